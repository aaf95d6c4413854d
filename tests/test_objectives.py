"""llmarch.objectives: masking statistics against their binomial bounds and against transformers'
DataCollatorForLanguageModeling, the MLM loss against F.cross_entropy and a loop, T5's counts against the
official float32 / half-to-even formulas and the paper's Fig. 2, best_span against brute force, and the
invariants of SpanBERT, BART, NSP and ELECTRA examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from llmarch.objectives import (
    IGNORE_INDEX,
    best_span,
    document_rotation,
    electra_corrupt,
    electra_labels,
    mlm_loss,
    mlm_mask,
    nsp_pairs,
    random_spans_noise_mask,
    sentence_permutation,
    span_boundary_targets,
    span_corruption_from_mask,
    span_length_distribution,
    span_mask,
    t5_span_corruption,
    t5_span_counts,
    text_infilling,
    token_deletion,
    token_masking,
)

SIGMAS = 5.0  # statistical tests: a correct implementation fails one with probability below 1e-6


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_rate(count: int, n: int, p: float, what: str) -> None:
    """``count`` successes of ``n`` Bernoulli(p) trials lie within SIGMAS standard deviations of ``n p``."""
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= SIGMAS * sd + 1e-9, \
        f"{what}: {count} of {n}, expected {n * p:.1f} +- {SIGMAS * sd:.1f}"


def selection_stats(ids, inputs, labels, special, mask_id):
    """(non-special tokens, selected, selected -> mask_id, selected and unchanged, selected -> another id)."""
    selected = labels != IGNORE_INDEX
    eligible = ~special
    return (int(eligible.sum()), int(selected.sum()), int((selected & (inputs == mask_id)).sum()),
            int((selected & (inputs == ids)).sum()), int((selected & (inputs != ids) & (inputs != mask_id)).sum()))


# ---------------------------------------------------------------------------------------------------------
# Masked language modelling
# ---------------------------------------------------------------------------------------------------------

def test_mlm_mask_rates_and_80_10_10_split_are_within_binomial_bounds():
    vocab, mask_id = 1000, 3
    g = gen(1)
    ids = torch.randint(5, vocab, (256, 512), generator=g)  # never the mask id
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    special[:, 400:] |= torch.rand(256, 112, generator=g) < 0.5  # padding-like specials
    ids[special] = 0
    inputs, labels = mlm_mask(ids, mask_id, vocab, special, mask_prob=0.15, generator=gen(2))
    n, k, masked, kept, other = selection_stats(ids, inputs, labels, special, mask_id)
    assert_rate(k, n, 0.15, "selected non-special tokens")
    # a random replacement is uniform on [0, V): it can draw the mask id or the original token
    assert_rate(masked, k, 0.8 + 0.1 / vocab, "selected -> [MASK]")
    assert_rate(kept, k, 0.1 + 0.1 / vocab, "selected and unchanged")
    assert_rate(other, k, 0.1 * (vocab - 2) / vocab, "selected -> random other token")


def test_mlm_mask_invariants():
    vocab, mask_id = 50, 4
    ids = torch.randint(5, vocab, (1000, 40), generator=gen(3))
    special = torch.rand(1000, 40, generator=gen(4)) < 0.2
    inputs, labels = mlm_mask(ids, mask_id, vocab, special, mask_prob=0.4, generator=gen(5))
    selected = labels != IGNORE_INDEX
    assert inputs.shape == labels.shape == ids.shape and inputs.dtype == labels.dtype == ids.dtype
    assert not (selected & special).any(), "special tokens are never selected"
    assert torch.equal(labels[selected], ids[selected]), "labels hold the original token where selected"
    assert (labels[~selected] == -100).all(), "labels are -100 exactly where not selected"
    assert torch.equal(inputs[~selected], ids[~selected]), "unselected tokens are unchanged"
    assert int(inputs.min()) >= 0 and int(inputs.max()) < vocab
    # random replacements cover the whole vocabulary [0, V), specials included
    random_ids = inputs[selected & (inputs != ids) & (inputs != mask_id)]
    assert set(random_ids.tolist()) == set(range(vocab)) - {mask_id}
    # the extremes: nothing, and every non-special token
    none_in, none_lab = mlm_mask(ids, mask_id, vocab, special, mask_prob=0.0, generator=gen(6))
    assert torch.equal(none_in, ids) and (none_lab == -100).all()
    _, all_lab = mlm_mask(ids, mask_id, vocab, special, mask_prob=1.0, generator=gen(6))
    assert torch.equal(all_lab != -100, ~special)
    # reproducible from the generator, and the 1-D case works
    a = mlm_mask(ids[0], mask_id, vocab, generator=gen(7))
    b = mlm_mask(ids[0], mask_id, vocab, generator=gen(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[0].shape == (40,)


def test_mlm_mask_all_mask_option_for_electra():
    ids = torch.randint(5, 100, (32, 64), generator=gen(8))
    inputs, labels = mlm_mask(ids, 4, 100, mask_prob=0.3, generator=gen(9), mask_replace_prob=1.0,
                              random_replace_prob=0.0)
    selected = labels != -100
    assert (inputs[selected] == 4).all() and torch.equal(inputs[~selected], ids[~selected])


def _wordlevel_tokenizer(n_words: int):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(n_words)])}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                  sep_token="[SEP]", mask_token="[MASK]")


def test_mlm_mask_matches_the_rates_of_transformers_data_collator():
    """transformers' DataCollatorForLanguageModeling implements BERT's 80/10/10 on a tokenizer's specials; on
    the same batch both give statistically indistinguishable rates, and both match the theory."""
    pytest.importorskip("transformers")
    from transformers import DataCollatorForLanguageModeling

    tokenizer = _wordlevel_tokenizer(45)
    vocab, mask_id = len(tokenizer), tokenizer.mask_token_id
    assert vocab == 50 and mask_id == 4
    words = torch.randint(5, vocab, (256, 126), generator=gen(10))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids = torch.cat([torch.full((256, 1), cls), words, torch.full((256, 1), sep)], dim=1)
    special = (ids == cls) | (ids == sep)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=11, return_tensors="pt")
    batch = collator([{"input_ids": row.tolist()} for row in ids])
    ours = mlm_mask(ids, mask_id, vocab, special, mask_prob=0.15, generator=gen(12))
    stats = {"transformers": selection_stats(ids, batch["input_ids"], batch["labels"], special, mask_id),
             "llmarch": selection_stats(ids, *ours, special, mask_id)}
    expected = {"selected": 0.15, "[MASK]": 0.8 + 0.1 / vocab, "kept": 0.1 + 0.1 / vocab,
                "other": 0.1 * (vocab - 2) / vocab}
    for who, (n, k, masked, kept, other) in stats.items():
        for what, count, total in (("selected", k, n), ("[MASK]", masked, k), ("kept", kept, k), ("other", other, k)):
            assert_rate(count, total, expected[what], f"{who}: {what}")
    (n1, k1, *c1), (n2, k2, *c2) = stats.values()
    for what, a, b in zip(("[MASK]", "kept", "other"), c1, c2):  # two-sample comparison of the proportions
        p = (a + b) / (k1 + k2)
        sd = math.sqrt(p * (1 - p) * (1 / k1 + 1 / k2))
        assert abs(a / k1 - b / k2) <= SIGMAS * sd, what


def test_mlm_loss_equals_cross_entropy_and_a_loop_over_selected_positions():
    g = gen(13)
    logits = torch.randn(3, 7, 11, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (3, 7), generator=g)
    labels[torch.rand(3, 7, generator=g) < 0.6] = -100
    labels[0, 0] = 5
    loss = mlm_loss(logits, labels)
    reference = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), ignore_index=-100)
    terms = [-(logits[b, t, labels[b, t]] - torch.logsumexp(logits[b, t], 0))
             for b in range(3) for t in range(7) if labels[b, t] != -100]
    assert torch.allclose(loss, reference, rtol=1e-12, atol=0)
    assert torch.allclose(loss, torch.stack(terms).mean(), rtol=1e-12, atol=0)
    # unselected positions get no gradient, and their logits do not change the loss
    logits.requires_grad_(True)
    mlm_loss(logits, labels).backward()
    assert (logits.grad[labels == -100] == 0).all() and logits.grad[labels != -100].abs().sum() > 0
    # stable for large logits
    big = torch.tensor([[1000.0, 0.0], [0.0, 1000.0]])
    assert torch.allclose(mlm_loss(big, torch.tensor([0, 0])), torch.tensor(500.0))


# ---------------------------------------------------------------------------------------------------------
# SpanBERT
# ---------------------------------------------------------------------------------------------------------

def test_span_length_distribution_has_the_mean_that_spanbert_quotes():
    probs = span_length_distribution(0.2, 10)
    lengths = torch.arange(1, 11, dtype=torch.float64)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float((probs * lengths).sum()) == pytest.approx(3.8, abs=0.005)  # Joshi et al. (2020), section 3.1
    assert float(probs[0]) == pytest.approx(0.2 / (1 - 0.8**10), rel=1e-12)
    assert torch.allclose(probs[1:] / probs[:-1], torch.full((9,), 0.8, dtype=torch.float64))


def _word_ids(word_starts):
    return torch.cumsum(word_starts.long(), dim=-1)


def test_span_mask_masks_whole_words_within_its_budget():
    g = gen(14)
    vocab, mask_id = 500, 3
    ids = torch.randint(5, vocab, (200, 60), generator=g)
    word_starts = torch.rand(200, 60, generator=g) < 0.6
    special = torch.zeros_like(word_starts)
    special[:, 0] = special[:, -1] = True
    special[:, 30] = True
    word_starts |= special
    word_starts[:, 31] = True
    inputs, labels = span_mask(ids, mask_id, vocab, word_starts, special, generator=gen(15))
    selected = labels != -100
    assert not (selected & special).any()
    assert torch.equal(labels[selected], ids[selected]) and torch.equal(inputs[~selected], ids[~selected])
    word = _word_ids(word_starts)
    for b in range(200):
        for w in torch.unique(word[b][selected[b]]).tolist():
            in_word = (word[b] == w) & ~special[b]
            assert selected[b][in_word].all(), "a word is masked whole or not at all"
        n = int((~special[b]).sum())
        budget = math.ceil(0.15 * n - 1e-9)
        longest = int(torch.bincount(word[b][~special[b]]).max())
        assert budget <= int(selected[b].sum()) <= budget + longest - 1


def _runs(flags):
    runs, start = [], None
    for i, f in enumerate(flags.tolist() + [False]):
        if f and start is None:
            start = i
        if not f and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_span_mask_decides_80_10_10_per_span():
    vocab, mask_id = 5000, 3
    ids = torch.randint(5, vocab, (400, 100), generator=gen(16))
    inputs, labels = span_mask(ids, mask_id, vocab, generator=gen(17))
    counts = {"mask": 0, "kept": 0, "random": 0}
    for b in range(400):
        for s, e in _runs(labels[b] != -100):
            piece, original = inputs[b, s:e], ids[b, s:e]
            if (piece == mask_id).all():
                counts["mask"] += 1
            elif torch.equal(piece, original):
                counts["kept"] += 1
            else:
                assert not (piece == mask_id).any() and (piece != original).all(), "one decision per span"
                counts["random"] += 1
    n = sum(counts.values())
    assert_rate(counts["mask"], n, 0.8, "spans -> [MASK]")
    assert_rate(counts["kept"], n, 0.1, "spans kept")


def test_span_mask_span_lengths_follow_the_truncated_geometric():
    """At low density spans rarely touch, so the masked runs (single-token words) average about 3.8 words:
    far from the untruncated geometric (5) and from clipping at 10 (4.46)."""
    ids = torch.randint(5, 100, (100, 1000), generator=gen(18))
    _, labels = span_mask(ids, 3, 100, mask_prob=0.05, generator=gen(19))
    lengths = [e - s for b in range(100) for s, e in _runs(labels[b] != -100)]
    assert 3.5 < np.mean(lengths) < 4.1, np.mean(lengths)
    assert max(lengths) <= 20  # at most two touching spans at this density in practice


def test_span_boundary_targets_worked_example():
    labels = torch.tensor([9, -100, 5, 6, -100, 7, -100, 8])  # the runs at both ends have no outer boundary
    t = span_boundary_targets(labels)
    assert t.position.tolist() == [2, 3, 5]
    assert t.left.tolist() == [1, 1, 4] and t.right.tolist() == [4, 4, 6]
    assert t.offset.tolist() == [0, 1, 0] and t.target.tolist() == [5, 6, 7] and t.batch.tolist() == [0, 0, 0]
    batched = span_boundary_targets(torch.stack([labels, torch.full((8,), -100)]).flip(0))
    assert batched.batch.tolist() == [1, 1, 1]


# ---------------------------------------------------------------------------------------------------------
# ELECTRA and NSP
# ---------------------------------------------------------------------------------------------------------

def test_electra_labels_count_a_sample_equal_to_the_original_as_original():
    original = torch.tensor([[5, 6, 7, 8]])
    corrupted = torch.tensor([[5, 9, 7, 1]])
    assert electra_labels(original, corrupted).tolist() == [[0, 1, 0, 1]]


def test_electra_corrupt_samples_the_generator_at_selected_positions():
    vocab = 6
    ids = torch.tensor([0, 1, 2, 3] * 500)
    labels = torch.where(torch.arange(2000) % 4 == 0, ids, torch.full_like(ids, -100))
    logits = torch.full((2000, vocab), -1e9)
    logits[:, 0] = 0.0  # position % 4 == 0: the generator predicts the original token 0 ...
    logits[:, 5] = math.log(3.0)  # ... with probability 1/4, and token 5 with probability 3/4
    corrupted, rtd = electra_corrupt(ids, labels, logits, generator=gen(20))
    selected = labels != -100
    assert torch.equal(corrupted[~selected], ids[~selected]) and (rtd[~selected] == 0).all()
    assert set(corrupted[selected].tolist()) <= {0, 5}
    assert torch.equal(rtd, (corrupted != ids).long())
    assert_rate(int(rtd.sum()), int(selected.sum()), 0.75, "replaced tokens")


def test_nsp_pairs_format_and_50_50_split():
    docs = [[torch.arange(100 * d + 10 * s, 100 * d + 10 * s + 2 + s % 3) for s in range(6)] for d in range(8)]
    pairs = nsp_pairs(docs, cls_id=1, sep_id=2, generator=gen(21))
    assert len(pairs) == 8 * 5
    where = {tuple(s.tolist()): (d, i) for d, doc in enumerate(docs) for i, s in enumerate(doc)}
    for ex in pairs:
        ids, types = ex.input_ids.tolist(), ex.token_type_ids.tolist()
        assert ids[0] == 1 and ids[-1] == 2 and ids.count(2) == 2
        cut = ids.index(2)
        a, b = tuple(ids[1:cut]), tuple(ids[cut + 1:-1])
        assert types == [0] * (cut + 1) + [1] * (len(ids) - cut - 1)
        (da, ia), (db, ib) = where[a], where[b]
        if ex.next_sentence_label == 0:
            assert (db, ib) == (da, ia + 1)
        else:
            assert ex.next_sentence_label == 1 and db != da
    many = nsp_pairs(docs * 25, 1, 2, generator=gen(22))
    assert_rate(sum(ex.next_sentence_label == 0 for ex in many), len(many), 0.5, "IsNext pairs")


# ---------------------------------------------------------------------------------------------------------
# BART
# ---------------------------------------------------------------------------------------------------------

def test_token_masking_and_deletion():
    ids = torch.arange(10, 20010)
    masked = token_masking(ids, 0, 0.2, generator=gen(23))
    assert torch.equal(masked[masked != 0], ids[masked != 0])
    assert_rate(int((masked == 0).sum()), 20000, 0.2, "masked tokens")
    kept = token_deletion(ids, 0.3, generator=gen(24))
    assert (torch.diff(kept) > 0).all() and set(kept.tolist()) <= set(ids.tolist()), "deletion keeps the order"
    assert_rate(20000 - len(kept), 20000, 0.3, "deleted tokens")


def test_text_infilling_replaces_each_poisson_span_by_one_mask():
    mask_id, n_docs, length = 0, 400, 200
    masked_tokens = spans = insertions = 0
    for d in range(n_docs):
        ids = torch.arange(1, length + 1)
        out = text_infilling(ids, mask_id, mask_ratio=0.3, poisson_lambda=3.0, generator=gen(100 + d)).tolist()
        kept = [t for t in out if t != mask_id]
        assert all(a < b for a, b in zip(kept, kept[1:])), "the kept tokens keep their order"
        # between two neighbouring kept tokens (and at the ends) a gap in the ids needs at least one mask
        padded, masks_between = [0] + out + [length + 1], 0
        previous = 0
        for t in padded[1:]:
            if t == mask_id:
                masks_between += 1
                continue
            if t - previous > 1:
                assert masks_between >= 1, "a removed run is always marked"
            if masks_between and t - previous == 1:
                insertions += masks_between  # a mask where nothing is missing: a 0-length span
            previous, masks_between = t, 0
        masked_tokens += length - len(kept)
        spans += out.count(mask_id)
        assert length - len(kept) >= math.ceil(0.3 * length)
    # Wald's identity: total masked tokens / number of spans -> lambda
    mean = masked_tokens / spans
    assert abs(mean - 3.0) < SIGMAS * math.sqrt(3.0 / spans), mean
    assert insertions > 0, "0-length spans insert a mask"


def test_sentence_permutation_permutes_whole_sentences_uniformly():
    full_stop = 0
    ids = torch.tensor([1, 2, 0, 3, 0, 4, 5, 6, 0])
    sentences = {(1, 2, 0), (3, 0), (4, 5, 6, 0)}
    orders = {}
    for seed in range(1200):
        out = sentence_permutation(ids, full_stop, generator=gen(seed)).tolist()
        pieces, piece = [], []
        for t in out:
            piece.append(t)
            if t == full_stop:
                pieces.append(tuple(piece))
                piece = []
        assert not piece and set(pieces) == sentences and len(pieces) == 3
        orders[tuple(pieces)] = orders.get(tuple(pieces), 0) + 1
    assert len(orders) == 6
    for count in orders.values():
        assert_rate(count, 1200, 1 / 6, "an order of the three sentences")
    # a last piece without a full stop is a sentence too
    tails = {tuple(sentence_permutation(torch.tensor([1, 0, 2, 3]), [0], generator=gen(s)).tolist()) for s in range(40)}
    assert tails == {(1, 0, 2, 3), (2, 3, 1, 0)}


def test_document_rotation_is_a_uniform_rotation():
    ids = torch.arange(7)
    firsts = []
    for seed in range(1400):
        out = document_rotation(ids, generator=gen(seed))
        k = int(out[0])
        assert torch.equal(out, torch.roll(ids, -k))
        firsts.append(k)
    for k in range(7):
        assert_rate(firsts.count(k), 1400, 1 / 7, f"rotation to start {k}")


# ---------------------------------------------------------------------------------------------------------
# T5
# ---------------------------------------------------------------------------------------------------------

def t5_counts_by_hand(length, density, mean):
    """T5's formulas as its TensorFlow code evaluates them: float32 arithmetic, tf.round = half to even."""
    noise = int(np.round(np.float32(length) * np.float32(density)))
    noise = min(max(noise, 1), length - 1)
    spans = int(np.round(np.float32(noise) / np.float32(mean)))
    return noise, max(spans, 1)


