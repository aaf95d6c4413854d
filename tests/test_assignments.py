"""The assignments themselves: releases in sync with solutions, solutions pass their own visible tests, the
release fails them helpfully, every graded cell has a trusted check, a failed check reads well in Jupyter, and
nbgrader's own autograde refuses to grade (the course is graded by `python -m autograder grade`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.api import Gradebook

from autograder import assignments
from autograder.__main__ import generate
from autograder.notebooks import Template
from submissions import submission

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(assignments.ASSIGNMENTS)


def _notebook(name):
    return assignments.load(name).NOTEBOOK


def test_exercises_are_in_sync_with_solutions(tmp_path):
    """`exercises/` must be exactly what nbgrader generates from `solutions/` (run `make assignments`)."""
    generate(NAMES, release_dir=tmp_path)
    for name in NAMES:
        fresh = json.loads((tmp_path / name / _notebook(name)).read_text())
        committed = json.loads((ROOT / "exercises" / name / _notebook(name)).read_text())
        assert fresh == committed, f"exercises/{name} is out of date: run `make assignments` and commit the result"


@pytest.mark.parametrize("name", NAMES)
def test_every_graded_cell_has_a_trusted_check(name):
    template = Template.from_release(nbformat.read(ROOT / "exercises" / name / _notebook(name), as_version=4))
    auto = {i.grade_id for i in template.auto_items}
    assert auto == set(assignments.load(name).CHECKS), "test cells and CHECKS must name the same grade_ids"
    assert all(i.points > 0 for i in template.items)


@pytest.mark.parametrize("name", NAMES)
def test_release_hides_solutions_and_hidden_tests(name):
    text = (ROOT / "exercises" / name / _notebook(name)).read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    assert "raise NotImplementedError()" in text


def _execute(nb):
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    return [(c.metadata.get("nbgrader", {}).get("grade_id"), o) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_its_visible_tests_and_release_fails_them(name):
    solution = nbformat.read(ROOT / "solutions" / name / _notebook(name), as_version=4)
    assert _execute(solution) == [], "the solution notebook must run without errors"
    errors = _execute(nbformat.read(ROOT / "exercises" / name / _notebook(name), as_version=4))
    failing = {gid for gid, _ in errors}
    template = Template.from_release(nbformat.read(ROOT / "exercises" / name / _notebook(name), as_version=4))
    assert {i.grade_id for i in template.auto_items} <= failing, "every visible test must fail on the empty release"
    assert {o["ename"] for _, o in errors} <= {"NotImplementedError"}, "the release fails by NotImplementedError only"


def test_a_failed_check_shows_its_message_first_and_names_a_broken_helper():
    """In Jupyter a failed check is two lines (the message and a hint), not a traceback; the tests of a function
    that uses a broken one (multi-head attention uses softmax) say to fix that one first."""
    wrong_softmax = "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n"
    nb = submission("ps1-attention", "ps1-attention.ipynb", answers={"softmax": wrong_softmax}, extra_cells=["%tb"])
    errors = dict(_execute(nb)[:-1])  # the last error is %tb showing the full traceback
    first = errors["test_softmax_examples"]
    assert first["ename"] == "AssertionError"
    assert first["traceback"][0].startswith("FAILED: softmax([1, 0, 0]): "), first["traceback"]
    assert len(first["traceback"]) == 2 and "%tb" in first["traceback"][1]
    assert errors["test_mha_two_heads"]["traceback"][0] == (
        "FAILED: multi_head_attention uses your softmax, which gives a wrong result on [1, 2, 3]: fix softmax first "
        "(its tests are above)")
    full = nb.cells[-1].outputs[0]
    assert len(full["traceback"]) > 2 and "Traceback" in full["traceback"][1]  # %tb still shows everything


def test_nbgrader_autograde_gives_zero_and_says_why(tmp_path):
    """nbgrader's own autograde (which runs the hidden-test blocks of the solutions) must fail every test cell with
    a message pointing to the course's grader, not quietly grade the visible tests: a correct submission scores 0."""
    name, notebook = "ps4-decoding", "ps4-decoding.ipynb"
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions" / name, course / "source" / name)
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'check'\n"
                                               "c.ExecutePreprocessor.timeout = 120\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    nbgrader = [sys.executable, "-m", "nbgrader"]
    subprocess.run([*nbgrader, "generate_assignment", name], cwd=course, env=env, check=True, capture_output=True)
    target = course / "submitted" / "alice" / name
    target.mkdir(parents=True)
    nbformat.write(submission(name, notebook), target / notebook)  # correct work
    done = subprocess.run([*nbgrader, "autograde", name], cwd=course, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    graded = nbformat.read(course / "autograded" / "alice" / name / notebook, as_version=4)
    template = Template.from_release(nbformat.read(ROOT / "exercises" / name / notebook, as_version=4))
    tests = {i.grade_id for i in template.auto_items}
    errors = {c.metadata["nbgrader"]["grade_id"]: o for c in graded.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"}
    assert set(errors) == tests, "every test cell fails, and nothing else"
    for output in errors.values():
        assert output["ename"] == "RuntimeError" and "python -m autograder grade" in output["evalue"], output
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        result = gradebook.find_submission(name, "alice")
        assert result.max_score == sum(i.points for i in template.items) > 0
        assert result.score == 0


@pytest.mark.parametrize("name", NAMES)
def test_a_visible_test_calls_no_other_function_of_the_student(name):
    """The expected values of a visible test are written out (numbers, or a few lines of NumPy), never computed with
    another function the student wrote: each test cell calls exactly one of the student's functions (for the
    Chinchilla fit that is chinchilla_fit, which the set-up cell's fitted_losses calls)."""
    import ast

    solution = nbformat.read(ROOT / "solutions" / name / _notebook(name), as_version=4)
    students = {c.metadata["nbgrader"]["grade_id"] for c in solution.cells
                if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}
    checks = assignments.load(name).CHECKS
    template = Template.from_release(nbformat.read(ROOT / "exercises" / name / _notebook(name), as_version=4))
    for item in template.auto_items:
        used = {node.id for node in ast.walk(ast.parse(item.source)) if isinstance(node, ast.Name)} & students
        function = checks[item.grade_id].function
        assert len(used) == 1 and (used == {function} or function not in students), (item.grade_id, used)
