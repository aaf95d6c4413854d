"""The classic wrong answers of ps12-flash (FlashAttention-2 in Triton), and what each must cost, whatever the
hidden inputs; ps12-flash through the real command line (full marks, zero, identical rows under 20 names).

The method of ``test_wrong_variants.py`` (its harness is reused): each variant is one wrong kernel cell, the rest
of the notebook is the solution, and under each of the issue's ten seeds it loses exactly the listed cells. The
kernels run in triton's interpreter, here as in the sandbox, which is slow, so a variant runs only the checks
whose wrapper launches its kernel (``test_each_grader_call_launches_one_kernel`` shows that the other checks
cannot see the variant's cell), and each check case by case, stopping at its first failing case: the
grader's ``judge`` passes a check (one without a ``verdict``) exactly when every case passes, so a lost cell
needs only one case. Each check's deterministic edge cases come first and are what makes a variant fail every
time; the random cases vary with the seed.

``TRITON_INTERPRET=1`` must hold when triton is imported (it builds its own helpers, ``tl.zeros``, ... for the
interpreter then) and when ``@triton.jit`` wraps a kernel. On a machine without a GPU, ``conftest.py`` sets it for
the whole session before anything is collected (another test's ``torch.utils.flop_counter`` imports triton); the
``interpreter`` fixture also sets it while a kernel test runs, so that this file alone works anywhere, and fails
a kernel test, rather than skipping it, if triton was imported without it on such a machine.
"""

from __future__ import annotations

import ast
import functools
import json
import shutil
from pathlib import Path

import pytest

import torch

from autograder import assignments, capture, gpu_benchmark
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import release, submission, write
from test_wrong_variants import (
    SEEDS, Harness, Variant, _judge, _notebook, _visible_failures, assert_copies_identical, read_grades,
    write_copies,
)
from test_wrong_variants import _namespace as _notebook_namespace

PS12 = "ps12-flash"
NOTEBOOK = "ps12-flash.ipynb"
MODULE = assignments.load(PS12)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def interpreter(monkeypatch):
    """``TRITON_INTERPRET=1`` for this test alone (monkeypatch restores the environment afterwards, whatever the
    notebook's set-up cell wrote into it), and triton imported under it unless it was imported before."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if isinstance(tl.zeros, JITFunction):
        reason = ("triton was imported without TRITON_INTERPRET=1 before this test ran, so the notebook's kernels "
                  "cannot run in its interpreter in this process; run this file alone")
        if not any(Path("/dev").glob("nvidia[0-9]*")):  # conftest.py sets the variable first on such a machine
            pytest.fail(reason)
        pytest.skip(reason)


def _solution_cell(gid: str) -> str:
    return next(c.source for c in _notebook(PS12).cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


VARIANTS: list[Variant] = []


def edited(cell: str, *edits: tuple[str, str]) -> str:
    """The solution's cell ``cell`` with each ``(old, new)`` replaced once (``old`` must occur exactly once)."""
    source = _solution_cell(cell)
    for old, new in edits:
        assert source.count(old) == 1, (cell, old)
        source = source.replace(old, new)
    return source


def variant(name: str, cell: str, loses: set[str], *edits: tuple[str, str]) -> None:
    """The solution's kernel ``cell`` with each ``(old, new)`` replaced once."""
    VARIANTS.append(Variant(name, cell, frozenset(loses), edited(cell, *edits)))


FWD, DKDV, DQ = "flash_fwd_kernel", "flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel"
FORWARD = {"test_forward", "test_forward_lse", "test_causal"}
CAUSAL_MASK = "keep = keep & (cols[None, :] <= rows[:, None])"
variant("running sum not rescaled", FWD, FORWARD, ("l_i = l_i * alpha + ", "l_i = l_i + "))
variant("accumulator not rescaled", FWD, {"test_forward", "test_causal"},
        ("acc = acc * alpha[:, None] + ", "acc = acc + "))
variant("causal mask off by one (a query does not see itself)", FWD, {"test_causal"},
        (CAUSAL_MASK, CAUSAL_MASK.replace("<=", "<")))
