"""Pretraining data: why duplicates hurt (memorisation in the tiny GPT), and the waterfall of the course's pipeline.

Book: Pretraining data, "Why duplicates hurt" and "The waterfall". Regenerate the files with ``make experiments``
(one thread; about 6 CPU-minutes, nearly all of it training; ``--only waterfall`` reruns part 2 alone in seconds).
Everything is seeded; as for the other experiments, a rerun on another CPU may differ in the last digits.

Part 1, memorisation. A corpus of ``BASE_TOKENS`` tokens of the course's grammar gets planted sequences:
``SEQS_PER_GROUP`` sequences of ``SEQ_LEN`` grammar tokens (sampled with their own seeds, so none occurs in the
base text), each inserted ``k`` times at random sentence boundaries, for ``k`` in ``COPIES``. The
*deduplicated* corpus is the same corpus after exact deduplication: every planted sequence once. The tiny GPT
(``tiny_gpt_config()``) is trained on each corpus for the same ``STEPS`` steps (equal compute), three seeds
(the seed draws the planted sequences, the base text, the initialisation and the batches). Each model is then
scored on

- the exact continuation rate: greedy decoding of ``SEQ_LEN - PREFIX`` tokens from the first ``PREFIX`` tokens
  of a planted sequence reproduces the rest exactly (the extraction test of Carlini et al., 2021/2023);
- the continuation loss: mean NLL (nats per token) of those same tokens given everything before them;
- the same two numbers for ``FRESH`` *fresh* sequences drawn the same way but never trained on;
- the held-out loss on ``EVAL_TOKENS`` tokens of fresh grammar text (the quality of the model as a
  language model, what duplicates cost at equal compute).

Part 2, the waterfall. ``write_synthetic_crawl`` writes a crawl of ``CRAWL_PAGES`` pages in ``CRAWL_FILES`` WARC
files (seed ``CRAWL_SEED``) and its hidden ``labels.jsonl``; the course's pipeline runs on the WARC files
(``python -m llmarch.webdata run WARC... --out DIR``, default settings) and its ``stats.json`` is the waterfall.
``kept.jsonl`` and ``removed.jsonl`` are then scored against the labels: for each stage (the three quality
stages also together), precision and recall of its removals among the pages that reached it, the pages it
was meant to remove being those whose label says so (``STAGE_TARGETS``); the pairing of each removed duplicate
with its original; the redaction of the labelled personal information in the kept pages; the removal of the
shared passages (licence, quotation) from the kept pages; and the whole pipeline's kept pages against the
clean originals, and which clean pages were lost (by the ``traits`` the generator gives the pages that rules are
known to remove wrongly).

Writes, under ``book/data/`` next to this script's folder:

- ``pretraining_data_memorisation.csv``: corpus (duplicated/deduplicated), seed, group (copies in the
  duplicated corpus, one of ``COPIES``, or ``fresh``), n_sequences, exact_rate, continuation_nll;
- ``pretraining_data_heldout.csv``: corpus, seed, train_tokens, heldout_loss, train_seconds;
- ``pretraining_data_stats.json``: the pipeline's ``stats.json`` (paths relative to the crawl's folder);
- ``pretraining_data_filters.csv``: stage, target (the label kinds it should remove), reached (target pages
  that reached the stage), removed, true_positives, precision, recall, clean_removed (clean original pages
  it removed: the data lost);
- ``pretraining_data_outcomes.csv``: kind, variant, pages, and the number removed by each stage or kept;
- ``pretraining_data.json``: per part, the settings (the grammar's entropy rate; the crawl's counts), the
  duplicate pairing, PII and shared-passage scores, and the CPU seconds (the pipeline subprocess included).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.decoding import gpt_next_logprobs, greedy_decode
from llmarch.model import GPT, tiny_gpt_config
from llmarch.train import evaluate, train
from llmarch.webdata.crawl import read_labels, write_synthetic_crawl
from llmarch.webdata.crawl_text import LICENCE_PASSAGE, QUOTED_PASSAGE
from llmarch.webdata.minhash import jaccard, shingles
from llmarch.webdata.pii import PII_PLACEHOLDERS
from llmarch.webdata.pipeline import STAGES
from tiny_gpt import write_csv  # sibling script (this folder is on sys.path when run)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

BASE_TOKENS, EVAL_TOKENS = 640_000, 32_769
SEQ_LEN, PREFIX = 64, 32
# 4 sequences per group: 4 * 64 * 1441 = 368,896 planted tokens, 37% of the duplicated corpus
COPIES, SEQS_PER_GROUP, FRESH = (1, 10, 30, 100, 300, 1000), 4, 16
SEEDS = (0, 1, 2)
STEPS, BATCH_SIZE, LR, WARMUP = 1500, 32, 3e-3, 50

CRAWL_PAGES, CRAWL_FILES, CRAWL_SEED = 1000, 4, 0
QUALITY_STAGES = ("gopher_repetition", "gopher_quality", "c4")
# what each stage (or group of stages) is meant to remove, by the crawl's hidden page kinds
STAGE_TARGETS = {
    "extract": ("http-error", "non-html", "empty"),
    "language": ("foreign",),
    **{stage: ("spam", "low-quality") for stage in QUALITY_STAGES},
    "quality (all three)": ("spam", "low-quality"),
    "exact_dedup": ("exact-duplicate",),
    "near_dedup": ("near-duplicate",),
}
SHARED_PASSAGES = {"licence": LICENCE_PASSAGE, "quote": QUOTED_PASSAGE}


def grammar_sequences(n: int, seed: int) -> list[torch.Tensor]:
    """``n`` distinct sequences of ``SEQ_LEN`` tokens, each sampled from the grammar's start state with its own
    seed (drawn from ``seed``), so they are grammatical text that the base corpus contains only by chance."""
    grammar = default_grammar()
    seeds = np.random.default_rng(seed).choice(10**9, size=n, replace=False) + 10**6
    sequences = [grammar.encode(grammar.sample(SEQ_LEN, seed=int(s))) for s in seeds]
    if len({tuple(s.tolist()) for s in sequences}) != n:
        raise RuntimeError("two planted sequences coincide; choose another seed")
    return sequences


def planted_corpus(base: torch.Tensor, planted: dict[int, list[torch.Tensor]], seed: int,
                   deduplicated: bool) -> torch.Tensor:
    """``base`` with each sequence of ``planted[k]`` inserted ``k`` times (once if ``deduplicated``) after
    randomly chosen sentence ends (``.`` tokens) of the base text."""
    period = default_grammar().encode(["."])[0]
    copies = [seq for k, seqs in planted.items() for seq in seqs for _ in range(1 if deduplicated else k)]
    rng = np.random.default_rng(seed)
    ends = torch.nonzero(base == period).flatten().numpy() + 1
    cuts = np.sort(rng.choice(ends, size=len(copies), replace=False))
    order = rng.permutation(len(copies))
    pieces, start = [], 0
    for cut, i in zip(cuts, order):
        pieces += [base[start:cut], copies[i]]
        start = cut
    pieces.append(base[start:])
    return torch.cat(pieces)


@torch.no_grad()
def continuation_scores(model: GPT, sequences: list[torch.Tensor]) -> tuple[float, float]:
    """(exact continuation rate under greedy decoding from the ``PREFIX``-token prefix, mean NLL per token of
    the last ``SEQ_LEN - PREFIX`` tokens given all tokens before them)."""
    model.eval()
    next_logprobs = gpt_next_logprobs(model)
    exact = 0
    for seq in sequences:
        out = greedy_decode(next_logprobs, seq[:PREFIX].tolist(), SEQ_LEN - PREFIX)
        exact += out[PREFIX:] == seq[PREFIX:].tolist()
    batch = torch.stack(sequences)
    logprobs = torch.log_softmax(model(batch[:, :-1]).double(), dim=-1)
    nll = -logprobs.gather(-1, batch[:, 1:, None])[:, PREFIX - 1:, 0]
    return exact / len(sequences), float(nll.mean())


def memorisation() -> tuple[list, list, dict]:
    grammar = default_grammar()
    config = tiny_gpt_config()
    rows, heldout_rows, seconds = [], [], {}
    for seed in SEEDS:
        sequences = grammar_sequences(SEQS_PER_GROUP * len(COPIES) + FRESH, seed=1000 + seed)
        planted = {k: sequences[i * SEQS_PER_GROUP:(i + 1) * SEQS_PER_GROUP] for i, k in enumerate(COPIES)}
        fresh = sequences[len(COPIES) * SEQS_PER_GROUP:]
        base = synthetic_corpus(BASE_TOKENS, seed=seed, grammar=grammar)
        heldout = synthetic_corpus(EVAL_TOKENS, seed=100 + seed, grammar=grammar)
        for name, deduplicated in (("duplicated", False), ("deduplicated", True)):
            corpus = planted_corpus(base, planted, seed=seed, deduplicated=deduplicated)
            t0 = time.process_time()
            torch.manual_seed(seed)
            model = GPT(config)
            train(model, corpus, steps=STEPS, context_length=config.context_length, batch_size=BATCH_SIZE, lr=LR,
                  warmup=WARMUP, eval_every=STEPS, seed=seed)
            seconds[f"{name}_{seed}"] = round(time.process_time() - t0, 1)
            loss = evaluate(model, heldout, config.context_length)
            heldout_rows.append((name, seed, len(corpus), f"{loss:.5f}", seconds[f"{name}_{seed}"]))
            groups = [(str(k), planted[k]) for k in COPIES] + [("fresh", fresh)]
            for group, seqs in groups:
                exact, nll = continuation_scores(model, seqs)
                rows.append((name, seed, group, len(seqs), f"{exact:.4f}", f"{nll:.5f}"))
            print(f"{name:12s} seed {seed}: held-out {loss:.4f}; "
                  + "  ".join(f"{r[2]}: exact {r[4]} nll {r[5]}" for r in rows[-len(groups):]), flush=True)
    settings = {"base_tokens": BASE_TOKENS, "eval_tokens": EVAL_TOKENS, "seq_len": SEQ_LEN, "prefix": PREFIX,
                "copies": list(COPIES), "seqs_per_group": SEQS_PER_GROUP, "fresh_sequences": FRESH,
                "seeds": list(SEEDS), "steps": STEPS, "batch_size": BATCH_SIZE, "lr": LR, "warmup": WARMUP,
                "context_length": config.context_length, "entropy_rate": grammar.entropy_rate(),
                "train_cpu_seconds": seconds}
    return rows, heldout_rows, settings


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def stage_scores(labels: list[dict], removed_by: dict[str, str]) -> list[tuple]:
    """Precision and recall of each stage's removals against the labels (see the module docstring)."""
    position = {stage: i for i, stage in enumerate(STAGES)}
    rows = []
    for name, target in STAGE_TARGETS.items():
        stages = QUALITY_STAGES if name == "quality (all three)" else (name,)
        first = min(position[s] for s in stages)
        reached = [lab for lab in labels if lab["id"] not in removed_by or position[removed_by[lab["id"]]] >= first]
        removed = [lab for lab in reached if removed_by.get(lab["id"]) in stages]
        positives = [lab for lab in reached if lab["kind"] in target]
        true_positives = sum(lab["kind"] in target for lab in removed)
        precision = true_positives / len(removed) if removed else 1.0
        recall = true_positives / len(positives) if positives else 1.0
        clean_removed = sum(lab["kind"] == "clean" for lab in removed)
        rows.append((name, "+".join(target), len(positives), len(removed), true_positives, f"{precision:.4f}",
                     f"{recall:.4f}", clean_removed))
    return rows


