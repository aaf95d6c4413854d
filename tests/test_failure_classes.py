"""Every failure class in every draw (README, "Writing a problem set"): each problem set lists, in its module's
``FAILURE_CLASSES``, the ways an answer can be wrong that its hidden checks cover, and every draw of the hidden
cases meets each of them. Random cases vary values, never which classes are covered, so the same bug loses the
same points under any seed or secret."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autograder import assignments
from autograder.checks import FailureClass

DRAWS = range(20)
# ps6's two fit checks: their classes are told apart by the reference fit itself (about 1 s a case), and their
# cases have one fixed shape; 3 draws, as the variant suites' SEEDS_OF gives them.
DRAWS_OF = {"test_fit_exact": range(3), "test_fit_noisy": range(3)}
WITH_TABLES = sorted(assignments.ASSIGNMENTS)  # every problem set has its table


def test_every_problem_set_has_a_failure_class_table():
    assert [a for a in WITH_TABLES if not hasattr(assignments.load(a), "FAILURE_CLASSES")] == []


@pytest.mark.parametrize("assignment", WITH_TABLES)
def test_the_table_names_real_checks_and_covers_every_check(assignment):
    module = assignments.load(assignment)
    classes = module.FAILURE_CLASSES
    assert all(isinstance(c, FailureClass) for c in classes)
    names = [c.name for c in classes]
    assert len(names) == len(set(names)), "two failure classes share a name"
    unknown = {c.check for c in classes} - set(module.CHECKS)
    assert not unknown, f"failure classes name checks that do not exist: {sorted(unknown)}"
    uncovered = set(module.CHECKS) - {c.check for c in classes}
    assert not uncovered, f"checks with no failure class: {sorted(uncovered)}"


@pytest.mark.parametrize("assignment", WITH_TABLES)
def test_every_draw_meets_every_failure_class(assignment):
    module = assignments.load(assignment)
    for draw in DRAWS:
        cases = {gid: check.cases(np.random.default_rng(draw)) for gid, check in module.CHECKS.items()
                 if draw in DRAWS_OF.get(gid, DRAWS)}
        missed = [c.name for c in module.FAILURE_CLASSES
                  if c.check in cases and not any(c.meets(case) for case in cases[c.check])]
        assert not missed, f"draw {draw} of {assignment} meets no case of: {missed}"


@pytest.mark.parametrize("assignment", WITH_TABLES)
def test_a_class_is_met_by_the_inputs_not_by_the_note(assignment):
    """The same case with its note removed meets the same classes: a predicate reads the inputs, so a class is met
    because the input exposes the failure, not because a note says so."""
    module = assignments.load(assignment)
    cases = {gid: check.cases(np.random.default_rng(0)) for gid, check in module.CHECKS.items()}
    for c in module.FAILURE_CLASSES:
        for case in cases[c.check]:
            assert c.meets(case) == c.meets(dataclasses.replace(case, note="")), (c.name, case.note)