variant("causal: tiles skipped but the diagonal tiles not masked", FWD, {"test_causal"},
        (CAUSAL_MASK, "pass"))
variant("causal loop stops before the diagonal tile", FWD, {"test_causal"},
        ("end = tl.minimum(T, (tile + 1) * BLOCK_M)", "end = tl.minimum(T, tile * BLOCK_M)"))
variant("causal loop bound counted in key tiles", FWD, {"test_causal"},
        ("end = tl.minimum(T, (tile + 1) * BLOCK_M)", "end = tl.minimum(T, (tile + 1) * BLOCK_N)"))
variant("log-sum-exp without the maximum", FWD, {"test_forward_lse", "test_causal"},
        ("m_i + tl.log(l_i)", "tl.log(l_i)"))
variant("padding keys not masked", FWD, {"test_forward", "test_forward_lse"},
        ("keep = cols[None, :] < T", "keep = cols[None, :] >= 0"))
variant("dS without delta (dK)", DKDV, {"test_dkdv"}, ("ds = p * (dp - delta[:, None])", "ds = p * dp"))
variant("dK not scaled", DKDV, {"test_dkdv"}, ("dk * scale", "dk"))
variant("P recomputed without the log-sum-exp (dK, dV)", DKDV, {"test_dkdv"},
        ("tl.exp(s - lse[:, None])", "tl.exp(s)"))
variant("causal dK/dV start at query tile = key tile index", DKDV, {"test_dkdv"},
        ("begin = (tile * BLOCK_N // BLOCK_M) * BLOCK_M", "begin = tile * BLOCK_M"))
variant("dQ not scaled", DQ, {"test_dq"}, ("dq * scale", "dq"))
variant("dS without delta (dQ)", DQ, {"test_dq"},
        ("p * (dp - delta[:, None])", "p * dp"))
variant("causal dQ without the mask", DQ, {"test_dq"}, (CAUSAL_MASK, "pass"))

# Scores far from 0, head sizes other than 16 (issue 33): each wrong only on the fixed cases of those classes.
P_SHIFTED, P_FROM_LSE = "p = tl.exp(s - m_new[:, None])", "tl.exp(s - lse[:, None])"
variant("no running maximum (P = exp(S))", FWD, FORWARD, (P_SHIFTED, "p = tl.exp(s)"),
        ("alpha = tl.exp(m_i - m_new)", "alpha = tl.full([BLOCK_M], 1.0, tl.float32)"),
        ("m_i + tl.log(l_i)", "tl.log(l_i)"))
variant("running maximum starts at 0", FWD, FORWARD,
        ('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)', "m_i = tl.zeros([BLOCK_M], tl.float32)"))
variant("padding masked after the exponential (the maximum counts the padding keys' score 0)", FWD, FORWARD,
        ('s = tl.where(keep, s, float("-inf"))', "pass"),
        (P_SHIFTED, "p = tl.where(keep, tl.exp(s - m_new[:, None]), 0.0)"))
variant("log-sum-exp from a separate unshifted sum (log of the sum of exp(S))", FWD,
        {"test_forward_lse", "test_causal"},
        ("l_i = tl.zeros([BLOCK_M], tl.float32)\n",
         "l_i = tl.zeros([BLOCK_M], tl.float32)\n    l_raw = tl.zeros([BLOCK_M], tl.float32)\n"),
        ("        m_i = m_new\n", "        m_i = m_new\n        l_raw += tl.sum(tl.exp(s), 1)\n"),
        ("m_i + tl.log(l_i)", "tl.log(l_raw)"))
variant("head size hard-coded to 16 (forward)", FWD, FORWARD,
        ("offs_d = tl.arange(0, D)", "offs_d = tl.arange(0, 16)"),
        ("acc = tl.zeros([BLOCK_M, D]", "acc = tl.zeros([BLOCK_M, 16]"))