@pytest.mark.parametrize("length,density,mean,expected", [
    (10, 0.15, 3.0, (2, 1)),    # 1.5 -> 2 (half to even)
    (30, 0.15, 3.0, (4, 1)),    # 4.5 -> 4 (half to even), 4 / 3 -> 1
    (50, 0.15, 3.0, (8, 3)),    # 7.5 -> 8, 8 / 3 = 2.67 -> 3
    (190, 0.15, 3.0, (29, 10)),  # float32: 28.500002 -> 29 (Python's round(190 * 0.15) gives 28)
    (512, 0.15, 3.0, (77, 26)),  # 76.8 -> 77, 25.67 -> 26
    (5, 0.01, 3.0, (1, 1)),     # at least one noise token and one span
    (4, 0.99, 1.0, (3, 3)),     # at most length - 1 noise tokens
    (20, 0.5, 4.0, (10, 2)),    # 2.5 -> 2 (half to even)
])
def test_t5_counts_worked_examples(length, density, mean, expected):
    assert t5_span_counts(length, density, mean) == expected


def test_t5_counts_match_the_formulas_on_a_grid():
    for length in range(2, 400):
        for density in (0.05, 0.1, 0.15, 0.2, 0.3, 0.35, 0.5, 0.7, 0.9):
            for mean in (1.0, 2.0, 3.0, 3.5, 5.0):
                assert t5_span_counts(length, density, mean) == t5_counts_by_hand(length, density, mean), \
                    (length, density, mean)


