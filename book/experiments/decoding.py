"""Degeneration and diversity of decoding methods on the tiny GPT, measured against the grammar it learned.

Book: Decoding, section "Degeneration". Regenerate with ``make experiments`` or

    python book/experiments/decoding.py

(about two minutes on a 2-core CPU; everything is seeded). Writes ``book/data/decoding_methods.csv``, one row
per decoding method, with these columns:

- ``method``: the decoding method and its parameters; ``grammar`` is the reference, continuations sampled from
  the synthetic grammar itself (what "human text" is for a real language model);
- ``texts``: how many continuations were generated (``PROMPTS`` prompts, ``SAMPLES`` samples each for the
  stochastic methods);
- ``rep4``: the fraction of repeated 4-grams in a continuation, ``1 - unique 4-grams / 4-grams`` (Welleck et
  al.'s seq-rep-4), averaged over continuations;
- ``distinct_sentences``: complete sentences that differ / complete sentences, pooled over ``PROMPTS``
  continuations, one per prompt, for *every* method (the fraction falls as the pool grows, so pools of equal
  size are needed to compare methods); for the sampling methods it is the mean over the ``SAMPLES``
  disjoint pools (sample ``s`` of every prompt), and ``distinct_min``, ``distinct_max`` give their range
  (deterministic methods have a single pool: min = max);
- ``rep4_lo, rep4_hi``, ``grammatical_lo, grammatical_hi``, ``nll_grammar_lo, nll_grammar_hi``: 95 %
  percentile bootstrap intervals, resampling the ``PROMPTS`` prompts (each with all its continuations)
  ``BOOTSTRAP`` times;
- ``grammatical``: the fraction of complete sentences the grammar accepts;
- ``nll_grammar``: the mean negative log-probability per token *under the grammar* (the true distribution),
  over the tokens of grammatical sentences; the entropy rate is its expected value for text from the grammar;
- ``nll_model``: the mean negative log-probability per token under the tiny GPT itself;
- ``example``: the first prompt followed by its (first) continuation.

Each prompt is a full stop followed by the first two words of a sentence sampled from the grammar (evaluation
seed 1); continuations have ``NEW_TOKENS`` tokens, so prompt and continuation fit the 64-token context.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch

from llmarch.data import StochasticGrammar, default_grammar
from llmarch.decoding import (beam_search, contrastive_search, generate, gpt_hidden_states, gpt_next_logprobs,
                              greedy_decode)
from llmarch.model import load_tiny_gpt

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
PROMPTS, SAMPLES, NEW_TOKENS, PROMPT_SEED, SAMPLE_SEED = 40, 5, 48, 1, 0
BOOTSTRAP, BOOTSTRAP_SEED = 2000, 0


def make_prompts(grammar: StochasticGrammar, n: int) -> list[list[str]]:
    """``n`` prompts ``[".", w1, w2]``: the first two words of consecutive sentences sampled from the grammar."""
    words = grammar.sample(20 * n, seed=PROMPT_SEED)
    starts = [i + 1 for i, w in enumerate(words[:-3]) if w == "."]
    return [["."] + words[s:s + 2] for s in starts[:n]]


def grammar_state(grammar: StochasticGrammar, words: list[str]) -> str:
    """The grammar's state after ``words``, which start with a full stop (the state after "." is the start)."""
    state = grammar.start
    for w in words[1:]:
        state = next(nxt for word, nxt, _ in grammar.rules[state] if word == w)
    return state