variant("head size hard-coded to 16 (dK, dV)", DKDV, {"test_dkdv"},
        ("offs_d = tl.arange(0, D)", "offs_d = tl.arange(0, 16)"),
        ("dk = tl.zeros([BLOCK_N, D]", "dk = tl.zeros([BLOCK_N, 16]"),
        ("dv = tl.zeros([BLOCK_N, D]", "dv = tl.zeros([BLOCK_N, 16]"))
variant("head size hard-coded to 16 (dQ)", DQ, {"test_dq"},
        ("offs_d = tl.arange(0, D)", "offs_d = tl.arange(0, 16)"),
        ("dq = tl.zeros([BLOCK_M, D]", "dq = tl.zeros([BLOCK_M, 16]"))
variant("P recomputed as exp(S) / exp(LSE) (dK, dV)", DKDV, {"test_dkdv"},
        (P_FROM_LSE, "tl.exp(s) / tl.exp(lse[:, None])"))
variant("P recomputed as exp(S) / exp(LSE) (dQ)", DQ, {"test_dq"}, (P_FROM_LSE, "tl.exp(s) / tl.exp(lse[:, None])"))
variant("causal dK/dV mask off by one (a query does not see itself)", DKDV, {"test_dkdv"},
        (CAUSAL_MASK, CAUSAL_MASK.replace("<=", "<")))

# Not a Triton kernel: an object that kernel[grid](...) launches, computing the right answer with torch. The
# launchers of the set-up cell refuse it (issue 33: such an object earned 7 points).
VARIANTS.append(Variant("a torch object that launches like a kernel", FWD, frozenset(FORWARD), '''
class TorchKernel:
    def __getitem__(self, grid):
        def launch(Q, K, V, O, LSE, scale, T, D, IS_CAUSAL, BLOCK_M, BLOCK_N):
            s = Q @ K.transpose(1, 2) * scale
            if IS_CAUSAL:
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            O.copy_(torch.softmax(s, -1) @ V)
            LSE.copy_(torch.logsumexp(s, -1))
        return launch


flash_fwd_kernel = TorchKernel()
'''))


def _namespace(v: Variant | None = None) -> dict:
    """ps12's namespace after every cell but the test cells (``test_wrong_variants._namespace``)."""
    return _notebook_namespace(PS12, v)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return Harness(PS12, tmp_path_factory.mktemp(PS12))


@functools.cache
def _kernels_of_wrappers() -> dict[str, set[str]]:
    """Each function of the read-only "grader-calls" cell -> the kernel cells whose names it uses."""
    tree = ast.parse(_solution_cell("grader-calls"))
    return {node.name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & {FWD, DKDV, DQ}
            for node in tree.body if isinstance(node, ast.FunctionDef)}


def _checks_of(kernel: str) -> set[str]:
    """The checks whose wrapper launches ``kernel``."""
    return {gid for gid, check in MODULE.CHECKS.items() if kernel in _kernels_of_wrappers()[check.function]}


def test_every_kernel_has_wrong_variants():
    cells = {cell.metadata["nbgrader"]["grade_id"] for cell in release(PS12, NOTEBOOK).cells
             if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code"}
    assert cells == {v.cell for v in VARIANTS}
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)


def test_each_grader_call_launches_one_kernel():
    """The wrapper a check calls names exactly one kernel and no other student cell, so a wrong kernel cannot cost
    the checks of the other kernels; every kernel has its checks."""
    wrappers = _kernels_of_wrappers()
    assert {v.cell for v in VARIANTS} == {FWD, DKDV, DQ}
    assert all(len(wrappers[check.function]) == 1 for check in MODULE.CHECKS.values())
    assert {kernel: _checks_of(kernel) for kernel in (FWD, DKDV, DQ)} == {
        FWD: FORWARD, DKDV: {"test_dkdv"}, DQ: {"test_dq"}}


def test_depends_on_names_check_functions_of_the_same_kernel():
    """``depends_on`` names functions of other checks (grade.py's "fix that first" compares it with the functions
    whose checks failed; a kernel's name never matches), each launching the same kernel as the check."""
    functions = {check.function for check in MODULE.CHECKS.values()}
    wrappers = _kernels_of_wrappers()
    for gid, check in MODULE.CHECKS.items():
        assert set(check.depends_on) <= functions - {check.function}, gid
        assert all(wrappers[f] == wrappers[check.function] for f in check.depends_on), gid
    assert any(check.depends_on for check in MODULE.CHECKS.values())