def cpu_seconds() -> float:
    """CPU time of this process and of the subprocesses it waited for (the pipeline command)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_pipeline_command(warc_files: list[Path], out: Path) -> None:
    """The course's pipeline as a user runs it: ``python -m llmarch.webdata run WARC... --out DIR``."""
    subprocess.run([sys.executable, "-m", "llmarch.webdata", "run", *map(str, warc_files), "--out", str(out)],
                   check=True)


def waterfall() -> tuple[dict, list, list, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        crawl = write_synthetic_crawl(Path(tmp) / "crawl", n_pages=CRAWL_PAGES, seed=CRAWL_SEED, n_files=CRAWL_FILES)
        out = Path(tmp) / "out"
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        run_pipeline_command(crawl.warc_files, out)
        pipeline_seconds, pipeline_cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        stats = json.loads((out / "stats.json").read_text())
        kept, removed = read_jsonl(out / "kept.jsonl"), read_jsonl(out / "removed.jsonl")
        labels = read_labels(crawl.labels)
    removed_by = {r["id"]: r["stage"] for r in removed}
    rows = stage_scores(labels, removed_by)

    outcomes = Counter((lab["kind"], lab["variant"] or "", removed_by.get(lab["id"], "kept")) for lab in labels)
    kinds = sorted({(kind, variant) for kind, variant, _ in outcomes})
    outcome_rows = [(kind, variant, sum(n for (k, v, _), n in outcomes.items() if (k, v) == (kind, variant)),
                     *[outcomes[(kind, variant, stage)] for stage in (*STAGES, "kept")]) for kind, variant in kinds]

    label_of = {lab["id"]: lab for lab in labels}
    duplicates = [r for r in removed if r["stage"] in ("exact_dedup", "near_dedup")]
    paired = sum(r["duplicate_of"] == label_of[r["id"]]["duplicate_of"] for r in duplicates)
    kept_text = {k["id"]: k["text"] for k in kept}
    pii = {kind: Counter() for kind in PII_PLACEHOLDERS}
    for doc_id, text in kept_text.items():
        truth = Counter(item["kind"] for item in label_of[doc_id]["pii"])
        for item in label_of[doc_id]["pii"]:
            pii[item["kind"]]["redacted" if item["value"] not in text else "missed"] += 1
        for kind, placeholder in PII_PLACEHOLDERS.items():
            pii[kind]["extra_placeholders"] += max(0, text.count(placeholder) - truth[kind])
    passages = Counter()
    for doc_id, text in kept_text.items():
        for name in label_of[doc_id]["shared_passages"]:
            passages[f"{name}_removed" if SHARED_PASSAGES[name] not in text else f"{name}_left"] += 1
    clean = {lab["id"] for lab in labels if lab["kind"] == "clean"}
    clean_removed = Counter(f"{removed_by[lab['id']]}: {'+'.join(lab['traits']) or 'no trait'}" for lab in labels
                            if lab["id"] in clean and lab["id"] in removed_by)
    missed_near = [round(jaccard(shingles(kept_text[lab["id"]]), shingles(kept_text[lab["duplicate_of"]])), 3)
                   for lab in labels if lab["kind"] == "near-duplicate" and lab["id"] in kept_text
                   and lab["duplicate_of"] in kept_text]
    summary = {
        "pages": CRAWL_PAGES, "files": CRAWL_FILES, "seed": CRAWL_SEED, "counts": crawl.counts,
        "kept": len(kept), "kept_clean": len(clean & set(kept_text)), "clean": len(clean),
        "clean_removed_by_stage_and_trait": dict(sorted(clean_removed.items())),
        "duplicates_removed": len(duplicates), "duplicates_paired_with_their_original": paired,
        "kept_near_duplicates_jaccard_with_original": missed_near,
        "pii_in_kept_pages": {kind: dict(c) for kind, c in pii.items()},
        "shared_passages_in_kept_pages": dict(passages),
        "pipeline_wall_seconds": round(pipeline_seconds, 1), "pipeline_cpu_seconds": round(pipeline_cpu, 1),
    }
    for entry in stats["inputs"]:
        entry["source"] = Path(entry["source"]).name
    return stats, rows, outcome_rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("memorisation", "waterfall"),
                        help="rerun one part and keep the other part's results (default: both)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    summary_path = DATA_DIR / "pretraining_data.json"
    summary = json.loads(summary_path.read_text()) if args.only and summary_path.exists() else {}
    if args.only != "waterfall":
        start = cpu_seconds()
        rows, heldout_rows, summary["memorisation"] = memorisation()
        write_csv(DATA_DIR / "pretraining_data_memorisation.csv",
                  ["corpus", "seed", "group", "n_sequences", "exact_rate", "continuation_nll"], rows)
        write_csv(DATA_DIR / "pretraining_data_heldout.csv",
                  ["corpus", "seed", "train_tokens", "heldout_loss", "train_cpu_seconds"], heldout_rows)
        summary["memorisation"]["cpu_seconds"] = round(cpu_seconds() - start, 1)
    if args.only != "memorisation":
        start = cpu_seconds()
        stats, filter_rows, outcome_rows, summary["waterfall"] = waterfall()
        (DATA_DIR / "pretraining_data_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        write_csv(DATA_DIR / "pretraining_data_filters.csv",
                  ["stage", "target", "reached", "removed", "true_positives", "precision", "recall", "clean_removed"],
                  filter_rows)
        write_csv(DATA_DIR / "pretraining_data_outcomes.csv", ["kind", "variant", "pages", *STAGES, "kept"],
                  outcome_rows)
        summary["waterfall"]["cpu_seconds"] = round(cpu_seconds() - start, 1)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"done; results in {DATA_DIR}")


if __name__ == "__main__":
    main()
