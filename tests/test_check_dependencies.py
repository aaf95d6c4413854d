"""``Check.depends_on`` names the student's other graded functions that a checked function calls; when one of
them fails its own tests, the feedback of the dependent test says "fix that first" (grade._judge_all). A name
that is no check's ``function`` can never fail, so its hint can never show: every entry must name one.
"""

from __future__ import annotations

import pytest

from autograder import assignments, capture, feedback, grade
from autograder.checks import OUTPUTS, CheckResult, expected_results, write_inputs
from autograder.grade import SubmissionResult, _judge_all, release_template
from test_wrong_variants import _namespace

HINT = "fix that first"


@pytest.mark.parametrize("assignment", sorted(assignments.ASSIGNMENTS))
def test_every_dependency_names_a_graded_function_of_the_same_set(assignment):
    checks = assignments.load(assignment).CHECKS
    functions = {check.function for check in checks.values()}
    unknown = {gid: [f for f in check.depends_on if f not in functions] for gid, check in checks.items()}
    assert not {gid: names for gid, names in unknown.items() if names}, f"graded functions: {sorted(functions)}"


@pytest.mark.parametrize("assignment", sorted(assignments.ASSIGNMENTS))
def test_when_everything_fails_every_dependent_test_names_its_dependencies(assignment, monkeypatch):
    """With every verdict failing, each test whose function depends on others names all of them and says to fix
    them first; a test without dependencies gives its verdict alone."""
    module = assignments.load(assignment)
    template, _ = release_template(assignment)
    checks = {item.grade_id: module.CHECKS[item.grade_id] for item in template.auto_items}
    monkeypatch.setattr(grade, "judge", lambda *args: CheckResult(False, "a hidden case fails"))
    items, problem = _judge_all(template, checks, {gid: [] for gid in checks}, {gid: [] for gid in checks}, {})
    assert problem == ""
    for item in items:
        if item.kind == "manual":
            continue
        depends_on = checks[item.grade_id].depends_on
        assert (HINT in item.message) == bool(depends_on), (item.grade_id, item.message)
        assert all(f"your {name}" in item.message or f" and {name}" in item.message for name in depends_on), \
            (item.grade_id, item.message)


def _ps1_items(tmp_path, answers):
    """ps1's items judged by ``_judge_all`` from the outputs that ``capture`` writes for the notebook whose
    answer cells are ``answers`` (grade_id -> source; in-process, on hidden cases drawn as for seed 0)."""
    assignment = "ps1-attention"
    module = assignments.load(assignment)
    template, _ = release_template(assignment)
    checks = {item.grade_id: module.CHECKS[item.grade_id] for item in template.auto_items}
    ns = _namespace(assignment, answers=answers)
    cases, expected, files = {}, {}, {}
    for gid, check in checks.items():
        cases[gid] = check.cases(grade._case_rng(0, "digest", gid))
        expected[gid] = expected_results(check, cases[gid], module.TRUSTED_CALLABLES)
        write_inputs(gid, check, cases[gid], expected[gid], tmp_path / "inputs")
        capture.capture(gid, namespace=ns, inputs=str(tmp_path / "inputs"), outputs=str(tmp_path / "outputs"))
        files.update({f"{OUTPUTS}/{gid}/{p.name}": p.read_bytes() for p in (tmp_path / "outputs" / gid).iterdir()})
    items, problem = _judge_all(template, checks, cases, expected, files)
    assert problem == ""
    return {item.grade_id: item for item in items}, template


def test_a_wrong_softmax_sends_attention_back_to_it_in_the_feedback(tmp_path):
    """A softmax that returns zeros fails its own tests, and attention, which calls it, fails too: its feedback
    says so, down to the HTML page; a correct softmax gives no such hint."""
    from submissions import solution_sources

    answers = dict(solution_sources("ps1-attention", "ps1-attention.ipynb"))
    answers["softmax"] = "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n"
    items, template = _ps1_items(tmp_path / "wrong", answers)
    assert items["test_softmax_examples"].points == 0 and HINT not in items["test_softmax_examples"].message
    sdpa = items["test_sdpa_small"]
    assert sdpa.points == 0 and "uses your softmax, which also fails its own tests: fix that first" in sdpa.message
    result = SubmissionResult("student", "graded", "", list(items.values()))
    page = feedback.render(result, "ps1-attention", sum(i.points for i in template.items))
    assert "uses your softmax, which also fails its own tests: fix that first" in page

    answers["softmax"] = solution_sources("ps1-attention", "ps1-attention.ipynb")["softmax"]
    answers["scaled_dot_product_attention"] = "def scaled_dot_product_attention(q, k, v, mask=None):\n    return q, q\n"
    items, _ = _ps1_items(tmp_path / "right", answers)
    assert items["test_sdpa_small"].points == 0 and HINT not in items["test_sdpa_small"].message
