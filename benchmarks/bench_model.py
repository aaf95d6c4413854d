"""A whole llmarch model against transformers with identical weights: prefill, one training step, greedy decoding.

    python benchmarks/bench_model.py [--device cpu|cuda] [--dtype fp32|bf16] [--backend sdpa]
                                     [--reps 3] [--csv PATH]

Two decoder shapes, each built as a transformers model with random weights (seed 0) and loaded into llmarch with
``llmarch.model.load_hf_state_dict`` (so both hold the same tensors), llmarch switched to ``--backend`` with
``set_attention_backend`` (default ``sdpa``; ``reference`` shows what the fast path gains), transformers with
``attn_implementation="sdpa"``:

- ``gpt2``: ``GPT2LMHeadModel`` (learned positions, LayerNorm, GELU MLP, tied head);
- ``llama``: ``LlamaForCausalLM`` (RoPE, RMSNorm, SwiGLU, grouped-query attention with 4x fewer key/value heads).

Sizes. ``--device cpu`` (the default): small models (d_model 256, 4 layers; about 5M parameters) and small
cases, about a minute on 2 cores. ``--device cuda``: the GPT-2 shape of the H100 measurement of issue 23
(d_model 2048, 16 layers, 32 heads: 880M parameters) and a Llama shape of about 1.1B parameters (d_model 2048,
16 layers, 32 heads, 8 key/value heads, d_ff 8192, vocabulary 32000), in ``--dtype`` (default bf16 on CUDA);
about two minutes on one H100.

Cases (``B`` rows of ``T`` tokens): prefill (a forward pass under ``no_grad``) at several ``(B, T)``; a
training step (forward, cross-entropy of the next token, backward, an SGD step, gradients set to None);
greedy decoding of ``new`` tokens after a prompt of ``T`` tokens (llmarch ``decoding.generate(greedy=True)``
with its KV cache; transformers ``generate(do_sample=False)`` with its cache, no end-of-sequence token), which
also reports whether both produced the same tokens.

Measurement: each case runs once (warm-up), then ``--reps`` times; the time is the median. Peak memory: on
CUDA ``torch.cuda.max_memory_allocated`` (reset before each case) minus what was allocated before it; on
Linux CPUs the peak resident set size (``VmHWM`` of ``/proc/self/status``, reset by writing 5 to
``/proc/self/clear_refs``) minus the resident size before the case, with glibc told to give every block over
128 KiB back to the system when it is freed (``mallopt(M_MMAP_THRESHOLD)``; otherwise memory freed by an
earlier run stays resident and the next run's peak reads 0); blank where neither is available. On CPU the
script runs torch on ``--threads`` threads (default 1: steadier timings on a shared machine).
Ratios are llmarch over transformers: time (below 1: llmarch is faster), memory, and for decoding tokens per
second (above 1: llmarch is faster). Nothing is asserted; ``--csv`` writes one row per (model, case) naming the
device, the versions and the date.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from llmarch.attention import set_attention_backend  # noqa: E402
from llmarch.decoding import generate  # noqa: E402
from llmarch.efficient import MODEL_BACKENDS  # noqa: E402
from llmarch.model import load_hf_state_dict  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPES = {  # device -> model -> (d_model, layers, heads, kv heads, d_ff, vocabulary)
    "cpu": {"gpt2": (256, 4, 4, 4, 1024, 2048), "llama": (256, 4, 8, 2, 704, 2048)},
    "cuda": {"gpt2": (2048, 16, 32, 32, 8192, 50257), "llama": (2048, 16, 32, 8, 8192, 32000)},
}
CASES = {  # device -> [(kind, batch, length, new tokens)]
    "cpu": [("prefill", 4, 128, 0), ("prefill", 2, 512, 0), ("train", 4, 128, 0), ("decode", 4, 32, 32)],
    "cuda": [("prefill", 8, 512, 0), ("prefill", 8, 2048, 0), ("prefill", 2, 4096, 0), ("train", 4, 2048, 0),
             ("decode", 8, 512, 128)],
}


def build_pair(model: str, device: str, dtype: torch.dtype, backend: str):
    """The transformers model and llmarch's copy of its weights, both in eval mode on ``device``."""
    import transformers

    d, layers, heads, kv_heads, d_ff, vocab = SHAPES[device][model]
    context = 4096 + 256
    if model == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=context, n_embd=d, n_layer=layers,
                                         n_head=heads, n_inner=d_ff, eos_token_id=None, bos_token_id=None)
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=d_ff,
                                          num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=kv_heads, max_position_embeddings=context,
                                          eos_token_id=None, bos_token_id=None, pad_token_id=None)
        cls = transformers.LlamaForCausalLM
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        hf = cls(config).to(dtype).eval()
    ours = load_hf_state_dict(hf.state_dict(), hf.config).to(device).eval()
    return hf, set_attention_backend(ours, backend)


