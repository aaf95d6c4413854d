"""Time and peak memory of attention implementations for growing sequence length T, one run, on this machine.

    python benchmarks/bench_attention.py [--lengths 1024 4096 8192] [--heads 8] [--d-head 64] [--window 256]
                                         [--methods sdpa flash ...] [--backward] [--repeats 3] [--threads 1]
                                         [--csv PATH]

Causal self-attention, batch 1, float32, forward pass by default. The methods:

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, whose CPU kernel is a C++
  FlashAttention (tiled, online softmax). It is the peer every time is compared with.
- ``flash``: ``llmarch.efficient.flash_attention`` (pure torch: a Python loop over 128 x 128 tiles, online
  softmax, tiles above the diagonal skipped).
- ``naive``: ``llmarch.attention.scaled_dot_product_attention``, which materialises the T x T scores and
  weights. It is the peer every memory figure is compared with.
- ``window``: causal sliding-window attention (each query sees its last ``--window`` keys, itself included):
  ``flash_attention(q, k, v, mask=sliding_window_mask(T, w))``. The tiles the mask hides entirely are skipped,
  so the work is O(T w d) instead of O(T^2 d). This path needs the window as a dense boolean (T, T) mask; the
  worker builds it *before* the baseline is taken, like q, k and v, and its size is reported separately
  (column ``mask_mib``, T^2 bytes; it is built in place, and checked against ``sliding_window_mask`` after the
  measurements, because that builder's int64 index temporaries would raise the process's high-water mark above
  anything the attention itself uses). A kernel with a built-in window (FlashAttention-2's ``window_size``,
  compiled FlexAttention's block mask) computes the band from the indices and needs no such mask.
- ``window_sdpa``: the same window as a boolean ``attn_mask`` to torch's SDPA. Same result; but torch's CPU
  kernel cannot skip anything it is given as a dense mask, so it computes all T^2 scores (the mask is again built
  before the baseline).

Compiled FlexAttention (``llmarch.efficient.flex_sliding_window(..., compile=True)``) also runs on this CPU,
but it is not in the table: its compilation takes tens of seconds and about 1.5 GiB per process, and once
compiled it was slower than SDPA's full causal attention here (1.9 s against 0.6 s at T = 4096, measured in one
process on this machine).

Each (method, T) runs in a fresh Python process so that its peak resident memory (``ru_maxrss``) above the
baseline (torch imported, inputs allocated) is its own; the first call sets the peak and warms up, the time is
the median of ``--repeats`` further calls, both wall-clock and the process's CPU time (``time.process_time``).
With one thread the CPU time is close to what the call costs on an idle core (other processes still compete
for caches and memory bandwidth); on a shared machine the wall-clock time also contains the time other processes
held the core, so the time ratios are taken on CPU time. Prints times
and peak extra memory with their ratios against sdpa (CPU time) and naive (memory) measured in the same run, and the course's targets for flash at the longest T
(memory at most 1/10 of naive, time within 3x of sdpa). Nothing is asserted about the numbers: a shared machine
makes times noisy, so the load average at the start is printed and recorded with them. Each worker checks its
first 64 output rows against float64 attention (column ``max_abs_error``). ``--csv`` writes one row per
(T, method); the book's section "Measured memory and time" (Efficient attention) plots
``book/data/attention_benchmark.csv``, written by ``make experiments``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("sdpa", "flash", "naive", "window", "window_sdpa")  # sdpa first: the peer for times
BLOCK = 128  # flash_attention's tile size here (its default is 64; 128 was the fastest on this CPU)

WORKER = r"""
import json, resource, statistics, sys, time
import torch
import torch.nn.functional as F
from llmarch.attention import scaled_dot_product_attention
from llmarch.efficient import flash_attention, sliding_window_mask

method, backward = sys.argv[1], sys.argv[5] == "1"
T, H, d, repeats, threads, window, block = (int(sys.argv[i]) for i in (2, 3, 4, 6, 7, 8, 9))
torch.set_num_threads(threads)
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, T, d, requires_grad=backward) for _ in range(3))
mask = None
if method.startswith("window"):  # an input, like q, k, v; built in place, so that it needs no more than its T^2 bytes
    mask = torch.ones(T, T, dtype=torch.bool).tril_().triu_(1 - window)  # 0 <= i - j < window
fn = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "flash": lambda: flash_attention(q, k, v, is_causal=True, block_q=block, block_k=block),
    "naive": lambda: scaled_dot_product_attention(q, k, v, is_causal=True),
    "window": lambda: flash_attention(q, k, v, mask=mask, block_q=block, block_k=block),
    "window_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
}[method]


