"""Keys held and bytes of the KV cache after N generated tokens: Mistral's rolling cache against the full cache.

    python benchmarks/bench_rolling_cache.py [--window 64] [--sinks 4] [--tokens 256 1024]

A small Mistral-style model (``llama_config("mistral-7b", ...)`` at d_model 64, 2 layers, 4 heads, 2 key/value
heads, random weights, float32) with ``sliding_window=--window`` and ``attention_sinks=--sinks`` decodes greedily
from a 4-token prompt, once with its rolling cache (``model.new_kv_cache()``, what ``generate`` uses) and once with
a cache that keeps every key (``KVCache(n_layers)``, the window then only a mask). Per N, it prints the keys each
layer holds and the bytes of both caches (``KVCache.nbytes``), and whether both loops produced the same tokens
(they must: the rolling cache drops only keys the mask hides). Nothing is timed; no assertions.
"""

from __future__ import annotations

import argparse

import torch

from llmarch.kv_cache import KVCache
from llmarch.model import GPT, llama_config


@torch.no_grad()
def decode(model: GPT, prompt: torch.Tensor, n_tokens: int, cache: KVCache) -> list[int]:
    """Greedy decoding with ``cache`` until the cache has seen ``n_tokens`` tokens; returns the tokens."""
    seq, step = prompt[0].tolist(), prompt
    while cache.length < n_tokens:
        token = int(model(step, kv_cache=cache)[0, -1].argmax())
        seq.append(token)
        step = torch.tensor([[token]])
    return seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    args = parser.parse_args()
    torch.manual_seed(0)
    config = llama_config("mistral-7b", vocab_size=100, context_length=max(args.tokens), d_model=64, n_layers=2,
                          n_heads=4, n_kv_heads=2, d_ff=128, sliding_window=args.window,
                          attention_sinks=args.sinks)
    model = GPT(config).eval()
    prompt = torch.randint(0, 100, (1, 4), generator=torch.Generator().manual_seed(0))
    for n in args.tokens:
        rolling, full = model.new_kv_cache(), KVCache(config.n_layers)
        same = decode(model, prompt, n, rolling) == decode(model, prompt, n, full)
        print(f"after {rolling.length} tokens (window {args.window}, {args.sinks} sinks): rolling cache holds "
              f"{rolling.held} keys per layer, {rolling.nbytes()} bytes; full cache {full.held} keys, "
              f"{full.nbytes()} bytes ({full.nbytes() / rolling.nbytes():.1f}x); same tokens: {same}")


if __name__ == "__main__":
    main()
