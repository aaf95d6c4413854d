"""The classic wrong answers of every graded function, and what each must cost, whatever the hidden inputs.

Each variant below is the source of one wrong answer cell (the rest of the notebook is the instructor's
solution) and the exact set of test cells it must lose: the cells of its own function that test what it gets
wrong, and the cells of the functions that call it (multi-head attention calls softmax) where the mistake
shows. Nothing else.

1. Same work, same score: under ten ``--seed`` values (three for the Chinchilla fit, whose reference takes a
   second per case) the hidden checks give every variant the same points and it loses exactly its cells. The
   cases come from the graded checks themselves (``check.cases(rng)`` with the grader's ``_case_rng``), and each
   check's deterministic edge cases are what makes this hold. To be fast this runs in-process: the notebook's
   code cells are executed in a namespace in the test process (our own code), and ``capture.capture`` (the
   sandbox's harness, given that namespace) calls the functions on the grader's input files, so what counts as an
   answer is the same as in the sandbox; the results are judged by ``checks.judge`` itself (comparisons and
   verdicts) against ``expected_results``. One variant per assignment also goes through the real command line
   (sandbox and all), copied under 20 names: 20 identical rows.
2. Visible tests catch what hidden checks catch: every variant fails at least one visible test of its own
   function; the visible tests of a function that calls a broken one fail exactly when its hidden cells are
   lost, and then name the broken function first.
"""

from __future__ import annotations

import contextlib
import csv
import io
import linecache
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat
import pytest

from autograder import assignments, capture
from autograder.__main__ import main as grader_main
from autograder.checks import OUTPUTS, expected_results, judge, write_inputs
from autograder.grade import _case_rng, _code_digest, release_template
from autograder.notebooks import prepare
from autograder.sandbox import bubblewrap_available
from submissions import solution_sources, submission, write

SEEDS = range(10)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow and nan are what some variants do


@dataclass(frozen=True)
class Variant:
    name: str
    cell: str  # the grade_id of the answer cell it replaces: the function's name
    loses: frozenset
    source: str


# The capstones, whose notebooks train models, have their own file: tests/test_wrong_variants_capstones.py.
CAPSTONES = ("ps11-train", "ps12-flash")
VARIANTS: dict[str, list[Variant]] = {name: [] for name in assignments.ASSIGNMENTS if name not in CAPSTONES}


def variant(assignment: str, name: str, cell: str, loses: set[str], source: str) -> None:
    VARIANTS[assignment].append(Variant(name, cell, frozenset(loses), source.strip("\n") + "\n"))


TEMPLATES: list[tuple[str, str, Callable[..., str]]] = []  # (assignment, cell, fill)


def template(assignment: str, cell: str, source: str, **right: str) -> Callable[..., str]:
    """A correct answer with some of its parts as ``{blanks}``, filled by ``right``: ``fill(**wrong)`` is the
    source with the named parts replaced by wrong ones (``fill()`` is correct: a test checks that)."""
    def fill(**wrong: str) -> str:
        assert set(wrong) <= set(right), set(wrong) - set(right)
        return source.format(**{**right, **wrong})

    TEMPLATES.append((assignment, cell, fill))
    return fill


# ---------------------------------------------------------------------------------------------------------------
# ps1-attention
# ---------------------------------------------------------------------------------------------------------------
PS1 = "ps1-attention"
SDPA = {"test_sdpa_small", "test_sdpa_mask", "test_sdpa_batched"}
MHA = {"test_mha_one_head", "test_mha_two_heads", "test_mha_batch_causal"}

variant(PS1, "softmax without subtracting the maximum", "softmax", {"test_softmax_stability"}, """
def softmax(x, axis=-1):
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)
""")
variant(PS1, "softmax shifted by the maximum of the whole array", "softmax", {"test_softmax_stability"}, """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x))
    return e / np.sum(e, axis=axis, keepdims=True)
""")
variant(PS1, "softmax ignores its axis argument", "softmax", {"test_softmax_axis"}, """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)
""")
variant(PS1, "softmax normalised over axis 0", "softmax", {"test_softmax_stability", "test_softmax_axis", *SDPA, *MHA},
        """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=0, keepdims=True)
""")
variant(PS1, "softmax without keepdims", "softmax", {"test_softmax_stability", "test_softmax_axis", *SDPA, *MHA}, """
def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis)
""")
variant(PS1, "softmax without normalising", "softmax",
        {"test_softmax_examples", "test_softmax_stability", "test_softmax_axis", *SDPA, *MHA}, """
def softmax(x, axis=-1):
    return np.exp(x - np.max(x, axis=axis, keepdims=True))
""")
variant(PS1, "causal mask transposed", "causal_mask", {"test_causal_mask"}, """
def causal_mask(T):
    return np.triu(np.ones((T, T), dtype=bool))
""")
variant(PS1, "causal mask without the diagonal", "causal_mask", {"test_causal_mask"}, """
def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool), k=-1)
""")
variant(PS1, "causal mask of floats", "causal_mask", {"test_causal_mask"}, """
def causal_mask(T):
    return np.tril(np.ones((T, T)))
""")
variant(PS1, "attention without the 1/sqrt(d) scale", "scaled_dot_product_attention", SDPA | MHA, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return np.matmul(weights, v), weights
""")
variant(PS1, "attention scaled by the size of the values", "scaled_dot_product_attention", SDPA, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(v.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return np.matmul(weights, v), weights
""")
variant(PS1, "attention with the mask polarity reversed", "scaled_dot_product_attention",
        {"test_sdpa_mask", "test_mha_batch_causal"}, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, -np.inf, scores)
    weights = softmax(scores, axis=-1)
    return np.matmul(weights, v), weights
""")
variant(PS1, "attention softmax over the queries", "scaled_dot_product_attention", SDPA | MHA, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-2)
    return np.matmul(weights, v), weights
""")
variant(PS1, "attention with .T (reverses every axis of a batch)", "scaled_dot_product_attention",
        {"test_sdpa_batched", *MHA}, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.T / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights
""")
variant(PS1, "attention reshapes a key mask to (T_q, 1): it hides queries, not keys", "scaled_dot_product_attention",
        {"test_sdpa_mask"}, """
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.reshape(mask, (q.shape[-2], -1)), scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return np.matmul(weights, v), weights
""")
mha_with = template(PS1, "multi_head_attention", """
def multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=None):
    *lead, T, d_model = x.shape
    d_head = d_model // n_heads

    def split(m):
        {split}

    q, k, v = split(x @ W_q), split(x @ W_k), split(x @ W_v)
    heads, _ = scaled_dot_product_attention(q, k, v, mask={mask})
    concat = {concat}
    return concat{w_o}
""", split="return np.swapaxes(m.reshape(*lead, T, n_heads, d_head), -2, -3)", mask="mask",
    concat="np.swapaxes(heads, -2, -3).reshape(*lead, T, d_model)", w_o=" @ W_o")
variant(PS1, "heads take every n_heads-th column", "multi_head_attention",
        {"test_mha_two_heads", "test_mha_batch_causal"},
        mha_with(split="return np.moveaxis(m.reshape(*lead, T, d_head, n_heads), -1, -3)",
                 concat="np.moveaxis(heads, -3, -1).reshape(*lead, T, d_model)"))
variant(PS1, "heads split by reshape without transposing", "multi_head_attention",
        {"test_mha_two_heads", "test_mha_batch_causal"},
        mha_with(split="return m.reshape(*lead, n_heads, T, d_head)",
                 concat="heads.reshape(*lead, T, d_model)"))
variant(PS1, "multi-head attention ignores the mask", "multi_head_attention", {"test_mha_batch_causal"},
        mha_with(mask="None"))
variant(PS1, "multi-head attention without W_o", "multi_head_attention", MHA,
        mha_with(w_o=""))
variant(PS1, "multi-head attention scaled by sqrt(d_model)", "multi_head_attention",
        {"test_mha_two_heads", "test_mha_batch_causal"}, """
def multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=None):
    *lead, T, d_model = x.shape
    d_head = d_model // n_heads
    heads = []
    for h in range(n_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        scores = (x @ W_q[:, cols]) @ np.swapaxes(x @ W_k[:, cols], -1, -2) / np.sqrt(d_model)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        heads.append(softmax(scores, axis=-1) @ (x @ W_v[:, cols]))
    return np.concatenate(heads, axis=-1) @ W_o
""")
variant(PS1, "equivariance error without abs", "equivariance_error", {"test_equivariance"}, """
def equivariance_error(f, x, perm):
    return float(np.max(f(x[perm]) - f(x)[perm]))
""")
variant(PS1, "equivariance error without abs, other order", "equivariance_error", {"test_equivariance"}, """
def equivariance_error(f, x, perm):
    return float(np.max(f(x)[perm] - f(x[perm])))
""")
variant(PS1, "equivariance error without permuting the output", "equivariance_error", {"test_equivariance"}, """
def equivariance_error(f, x, perm):
    return float(np.max(np.abs(f(x[perm]) - f(x))))
""")
variant(PS1, "equivariance error with the inverse permutation on the output", "equivariance_error",
        {"test_equivariance"}, """
def equivariance_error(f, x, perm):
    return float(np.max(np.abs(f(x[perm]) - f(x)[np.argsort(perm)])))
""")
variant(PS1, "equivariance error as a mean", "equivariance_error", {"test_equivariance"}, """
def equivariance_error(f, x, perm):
    return float(np.mean(np.abs(f(x[perm]) - f(x)[perm])))
""")


# ---------------------------------------------------------------------------------------------------------------
# ps2-positions
# ---------------------------------------------------------------------------------------------------------------
PS2 = "ps2-positions"
SINUSOIDAL = {"test_sinusoidal_small", "test_sinusoidal_values"}
T5_LARGE = {"test_t5_log", "test_t5_bidirectional"}
ROPE = {"test_rope_small", "test_rope_properties"}

variant(PS2, "sin and cos swapped", "sinusoidal_encoding", SINUSOIDAL, """
def sinusoidal_encoding(n_positions, d, base=10000.0):
    t = np.arange(n_positions)[:, None]
    omega = base ** (-np.arange(0, d, 2) / d)
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.cos(t * omega)
    pe[:, 1::2] = np.sin(t * omega)
    return pe
""")
variant(PS2, "exponent i/d instead of 2i/d", "sinusoidal_encoding", SINUSOIDAL, """
def sinusoidal_encoding(n_positions, d, base=10000.0):
    t = np.arange(n_positions)[:, None]
    omega = base ** (-np.arange(d // 2) / d)
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.sin(t * omega)
    pe[:, 1::2] = np.cos(t * omega)
    return pe
""")
variant(PS2, "a frequency per feature, not per pair", "sinusoidal_encoding", SINUSOIDAL, """
def sinusoidal_encoding(n_positions, d, base=10000.0):
    angles = np.arange(n_positions)[:, None] * base ** (-np.arange(d) / d)
    return np.where(np.arange(d) % 2 == 0, np.sin(angles), np.cos(angles))
""")
variant(PS2, "all sines first, then all cosines", "sinusoidal_encoding", SINUSOIDAL, """
def sinusoidal_encoding(n_positions, d, base=10000.0):
    angles = np.arange(n_positions)[:, None] * base ** (-np.arange(0, d, 2) / d)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
""")
variant(PS2, "sinusoidal ignores base", "sinusoidal_encoding", {"test_sinusoidal_values"}, """
def sinusoidal_encoding(n_positions, d, base=10000.0):
    t = np.arange(n_positions)[:, None]
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.sin(t * omega)
    pe[:, 1::2] = np.cos(t * omega)
    return pe
""")
alibi_with = template(PS2, "alibi_slopes", """
def alibi_slopes(n_heads):
    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range({start}, n + {start})]

    p = 2 ** int(np.{rounding}(np.log2(n_heads)))
    slopes = power_of_two(p)
    if p < n_heads:
        slopes += power_of_two(2 * p){extra}
    return np.array({slopes})
""", start="1", rounding="floor", extra="[0::2][: n_heads - p]", slopes="slopes")
variant(PS2, "ALiBi: the geometric sequence for any number of heads", "alibi_slopes", {"test_alibi_other"}, """
def alibi_slopes(n_heads):
    return np.array([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)])
""")
variant(PS2, "ALiBi: the even entries of the 2p sequence", "alibi_slopes", {"test_alibi_other"},
        alibi_with(extra="[1::2][: n_heads - p]"))
variant(PS2, "ALiBi: the next power of two, truncated", "alibi_slopes", {"test_alibi_other"},
        alibi_with(rounding="ceil", slopes="slopes[:n_heads]"))
variant(PS2, "ALiBi: every odd entry of the 2p sequence, untruncated", "alibi_slopes", {"test_alibi_other"},
        alibi_with(extra="[0::2]"))
variant(PS2, "ALiBi: heads counted from 0", "alibi_slopes", {"test_alibi_power_of_two", "test_alibi_other"},
        alibi_with(start="0"))
t5_with = template(PS2, "t5_bucket", """
def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    r = np.asarray(relative_position)
    n = num_buckets
    start = np.zeros_like(r)
    if bidirectional:
        n {halve}
        start = np.where(r {upper}, n, 0)
        a = np.abs(r)
    else:
        a = np.maximum({distance}, 0)
    e = {exact}
    with np.errstate(divide="ignore"):
        large = e + np.{rounding}(np.log(np.maximum(a, 1) / e) / np.log({max_distance} / e) * (n - e)).astype(int)
    return start + np.where(a < e, a, {clamp})
""", halve="//= 2", upper="> 0", distance="-r", exact="n // 2", rounding="floor",
    max_distance="max_distance", clamp="np.minimum(large, n - 1)")
variant(PS2, "T5 without the clamp at n - 1", "t5_bucket", T5_LARGE, t5_with(clamp="large"))
variant(PS2, "T5 clamped at n instead of n - 1", "t5_bucket", T5_LARGE,
        t5_with(clamp="np.minimum(large, n)"))
variant(PS2, "T5 relative position as query minus key", "t5_bucket",
        {"test_t5_exact", "test_t5_log", "test_t5_bidirectional"},
        t5_with(distance="r", upper="< 0"))
variant(PS2, "T5: distance 0 in the upper half", "t5_bucket", {"test_t5_bidirectional"},
        t5_with(upper=">= 0"))
variant(PS2, "T5: bidirectional without halving the buckets", "t5_bucket", {"test_t5_bidirectional"},
        t5_with(halve="//= 1"))
variant(PS2, "T5: rounding the log bucket", "t5_bucket", T5_LARGE, t5_with(rounding="round"))
variant(PS2, "T5: one exact bucket too many", "t5_bucket", T5_LARGE, t5_with(exact="n // 2 + 1"))
variant(PS2, "T5: max_distance fixed at 128", "t5_bucket", T5_LARGE, t5_with(max_distance="128"))
variant(PS2, "T5: causal buckets by |r| (future keys not in bucket 0)", "t5_bucket", {"test_t5_exact"},
        t5_with(distance="np.abs(r)"))
rope_with = template(PS2, "apply_rope", """
def apply_rope(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = np.asarray({positions}, dtype=float)[:, None] * {base} ** (-np.arange(0, d, 2) / {exponent})
    cos, sin = np.cos(angles), np.sin({sign}angles)
    a, b = {pairs}
    out = np.empty(np.shape(x))
    {out_a} = a * cos - b * sin
    {out_b} = a * sin + b * cos
    return out
""", positions="positions", base="base", exponent="d", sign="", pairs="x[..., 0::2], x[..., 1::2]",
    out_a="out[..., 0::2]", out_b="out[..., 1::2]")
variant(PS2, "RoPE rotating the two halves (rotate-half layout)", "apply_rope", ROPE,
        rope_with(pairs="x[..., : d // 2], x[..., d // 2:]",
                  out_a="out[..., : d // 2]", out_b="out[..., d // 2:]"))
variant(PS2, "RoPE rotating the wrong way", "apply_rope", ROPE, rope_with(sign="-"))
variant(PS2, "RoPE with theta_i = base^(-i/d)", "apply_rope", ROPE,
        rope_with(exponent="d / 2"))
variant(PS2, "RoPE ignores the positions given", "apply_rope", ROPE,
        rope_with(positions="np.arange(x.shape[-2])"))
variant(PS2, "RoPE ignores base", "apply_rope", {"test_rope_properties"},
        rope_with(base="10000.0"))
variant(PS2, "RoPE slices the second axis (x[:, 0::2]), not the last", "apply_rope", {"test_rope_properties"},
        rope_with(pairs="x[:, 0::2], x[:, 1::2]"))
variant(PS2, "RoPE overwriting the first feature of a pair before using it", "apply_rope", ROPE, """
def apply_rope(x, positions, base=10000.0):
    d = x.shape[-1]
    angles = np.asarray(positions, dtype=float)[:, None] * base ** (-np.arange(0, d, 2) / d)
    out = np.array(x, dtype=float)
    out[..., 0::2] = out[..., 0::2] * np.cos(angles) - out[..., 1::2] * np.sin(angles)
    out[..., 1::2] = out[..., 0::2] * np.sin(angles) + out[..., 1::2] * np.cos(angles)
    return out
""")

# ---------------------------------------------------------------------------------------------------------------
# ps3-tokenizers
# ---------------------------------------------------------------------------------------------------------------
PS3 = "ps3-tokenizers"
TRAIN = {"test_train_bpe", "test_train_bpe_ties"}
WORDPIECE = {"test_wordpiece", "test_wordpiece_unknown"}
VITERBI = {"test_viterbi", "test_viterbi_ties"}

variant(PS3, "pair counted once per word", "get_pair_stats", {"test_pair_stats", *TRAIN}, """
def get_pair_stats(vocab):
    stats = {}
    for word, count in vocab.items():
        symbols = word.split()
        for pair in dict.fromkeys(zip(symbols, symbols[1:])):
            stats[pair] = stats.get(pair, 0) + count
    return stats
""")
variant(PS3, "pair counts not weighted by the word counts", "get_pair_stats", {"test_pair_stats", *TRAIN}, """
def get_pair_stats(vocab):
    stats = {}
    for word in vocab:
        symbols = word.split()
        for pair in zip(symbols, symbols[1:]):
            stats[pair] = stats.get(pair, 0) + 1
    return stats
""")
variant(PS3, "pair statistics sorted (the tie rule needs first-seen order)", "get_pair_stats",
        {"test_train_bpe_ties"}, """
def get_pair_stats(vocab):
    stats = {}
    for word, count in vocab.items():
        symbols = word.split()
        for pair in zip(symbols, symbols[1:]):
            stats[pair] = stats.get(pair, 0) + count
    return dict(sorted(stats.items()))
""")
variant(PS3, "merge by string replacement", "merge_pair", {"test_merge_pair", *TRAIN, "test_bpe_segment"}, """
def merge_pair(pair, vocab):
    return {word.replace(" ".join(pair), "".join(pair)): count for word, count in vocab.items()}
""")
variant(PS3, "merge scanning right to left", "merge_pair", {"test_merge_pair", *TRAIN, "test_bpe_segment"}, """
def merge_pair(pair, vocab):
    a, b = pair
    merged = {}
    for word, count in vocab.items():
        symbols = word.split()
        out, i = [], len(symbols) - 1
        while i >= 0:
            if i > 0 and symbols[i - 1] == a and symbols[i] == b:
                out.append(a + b)
                i -= 2
            else:
                out.append(symbols[i])
                i -= 1
        merged[" ".join(reversed(out))] = count
    return merged
""")
train_with = template(PS3, "train_bpe", """
def train_bpe(word_counts, num_merges):
    vocab = {{" ".join(list(word){end}): count for word, count in word_counts.items()}}
    merges = []
    for _ in range(num_merges):
        stats = get_pair_stats(vocab)
        {stop}
        best = {pick}
        merges.append(best)
        vocab = merge_pair(best, vocab)
    return merges
""", end=' + ["</w>"]', stop="if not stats:\n            break", pick="max(stats, key=stats.get)")
variant(PS3, "ties to the lexicographically largest pair (subword-nmt)", "train_bpe", {"test_train_bpe_ties"},
        train_with(pick="max(stats, key=lambda pair: (stats[pair], pair))"))
variant(PS3, "ties to the pair seen last", "train_bpe", {"test_train_bpe_ties"},
        train_with(pick="max(reversed(list(stats)), key=stats.get)"))
variant(PS3, "training does not stop when no pair is left", "train_bpe", {"test_train_bpe"},
        train_with(stop="pass"))
variant(PS3, "training without the end-of-word symbol", "train_bpe", TRAIN, train_with(end=""))
variant(PS3, "training counts the merges after merging (0 merges still trains)", "train_bpe", {"test_train_bpe"}, """
def train_bpe(word_counts, num_merges):
    vocab = {" ".join(list(word) + ["</w>"]): count for word, count in word_counts.items()}
    merges = []
    while True:
        stats = get_pair_stats(vocab)
        if not stats:
            break
        best = max(stats, key=stats.get)
        merges.append(best)
        vocab = merge_pair(best, vocab)
        if len(merges) == num_merges:
            break
    return merges
""")
variant(PS3, "segmenting applies each merge once", "bpe_segment", {"test_bpe_segment"}, """
def bpe_segment(word, merges):
    symbols = list(word) + ["</w>"]
    for a, b in merges:
        for i in range(len(symbols) - 1):
            if symbols[i] == a and symbols[i + 1] == b:
                symbols[i:i + 2] = [a + b]
                break
    return symbols
""")
variant(PS3, "segmenting without the end-of-word symbol", "bpe_segment", {"test_bpe_segment"}, """
def bpe_segment(word, merges):
    vocab = {" ".join(word): 1}
    for pair in merges:
        vocab = merge_pair(pair, vocab)
    return list(vocab)[0].split()
""")
variant(PS3, "segmenting by the longest known symbol", "bpe_segment", {"test_bpe_segment"}, """
def bpe_segment(word, merges):
    known = {a + b for a, b in merges} | set(word) | {"</w>"}
    text, pieces, start = word + "</w>", [], 0
    while start < len(text):
        end = max(e for e in range(start + 1, len(text) + 1) if text[start:e] in known or e == start + 1)
        pieces.append(text[start:end])
        start = end
    return pieces
""")
wordpiece_with = template(PS3, "wordpiece_encode", """
def wordpiece_encode(word, vocab, unk="[UNK]", max_chars=100):
    if len(word) {too_long} max_chars:
        return {long}
    vocab = set(vocab)
    pieces, start = [], 0
    while start < len(word):
        {search}
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if {lookup} in vocab:
                break
        else:
            return {unknown}
        pieces.append(piece)
        start = end
    return pieces
""", too_long=">", long="[unk]", search="for end in range(len(word), start, -1):", lookup="piece",
    unknown="[unk]")
variant(PS3, "WordPiece shortest match first", "wordpiece_encode", WORDPIECE,
        wordpiece_with(search="for end in range(start + 1, len(word) + 1):"))
variant(PS3, "WordPiece looks up continuations without ##", "wordpiece_encode", WORDPIECE,
        wordpiece_with(lookup="word[start:end]"))
variant(PS3, "WordPiece never tries a piece of one letter (range stops at start + 1)", "wordpiece_encode", WORDPIECE,
        wordpiece_with(search="for end in range(len(word), start + 1, -1):"))
variant(PS3, "WordPiece keeps the pieces found before the unknown one", "wordpiece_encode", {"test_wordpiece_unknown"},
        wordpiece_with(unknown="pieces + [unk]"))
variant(PS3, "WordPiece max_chars off by one", "wordpiece_encode", {"test_wordpiece_unknown"},
        wordpiece_with(too_long=">="))
variant(PS3, "WordPiece ignores the unk argument", "wordpiece_encode", {"test_wordpiece_unknown"},
        wordpiece_with(unknown='["[UNK]"]', long='["[UNK]"]'))
viterbi_with = template(PS3, "viterbi_segment", """
def viterbi_segment(word, log_probs):
    n = len(word)
    longest = max(len(piece) for piece in log_probs)
    best = [0.0] + [-np.inf] * n
    back = [0] * (n + 1)
    count = [0] * (n + 1)
    for e in range(1, n + 1):
        for s in range({first}, e):
            piece = word[s:e]
            if piece in log_probs:
                score = best[s] + log_probs[piece]
                if {better}:
                    best[e], back[e], count[e] = score, s, count[s] + 1
    pieces, e = [], n
    while e > 0:
        pieces.append(word[back[e]:e])
        e = back[e]
    return pieces{order}, float(best[n])
""", first="max(0, e - longest)", better="score > best[e]", order="[::-1]")
variant(PS3, "Viterbi ties to the shorter last piece", "viterbi_segment", {"test_viterbi_ties"},
        viterbi_with(better="score >= best[e]"))
variant(PS3, "Viterbi ties to fewer pieces", "viterbi_segment", {"test_viterbi_ties"},
        viterbi_with(better="(score, -count[s] - 1) > (best[e], -count[e])"))
variant(PS3, "Viterbi never uses a piece of the longest length (off by one)", "viterbi_segment", VITERBI,
        viterbi_with(first="max(0, e - longest + 1)"))
variant(PS3, "Viterbi pieces in reverse order", "viterbi_segment", VITERBI,
        viterbi_with(order=""))
variant(PS3, "greedy longest match instead of Viterbi", "viterbi_segment", VITERBI, """
def viterbi_segment(word, log_probs):
    pieces, start = [], 0
    while start < len(word):
        end = max(e for e in range(start + 1, len(word) + 1) if word[start:e] in log_probs)
        pieces.append(word[start:end])
        start = end
    return pieces, float(sum(log_probs[p] for p in pieces))
""")

# ---------------------------------------------------------------------------------------------------------------
# ps4-decoding
# ---------------------------------------------------------------------------------------------------------------
PS4 = "ps4-decoding"
TOP_K = {"test_top_k_small", "test_top_k_batch"}
CACHE = {"test_cache_first", "test_cache_steps"}

variant(PS4, "top-k keeps exactly k entries (ties at the threshold dropped)", "top_k_filter", {"test_top_k_small"}, """
def top_k_filter(logits, k):
    logits = np.asarray(logits, dtype=float)
    order = np.argsort(-logits, axis=-1, kind="stable")
    keep = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :k], True, axis=-1)
    return np.where(keep, logits, -np.inf)