@pytest.mark.parametrize("length,density,mean", [(10, 0.15, 3.0), (31, 0.15, 3.0), (100, 0.3, 2.0), (512, 0.15, 3.0),
                                                 (57, 0.5, 1.0)])
def test_random_spans_noise_mask_has_the_counts_and_alternates_from_non_noise(length, density, mean):
    num_noise, num_spans = t5_counts_by_hand(length, density, mean)
    for seed in range(20):
        mask = random_spans_noise_mask(length, density, mean, generator=gen(seed))
        assert mask.shape == (length,) and mask.dtype == torch.bool
        assert int(mask.sum()) == num_noise
        assert not bool(mask[0]) and bool(mask[-1]), "non-noise first, noise last"
        assert len(_runs(mask)) == num_spans and len(_runs(~mask)) == num_spans


def test_random_spans_noise_mask_draws_every_mask_equally_often():
    """L = 10, density 0.4, mean 2: 4 noise tokens in 2 spans (3 ways), 6 others in 2 spans (5 ways): 15 masks."""
    every = set()
    for noise in ([1, 3], [2, 2], [3, 1]):
        for other in ([1, 5], [2, 4], [3, 3], [4, 2], [5, 1]):
            every.add(tuple([False] * other[0] + [True] * noise[0] + [False] * other[1] + [True] * noise[1]))
    counts = dict.fromkeys(every, 0)
    n = 4500
    g = gen(25)
    for _ in range(n):
        counts[tuple(random_spans_noise_mask(10, 0.4, 2.0, generator=g).tolist())] += 1  # KeyError if not one of them
    for count in counts.values():
        assert_rate(count, n, 1 / 15, "one of the 15 masks")


