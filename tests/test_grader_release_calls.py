"""README, "How it grades": the release's code calls the student's code. A test cell calls the graded function
through what the release's read-only cells defined, kept right after they ran, never through names a student's
later cell can rebind. The red team's ps12 notebook redefined the five read-only wrappers (and the launchers they
call) to return the notebook's own float64 reference, with no Triton kernel at all: 12/12."""

from __future__ import annotations

import pytest

from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.runner import _calling_namespace, _kept
from autograder.sandbox import bubblewrap_available
from submissions import submission, write
from test_wrong_variants import read_grades

PS12 = "ps12-flash"
WRAPPERS = '''
def flash_output(q, k, v, block_m, block_n):
    return attention_reference(*(torch.as_tensor(x) for x in (q, k, v)), False)[0]


def flash_lse(q, k, v, block_m, block_n):
    return attention_reference(*(torch.as_tensor(x) for x in (q, k, v)), False)[1]


def flash_causal(q, k, v, block_m, block_n):
    return attention_reference(*(torch.as_tensor(x) for x in (q, k, v)), True)


def flash_dkdv(q, k, v, d_out, is_causal, block_m, block_n):
    return gradients_reference(*(torch.as_tensor(x) for x in (q, k, v, d_out)), bool(is_causal))[1:]


def flash_dq(q, k, v, d_out, is_causal, block_m, block_n):
    return gradients_reference(*(torch.as_tensor(x) for x in (q, k, v, d_out)), bool(is_causal))[0]
'''
LAUNCHERS = '''
def run_forward(kernel, q, k, v, is_causal, block_m=16, block_n=16):
    return attention_reference(q, k, v, is_causal)


def run_dkdv(kernel, q, k, v, d_out, is_causal, block_m=16, block_n=16):
    return gradients_reference(q, k, v, d_out, is_causal)[1:]


def run_dq(kernel, q, k, v, d_out, is_causal, block_m=16, block_n=16):
    return gradients_reference(q, k, v, d_out, is_causal)[0]
'''

GC_WALK = WRAPPERS.replace("def flash_", "def forged_") + '''

import gc
import types

for obj in gc.get_objects():  # every dict or function that holds the release's wrappers, wherever it is kept
    for name in ("flash_output", "flash_lse", "flash_causal", "flash_dkdv", "flash_dq"):
        if isinstance(obj, dict) and name in obj:
            obj[name] = globals()["forged_" + name[len("flash_"):]]
        elif isinstance(obj, types.FunctionType) and obj.__name__ == name:
            obj.__code__ = globals()["forged_" + name[len("flash_"):]].__code__
'''


def test_a_release_function_looks_its_globals_up_in_the_release_and_the_student_functions_in_the_notebook():
    release_cell = "def wrapper(x):\n    return helper(kernel(x))\n\n\ndef helper(x):\n    return ('release', x)\n"
    cell_ns: dict = {}
    exec(release_cell, cell_ns)  # noqa: S102 - a read-only cell, as the kernel runs it
    kept = _kept(cell_ns, {"wrapper", "helper"})
    live = {**cell_ns, "kernel": lambda x: x + 1}
    live["helper"] = lambda x: ("forged", x)  # a later cell rebinds the names
    live["wrapper"] = lambda x: "forged"
    cell_ns["wrapper"].__code__ = cell_ns["helper"].__code__ = (lambda x: "forged").__code__  # as gc could reach
    ns = _calling_namespace(live, kept)
    assert ns["wrapper"](1) == ("release", 2)  # the release's wrapper and helper, the student's kernel
    assert live["wrapper"](1) == "forged"  # the notebook's own namespace is left as it is


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
@pytest.mark.parametrize("forged", [WRAPPERS, LAUNCHERS, GC_WALK], ids=["wrappers", "launchers", "gc"])
def test_redefined_wrappers_or_launchers_earn_nothing_without_kernels(tmp_path, forged):
    notebook = assignments.load(PS12).NOTEBOOK
    nb = submission(PS12, notebook, answers={"flash_fwd_kernel": forged}, solved=False)
    write(nb, tmp_path / "subs" / "mallory", notebook)
    assert grader_main(["grade", PS12, str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--workers", "1",
                        "--timeout", "60"]) == 0
    row = read_grades(tmp_path / "out")["mallory"]
    assert row["status"] == "graded" and float(row["score"]) == 0, row
