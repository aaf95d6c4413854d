"""Every hidden case says in one line what it checks, and a failing case's feedback shows that line.

The cases are built as the grader builds them (``check.cases(_case_rng(seed, digest, grade_id))``), under a few
seeds, since some checks add random cases whose number depends on the draw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autograder import assignments, capture
from autograder.checks import OUTPUTS, expected_results, judge, write_inputs
from autograder.grade import _case_rng

NAMES = sorted(assignments.ASSIGNMENTS)


@pytest.mark.parametrize("name", NAMES)
def test_every_hidden_case_has_a_one_line_note(name):
    module = assignments.load(name)
    for seed in range(3):
        for gid, check in module.CHECKS.items():
            cases = check.cases(_case_rng(seed, f"digest-{seed}", gid))
            assert cases, f"{name} {gid}: no cases"
            for i, case in enumerate(cases):
                where = f"{name} {gid}, case {i + 1} of {len(cases)} (seed {seed})"
                assert isinstance(case.note, str) and case.note.strip(), f"{where} has no note"
                assert "\n" not in case.note and len(case.note) <= 100, f"{where}: the note is not one short line"


def _softmax_plus_one(x, axis=-1):
    """A wrong softmax: its rows sum to 2."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True) + 1.0 / np.shape(x)[axis]


@pytest.mark.parametrize("gid", ["test_softmax_examples", "test_softmax_stability", "test_softmax_axis"])
def test_a_failing_hidden_case_names_its_note_in_the_feedback(gid, tmp_path: Path):
    """A wrong softmax through the sandbox's own harness (``capture.capture``, here in-process) and ``judge``:
    the message of the first failing case carries that case's note."""
    module = assignments.load("ps1-attention")
    check = module.CHECKS[gid]
    cases = check.cases(_case_rng(0, "digest", gid))
    expected = expected_results(check, cases, module.TRUSTED_CALLABLES)
    write_inputs(gid, check, cases, expected, tmp_path / "inputs")
    capture.capture(gid, namespace={"softmax": _softmax_plus_one}, inputs=str(tmp_path / "inputs"),
                    outputs=str(tmp_path / "outputs"))
    files = {f"{OUTPUTS}/{gid}/{p.name}": p.read_bytes() for p in (tmp_path / "outputs" / gid).iterdir()}
    result = judge(check, gid, cases, expected, files)
    assert not result.passed
    assert result.message.startswith(f"hidden case 1 of {len(cases)} ({cases[0].note}), softmax("), result.message


@pytest.mark.parametrize("name,gid", [("ps8-objectives", "test_mlm_invariants"),
                                      ("ps9-data", "test_minhash_signature")])
def test_a_verdict_names_a_failing_case_by_its_note(name, gid):
    """Checks judged by a verdict on all outputs together (random masks, MinHash signatures) name a failing case
    the same way: arrays of the wrong shape fail the first case."""
    check = assignments.load(name).CHECKS[gid]
    cases = check.cases(_case_rng(0, "digest", gid))
    message = check.verdict(cases, [(np.zeros(1, dtype=np.int64),) * 2 for _ in cases])
    assert message.startswith(f"hidden case 1 of {len(cases)} ({cases[0].note}), {check.function}("), message