def test_random_roll_rotates_every_mask_by_a_uniform_offset():
    """L = 10, density 0.4, mean 2, rolled: each of the 15 masks above, rotated by each of the 10 offsets
    (T5's ``tf.roll``), is equally likely; counted over the 150 pairs (several pairs give one rolled mask)."""
    unrolled = set()
    for noise in ([1, 3], [2, 2], [3, 1]):
        for other in ([1, 5], [2, 4], [3, 3], [4, 2], [5, 1]):
            unrolled.add(tuple([False] * other[0] + [True] * noise[0] + [False] * other[1] + [True] * noise[1]))
    expected = {}
    for mask in unrolled:
        for k in range(10):
            rolled = mask[-k:] + mask[:-k] if k else mask
            expected[rolled] = expected.get(rolled, 0) + 1 / 150
    counts = dict.fromkeys(expected, 0)
    n, g = 6000, gen(27)
    for _ in range(n):
        counts[tuple(random_spans_noise_mask(10, 0.4, 2.0, generator=g, random_roll=True).tolist())] += 1
    for mask, p in expected.items():
        assert_rate(counts[mask], n, p, f"rolled mask {mask}")
    assert random_spans_noise_mask(10, 0.4, 2.0, generator=gen(1), random_roll=False).tolist() == \
        random_spans_noise_mask(10, 0.4, 2.0, generator=gen(1)).tolist()       # the default does not roll
    with pytest.raises(ValueError, match="one sequence"):
        t5_span_corruption(torch.arange(20).reshape(2, 10), sentinel_ids=[90, 91, 92], random_roll=True)
    inputs, targets = t5_span_corruption(torch.arange(40), sentinel_ids=list(range(90, 99)), generator=gen(2),
                                         random_roll=True)
    assert _fill_sentinels(inputs.tolist(), targets.tolist(), set(range(90, 99))) == list(range(40))


