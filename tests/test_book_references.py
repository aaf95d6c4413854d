"""Every docstring of llmarch that sends the reader to the book ("Book: Decoding, "Beam search"") names a
chapter and a section that exist, so the pointers cannot rot when a chapter is rewritten."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# "Book: <chapter> (``book/<file>.md``)" or "Book: <chapter>, "<section>"[, "<section>" | and "<section>"]"
CHAPTER = r'Book: ([A-Z][^,.(]*?)(?: \(``(book/[\w-]+\.md)``\))?(?=[,.;)]| and )'
SECTIONS = r'(?:, (?:sections? )?((?:"[^"]+"(?:, and |, | and )?)+))?'


def _headings(path: Path) -> tuple[str, set[str]]:
    """The chapter title (its `# ` heading) and every section heading, ignoring code cells."""
    title, sections, in_code = None, set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        match = re.match(r"(#+) (.+)", line)
        if match and not in_code:
            if len(match.group(1)) == 1 and title is None:
                title = match.group(2).strip()
            else:
                sections.add(match.group(2).strip())
    return title, sections


def _book() -> dict[str, tuple[str, set[str]]]:
    chapters = {}
    for path in sorted((ROOT / "book").glob("*.md")):
        title, sections = _headings(path)
        chapters[title] = (f"book/{path.name}", sections)
    return chapters


def _references() -> list[tuple[str, str, str | None, str | None]]:
    """(where, chapter, file or None, section or None) for every `Book:` pointer in llmarch's docstrings."""
    found = []
    for source in sorted((ROOT / "lib" / "llmarch").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = " ".join((ast.get_docstring(node) or "").split())
            where = f"{source.relative_to(ROOT / 'lib' / 'llmarch')}:{getattr(node, 'name', '<module>')}"
            for match in re.finditer(CHAPTER + SECTIONS, doc):
                chapter, file, sections = match.groups()
                names = re.findall(r'"([^"]+)"', sections or "") or [None]
                found.extend((where, chapter, file, name) for name in names)
            assert doc.count("Book: ") == len(re.findall(CHAPTER, doc)), f"{where}: a `Book:` pointer that does not parse"
    return found


REFERENCES = _references()


def test_references_were_found():
    assert len(REFERENCES) > 40
    assert {chapter for _, chapter, _, _ in REFERENCES} >= {"Attention", "Tokenizers", "Decoding", "Scaling laws"}


@pytest.mark.parametrize("where,chapter,file,section", REFERENCES, ids=[f"{r[0]}-{r[3]}" for r in REFERENCES])
def test_book_pointer_names_an_existing_chapter_and_section(where, chapter, file, section):
    book = _book()
    assert chapter in book, f"{where} points to the chapter {chapter!r}; the book's chapters are {sorted(book)}"
    path, sections = book[chapter]
    if file is not None:
        assert file == path, f"{where}: chapter {chapter!r} is {path}, not {file}"
    if section is not None:
        assert section in sections, f"{where}: {path} has no section {section!r}"
