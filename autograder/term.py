"""The grader inside an nbgrader term: the course folder's layout, its roster, and submission times.

nbgrader's ``collect`` leaves ``submitted/<student>/<assignment>/`` with the notebooks, ``timestamp.txt``
and ``submission_secret.txt`` (nbgrader's, not the student's: never placed beside the notebook as extra files).
Here only ``<student>/<assignment>/`` is read for an assignment: a student whose folder holds other assignments
only is ``missing``, never graded from another assignment's notebook. A submission without a readable
``timestamp.txt`` is taken as submitted when the grader reads it, with a note (``submission_time``).
The roster (the gradebook's students, and/or a roster CSV) gives every student a row: a student with no
submission is ``missing``, with nothing left to grade by hand.

Example::

    python -m autograder grade ps1-attention --course course/     # course/submitted, course/gradebook.db
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from autograder.intake import CANVAS_NAME, Submission, student_name
from autograder.lateness import TIME_NOTE, format_time, parse_time
from autograder.results import csv_safe

CARRIED_FILES = ("timestamp.txt", "submission_secret.txt")  # nbgrader's files that autograded/ must keep
MAX_SMALL_FILE = 4096


@dataclass
class Term:
    """What the grader knows of the term for one assignment: each submission's time and LMS id, the roster,
    due date and extensions. Every field may be empty (a plain folder of submissions, no gradebook)."""

    submitted_at: dict[str, datetime] = field(default_factory=dict)
    late_flag: set[str] = field(default_factory=set)  # Canvas's _late marker
    time_notes: dict[str, str] = field(default_factory=dict)  # student -> how a missing time was taken
    lms_ids: dict[str, str] = field(default_factory=dict)  # student -> the LMS's user id
    roster: list[str] = field(default_factory=list)
    due: datetime | None = None
    extensions: dict[str, timedelta] = field(default_factory=dict)
    course_id: str = ""
    submitted_from: dict[str, Path] = field(default_factory=dict)  # student -> submitted/<student>/<assignment>
    ids: dict[str, str] = field(default_factory=dict)  # student -> nbgrader id, where it is not folder_name's
    absent: list[str] = field(default_factory=list)  # on the roster or in submitted/, without this assignment
    recorded: set[str] | None = None  # ids with a submission in the gradebook (None: no gradebook)

    def student_id(self, student: str) -> str:
        """The student's distinct, stable id in feedback/, grades.csv and the gradebook: nbgrader's own id
        (the folder name in submitted/) in a course folder, else ``feedback.folder_name``."""
        from autograder.feedback import folder_name

        return self.ids.get(student) or folder_name(student)


def is_nbgrader_layout(folder: Path, declared: bool = False) -> bool:
    """Whether ``folder`` is read as nbgrader's ``submitted/``: when the instructor says so (``--nbgrader-layout``)
    or the folder sits in a course folder (``nbgrader_config.py`` beside it). Never decided by what an entry
    holds: one student's upload shaped like nbgrader's layout must not change how the others are read."""
    return declared or (folder.parent / "nbgrader_config.py").exists()


def _small_text(path: Path) -> str | None:
    """A small regular file's text (no links followed), or None."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_SMALL_FILE:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def submission_time(path: Path, name: str, assignment: str, now: datetime) -> tuple[datetime, str]:
    """The time of nbgrader's submission folder ``path`` from its ``timestamp.txt``, and a note. Without a
    readable time there (missing, a link, too large, not a date and time), the submission is taken as submitted
    at ``now``, the time the grader read it: late from the due date, never on time for want of a time."""
    stamp = _small_text(path / "timestamp.txt")
    problem = "is missing, a link or not a small file"
    if stamp is not None and stamp.strip():
        try:
            return parse_time(stamp, f"{name}/{assignment}/timestamp.txt"), ""
        except ValueError:
            problem = f"holds {stamp.strip()[:40]!r}, not a date and time"
    elif stamp is not None:
        problem = "is empty"
    return now, (f"{TIME_NOTE}nbgrader's timestamp.txt {problem}: taken as submitted when the grader read it "
                 f"({format_time(now)})")