class PeakMemory:
    """Peak memory of a block of code, in bytes above what was in use when it started (None if unknown)."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = _rss("VmRSS")
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.start = None
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            high = _rss("VmHWM")
            self.peak = None if self.start is None or high is None else max(high - self.start, 0)


def _release_freed_memory() -> None:
    """glibc: serve (and unmap on free) every allocation over 128 KiB with mmap, so that RSS follows live memory."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # -3 is M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _rss(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fn, device: str, reps: int) -> tuple[float, int | None, object]:
    """(median seconds, peak bytes of one run, the last result) of ``fn()`` after one warm-up run."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    with PeakMemory(device) as memory:
        fn()
    return statistics.median(times), memory.peak, result


def case_functions(kind: str, hf, ours, ids: torch.Tensor, new: int):
    """``{"llmarch": fn, "transformers": fn}`` for one case."""
    if kind == "prefill":
        def run_ours():
            with torch.no_grad():
                return ours(ids)

        def run_hf():
            with torch.no_grad():
                return hf(ids).logits

        return {"llmarch": run_ours, "transformers": run_hf}
    if kind == "train":
        def step(model, logits_of):
            model.train()
            logits = logits_of(ids)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(1e-6 * p.grad)  # an SGD step (tiny: the weights barely move between runs)
                        p.grad = None
            model.eval()
            return loss.detach()

        return {"llmarch": lambda: step(ours, ours), "transformers": lambda: step(hf, lambda x: hf(x).logits)}
    return {"llmarch": lambda: generate(ours, ids, new, greedy=True),
            "transformers": lambda: hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                                pad_token_id=0)}


def run(args) -> list[dict]:
    import transformers

    device, dtype = args.device, DTYPES[args.dtype]
    rows = []
    for model in ("gpt2", "llama"):
        hf, ours = build_pair(model, device, dtype, args.backend)
        vocab = SHAPES[device][model][5]
        params = sum(p.numel() for p in ours.parameters())
        for kind, batch, length, new in CASES[device]:
            ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
            results = {}
            for impl, fn in case_functions(kind, hf, ours, ids, new).items():
                results[impl] = measure(fn, device, args.reps)
            (t_ours, m_ours, out_ours), (t_hf, m_hf, out_hf) = results["llmarch"], results["transformers"]
            row = dict(model=model, params=params, case=kind, batch=batch, length=length, new_tokens=new,
                       llmarch_ms=1e3 * t_ours, transformers_ms=1e3 * t_hf, time_ratio=t_ours / t_hf,
                       llmarch_peak_mib=_mib(m_ours), transformers_peak_mib=_mib(m_hf),
                       memory_ratio=(m_ours / m_hf) if m_ours and m_hf else None, tokens_per_s_ratio=None,
                       same_tokens=None)
            if kind == "decode":
                row["tokens_per_s_ratio"] = t_hf / t_ours
                row["same_tokens"] = bool(torch.equal(out_ours.cpu(), out_hf.cpu()))
            rows.append(row)
            print(_format(row), flush=True)
        del hf, ours
        if device == "cuda":
            torch.cuda.empty_cache()
    stamp = dict(device=_device_name(device), dtype=args.dtype, backend=args.backend, torch=torch.__version__,
                 transformers=transformers.__version__, date=datetime.date.today().isoformat())
    return [{**row, **stamp} for row in rows]


def _mib(n):
    return None if n is None else n / 2**20


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def _format(row: dict) -> str:
    case = f"{row['model']:5s} {row['case']:7s} B {row['batch']:2d} T {row['length']:5d}"
    if row["case"] == "decode":
        case += f" +{row['new_tokens']}"
    mem = "" if row["memory_ratio"] is None else (
        f"  peak {row['llmarch_peak_mib']:8.1f} / {row['transformers_peak_mib']:8.1f} MiB"
        f" = {row['memory_ratio']:.2f}x")
    text = (f"{case:32s} llmarch {row['llmarch_ms']:9.1f} ms  transformers {row['transformers_ms']:9.1f} ms"
            f"  time ratio {row['time_ratio']:.2f}{mem}")
    if row["case"] == "decode":
        text += f"  tokens/s ratio {row['tokens_per_s_ratio']:.2f}, same tokens: {row['same_tokens']}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--backend", choices=MODEL_BACKENDS, default="sdpa")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_model: --device cuda but torch sees no CUDA GPU; skipped")
        return 0
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        _release_freed_memory()
    rows = run(args)
    print("ratios are llmarch / transformers (time, memory) and transformers / llmarch time (tokens/s)")
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
