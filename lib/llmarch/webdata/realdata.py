"""Real inputs: WARC and ARC files from the source distributions of ``warcio`` and ``pywb``, and real HTML
pages with their reference checks from ``trafilatura``'s, and a labelled WARC built from those pages.

Book: Pretraining data, "Real pages".

``make`` fetches the three source distributions with ``pip download --no-binary :all: --no-deps`` at pinned
versions into ``_build/realdata`` (or the folder in ``$LLMARCH_REALDATA``); nothing of them is committed.
:func:`realdata_dir` finds that folder, :func:`archive_files` lists the crawl files, :func:`real_pages`
reads the pages of trafilatura 1.0.0's ``tests/cache`` with their URLs, and :func:`reference_checks`
reads the strings its ``tests/realworld_tests.py`` asserts the extracted text must and must not contain.

:func:`write_real_page_warc` packs pages into a labelled WARC: every page as a response in its original
bytes (its charset named in the HTTP header only when asked), then exact copies, near copies (a few words
changed), pages with a short prefix added and pages that copy half of another, in a fixed order, so that a
test or the chapter knows which record duplicates which.
"""

from __future__ import annotations

import ast
import io
import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REALDATA_VERSIONS", "realdata_dir", "archive_files", "RealPage", "real_pages", "reference_checks",
           "write_real_page_warc"]

REALDATA_VERSIONS = {"warcio": "1.6.3", "pywb": "2.6.9", "trafilatura": "1.0.0"}
"""The pinned source distributions (``Makefile``, target ``$(REALDATA)``)."""

_ARCHIVE_DIRS = ("warcio-1.6.3/test/data", "pywb-2.6.9/sample_archive/warcs")
_TRAFILATURA_TESTS = "trafilatura-1.0.0/tests"


def realdata_dir() -> Path | None:
    """The folder of the fetched source distributions (``$LLMARCH_REALDATA``, else ``_build/realdata`` of
    the repository), or ``None`` when it has not been fetched (run ``make test-lib`` or ``make book``).

    Book: Pretraining data, "Real pages"
    """
    root = os.environ.get("LLMARCH_REALDATA")
    folder = Path(root) if root else Path(__file__).resolve().parents[3] / "_build" / "realdata"
    return folder if (folder / ".fetched").is_file() else None


def _require(folder: Path | None) -> Path:
    folder = realdata_dir() if folder is None else Path(folder)
    if folder is None or not folder.is_dir():
        raise FileNotFoundError("the real inputs are not fetched: run `make _build/realdata/.fetched` "
                                "(or set LLMARCH_REALDATA to a folder that holds them)")
    return folder


def archive_files(folder=None) -> list[Path]:
    """Every file of the crawl-file folders of warcio's and pywb's source distributions, sorted (WARC, ARC,
    gzip per record and as one stream, damaged and truncated ones: each is a test case of the originals).

    Book: Pretraining data, "Real pages"
    """
    folder = _require(folder)
    return sorted(p for d in _ARCHIVE_DIRS for p in (folder / d).iterdir() if p.is_file())


@dataclass(frozen=True)
class RealPage:
    """A page of trafilatura's test cache: its ``url``, file ``name`` and raw ``html`` bytes.

    Book: Pretraining data, "Real pages"
    """

    url: str
    name: str
    html: bytes


