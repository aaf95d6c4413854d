"""A second correct solution of each problem set, written from the notebook's text alone (never from
``solutions/``), keeps full marks under every seed: the hidden checks never ask more than the text states.

Each module of ``tests/independent_solutions/`` (named as the set's module in ``autograder/assignments/``) has
``ANSWERS``, grade_id -> the source of every code answer cell. The notebook is the release with those answers
(written answers left as released), run in-process and judged by the grader's own capture and judge
(``test_wrong_variants.Harness``).

The capstones use their own harnesses: ps11-train in-process with the reference's trained weights loaded into the
independent Llama in place of its training run (cell ``model``; ``test_wrong_variants_capstones``), plus one run of
the whole notebook, training included, through the real command line; ps12-flash in triton's interpreter
(``test_wrong_variants_flash``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import submission, write
from test_wrong_variants import SEEDS, _namespace, _test_cells, _visible_failures, read_grades
from test_wrong_variants import harnesses  # noqa: F401 - a fixture
from test_wrong_variants_capstones import PS11, ROOT, TRAINED_MODEL, TRAINING, FastHarness, _release_items, trained_state
from test_wrong_variants_flash import PS12, interpreter  # noqa: F401 - a fixture

HERE = Path(__file__).resolve().parent / "independent_solutions"
CAPSTONES = (PS11, PS12)  # their own harnesses: tests/test_wrong_variants_capstones.py and _flash.py


def _answers_path(assignment: str) -> Path:
    return HERE / f"{assignments.ASSIGNMENTS[assignment].rsplit('.', 1)[1]}.py"


def independent_answers(assignment: str) -> dict[str, str]:
    path = _answers_path(assignment)
    spec = importlib.util.spec_from_file_location(f"independent_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ANSWERS


WRITTEN = [a for a in sorted(assignments.ASSIGNMENTS) if a not in CAPSTONES]


def test_every_problem_set_has_an_independent_solution():
    assert [a for a in assignments.ASSIGNMENTS if not _answers_path(a).exists()] == []


@pytest.mark.parametrize("assignment", WRITTEN)
def test_an_independent_correct_notebook_keeps_full_marks_under_every_seed(assignment, harnesses):
    ns = _namespace(assignment, answers=independent_answers(assignment))
    assert _visible_failures(assignment, ns, _test_cells(assignment)) == {}
    harness = harnesses(assignment)
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


def test_ps11_independent_notebook_keeps_full_marks_under_every_seed(tmp_path, monkeypatch):
    """Every check under the capstone suite's seeds, the held-out one with the independent Llama loaded with the
    reference's trained weights (as the capstone suite does); the notebook's own training run is graded below."""
    ns = _namespace(PS11, answers=independent_answers(PS11), skip=frozenset({TRAINING[PS11][0]}),
                    cwd=ROOT / "exercises" / PS11)
    ns["TRAINED_STATE"] = trained_state()
    exec(compile(TRAINED_MODEL, "<ps11: the trained model>", "exec"), ns)  # noqa: S102 - our code
    monkeypatch.chdir(tmp_path)  # the checkpoint test and wrapper write their files in the working directory
    assert _visible_failures(PS11, ns, set(_test_cells(PS11))) == {}
    harness = FastHarness(PS11, tmp_path / "harness")
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


def test_ps12_independent_kernels_keep_full_marks_under_every_seed(harnesses, interpreter):  # noqa: F811
    ns = _namespace(PS12, answers=independent_answers(PS12))
    assert _visible_failures(PS12, ns, _test_cells(PS12)) == {}
    harness = harnesses(PS12)
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_ps11_independent_notebook_with_its_training_run_gets_full_marks_through_the_command_line(tmp_path):
    """The whole notebook, training run included, in the sandbox with the grader's default CPU limits; the
    wall-clock limits are raised because this test machine may be shared."""
    notebook = assignments.load(PS11).NOTEBOOK
    write(submission(PS11, notebook, answers=independent_answers(PS11), solved=False), tmp_path / "subs" / "indep",
          notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", PS11, str(tmp_path / "subs"), "--out", str(out), "--workers", "1",
                        "--timeout", "240", "--notebook-timeout", "600"]) == 0
    row = read_grades(out)["indep"]
    assert row["status"] == "graded" and float(row["score"]) == sum(i.points for i in _release_items(PS11)), row
