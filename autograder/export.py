"""``python -m autograder export``: the term's grades for a learning-management system, from the gradebook.

One row per student of the gradebook, one column per assignment: the automatic and the manual points
together (nbgrader's score: a manual grade replaces the automatic one of its cell), minus the late penalty
recorded by the grader, never below 0 (the rule of ``nbgrader export``); a student with no submission gets 0.

- default: ``student_id, first_name, last_name, email, lms_user_id, <assignment>..., total, max_total,
  manual_pending`` (the assignments that still have answers to grade by hand);
- ``--canvas ROSTER.csv``: Canvas's gradebook import format, from Canvas's own gradebook export: the columns
  ``Student, ID, SIS User ID, SIS Login ID, Section`` kept as they are, a ``Points Possible`` row, and one
  column per assignment that has Canvas's ``<name> (<id>)`` column in the file, so that the grades go into the
  existing column (the others are left out with a note: Canvas would make each a new assignment of zeros).
  Canvas's test student is left out. A maximum that differs from Canvas's points possible is a warning
  (``--rescale`` scales the points to Canvas's maximum). Students are matched by SIS Login ID, then SIS User
  ID, then Canvas's user id;
- ``--moodle``: Moodle's grade import (``Email address``, ``ID number``, one column per assignment).

``--assignment NAME`` (repeatable) exports only those assignments.

Example::

    python -m autograder export --course course/ --canvas canvas-export.csv --to canvas-import.csv
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

from autograder.gradebook import open_gradebook
from autograder.results import atomic_write_text, csv_safe
from autograder.term import read_roster

CANVAS_FIXED = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")



def _natural_key(name: str) -> list:
    """Sort key that orders the numbers inside names by value: ``ps2-...`` before ``ps10-...``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

def term_grades(path: Path) -> tuple[list[str], dict[str, float], list[dict]]:
    """(assignments, assignment -> max points, one dict per student: ``student`` (nbgrader's Student),
    ``final`` (assignment -> points after the penalty) and ``pending`` (assignments to grade by hand))."""
    from nbgrader.api import MissingEntry

    if not path.exists():
        raise SystemExit(f"no gradebook at {path}")
    students = []
    with open_gradebook(path) as gradebook:
        names = sorted((a.name for a in gradebook.assignments), key=_natural_key)  # ps1, ps2, ..., ps10
        maxima = {a.name: a.max_score for a in gradebook.assignments}
        for student in gradebook.students:
            final, pending = {}, []
            for name in names:
                try:
                    submission = gradebook.find_submission(name, student.id)
                except MissingEntry:
                    final[name] = 0.0
                    continue
                final[name] = max(0.0, submission.score - submission.late_submission_penalty)
                if submission.needs_manual_grade:
                    pending.append(name)
            students.append({"id": student.id, "first_name": student.first_name or "",
                             "last_name": student.last_name or "", "email": student.email or "",
                             "lms_user_id": student.lms_user_id or "", "final": final, "pending": pending})
    return names, maxima, students


