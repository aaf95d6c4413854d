"""Information, not points: the TFLOP/s of a ps12-flash submission's kernels, compiled on the grading
machine's GPU, against PyTorch's FlashAttention backend.

Only where the grading machine has CUDA, the grader (``grade.py``) starts, after the graded run and in a sandbox
of its own that sees the GPU, ``python /grader/gpu_benchmark.py /grader/program.py`` (this file and the program,
both read-only). The program is built by trusted code (:func:`kernel_program`): the release's set-up cell, then
only the *definitions* of the submission's Triton kernels, taken from its cells' sources. No other statement of
the notebook runs, so nothing the notebook does can write the result or end the process early, and a result file
left by the graded run is deleted first. On the GPU the kernels' bodies are compiled, never run as Python.
This script launches them as the notebook's launchers do on :data:`SHAPES`, checks each result against
``scaled_dot_product_attention`` in float32 on a slice, times it with triton's ``do_bench`` and writes
:data:`RESULT_FILE` into its working folder. The grader reads that file with :func:`read_rows` (it was written
inside the sandbox, so it is checked and bounded, and it can only change what this student's feedback shows) and
shows :func:`feedback_lines`. Nothing here changes a grade; any failure becomes "benchmark skipped: <reason>".
(In triton's interpreter, ``--cpu-test``, a kernel's body does run as Python: that mode is for the course's tests.)

The student's kernels take float32 (the notebook's contract: exact float32 ``tl.dot``); PyTorch's flash backend
takes only 16-bit inputs, so the peer runs in float16 on the same values (cast once, outside the timing).

FLOP count, the FlashAttention-2 paper's (Dao, 2023, section 4.1, "Benchmarking attention"): the forward does
``4 B H T^2 d`` FLOPs (two matmuls, ``Q K^T`` and ``P V``, of ``2 B H T^2 d`` each), half of that when causal; the
backward counts 2.5 times the forward (five such matmuls against two: ``S`` recomputed, ``dV``, ``dP``, ``dQ``,
``dK``). The same count serves both implementations, so the TFLOP/s ratio is the speed ratio.

Book: Efficient attention, "GPU paths".
"""

import argparse
import ast
import json
import math
import os
import sys
import time

RESULT_FILE = ".grader-benchmark.json"
NO_GPU = "no GPU on the grading machine: TFLOP/s not measured"
SHAPES = ((4, 16, 1024, 64), (4, 16, 4096, 64))  # (B, H, T, d), each causal and not
BLOCKS = (64, 64)  # (BLOCK_M, BLOCK_N) for every kernel
BACKWARD_FACTOR = 2.5
TOLERANCE = 1e-3  # rtol and atol against float32 SDPA; a correct float32 kernel is near 1e-5
MAX_ROWS = 32
PASSES = ("forward", "backward")
SETUP_CELL = "setup"  # the grade_id of the release's read-only set-up cell (imports triton, tl, torch)


def attention_flops(b: int, h: int, t: int, d: int, causal: bool, backward: bool = False) -> float:
    """FLOPs of attention on ``(B, H, T, d)``, FlashAttention-2's convention (module docstring):
    ``4 B H T^2 d``, halved when causal, times 2.5 for the backward."""
    flops = 4.0 * b * h * t * t * d / (2 if causal else 1)
    return flops * BACKWARD_FACTOR if backward else flops


# -- Launching the student's kernels as the notebook's launchers do (its set-up cell) ---------------------------


def _flat(x):
    b, h, t, d = x.shape
    return x.reshape(b * h, t, d).contiguous()


def student_forward(ns: dict, q, k, v, causal: bool, blocks=BLOCKS):
    """``flash_fwd_kernel`` launched like ``run_forward``: q, k, v (B, H, T, d) -> output, log-sum-exp (B*H, T)."""
    import torch

    b, h, t, d = q.shape
    q3, k3, v3 = _flat(q), _flat(k), _flat(v)
    out, lse = torch.empty_like(q3), torch.empty(b * h, t, dtype=torch.float32, device=q.device)
    ns["flash_fwd_kernel"][(math.ceil(t / blocks[0]), b * h)](
        q3, k3, v3, out, lse, 1.0 / math.sqrt(d), t, D=d, IS_CAUSAL=causal, BLOCK_M=blocks[0], BLOCK_N=blocks[1])
    return out.reshape(b, h, t, d), lse