def nbgrader_submissions(folder: Path, assignment: str) -> tuple[dict[str, Submission], dict[str, datetime],
                                                                   list[str], list[str], dict[str, str]]:
    """From nbgrader's ``submitted/``: student -> ``<student>/<assignment>/`` (only that folder), each one's
    time (``submission_time``), the students whose folder lacks this assignment, warnings, and student -> the
    note on a time that had to be taken as the grading time. A folder whose name (nbgrader's student id, which
    comes from a name in the exchange's ``inbound/``) a spreadsheet would read as a formula is refused with a
    warning: it never enters grades.csv or the gradebook, which ``nbgrader export`` writes out raw."""
    found, times, absent, warnings, notes = {}, {}, [], [], {}
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise SystemExit(f"cannot read the submissions folder {folder}: {err.strerror or err} (in a course folder, "
                         f"run `nbgrader collect {assignment}` first)") from None
    for entry in entries:
        name = student_name(entry.name)
        if not entry.is_dir(follow_symlinks=False):
            warnings.append(f"{name}: ignored, not a student folder of nbgrader's submitted/ layout")
            continue
        if csv_safe(name) != name:
            warnings.append(f"{csv_safe(name)}: ignored, a student id that a spreadsheet would read as a formula "
                            "(it comes from a folder name in the exchange); nothing of it enters grades.csv or the "
                            "gradebook")
            continue
        path = Path(entry.path) / assignment
        if path.is_symlink():
            found[name] = Submission(path, "link", f"{assignment}/ of {name} is a symbolic link; the grader never "
                                                   "follows links")
        elif path.is_dir():
            found[name] = Submission(path, "folder", bookkeeping=CARRIED_FILES)
            times[name], note = submission_time(path, name, assignment, now)
            if note:
                notes[name] = note
                warnings.append(f"{name}: {note}")
        else:
            absent.append(name)
    return found, times, absent, warnings, notes


def canvas_details(submissions: dict[str, Submission]) -> tuple[dict[str, str], set[str]]:
    """Canvas's user id and ``_late`` marker from the names of Canvas files
    (``<name>[_late]_<userid>_<submissionid>_<file>.ipynb``)."""
    ids, late = {}, set()
    for student, submission in submissions.items():
        if submission.kind != "file":
            continue
        match = CANVAS_NAME.match(submission.path.name)
        if match:
            ids[student] = match["user"]
            if re.match(rf"^{re.escape(match['name'])}_late_", submission.path.name, re.IGNORECASE):
                late.add(student)
    return ids, late


CANVAS_TEST_STUDENTS = {"Student, Test", "Test Student"}  # the account Canvas adds to every course ("Student View")


def read_roster(path: Path, option: str = "--roster") -> tuple[list[str], dict[str, dict[str, str]]]:
    """A roster CSV: nbgrader's (``id,first_name,last_name,email``, as ``nbgrader db student import`` reads it)
    or Canvas's gradebook export (``Student,ID,SIS User ID,SIS Login ID,Section``, where the student id is the
    SIS Login ID). Canvas's test student (no SIS Login ID) is left out, with a note. Errors name ``option``, the
    command-line option that gave the file. -> the ids in order, and id -> the row."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise SystemExit(f"{option} {path}: {err.strerror or err}") from None
    if not rows:
        raise SystemExit(f"{option} {path}: no students")
    key = "id" if "id" in rows[0] else "SIS Login ID" if "SIS Login ID" in rows[0] else None
    if key is None:
        raise SystemExit(f"{option} {path}: needs a column 'id' (nbgrader) or 'SIS Login ID' (Canvas)")
    table = {}
    for line, row in enumerate(rows, start=2):
        name = (row.get("Student") or "").strip()
        if "Points Possible" in name:
            continue  # Canvas's second header row
        student = (row.get(key) or "").strip()
        if not student and key == "SIS Login ID" and name in CANVAS_TEST_STUDENTS:
            print(f"note: {option} {path}, line {line}: Canvas's test student ({name!r}) is not a student of the "
                  "course: left out", file=sys.stderr)
            continue
        if not student:
            raise SystemExit(f"{option} {path}, line {line}: the column {key!r} is empty ({name or 'no name'})")
        if student in table:
            raise SystemExit(f"{option} {path}, line {line}: {student!r} is listed twice")
        table[student] = row
    return list(table), table


def carry_files(submitted: Path, autograded: Path, taken: datetime | None = None) -> None:
    """Copy nbgrader's ``timestamp.txt`` and ``submission_secret.txt`` (small, no links) into
    ``autograded/<student>/<assignment>/``: ``generate_feedback`` and ``release_feedback`` read them there, and
    ``release_feedback`` stops for the whole class at one that is missing. So ``taken``, the time the grader took
    for a submission without a readable ``timestamp.txt``, is written in its place (as nbgrader writes times),
    and a missing secret is replaced by a new random one (that student's ``fetch_feedback`` then finds no page:
    ask them to submit again)."""
    for name in CARRIED_FILES:
        text = _small_text(submitted / name)
        if name == "timestamp.txt" and taken is not None:
            text = f"{taken:%Y-%m-%d %H:%M:%S.%f} UTC"
        elif name == "submission_secret.txt" and not (text or "").strip():
            text = secrets.token_hex(16)
        if text is not None:
            (autograded / name).write_text(text, encoding="utf-8")


def gradebook_roster(path: Path) -> tuple[list[str], dict[str, str], str]:
    """The students of an existing gradebook, LMS user id -> student id, and the course id (nothing when there
    is no gradebook yet)."""
    from autograder.gradebook import course_id_of, open_gradebook

    if not path.exists():
        return [], {}, ""
    with open_gradebook(path) as gradebook:
        students = gradebook.students
        return ([s.id for s in students], {s.lms_user_id: s.id for s in students if s.lms_user_id},
                course_id_of(path))


def gradebook_assignment(path: Path, assignment: str) -> tuple[datetime | None, set[str]]:
    """The assignment's due date in the gradebook and the ids of the students with a submission of it."""
    from nbgrader.api import MissingEntry

    from autograder.gradebook import open_gradebook

    if not path.exists():
        return None, set()
    with open_gradebook(path) as gradebook:
        try:
            found = gradebook.find_assignment(assignment)
        except MissingEntry:
            return None, set()
        return found.duedate, {s.student.id for s in found.submissions}