def sample_from_grammar(grammar: StochasticGrammar, state: str, n: int, rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(n):
        options = grammar.rules[state]
        k = rng.choice(len(options), p=np.array([p for _, _, p in options]) / sum(p for _, _, p in options))
        out.append(options[k][0])
        state = options[k][1]
    return out


def sentence_scores(grammar: StochasticGrammar, state: str, words: list[str]):
    """Split a continuation that starts in ``state`` into its complete sentences (the unfinished tail is
    dropped). Returns ``[(sentence, nll_per_word or None if the grammar rejects it), ...]``; after the first
    sentence every sentence starts in the start state."""
    table = {s: {w: (nxt, p) for w, nxt, p in options} for s, options in grammar.rules.items()}
    out, current, nll, ok = [], [], [], True
    for w in words:
        current.append(w)
        if ok and w in table[state]:
            state, p = table[state][w]
            nll.append(-math.log(p))
        else:
            ok = False
        if w == ".":
            out.append((" ".join(current), nll if ok else None))
            current, nll, ok, state = [], [], True, grammar.start
    return out


def repeated_ngram_fraction(tokens: list, n: int = 4) -> float:
    """``1 - |unique n-grams| / |n-grams|`` of one sequence (Welleck et al., 2020, seq-rep-n)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return 1 - len(set(grams)) / len(grams)


@torch.no_grad()
def model_nll(model, prompt_ids: list[int], continuation: list[int]) -> float:
    ids = torch.tensor([prompt_ids + continuation])
    logp = torch.log_softmax(model(ids)[0, :-1].double(), dim=-1)
    targets = ids[0, 1:]
    per_token = -logp.gather(-1, targets[:, None])[:, 0]
    return float(per_token[len(prompt_ids) - 1:].mean())


def summarise(name, grammar, model, prompts, continuations):
    """``continuations``: list of (prompt index, continuation words)."""
    rep4, sentences, nll_model = [], [], []
    per_prompt = {i: [] for i in range(len(prompts))}  # prompt -> [(rep4, sentences of one continuation)]
    pools = {}  # replicate r -> sentences of the r-th continuation of every prompt
    for i, words in continuations:
        state = grammar_state(grammar, prompts[i])
        rep4.append(repeated_ngram_fraction(words))
        these = sentence_scores(grammar, state, words)
        sentences += these
        pools.setdefault(len(per_prompt[i]), []).extend(these)
        per_prompt[i].append((rep4[-1], these))
        nll_model.append(model_nll(model, grammar.encode(prompts[i]).tolist(), grammar.encode(words).tolist()))
    good = [nll for _, nll in sentences if nll is not None]
    distinct = [len({s for s, _ in pool}) / len(pool) for pool in pools.values()]

    def stats(prompt_ids):
        r, n_sent, n_good, nll_sum, n_tok = [], 0, 0, 0.0, 0
        for i in prompt_ids:
            for value, sents in per_prompt[i]:
                r.append(value)
                n_sent += len(sents)
                for _, nll in sents:
                    if nll is not None:
                        n_good, nll_sum, n_tok = n_good + 1, nll_sum + sum(nll), n_tok + len(nll)
        return np.mean(r), n_good / n_sent, nll_sum / n_tok

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    boot = np.array([stats(rng.integers(len(prompts), size=len(prompts))) for _ in range(BOOTSTRAP)])
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    return {
        "method": name,
        "texts": len(continuations),
        "rep4": np.mean(rep4),
        "distinct_sentences": float(np.mean(distinct)),
        "grammatical": len(good) / len(sentences),
        "nll_grammar": float(np.mean(np.concatenate(good))) if good else float("nan"),
        "nll_model": np.mean(nll_model),
        "distinct_min": float(min(distinct)),
        "distinct_max": float(max(distinct)),
        "rep4_lo": float(lo[0]), "rep4_hi": float(hi[0]),
        "grammatical_lo": float(lo[1]), "grammatical_hi": float(hi[1]),
        "nll_grammar_lo": float(lo[2]), "nll_grammar_hi": float(hi[2]),
        "example": " ".join(prompts[0] + next(words for i, words in continuations if i == 0)),
    }


def main() -> None:
    torch.set_num_threads(1)
    grammar, model = default_grammar(), load_tiny_gpt()
    prompts = make_prompts(grammar, PROMPTS)
    ids = [grammar.encode(p).tolist() for p in prompts]
    next_lp, hidden = gpt_next_logprobs(model), gpt_hidden_states(model)
    rng = np.random.default_rng(SAMPLE_SEED)

    def deterministic(decode):
        return [(i, grammar.decode(decode(p)[len(p):])) for i, p in enumerate(ids)]

    def sampled(**kwargs):
        g = torch.Generator().manual_seed(SAMPLE_SEED)
        batch = torch.tensor([p for p in ids for _ in range(SAMPLES)])  # the prompts all have 3 tokens
        out = generate(model, batch, NEW_TOKENS, generator=g, **kwargs)[:, batch.shape[1]:]
        return [(r // SAMPLES, grammar.decode(row)) for r, row in enumerate(out.tolist())]

    methods = {
        "grammar": lambda: [(i, sample_from_grammar(grammar, grammar_state(grammar, prompts[i]), NEW_TOKENS, rng))
                            for i in range(PROMPTS) for _ in range(SAMPLES)],
        "greedy": lambda: deterministic(lambda p: greedy_decode(next_lp, p, NEW_TOKENS)),
        "beam 4": lambda: deterministic(lambda p: beam_search(next_lp, p, 4, NEW_TOKENS)[0][0]),
        "contrastive k=4 alpha=0.6": lambda: deterministic(
            lambda p: contrastive_search(next_lp, hidden, p, NEW_TOKENS, k=4, alpha=0.6)),
        "contrastive k=8 alpha=0.4": lambda: deterministic(
            lambda p: contrastive_search(next_lp, hidden, p, NEW_TOKENS, k=8, alpha=0.4)),
        "sampling T=1": lambda: sampled(),
        "sampling T=0.7": lambda: sampled(temperature=0.7),
        "sampling T=1.5": lambda: sampled(temperature=1.5),
        "top-k k=5": lambda: sampled(top_k=5),
        "top-p p=0.9": lambda: sampled(top_p=0.9),
    }
    rows = []
    for name, run in methods.items():
        rows.append(summarise(name, grammar, model, prompts, run()))
        r = rows[-1]
        print(f"{name:>26}: rep4 {r['rep4']:.3f}  distinct sentences {r['distinct_sentences']:.3f}  "
              f"grammatical {r['grammatical']:.3f}  nll grammar {r['nll_grammar']:.3f}  nll model {r['nll_model']:.3f}")
    print(f"entropy rate of the grammar: {grammar.entropy_rate():.4f} nats per token")
    DATA_DIR.mkdir(exist_ok=True)
    path = DATA_DIR / "decoding_methods.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in r.items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
