"""Time and throughput of attention on a CUDA GPU: the course's Triton kernel against torch's two fused kernels.

    python benchmarks/bench_attention_gpu.py [--quick] [--dtypes fp16 bf16] [--d-heads 64 128]
                                             [--lengths 1024 2048 4096 8192 16384] [--causal both|yes|no]
                                             [--passes forward forward+backward] [--tokens 16384] [--heads 16]
                                             [--warmup 5] [--reps 20] [--csv PATH]

Three implementations of the same attention, ``softmax(Q K^T / sqrt(d)) V`` on ``q, k, v (B, H, T, d)``:

- ``triton``: ``llmarch.efficient.triton_flash_attention(q, k, v, is_causal=...)``, the course's FlashAttention-2
  in Triton (forward kernel, backward in two kernels; float16 / bfloat16 / float32; any head dim, padded to a
  power of two inside the kernel; default 64 x 64 tiles). It is *ours*: every ratio is a peer's time over its time.
- ``sdpa_flash``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)`` inside
  ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, i.e. torch's build of Tri Dao's
  FlashAttention-2 CUDA kernels and nothing else (no fallback to another backend). Peer 1.
- ``flex``: ``torch.compile(torch.nn.attention.flex_attention.flex_attention)``; for the causal case with a
  ``block_mask = create_block_mask(causal, None, None, T, T)`` (built once per configuration, outside the timed
  region, like the other two kernels' ``is_causal`` flag), so that the fully masked tiles are skipped; no mask
  otherwise. Peer 2. Its compilation (once per shape, dtype and pass: 80 graphs for the whole grid) dominates the
  run time of this script; expect tens of minutes for the full grid, much less for ``--quick``.

The grid: passes forward and forward+backward, dtypes float16 and bfloat16, head dim d = 64 and 128, sequence
length T = 1k, 2k, 4k, 8k, 16k, causal and not. The number of query rows is kept constant so that memory stays
sane (the inputs have the same size at every T; the work grows like T): batch ``B = --tokens // T`` (16 at T = 1k,
1 at T = 16k) with ``H = --heads = 16``, so ``B * H * T = 16 * 16k = 262144`` rows of q (64 MiB per tensor in 16
bits at d = 128). ``--quick`` runs a small subset (float16, d = 64, T = 1k and 4k, both passes, causal and not).

Timing: each implementation is run once (compiles, autotunes, and checks that it runs at all), then ``--warmup``
more calls, then ``--reps`` calls each bracketed by CUDA events (``torch.cuda.synchronize()`` before reading
them); the time is the median. forward+backward is one call of the forward and
``torch.autograd.grad(out, (q, k, v), dout)`` (no gradient accumulation into ``.grad``).

FLOP convention (FlashAttention's benchmark, ``flash_attn/benchmarks``): the forward pass does two matmuls,
``Q K^T`` and ``P V``, each ``B * H * T * T * d`` multiply-adds, so ``4 * B * H * T^2 * d`` FLOPs; halved for
causal (only the half at or below the diagonal is needed; the exact count is ``T (T + 1) / 2`` pairs per head).
The backward counts as 2.5x the forward (five matmuls of that size against two), so forward+backward is 3.5x the
forward. TFLOP/s is this count over the median time; it ignores the softmax's exponentials, as FlashAttention
does. The same count is used for all three implementations, so TFLOP/s ratios equal speed ratios.

Ratios: ``Triton/SDPA-flash`` and ``Triton/Flex`` are speed ratios, the peer's time over the Triton kernel's time
(above 1: the Triton kernel is faster). Correctness, once per configuration: the output (forward) or the gradients
dq, dk, dv for a random ``dout`` (forward+backward) of batch 0 and the first few heads (as many as keep the float32
T x T scores of the reference under 2^28 elements) against ``scaled_dot_product_attention`` with
``SDPBackend.MATH`` on float32 copies; the largest absolute error is printed (column ``max_abs_error``), and a cell
whose error is over 4x that of ``sdpa_flash`` (and over 1e-2) is flagged ``CHECK``, so a fast but wrong kernel is
visible. Nothing is asserted about the numbers.

An implementation that cannot run a configuration (an exception: unsupported dtype or head dim, out of shared
memory or GPU memory, a compile failure, triton missing) is recorded as ``unsupported`` for that cell with the
first line of the error, and the script goes on. ``--csv`` writes one row per (impl, pass, dtype, d, T, causal)
with ``ms``, ``tflops``, ``triton_speed_ratio`` (this implementation's time over the Triton kernel's: the speed
ratio of ours against this peer; 1 for the Triton row; empty where either is unsupported), ``max_abs_error``,
``status`` and ``note``; ``make test-gpu`` writes ``book/data/attention_gpu_benchmark.csv``.

On a machine without CUDA (or with ``TRITON_INTERPRET=1``, under which nothing compiled runs and nothing can be
timed) the script prints one line saying so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("llmarch") is None:  # not installed (e.g. a GPU machine without the venv)
    sys.path.insert(0, str(ROOT / "lib"))

IMPLS = ("triton", "sdpa_flash", "flex")  # triton first: ours; the other two are the peers
PASSES = ("forward", "forward+backward")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BACKWARD_FACTOR = 2.5  # backward FLOPs = 2.5 x forward FLOPs (FlashAttention's benchmark convention)
REF_BUDGET = 2**28  # elements of float32 T x T scores the math-backend reference may materialise per head slice
FLAG_ABS = 1e-2  # an error under this is never flagged
FLAG_FACTOR = 4.0  # ... nor one within this factor of sdpa_flash's
DEVICE = "cuda"


def attention_flops(batch: int, heads: int, T: int, d: int, causal: bool = False, pass_: str = "forward") -> float:
    """FLOPs of attention by FlashAttention's convention: ``4 B H T^2 d`` forward (two matmuls of ``B H T^2 d``
    multiply-adds, 2 FLOPs each), halved when causal; the backward is 2.5x the forward, so ``"forward+backward"``
    is 3.5x and ``"backward"`` 2.5x."""
    fwd = 4.0 * batch * heads * T * T * d / (2 if causal else 1)
    factor = {"forward": 1.0, "backward": BACKWARD_FACTOR, "forward+backward": 1.0 + BACKWARD_FACTOR}[pass_]
    return fwd * factor


def no_benchmark_reason() -> str | None:
    """Why nothing can be timed here, or None."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: triton runs in its interpreter and nothing can be timed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def _time_ms(fn, warmup: int, reps: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls, each between two CUDA events, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def _make_impls(causal: bool, T: int):
    """The three attention functions ``f(q, k, v) -> out`` for one configuration (the block mask built here)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        from llmarch.efficient import triton_flash_attention
    except ImportError as err:  # every Triton cell becomes "unsupported" with this reason
        triton_flash_attention, import_error = None, err

    def triton_fn(q, k, v):
        if triton_flash_attention is None:
            raise import_error
        return triton_flash_attention(q, k, v, is_causal=causal)

    def sdpa_flash_fn(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    state = {}

    def flex_fn(q, k, v):
        if "fn" not in state:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            state["fn"] = _compiled(flex_attention)
            state["mask"] = None
            if causal:
                state["mask"] = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None, T, T,
                                                  device=q.device)
        return state["fn"](q, k, v, block_mask=state["mask"])

    return {"triton": triton_fn, "sdpa_flash": sdpa_flash_fn, "flex": flex_fn}


_COMPILED = {}


def _compiled(fn):
    if "flex" not in _COMPILED:
        import torch._dynamo

        # one compiled graph per (shape, dtype, pass, mask): the whole grid has ~80, over dynamo's default limit of 8
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
        _COMPILED["flex"] = torch.compile(fn, dynamic=False)
    return _COMPILED["flex"]


def _reference(q, k, v, dout, causal: bool, heads: int, backward: bool):
    """Batch 0, the first ``heads`` heads, in float32 with SDPA's math backend: the output, or (dq, dk, dv)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q32, k32, v32 = (x[:1, :heads].detach().float().requires_grad_(backward) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
    if not backward:
        return (out.detach(),)
    return torch.autograd.grad(out, (q32, k32, v32), dout[:1, :heads].float())