""")
top_k_with = template(PS4, "top_k_filter", """
def top_k_filter(logits, k):
    logits = np.asarray(logits, dtype=float)
    {guard}
    kth = {kth}
    return np.where(logits {compare} kth, -np.inf, logits)
""", guard="if k >= logits.shape[-1]:\n        return logits.copy()",
    kth="np.sort(logits, axis=-1)[..., -k][..., None]", compare="<")
variant(PS4, "top-k removes the k-th largest too (<= instead of <)", "top_k_filter", TOP_K,
        top_k_with(compare="<="))
variant(PS4, "top-k fails when k exceeds the vocabulary", "top_k_filter", {"test_top_k_batch"},
        top_k_with(guard="pass"))
variant(PS4, "top-k threshold over the whole batch", "top_k_filter", {"test_top_k_batch"},
        top_k_with(kth="np.sort(logits, axis=None)[-k]"))
top_p_with = template(PS4, "top_p_filter", """
def top_p_filter(logits, p):
    logits = np.asarray(logits, dtype=float)
    {guard}
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    order = {order}
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    {before}
    remove_sorted = before >= p
    remove_sorted[..., 0] = False
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, logits)
""", guard="if p >= 1:\n        return logits.copy()", order='np.argsort(-probs, axis=-1, kind="stable")',
    before="before = np.cumsum(sorted_probs, axis=-1) - sorted_probs")
variant(PS4, "top-p drops the token that crosses p", "top_p_filter", {"test_top_p"},
        top_p_with(before="before = np.cumsum(sorted_probs, axis=-1)"))
variant(PS4, "top-p with p = 1 drops the negligible tail", "top_p_filter", {"test_top_p"},
        top_p_with(guard="pass"))
variant(PS4, "top-p breaks ties to the higher index", "top_p_filter", {"test_top_p"},
        top_p_with(order='np.argsort(probs, axis=-1, kind="stable")[..., ::-1]'))
variant(PS4, "top-p in index order, not sorted by probability", "top_p_filter", {"test_top_p"},
        top_p_with(order="np.broadcast_to(np.arange(probs.shape[-1]), probs.shape)"))
variant(PS4, "top-p shifts the removal mask right but does not keep the first token", "top_p_filter", {"test_top_p"}, """
def top_p_filter(logits, p):
    logits = np.asarray(logits, dtype=float)
    if p >= 1:
        return logits.copy()
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    order = np.argsort(-probs, axis=-1, kind="stable")
    remove_sorted = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1) >= p
    remove_sorted[..., 1:] = remove_sorted[..., :-1].copy()
    remove = np.zeros_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, logits)
""")
sample_with = template(PS4, "sample_with_temperature", """
def sample_with_temperature(logits, temperature, u):
    z = np.asarray(logits, dtype=float) {scale} temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    return int(min(np.searchsorted(np.cumsum(probs), u, side="{side}"), len(probs) - 1))
""", scale="/", side="right")
variant(PS4, "sampling with searchsorted side='left'", "sample_with_temperature", {"test_sampling"},
        sample_with(side="left"))
variant(PS4, "sampling multiplies by the temperature", "sample_with_temperature", {"test_sampling"},
        sample_with(scale="*"))
variant(PS4, "sampling ignores the temperature", "sample_with_temperature", {"test_sampling"},
        sample_with(scale="/ 1.0  #"))
variant(PS4, "sampling without subtracting the maximum (exp overflows)", "sample_with_temperature",
        {"test_sampling"}, """
def sample_with_temperature(logits, temperature, u):
    probs = np.exp(np.asarray(logits, dtype=float) / temperature)
    probs /= probs.sum()
    return int(np.searchsorted(np.cumsum(probs), u, side="right"))
""")
variant(PS4, "sampling returns the most probable token", "sample_with_temperature", {"test_sampling"}, """
def sample_with_temperature(logits, temperature, u):
    return int(np.argmax(logits))
""")
beam_with = template(PS4, "beam_search_step", """
def beam_search_step(beams, scores, logprobs, beam_size):
    n, V = logprobs.shape
    total = {total}
    best = {best}
    beam_index, token = {decode}
    new_beams = np.concatenate([beams[beam_index], token[:, None]], axis=1)
    return new_beams, total[best]
""", total="(scores[:, None] + logprobs).reshape(-1)", best='np.argsort(-total, kind="stable")[:beam_size]',
    decode="np.divmod(best, V)")
variant(PS4, "beam step breaks ties to the last extension", "beam_search_step", {"test_beam_step"},
        beam_with(best='np.argsort(total, kind="stable")[::-1][:beam_size]'))
variant(PS4, "beam step flattened token-major", "beam_search_step", {"test_beam_step"},
        beam_with(total="(scores[:, None] + logprobs).T.reshape(-1)",
                  decode="best % n, best // n"))
variant(PS4, "beam step unflattens with the number of beams", "beam_search_step", {"test_beam_step"},
        beam_with(decode="best % n, best // n"))
variant(PS4, "beam step ranks by the new token's log-probability only", "beam_search_step", {"test_beam_step"},
        beam_with(total="logprobs.reshape(-1)"))
CACHE_APPEND = ("k_cache = np.concatenate([k_cache, k[None]], axis=0)\n"
                "    v_cache = np.concatenate([v_cache, v[None]], axis=0)")
CACHE_PREPEND = ("k_cache = np.concatenate([k[None], k_cache], axis=0)\n"
                 "    v_cache = np.concatenate([v[None], v_cache], axis=0)")
cache_with = template(PS4, "cached_attention_step", """
def cached_attention_step(q, k, v, k_cache, v_cache):
    {before}
    scores = k_cache @ q{scale}
    w = np.exp(scores - scores.max())
    w /= w.sum()
    out = w @ v_cache
    {after}
    return out, k_cache, v_cache
""", before=CACHE_APPEND, scale=" / np.sqrt(q.shape[-1])", after="")
variant(PS4, "cached attention without the 1/sqrt(d) scale", "cached_attention_step", {"test_cache_steps"},
        cache_with(scale=""))
variant(PS4, "cached attention scaled by 1/d", "cached_attention_step", {"test_cache_steps"},
        cache_with(scale=" / q.shape[-1]"))
variant(PS4, "cached attention drops the new key (appends it afterwards)", "cached_attention_step", CACHE,
        cache_with(before="", after=CACHE_APPEND))
variant(PS4, "cached attention prepends the new key", "cached_attention_step", {"test_cache_steps"},
        cache_with(before=CACHE_PREPEND))
variant(PS4, "cached attention returns the old caches", "cached_attention_step", CACHE, """
def cached_attention_step(q, k, v, k_cache, v_cache):
    keys = np.concatenate([k_cache, k[None]], axis=0)
    values = np.concatenate([v_cache, v[None]], axis=0)
    scores = keys @ q / np.sqrt(q.shape[-1])
    w = np.exp(scores - scores.max())
    return (w / w.sum()) @ values, k_cache, v_cache
""")

# ---------------------------------------------------------------------------------------------------------------
# ps5-efficient
# ---------------------------------------------------------------------------------------------------------------
PS5 = "ps5-efficient"
MERGE_ALL = {"test_merge_stats", "test_merge_extremes", "test_online_softmax", "test_online_softmax_extremes"}
MERGE_EXTREMES = {"test_merge_extremes", "test_online_softmax_extremes"}
ONLINE = {"test_online_softmax", "test_online_softmax_extremes"}
TILED = {"test_tiled_full", "test_tiled_causal"}
GQA = {"test_gqa", "test_gqa_causal"}
DECODE = {"test_decode_step", "test_decode_chunks"}

window_with = template(PS5, "sliding_window_mask", """
def sliding_window_mask(T, w, causal=True):
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    if {causal}:
        return {causal_mask}
    return {bidirectional_mask}
""", causal="causal", causal_mask="(i - j >= 0) & (i - j < w)", bidirectional_mask="np.abs(i - j) <= w // 2")
variant(PS5, "causal window of w + 1 keys", "sliding_window_mask", {"test_window_causal"},
        window_with(causal_mask="(i - j >= 0) & (i - j <= w)"))
variant(PS5, "causal window transposed", "sliding_window_mask", {"test_window_causal"},
        window_with(causal_mask="(j - i >= 0) & (j - i < w)"))
variant(PS5, "bidirectional window of w keys ((w - 1) // 2 per side)", "sliding_window_mask",
        {"test_window_bidirectional"}, window_with(bidirectional_mask="np.abs(i - j) <= (w - 1) // 2"))
variant(PS5, "window ignores causal=False", "sliding_window_mask", {"test_window_bidirectional"},
        window_with(causal="True"))
variant(PS5, "bidirectional window of w keys on each side (|i - j| < w)", "sliding_window_mask",
        {"test_window_bidirectional"}, window_with(bidirectional_mask="np.abs(i - j) < w"))
variant(PS5, "window mask of integers", "sliding_window_mask", {"test_window_causal", "test_window_bidirectional"},
        window_with(causal_mask="((i - j >= 0) & (i - j < w)).astype(int)",
                    bidirectional_mask="(np.abs(i - j) <= w // 2).astype(int)"))
merge_with = template(PS5, "merge_softmax_stats", """
def merge_softmax_stats(m1, l1, m2, l2):
    m1, l1, m2, l2 = (np.asarray(a, dtype=float) for a in (m1, l1, m2, l2))
    m = np.maximum(m1, m2)
    safe = {safe}
    return m, {merged}
""", safe="np.where(np.isfinite(m), m, 0.0)", merged="l1 * np.exp(m1 - safe) + l2 * np.exp(m2 - safe)")
variant(PS5, "merge without rescaling the sums", "merge_softmax_stats", MERGE_ALL,
        merge_with(merged="l1 + l2"))
variant(PS5, "merge without a guard for empty blocks (nan)", "merge_softmax_stats", MERGE_EXTREMES,
        merge_with(safe="m"))
variant(PS5, "merge in absolute terms (overflows)", "merge_softmax_stats", MERGE_EXTREMES,
        merge_with(merged="(l1 * np.exp(m1) + l2 * np.exp(m2)) / np.exp(safe)"))
variant(PS5, "merge rescaling with the wrong sign", "merge_softmax_stats", MERGE_ALL,
        merge_with(merged="l1 * np.exp(safe - m1) + l2 * np.exp(safe - m2)"))
online_with = template(PS5, "online_softmax", """
def online_softmax(x, block_size):
    x = np.asarray(x, dtype=float)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    m_run, l_run = [], []
    for start in range(0, {stop}, block_size):
        block = x[..., start:start + block_size]
        m_block = block.max(axis=-1)
        safe = {safe}
        l_block = np.exp(block - safe[..., None]).sum(axis=-1)
        m, l = merge_softmax_stats(m, l, m_block, l_block)
        m_run.append(m)
        l_run.append(l)
    p = np.exp(x - m[..., None]) / l[..., None]
    return {result}
