"""Train short, test long: tiny GPTs with seven positional encodings, evaluated beyond their training length.

Book: Positional encodings, "Length generalisation". Regenerate the files with ``make experiments``
(this script alone takes about fifteen minutes on a 2-core CPU); ``--only ENCODING ...`` reruns some encodings
and merges them into the committed files (KERPLE's two kernels were added that way). Everything is seeded, but the runs are not
bit-for-bit reproducible: two runs on the same machine gave the same in-distribution losses to about 0.002
nats, while the losses far beyond the training length (which amplify small differences between trained
models) moved by up to 0.08 nats. The chapter's conclusions do not depend on numbers at that level.

Every model is the same pre-LN GPT (2 blocks, width 64, 4 heads) trained on windows of ``TRAIN_LENGTH``
tokens of the synthetic grammar corpus; only ``pos_encoding`` (and the initialisation seed) differs, except
that the sinusoidal model scales its token embeddings by ``sqrt(d_model)`` as Vaswani et al. do (see
``model_config``); ``sinusoidal_unscaled`` is the sinusoidal model without that factor. Each
model is then evaluated on windows of ``L`` tokens for every ``L`` in ``EVAL_LENGTHS``; the learned table
only for ``L <= TRAIN_LENGTH``, because it has no vectors for later positions.

Main protocol, ``nll_last`` (the same target tokens, with enough context, for every ``L``). The held-out
stream holds ``N_BLOCKS`` scored blocks of ``SCORED`` consecutive target tokens. For a block whose last
target is ``data[e]`` the model reads the ``L`` tokens ``data[e-L .. e-1]`` and only its last ``SCORED``
predictions count. Every ``L`` thus scores exactly the same tokens, each with at least
``L - SCORED >= TRAIN_LENGTH - SCORED`` tokens of context (enough to know the grammar state: see the
chapter), so the best achievable loss is the same for every ``L``. What changes with ``L`` is only where the
scored tokens sit in the window (positions ``L - SCORED .. L - 1``) and how many keys the attention sees.

Secondary protocol, ``nll_all`` (the usual one): the mean over *all* positions of non-overlapping windows
of ``L`` tokens covering one fixed stretch of ``ALL_SPAN`` tokens. Same tokens for every ``L`` too, but a
longer window has fewer tokens near its start, where context is short.

Writes, under ``book/data/`` next to this script's folder:

- ``length_generalisation.csv``: encoding, seed, eval_length, nll_last, nll_all, nll_last_windowed (nats per
  token; the last is ``nll_last`` with sliding-window attention of width ``TRAIN_LENGTH``, which keeps every
  attention distance and key count inside what training showed but leaves absolute positions unseen); empty
  fields where an encoding cannot be evaluated (learned, ``L > TRAIN_LENGTH``). The extra encoding
  ``t5_tied`` is the trained ``t5`` model with its never-trained buckets (those of distances
  ``>= TRAIN_LENGTH - 1``, buckets 21..31) set to the bias of bucket 20 (distances 27..30);
- ``length_generalisation_by_position.csv``: position, then ``<encoding>_<seed>`` columns: the mean NLL at
  each position of the ``max(EVAL_LENGTHS)``-token windows of the main protocol (learned: its
  ``TRAIN_LENGTH``-token windows);
- ``length_generalisation_t5_bias.csv``: layer, bucket, head_0.. : the learned T5 bias table of seed 0;
- ``length_generalisation.json``: the configuration, reference losses, training losses and run times.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import math
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from llmarch.data import StochasticGrammar, default_grammar, synthetic_corpus
from llmarch.model import GPT, GPTConfig, count_parameters
from llmarch.positional import POS_ENCODINGS, sinusoidal_encoding, t5_relative_bucket
from llmarch.train import train
from tiny_gpt import write_csv  # the sibling experiment script (this folder is on sys.path when run)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

TRAIN_LENGTH = 32
EVAL_LENGTHS = (32, 64, 128, 256, 512)
BASE_CONFIG = GPTConfig(vocab_size=36, context_length=TRAIN_LENGTH, d_model=64, n_layers=2, n_heads=4)
TRAIN_TOKENS, EVAL_TOKENS = 1_000_000, 100_000
TRAIN_SEED, EVAL_SEED, MODEL_SEEDS = 0, 1, (0, 1, 2)
STEPS, BATCH_SIZE, LR, WARMUP = 600, 32, 3e-3, 50
SCORED = 16      # scored targets per window in the main protocol (the last SCORED positions)
N_BLOCKS = 128   # windows per length: 2,048 scored target tokens
ALL_SPAN = 16_384  # tokens covered by the secondary protocol's non-overlapping windows
EVAL_BATCH = 32


# the library's encodings, KERPLE in both of its kernels, and the sinusoidal model without its sqrt(d) factor
ENCODINGS = ("none", "learned", "sinusoidal", "t5", "alibi", "rope", "kerple_log", "kerple_power",
             "sinusoidal_unscaled")
assert set(ENCODINGS) >= set(POS_ENCODINGS) - {"kerple"}


def model_config(encoding: str) -> GPTConfig:
    """The configuration of one model. The sinusoidal model scales its token embeddings by ``sqrt(d_model)``
    as Vaswani et al. (2017) do: the library initialises embeddings with standard deviation 0.02, and without
    the factor the table (amplitude 1) would swamp them. ``sinusoidal_unscaled`` is the same model without
    the factor, kept to show how much it matters."""
    if encoding == "sinusoidal_unscaled":
        return replace(BASE_CONFIG, pos_encoding="sinusoidal")
    if encoding.startswith("kerple_"):
        return replace(BASE_CONFIG, pos_encoding="kerple", kerple_variant=encoding.removeprefix("kerple_"))
    return replace(BASE_CONFIG, pos_encoding=encoding, scale_embeddings=encoding == "sinusoidal")


def block_ends() -> torch.Tensor:
    """Index of the last target of each scored block. The blocks follow each other after a prefix of
    ``max(EVAL_LENGTHS)`` tokens (so the longest window fits) and after the secondary protocol's span."""
    first = ALL_SPAN + max(EVAL_LENGTHS) + SCORED
    return first + SCORED * torch.arange(N_BLOCKS)