def run_config(dtype, d: int, T: int, causal: bool, passes, args) -> list[dict]:
    """All implementations and passes of one (dtype, d, T, causal); a list of result dicts."""
    B, H = max(1, args.tokens // T), args.heads
    ref_heads = max(1, min(H, REF_BUDGET // (T * T)))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, T, d, device=DEVICE, dtype=dtype, generator=gen) for _ in range(4))
    impls = _make_impls(causal, T)
    results = []
    for pass_ in passes:
        backward = pass_ == "forward+backward"
        qg, kg, vg = (x.detach().requires_grad_(backward) for x in (q, k, v))
        try:
            ref = _reference(q, k, v, dout, causal, ref_heads, backward)
        except Exception as err:  # noqa: BLE001 - no reference: the times are still taken, the errors left empty
            print(f"reference for {pass_}, T={T}, d={d} failed ({_first_line(err)}); no error check", flush=True)
            ref = None
            torch.cuda.empty_cache()
        flops = attention_flops(B, H, T, d, causal, pass_)
        for name in args.impls:
            f = impls[name]

            def call(f=f):
                out = f(qg, kg, vg)
                return torch.autograd.grad(out, (qg, kg, vg), dout) if backward else (out,)

            row = {"impl": name, "pass": pass_, "dtype": args.dtype_name[dtype], "d": d, "T": T,
                   "causal": causal, "batch": B, "heads": H, "ms": None, "tflops": None, "max_abs_error": None,
                   "status": "ok", "note": ""}
            try:
                got = call()  # the first call: compiles / autotunes, and is the one checked
                torch.cuda.synchronize()
                if ref is not None:
                    row["max_abs_error"] = max((g[:1, :ref_heads].float() - r).abs().max().item()
                                               for g, r in zip(got, ref))
                del got
                row["ms"] = _time_ms(call, args.warmup, args.reps)
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
            except Exception as err:  # noqa: BLE001 - any failure makes the cell "unsupported", with its reason
                row.update(status="unsupported", note=_first_line(err), ms=None, tflops=None, max_abs_error=None)
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            results.append(row)
        del qg, kg, vg, ref
    del q, k, v, dout
    torch.cuda.empty_cache()
    return results


def _add_ratios(rows: list[dict]) -> None:
    """``triton_speed_ratio`` = this row's time / the Triton row's time (same pass and config); ``flag``."""
    ours = {(r["pass"], r["dtype"], r["d"], r["T"], r["causal"]): r for r in rows if r["impl"] == "triton"}
    sdpa = {(r["pass"], r["dtype"], r["d"], r["T"], r["causal"]): r for r in rows if r["impl"] == "sdpa_flash"}
    for r in rows:
        key = (r["pass"], r["dtype"], r["d"], r["T"], r["causal"])
        t = ours.get(key)
        r["triton_speed_ratio"] = r["ms"] / t["ms"] if t and t["ms"] and r["ms"] else None
        s = sdpa.get(key)
        err, floor = r["max_abs_error"], FLAG_ABS
        if s is not None and s["max_abs_error"] is not None:
            floor = max(floor, FLAG_FACTOR * s["max_abs_error"])
        r["flag"] = "CHECK" if err is not None and err > floor else ""


def _fmt(x, spec: str, width: int) -> str:
    return f"{'unsup.':>{width}}" if x is None else f"{x:>{width}{spec}}"


def print_rows(rows: list[dict], impls) -> None:
    by = {}
    for r in rows:
        by.setdefault((r["pass"], r["dtype"], r["d"], r["T"], r["causal"]), {})[r["impl"]] = r
    for key, cell in by.items():
        pass_, dtype, d, T, causal = key
        line = f"{pass_:>16} {dtype:>5} {d:>4} {T:>6} {'yes' if causal else 'no':>6}"
        for name in impls:
            r = cell[name]
            line += f" | {_fmt(r['ms'], '.3f', 8)} {_fmt(r['tflops'], '.1f', 6)}"
        for name in impls:
            if name != "triton" and "triton" in impls:
                line += f" | {_fmt(cell[name]['triton_speed_ratio'], '.2f', 6)}"
        line += " |" + "".join(f" {_fmt(cell[n]['max_abs_error'], '.1e', 7)}{'!' if cell[n]['flag'] else ''}"
                               for n in impls)
        print(line, flush=True)
        for name in impls:
            r = cell[name]
            if r["status"] != "ok":
                print(f"{'':>16} {name} unsupported: {r['note']}", flush=True)
            elif r["flag"]:
                print(f"{'':>16} CHECK {name}: max abs error {r['max_abs_error']:.2e} is over "
                      f"max({FLAG_ABS:g}, {FLAG_FACTOR:g} x sdpa_flash's)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small subset: fp16, d 64, T 1k and 4k")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--d-heads", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--tokens", type=int, default=16384, help="B * T: the batch is tokens // T (at least 1)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--csv", type=Path, help="also write the results to this CSV file")
    args = parser.parse_args(argv)

    reason = no_benchmark_reason()
    if reason:
        print(f"bench_attention_gpu: {reason}; nothing benchmarked (needs a CUDA GPU), skipped.")
        return 0

    if args.quick:
        args.dtypes, args.d_heads, args.lengths = ["fp16"], [64], [1024, 4096]
    args.impls = [m for m in IMPLS if m in args.impls]
    args.dtype_name = {DTYPES[n]: n for n in DTYPES}
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "missing"
    device = torch.cuda.get_device_name()
    print(f"attention on {device}; torch {torch.__version__}, triton {triton_version}, python "
          f"{platform.python_version()}; B = {args.tokens} // T, H = {args.heads}; median of {args.reps} after "
          f"{args.warmup} warm-up calls; TFLOP/s with 4 B H T^2 d forward (halved if causal), backward 2.5x")
    peers = [n for n in args.impls if n != "triton"] if "triton" in args.impls else []
    print(f"{'':>41}" + "".join(f" | {n:>15}" for n in args.impls) + "".join(f" | {'T/' + n[:4]:>6}" for n in peers)
          + " | max abs error")
    print(f"{'pass':>16} {'dtype':>5} {'d':>4} {'T':>6} {'causal':>6}" + f" | {'ms':>8} {'TF/s':>6}" * len(args.impls)
          + f" | {'':>6}" * len(peers) + " | " + ", ".join(args.impls))
    if peers:
        print("(T/<peer>: speed ratio Triton/<peer> = the peer's time / the Triton kernel's time; above 1, ours is "
              "faster. '!' after an error: flagged CHECK)")

    rows = []
    for name in args.dtypes:
        for d in args.d_heads:
            for causal in causals:
                for T in args.lengths:
                    config_rows = run_config(DTYPES[name], d, T, causal, args.passes, args)
                    _add_ratios(config_rows)
                    print_rows(config_rows, args.impls)
                    rows += config_rows

    for peer in args.impls[1:] if args.impls[:1] == ["triton"] else []:
        vals = [r["triton_speed_ratio"] for r in rows if r["impl"] == peer and r["triton_speed_ratio"]]
        if vals:
            print(f"Triton/{peer}: speed ratio median {statistics.median(vals):.2f} over {len(vals)} cells "
                  f"(min {min(vals):.2f}, max {max(vals):.2f})")
    unsupported = [r for r in rows if r["status"] != "ok"]
    flagged = [r for r in rows if r["flag"]]
    print(f"{len(rows)} cells, {len(unsupported)} unsupported, {len(flagged)} flagged CHECK")

    if args.csv:
        fields = ["impl", "pass", "dtype", "d", "T", "causal", "batch", "heads", "ms", "tflops",
                  "triton_speed_ratio", "max_abs_error", "status", "note", "flag", "device", "torch", "triton"]
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for r in rows:
                writer.writerow({
                    **r, "causal": int(r["causal"]),
                    "ms": "" if r["ms"] is None else f"{r['ms']:.4f}",
                    "tflops": "" if r["tflops"] is None else f"{r['tflops']:.2f}",
                    "triton_speed_ratio": "" if r["triton_speed_ratio"] is None else f"{r['triton_speed_ratio']:.4f}",
                    "max_abs_error": "" if r["max_abs_error"] is None else f"{r['max_abs_error']:.3e}",
                    "device": device, "torch": torch.__version__, "triton": triton_version,
                })
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