""", stop="x.shape[-1]", safe="np.where(np.isfinite(m_block), m_block, 0.0)",
    result="p, np.stack(m_run, axis=-1), np.stack(l_run, axis=-1)")
variant(PS5, "online softmax drops a shorter last block", "online_softmax", ONLINE,
        online_with(stop="x.shape[-1] - block_size + 1"))
variant(PS5, "online softmax returns only the final statistics", "online_softmax", ONLINE,
        online_with(result="p, m, l"))
variant(PS5, "online softmax without a guard for a masked block", "online_softmax", {"test_online_softmax_extremes"},
        online_with(safe="m_block"))
tiled_with = template(PS5, "tiled_attention", """
def tiled_attention(q, k, v, block_size, is_causal=False):
    t_q, d = q.shape[-2:]
    t_k = k.shape[-2]
    m = np.full(q.shape[:-1], {m0})
    l = np.zeros(q.shape[:-1])
    acc = np.zeros(q.shape[:-1] + (v.shape[-1],))
    rows = np.arange(t_q)[:, None]
    for start in range(0, {stop}, block_size):
        stop = min(start + block_size, t_k)
        s = q @ np.swapaxes(k[..., start:stop, :], -1, -2){scale}
        if is_causal:
            s = np.where({keys} <= rows, s, -np.inf)
        m_new = {m_new}
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        p = np.exp(s - safe[..., None])
        alpha = np.exp(m - safe)
        l = alpha * l + p.sum(axis=-1)
        acc = {acc} + p @ v[..., start:stop, :]
        m = m_new
    return acc / l[..., None], {lse}
""", m0="-np.inf", stop="t_k", scale=" / np.sqrt(d)", keys="np.arange(start, stop)[None, :]",
    m_new="np.maximum(m, s.max(axis=-1))", acc="alpha[..., None] * acc", lse="m + np.log(l)")
variant(PS5, "tiled attention without rescaling the output", "tiled_attention", TILED,
        tiled_with(acc="acc"))
variant(PS5, "tiled attention returns the maximum as the log-sum-exp", "tiled_attention", TILED,
        tiled_with(lse="m"))
variant(PS5, "tiled attention with block-local key indices for the causal mask", "tiled_attention",
        {"test_tiled_causal"}, tiled_with(keys="np.arange(stop - start)[None, :]"))
variant(PS5, "tiled attention without a running maximum (overflows)", "tiled_attention", TILED,
        tiled_with(m0="0.0", m_new="m"))
variant(PS5, "tiled attention with a running maximum that starts at 0 (underflows)", "tiled_attention", TILED,
        tiled_with(m0="0.0"))
variant(PS5, "tiled attention drops a shorter last block", "tiled_attention", TILED,
        tiled_with(stop="t_k - block_size + 1"))
variant(PS5, "tiled attention without the 1/sqrt(d) scale", "tiled_attention", TILED,
        tiled_with(scale=""))
variant(PS5, "grouped-query heads interleaved (h % H_kv, repeat instead of repeat_interleave)",
        "grouped_query_attention", GQA, """
