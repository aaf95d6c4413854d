"""A crash costs only its cell (autograder/runner.py): a segfault or ``os._exit`` in one cell loses that cell and
what needs it, never the whole notebook, and the feedback names the cell; a notebook that keeps crashing ends
``crashed``, quickly.

The reference for each crash is an independent notebook without it: the same work where the crashing cell
defines nothing, or where the crashing function raises instead. Every per-cell score must be the same. All
notebooks are graded together through the real sandbox and the command line.
"""

from __future__ import annotations

import csv

import nbformat
import pytest

from autograder.__main__ import main as grader_main
from autograder.grade import release_template
from autograder.runner import MAX_CRASHES
from autograder.sandbox import bubblewrap_available
from submissions import solution_sources, submission, write

PS, NB, FULL = "ps1-attention", "ps1-attention.ipynb", 15
SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
EXIT = "import os\nos._exit(1)\n"
RAISE = "raise RuntimeError('not this time')\n"

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")


def _function_that(body: str) -> str:
    """multi_head_attention whose every call runs ``body``."""
    return "def multi_head_attention(*args, **kwargs):\n" + "".join(f"    {line}\n" for line in body.splitlines())


def _with_setup_cell(source: str):
    """The solution with a cell of the student's own right after the set-up cell: it defines the scale of the
    attention scores, which the student's attention uses."""
    sdpa = solution_sources(PS, NB)["scaled_dot_product_attention"]
    assert "np.sqrt(d)" in sdpa, "the solution's scale changed: update this test"
    nb = submission(PS, NB, answers={"scaled_dot_product_attention": sdpa.replace("np.sqrt(d)", "SCALE(d)")})
    nb.cells.insert(2, nbformat.v4.new_code_cell("SCALE = np.sqrt\n" + source))
    return nb


def _crashing_cells(count: int):
    """The solution with its answer cells crashing after their definitions, and ``count`` crashing cells of the
    student's own before them (right after the set-up cell)."""
    nb = submission(PS, NB, answers={gid: source + "\n" + SEGFAULT for gid, source in solution_sources(PS, NB).items()
                                     if gid != "causal_not_equivariant"})
    nb.cells[2:2] = [nbformat.v4.new_code_cell(SEGFAULT) for _ in range(count)]
    return nb