def _fill_sentinels(inputs, targets, sentinels):
    """Rebuild the original from T5's inputs and targets (the decoder's job)."""
    spans, current = {}, None
    for t in targets:
        if t in sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in inputs:
        out.extend(spans[t] if t in sentinels else [t])
    return out


def test_t5_span_corruption_round_trip_order_and_lengths():
    sentinels = list(range(999, 949, -1))  # like <extra_id_0> = the top of the vocabulary, then downwards
    for length, density in ((12, 0.15), (64, 0.15), (200, 0.3), (33, 0.5)):
        num_noise, num_spans = t5_counts_by_hand(length, density, 3.0)
        ids = torch.randint(0, 900, (length,), generator=gen(length))
        inputs, targets = t5_span_corruption(ids, density, 3.0, sentinel_ids=sentinels, generator=gen(26))
        inputs, targets = inputs.tolist(), targets.tolist()
        assert len(inputs) == length - num_noise + num_spans and len(targets) == num_noise + num_spans
        assert [t for t in inputs if t in sentinels] == sentinels[:num_spans], "sentinels in order in the inputs"
        assert [t for t in targets if t in sentinels] == sentinels[:num_spans], "... and in the targets"
        assert targets[0] == sentinels[0] and targets[-1] not in sentinels, "no closing sentinel, no EOS"
        assert _fill_sentinels(inputs, targets, set(sentinels)) == ids.tolist()
    batch = torch.randint(0, 900, (4, 50), generator=gen(27))
    inputs, targets = t5_span_corruption(batch, sentinel_ids=sentinels, generator=gen(28))
    assert inputs.shape == (4, 50 - 8 + 3) and targets.shape == (4, 8 + 3)
    for b in range(4):
        assert _fill_sentinels(inputs[b].tolist(), targets[b].tolist(), set(sentinels)) == batch[b].tolist()