def run():
    out = fn()
    if backward:
        out.sum().backward()
    return out


baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
out = run()  # the first call: its high-water mark is the peak memory; it also warms up
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
# a spot check that the method computes what it should: the first 64 queries against float64 attention
rows = slice(0, 64)
allowed = (mask if mask is not None else torch.ones(T, T, dtype=torch.bool).tril())[rows]
ref = F.scaled_dot_product_attention(*(t.detach().double() for t in (q[..., rows, :], k, v)), attn_mask=allowed)
err = (out[..., rows, :].detach() - ref).abs().max().item()
del out
times, cpu_times = [], []
for _ in range(repeats):
    start, cpu_start = time.perf_counter(), time.process_time()
    run()
    times.append(time.perf_counter() - start)
    cpu_times.append(time.process_time() - cpu_start)
if mask is not None:  # after the measurements: sliding_window_mask needs 8 T^2 bytes of temporaries
    assert torch.equal(mask, sliding_window_mask(T, window))
print(json.dumps({"seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu_times),
                  "peak_mib": max(peak - baseline, 0) / 1024, "max_abs_error": err}))
"""


def measure(method: str, T: int, args) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", WORKER, method, str(T), str(args.heads), str(args.d_head),
         "1" if args.backward else "0", str(args.repeats), str(args.threads), str(args.window), str(BLOCK)],
        env=env, capture_output=True, text=True,
    )
    if result.returncode:
        raise RuntimeError(f"{method} at T={T} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--window", type=int, default=256, help="keys per query of the sliding-window methods")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 by default: on a shared 2-core machine more threads oversubscribe)")
    parser.add_argument("--csv", type=Path, help="also write the results to this CSV file")
    args = parser.parse_args()
    methods = [m for m in METHODS if m in args.methods]
    import torch  # only for its version, recorded with the results

    what = "forward + backward" if args.backward else "forward"
    load = os.getloadavg()[0]
    print(f"causal attention, batch 1, {args.heads} heads, d_head {args.d_head}, float32, {what}; window "
          f"{args.window}; {args.threads} thread(s); median of {args.repeats} after a warm-up; torch "
          f"{torch.__version__}; load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'T':>6} {'method':>12} {'wall ms':>9} {'CPU ms':>9} {'x sdpa':>7} {'peak MiB':>9} {'x naive':>8} "
          f"{'max err':>8}")
    records = []
    for T in args.lengths:
        rows = {m: measure(m, T, args) for m in methods}
        for m in methods:
            r = rows[m]
            t_ratio = r["cpu_seconds"] / rows["sdpa"]["cpu_seconds"] if "sdpa" in rows else float("nan")
            naive_mib = rows["naive"]["peak_mib"] if "naive" in rows else 0.0
            m_ratio = r["peak_mib"] / naive_mib if naive_mib > 0 else float("nan")
            print(f"{T:>6} {m:>12} {1e3 * r['seconds']:>9.1f} {1e3 * r['cpu_seconds']:>9.1f} {t_ratio:>7.2f} "
                  f"{r['peak_mib']:>9.1f} {m_ratio:>8.4f} {r['max_abs_error']:>8.1e}")
            records.append({
                "T": T, "method": m, "seconds": f"{r['seconds']:.5f}", "cpu_seconds": f"{r['cpu_seconds']:.5f}",
                "peak_extra_mib": f"{r['peak_mib']:.2f}",
                "time_vs_sdpa": f"{t_ratio:.4f}", "memory_vs_naive": f"{m_ratio:.5f}",
                "mask_mib": f"{T * T / 2**20:.2f}" if m.startswith("window") else "0",
                "max_abs_error": f"{r['max_abs_error']:.2e}", "batch": 1, "heads": args.heads,
                "d_head": args.d_head, "window": args.window if m.startswith("window") else "",
                "pass": "forward+backward" if args.backward else "forward", "threads": args.threads,
                "torch": torch.__version__, "load_average": f"{load:.2f}",
            })

    if {"flash", "sdpa", "naive"} <= set(methods):
        T = max(args.lengths)
        r = {rec["method"]: rec for rec in records if rec["T"] == T}
        mem, tim = float(r["flash"]["memory_vs_naive"]), float(r["flash"]["time_vs_sdpa"])
        print(f"targets for flash at T = {T}: peak extra memory {mem:.4f} x naive (target <= 0.1: "
              f"{'met' if mem <= 0.1 else 'MISSED'}); CPU time {tim:.2f} x sdpa (target <= 3: "
              f"{'met' if tim <= 3 else 'MISSED'})")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
