"""``--gradebook PATH``: record every graded submission in nbgrader's own gradebook database.

nbgrader's database is the record for grading by hand. Each test cell becomes a grade cell with its automatic
score; each written answer a grade cell that needs a manual grade; a manual score already given survives a
regrade. Beside the database, in the course folder's ``autograded/<student>/<assignment>/``, the grader writes
the notebook formgrader shows: the release notebook with the student's written answers in place (the student's
code and the automatic results are in the feedback page). Then, in that course folder, formgrader (JupyterLab,
"Formgrader", "Manual grading") lists the answers to grade, and ``nbgrader export`` writes one CSV with the
automatic and the manual points together.

Example::

    python -m autograder grade ps1-attention submissions/ --out out/ --gradebook course/gradebook.db
    cd course && nbgrader export --to grades-with-manual.csv
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import nbformat

from autograder.feedback import folder_name


def _autograded_notebook(release: nbformat.NotebookNode, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The release notebook with the student's written answers in their cells (metadata kept, so that
    formgrader finds the cells to grade)."""
    nb = copy.deepcopy(release)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    note = ("*Written answers of this submission, for grading by hand. The student's code and the automatic "
            "results are in the grader's feedback page.*")
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(note))
    return nb


def record(path: Path, assignment: str, notebook: str, template, results, release: nbformat.NotebookNode) -> None:
    """Create or update the assignment, its graded cells, the students and their submissions in the gradebook
    at ``path`` (sqlite), with the automatic score of every test cell, and write the notebooks formgrader shows
    into ``autograded/`` beside it."""
    from nbgrader.api import Gradebook, MissingEntry

    # nbgrader creates a new database by running the `alembic` command, which lives beside this interpreter
    # (the venv's bin/), not necessarily on the instructor's PATH.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    path.parent.mkdir(parents=True, exist_ok=True)
    name = Path(notebook).stem
    with Gradebook(f"sqlite:///{path.resolve()}") as gradebook:
        gradebook.update_or_create_assignment(assignment)
        gradebook.update_or_create_notebook(name, assignment)
        for item in template.items:
            manual = item.kind == "manual"
            gradebook.update_or_create_grade_cell(item.grade_id, name, assignment, max_score=item.points,
                                                  cell_type="markdown" if manual else "code")
            if manual:  # a written answer is a solution cell that is graded by hand
                gradebook.update_or_create_solution_cell(item.grade_id, name, assignment)
        for result in results:
            student = folder_name(result.student)  # nbgrader uses the id in paths: the same safe name as feedback/
            gradebook.update_or_create_student(student)
            try:
                gradebook.find_submission(assignment, student)
            except MissingEntry:
                gradebook.add_submission(assignment, student)
            points = {i.grade_id: i.points for i in result.items}
            for item in template.items:
                grade = gradebook.find_grade(item.grade_id, name, assignment, student)
                if item.kind == "manual":
                    grade.auto_score = None
                    grade.needs_manual_grade = grade.manual_score is None
                else:
                    grade.auto_score = points.get(item.grade_id) or 0.0
                    grade.needs_manual_grade = False
            gradebook.db.commit()
            folder = path.parent / "autograded" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            nbformat.write(_autograded_notebook(release, result.answers), folder / notebook)
