"""``--gradebook PATH``: record every graded submission in nbgrader's own gradebook database.

nbgrader's database is the record for grading by hand and for the term. For each submission the grader
writes: the student (with the LMS's user id where one is known), the submission with nbgrader's own
timestamp (from ``timestamp.txt``), the student's extension and the late penalty in points, each test cell's
automatic score, and each written answer as a grade that needs a manual grade (a manual score already given
survives a regrade). Students of the roster who did not submit are added as students without a submission,
as nbgrader itself keeps them. Beside the database, in the course folder's
``autograded/<student>/<assignment>/``, it writes the notebook that formgrader shows and that
``generate_feedback`` turns into the student's feedback (``autograder/nbfeedback.py``), with nbgrader's
``timestamp.txt`` and ``submission_secret.txt``, and removes the student's old ``feedback/<student>/<assignment>/``,
so that ``generate_feedback`` makes the page of this grading. Formgrader then lists graded work as graded, and
``nbgrader export`` adds the manual points and subtracts the penalty.

Example::

    python -m autograder grade ps1-attention --course course/
    cd course && nbgrader export --to grades-with-manual.csv
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import contextmanager
from unittest import mock
from pathlib import Path

import nbformat

from autograder.term import carry_files

DEFAULT_COURSE_ID = "llmarch"


def _alembic_head() -> str:
    """The schema version nbgrader stamps into a new database, read from nbgrader's own migration scripts in
    this process (nbgrader itself runs the ``alembic`` command for it, which must be on PATH, and takes
    seconds)."""
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def course_id_of(path: Path) -> str:
    """The course id recorded in an existing gradebook (its one ``course`` row), else the course's default;
    the grader writes under that id, so that it adds no second course (no stray ``default_course``)."""
    if path.exists():
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                ids = [row[0] for row in db.execute("SELECT id FROM course")]
        except sqlite3.Error:
            ids = []
        if len(ids) > 1:  # nbgrader's generate_feedback adds "default_course" (GetGrades opens it without an id)
            ids = [i for i in ids if i != "default_course"]
        if len(ids) == 1:
            return ids[0]
    return DEFAULT_COURSE_ID


def check_writable(path: Path) -> None:
    """Refuse (SystemExit, before anything is graded) a gradebook path the grader could not write: a folder
    that cannot be created or written, a file that is not an sqlite database, or a locked or read-only one."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"--gradebook {path}: cannot create its folder ({err.strerror or err})") from None
    if path.is_dir():
        raise SystemExit(f"--gradebook {path} is a folder, not a database file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SystemExit(f"--gradebook {path}: its folder {folder} is not writable (sqlite needs to write a "
                         "journal beside the database)")
    if path.exists():
        try:
            with sqlite3.connect(str(path), timeout=10) as db:
                db.execute("BEGIN IMMEDIATE")
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
                db.rollback()
        except sqlite3.Error as err:
            raise SystemExit(f"--gradebook {path} cannot be written as an sqlite database: {err}") from None


@contextmanager
def open_gradebook(path: Path, course_id: str | None = None):
    """nbgrader's ``Gradebook`` on ``path`` under the course's id. A new database (also in place of an empty
    file) is made under a temporary name and renamed into place, so that a run killed while nbgrader creates its
    tables leaves no half-made gradebook."""
    import nbgrader.api
    from nbgrader.api import Gradebook

    course_id = course_id or course_id_of(path)
    if not path.exists() or path.stat().st_size == 0:  # none yet, or an empty file a killed run left
        temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
        temporary.unlink(missing_ok=True)
        head = _alembic_head()
        with mock.patch.object(nbgrader.api, "get_alembic_version", lambda: head):
            with Gradebook(f"sqlite:///{temporary.resolve()}", course_id=course_id):
                pass
        os.replace(temporary, path)
    with Gradebook(f"sqlite:///{path.resolve()}", course_id=course_id) as gradebook:
        yield gradebook


def ensure_assignment(gradebook, assignment: str, notebook: str, template, release: nbformat.NotebookNode,
                      due=None) -> None:
    """The assignment, its notebook, its graded cells (points from the release notebook) and its solution
    cells (where formgrader takes comments) in the gradebook; ``due`` (naive UTC) is set when given."""
    name = Path(notebook).stem
    if due is not None:
        gradebook.update_or_create_assignment(assignment, duedate=due)
    else:
        gradebook.update_or_create_assignment(assignment)
    gradebook.update_or_create_notebook(name, assignment)
    for item in template.items:
        gradebook.update_or_create_grade_cell(item.grade_id, name, assignment, max_score=item.points,
                                              cell_type="markdown" if item.kind == "manual" else "code")
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id"):
            gradebook.update_or_create_solution_cell(meta["grade_id"], name, assignment)


def record(path: Path, assignment: str, notebook: str, template, results, release: nbformat.NotebookNode,
           term, timings: dict, autograded_notebooks: dict) -> None:
    """Create or update the assignment, the roster's students and every submission of ``results`` in the
    gradebook at ``path``, and write ``autograded/<student>/<assignment>/`` beside it (``autograded_notebooks``:
    student -> notebook; ``timings``: student -> ``lateness.Timing``)."""
    from nbgrader.api import MissingEntry

    name = Path(notebook).stem
    course = path.parent
    with open_gradebook(path, term.course_id or None) as gradebook:
        ensure_assignment(gradebook, assignment, notebook, template, release)
        for student in term.roster:
            gradebook.update_or_create_student(student)
        for result in results:
            student = term.student_id(result.student)
            extra = {"lms_user_id": term.lms_ids[result.student]} if result.student in term.lms_ids else {}
            gradebook.update_or_create_student(student, **extra)
            if result.status == "missing" and result.student not in timings:
                continue  # nothing was submitted: like nbgrader, no submission
            timing = timings.get(result.student)
            try:
                submission = gradebook.find_submission(assignment, student)
            except MissingEntry:
                submission = gradebook.add_submission(assignment, student)
            submission.timestamp = timing.submitted_at if timing else None
            submission.extension = timing.extension if timing else None
            points = {i.grade_id: i.points for i in result.items}
            for item in template.items:
                grade = gradebook.find_grade(item.grade_id, name, assignment, student)
                if item.kind == "manual":
                    grade.auto_score = 0.0 if result.status == "missing" else None
                    grade.needs_manual_grade = grade.manual_score is None and result.status != "missing"
                else:
                    grade.auto_score = points.get(item.grade_id) or 0.0
                    grade.needs_manual_grade = False
            submitted_notebook = gradebook.find_submission_notebook(name, assignment, student)
            submitted_notebook.late_submission_penalty = timing.penalty if timing else 0.0
            gradebook.db.commit()
            folder = course / "autograded" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            nbformat.write(autograded_notebooks[result.student], folder / notebook)
            if result.student in term.submitted_from:
                carry_files(term.submitted_from[result.student], folder,
                            timing.submitted_at if timing and result.student in term.time_notes else None)
            remove_stale_feedback(course / "feedback" / student / assignment)


def remove_stale_feedback(folder: Path) -> None:
    """Remove nbgrader's ``feedback/<student>/<assignment>/`` of a student just (re)graded: ``generate_feedback``
    skips a student whose folder exists ("Skipping existing assignment") unless the submission's time is newer,
    so after a regrade of the same submission the student would be handed the old page."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder)


def manual_state(path: Path, assignment: str) -> dict[str, tuple[float, float]]:
    """nbgrader id -> (total points, points still to grade by hand) of ``assignment``, from the gradebook:
    each grade counts its manual score where one was given, else its automatic score (nbgrader's rule).
    Students without a submission are absent."""
    from nbgrader.api import Assignment, Grade, GradeCell, Notebook, SubmittedAssignment, SubmittedNotebook

    if not path.exists():
        return {}
    state: dict[str, list[float]] = {}
    with open_gradebook(path) as gradebook:
        query = (gradebook.db.query(SubmittedAssignment.student_id, Grade.auto_score, Grade.manual_score,
                                    Grade.needs_manual_grade,
                                    GradeCell.max_score)
                 .join(SubmittedNotebook, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                 .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
                 .join(GradeCell, GradeCell.id == Grade.cell_id)
                 .join(Notebook, Notebook.id == GradeCell.notebook_id)
                 .join(Assignment, Assignment.id == Notebook.assignment_id)
                 .filter(Assignment.name == assignment))
        for student, auto, manual, needs, max_score in query:
            total, pending = state.setdefault(student, [0.0, 0.0])
            points = manual if manual is not None else (auto or 0.0)
            state[student] = [total + points, pending + (max_score if needs else 0.0)]
    return {student: (given, pending) for student, (given, pending) in state.items()}
