"""The book links to every problem set: each set's released notebook (and the data files it reads) is built into
the site as a download, linked from the page "Problem sets" and from a chapter.

The source checks run anywhere; the checks of the built site need the HTML that `make book` writes (``make test``
builds it first), as tests/test_book.py does."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from autograder import assignments

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
DOWNLOAD = re.compile(r"\{download\}`[^`<]*<([^>`]+)>`")


def _release_files(name: str) -> list[str]:
    """The files a student downloads for a set: its notebook and the data files beside it."""
    module = assignments.load(name)
    return [module.NOTEBOOK, *getattr(module, "FILES", ())]


def _downloads(page: str) -> set[str]:
    """The repository paths a page of book/ offers as downloads."""
    text = (ROOT / "book" / f"{page}.md").read_text()
    return {(ROOT / "book" / target).resolve().relative_to(ROOT).as_posix() for target in DOWNLOAD.findall(text)}


def test_every_download_in_the_book_is_a_released_file():
    for page in sorted(p.stem for p in (ROOT / "book").glob("*.md")):
        for path in _downloads(page):
            assert path.startswith("exercises/") and (ROOT / path).is_file(), (page, path)


@pytest.mark.parametrize("name", sorted(assignments.ASSIGNMENTS))
def test_the_problem_sets_page_and_a_chapter_offer_every_file_of_a_set(name):
    files = {f"exercises/{name}/{file}" for file in _release_files(name)}
    assert files <= _downloads("problem-sets"), sorted(files - _downloads("problem-sets"))
    chapters = [p.stem for p in (ROOT / "book").glob("*.md") if p.stem != "problem-sets"
                and f"exercises/{name}/{assignments.load(name).NOTEBOOK}" in _downloads(p.stem)]
    assert chapters, f"no chapter links to the notebook of {name}"
    assert "book/problem-sets" in (ROOT / "_toc.yml").read_text()


def _built_downloads(page: Path) -> dict[str, Path]:
    """File name -> the file in the built site, for every link of a built page into _downloads/."""
    hrefs = re.findall(r'href="([^"]*_downloads/[^"]+)"', page.read_text())
    return {unquote(h).rsplit("/", 1)[-1]: (page.parent / unquote(h)).resolve() for h in hrefs}


@pytest.mark.parametrize("name", sorted(assignments.ASSIGNMENTS))
def test_the_built_site_serves_every_file_of_a_set(name):
    """The built pages link to copies of the released files, byte for byte; from the problem-set page and from
    every chapter whose source offers the notebook."""
    assert HTML.exists(), "no _build/html: run `make book` first (`make test` does)"
    listed = _built_downloads(HTML / "book" / "problem-sets.html")
    for file in _release_files(name):
        assert file in listed, f"book/problem-sets.html has no download link to {file}"
        assert listed[file].is_file() and listed[file].is_relative_to(HTML), listed[file]
        assert listed[file].read_bytes() == (ROOT / "exercises" / name / file).read_bytes(), file
    notebook = assignments.load(name).NOTEBOOK
    for chapter in (p.stem for p in (ROOT / "book").glob("*.md") if p.stem != "problem-sets"):
        if f"exercises/{name}/{notebook}" in _downloads(chapter):
            served = _built_downloads(HTML / "book" / f"{chapter}.html")
            assert notebook in served and served[notebook].is_file(), (chapter, notebook)
