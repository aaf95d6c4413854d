"""The speed of ps12-flash's kernels in the feedback (``autograder/gpu_benchmark.py``): information, not points.

Without a GPU here, everything but the CUDA calls runs on CPU: the FLOP count against the matmuls it counts, the
measuring of the solution's kernels (in triton's interpreter, timed by an injected clock, against plain SDPA),
which refuses kernels that differ from SDPA, the benchmark script end to end in a subprocess and in the sandbox
(where it finds no GPU and says so), the checks of its untrusted result, and the one no-GPU line. The test marked
``cuda`` (``make test-gpu``) runs the whole path on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder import gpu_benchmark as gb
from autograder.grade import Options, _gpu_benchmark, benchmark_program, release_template
from autograder.notebooks import prepare
from autograder.sandbox import Limits, bubblewrap_available, run_sandboxed
from submissions import submission
from test_wrong_variants_flash import NOTEBOOK, PS12, VARIANTS, _namespace, interpreter  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter on a wrong kernel's -inf
SHAPE = (1, 2, 40, 16)  # T = 40: not a multiple of the tiles of 16


def test_flop_count_is_the_flashattention2_papers():
    b, h, t, d = 2, 3, 128, 64
    matmul = 2 * t * d * t  # (T x d) @ (d x T) or (T x T) @ (T x d): T * T * d multiply-adds
    assert gb.attention_flops(b, h, t, d, False) == b * h * 2 * matmul  # Q K^T and P V
    assert gb.attention_flops(b, h, t, d, True) == b * h * matmul  # half of the scores
    # the backward: S recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q
    assert gb.attention_flops(b, h, t, d, False, backward=True) == b * h * 5 * matmul


def _measure(ns: dict) -> list[dict]:
    """The rows of ``measure`` on CPU, with a clock that says 2 ms for the student's call and 1 ms for the peer's
    (each is run once, so a kernel that fails while being timed still shows)."""
    calls = []

    def timer(fn):
        fn()
        calls.append(fn)
        return 2.0 if len(calls) % 2 else 1.0

    rows = gb.measure(ns, "cpu", [SHAPE], (16, 16), timer, gb._plain_sdpa, "bfloat16")  # the peer cast as on a GPU
    assert len(calls) == 2 * sum("skipped" not in row for row in rows)
    return rows


def _by_pass(rows: list[dict]) -> dict[tuple[str, bool], dict]:
    return {(row["pass"], row["causal"]): row for row in rows}


def test_the_solutions_kernels_are_measured_in_both_passes(interpreter):
    rows = _by_pass(_measure(_namespace()))
    assert set(rows) == {(p, c) for p in gb.PASSES for c in (False, True)}
    for (pass_, causal), row in rows.items():
        flops = gb.attention_flops(*SHAPE, causal, backward=pass_ == "backward")
        assert row["student_tflops"] == pytest.approx(flops / 2e9) and row["peer_tflops"] == pytest.approx(flops / 1e9)
    lines = gb.feedback_lines(gb.read_rows(json.dumps(list(rows.values())).encode()))
    assert len(lines) == 5 and "information, not graded" in lines[0]
    assert all(line.endswith("(0.50x)") and "TFLOP/s" in line for line in lines[1:]), lines


@pytest.mark.parametrize("name, skipped", [
    ("causal mask off by one (a query does not see itself)", {("forward", True): "output differs"}),
    ("dQ not scaled", {("backward", False): "your dQ differs", ("backward", True): "your dQ differs"}),
])
def test_kernels_that_differ_from_sdpa_are_not_timed(name, skipped, interpreter):
    v = next(v for v in VARIANTS if v.name == name)
    rows = _by_pass(_measure(_namespace(v)))
    for key, row in rows.items():
        if key in skipped:
            assert skipped[key] in row["skipped"], row
        else:
            assert "student_tflops" in row, row
    # a wrong causal forward leaves no log-sum-exp to time the causal backward with: no such row
    assert (("backward", True) in rows) == (("forward", True) not in skipped)


def test_a_missing_backward_is_said_so(interpreter):
    ns = {k: val for k, val in _namespace().items() if k != "flash_bwd_dq_kernel"}
    rows = _by_pass(_measure(ns))
    assert rows["backward", False]["skipped"] == "the backward kernels are not defined"
    assert "student_tflops" in rows["forward", False]


def _program(nb: nbformat.NotebookNode) -> str:
    """What the grader hands the benchmark for this submission (``grade.benchmark_program``)."""
    template, _ = release_template(PS12)
    return benchmark_program(template, prepare(nb, template))


def _run_script(tmp_path, program: str) -> subprocess.CompletedProcess:
    """``gpu_benchmark.py`` as the sandbox starts it, in ``tmp_path``, but with ``--cpu-test`` (one small shape in
    the interpreter)."""
    (tmp_path / "program.py").write_text(program)
    return subprocess.run([sys.executable, str(ROOT / "autograder" / "gpu_benchmark.py"), "program.py",
                           "--cpu-test", *map(str, SHAPE)], capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_the_script_runs_the_kernel_program_end_to_end_on_cpu(tmp_path):
    """It defines the kernels itself, in a fresh process, and writes rows the grader accepts."""
    result = _run_script(tmp_path, _program(submission(PS12, NOTEBOOK)))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = gb.read_rows((tmp_path / gb.RESULT_FILE).read_bytes())
    assert isinstance(rows, list) and len(rows) == 4 and all(row["student_tflops"] > 0 for row in rows), rows


FORGE = """
import json, os
json.dump([{"pass": "forward", "shape": [4, 16, 1024, 64], "causal": False, "student_tflops": 9999.0,
            "peer_tflops": 1.0}], open(".grader-benchmark.json", "w"))