def student_backward(ns: dict, q, k, v, out, lse, d_out, causal: bool, blocks=BLOCKS):
    """``delta = rowsum(dO * O)``, then the two backward kernels launched like ``run_dkdv`` and ``run_dq`` with
    the forward's ``out`` and ``lse``: -> dq, dk, dv (B, H, T, d)."""
    import torch

    b, h, t, d = q.shape
    q3, k3, v3, do3 = _flat(q), _flat(k), _flat(v), _flat(d_out)
    delta = (d_out.float() * out.float()).sum(-1).reshape(b * h, t).contiguous()
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    scale, constants = 1.0 / math.sqrt(d), dict(D=d, IS_CAUSAL=causal, BLOCK_M=blocks[0], BLOCK_N=blocks[1])
    ns["flash_bwd_dkdv_kernel"][(math.ceil(t / blocks[1]), b * h)](q3, k3, v3, do3, lse, delta, dk, dv, scale, t,
                                                                   **constants)
    ns["flash_bwd_dq_kernel"][(math.ceil(t / blocks[0]), b * h)](q3, k3, v3, do3, lse, delta, dq, scale, t,
                                                                 **constants)
    return tuple(x.reshape(b, h, t, d) for x in (dq, dk, dv))


# -- The peer and the timer on a GPU ------------------------------------------------------------------------------


def flash_sdpa(q, k, v, causal: bool):
    """PyTorch's FlashAttention-2 backend alone (no fallback); it takes float16 or bfloat16 inputs only."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def cuda_timer(fn) -> float:
    """Milliseconds per call of ``fn``: triton's ``do_bench`` (warm-up, then the median of repeated calls)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


# -- Measuring ----------------------------------------------------------------------------------------------------


def _close(got, want) -> bool:
    import torch

    return bool(torch.allclose(got.float(), want.float(), rtol=TOLERANCE, atol=TOLERANCE))


def _reference(q, k, v, d_out, causal):
    """Output and gradients of float32 SDPA on batch 0 and the first two heads (kept small: the default backend
    may materialise the T x T scores)."""
    import torch
    import torch.nn.functional as F

    q, k, v = (x[:1, :2].detach().float().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out[:1, :2].float())
    return out.detach(), grads


def _row(pass_: str, shape, causal: bool, **fields) -> dict:
    return {"pass": pass_, "shape": list(shape), "causal": causal, **fields}


def _timed(pass_, shape, causal, student_fn, peer_fn, timer) -> dict:
    flops = attention_flops(*shape, causal, backward=pass_ == "backward")
    student_ms, peer_ms = timer(student_fn), timer(peer_fn)
    return _row(pass_, shape, causal, student_tflops=flops / student_ms / 1e9, peer_tflops=flops / peer_ms / 1e9)


def measure(ns: dict, device: str, shapes=SHAPES, blocks=BLOCKS, timer=cuda_timer, peer=flash_sdpa,
            peer_dtype: str = "float16") -> list[dict]:
    """One row per (shape, causal, pass): the TFLOP/s of the student's kernels (float32) and of ``peer`` (on
    the same values in ``peer_dtype``, cast before the timing) timed by ``timer(fn) -> ms``, or ``"skipped"``
    with the reason (a kernel that raised, or whose result differs from float32 SDPA). The backward is timed
    only where the kernels exist and the forward is right. ``device``, ``timer``, ``peer`` and ``peer_dtype``
    are parameters so that the course's tests run this on CPU."""
    import torch

    rows = []
    for shape in shapes:
        g = torch.Generator().manual_seed(0)
        q, k, v, d_out = (torch.randn(*shape, generator=g).to(device) for _ in range(4))
        peer_inputs = [x.to(getattr(torch, peer_dtype)) for x in (q, k, v, d_out)]
        for causal in (False, True):
            ref_out, ref_grads = _reference(q, k, v, d_out, causal)
            try:
                out, lse = student_forward(ns, q, k, v, causal, blocks)
            except Exception as err:  # noqa: BLE001 - the student's kernel: any failure is a reason
                rows.append(_row("forward", shape, causal, skipped=f"your forward raised {_describe(err)}"))
                continue
            if not _close(out[:1, :2], ref_out):
                rows.append(_row("forward", shape, causal, skipped="your forward's output differs from SDPA's"))
                continue
            rows.append(_timed("forward", shape, causal, lambda: student_forward(ns, q, k, v, causal, blocks),
                               lambda: peer(*peer_inputs[:3], causal), timer))
            rows.append(_backward_row(ns, shape, causal, (q, k, v, out, lse, d_out), ref_grads, blocks, timer,
                                      peer, peer_inputs))
    return rows


