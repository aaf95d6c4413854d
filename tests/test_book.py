"""The rendered book, as a reader's browser sees it (headless Chromium through Playwright).

Needs the HTML that `make book` builds (``make test`` builds it first). Every page is opened over HTTP from
localhost at 1280 x 900; the tests fail if math is left untypeset or MathJax reports an error, an image does
not load, a cell shows an error, the page asks for anything outside the book (it must work offline), or a
line of code or a display equation does not fit the text column. A full-page screenshot of each page is saved
under ``_build/screenshots/`` for a person to look at.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PAGES_WITHOUT_FIGURES = {"intro", "references", "problem-sets"}
PAGES = sorted(p.relative_to(HTML).as_posix() for p in (HTML / "book").glob("*.html")) if HTML.exists() else []


def chapters_in_toc() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    return re.findall(r"(?:root|file):\s*(\S+)", toc)


def test_book_was_built_from_every_toc_entry():
    assert HTML.exists(), "no _build/html: run `make book` first (`make test` does)"
    for entry in chapters_in_toc():
        assert (HTML / f"{entry}.html").exists(), f"{entry} is in _toc.yml but {entry}.html was not built"


def test_build_log_has_no_warnings():
    log = ROOT / "_build" / "book-build.log"
    assert log.exists(), "no _build/book-build.log: run `make book` first"
    text = log.read_text(errors="replace")
    assert "build succeeded" in text, "the last book build did not succeed; see _build/book-build.log"
    # Sphinx writes "file:line: WARNING: ..."; "[IPKernelApp] WARNING | ..." is the kernel's own start-up noise
    warnings = [line for line in text.splitlines() if "WARNING:" in line]
    assert not warnings, "the book build printed warnings:\n" + "\n".join(warnings[:20])


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "Chromium is not installed (the Debian package `chromium`; `make test` installs it)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"],
        )
        yield browser
        browser.close()


# Collected in the page after MathJax has finished: what a reader would see as broken.
_INSPECT = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const maths = [...document.querySelectorAll('.math')];
  const untypeset = maths.filter(m => !m.querySelector('mjx-container') && !m.closest('mjx-container'))
                         .map(m => m.textContent.slice(0, 80));
  const mathErrors = [...document.querySelectorAll('mjx-merror')].map(e => e.textContent.slice(0, 80));
  const images = [...document.querySelectorAll('img')];
  await Promise.all(images.map(img => img.complete ? null : new Promise(r => { img.onload = img.onerror = r; })));
  const broken = images.filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src);
  const errors = [...document.querySelectorAll('.output.stderr, .output.traceback, .cell_output .traceback')]
                  .map(e => e.textContent.slice(0, 200));
  const text = document.body.innerText;
  const tracebacks = text.includes('Traceback (most recent call last)');
  const figures = document.querySelectorAll('.cell_output img, figure img').length;
  return {nMath: maths.length, untypeset, mathErrors, nImages: images.length, figures, broken, errors, tracebacks,
          mathjax: !!window.MathJax};
}
"""


# Run after _INSPECT and the screenshot (it unfolds hidden content): the code blocks and display equations that
# do not fit their box, each with its first overflowing line (or the TeX source of the equation).
_OVERFLOW = """
async () => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });        // hidden cell inputs
  document.querySelectorAll('.toggle-hidden').forEach(e => e.classList.remove('toggle-hidden'));  // dropdowns
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const column = (document.querySelector('article') || document.body).getBoundingClientRect();
  const tooWide = el => el.scrollWidth > el.clientWidth + 1 || el.getBoundingClientRect().right > column.right + 1;
  const ruler = document.createElement('canvas').getContext('2d');
  const firstLongLine = pre => {
    const style = getComputedStyle(pre);
    ruler.font = style.font;
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const lines = pre.textContent.split('\\n');
    return lines.find(line => ruler.measureText(line).width > room + 1)
           || lines.reduce((a, b) => (a.length >= b.length ? a : b));
  };
  const texOf = el => {
    try {
      const items = MathJax.startup.document.getMathItemsWithin(el);
      if (items.length) return items[0].math.trim();
    } catch (e) { /* fall back to the rendered text */ }
    return el.textContent;
  };
  const kindOf = pre => pre.closest('.cell_output') ? 'cell output'
                      : pre.closest('.cell_input') ? 'cell input' : 'code block';
  const code = [...document.querySelectorAll('pre')].filter(tooWide).map(pre =>
      ({kind: kindOf(pre), width: pre.scrollWidth, room: pre.clientWidth, line: firstLongLine(pre)}));
  const math = [...document.querySelectorAll('mjx-container[display="true"]')].filter(tooWide).map(m =>
      ({kind: 'display equation', width: m.scrollWidth, room: m.clientWidth, line: texOf(m)}));
  return code.concat(math);
}
"""