def test_t5_figure_2_worked_example():
    """Raffel et al. (2020), Fig. 2: "Thank you for inviting me to your party last week." with "for inviting" and
    "last" dropped gives the inputs "Thank you <X> me to your party <Y> week ." and the targets
    "<X> for inviting <Y> last <Z>": the sequence ends with non-noise, so a closing sentinel follows."""
    words = "Thank you for inviting me to your party last week .".split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words + ["<X>", "<Y>", "<Z>"]))}
    ids = torch.tensor([vocab[w] for w in words])
    noise = torch.tensor([w in ("for", "inviting", "last") for w in words])
    inputs, targets = span_corruption_from_mask(ids, noise, [vocab["<X>"], vocab["<Y>"], vocab["<Z>"]])
    names = {i: w for w, i in vocab.items()}
    assert " ".join(names[i] for i in inputs.tolist()) == "Thank you <X> me to your party <Y> week ."
    assert " ".join(names[i] for i in targets.tolist()) == "<X> for inviting <Y> last <Z>"


def test_span_corruption_from_mask_edge_cases():
    ids = torch.tensor([10, 11, 12, 13, 14])
    inputs, targets = span_corruption_from_mask(ids, torch.tensor([True, True, False, True, True]), [90, 91, 92])
    assert inputs.tolist() == [90, 12, 91] and targets.tolist() == [90, 10, 11, 91, 13, 14], \
        "a mask that starts with noise: sentinel k still announces span k"
    inputs, targets = span_corruption_from_mask(ids, torch.zeros(5, dtype=torch.bool), [90])
    assert inputs.tolist() == ids.tolist() and targets.tolist() == [90]
    with pytest.raises(ValueError, match="sentinel"):
        span_corruption_from_mask(ids, torch.tensor([True, False, True, False, False]), [90, 91])