def _backward_row(ns, shape, causal, tensors, ref_grads, blocks, timer, peer, peer_inputs) -> dict:
    import torch

    q, k, v, out, lse, d_out = tensors
    if not all(name in ns for name in ("flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel")):
        return _row("backward", shape, causal, skipped="the backward kernels are not defined")
    try:
        grads = student_backward(ns, q, k, v, out, lse, d_out, causal, blocks)
    except Exception as err:  # noqa: BLE001 - the student's kernel: any failure is a reason
        return _row("backward", shape, causal, skipped=f"your backward raised {_describe(err)}")
    for name, got, want in zip(("dQ", "dK", "dV"), grads, ref_grads):
        if not _close(got[:1, :2], want):
            return _row("backward", shape, causal, skipped=f"your {name} differs from SDPA's gradient")
    qp, kp, vp = (x.detach().clone().requires_grad_() for x in peer_inputs[:3])
    peer_out = peer(qp, kp, vp, causal)
    return _timed("backward", shape, causal, lambda: student_backward(ns, q, k, v, out, lse, d_out, causal, blocks),
                  lambda: torch.autograd.grad(peer_out, (qp, kp, vp), peer_inputs[3], retain_graph=True), timer)


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
    return text[:200]


# -- What the grader shows ------------------------------------------------------------------------------------------


def read_rows(raw: bytes | None) -> list[dict] | str:
    """The rows of :data:`RESULT_FILE` (untrusted), each checked: a pass, a shape of four positive ints, a causal
    flag, and either two finite positive TFLOP/s values or a reason; else a string saying why it was refused."""
    if raw is None:
        return "the benchmark wrote no result"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return "the benchmark's result is not JSON"
    if isinstance(data, dict) and isinstance(data.get("skipped"), str):
        return data["skipped"][:300]
    if not isinstance(data, list) or not 0 < len(data) <= MAX_ROWS:
        return "the benchmark's result is malformed"
    rows = []
    for row in data:
        if not (isinstance(row, dict) and row.get("pass") in PASSES and type(row.get("causal")) is bool
                and isinstance(row.get("shape"), list) and len(row["shape"]) == 4
                and all(type(n) is int and 0 < n < 2**20 for n in row["shape"])):
            return "the benchmark's result is malformed"
        clean = {"pass": row["pass"], "shape": row["shape"], "causal": row["causal"]}
        if isinstance(row.get("skipped"), str):
            clean["skipped"] = row["skipped"][:200]
        else:
            speeds = [row.get("student_tflops"), row.get("peer_tflops")]
            if not all(type(x) in (int, float) and math.isfinite(x) and 0 < x < 1e6 for x in speeds):
                return "the benchmark's result is malformed"
            clean["student_tflops"], clean["peer_tflops"] = map(float, speeds)
        rows.append(clean)
    return rows


