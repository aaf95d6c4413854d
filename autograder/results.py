"""The output folder: ``grades.csv`` merged across runs, written atomically, and never another assignment's.

Every run merges its rows into the existing ``grades.csv``: a row is replaced only when its student was graded
again (``--only NAME``, ``--retry-failed``, or a full run), so no run deletes another student's results. Files
are written to a temporary name and renamed, so a run killed halfway leaves the previous files whole. The
folder records its assignment in ``.autograder.json``; an output folder of another assignment is refused.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import secrets
from pathlib import Path

MARKER = ".autograder.json"
FIXED_COLUMNS = ("student", "id", "status", "tampered", "score", "max_score", "manual_pending", "submitted_at",
                 "late_seconds", "penalty", "extension", "lms_id")
TRAILING_COLUMNS = ("seconds", "cpu_seconds", "detail", "notes")
LOCK = ".autograder.lock"
PENDING = ".autograder-pending.json"
FINISHED = ("graded", "tampered")  # --retry-failed regrades every other status


def csv_safe(text: str) -> str:
    """Text a spreadsheet shows as text: a leading ``= + - @`` (or tab, carriage return) would make it a
    formula, so it gets a leading apostrophe, and so does a leading apostrophe, so that two names never give
    one text. ``csv_safe("=HYPERLINK(...)")`` -> ``"'=HYPERLINK(...)"``, ``csv_safe("'=x")`` -> ``"''=x"``."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r", "'") else text


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (a name no other writer, process or thread, uses),
    then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
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


def result_row(result, template, student_id: str, timing=None, lms_id: str = "") -> dict[str, str]:
    """One submission's row. ``score`` counts the automatically graded points, ``max_score`` every point of the
    assignment (written answers too), ``manual_pending`` the points still to be graded by hand (none for a
    submission that is missing or not a readable notebook), ``submitted_at``/``late_seconds``/``penalty`` come
    from ``timing`` (a ``lateness.Timing``; blank when unknown), and so does ``extension`` (``48h``), ``id`` is
    the student's id in feedback/ and the gradebook. Every text a student could choose is ``csv_safe``."""
    from autograder.lateness import format_hours, format_time

    by_id = {i.grade_id: i for i in result.items}
    unreadable = result.status in ("missing", "invalid-notebook")  # no written answer to grade by hand
    manual = 0.0 if unreadable else sum(i.points for i in template.items if i.kind == "manual")
    late = None if timing is None else timing.late_seconds
    row = {
        "student": csv_safe(result.student),
        "id": csv_safe(student_id),
        "status": result.status,
        "tampered": "yes" if result.tampered else "no",
        "score": f"{result.score:g}",
        "max_score": f"{sum(i.points for i in template.items):g}",
        "manual_pending": f"{manual:g}",
        "submitted_at": format_time(timing.submitted_at) if timing else "",
        "late_seconds": "" if late is None else f"{late:.0f}",
        "penalty": f"{timing.penalty:g}" if timing else "0",
        "extension": format_hours(timing.extension) if timing else "",
        "lms_id": csv_safe(lms_id),
        "seconds": f"{result.seconds:.1f}",
        "cpu_seconds": "" if result.cpu_seconds is None else f"{result.cpu_seconds:.1f}",
        "detail": csv_safe(result.detail),
        "notes": csv_safe("; ".join(result.tampering + result.notes + ([timing.note] if timing and timing.note
                                                                       else []))),
    }
    for item in template.items:
        got = by_id.get(item.grade_id)
        row[item.grade_id] = "" if got is None or got.points is None else f"{got.points:g}"
    return row


def merge(existing: dict[str, dict[str, str]], rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """``existing`` rows with ``rows`` (of the students graded now) replaced or added, in student order."""
    merged = dict(existing)
    for row in rows:
        merged[row["student"]] = row
    return dict(sorted(merged.items()))


@contextlib.contextmanager
def locked(lock_file: Path):
    """Hold ``lock_file`` (an exclusive ``flock``) in this block: two runs into one output folder (lock
    ``out/.autograder.lock``) or one gradebook write one after the other, each merging into what the other
    wrote, so no row is lost."""
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_pending(out: Path) -> set[str]:
    """The students (CSV keys) whose outputs a killed run was writing: ``--retry-failed`` grades them again."""
    try:
        return set(json.loads((out / PENDING).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return set()


def mark_pending(out: Path, students) -> None:
    """Record, before the first output is written, whose outputs this run is about to write."""
    atomic_write_text(out / PENDING, json.dumps(sorted(set(students) | read_pending(out))))


def clear_pending(out: Path) -> None:
    (out / PENDING).unlink(missing_ok=True)


def write_rows(rows: dict[str, dict[str, str]], template, path: Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns(template), restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows.values())
    atomic_write_text(path, buffer.getvalue())


def write_record(out: Path, student_id: str, result) -> None:
    """``out/.records/<id>.json``: the status and every item's points and message of one student, which the
    class report's failure lists read (grades.csv has the points, not the messages)."""
    folder = out / ".records"
    folder.mkdir(exist_ok=True)
    record = {"student": result.student, "status": result.status,
              "items": [{"grade_id": i.grade_id, "points": i.points, "max_points": i.max_points,
                         "message": i.message} for i in result.items]}
    atomic_write_text(folder / f"{student_id}.json", json.dumps(record))


def read_records(out: Path) -> dict[str, dict]:
    """id -> the record ``write_record`` wrote (unreadable records are skipped)."""
    records = {}
    for path in sorted((out / ".records").glob("*.json")):
        try:
            records[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return records