def true_model_nll(grammar: StochasticGrammar, ids: torch.Tensor) -> torch.Tensor:
    """``-log p(ids[t] | ids[:t])`` under the grammar itself, tracking its state from the start of the stream
    (``ids`` must be a sample that starts in ``grammar.start``); entry 0 is ``-log p(ids[0] | start)``."""
    table = {s: {w: (nxt, p) for w, nxt, p in options} for s, options in grammar.rules.items()}
    state, out = grammar.start, []
    for word in grammar.decode(ids):
        nxt, p = table[state][word]
        out.append(-math.log(p))
        state = nxt
    return torch.tensor(out, dtype=torch.float64)


@torch.no_grad()
def windowed_logits(model: GPT, idx: torch.Tensor, window: int) -> torch.Tensor:
    """``GPT.forward`` with sliding-window attention: query ``i`` sees keys ``i - window < j <= i`` only.

    Positions keep their absolute values (sinusoidal table, RoPE angles, ALiBi and T5 distances), but no
    attention layer ever sees more than ``window`` keys or a distance of ``window`` or more."""
    if model.config.pos_encoding == "learned":
        raise ValueError("learned positions cannot be evaluated beyond the training length")
    t = idx.shape[1]
    pos = torch.arange(t)
    near = (pos[:, None] - pos[None, :]) < window  # combined with the causal mask below
    h = model.tok_emb(idx)
    if model.config.scale_embeddings:
        h = h * math.sqrt(model.config.d_model)
    if model.config.pos_encoding == "sinusoidal":
        h = h + sinusoidal_encoding(t, model.config.d_model)
    for block in model.blocks:
        h = block(h, mask=near, is_causal=True)
    return model.lm_head(model.norm_f(h))