def feedback_lines(rows: list[dict] | str) -> list[str]:
    """One line per row (``"forward, B 4, H 16, T 1024, d 64, causal: your kernels 41.3 TFLOP/s, SDPA flash
    150.2 TFLOP/s (0.27x)"``), under one line saying what they are; a string (a reason) gives one line."""
    if isinstance(rows, str):
        return [f"benchmark skipped: {rows}"]
    lines = ["Speed on the grading machine's GPU (information, not graded): your kernels compiled, in float32, "
             "against PyTorch's FlashAttention-2 backend (scaled_dot_product_attention, float16); FLOPs counted as "
             "in the FlashAttention-2 paper (4 B H T^2 d forward, half of it causal, backward 2.5x)"]
    for row in rows:
        b, h, t, d = row["shape"]
        what = f"{row['pass']}, B {b}, H {h}, T {t}, d {d}{', causal' if row['causal'] else ''}"
        if "skipped" in row:
            lines.append(f"{what}: benchmark skipped: {row['skipped']}")
        else:
            mine, peer = row["student_tflops"], row["peer_tflops"]
            lines.append(f"{what}: your kernels {mine:.1f} TFLOP/s, SDPA flash {peer:.1f} TFLOP/s "
                         f"({mine / peer:.2f}x)")
    return lines


# -- In the sandbox ------------------------------------------------------------------------------------------------


def _is_kernel_definition(node: ast.stmt) -> bool:
    """A top-level ``@triton.jit`` function whose definition evaluates nothing of the student's: defaults are
    literals and annotations ``tl.constexpr`` (both are evaluated when the ``def`` runs; the body is not)."""
    if not isinstance(node, ast.FunctionDef) or [ast.unparse(d) for d in node.decorator_list] != ["triton.jit"]:
        return False
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
    annotations = [a.annotation for a in every if a.annotation is not None] + [node.returns] * bool(node.returns)
    defaults = [*args.defaults, *filter(None, args.kw_defaults)]
    return (all(ast.unparse(a) == "tl.constexpr" for a in annotations)
            and all(isinstance(d, ast.Constant) for d in defaults))


def kernel_program(setup: str, cells: list[str]) -> str:
    """The only code the benchmark runs: the release's set-up cell ``setup``, then, from the submission's code
    cells ``cells``, every top-level ``@triton.jit`` definition (:func:`_is_kernel_definition`) and nothing else.
    A cell that does not parse contributes nothing."""
    parts = [setup]
    for source in cells:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError):
            continue
        parts += [ast.unparse(node) for node in tree.body if _is_kernel_definition(node)]
    return "\n\n\n".join(parts) + "\n"


def program_namespace(path: str) -> dict:
    """Run the program at ``path`` (compiled with its file name, so that ``triton.jit`` finds each kernel's
    source) and return its namespace; an error stops here with its message."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    ns = {"__name__": "__benchmark__"}
    try:
        exec(compile(source, path, "exec"), ns)  # noqa: S102 - built by kernel_program: set-up and definitions
    except Exception as err:  # noqa: BLE001 - any failure is the reason shown
        raise RuntimeError(f"defining the kernels raised {_describe(err)}") from None
    return ns


def _cpu_timer(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def _plain_sdpa(q, k, v, causal):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", help="the set-up and kernel definitions written by kernel_program")
    parser.add_argument("--cpu-test", nargs=4, type=int, metavar=("B", "H", "T", "D"),
                        help="for the course's tests: one small shape on the CPU (triton's interpreter), timed "
                             "once with a clock, against plain SDPA")
    args = parser.parse_args(argv)
    out = os.path.abspath(RESULT_FILE)  # in the working folder
    try:
        import torch

        if args.cpu_test is None and not torch.cuda.is_available():
            raise RuntimeError("the benchmark's sandbox sees no CUDA GPU")
        ns = program_namespace(args.program)
        if args.cpu_test is None:
            rows = measure(ns, "cuda")
        else:
            rows = measure(ns, "cpu", [tuple(args.cpu_test)], (16, 16), _cpu_timer, _plain_sdpa, "float32")
        result = rows
    except Exception as err:  # noqa: BLE001 - information only: every failure is a reason to show
        result = {"skipped": _describe(err)}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # skip teardown: nothing the notebook registered runs after this


if __name__ == "__main__":
    main()
