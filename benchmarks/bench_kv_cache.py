"""Time per generated token with and without the KV cache, for 512 new tokens, one run, on this machine.

    python benchmarks/bench_kv_cache.py [--new-tokens 512] [--prompt-len 1] [--d-model 64] [--layers 2]
                                        [--heads 4] [--repeats 3] [--threads 1] [--bin 64] [--csv PATH]

The model has the architecture of the course's tiny GPT (``llmarch.model.tiny_gpt_config()``: 2 layers,
d_model 64, 4 heads, learned positions, the 36-word vocabulary). The trained checkpoint (``load_tiny_gpt()``)
has learned positions for only 64 tokens, so it cannot generate 512; the benchmark builds the same
architecture with ``context_length = prompt_len + new_tokens`` and random weights (seed 0). The cost of a
forward pass does not depend on the values of the weights, so the timings are those of the trained model's
architecture at that length. ``--d-model``, ``--layers`` and ``--heads`` change the size.

Two greedy decoding loops produce the same tokens:

- *with the cache* (what ``llmarch.decoding.generate`` does by default): the prompt runs once, then each step
  feeds only the newest token and attends over the cached keys and values (``llmarch.efficient.KVCache``);
- *without the cache* (``generate(..., use_cache=False)``): each step runs the whole sequence so far again.

A step that starts with ``t`` tokens in the context costs O(t) with the cache and O(t) token-forwards plus O(t^2)
attention scores without it, so the total for n tokens is about linear against quadratic in n. The script
times every step (median over ``--repeats`` runs), prints the mean time per token in bins of positions, the
total of each loop and the ratio uncached / cached, and also times ``llmarch.decoding.generate`` itself both
ways (and checks that the two outputs are identical). No assertions: the numbers are for the book's chapter
Decoding, section "The KV cache", which reads ``--csv`` output from ``book/data/kv_cache_timing.csv``
(columns ``position, cached_ms, uncached_ms``: the step that predicts the token at index ``position`` of the
sequence, so the context then holds ``position`` tokens).

    python benchmarks/bench_kv_cache.py --csv book/data/kv_cache_timing.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import platform
import statistics
import time
from pathlib import Path

import torch

from llmarch.decoding import generate
from llmarch.efficient import KVCache
from llmarch.model import GPT, tiny_gpt_config


@torch.no_grad()
def timed_greedy(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> tuple[list[int], list[float]]:
    """Greedy decoding of ``new_tokens`` tokens after ``prompt (1, T0)``, timing each step.

    Returns the generated ids and the seconds of each step (step ``i`` predicts the token at index ``T0 + i``).
    The loop is ``generate``'s, with a clock around each forward pass and argmax.
    """
    cache = KVCache(len(model.blocks)) if use_cache else None
    seq, step_input = prompt, prompt
    tokens, seconds = [], []
    for _ in range(new_tokens):
        start = time.perf_counter()
        logits = model(step_input if use_cache else seq, kv_cache=cache)[:, -1]
        token = logits.argmax(dim=-1, keepdim=True)
        seconds.append(time.perf_counter() - start)
        seq = torch.cat([seq, token], dim=1)
        step_input = token
        tokens.append(int(token))
    return tokens, seconds


def median_step_times(model, prompt, new_tokens, use_cache, repeats):
    runs, outputs = [], []
    for _ in range(repeats):
        tokens, seconds = timed_greedy(model, prompt, new_tokens, use_cache)
        runs.append(seconds)
        outputs.append(tokens)
    return outputs[0], [statistics.median(step) for step in zip(*runs)]


def time_generate(model, prompt, new_tokens, use_cache, repeats):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = generate(model, prompt, new_tokens, greedy=True, use_cache=use_cache)
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=None, help="default: the tiny GPT's 64")
    parser.add_argument("--layers", type=int, default=None, help="default: the tiny GPT's 2")
    parser.add_argument("--heads", type=int, default=None, help="default: the tiny GPT's 4")
    parser.add_argument("--repeats", type=int, default=3, help="runs per loop; the median time of each step is kept")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 by default: on a shared 2-core machine more threads oversubscribe)")
    parser.add_argument("--bin", type=int, default=64, help="positions per row of the printed table")
    parser.add_argument("--csv", type=Path, default=None, help="write position, cached_ms, uncached_ms here")
    args = parser.parse_args()
    if args.new_tokens < 1 or args.prompt_len < 1:
        parser.error("--new-tokens and --prompt-len must be >= 1")

    torch.set_num_threads(args.threads)
    tiny = tiny_gpt_config()
    config = dataclasses.replace(
        tiny, context_length=args.prompt_len + args.new_tokens,
        d_model=args.d_model or tiny.d_model, n_layers=args.layers or tiny.n_layers, n_heads=args.heads or tiny.n_heads,
    )
    torch.manual_seed(0)
    model = GPT(config).eval()
    prompt = torch.randint(config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))

    print(f"GPT: {config.n_layers} layers, d_model {config.d_model}, {config.n_heads} heads, vocab {config.vocab_size}, "
          f"random weights, float32; batch 1, prompt {args.prompt_len} token(s), {args.new_tokens} new tokens, greedy")
    print(f"torch {torch.__version__}, {args.threads} thread(s), {platform.processor() or platform.machine()}; "
          f"median of {args.repeats} runs per step")
    timed_greedy(model, prompt, min(args.new_tokens, 16), True)  # warm-up
    cached_tokens, cached = median_step_times(model, prompt, args.new_tokens, True, args.repeats)
    uncached_tokens, uncached = median_step_times(model, prompt, args.new_tokens, False, args.repeats)
    positions = list(range(args.prompt_len, args.prompt_len + args.new_tokens))

    print(f"\n{'positions':>12} {'cached ms/token':>16} {'uncached ms/token':>18} {'ratio':>7}")
    for lo in range(0, args.new_tokens, args.bin):
        c = statistics.mean(cached[lo:lo + args.bin])
        u = statistics.mean(uncached[lo:lo + args.bin])
        span = f"{positions[lo]}-{positions[min(lo + args.bin, args.new_tokens) - 1]}"
        print(f"{span:>12} {1e3 * c:>16.3f} {1e3 * u:>18.3f} {u / c:>7.1f}")
    total_c, total_u = sum(cached), sum(uncached)
    print(f"{'total s':>12} {total_c:>16.3f} {total_u:>18.3f} {total_u / total_c:>7.1f}")
    print(f"same tokens with and without the cache: {cached_tokens == uncached_tokens}")

    out_c, gen_c = time_generate(model, prompt, args.new_tokens, True, args.repeats)
    out_u, gen_u = time_generate(model, prompt, args.new_tokens, False, args.repeats)
    print(f"\nllmarch.decoding.generate, {args.new_tokens} tokens: use_cache=True {gen_c:.3f} s, "
          f"use_cache=False {gen_u:.3f} s, ratio {gen_u / gen_c:.1f} (identical output: {torch.equal(out_c, out_u)})")

    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["position", "cached_ms", "uncached_ms"])
            for t, c, u in zip(positions, cached, uncached):
                writer.writerow([t, f"{1e3 * c:.4f}", f"{1e3 * u:.4f}"])
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