# ---------------------------------------------------------------------------------------------------------
# Extractive QA
# ---------------------------------------------------------------------------------------------------------

def best_span_brute_force(start, end, max_len):
    best, arg = -math.inf, None
    for s in range(len(start)):
        for e in range(s, min(len(start), s + max_len)):
            if start[s] + end[e] > best:  # strict: the first (smallest start, then end) wins ties
                best, arg = start[s] + end[e], (s, e)
    return arg


def test_best_span_equals_brute_force_with_ties():
    g = gen(29)
    for trial in range(300):
        t = int(torch.randint(1, 14, (1,), generator=g))
        max_len = int(torch.randint(1, 16, (1,), generator=g))
        start = torch.randint(-3, 4, (t,), generator=g).double()  # small integers: many ties
        end = torch.randint(-3, 4, (t,), generator=g).double()
        expected = best_span_brute_force(start.tolist(), end.tolist(), max_len)
        assert best_span(start, end, max_len) == expected, (start, end, max_len)


def test_best_span_batched_and_masked_positions():
    g = gen(30)
    start, end = torch.randn(6, 20, generator=g), torch.randn(6, 20, generator=g)
    start[:, :5] = end[:, :5] = -math.inf  # the question's tokens cannot hold the answer
    s, e = best_span(start, end, 4)
    assert s.shape == e.shape == (6,)
    for b in range(6):
        assert (int(s[b]), int(e[b])) == best_span_brute_force(start[b].tolist(), end[b].tolist(), 4)
        assert 5 <= s[b] <= e[b] < s[b] + 4
    # the largest start and the largest end are not a valid pair: end before start
    assert best_span(torch.tensor([0.0, 0.0, 5.0]), torch.tensor([4.0, 0.0, 0.0]), 3) == (2, 2)
    assert best_span(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]), 1) == (0, 0)


# ---------------------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------------------

IDS = torch.tensor([[5, 6, 7], [8, 9, 5]])