def _table(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([[csv_safe(v) if isinstance(v, str) else f"{v:g}" for v in row] for row in rows])
    return buffer.getvalue()


def plain(names, maxima, students) -> str:
    header = ["student_id", "first_name", "last_name", "email", "lms_user_id", *names, "total", "max_total",
              "manual_pending"]
    rows = [[s["id"], s["first_name"], s["last_name"], s["email"], s["lms_user_id"],
             *[s["final"][n] for n in names], sum(s["final"].values()), sum(maxima.values()),
             " ".join(s["pending"])] for s in students]
    return _table(header, rows)


def _canvas_points(roster: Path, header: list[str]) -> dict[str, float]:
    """Canvas's points possible per column header, from its ``Points Possible`` row (none: an empty dict)."""
    with open(roster, newline="", encoding="utf-8-sig") as f:
        for row in csv.reader(f):
            if row and "Points Possible" in row[0]:
                return {h: float(v) for h, v in zip(header, row) if re.fullmatch(r"\d+(\.\d+)?", v.strip())}
    return {}


def canvas(names, maxima, students, roster: Path, rescale: bool = False) -> str:
    """Canvas's import CSV for the students of the Canvas export ``roster``; see the module's text. Only the
    assignments that have a column in the file are exported (a column Canvas does not know would become a new
    assignment of zeros); a maximum that differs from Canvas's points possible is a warning, or, with
    ``rescale``, the points are scaled to Canvas's maximum."""
    _, table = read_roster(roster, "--canvas")
    with open(roster, newline="", encoding="utf-8-sig") as f:
        header_in = next(csv.reader(f))
    missing = [c for c in CANVAS_FIXED if c not in header_in]
    if missing:
        raise SystemExit(f"--canvas {roster}: not Canvas's gradebook export (no column {', '.join(missing)})")
    columns = {n: h for n in names for h in header_in if re.fullmatch(rf"{re.escape(n)} \(\d+\)", h)}
    left_out = [n for n in names if n not in columns]
    if left_out:
        print(f"note: --canvas {roster} has no column for {', '.join(left_out)}: not exported (create the "
              "assignment in Canvas, export its gradebook again, and rerun)", file=sys.stderr)
    names = [n for n in names if n in columns]
    if not names:
        raise SystemExit(f"--canvas {roster}: no column '<assignment> (<id>)' for any assignment of the course")
    scale = {n: 1.0 for n in names}
    canvas_max = _canvas_points(roster, header_in)
    for n in names:
        theirs = canvas_max.get(columns[n])
        if theirs is not None and abs(theirs - maxima[n]) > 1e-9:
            if rescale:
                scale[n] = theirs / maxima[n]
            print(f"warning: Canvas's {columns[n]} is out of {theirs:g} points, the course's {n} out of "
                  f"{maxima[n]:g}: " + (f"points scaled by {scale[n]:.4g}" if rescale else
                                        "exported as they are (--rescale scales them to Canvas's points)"),
                  file=sys.stderr)
    by_key = {}
    for s in students:
        by_key.setdefault(("login", s["id"]), s)
        if s["lms_user_id"]:
            by_key.setdefault(("canvas", s["lms_user_id"]), s)
    rows = [["    Points Possible", "", "", "", "", *[maxima[n] * scale[n] for n in names]]]
    matched = set()
    for login, row in table.items():
        s = (by_key.get(("login", login)) or by_key.get(("login", row.get("SIS User ID", "")))
             or by_key.get(("canvas", row.get("ID", ""))))
        if s is None:
            print(f"warning: {login!r} of the Canvas roster is not in the gradebook: left blank", file=sys.stderr)
        else:
            matched.add(s["id"])
        rows.append([*(row.get(c, "") for c in CANVAS_FIXED), *([s["final"][n] * scale[n] for n in names] if s else
                                                                ["" for _ in names])])
    for s in students:
        if s["id"] not in matched:
            print(f"warning: {s['id']!r} of the gradebook is not on the Canvas roster: not exported", file=sys.stderr)
    return _table([*CANVAS_FIXED, *(columns[n] for n in names)], rows)


def moodle(names, maxima, students) -> str:
    rows = [[s["email"], s["id"], *[s["final"][n] for n in names]] for s in students]
    return _table(["Email address", "ID number", *names], rows)


def export(gradebook: Path, to: Path, canvas_roster: Path | None = None, to_moodle: bool = False,
           only: list[str] = (), rescale: bool = False) -> None:
    """Write the term's grades to ``to``; ``only``: these assignments alone (``--assignment``)."""
    names, maxima, students = term_grades(gradebook)
    unknown = [n for n in only if n not in names]
    if unknown:
        raise SystemExit(f"--assignment: {', '.join(unknown)} not in the gradebook; it has {', '.join(names)}")
    names = [n for n in names if n in only] if only else names
    if canvas_roster is not None:
        text = canvas(names, maxima, students, canvas_roster, rescale)
    elif to_moodle:
        text = moodle(names, maxima, students)
    else:
        text = plain(names, maxima, students)
    atomic_write_text(to, text)
    print(f"wrote {to}: {len(students)} students")