@torch.no_grad()
def token_nll(model: GPT, x: torch.Tensor, y: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Per-token NLL ``(B, T)`` in nats; with ``window``, under sliding-window attention."""
    logits = model(x) if window is None else windowed_logits(model, x, window)
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").double()


@torch.no_grad()
def evaluate_windowed(model: GPT, data: torch.Tensor, length: int) -> float:
    """``nll_last`` of the main protocol with sliding-window attention of width ``TRAIN_LENGTH``."""
    model.eval()
    ends = block_ends()
    total = 0.0
    for i in range(0, len(ends), EVAL_BATCH):
        idx = (ends[i : i + EVAL_BATCH, None] - length) + torch.arange(length)
        total += token_nll(model, data[idx], data[idx + 1], window=TRAIN_LENGTH)[:, -SCORED:].sum().item()
    return total / (len(ends) * SCORED)


@torch.no_grad()
def evaluate_length(model: GPT, data: torch.Tensor, length: int):
    """``(nll_last, nll_all, per_position)`` for windows of ``length`` tokens (see the module docstring)."""
    model.eval()
    ends = block_ends()
    offsets = torch.arange(length)
    last_sum, pos_sum = 0.0, torch.zeros(length, dtype=torch.float64)
    for i in range(0, len(ends), EVAL_BATCH):
        idx = (ends[i : i + EVAL_BATCH, None] - length) + offsets  # inputs data[e-L .. e-1]
        nll = token_nll(model, data[idx], data[idx + 1])  # targets data[e-L+1 .. e]
        last_sum += nll[:, -SCORED:].sum().item()
        pos_sum += nll.sum(dim=0)
    nll_last = last_sum / (len(ends) * SCORED)

    n_windows = ALL_SPAN // length
    x = data[: n_windows * length].view(n_windows, length)
    y = data[1 : n_windows * length + 1].view(n_windows, length)
    all_sum = sum(token_nll(model, x[j : j + EVAL_BATCH], y[j : j + EVAL_BATCH]).sum().item()
                  for j in range(0, n_windows, EVAL_BATCH))
    return nll_last, all_sum / y.numel(), pos_sum / len(ends)


def previous_results(rerun: set[str]):
    """The committed results of every run (``<encoding>_<seed>``) not in ``rerun``: (csv rows, by-position
    columns, runs)."""
    with open(DATA_DIR / "length_generalisation.csv") as f:
        rows = [tuple(r) for r in list(csv.reader(f))[1:] if f"{r[0]}_{r[1]}" not in rerun]
    with open(DATA_DIR / "length_generalisation_by_position.csv") as f:
        table = list(csv.DictReader(f))
    by_position = {c: torch.tensor([float(r[c]) for r in table if r[c]], dtype=torch.float64)
                   for c in table[0] if c != "position" and c not in rerun}
    runs = json.loads((DATA_DIR / "length_generalisation.json").read_text())["runs"]
    return rows, by_position, {k: v for k, v in runs.items() if k not in rerun}


def main(only: tuple[str, ...] = (), seeds: tuple[int, ...] = MODEL_SEEDS) -> None:
    """Train and evaluate every encoding; with ``only`` (and ``seeds``), just those runs, merged into the
    existing result files under a lock, so that several such reruns can run side by side."""
    encodings = only or ENCODINGS
    start, cpu_start = time.perf_counter(), time.process_time()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    grammar = default_grammar()
    train_data = synthetic_corpus(TRAIN_TOKENS, seed=TRAIN_SEED, grammar=grammar)
    eval_data = synthetic_corpus(EVAL_TOKENS, seed=EVAL_SEED, grammar=grammar)
    assert int(block_ends()[-1]) < len(eval_data)
    with torch.no_grad():  # the windowed forward pass is GPT.forward when the window covers everything
        for encoding in (e for e in ENCODINGS if e != "learned"):
            probe = GPT(model_config(encoding)).eval()
            x = eval_data[:40][None]
            assert torch.allclose(windowed_logits(probe, x, 40), probe(x), atol=1e-5), encoding

    # the loss of the grammar itself on exactly the scored tokens: the floor for every model
    reference = true_model_nll(grammar, eval_data)  # reference[t] scores eval_data[t]
    scored = (block_ends()[:, None] - torch.arange(SCORED)).flatten()
    floor_last = reference[scored].mean().item()
    floor_all = reference[1 : ALL_SPAN + 1].mean().item()

    rows, by_position, t5_rows, runs = [], {}, [], {}
    for seed in seeds:
        for encoding in encodings:
            t0 = time.perf_counter()
            torch.manual_seed(seed)
            model = GPT(model_config(encoding))
            result = train(model, train_data, steps=STEPS, context_length=TRAIN_LENGTH, batch_size=BATCH_SIZE,
                           lr=LR, warmup=WARMUP, eval_every=100, seed=TRAIN_SEED + seed)
            t1 = time.perf_counter()
            for length in EVAL_LENGTHS:
                if encoding == "learned" and length > TRAIN_LENGTH:
                    rows.append((encoding, seed, length, "", "", ""))  # no position vectors beyond TRAIN_LENGTH
                    continue
                nll_last, nll_all, per_position = evaluate_length(model, eval_data, length)
                windowed = nll_last if length == TRAIN_LENGTH else evaluate_windowed(model, eval_data, length)
                rows.append((encoding, seed, length, f"{nll_last:.5f}", f"{nll_all:.5f}", f"{windowed:.5f}"))
                if length == max(EVAL_LENGTHS) or (encoding == "learned" and length == TRAIN_LENGTH):
                    by_position[f"{encoding}_{seed}"] = per_position
            if encoding == "t5":
                if seed == MODEL_SEEDS[0]:
                    for layer, block in enumerate(model.blocks):
                        table = block.attn.relative_bias.embedding.weight.detach()  # (buckets, heads)
                        t5_rows += [(layer, b, *(f"{w:.5f}" for w in table[b].tolist())) for b in range(len(table))]
                # Diagnosis: training windows never contain distances >= TRAIN_LENGTH, so the buckets above the
                # one of distance TRAIN_LENGTH - 2 (bucket 20: distances 27..30) keep their initial values. Tie
                # them to bucket 20 (as if every longer distance were clipped to it) and evaluate again.
                last = int(t5_relative_bucket(torch.tensor(-(TRAIN_LENGTH - 2)), bidirectional=False))
                with torch.no_grad():
                    for block in model.blocks:
                        weight = block.attn.relative_bias.embedding.weight
                        weight[last + 1 :] = weight[last]
                for length in EVAL_LENGTHS:
                    nll_last, nll_all, per_position = evaluate_length(model, eval_data, length)
                    rows.append(("t5_tied", seed, length, f"{nll_last:.5f}", f"{nll_all:.5f}", ""))
                by_position[f"t5_tied_{seed}"] = per_position
            runs[f"{encoding}_{seed}"] = {
                "n_parameters": count_parameters(model),
                "train_loss_last_100_steps": round(result.train_loss[-1], 5),
                "train_seconds": round(t1 - t0, 1),
                "eval_seconds": round(time.perf_counter() - t1, 1),
            }
            print(f"{encoding:10s} seed {seed}  "
                  + "  ".join(f"L={r[2]}: {r[3] or '-'}" for r in rows if r[1] == seed and r[0].startswith(encoding))
                  + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)

    lock = open(Path(tempfile.gettempdir()) / "llmarch-length-generalisation.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the process ends
    if only:  # merge: the other runs keep their committed results
        rerun = {f"{e}_{s}" for e in (*only, *(["t5_tied"] if "t5" in only else [])) for s in seeds}
        old_rows, old_by_position, old_runs = previous_results(rerun)
        rows, by_position, runs = old_rows + rows, {**old_by_position, **by_position}, {**old_runs, **runs}
    write_csv(DATA_DIR / "length_generalisation.csv", ["encoding", "seed", "eval_length", "nll_last", "nll_all",
                                                            "nll_last_windowed"], rows)
    columns = list(by_position)
    write_csv(
        DATA_DIR / "length_generalisation_by_position.csv",
        ["position", *columns],
        [[t] + [f"{by_position[c][t]:.5f}" if t < len(by_position[c]) else "" for c in columns]
         for t in range(max(EVAL_LENGTHS))],
    )
    if "t5" in encodings:
        write_csv(DATA_DIR / "length_generalisation_t5_bias.csv",
                  ["layer", "bucket", *(f"head_{h}" for h in range(BASE_CONFIG.n_heads))], t5_rows)
    summary = {
        "config": asdict(BASE_CONFIG),
        "train_length": TRAIN_LENGTH,
        "eval_lengths": list(EVAL_LENGTHS),
        "steps": STEPS,
        "batch_size": BATCH_SIZE,
        "lr": LR,
        "warmup": WARMUP,
        "train_tokens_in_corpus": TRAIN_TOKENS,
        "eval_tokens_in_corpus": EVAL_TOKENS,
        "seeds": {"train_data": TRAIN_SEED, "eval_data": EVAL_SEED, "models": list(MODEL_SEEDS)},
        "scored_per_window": SCORED,
        "n_blocks": N_BLOCKS,
        "all_span": ALL_SPAN,
        "entropy_rate": grammar.entropy_rate(),
        "true_model_nll_last": floor_last,
        "true_model_nll_all": floor_all,
        "runs": runs,
        "total_seconds": round(time.perf_counter() - start, 1),
        "total_cpu_seconds": round(time.process_time() - cpu_start, 1),
        "last_run": {"encodings": list(encodings), "seeds": list(seeds)},
    }
    (DATA_DIR / "length_generalisation.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done in {time.perf_counter() - start:.0f} s; results in {DATA_DIR}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=ENCODINGS, default=(),
                        help="rerun only these encodings and merge them into the committed results")
    parser.add_argument("--seeds", nargs="+", type=int, default=MODEL_SEEDS, help="with --only: these seeds")
    args = parser.parse_args()
    main(tuple(args.only), tuple(args.seeds))