def _mock_pages(tests: Path) -> dict[str, str]:
    tree = ast.parse((tests / "realworld_tests.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MOCK_PAGES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError("realworld_tests.py has no MOCK_PAGES table")


def real_pages(folder=None) -> list[RealPage]:
    """The pages of trafilatura's ``tests/cache`` that its ``MOCK_PAGES`` table names, with their URLs, in
    the table's order (pages without a URL there get ``http://trafilatura.test/<file name>``).

    Book: Pretraining data, "Real pages"
    """
    tests = _require(folder) / _TRAFILATURA_TESTS
    named = _mock_pages(tests)
    by_file = {name: url for url, name in named.items()}
    files = sorted(p.name for p in (tests / "cache").iterdir() if p.suffix == ".html")
    order = [name for name in named.values() if name in files] + [n for n in files if n not in by_file]
    return [RealPage(by_file.get(n, f"http://trafilatura.test/{n}"), n, (tests / "cache" / n).read_bytes())
            for n in dict.fromkeys(order)]


def _strings(test: ast.expr, result: str) -> list[tuple[str, bool]]:
    """``('x' in result)`` -> ``[('x', True)]``, ``('x' not in result)`` -> ``[('x', False)]``, through ``and``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [pair for value in test.values for pair in _strings(value, result)]
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Constant)
            and isinstance(test.left.value, str) and getattr(test.comparators[0], "id", "") == result):
        if isinstance(test.ops[0], (ast.In, ast.NotIn)):
            return [(test.left.value, isinstance(test.ops[0], ast.In))]
    return []


def reference_checks(folder=None) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """``{url: (must_include, must_exclude)}``: the strings that trafilatura's ``realworld_tests.py`` asserts
    in (and not in) the text extracted from each page, read from its source with ``ast`` (each
    ``result = load_mock_page(url, ...)`` followed by ``assert 'a' in result and 'b' not in result``).

    Book: Pretraining data, "Real pages"
    """
    tests = _require(folder) / _TRAFILATURA_TESTS
    tree = ast.parse((tests / "realworld_tests.py").read_text(encoding="utf-8"))
    checks: dict[str, tuple[list[str], list[str]]] = {}
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        url = None
        for node in ast.walk(function):  # breadth first, but each statement list keeps its order
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            for statement in body:
                value = getattr(statement, "value", None)
                if (isinstance(statement, ast.Assign) and isinstance(value, ast.Call)
                        and getattr(value.func, "id", "") == "load_mock_page" and value.args
                        and isinstance(value.args[0], ast.Constant)):
                    url = value.args[0].value
                elif isinstance(statement, ast.Assert) and url is not None:
                    include, exclude = checks.setdefault(url, ([], []))
                    for text, present in _strings(statement.test, "result"):
                        (include if present else exclude).append(text)
    return {url: (tuple(dict.fromkeys(a)), tuple(dict.fromkeys(b))) for url, (a, b) in checks.items() if a or b}


def _edited(text: str, rng: random.Random, changes: int) -> str:
    words = text.split(" ")
    for _ in range(changes):
        i = rng.randrange(len(words))
        words[i] = words[i][::-1]
    return " ".join(words)


def write_real_page_warc(path, pages: list[RealPage], copies: int = 5, seed: int = 0,
                         declare_charset: bool = False) -> dict[str, dict]:
    """Write ``pages`` as a labelled WARC (gzip per record) at ``path`` and return the labels,
    ``{record id: {"url", "name", "kind", "copy_of"}}`` with ``kind`` one of ``original``,
    ``exact-copy`` (the same bytes at another URL), ``near-copy`` (the HTML with 3 words reversed per 1000
    bytes, at most 30), ``prefixed-copy`` (a short paragraph added at the top of the body) and
    ``half-copy`` (the HTML cut in the middle of its body: a page that quotes half of another, which near
    deduplication at 0.8 does not catch);
    ``copy_of`` is the original's record id. The copies are of ``copies`` pages drawn with ``seed``, in the
    order exact, near, prefixed, half after all originals. The HTTP ``Content-Type`` is
    ``text/html``, with ``; charset=utf-8`` only when ``declare_charset`` and the page is valid UTF-8.

    Book: Pretraining data, "Real pages"
    """
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    rng = random.Random(seed)
    labels: dict[str, dict] = {}
    records = []
    ids = {}
    for page in pages:
        rid = f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128))}>"
        ids[page.name] = rid
        records.append((rid, page.url, page.html))
        labels[rid] = {"url": page.url, "name": page.name, "kind": "original", "copy_of": None}
    for page in rng.sample(pages, min(copies, len(pages))):
        html = page.html.decode("utf-8", errors="surrogateescape")
        body = html.find("<body")
        body = html.find(">", body) + 1 if body >= 0 else 0
        prefix = ("<p>Reposted from another site. The text below is quoted in full for our readers, "
                  "with thanks to its author.</p>")
        variants = {
            "exact-copy": page.html,
            "near-copy": _edited(html, rng, min(30, 3 * max(1, len(html) // 1000))).encode(
                "utf-8", errors="surrogateescape"),
            "prefixed-copy": (html[:body] + prefix + html[body:]).encode("utf-8", errors="surrogateescape"),
            "half-copy": (html[:body + (len(html) - body) // 2] + "</body></html>").encode(
                "utf-8", errors="surrogateescape"),
        }
        for kind, data in variants.items():
            rid = f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128))}>"
            url = f"http://mirror.example/{kind}/{page.name}"
            records.append((rid, url, data))
            labels[rid] = {"url": url, "name": page.name, "kind": kind, "copy_of": ids[page.name]}
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for rid, url, data in records:
            charset = ""
            if declare_charset:
                try:
                    data.decode("utf-8")
                    charset = "; charset=utf-8"
                except UnicodeDecodeError:
                    pass
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/html" + charset)], protocol="HTTP/1.1")
            record = writer.create_warc_record(url, "response", payload=io.BytesIO(data), http_headers=http,
                                               warc_headers_dict={"WARC-Record-ID": rid})
            writer.write_record(record)
    return labels
