"""The feedback page a student receives: status, points per graded item, and what went wrong.

It is built only from the grader's own results and the student's own text (escaped), never from test-cell
source, so hidden tests cannot leak through it.
"""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from autograder.runner import MAX_CRASHES

STATUS_TEXT = {
    "graded": "Your notebook ran to the end and was graded.",
    "tampered": "Read-only cells of your notebook were changed. They were restored before grading, and your "
                "instructor has been told what changed.",
    "timeout": "Your notebook ran out of time. Points from the tests before that point count.",
    "memory-limit": "Your notebook used more memory than allowed. Points from the tests before that point count.",
    "crashed": "Your notebook crashed more than the grader recovers from (a crash in one cell costs only "
               f"that cell, {MAX_CRASHES} times at most). Points from the tests before that point count.",
    "invalid-notebook": "Your file could not be read as a Jupyter notebook, so it was not run.",
    "missing": "No notebook with the expected name was found in your submission.",
    "grader-error": "The grader itself failed on your submission; this is not your fault. Your instructor has been "
                    "told and will grade it again.",
}

HASHED = re.compile(r"-[0-9a-f]{10}$")  # the ending folder_name gives to names it changed

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; line-height: 1.45; color: #222; }
table { border-collapse: collapse; width: 100%; } td, th { border-bottom: 1px solid #ddd; padding: .4rem; text-align: left; vertical-align: top; }
.status { padding: .6rem 1rem; border-radius: .4rem; background: #eef; } .pass { color: #176b2c; } .fail { color: #a11; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .6rem; }
"""


def _timing_text(timing) -> str:
    """The submission's time, lateness, extension and penalty (a ``lateness.Timing``), as one escaped line."""
    from autograder.lateness import format_hours, format_time

    parts = []
    if timing.submitted_at is not None:
        parts.append(f"Submitted {format_time(timing.submitted_at)}")
    if timing.extension:
        parts.append(f"extension {format_hours(timing.extension)}")
    if timing.late_seconds:
        parts.append(f"{timing.late_seconds / 3600:.1f} hours late")
    parts.append(f"late penalty: {timing.penalty:g} points, taken from your total (written answers included)")
    return html.escape(", ".join(parts)) + (f"<br>{html.escape(timing.note)}" if timing.note else "")


def render(result, assignment: str, max_score: float, timing=None) -> str:
    """The page of ``result`` (a ``grade.SubmissionResult``); ``timing`` (a ``lateness.Timing``): its time and
    late penalty, shown when given. Every text is escaped."""
    e = html.escape
    rows = []
    for item in result.items:
        if item.points is None:
            score, css = f"– / {item.max_points:g}", ""
        else:
            score = f"{item.points:g} / {item.max_points:g}"
            css = "pass" if item.points == item.max_points else "fail"
        rows.append(f"<tr><td>{e(item.grade_id)}</td><td class='{css}'>{e(score)}</td><td>{e(item.message)}</td></tr>")
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(assignment)}: feedback for {e(result.student)}</title>"
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{e(assignment)}</h1><p>Feedback for <b>{e(result.student)}</b></p>",
        f"<p class='status'><b>Status: {e(result.status)}</b>. {e(STATUS_TEXT[result.status])}"
        + (f"<br>{e(result.detail)}" if result.detail else "") + "</p>",
        f"<p>Automatically graded score: <b>{result.score:g} / {max_score:g}</b></p>",
        f"<p class='timing'>{_timing_text(timing)}</p>" if timing is not None else "",
        "<table><tr><th>test</th><th>points</th><th>result</th></tr>" + "".join(rows) + "</table>",
    ]
    if result.tampering:
        parts.append("<h2>Changes to read-only cells</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in result.tampering) + "</ul>")
    if result.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in result.notes) + "</ul>")
    if result.information:
        parts.append("<h2>Information (not graded)</h2><ul>"
                     + "".join(f"<li>{e(n)}</li>" for n in result.information) + "</ul>")
    if result.cell_errors:
        parts.append("<h2>Errors and crashes while your notebook ran</h2>"
                     + "".join(f"<pre>{e(msg)}</pre>" for msg in result.cell_errors))
    for gid, text in result.answers.items():
        parts.append(f"<h2>Your written answer ({e(gid)})</h2><pre>{e(text[:5000])}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def folder_name(student: str) -> str:
    """A file-system-safe, distinct and stable id for a student name (which comes from a file name a student
    chose): only ``A-Z a-z 0-9 . _ -``, no leading dot or dash, at most 91 characters. A name that is already safe
    keeps itself, unless it ends like a hashed id (``-`` and 10 hex digits); every other name gets the safe
    part and ``-`` and the first 10 hex digits of the SHA-256 of the name. So no name can take another's id:
    ``folder_name("alice")`` -> ``"alice"``; ``folder_name("../x")`` -> ``"_.._x-…"``; and
    ``folder_name("_.._x-…")`` gets a hash of its own."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", student)[:80]
    if safe[:1] in (".", "-"):  # no hidden folder, and nothing a spreadsheet reads as a formula (-A1)
        safe = "_" + safe[:79]
    if safe != student or not safe or HASHED.search(student):
        safe += "-" + hashlib.sha256(student.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return safe


def write_feedback(result, assignment: str, notebook: str, max_score: float, out: Path, timing=None) -> Path:
    """Write ``out/feedback/<folder_name(student)>/<notebook>.html`` (``render``); the path never leaves
    ``out/feedback``."""
    root = (out / "feedback").resolve()
    folder = root / folder_name(result.student)
    if folder.parent != root:
        raise ValueError(f"feedback folder {folder} is not directly inside {root}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (Path(notebook).stem + ".html")
    path.write_text(render(result, assignment, max_score, timing), encoding="utf-8")
    return path
