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


def _execute(nb, folder=None):
    """Run every cell (in ``folder``, where a set's data files sit) and return the errors."""
    resources = {"metadata": {"path": str(folder)}} if folder else {}
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True, resources=resources).execute()
    return [(c.metadata.get("nbgrader", {}).get("grade_id"), o) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_its_visible_tests_and_release_fails_them(name):
    solution = nbformat.read(ROOT / "solutions" / name / _notebook(name), as_version=4)
    assert _execute(solution, ROOT / "solutions" / name) == [], "the solution notebook must run without errors"
    released = nbformat.read(ROOT / "exercises" / name / _notebook(name), as_version=4)
    errors = _execute(released, ROOT / "exercises" / name)
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


def test_ps9_minhash_thresholds_fail_an_honest_solution_with_probability_below_1e_9():
    """ps9's MinHash collisions check: with c_k ~ Binomial(128, q_k), |q_k - J_k| <= 0.003, J_k in [0.2, 0.8],
    (1) Hoeffding bounds the mean test and (2) a Chernoff bound from the exact binomial distributions bounds the
    dispersion test, each below 1e-9, and (3) its lower tail bounds the dispersion floor (signatures that agree
    in exactly n J positions), below 1e-12. Each of the two groups of pairs (large and small unions) is
    tested alone, so the bounds hold for each."""
    from math import lgamma

    import numpy as np

    from autograder.assignments import ps9_data as m

    n, pairs, bias = m.NUM_PERM, m.COLLISION_PAIRS, 0.003
    trials = n * (pairs + 1)  # the random pairs and the disjoint pair
    assert 2 * np.exp(-2 * (m.MEAN_TOLERANCE - bias) ** 2 * trials) < 1e-9
    c = np.arange(n + 1)
    log_comb = np.array([lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1) for k in range(n + 1)])
    worst = np.full(200, -np.inf)  # max over J and q of log E[exp(lambda X)], on a grid of lambda
    lambdas = np.linspace(0.005, 0.5, 200)
    for j in np.linspace(0.2, 0.8, 601):
        x = (c - n * j) ** 2 / (n * j * (1 - j))
        for q in j + np.linspace(-bias, bias, 5):
            log_pmf = log_comb + c * np.log(q) + (n - c) * np.log(1 - q)
            log_mgf = np.logaddexp.reduce(log_pmf[None, :] + lambdas[:, None] * x[None, :], axis=1)
            worst = np.maximum(worst, log_mgf)
    log_bound = np.min(-lambdas * m.DISPERSION_FACTOR * pairs + pairs * worst)
    assert log_bound < np.log(1e-9), np.exp(log_bound)
    worst = np.full(300, -np.inf)  # the lower tail: max over J and q of log E[exp(-lambda X)]
    lambdas = np.linspace(0.01, 5, 300)
    for j in np.linspace(0.2, 0.8, 601):
        x = (c - n * j) ** 2 / (n * j * (1 - j))
        for q in j + np.linspace(-bias, bias, 5):
            log_pmf = log_comb + c * np.log(q) + (n - c) * np.log(1 - q)
            worst = np.maximum(worst, np.logaddexp.reduce(log_pmf[None, :] - lambdas[:, None] * x[None, :], axis=1))
    log_bound = np.min(lambdas * m.DISPERSION_FLOOR * pairs + pairs * worst)
    assert log_bound < np.log(1e-12), np.exp(log_bound)


def test_ps9_collision_verdict_accepts_other_honest_hash_functions_and_rejects_a_reused_one():
    """Any family of independent random hash functions passes (here BLAKE2b of seed, position and item, not the
    notebook's universal hashing); one function copied to every position fails (by the dispersion test, or
    by the mean test when its all-or-nothing collisions happen to move the mean too)."""
    import hashlib

    import numpy as np

    from autograder.assignments import ps9_data as m

    def blake_signature(items, num_perm=128, seed=0):
        if not items:
            return np.full(num_perm, m.PRIME)
        return np.array([min(int.from_bytes(hashlib.blake2b(f"{seed}/{i}/{x}".encode(), digest_size=8).digest(),
                                            "little") % m.PRIME for x in items) for i in range(num_perm)])

    for seed in range(2):
        cases = m._minhash_collisions(np.random.default_rng(seed))
        honest = [(blake_signature(*case.args),) for case in cases]
        assert m._verdict_collisions(cases, honest) is None
        reused = [(np.full(m.NUM_PERM, sig[0][0]),) for sig in honest]
        assert m._verdict_collisions(cases, reused) is not None


def test_ps9_pii_reference_agrees_with_the_labels_of_the_generated_strings():
    """The hidden PII strings are built from templates whose placeholders are known: llmarch's redact_pii (the
    reference) must give exactly the labelled redaction, and leave the ordinary numbers alone."""
    import numpy as np

    from autograder.assignments import ps9_pii_texts as m
    from llmarch.webdata import redact_pii

    for seed in range(300):
        rng = np.random.default_rng(seed)
        for text, redacted in (m.email_ip_text(rng), m.phone_text(rng)):
            assert redact_pii(text) == redacted, text
        for text in (m.ordinary_text(rng), m.not_ipv4_text(rng)):
            assert redact_pii(text) == text
