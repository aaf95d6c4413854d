"""A second correct solution of each problem set, written from the notebook's text alone (never from
``solutions/``), keeps full marks under every seed: the hidden checks never ask more than the text states.

Each module of ``tests/independent_solutions/`` (named as the set's module in ``autograder/assignments/``) has
``ANSWERS``, grade_id -> the source of every code answer cell. The notebook is the release with those answers
(written answers left as released), run in-process and judged by the grader's own capture and judge
(``test_wrong_variants.Harness``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from autograder import assignments
from test_wrong_variants import SEEDS, _namespace, _test_cells, _visible_failures
from test_wrong_variants import harnesses  # noqa: F401 - a fixture

HERE = Path(__file__).resolve().parent / "independent_solutions"
CAPSTONES = ("ps11-train", "ps12-flash")  # their own harness: tests/test_wrong_variants_capstones.py


def independent_answers(assignment: str) -> dict[str, str]:
    path = HERE / f"{assignments.ASSIGNMENTS[assignment].rsplit('.', 1)[1]}.py"
    spec = importlib.util.spec_from_file_location(f"independent_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ANSWERS


WRITTEN = [a for a in sorted(assignments.ASSIGNMENTS) if a not in CAPSTONES
           and (HERE / f"{assignments.ASSIGNMENTS[a].rsplit('.', 1)[1]}.py").exists()]


@pytest.mark.parametrize("assignment", WRITTEN)
def test_an_independent_correct_notebook_keeps_full_marks_under_every_seed(assignment, harnesses):
    ns = _namespace(assignment, answers=independent_answers(assignment))
    assert _visible_failures(assignment, ns, _test_cells(assignment)) == {}
    harness = harnesses(assignment)
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"