os._exit(0)
"""
TRAPS = """

def helper(x):
    os._exit(0)


@triton.jit
def with_default(X, n=os._exit(0)):
    pass


@triton.jit
def with_annotation(X: os._exit(0)):
    pass


@helper
def decorated(X):
    pass
"""


def test_no_statement_of_the_notebook_but_its_kernel_definitions_reaches_the_benchmark(tmp_path):
    """README: the benchmark's figures are a measurement, not the submission's report. The red team's cell that
    writes the result file and ends the process (9999 TFLOP/s in the feedback) is not run, nor is a forged
    decorator, a default or an annotation that would run code when the kernel is defined."""
    nb = submission(PS12, NOTEBOOK, extra_cells=[FORGE])
    kernel_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "flash_fwd_kernel")
    kernel_cell.source = FORGE + "\n" + kernel_cell.source + TRAPS
    program = _program(nb)
    assert "_exit" not in program and "json" not in program and "def flash_fwd_kernel" in program
    result = _run_script(tmp_path, program)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = gb.read_rows((tmp_path / gb.RESULT_FILE).read_bytes())
    assert isinstance(rows, list) and len(rows) == 4 and all(row["student_tflops"] < 9999 for row in rows), rows


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_in_the_sandbox_without_a_gpu_the_benchmark_says_why_it_skipped_and_a_stale_result_is_gone(tmp_path):
    program = _program(submission(PS12, NOTEBOOK))
    assert _gpu_benchmark(tmp_path, Options(), program, cuda_available=False) == [gb.NO_GPU]
    (tmp_path / gb.RESULT_FILE).write_text('[{"pass": "forward", "shape": [4, 16, 1024, 64], "causal": false, '
                                           '"student_tflops": 9999.0, "peer_tflops": 1.0}]')  # left by phase 1
    lines = _gpu_benchmark(tmp_path, Options(), program, cuda_available=True)  # as if the grader saw a GPU
    assert lines == ["benchmark skipped: RuntimeError: the benchmark's sandbox sees no CUDA GPU"], lines


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_devices_are_bound_into_the_sandbox_with_sys_read_only(tmp_path):
    """A device file that bubblewrap's minimal /dev lacks appears with ``devices``, and /sys's device folders."""
    device = next((d for d in ("/dev/fuse", "/dev/loop-control", "/dev/kmsg") if Path(d).exists()), None)
    if device is None:
        pytest.skip("this machine has none of /dev/fuse, /dev/loop-control, /dev/kmsg to bind")
    script = f"import os; print(os.path.exists({device!r}), os.path.isdir('/sys/devices'))"
    plain = run_sandboxed([sys.executable, "-c", script], tmp_path, Limits(wall_seconds=60))
    bound = run_sandboxed([sys.executable, "-c", script], tmp_path, Limits(wall_seconds=60), devices=(device,))
    assert plain.stdout.split() == ["False", "False"], plain
    assert bound.stdout.split() == ["True", "True"], bound
    with pytest.raises(ValueError, match="not an existing path under /dev/"):
        run_sandboxed(["true"], tmp_path, devices=("/etc/passwd",))


NUMBERS = {"student_tflops": 40.0, "peer_tflops": 160.0}


@pytest.mark.parametrize("raw, reason", [
    (None, "wrote no result"),
    (b"{not json", "not JSON"),
    (json.dumps({"skipped": "RuntimeError: boom"}).encode(), "RuntimeError: boom"),
    (json.dumps([]).encode(), "malformed"),
    (json.dumps([{"pass": "forward", "shape": [1, 1, 8, 16], "causal": False}] * 33).encode(), "malformed"),
    (json.dumps([{"pass": "sideways", "shape": [1, 1, 8, 16], "causal": False, **NUMBERS}]).encode(), "malformed"),
    (json.dumps([{"pass": "forward", "shape": [1, 1, 8], "causal": False, **NUMBERS}]).encode(), "malformed"),
    (json.dumps([{"pass": "forward", "shape": [True, 1, 8, 16], "causal": 0, **NUMBERS}]).encode(), "malformed"),
    (json.dumps([{"pass": "forward", "shape": [1, 1, 8, 16], "causal": False, "student_tflops": float("inf"),
                  "peer_tflops": 1.0}]).encode(), "malformed"),
    (json.dumps([{"pass": "forward", "shape": [1, 1, 8, 16], "causal": False, "student_tflops": -1.0,
                  "peer_tflops": 1.0}]).encode(), "malformed"),
])
def test_an_untrusted_result_that_is_not_rows_gives_one_skipped_line(raw, reason):
    lines = gb.feedback_lines(gb.read_rows(raw))
    assert len(lines) == 1 and lines[0].startswith("benchmark skipped: ") and reason in lines[0], lines


def test_the_feedback_lines_name_the_shape_the_speeds_and_the_ratio():
    rows = [{"pass": "backward", "shape": [4, 16, 1024, 64], "causal": True, **NUMBERS},
            {"pass": "forward", "shape": [4, 16, 4096, 64], "causal": False, "skipped": "x" * 500}]
    lines = gb.feedback_lines(gb.read_rows(json.dumps(rows).encode()))
    assert lines[1] == ("backward, B 4, H 16, T 1024, d 64, causal: your kernels 40.0 TFLOP/s, SDPA flash "
                        "160.0 TFLOP/s (0.25x)")
    assert lines[2] == "forward, B 4, H 16, T 4096, d 64: benchmark skipped: " + "x" * 200


@pytest.mark.cuda
def test_on_a_gpu_the_solution_gets_its_tflops_in_the_feedback(tmp_path):
    """The whole path where the grading machine has CUDA: the second sandboxed run sees the GPU, compiles the
    solution's kernels and times them against SDPA's flash backend on every shape, both passes."""
    lines = _gpu_benchmark(tmp_path, Options(unsafe_no_sandbox=not bubblewrap_available()),
                           _program(submission(PS12, NOTEBOOK)))
    print("\n".join(lines))
    assert len(lines) == 1 + 2 * 2 * len(gb.SHAPES), lines
    assert all("TFLOP/s" in line and "skipped" not in line for line in lines[1:]), lines