def grouped_query_attention(q, k, v, is_causal=False):
    H, H_kv = q.shape[1], k.shape[1]
    t_q, t_k = q.shape[2], k.shape[2]
    mask = np.tril(np.ones((t_q, t_k), dtype=bool)) if is_causal else None
    return dense_attention(q, np.tile(k, (1, H // H_kv, 1, 1)), np.tile(v, (1, H // H_kv, 1, 1)), mask=mask)
""")
variant(PS5, "grouped-query attention ignores is_causal", "grouped_query_attention", {"test_gqa_causal"}, """
def grouped_query_attention(q, k, v, is_causal=False):
    g = q.shape[1] // k.shape[1]
    return dense_attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1))
""")
variant(PS5, "grouped-query attention relies on broadcasting (right for one or H key/value heads only)",
        "grouped_query_attention", GQA, """
def grouped_query_attention(q, k, v, is_causal=False):
    t_q, t_k = q.shape[2], k.shape[2]
    mask = np.tril(np.ones((t_q, t_k), dtype=bool)) if is_causal else None
    return dense_attention(q, k, v, mask=mask)
""")
decode_with = template(PS5, "decode_step", """
def decode_step(q, k_new, v_new, k_cache, v_cache):
    k_cache = np.concatenate([k_cache, k_new], axis=2)
    v_cache = np.concatenate([v_cache, v_new], axis=2)
    B, H, t_new, d = q.shape
    H_kv, t_all = k_cache.shape[1], k_cache.shape[2]
    g = H // H_kv
    mask = {mask}
    keys, values = {kv}
    out = dense_attention(q, keys, values, mask=mask)
    return out, {caches}
""", mask="np.arange(t_all)[None, :] <= np.arange(t_new)[:, None] + (t_all - t_new)",
    kv="np.repeat(k_cache, g, axis=1), np.repeat(v_cache, g, axis=1)", caches="k_cache, v_cache")
variant(PS5, "decoding with the top-left causal mask", "decode_step", DECODE,
        decode_with(mask="np.arange(t_all)[None, :] <= np.arange(t_new)[:, None]"))
variant(PS5, "decoding without a mask", "decode_step", {"test_decode_chunks"},
        decode_with(mask="None"))
variant(PS5, "decoding excludes the token's own position", "decode_step", DECODE,
        decode_with(mask="np.arange(t_all)[None, :] < np.arange(t_new)[:, None] + (t_all - t_new)"))
variant(PS5, "decoding caches the repeated key/value heads", "decode_step", DECODE,
        decode_with(caches="keys, values"))
variant(PS5, "decoding with interleaved key/value heads", "decode_step", DECODE,
        decode_with(kv="np.tile(k_cache, (1, g, 1, 1)), np.tile(v_cache, (1, g, 1, 1))"))

# ---------------------------------------------------------------------------------------------------------------
# ps6-scaling
# ---------------------------------------------------------------------------------------------------------------
PS6 = "ps6-scaling"
POWER_LAW = {"test_power_law_exact", "test_power_law_noisy"}
OPTIMAL = {"test_optimal_closed_form", "test_optimal_brute_force"}

power_law_with = template(PS6, "fit_power_law", """
def fit_power_law(x, y):
    u = np.{log}(np.asarray(x, dtype=float))
    v = np.{log}(np.asarray(y, dtype=float))
    du = u - u.mean()
    b = np.sum(du * (v - v.mean())) / np.sum(du**2)
    log_a = v.mean() - b * u.mean()
    return {result}
""", log="log", result="float(np.exp(log_a)), float(b)")
variant(PS6, "power law: the prefactor as a mean in linear space", "fit_power_law", {"test_power_law_noisy"},
        power_law_with(result="float(np.mean(y / x**b)), float(b)"))
variant(PS6, "power law: log10 with exp", "fit_power_law", POWER_LAW, power_law_with(log="log10"))
variant(PS6, "power law returns log a", "fit_power_law", POWER_LAW,
        power_law_with(result="float(log_a), float(b)"))
variant(PS6, "power law: log x regressed on log y", "fit_power_law", {"test_power_law_noisy"}, """
def fit_power_law(x, y):
    u, v = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    dv = v - v.mean()
    b = np.sum(dv**2) / np.sum(dv * (u - u.mean()))
    return float(np.exp(v.mean() - b * u.mean())), float(b)
""")
variant(PS6, "training compute 2ND (the forward pass only)", "training_flops", {"test_training_flops"}, """
def training_flops(N, D):
    return 2.0 * np.asarray(N, dtype=float) * np.asarray(D, dtype=float)
""")
variant(PS6, "training compute through float() (scalars only)", "training_flops", {"test_training_flops"}, """
def training_flops(N, D):
    return 6.0 * float(N) * float(D)
""")
optimal_with = template(PS6, "compute_optimal", """
def compute_optimal(C, E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28):
    budget = np.asarray(C, dtype=float) / {six}
    G = {G}
    N_opt = G * budget ** ({exponent} / (alpha + beta))
    return N_opt, budget / N_opt
""", six="6.0", G="(alpha * A / (beta * B)) ** (1.0 / (alpha + beta))", exponent="beta")
variant(PS6, "compute-optimal exponents swapped", "compute_optimal", OPTIMAL,
        optimal_with(exponent="alpha"))
variant(PS6, "compute-optimal without the 6", "compute_optimal", OPTIMAL, optimal_with(six="1.0"))
variant(PS6, "compute-optimal constant without the exponents (A/B only)", "compute_optimal", OPTIMAL,
        optimal_with(G="(A / B) ** (1.0 / (alpha + beta))"))
objective_with = template(PS6, "chinchilla_objective", """
def chinchilla_objective(params, N, D, loss, delta=1e-3):
    pred = chinchilla_loss(N, D, params["E"], params["A"], params["B"], params["alpha"], params["beta"])
    r = {residual}
    huber = {huber}
    return float(np.{total}(huber))
""", residual="np.log(pred) - np.log(np.asarray(loss, dtype=float))", total="sum",
    huber="np.where(np.abs(r) <= delta, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta))")
variant(PS6, "objective: least squares instead of Huber", "chinchilla_objective", {"test_objective"},
        objective_with(huber="0.5 * r**2"))
variant(PS6, "objective: a mean instead of a sum", "chinchilla_objective", {"test_objective"},
        objective_with(total="mean"))
variant(PS6, "objective: residuals of the losses, not of their logarithms", "chinchilla_objective", {"test_objective"},
        objective_with(residual="pred - np.asarray(loss, dtype=float)"))
variant(PS6, "objective: Huber without the -delta/2", "chinchilla_objective", {"test_objective"},
        objective_with(huber="np.where(np.abs(r) <= delta, 0.5 * r**2, delta * np.abs(r))"))
variant(PS6, "objective ignores delta", "chinchilla_objective", {"test_objective"},
        objective_with(huber="np.where(np.abs(r) <= 1e-3, 0.5 * r**2, 1e-3 * (np.abs(r) - 0.5e-3))"))
variant(PS6, "Chinchilla fit by least squares (no Huber loss)", "chinchilla_fit", {"test_fit_noisy"},
        solution_sources(PS6, "ps6-scaling.ipynb")["chinchilla_fit"].replace(
            "def chinchilla_fit(N, D, loss, delta=1e-3):", "def chinchilla_fit(N, D, loss, delta=1.0):"))

# ---------------------------------------------------------------------------------------------------------------
# ps7-modern
# ---------------------------------------------------------------------------------------------------------------
PS7 = "ps7-modern"
RMS = {"test_rms_norm", "test_rms_norm_eps"}
SWIGLU = {"test_swiglu", "test_swiglu_batched"}
ROPE = {"test_rope", "test_rope_offset"}
GQA7 = {"test_gqa", "test_gqa_cache"}
LLAMA3 = {"test_llama3", "test_llama3_factors"}
ROLLING = {"test_rolling_cache", "test_rolling_cache_chunks"}

rms_with = template(PS7, "rms_norm", """
def rms_norm(x, weight, eps=1e-6):
    x = np.asarray(x, dtype=float)
    return np.asarray(weight, dtype=float) * {centred} / {denominator}
""", centred="x", denominator="np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)")
variant(PS7, "RMSNorm that subtracts the mean (LayerNorm)", "rms_norm", RMS,
        rms_with(centred="(x - x.mean(axis=-1, keepdims=True))",
                 denominator="np.sqrt(np.var(x, axis=-1, keepdims=True) + eps)"))
variant(PS7, "RMSNorm with eps outside the square root", "rms_norm", {"test_rms_norm_eps"},
        rms_with(denominator="(np.sqrt(np.mean(x**2, axis=-1, keepdims=True)) + eps)"))
variant(PS7, "RMSNorm without eps", "rms_norm", {"test_rms_norm_eps"},
        rms_with(denominator="np.sqrt(np.mean(x**2, axis=-1, keepdims=True))"))
variant(PS7, "RMSNorm with the root of the sum instead of the mean", "rms_norm", RMS,
        rms_with(denominator="np.sqrt(np.sum(x**2, axis=-1, keepdims=True) + eps)"))
variant(PS7, "RMSNorm over axis 0", "rms_norm", RMS,
        rms_with(denominator="np.sqrt(np.mean(x**2, axis=0, keepdims=True) + eps)"))
swiglu_with = template(PS7, "swiglu", """
def swiglu(x, w_gate, w_up, w_down):
    gate, up = {projections}
    return ({activation} * up) @ w_down.T
""", projections="x @ w_gate.T, x @ w_up.T", activation="gate / (1.0 + np.exp(-gate))")
variant(PS7, "SwiGLU with gate and up swapped", "swiglu", SWIGLU, swiglu_with(projections="x @ w_up.T, x @ w_gate.T"))
variant(PS7, "SwiGLU with GELU instead of SiLU (GeGLU)", "swiglu", SWIGLU, swiglu_with(
    activation="0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))"))
variant(PS7, "SwiGLU with a sigmoid gate (GLU)", "swiglu", SWIGLU,
        swiglu_with(activation="1.0 / (1.0 + np.exp(-gate))"))
variant(PS7, "SwiGLU flattens the leading axes", "swiglu", {"test_swiglu_batched"}, """
def swiglu(x, w_gate, w_up, w_down):
    x2 = x.reshape(-1, x.shape[-1])
    gate = x2 @ w_gate.T
    return (gate / (1.0 + np.exp(-gate)) * (x2 @ w_up.T)) @ w_down.T
""")
rope_with = template(PS7, "rope_rotate_half", """
def rope_rotate_half(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = {theta}
    angle = np.asarray({positions}, dtype=float)[:, None] * theta
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = {pairs}
    return {combine}
""", theta="base ** (-np.arange(0, d, 2) / d)", positions="positions", pairs="x[..., : d // 2], x[..., d // 2:]",
    combine="np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)")
variant(PS7, "RoPE interleaved instead of rotate-half", "rope_rotate_half", ROPE, rope_with(
    pairs="x[..., 0::2], x[..., 1::2]",
    combine="np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)"))
variant(PS7, "RoPE ignores positions (starts at 0)", "rope_rotate_half", {"test_rope_offset"},
        rope_with(positions="np.arange(x.shape[-2])"))
variant(PS7, "RoPE assumes consecutive positions from positions[0]", "rope_rotate_half", {"test_rope_offset"},
        rope_with(positions="positions[0] + np.arange(x.shape[-2])"))
variant(PS7, "RoPE in float32", "rope_rotate_half", ROPE,
        rope_with(combine="np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(np.float32)"))
variant(PS7, "RoPE rotates the other way", "rope_rotate_half", ROPE,
        rope_with(combine="np.concatenate([a * cos + b * sin, b * cos - a * sin], axis=-1)"))
variant(PS7, "RoPE ignores base", "rope_rotate_half", ROPE, rope_with(theta="10000.0 ** (-np.arange(0, d, 2) / d)"))
variant(PS7, "RoPE with theta_i = base^(-i/d)", "rope_rotate_half", ROPE,
        rope_with(theta="base ** (-np.arange(d // 2) / d)"))
gqa7_with = template(PS7, "grouped_query_attention", """
def grouped_query_attention(q, k, v, is_causal=False):
    g = q.shape[1] // k.shape[1]
    T, T_k = q.shape[2], k.shape[2]
    mask = {mask} if {causal} else None
    return dense_attention(q, {kv}, mask=mask)
""", mask="np.arange(T_k)[None, :] <= np.arange(T)[:, None] + (T_k - T)", causal="is_causal",
    kv="np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)")
variant(PS7, "grouped-query heads interleaved (tile instead of repeat)", "grouped_query_attention", GQA7,
        gqa7_with(kv="np.tile(k, (1, g, 1, 1)), np.tile(v, (1, g, 1, 1))"))
variant(PS7, "grouped-query causal mask aligned at the top left", "grouped_query_attention", {"test_gqa_cache"},
        gqa7_with(mask="np.arange(T_k)[None, :] <= np.arange(T)[:, None]"))
variant(PS7, "grouped-query attention always causal", "grouped_query_attention", {"test_gqa"},
        gqa7_with(causal="True"))
variant(PS7, "grouped-query attention relies on broadcasting (no repeat of the key/value heads)",
        "grouped_query_attention", GQA7, gqa7_with(kv="k, v"))
variant(PS7, "grouped-query mask hides the query's own position", "grouped_query_attention", GQA7,
        gqa7_with(mask="np.arange(T_k)[None, :] < np.arange(T)[:, None] + (T_k - T)"))
variant(PS7, "grouped-query attention without the 1/sqrt(d) scale", "grouped_query_attention", GQA7, """
def grouped_query_attention(q, k, v, is_causal=False):
    g = q.shape[1] // k.shape[1]
    T, T_k = q.shape[2], k.shape[2]
    mask = np.arange(T_k)[None, :] <= np.arange(T)[:, None] + (T_k - T) if is_causal else None
    return dense_attention(q * np.sqrt(q.shape[-1]), np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), mask=mask)
""")
llama3_with = template(PS7, "llama3_inv_freq", """
def llama3_inv_freq(d, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192):
    theta = base ** (-np.arange(0, d, 2) / d)
    wavelength = 2 * np.pi / theta
    L0 = original_max_position_embeddings
    low, high = {factors}
    gamma = (L0 / wavelength - low) / (high - low)
    blended = {blended}
    return np.where(wavelength < L0 / {keep}, theta, np.where(wavelength > L0 / {divide}, theta / factor, blended))
""", factors="low_freq_factor, high_freq_factor", blended="(1 - gamma) * theta / factor + gamma * theta",
    keep="high", divide="low")
variant(PS7, "llama3 with the boundaries swapped", "llama3_inv_freq", LLAMA3, llama3_with(keep="low", divide="high"))
variant(PS7, "llama3 without smoothing (middle divided)", "llama3_inv_freq", LLAMA3,
        llama3_with(blended="theta / factor"))
variant(PS7, "llama3 without smoothing (middle kept)", "llama3_inv_freq", LLAMA3, llama3_with(blended="theta"))
variant(PS7, "llama3 with the blend weights swapped", "llama3_inv_freq", LLAMA3,
        llama3_with(blended="gamma * theta / factor + (1 - gamma) * theta"))
variant(PS7, "llama3 ignores low_freq_factor and high_freq_factor", "llama3_inv_freq", {"test_llama3_factors"},
        llama3_with(factors="1.0, 4.0"))
variant(PS7, "llama3 in float32", "llama3_inv_freq", LLAMA3, """
def llama3_inv_freq(d, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192):
    theta = np.float32(base) ** (-np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    wavelength = np.float32(2 * np.pi) / theta
    L0 = np.float32(original_max_position_embeddings)
    gamma = (L0 / wavelength - np.float32(low_freq_factor)) / np.float32(high_freq_factor - low_freq_factor)
    blended = (1 - gamma) * theta / np.float32(factor) + gamma * theta
    return np.where(wavelength < L0 / np.float32(high_freq_factor), theta,
                    np.where(wavelength > L0 / np.float32(low_freq_factor), theta / np.float32(factor), blended))
""")
rolling_with = template(PS7, "rolling_cache_step", """
def rolling_cache_step(keys, values, positions, q, k_new, v_new, window, sinks=4):
    t = q.shape[1]
    start = {start} if len(positions) else 0
    pos = np.concatenate([positions, np.arange(start, start + t)]).astype(np.int64)
    k = np.concatenate([keys, k_new], axis=1)
    v = np.concatenate([values, v_new], axis=1)
    i, j = pos[-t:, None], pos[None, :]
    mask = {mask}
    keep = {keep}
    return dense_attention(q, k, v, mask={attend}), k[:, keep], v[:, keep], {kept_positions}
""", start="positions[-1] + 1", mask="(j <= i) & ((j < sinks) | (i - j < window - sinks))", keep="mask[-1]",
    attend="mask", kept_positions="pos[keep]")
variant(PS7, "rolling cache: window off by one (window - sinks + 1 recent tokens)", "rolling_cache_step", ROLLING,
        rolling_with(mask="(j <= i) & ((j < sinks) | (i - j <= window - sinks))"))
variant(PS7, "rolling cache evicts the sinks (the last window tokens only)", "rolling_cache_step", ROLLING,
        rolling_with(mask="(j <= i) & (i - j < window)"))
variant(PS7, "rolling cache numbers the new tokens by their slot in the cache", "rolling_cache_step", ROLLING,
        rolling_with(start="len(positions)"))
variant(PS7, "rolling cache returns the slots (StreamingLLM) instead of the original positions",
        "rolling_cache_step", ROLLING, rolling_with(kept_positions="np.arange(int(keep.sum()))"))
variant(PS7, "rolling cache without a mask (attends to every key it holds)", "rolling_cache_step", ROLLING,
        rolling_with(attend="None"))
variant(PS7, "rolling cache without the causal part of the mask (right for one new token only)",
        "rolling_cache_step", {"test_rolling_cache_chunks"}, rolling_with(mask="(j < sinks) | (i - j < window - sinks)"))
variant(PS7, "rolling cache keeps what the first new query sees", "rolling_cache_step",
        {"test_rolling_cache_chunks"}, rolling_with(keep="mask[0]"))

# ---------------------------------------------------------------------------------------------------------------
# ps8-objectives
# ---------------------------------------------------------------------------------------------------------------
PS8 = "ps8-objectives"
MLM_INV, MLM_STATS = "test_mlm_invariants", "test_mlm_statistics"
MLM = {MLM_INV, MLM_STATS}
LOSS, LOSS_LARGE = "test_mlm_loss", "test_mlm_loss_large_logits"
COUNTS, CLIP = "test_t5_counts", "test_t5_counts_clipping"
T5_FORMAT = {"test_t5_corruption", "test_t5_corruption_edges"}
BEST, TIES = "test_best_span", "test_best_span_ties"

mlm_with = template(PS8, "mlm_mask", """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    selected = (rng.random(ids.shape) < {mask_prob}){specials}
    action = rng.random(ids.shape)
    random_ids = {random_ids}
    inputs = np.where(selected & (action < {to_mask}), mask_id, ids)
    inputs = np.where({to_random}, random_ids, inputs)
    labels = np.where({labelled}, ids, -100)
    return inputs, labels
""", mask_prob="mask_prob", specials=" & ~np.asarray(special_mask, dtype=bool)", to_mask="0.8",
    to_random="selected & (action >= 0.8) & (action < 0.9)", labelled="selected",
    random_ids="rng.integers(0, vocab_size, size=ids.shape)")
variant(PS8, "MLM 90/10/0 (no kept tokens)", "mlm_mask", {MLM_STATS},
        mlm_with(to_mask="0.9", to_random="selected & (action >= 0.9)"))
variant(PS8, "MLM random share not rescaled (10% of the remaining 20%: 80/2/18)", "mlm_mask", {MLM_STATS},
        mlm_with(to_random="selected & (action >= 0.8) & (rng.random(ids.shape) < 0.1)"))
variant(PS8, "MLM selects special tokens", "mlm_mask", {MLM_INV}, mlm_with(specials=""))
variant(PS8, "MLM labels every position (the loss over all tokens)", "mlm_mask", MLM,
        mlm_with(labelled="np.ones(ids.shape, dtype=bool)"))
variant(PS8, "MLM labels only the tokens that changed", "mlm_mask", MLM,
        mlm_with(labelled="selected & (inputs != ids)"))
variant(PS8, "MLM random replacements also hit unselected tokens", "mlm_mask", {MLM_INV},
        mlm_with(to_random="(action >= 0.8) & (action < 0.9)"))
variant(PS8, "MLM ignores mask_prob (always 15%)", "mlm_mask", MLM, mlm_with(mask_prob="0.15"))
variant(PS8, "MLM random ids only from the word pieces [999, vocab_size)", "mlm_mask", {MLM_STATS},
        mlm_with(random_ids="rng.integers(min(999, vocab_size - 1), vocab_size, size=ids.shape)"))
variant(PS8, "MLM random ids never equal to the original", "mlm_mask", {MLM_STATS},
        mlm_with(random_ids="(ids + rng.integers(1, vocab_size, size=ids.shape)) % vocab_size"))
variant(PS8, "MLM ignores its rng (NumPy's global generator)", "mlm_mask", {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    ids = np.asarray(ids)
    selected = (np.random.random(ids.shape) < mask_prob) & ~np.asarray(special_mask, dtype=bool)
    action = np.random.random(ids.shape)
    random_ids = np.random.randint(0, vocab_size, size=ids.shape)
    inputs = np.where(selected & (action < 0.8), mask_id, ids)
    inputs = np.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, np.where(selected, ids, -100)
""")
variant(PS8, "MLM a fixed pattern with the right rates (the same for every rng)", "mlm_mask", {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    ids = np.asarray(ids)
    fixed = np.random.default_rng(1234)  # a pattern of its own: right rates, never changes
    selected = (fixed.random(ids.shape) < mask_prob) & ~np.asarray(special_mask, dtype=bool)
    action = fixed.random(ids.shape)
    random_ids = fixed.integers(0, vocab_size, size=ids.shape)
    inputs = np.where(selected & (action < 0.8), mask_id, ids)
    inputs = np.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, np.where(selected, ids, -100)
""")
variant(PS8, "MLM evenly spaced selections (position-dependent, right rates)", "mlm_mask", {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    step = max(int(round(1 / mask_prob)), 1) if mask_prob > 0 else 0
    position = np.arange(ids.size).reshape(ids.shape) + int(rng.integers(0, max(step, 1)))
    selected = ((position % step == 0) if step else np.zeros(ids.shape, dtype=bool))
    selected &= ~np.asarray(special_mask, dtype=bool)
    if mask_prob >= 1:
        selected = ~np.asarray(special_mask, dtype=bool)
    action = rng.random(ids.shape)
    inputs = np.where(selected & (action < 0.8), mask_id, ids)
    inputs = np.where(selected & (action >= 0.8) & (action < 0.9), rng.integers(0, vocab_size, size=ids.shape), inputs)
    return inputs, np.where(selected, ids, -100)
""")
variant(PS8, "MLM selects exactly round(mask_prob * n) tokens (right rates, no spread)", "mlm_mask", {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    candidates = np.flatnonzero(~np.asarray(special_mask, dtype=bool))
    chosen = rng.choice(candidates, size=int(round(mask_prob * candidates.size)), replace=False)
    selected = np.isin(np.arange(ids.size), chosen).reshape(ids.shape)
    action = rng.random(ids.shape)
    inputs = np.where(selected & (action < 0.8), mask_id, ids)
    inputs = np.where(selected & (action >= 0.8) & (action < 0.9), rng.integers(0, vocab_size, size=ids.shape), inputs)
    return inputs, np.where(selected, ids, -100)
""")
variant(PS8, "MLM masks exactly 80% and replaces exactly 10% of the selected tokens (no spread)", "mlm_mask",
        {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    selected = (rng.random(ids.shape) < mask_prob) & ~np.asarray(special_mask, dtype=bool)
    order = rng.permutation(np.flatnonzero(selected))
    n_mask, n_random = int(round(0.8 * order.size)), int(round(0.1 * order.size))
    inputs = ids.copy().ravel()
    inputs[order[:n_mask]] = mask_id
    inputs[order[n_mask:n_mask + n_random]] = rng.integers(0, vocab_size, size=n_random)
    return inputs.reshape(ids.shape), np.where(selected, ids, -100)
""")
variant(PS8, "MLM one draw for the selection and the 80/10/10 split (not rescaled)", "mlm_mask", {MLM_STATS}, """
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    u = rng.random(ids.shape)
    selected = (u < mask_prob) & ~np.asarray(special_mask, dtype=bool)
    inputs = np.where(selected & (u < 0.8), mask_id, ids)
    inputs = np.where(selected & (u >= 0.8) & (u < 0.9), rng.integers(0, vocab_size, size=ids.shape), inputs)
    return inputs, np.where(selected, ids, -100)
""")
loss_with = template(PS8, "mlm_loss", """
def mlm_loss(logits, labels):
    logits, labels = np.asarray(logits, dtype=float), np.asarray(labels)
    selected = {selected}
    z = logits[selected]
    z = z - {shift}
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    picked = -log_probs[np.arange(len(z)), np.where(labels[selected] == -100, 0, labels[selected])]
    return float({reduce})
""", selected="labels != -100", shift="z.max(axis=-1, keepdims=True)", reduce="picked.mean()")
variant(PS8, "MLM loss over all positions (-100 read as token 0)", "mlm_loss", {LOSS},
        loss_with(selected="np.ones(labels.shape, dtype=bool)"))
variant(PS8, "MLM loss summed instead of averaged", "mlm_loss", {LOSS, LOSS_LARGE}, loss_with(reduce="picked.sum()"))
variant(PS8, "MLM loss divided by all positions", "mlm_loss", {LOSS}, loss_with(reduce="picked.sum() / labels.size"))
variant(PS8, "MLM loss without subtracting the maximum (overflow)", "mlm_loss", {LOSS_LARGE}, loss_with(shift="0.0"))
counts_with = template(PS8, "t5_span_counts", """
def t5_span_counts(length, noise_density=0.15, mean_span_length=3.0):
    num_noise = int({noise})
    num_noise = {clip_noise}
    num_spans = int(np.round(np.float32(num_noise) / np.float32(mean_span_length)))
    return num_noise, {clip_spans}
""", noise="np.round(np.float32(length) * np.float32(noise_density))", clip_noise="min(max(num_noise, 1), length - 1)",
    clip_spans="max(num_spans, 1)")
variant(PS8, "T5 counts with floor instead of round", "t5_span_counts", {COUNTS},
        counts_with(noise="np.floor(np.float32(length) * np.float32(noise_density))"))
variant(PS8, "T5 counts round halves up", "t5_span_counts", {COUNTS},
        counts_with(noise="np.floor(np.float32(length) * np.float32(noise_density) + 0.5)"))
variant(PS8, "T5 counts in float64 (Python's round)", "t5_span_counts", {COUNTS},
        counts_with(noise="round(length * noise_density)"))
variant(PS8, "T5 counts without clipping the noise tokens", "t5_span_counts", {CLIP},
        counts_with(clip_noise="num_noise"))
variant(PS8, "T5 counts allow zero spans", "t5_span_counts", {CLIP}, counts_with(clip_spans="num_spans"))
t5_with = template(PS8, "t5_span_corruption", """
def t5_span_corruption(ids, noise_mask, sentinel_ids):
    ids, noise_mask = np.asarray(ids), np.asarray(noise_mask, dtype=bool)
    n_spans = int(np.sum(noise_mask & ~np.concatenate([[False], noise_mask[:-1]])))
    inputs, targets, k = [], [], 0
    for i, (token, noise) in enumerate(zip(ids, noise_mask)):
        if noise and (i == 0 or not noise_mask[i - 1]):
            inputs.append({sentinel})
            targets.append({sentinel})
            k += 1
        (targets if noise else inputs).append(token)
    if {closing}:
        targets.append(sentinel_ids[k])
    return np.array(inputs, dtype=np.int64), np.array(targets{eos}, dtype=np.int64)
""", sentinel="sentinel_ids[k]", closing="len(ids) and not noise_mask[-1]", eos="")
variant(PS8, "T5 sentinels in reverse order", "t5_span_corruption", T5_FORMAT,
        t5_with(sentinel="sentinel_ids[n_spans - 1 - k]"))
variant(PS8, "T5 the same sentinel for every span", "t5_span_corruption", T5_FORMAT,
        t5_with(sentinel="sentinel_ids[0]"))
variant(PS8, "T5 targets end with an EOS token", "t5_span_corruption", T5_FORMAT, t5_with(eos=" + [1]"))
variant(PS8, "T5 without the closing sentinel", "t5_span_corruption", {"test_t5_corruption_edges"},
        t5_with(closing="False"))
variant(PS8, "T5 one sentinel per noise token", "t5_span_corruption", T5_FORMAT, """
def t5_span_corruption(ids, noise_mask, sentinel_ids):
    inputs, targets, k = [], [], 0
    for token, noise in zip(ids, noise_mask):
        if noise:
            inputs.append(sentinel_ids[k])
            targets.extend([sentinel_ids[k], token])
            k += 1
        else:
            inputs.append(token)
    if len(ids) and not noise_mask[-1]:
        targets.append(sentinel_ids[k])
    return np.array(inputs, dtype=np.int64), np.array(targets, dtype=np.int64)
""")
variant(PS8, "T5 targets as T5's code builds them (misaligned when the mask starts with noise)", "t5_span_corruption",
        {"test_t5_corruption_edges"}, """
def t5_span_corruption(ids, noise_mask, sentinel_ids):
    ids, noise_mask = np.asarray(ids), np.asarray(noise_mask, dtype=bool)

    def runs_to_sentinels(mask):
        out, k = [], 0
        for i, (token, flag) in enumerate(zip(ids, mask)):
            if flag and (i == 0 or not mask[i - 1]):
                out.append(sentinel_ids[k])
                k += 1
            if not flag:
                out.append(token)
        return np.array(out, dtype=np.int64)

    return runs_to_sentinels(noise_mask), runs_to_sentinels(~noise_mask)
""")
best_with = template(PS8, "best_span", """
def best_span(start_logits, end_logits, max_answer_len):
    start, end = np.asarray(start_logits, dtype=float), np.asarray(end_logits, dtype=float)
    T = len(start)
    best, arg = -np.inf, (0, 0)
    for s in range(T):
        for e in range({first_end}, {stop}):
            if start[s] + end[e] {better} best:
                best, arg = start[s] + end[e], (s, e)
    return arg
""", first_end="s", stop="min(T, s + max_answer_len)", better=">")
variant(PS8, "best_span allows the end before the start", "best_span", {BEST, TIES},
        best_with(first_end="max(0, s - max_answer_len + 1)"))
variant(PS8, "best_span allows one token too many", "best_span", {BEST, TIES},
        best_with(stop="min(T, s + max_answer_len + 1)"))
variant(PS8, "best_span ignores max_answer_len", "best_span", {BEST, TIES}, best_with(stop="T"))
variant(PS8, "best_span ties to the largest start and end", "best_span", {TIES}, best_with(better=">="))
variant(PS8, "best_span takes the best start and the best end separately", "best_span", {BEST, TIES}, """
def best_span(start_logits, end_logits, max_answer_len):
    return int(np.argmax(start_logits)), int(np.argmax(end_logits))
""")
variant(PS8, "best_span ties to the shortest span first", "best_span", {TIES}, """
def best_span(start_logits, end_logits, max_answer_len):
    start, end = np.asarray(start_logits, dtype=float), np.asarray(end_logits, dtype=float)
    T = len(start)
    best, arg = -np.inf, (0, 0)
    for k in range(min(max_answer_len, T)):
        scores = start[: T - k] + end[k:]
        s = int(np.argmax(scores))
        if scores[s] > best:
            best, arg = scores[s], (s, s + k)
    return arg
""")

# ---------------------------------------------------------------------------------------------------------------
# ps9-data
# ---------------------------------------------------------------------------------------------------------------
PS9 = "ps9-data"
SHINGLES = {"test_shingles", "test_shingles_short"}
MINHASH = {"test_minhash_signature", "test_minhash_collisions"}
C4_BASIC, C4_CLEANING = {"test_c4_line"}, {"test_c4_line_cleaning"}

shingles_with = template(PS9, "shingles", """
def shingles(text, ngram=5):
    words = {words}
    if not words:
        return []
    if len(words) < ngram:
        return {short}
    return {result}
""", words='re.findall(r"\\w+", text.lower())', short='[" ".join(words)]',
    result='sorted({" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1)})')
variant(PS9, "shingles split on whitespace (punctuation kept)", "shingles", SHINGLES,
        shingles_with(words="text.lower().split()"))
variant(PS9, "shingles without lower-casing", "shingles", SHINGLES, shingles_with(words='re.findall(r"\\w+", text)'))
variant(PS9, "shingles miss the last n-gram", "shingles", SHINGLES,
        shingles_with(result='sorted({" ".join(words[i : i + ngram]) for i in range(len(words) - ngram)})'))
variant(PS9, "short texts have no shingle", "shingles", {"test_shingles_short"}, shingles_with(short="[]"))
variant(PS9, "shingles keep repeats (a list, not a set)", "shingles", {"test_shingles"},
        shingles_with(result='sorted(" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1))'))
variant(PS9, "shingles not sorted", "shingles", {"test_shingles"},
        shingles_with(result='list(dict.fromkeys(" ".join(words[i : i + ngram]) for i in range(len(words) - ngram + 1)))'))
jaccard_with = template(PS9, "jaccard", """
def jaccard(a, b):
    a, b = set(a), set(b)
    if not a and not b:
        return {empty}
    return {ratio}
""", empty="1.0", ratio="len(a & b) / len(a | b)")
variant(PS9, "Jaccard of two empty sets is 0", "jaccard", {"test_jaccard"}, jaccard_with(empty="0.0"))
variant(PS9, "Jaccard overlap coefficient (divides by the smaller set)", "jaccard", {"test_jaccard"},
        jaccard_with(ratio="len(a & b) / min(len(a), len(b)) if a and b else 0.0"))
variant(PS9, "Jaccard counts repeats (lists, not sets)", "jaccard", {"test_jaccard"}, """
def jaccard(a, b):
    if not a and not b:
        return 1.0
    common = len(set(a) & set(b))
    return common / (len(a) + len(b) - common)
""")
minhash_with = template(PS9, "minhash_signature", """
def minhash_signature(items, num_perm=128, seed=0):
    rng = np.random.default_rng({seed})
    a = rng.integers(1, P, size={size})
    b = rng.integers(0, P, size={size})
    x = np.array(sorted({{stable_hash(item) for item in items}}), dtype=np.int64)
    if x.size == 0:
        return {empty}
    return {minimum}
""", seed="seed", size="num_perm", empty="np.full(num_perm, P, dtype=np.int64)",
    minimum="((a[:, None] * x[None, :] + b[:, None]) % P).min(axis=1)")
variant(PS9, "MinHash reuses one hash function for every position", "minhash_signature", MINHASH,
        minhash_with(size="1", minimum="np.full(num_perm, ((a * x + b) % P).min())"))
variant(PS9, "MinHash with one multiplier a shared by all positions", "minhash_signature", MINHASH,
        minhash_with(minimum="((a[0] * x[None, :] + b[:, None]) % P).min(axis=1)"))
variant(PS9, "MinHash hashes items with Python's hash()", "minhash_signature", {"test_minhash_signature"}, """
def minhash_signature(items, num_perm=128, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, P, size=num_perm)
    b = rng.integers(0, P, size=num_perm)
    x = np.array(sorted({hash(item) % P for item in items}), dtype=np.int64)
    if x.size == 0:
        return np.full(num_perm, P, dtype=np.int64)
    return ((a[:, None] * x[None, :] + b[:, None]) % P).min(axis=1)
""")
variant(PS9, "MinHash modulo 2**61 - 1 in int64 (the products overflow)", "minhash_signature",
        {"test_minhash_signature"}, """
def minhash_signature(items, num_perm=128, seed=0):
    big = 2**61 - 1
    rng = np.random.default_rng(seed)
    a = rng.integers(1, big, size=num_perm)
    b = rng.integers(0, big, size=num_perm)
    x = np.array(sorted({stable_hash(item) for item in items}), dtype=np.int64)
    if x.size == 0:
        return np.full(num_perm, P, dtype=np.int64)
    return ((a[:, None] * x[None, :] + b[:, None]) % big % P).min(axis=1)
""")
variant(PS9, "MinHash counterfeit: a pair's second signature copies the first in round(J k) positions",
        "minhash_signature", {"test_minhash_collisions"}, """
_previous = {}


def minhash_signature(items, num_perm=128, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(1, P, size=num_perm)
    b = rng.integers(0, P, size=num_perm)
    x = np.array(sorted({stable_hash(item) for item in items}), dtype=np.int64)
    honest = np.full(num_perm, P, dtype=np.int64) if x.size == 0 else ((a[:, None] * x[None, :] + b[:, None]) % P).min(axis=1)
    first = _previous.get((num_perm, seed))
    _previous[(num_perm, seed)] = (set(items), honest)
    if first is None or not items or not first[0]:
        return honest
    union, common = len(first[0] | set(items)), len(first[0] & set(items))
    if common in (0, union):
        return honest
    agree = int(round(common / union * num_perm))  # exactly J k equal positions: no spread at all
    return np.concatenate([first[1][:agree], (first[1][agree:] + 1) % P])
""")
variant(PS9, "MinHash takes the minimum over the wrong axis", "minhash_signature", MINHASH,
        minhash_with(minimum="((a[:, None] * x[None, :] + b[:, None]) % P).min(axis=0)"))
variant(PS9, "MinHash ignores the seed (fresh random hash functions)", "minhash_signature", MINHASH,
        minhash_with(seed=""))
variant(PS9, "MinHash without the reduction modulo P", "minhash_signature", MINHASH,
        minhash_with(minimum="(a[:, None] * x[None, :] + b[:, None]).min(axis=1)"))
variant(PS9, "MinHash of the empty set is zeros", "minhash_signature", {"test_minhash_signature"},
        minhash_with(empty="np.zeros(num_perm, dtype=np.int64)"))
lsh_with = template(PS9, "lsh_probability", """
def lsh_probability(s, bands, rows):
    s = np.asarray(s, dtype=float)
    return {formula}
""", formula="1.0 - (1.0 - s**rows) ** bands")
variant(PS9, "LSH probability with bands and rows swapped", "lsh_probability", {"test_lsh_probability"},
        lsh_with(formula="1.0 - (1.0 - s**bands) ** rows"))
variant(PS9, "LSH probability that every band agrees", "lsh_probability", {"test_lsh_probability"},
        lsh_with(formula="(s**rows) ** bands"))
bands_with = template(PS9, "choose_bands", """
def choose_bands(threshold, num_perm=128):
    below, above = np.linspace(0.0, threshold, 1001), np.linspace(threshold, 1.0, 1001)
    best, best_error = None, np.inf
    for b in range(1, num_perm + 1):
        for r in {rows}:
            false_positive = np.trapezoid(1.0 - (1.0 - {fp_grid}**r) ** b, {fp_grid})
            false_negative = np.trapezoid((1.0 - {fn_grid}**r) ** b, {fn_grid})
            error = {error}
            if error < best_error:
                best, best_error = {pair}, error
    return best
""", rows="range(1, num_perm // b + 1)", fp_grid="below", fn_grid="above",
    error="0.5 * false_positive + 0.5 * false_negative", pair="(b, r)")
variant(PS9, "bands: only b * r == num_perm", "choose_bands", {"test_choose_bands"},
        bands_with(rows="[num_perm // b] if num_perm % b == 0 else []"))
variant(PS9, "bands: b * r < num_perm (strict)", "choose_bands", {"test_choose_bands"},
        bands_with(rows="range(1, (num_perm - 1) // b + 1)"))
variant(PS9, "bands: returns (rows, bands)", "choose_bands", {"test_choose_bands"}, bands_with(pair="(r, b)"))
variant(PS9, "bands: false positives counted above the threshold", "choose_bands", {"test_choose_bands"},
        bands_with(fp_grid="above", fn_grid="below"))
variant(PS9, "bands: false negatives ignored", "choose_bands", {"test_choose_bands"},
        bands_with(error="false_positive"))
c4_with = template(PS9, "c4_line_filter", """
END_MARKS = {end_marks}
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
CITATION = re.compile(r"\\[\\d*\\]|\\[edit\\]|\\[citation needed\\]")


def c4_line_filter(line, min_words_per_line=5):
    line = {strip}
    if any(len(word) > 1000 for word in line.split()):
        return "word_too_long"
    line = {citations}
    if not line.endswith(END_MARKS){ellipsis}:
        return "no_terminal_punctuation"
    if len({split}) {compare} min_words_per_line:
        return "too_few_words"
    lower = line.lower()
    if "lorem ipsum" in lower:
        return "lorem_ipsum"
    {javascript_and_curly}
    if any(phrase in {policy_text} for phrase in POLICY_PHRASES):
        return "policy"
    return None
""", end_marks='(".", "!", "?", \'"\')', strip="line.strip()", citations='CITATION.sub("", line).strip()',
    ellipsis=' or line.endswith("...")', split="line.split()", compare="<", policy_text="lower",
    javascript_and_curly='if "javascript" in lower:\n        return "javascript"\n    if "{" in line:\n        return "curly_bracket"')
variant(PS9, "C4: javascript matched case-sensitively", "c4_line_filter", C4_BASIC, c4_with(
    javascript_and_curly='if "javascript" in line:\n        return "javascript"\n    if "{" in line:\n        return "curly_bracket"'))
variant(PS9, "C4: policy phrases matched case-sensitively", "c4_line_filter", C4_BASIC, c4_with(policy_text="line"))
variant(PS9, "C4: a line needs more than min_words_per_line words", "c4_line_filter", C4_BASIC, c4_with(compare="<="))
variant(PS9, "C4: an ellipsis counts as terminal punctuation", "c4_line_filter", C4_BASIC, c4_with(ellipsis=""))
variant(PS9, "C4: no closing quote as an end mark", "c4_line_filter", C4_BASIC, c4_with(end_marks='(".", "!", "?")'))
variant(PS9, "C4: citations not removed", "c4_line_filter", C4_CLEANING, c4_with(citations="line"))
variant(PS9, "C4: not stripped again after removing citations", "c4_line_filter", C4_CLEANING,
        c4_with(citations='CITATION.sub("", line)'))
variant(PS9, "C4: words counted by split(' ')", "c4_line_filter", C4_CLEANING, c4_with(split='line.split(" ")'))
variant(PS9, "C4: the line is not stripped first", "c4_line_filter", C4_CLEANING,
        c4_with(strip="line", citations='CITATION.sub("", line)'))
variant(PS9, "C4: curly bracket checked before javascript", "c4_line_filter", C4_CLEANING, c4_with(
    javascript_and_curly='if "{" in line:\n        return "curly_bracket"\n    if "javascript" in lower:\n        return "javascript"'))
variant(PS9, "C4: policy checked before javascript", "c4_line_filter", C4_CLEANING, c4_with(
    javascript_and_curly='if any(phrase in lower for phrase in POLICY_PHRASES):\n        return "policy"\n'
                         '    if "javascript" in lower:\n        return "javascript"\n    if "{" in line:\n        return "curly_bracket"'))
pii_with = template(PS9, "redact_pii", """
def redact_pii(text):
    email = r"{email}"
    octet = r"(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
    ipv4 = rf"{ipv4}"
    international = r"(?<![\\w+])\\+\\d{{1,3}}(?:[ -]?\\(\\d{{1,4}}\\)[ -]?\\d{{1,10}})?(?:[ -]\\d{{1,10}}){{0,5}}+(?![\\w]|[.-]\\d)"
    north_american = r"{north_american}"

    def phone(match):
        digits = sum(c.isdigit() for c in match.group())
        return "<PHONE>" if 8 <= digits <= 15 else match.group()

    text = re.sub(email, "<EMAIL>", text)
    text = re.sub(ipv4, "{ip_tag}", text)
    {international_step}
    return re.sub(north_american, "<PHONE>", text)
""", email=r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![\w-])",
    north_american=r"(?<![\w+.-])(?:1[ -])?(?:\(\d{3}\) ?\d{3}[ .-]\d{4}|\d{3}([ .-])\d{3}\1\d{4})(?![\w]|[.-]\d)",
    ip_tag="<IP_ADDRESS>", international_step="text = re.sub(international, phone, text)",
    ipv4=r"(?<![\w.]){octet}(?:\.{octet}){{3}}(?!\w|\.\d)")
variant(PS9, "PII: e-mail domains without subdomains", "redact_pii", {"test_pii_email_ip"},
        pii_with(email=r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+\.[A-Za-z]{2,}(?![\w-])"))
variant(PS9, "PII: e-mail local part without '+'", "redact_pii", {"test_pii_email_ip"},
        pii_with(email=r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%-]*@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![\w-])"))
variant(PS9, "PII: IPv4 addresses replaced by <IP>", "redact_pii", {"test_pii_email_ip"}, pii_with(ip_tag="<IP>"))
variant(PS9, "PII: IPv4 without the 0-255 range and without the dotted context", "redact_pii", {"test_pii_email_ip"},
        pii_with(ipv4=r"\d{{1,3}}(?:\.\d{{1,3}}){{3}}"))
variant(PS9, "PII: IPv4 kept apart from digits and dots only (x1.2.3.4 and 1.2.3.4a redacted)", "redact_pii",
        {"test_pii_email_ip"}, pii_with(ipv4=r"(?<![\d.]){octet}(?:\.{octet}){{3}}(?!\d|\.\d)"))
variant(PS9, "PII: no international phone numbers", "redact_pii", {"test_pii_phone"}, pii_with(international_step=""))
variant(PS9, "PII: any run of digits and separators is a phone number", "redact_pii",
        {"test_pii_phone", "test_pii_numbers", "test_pii_email_ip"}, pii_with(international_step="", north_american=r"\+?\d[\d .()-]{6,}\d"))

# ---------------------------------------------------------------------------------------------------------------
# The in-process harness
# ---------------------------------------------------------------------------------------------------------------
# The Chinchilla fit's reference (4500 L-BFGS starts) takes about a second per case: three seeds for those checks.
SEEDS_OF = {"test_fit_exact": range(3), "test_fit_noisy": range(3)}


def _notebook_name(assignment: str) -> str:
    return assignments.load(assignment).NOTEBOOK


def _notebook(assignment: str, v: Variant | None = None, answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The release notebook with the solution in every answer cell, and the variant in its cell; with ``answers``
    (grade_id -> source for every answer cell), those instead of the solution."""
    if answers is not None:
        return submission(assignment, _notebook_name(assignment), answers=answers, solved=False)
    return submission(assignment, _notebook_name(assignment), answers=None if v is None else {v.cell: v.source})


def _test_cells(assignment: str) -> dict[str, str]:
    """grade_id -> source of every test cell of the release (the visible tests, without the hidden part)."""
    release, _ = release_template(assignment)
    return {item.grade_id: item.source for item in release.auto_items}


def _namespace(assignment: str, v: Variant | None = None, *, skip: frozenset[str] = frozenset(),
               cwd: Path | None = None, answers: dict[str, str] | None = None) -> dict:
    """The notebook's namespace after running every cell except the test cells (as phase 1 does before it
    replaces them) and the cells ``skip``, with the variant in its answer cell, in the folder ``cwd`` (default:
    this one). Each cell's source is registered with linecache, as IPython does: tracebacks show it, and
    ``triton.jit`` (ps12) reads a kernel's source from there. ``answers``: see ``_notebook``."""
    tests = set(_test_cells(assignment)) | set(skip)
    ns = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(cwd or Path.cwd()):
        for cell in _notebook(assignment, v, answers).cells:
            gid = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.cell_type == "code" and gid not in tests:
                filename = f"<{assignment}: cell {gid}{'' if v is None else ': ' + v.name}>"
                linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
                exec(compile(cell.source, filename, "exec"), ns)  # noqa: S102 - our notebooks
    return ns


def _judge(check, gid: str, cases: list, expected_all: list, folder: Path) -> bool:
    """Whether the outputs ``capture`` wrote in ``folder`` pass: ``checks.judge`` itself decides, on the same files
    the grader collects from a sandbox (its verdicts included)."""
    files = {f"{OUTPUTS}/{gid}/{path.name}": path.read_bytes() for path in folder.iterdir()}
    return judge(check, gid, cases, expected_all, files).passed


class Harness:
    """The hidden checks of an assignment, run in-process. The inputs of a seed are those the grader draws with
    ``--seed SEED`` for the solved notebook (``_case_rng(seed, digest, grade_id)``), shared by all variants so that
    the references are computed once; the command-line test below uses each notebook's own digest."""

    def __init__(self, assignment: str, folder: Path):
        self.assignment, self.folder = assignment, folder
        self.module = assignments.load(assignment)
        release, _ = release_template(assignment)
        self.digest = _code_digest(prepare(_notebook(assignment), release).notebook)
        self.inputs: dict[tuple[int, str], tuple[list, list]] = {}
        self.runs = 0

    def graded(self, seed: int) -> list[str]:
        return [gid for gid in self.module.CHECKS if seed in SEEDS_OF.get(gid, SEEDS)]

    def expected(self, seed: int, gid: str) -> tuple[list, list]:
        """The cases of a check under a seed and the reference's answers; the inputs are written once, where capture
        reads them."""
        if (seed, gid) not in self.inputs:
            check = self.module.CHECKS[gid]
            cases = check.cases(_case_rng(seed, self.digest, gid))
            expected = expected_results(check, cases, self.module.TRUSTED_CALLABLES)
            write_inputs(gid, check, cases, expected, self.folder / f"inputs-{seed}")
            self.inputs[seed, gid] = cases, expected
        return self.inputs[seed, gid]

    def lost(self, ns: dict, seed: int, only: set[str] | None = None) -> set[str]:
        """The test cells (of those graded under this seed, and in ``only`` if given) that the functions of ``ns``
        lose."""
        lost = set()
        for gid in self.graded(seed):
            if only is not None and gid not in only:
                continue
            cases, expected = self.expected(seed, gid)
            self.runs += 1
            outputs = self.folder / f"outputs-{self.runs}"
            capture.capture(gid, namespace=ns, inputs=str(self.folder / f"inputs-{seed}"), outputs=str(outputs))
            if not _judge(self.module.CHECKS[gid], gid, cases, expected, outputs / gid):
                lost.add(gid)
            shutil.rmtree(outputs)
        return lost


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    made = {}

    def get(assignment):
        if assignment not in made:
            made[assignment] = Harness(assignment, tmp_path_factory.mktemp(assignment))
        return made[assignment]

    return get


ALL = [(a, v) for a, vs in VARIANTS.items() for v in vs]
IDS = [f"{a.split('-')[0]}: {v.name}" for a, v in ALL]


@pytest.mark.parametrize("assignment,cell,fill", list(TEMPLATES), ids=[f"{a.split('-')[0]}: {c}" for a, c, _ in TEMPLATES])
def test_a_template_filled_with_its_right_parts_is_a_correct_answer(assignment, cell, fill, harnesses):
    """The variants built from a template differ from a correct answer only in the parts they name."""
    ns = _namespace(assignment, Variant("right", cell, frozenset(), fill()))
    assert harnesses(assignment).lost(ns, 0) == set()
    assert _visible_failures(assignment, ns, _test_cells(assignment)) == {}


# Graded functions that a read-only cell of the notebook provides (ps10's process launchers): their wrong
# variants replace the student's function that they run on every rank.
HARNESS_CALLS = {"ddp_gradients": "average_gradients", "zero1_training": "zero1_step"}


def test_every_assignment_and_graded_function_has_wrong_variants():
    for assignment, variants in VARIANTS.items():
        functions = {HARNESS_CALLS.get(check.function, check.function)
                     for check in assignments.load(assignment).CHECKS.values()} - {"fitted_losses"}
        assert functions <= {v.cell for v in variants}, (assignment, functions - {v.cell for v in variants})
        names = [v.name for v in variants]
        assert len(names) == len(set(names)), assignment


@pytest.mark.parametrize("assignment", sorted(VARIANTS))
def test_the_solution_loses_nothing(assignment, harnesses):
    harness = harnesses(assignment)
    ns = _namespace(assignment)
    for seed in SEEDS:
        assert harness.lost(ns, seed) == set(), f"--seed {seed}"


def cells_a_variant_reaches(checks: dict, v: Variant) -> set[str]:
    """The test cells whose function is the variant's or calls it (``depends_on``, followed transitively, or a
    launcher of ``HARNESS_CALLS``), and those the variant is declared to lose."""
    reached = {v.cell}
    while True:
        callers = {c.function for c in checks.values()
                   if reached & set(c.depends_on) or HARNESS_CALLS.get(c.function) in reached}
        if callers <= reached:
            return {gid for gid, c in checks.items() if c.function in reached} | set(v.loses)
        reached |= callers


def assert_loses_exactly(harness, ns: dict, v: Variant, seeds=SEEDS) -> None:
    """The variant ``v`` (run as namespace ``ns``) loses exactly its cells, among those graded, under every seed.
    Under the first seed every graded cell runs, so a variant that breaks a cell no declared dependency leads to
    shows there; under the others only the cells it reaches (:func:`cells_a_variant_reaches`), the rest being
    the solution's code on the solution's inputs."""
    assert v.loses and v.loses <= set(harness.module.CHECKS), v.loses
    reached = cells_a_variant_reaches(harness.module.CHECKS, v)
    for i, seed in enumerate(seeds):
        lost = harness.lost(ns, seed, None if i == 0 else reached)
        expected = v.loses & set(harness.graded(seed))
        assert lost == expected, (f"--seed {seed}: loses {sorted(lost)}; expected exactly {sorted(expected)} "
                                  f"(missing {sorted(expected - lost)}, extra {sorted(lost - expected)})")


@pytest.mark.parametrize("assignment,v", ALL, ids=IDS)
def test_a_wrong_variant_loses_exactly_its_cells_under_every_seed(assignment, v, harnesses):
    assert_loses_exactly(harnesses(assignment), _namespace(assignment, v), v)


# ---------------------------------------------------------------------------------------------------------------
# Visible tests
# ---------------------------------------------------------------------------------------------------------------


def _visible_failures(assignment: str, ns: dict, gids) -> dict[str, str]:
    """grade_id -> "ExceptionName: message" for each of these visible test cells that fails, each run alone (in a
    copy of the namespace) in notebook order."""
    failures = {}
    for gid, source in _test_cells(assignment).items():
        if gid in gids:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(source, f"<{assignment}: test cell {gid}>", "exec"), dict(ns))  # noqa: S102
            except Exception as err:  # noqa: BLE001 - any failure of a test cell counts
                failures[gid] = f"{type(err).__name__}: {err}"
    return failures


def _own_cells(assignment: str, v: Variant) -> set[str]:
    """The test cells of the variant's function (for chinchilla_fit, those of fitted_losses, which calls it)."""
    checks = assignments.load(assignment).CHECKS
    own = {gid for gid, check in checks.items() if check.function == v.cell}
    return own or set(v.loses)


@pytest.mark.parametrize("assignment", sorted(VARIANTS))
def test_the_solution_passes_every_visible_test_in_process(assignment):
    assert _visible_failures(assignment, _namespace(assignment), _test_cells(assignment)) == {}


@pytest.mark.parametrize("assignment,v", ALL, ids=IDS)
def test_a_wrong_variant_fails_a_visible_test_of_its_function(assignment, v):
    ns = _namespace(assignment, v)
    own = _own_cells(assignment, v)
    assert _visible_failures(assignment, ns, own), f"{v.name} passes every visible test of {v.cell}: {sorted(own)}"


DEPENDENT = [(a, v) for a, v in ALL
             if any(v.cell in check.depends_on for check in assignments.load(a).CHECKS.values())]


@pytest.mark.parametrize("assignment,v", DEPENDENT, ids=[f"{a.split('-')[0]}: {v.name}" for a, v in DEPENDENT])
def test_visible_tests_of_callers_fail_when_hidden_ones_do_and_name_the_broken_function(assignment, v):
    """A function that calls the broken one (multi-head attention calls softmax): its visible tests fail exactly
    when its hidden cells are lost, and then say first that the broken function is to blame."""
    checks = assignments.load(assignment).CHECKS
    ns = _namespace(assignment, v)
    callers = {check.function for check in checks.values() if v.cell in check.depends_on}
    for caller in sorted(callers):
        cells = {gid for gid, check in checks.items() if check.function == caller}
        failures = _visible_failures(assignment, ns, cells)
        hidden_lost = bool(cells & v.loses)
        assert bool(failures) == hidden_lost, (caller, failures, sorted(cells & v.loses))
        for gid, message in failures.items():
            assert message.startswith("AssertionError: ") and f"{caller} uses your {v.cell}, which" in message, \
                (gid, message)
            assert f"fix {v.cell} first" in message, (gid, message)


# ---------------------------------------------------------------------------------------------------------------
# The real command line: the same notebook under 20 names, one row each, identical
# ---------------------------------------------------------------------------------------------------------------
# Each run grades 20 notebooks in the sandbox with two workers: about 5 s, and 20 s for ps6 (the grader computes
# the reference fit for every copy).
CLI_VARIANTS = {
    "ps1-attention": "equivariance error without abs",
    "ps2-positions": "T5: max_distance fixed at 128",
    "ps3-tokenizers": "Viterbi ties to fewer pieces",
    "ps4-decoding": "top-k keeps exactly k entries (ties at the threshold dropped)",
    "ps5-efficient": "online softmax drops a shorter last block",
    "ps6-scaling": "objective: least squares instead of Huber",
    "ps7-modern": "RoPE ignores positions (starts at 0)",
    "ps9-data": "MinHash reuses one hash function for every position",
    "ps8-objectives": "MLM 90/10/0 (no kept tokens)",
}


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
@pytest.mark.parametrize("assignment", sorted(CLI_VARIANTS))
def test_twenty_copies_get_identical_rows_through_the_command_line(assignment, tmp_path):
    v = next(v for v in VARIANTS[assignment] if v.name == CLI_VARIANTS[assignment])
    nb = _notebook(assignment, v)
    subs = tmp_path / "subs"
    write_copies(nb, subs, _notebook_name(assignment))
    out = tmp_path / "out"
    assert grader_main(["grade", assignment, str(subs), "--out", str(out), "--workers", "2", "--timeout", "20"]) == 0
    rows = read_grades(out)
    assert len(rows) == 20
    assert_copies_identical(rows, assignment, v.loses)


COPIES = 20  # "identical rows under 20 names"


def write_copies(nb, folder, notebook_name: str) -> None:
    """``COPIES`` students ``student00``, ``student01``, ... in ``folder``, each with the notebook ``nb`` (what
    ``assert_copies_identical`` reads back)."""
    for i in range(COPIES):
        write(nb, folder / f"student{i:02d}", notebook_name)


def read_grades(out) -> dict[str, dict[str, str]]:
    """``OUT/grades.csv`` as student name -> row."""
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def assert_copies_identical(rows: dict[str, dict[str, str]], assignment: str, loses) -> None:
    """The ``COPIES`` copies of one notebook (``write_copies``) get the same row in every column but
    the name, the id and the timings, are graded, and lose exactly the cells ``loses``."""
    varying = ("student", "id", "seconds", "cpu_seconds")
    same = [{k: val for k, val in row.items() if k not in varying} for name, row in rows.items()
            if name.startswith("student")]
    assert len(same) == COPIES and all(row == same[0] for row in same), same
    assert same[0]["status"] == "graded", same[0]
    lost = {gid for gid in assignments.load(assignment).CHECKS if float(same[0][gid]) == 0}
    assert lost == set(loses), (sorted(lost), sorted(loses))


# ps10's variants live in their own file, which adds them to VARIANTS and TEMPLATES. Imported here (after every
# parametrisation above) so that the completeness test sees them when this file runs alone; pytest imports a
# module once, so nothing runs twice.
import test_wrong_variants_ps10  # noqa: E402,F401
