"""``python -m autograder export``: the term's grades for a learning-management system, from the gradebook.

One row per student of the gradebook, one column per assignment: the automatic and the manual points
together (nbgrader's score: a manual grade replaces the automatic one of its cell), minus the late penalty
recorded by the grader, never below 0 (the rule of ``nbgrader export``); a student with no submission gets 0.

- default: ``student_id, first_name, last_name, email, lms_user_id, <assignment>..., total, max_total,
  manual_pending`` (the assignments that still have answers to grade by hand);
- ``--canvas ROSTER.csv``: Canvas's gradebook import format, from Canvas's own gradebook export: the columns
  ``Student, ID, SIS User ID, SIS Login ID, Section`` kept as they are, a ``Points Possible`` row, and one
  column per assignment (Canvas's ``<name> (<id>)`` header where the roster has one, so that the grades go
  into the existing column). Students are matched by SIS Login ID, then SIS User ID, then Canvas's user id;
- ``--moodle``: Moodle's grade import (``Email address``, ``ID number``, one column per assignment).

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


def canvas(names, maxima, students, roster: Path) -> str:
    """Canvas's import CSV for the students of the Canvas export ``roster``; see the module's text."""
    _, table = read_roster(roster)
    with open(roster, newline="", encoding="utf-8-sig") as f:
        header_in = next(csv.reader(f))
    missing = [c for c in CANVAS_FIXED if c not in header_in]
    if missing:
        raise SystemExit(f"--canvas {roster}: not Canvas's gradebook export (no column {', '.join(missing)})")
    columns = {n: next((h for h in header_in if re.fullmatch(rf"{re.escape(n)} \(\d+\)", h)), n) for n in names}
    by_key = {}
    for s in students:
        by_key.setdefault(("login", s["id"]), s)
        if s["lms_user_id"]:
            by_key.setdefault(("canvas", s["lms_user_id"]), s)
    rows = [["    Points Possible", "", "", "", "", *[maxima[n] for n in names]]]
    matched = set()
    for login, row in table.items():
        s = (by_key.get(("login", login)) or by_key.get(("login", row.get("SIS User ID", "")))
             or by_key.get(("canvas", row.get("ID", ""))))
        if s is None:
            print(f"warning: {login!r} of the Canvas roster is not in the gradebook: left blank", file=sys.stderr)
        else:
            matched.add(s["id"])
        rows.append([*(row.get(c, "") for c in CANVAS_FIXED), *([s["final"][n] for n in names] if s else
                                                                ["" for _ in names])])
    for s in students:
        if s["id"] not in matched:
            print(f"warning: {s['id']!r} of the gradebook is not on the Canvas roster: not exported", file=sys.stderr)
    return _table([*CANVAS_FIXED, *(columns[n] for n in names)], rows)


def moodle(names, maxima, students) -> str:
    rows = [[s["email"], s["id"], *[s["final"][n] for n in names]] for s in students]
    return _table(["Email address", "ID number", *names], rows)


def export(gradebook: Path, to: Path, canvas_roster: Path | None = None, to_moodle: bool = False) -> None:
    names, maxima, students = term_grades(gradebook)
    if canvas_roster is not None:
        text = canvas(names, maxima, students, canvas_roster)
    elif to_moodle:
        text = moodle(names, maxima, students)
    else:
        text = plain(names, maxima, students)
    atomic_write_text(to, text)
    print(f"wrote {to}: {len(students)} students, {len(names)} assignments")
