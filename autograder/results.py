"""The output folder: ``grades.csv`` merged across runs, written atomically, and never another assignment's.

Every run merges its rows into the existing ``grades.csv``: a row is replaced only when its student was graded
again (``--only NAME``, ``--retry-failed``, or a full run), so no run deletes another student's results. Files
are written to a temporary name and renamed, so a run killed halfway leaves the previous files whole. The
folder records its assignment in ``.autograder.json``; an output folder of another assignment is refused.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

MARKER = ".autograder.json"
FIXED_COLUMNS = ("student", "status", "tampered", "score", "max_score", "manual_pending")
TRAILING_COLUMNS = ("seconds", "cpu_seconds", "detail", "notes")
FINISHED = ("graded", "tampered")  # --retry-failed regrades every other status


def csv_safe(text: str) -> str:
    """Text a spreadsheet shows as text: a leading ``= + - @`` (or tab, carriage return) would make it a
    formula, so it gets a leading apostrophe. ``csv_safe("=HYPERLINK(...)")`` -> ``"'=HYPERLINK(...)"``."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def columns(template) -> list[str]:
    return [*FIXED_COLUMNS, *[i.grade_id for i in template.items], *TRAILING_COLUMNS]


def prepare_output_dir(out: Path, assignment: str, template) -> None:
    """Create ``out`` (and ``out/feedback``) for ``assignment``, or refuse (SystemExit) a folder that holds
    another assignment's results."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} exists and is not a folder")
    marker = out / MARKER
    if marker.exists():
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8")).get("assignment")
        except (ValueError, OSError, AttributeError):
            recorded = None
        if recorded != assignment:
            raise SystemExit(f"--out {out} holds the results of {recorded!r}, not {assignment!r}: "
                             "choose another folder")
    elif (out / "grades.csv").exists():
        with open(out / "grades.csv", newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if header != columns(template):
            raise SystemExit(f"--out {out} holds a grades.csv that is not this grader's for {assignment!r}: "
                             "choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
    atomic_write_text(marker, json.dumps({"assignment": assignment}) + "\n")


def read_rows(path: Path) -> dict[str, dict[str, str]]:
    """The rows of an existing ``grades.csv`` by (CSV-safe) student name; empty when there is none."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def result_row(result, template) -> dict[str, str]:
    """One submission's row. ``score`` counts the automatically graded points, ``max_score`` every point of the
    assignment (written answers too), and ``manual_pending`` the points still to be graded by hand."""
    by_id = {i.grade_id: i for i in result.items}
    manual = sum(i.points for i in template.items if i.kind == "manual")
    row = {
        "student": csv_safe(result.student),
        "status": result.status,
        "tampered": "yes" if result.tampered else "no",
        "score": f"{result.score:g}",
        "max_score": f"{sum(i.points for i in template.items):g}",
        "manual_pending": f"{manual:g}",
        "seconds": f"{result.seconds:.1f}",
        "cpu_seconds": "" if result.cpu_seconds is None else f"{result.cpu_seconds:.1f}",
        "detail": csv_safe(result.detail),
        "notes": csv_safe("; ".join(result.tampering + result.notes)),
    }
    for item in template.items:
        got = by_id.get(item.grade_id)
        row[item.grade_id] = "" if got is None or got.points is None else f"{got.points:g}"
    return row


def merge(existing: dict[str, dict[str, str]], results, template) -> dict[str, dict[str, str]]:
    """``existing`` rows with those of the students in ``results`` replaced or added, in student order."""
    rows = dict(existing)
    for result in results:
        row = result_row(result, template)
        rows[row["student"]] = row
    return dict(sorted(rows.items()))


def write_rows(rows: dict[str, dict[str, str]], template, path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns(template), restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows.values())
    atomic_write_text(path, buffer.getvalue())