# name -> the notebook
NOTEBOOKS = {
    "segfault-in-answer": lambda: submission(PS, NB, answers={"causal_mask": SEGFAULT}),
    "exit-in-answer": lambda: submission(PS, NB, answers={"causal_mask": EXIT}),
    "answer-defines-nothing": lambda: submission(PS, NB, answers={"causal_mask": ""}),
    "segfault-in-test-cells": lambda: submission(PS, NB, answers={"multi_head_attention": _function_that(SEGFAULT)}),
    "raises-in-test-cells": lambda: submission(PS, NB, answers={"multi_head_attention": _function_that(RAISE)}),
    "segfault-in-setup": lambda: _with_setup_cell(SEGFAULT),
    "setup-raises-first": lambda: _with_setup_cell("del SCALE\n"),
    "crashes-in-every-cell": lambda: _crashing_cells(MAX_CRASHES + 1),
}
# crashing notebook -> the notebook without the crash that must get the same points
SAME_POINTS = {
    "segfault-in-answer": "answer-defines-nothing",
    "exit-in-answer": "answer-defines-nothing",
    "segfault-in-test-cells": "raises-in-test-cells",
    "segfault-in-setup": "setup-raises-first",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("crashes")
    for name, build in NOTEBOOKS.items():
        write(build(), base / "subs" / name, NB)
    out = base / "out"
    assert grader_main(["grade", PS, str(base / "subs"), "--out", str(out), "--workers", "2", "--timeout", "30",
                        "--notebook-timeout", "120"]) == 0
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return out, {row["student"]: row for row in csv.DictReader(f)}


def _points(row: dict) -> dict:
    return {key: value for key, value in row.items() if key.startswith("test_")}


@pytest.mark.parametrize("crashing, reference", SAME_POINTS.items())
def test_a_crash_costs_what_losing_its_cell_costs(crashing, reference, graded):
    _, rows = graded
    assert rows[crashing]["status"] == "graded", rows[crashing]
    assert rows[reference]["status"] == "graded", rows[reference]
    assert _points(rows[crashing]) == _points(rows[reference])
    assert 0 < float(rows[crashing]["score"]) < FULL


def test_the_lost_cells_are_the_ones_that_need_the_crashed_cell(graded):
    _, rows = graded
    lost = {gid for gid, points in _points(rows["segfault-in-answer"]).items() if points == "0"}
    assert lost == {"test_causal_mask"}
    lost = {gid for gid, points in _points(rows["segfault-in-test-cells"]).items() if points == "0"}
    assert lost == {"test_mha_one_head", "test_mha_two_heads", "test_mha_batch_causal"}  # three crashes
    lost = {gid for gid, points in _points(rows["segfault-in-setup"]).items() if points == "0"}
    assert {"test_sdpa_small", "test_sdpa_mask", "test_sdpa_batched"} <= lost
    assert "test_softmax_examples" not in lost and "test_causal_mask" not in lost


@pytest.mark.parametrize("name, cell, how", [("segfault-in-answer", "your cell 9", "signal SIGSEGV"),
                                             ("exit-in-answer", "your cell 9", "exit code 1"),
                                             ("segfault-in-setup", "your cell 3", "signal SIGSEGV")])
def test_the_feedback_names_the_crashed_cell(name, cell, how, graded):
    out, rows = graded
    assert f"crashed in {cell} ({how})" in rows[name]["detail"]
    page = (out / "feedback" / name / "ps1-attention.html").read_text()
    assert f"the process crashed in {cell} ({how})" in page


def test_a_crash_in_a_test_cell_names_the_test(graded):
    out, rows = graded
    assert "crashed in test cell 'test_mha_one_head'" in rows["segfault-in-test-cells"]["detail"]
    assert "and 2 more cell(s)" in rows["segfault-in-test-cells"]["detail"]


def test_a_notebook_that_keeps_crashing_ends_crashed_quickly(graded):
    out, rows = graded
    row = rows["crashes-in-every-cell"]
    assert row["status"] == "crashed" and "SIGSEGV" in row["detail"], row
    assert float(row["score"]) == 0  # the run ended before any function was defined
    page = (out / "feedback" / "crashes-in-every-cell" / "ps1-attention.html").read_text()
    assert f"{MAX_CRASHES} times at most" in page
    assert float(row["seconds"]) < 60


def test_a_flash_kernel_that_writes_past_its_output_costs_only_the_forward_tests(tmp_path):
    """Issue 33's case: in ps12, a forward kernel that stores far past its output segfaults Triton's
    interpreter in each of the three forward tests; the correct backward kernels keep all their points."""
    ps, notebook = "ps12-flash", "ps12-flash.ipynb"
    solution = solution_sources(ps, notebook)["flash_fwd_kernel"]
    store = "tl.store(O + head + rows[:, None] * D + offs_d[None, :], acc / l_i[:, None], mask=rows[:, None] < T)"
    assert store in solution, "the solution's store changed: update this test"
    wild = "tl.store(O + head + rows[:, None] * D + offs_d[None, :] + (1 << 40), acc / l_i[:, None])"
    write(submission(ps, notebook, answers={"flash_fwd_kernel": solution.replace(store, wild)}),
          tmp_path / "subs" / "student", notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", ps, str(tmp_path / "subs"), "--out", str(out), "--timeout", "120",
                        "--notebook-timeout", "500"]) == 0
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    assert row["status"] == "graded", row
    full = {item.grade_id: f"{item.points:g}" for item in release_template(ps)[0].auto_items}
    assert _points(row) == {**{gid: "0" for gid in full}, "test_dkdv": full["test_dkdv"], "test_dq": full["test_dq"]}
    assert "crashed in test cell 'test_forward'" in row["detail"] and "SIGSEGV" in row["detail"]