@pytest.mark.parametrize("call,match", [
    (lambda: mlm_mask(IDS, 3, 10, mask_prob=1.5), "mask_prob"),
    (lambda: mlm_mask(IDS, 10, 10), "mask_id"),
    (lambda: mlm_mask(IDS, 3, 8), "vocabulary"),
    (lambda: mlm_mask(IDS.float(), 3, 10), "integer"),
    (lambda: mlm_mask(IDS, 3, 10, special_mask=torch.zeros(2, 2, dtype=torch.bool)), "special_mask"),
    (lambda: mlm_mask(IDS, 3, 10, special_mask=torch.zeros(2, 3)), "special_mask"),
    (lambda: mlm_mask(IDS, 3, 10, mask_replace_prob=0.95, random_replace_prob=0.1), "must be <= 1"),
    (lambda: mlm_loss(torch.randn(2, 3, 10), torch.full((2, 3), -100)), "no position"),
    (lambda: mlm_loss(torch.randn(2, 3, 10), torch.zeros(2, 4, dtype=torch.long)), "shape"),
    (lambda: mlm_loss(torch.randn(2, 3, 10), torch.full((2, 3), 10)), r"\[0, 10\)"),
    (lambda: span_mask(IDS, 3, 10, word_starts=torch.ones(3, dtype=torch.bool)), "word_starts"),
    (lambda: span_length_distribution(0.0), "p must"),
    (lambda: t5_span_counts(1), "length"),
    (lambda: t5_span_counts(10, 1.0), "noise_density"),
    (lambda: t5_span_counts(10, 0.15, 0.5), "mean_span_length"),
    (lambda: random_spans_noise_mask(4, 0.9, 1.0), "non-noise"),
    (lambda: t5_span_corruption(torch.arange(20)), "sentinel_ids"),
    (lambda: t5_span_corruption(torch.arange(100), sentinel_ids=[1]), "sentinel"),
    (lambda: span_corruption_from_mask(torch.arange(4), torch.ones(3, dtype=torch.bool), [9]), "noise_mask"),
    (lambda: text_infilling(torch.arange(5), 0, poisson_lambda=0.0), "poisson_lambda"),
    (lambda: token_deletion(IDS, 0.1), "dimensions"),
    (lambda: sentence_permutation(torch.arange(5), []), "sentence_end_ids"),
    (lambda: document_rotation(torch.zeros(0, dtype=torch.long)), "empty"),
    (lambda: nsp_pairs([[torch.arange(3)]], 1, 2), "two non-empty documents"),
    (lambda: electra_labels(IDS, IDS[:, :2]), "shape"),
    (lambda: electra_corrupt(IDS, IDS, torch.randn(2, 3, 4)), "vocabulary"),
    (lambda: best_span(torch.randn(5), torch.randn(4), 3), "same shape"),
    (lambda: best_span(torch.randn(5), torch.randn(5), 0), "max_answer_len"),
    (lambda: best_span(torch.tensor([0.0, math.nan]), torch.zeros(2), 2), "nan"),
    (lambda: span_boundary_targets(torch.tensor([-5, 3])), "-100"),
])
def test_invalid_inputs_raise_value_errors_that_name_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_generator_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="generator"):
        mlm_mask(IDS, 3, 10, generator=np.random.default_rng(0))


def test_everything_is_reproducible_from_the_generator():
    ids = torch.arange(5, 45)
    calls = [
        lambda g: span_mask(ids, 3, 50, generator=g)[0],
        lambda g: text_infilling(ids, 0, generator=g),
        lambda g: token_deletion(ids, 0.3, generator=g),
        lambda g: t5_span_corruption(ids, sentinel_ids=list(range(90, 99)), generator=g)[0],
    ]
    for call in calls:
        assert torch.equal(call(gen(31)), call(gen(31)))
    assert len({tuple(text_infilling(ids, 0, generator=gen(s)).tolist()) for s in range(5)}) > 1


# ----------------------------------------------------------------------------------------------------------
# Prefix LM mask
# ----------------------------------------------------------------------------------------------------------

def test_prefix_lm_mask_matches_a_loop_and_its_limits():
    from llmarch.objectives import prefix_lm_mask
    for length in (1, 5, 9):
        for prefix in range(length + 1):
            expected = torch.tensor([[j <= i or j < prefix for j in range(length)] for i in range(length)])
            assert torch.equal(prefix_lm_mask(prefix, length), expected)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(prefix_lm_mask(0, 6), causal) and torch.equal(prefix_lm_mask(1, 6), causal)
    assert prefix_lm_mask(6, 6).all()
    rows = prefix_lm_mask(torch.tensor([0, 3, 6]), 6)
    assert rows.shape == (3, 6, 6)
    for r, p in enumerate((0, 3, 6)):
        assert torch.equal(rows[r], prefix_lm_mask(p, 6))


def test_prefix_lm_attention_sees_the_whole_prefix_and_no_future():
    """With torch's SDPA: changing a prefix token changes every output; changing a later token changes only
    the outputs at and after it (causality by perturbation)."""
    from llmarch.objectives import prefix_lm_mask
    torch.manual_seed(0)
    T, prefix = 8, 3
    x = torch.randn(1, 1, T, 4, dtype=torch.float64)
    mask = prefix_lm_mask(prefix, T)

    def attend(v):
        return F.scaled_dot_product_attention(v, v, v, attn_mask=mask)[0, 0]

    base = attend(x)
    for t in range(T):
        y = x.clone()
        y[..., t, :] += 1.0
        changed = (attend(y) - base).abs().amax(-1) > 1e-12
        expected = torch.ones(T, dtype=torch.bool) if t < prefix else torch.arange(T) >= t
        assert torch.equal(changed, expected), t


def test_prefix_lm_mask_rejects_bad_prefixes():
    from llmarch.objectives import prefix_lm_mask
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm_mask(7, 6)
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm_mask(torch.tensor([2, 9]), 6)
    with pytest.raises(ValueError, match="prefix_length"):
        prefix_lm_mask(torch.tensor([1.0]), 6)