def test_the_solution_loses_nothing(harness, interpreter):
    ns = _namespace()
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


LOG2E = "1.4426950408889634"
# Correct kernels that depart from the text's formulas as FlashAttention's own Triton kernels do: q scaled by
# scale * log2(e) once, exp2 instead of exp, a finite -1e30 for -inf; the backward's P as exp2 of S - LSE in base 2.
HONEST = {
    FWD: edited(FWD, ("mask=rows[:, None] < T, other=0.0)\n",
                      f"mask=rows[:, None] < T, other=0.0) * (scale * {LOG2E})\n"),
                ('s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale',
                 's = tl.dot(q, tl.trans(k), input_precision="ieee")'),
                ('m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)', "m_i = tl.full([BLOCK_M], -1e30, tl.float32)"),
                ('s = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, -1e30)"),
                (P_SHIFTED, "p = tl.exp2(s - m_new[:, None])"),
                ("alpha = tl.exp(m_i - m_new)", "alpha = tl.exp2(m_i - m_new)"),
                ("m_i + tl.log(l_i)", "(m_i + tl.log2(l_i)) * 0.6931471805599453")),
    **{cell: edited(cell, (P_FROM_LSE, f"tl.exp2(s * {LOG2E} - lse[:, None] * {LOG2E})")) for cell in (DKDV, DQ)},
}


def test_honest_alternative_kernels_lose_nothing(harness, interpreter):
    """The fixed cases of scores far from 0 leave room for float32 rounding that the text does not forbid."""
    ns = _notebook_namespace(PS12, None, answers=HONEST)
    assert _visible_failures(PS12, ns, set(MODULE.CHECKS)) == {}
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


@functools.cache
def _input_files(harness: Harness, seed: int, gid: str) -> dict[str, bytes]:
    """The files the grader writes for a check under a seed (``spec.json`` and its arrays), by name."""
    harness.expected(seed, gid)
    return {path.name: path.read_bytes() for path in (harness.folder / f"inputs-{seed}" / gid).iterdir()}


def _lost_case_by_case(harness: Harness, ns: dict, seed: int, gids) -> set[str]:
    """What ``harness.lost`` returns for these checks, judging one case at a time and stopping at a check's
    first failing case (``judge`` passes a check without a ``verdict`` exactly when each case passes)."""
    lost = set()
    for gid in gids:
        check = MODULE.CHECKS[gid]
        assert check.verdict is None, gid
        cases, expected = harness.expected(seed, gid)
        files = _input_files(harness, seed, gid)
        spec = json.loads(files["spec.json"])
        for i in range(len(cases)):
            one = {**files, "spec.json": json.dumps({**spec, "cases": [spec["cases"][i]]}).encode()}
            outputs = harness.folder / "outputs-one-case"
            capture.capture(gid, namespace=ns, inputs=one, outputs=str(outputs))
            passed = _judge(check, gid, [cases[i]], [expected[i]], outputs / gid)
            shutil.rmtree(outputs)
            if not passed:
                lost.add(gid)
                break
    return lost


@pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
def test_a_wrong_variant_loses_exactly_its_cells_under_every_seed(v, harness, interpreter):
    run = _checks_of(v.cell)
    assert v.loses and v.loses <= run, (sorted(v.loses), sorted(run))
    ns = _namespace(v)
    for seed in SEEDS:
        lost = _lost_case_by_case(harness, ns, seed, sorted(run))
        assert lost == v.loses, f"--seed {seed}: loses {sorted(lost)}; expected exactly {sorted(v.loses)}"


def test_judging_case_by_case_agrees_with_the_harness(harness, interpreter):
    """The shortcut above gives the harness's own verdicts, for a variant that loses some of its checks."""
    v = next(v for v in VARIANTS if v.name == "padding keys not masked")
    ns = _namespace(v)
    harness.graded = lambda seed: sorted(FORWARD)
    try:
        assert _lost_case_by_case(harness, ns, 0, sorted(FORWARD)) == harness.lost(ns, 0) == v.loses
    finally:
        del harness.graded


@pytest.mark.parametrize("v", VARIANTS, ids=[v.name for v in VARIANTS])
def test_a_wrong_variant_fails_visible_tests_only_where_it_loses_points(v, interpreter):
    failing = set(_visible_failures(PS12, _namespace(v), _checks_of(v.cell)))
    assert failing and failing <= v.loses, (sorted(failing), sorted(v.loses))


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_ps12_full_marks_zero_and_twenty_identical_rows_through_the_command_line(tmp_path):
    """The solution gets full marks (of the automatic points; the written answers wait for a person), the release
    zero, and 20 copies of a forward without the rescaled running sum identical rows that lose exactly its cells."""
    wrong = VARIANTS[0]
    subs = tmp_path / "subs"
    write(submission(PS12, NOTEBOOK), subs / "solved", NOTEBOOK)
    write(release(PS12, NOTEBOOK), subs / "untouched", NOTEBOOK)
    write_copies(submission(PS12, NOTEBOOK, answers={wrong.cell: wrong.source}), subs, NOTEBOOK)
    out = tmp_path / "out"
    assert grader_main(["grade", PS12, str(subs), "--out", str(out), "--workers", "2", "--timeout", "240"]) == 0
    rows = read_grades(out)
    auto = {gid: _points()[gid] for gid in MODULE.CHECKS}
    assert rows["solved"]["status"] == "graded" and float(rows["solved"]["score"]) == sum(auto.values()), rows["solved"]
    assert rows["untouched"]["status"] == "graded" and float(rows["untouched"]["score"]) == 0, rows["untouched"]
    assert_copies_identical(rows, PS12, wrong.loses)
    # the kernels' speed is information in the feedback only, never in the gradebook's rows
    assert not any("TFLOP/s" in row["notes"] or gpu_benchmark.NO_GPU in row["notes"] for row in rows.values())
    if not torch.cuda.is_available():
        assert gpu_benchmark.NO_GPU in (out / "feedback" / "solved" / "ps12-flash.html").read_text()


@functools.cache
def _points() -> dict[str, float]:
    return {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in _notebook(PS12).cells
            if c.metadata.get("nbgrader", {}).get("grade")}


def test_llmarch_triton_kernels_meet_the_checks_references_on_the_graded_cases(interpreter):
    """An independent implementation, llmarch's FlashAttention-2 kernels (``triton_flash_attention``, in the
    interpreter), passes the checks' float64 references (SDPA and its gradients) on seed 0's cases, with the
    checks' tolerances and tile sizes: the references and tolerances accept a correct float32 kernel."""
    import numpy as np
    import torch

    from autograder.assignments import ps12_flash as m
    from llmarch.efficient import triton_flash_attention

    rng = np.random.default_rng(0)
    forward = [(case, False, m.ref_output(*case.args)) for case in m._forward(rng)]
    for case, is_causal, ref in forward + [(case, True, m.ref_causal(*case.args)[0]) for case in m._causal(rng)]:
        q, k, v, block_m, block_n = case.args
        out = triton_flash_attention(*(torch.tensor(x, dtype=torch.float32) for x in (q, k, v)),
                                     is_causal=is_causal, block_q=block_m, block_k=block_n)
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=m.RTOL, atol=m.ATOL)
    for case in m._backward(rng):
        q, k, v, d_out, is_causal, block_m, block_n = case.args
        qkv = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (q, k, v)]
        triton_flash_attention(*qkv, is_causal=is_causal, block_q=block_m, block_k=block_n).backward(
            torch.tensor(d_out, dtype=torch.float32))
        expected = (m.ref_dq(*case.args), *m.ref_dkdv(*case.args))
        for got, want in zip(qkv, expected):
            np.testing.assert_allclose(got.grad.double().numpy(), want, rtol=m.RTOL, atol=m.ATOL)