def _visit(page_path: str, server: str, browser) -> dict:
    """Open one page at 1280 x 900, save its screenshot, and return what the page tests check."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    outside, failed = [], []
    page.on("request", lambda r: None if r.url.startswith(server) or r.url.startswith("data:") else outside.append(r.url))
    page.on("requestfailed", lambda r: failed.append(r.url))
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    try:
        page.goto(server + page_path, wait_until="load")
        report = page.evaluate(_INSPECT)
        page.wait_for_timeout(200)
        page.screenshot(path=str(SHOTS / (Path(page_path).stem + ".png")), full_page=True)
        report["too_wide"] = page.evaluate(_OVERFLOW)
    finally:
        page.close()
    report["outside"], report["failed"] = outside, failed
    return report


@pytest.fixture(scope="module")
def rendered(server, browser):
    """``rendered(page_path)``: the page's report, from one visit shared by the tests of this module."""
    reports = {}

    def report_of(page_path):
        if page_path not in reports:
            reports[page_path] = _visit(page_path, server, browser)
        return reports[page_path]

    return report_of


@pytest.mark.parametrize("page_path", PAGES)
def test_page_renders_cleanly(page_path, rendered):
    report = rendered(page_path)
    outside, failed = report["outside"], report["failed"]
    assert not outside, f"{page_path} requests resources outside the book (it must work offline): {outside[:5]}"
    assert not failed, f"{page_path}: requests failed: {failed[:5]}"
    if report["nMath"]:
        assert report["mathjax"], f"{page_path} has math but MathJax did not load"
    assert not report["untypeset"], f"{page_path}: math left untypeset: {report['untypeset'][:3]}"
    assert not report["mathErrors"], f"{page_path}: MathJax errors: {report['mathErrors'][:3]}"
    assert not report["broken"], f"{page_path}: images that did not load: {report['broken'][:3]}"
    assert not report["errors"] and not report["tracebacks"], f"{page_path}: error output: {report['errors'][:2]}"
    if Path(page_path).stem not in PAGES_WITHOUT_FIGURES:  # a chapter whose figures vanished renders "fine" otherwise
        assert report["figures"] > 0, f"{page_path}: no figure was rendered (matplotlib backend not inline?)"


@pytest.mark.parametrize("page_path", PAGES)
def test_code_and_equations_fit_at_1280px(page_path, rendered):
    """No line of code and no display equation is clipped at 1280 px.

    Checked: every ``pre`` (cell inputs, cell outputs, literal blocks) and every display equation
    (``mjx-container[display]``). The theme gives both ``overflow: auto``, so a line wider than the text column
    gets a scroll bar and its end stays hidden until the reader scrolls sideways: that is what "clipped" means
    here (``scrollWidth > clientWidth + 1``, the pixel of slack absorbing sub-pixel rounding), as is a box that
    sticks out of the column. Folded content (hidden cell inputs, dropdown answers) is opened first, since a
    reader who opens it must be able to read it too. Tables are not checked: a wide result table sits in a
    scrollable container on purpose, and every cell of it stays readable without scrolling inside a cell.
    """
    too_wide = rendered(page_path)["too_wide"]
    listing = "\n".join(f"  {w['kind']}, {w['width']} px in {w['room']} px: {w['line'][:160]!r}" for w in too_wide[:8])
    if too_wide:
        pytest.fail(
            f"{page_path}: {len(too_wide)} code block(s) or display equation(s) are wider than the text column "
            f"at 1280 px, so their ends are hidden behind a scroll bar; rewrap them (first overflowing line of "
            f"each):\n{listing}", pytrace=False)


def test_overflow_check_catches_wide_code_and_ignores_tables(browser):
    """The check above can fail: on a hand-made page, a code line wider than the column is reported (with
    that line), a folded one too once unfolded, and a narrow block and a wide scrollable table are not."""
    wide = "x = " + "1 + " * 60 + "1"
    html = f"""<html><body><article style="width: 600px">
      <pre style="overflow: auto">short = 1\n{wide}\nshort = 2</pre>
      <pre style="overflow: auto">fits = True</pre>
      <details><summary>code</summary><pre style="overflow: auto">folded = "{'y' * 200}"</pre></details>
      <div style="overflow-x: auto"><table><tr>{'<td>cell</td>' * 200}</tr></table></div>
    </article></body></html>"""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.set_content(html)
        too_wide = page.evaluate(_OVERFLOW)
    finally:
        page.close()
    assert [w["line"] for w in too_wide] == [wide, f'folded = "{"y" * 200}"'], too_wide
    assert all(w["kind"] == "code block" and w["width"] > w["room"] for w in too_wide)