def gather(folder: Path, assignment: str, notebook: str, out: Path, gradebook: Path | None,
           roster_csv: Path | None, extensions_csv: Path | None, due: str | None, nbgrader_layout: bool = False):
    """Every submission of ``assignment`` in ``folder`` (nbgrader's layout or an LMS's), and the ``Term``:
    times, LMS ids, roster (gradebook's and CSV's), the students without a submission, the due date (``due``,
    else the gradebook's) and extensions. -> (submissions, term, warnings)."""
    from autograder.intake import find_submissions
    from autograder.lateness import read_extensions

    term = Term()
    if is_nbgrader_layout(folder, nbgrader_layout):
        submissions, term.submitted_at, absent, warnings, term.time_notes = nbgrader_submissions(folder, assignment)
        term.submitted_from = {s: sub.path for s, sub in submissions.items() if sub.kind == "folder"}
        term.ids = {s: s for s in [*submissions, *absent] if "/" not in s and s.isprintable()}
    else:
        submissions, warnings = find_submissions(folder, notebook, exclude=out)
        absent = []
        term.lms_ids, term.late_flag = canvas_details(submissions)
    if gradebook is not None:
        term.roster, by_lms_id, term.course_id = gradebook_roster(gradebook)
        # a Canvas file names the student's Canvas user id: the gradebook's student with that id is the student
        term.ids.update({s: by_lms_id[i] for s, i in term.lms_ids.items() if i in by_lms_id})
        lms_of = {student: lms for lms, student in by_lms_id.items()}  # and a student id gives the LMS's user id
        term.lms_ids.update({s: lms_of[term.student_id(s)] for s in [*submissions, *absent, *term.roster]
                             if s not in term.lms_ids and term.student_id(s) in lms_of})
        gradebook_due, term.recorded = gradebook_assignment(gradebook, assignment)
        if due is None:
            term.due = gradebook_due
    if roster_csv is not None:
        ids, _ = read_roster(roster_csv)
        term.roster += [s for s in ids if s not in term.roster]
    if due is not None:
        try:
            term.due = parse_time(due, "--due")
        except ValueError as err:
            raise SystemExit(str(err)) from None
    if extensions_csv is not None:
        term.extensions = read_extensions(extensions_csv, assignment)
    known = {term.student_id(s) for s in submissions}
    term.absent = sorted({s for s in [*absent, *term.roster] if s not in submissions and s not in known})
    term.ids.update({s: s for s in term.roster if s not in submissions})
    return submissions, term, warnings
