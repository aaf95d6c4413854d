"""The helpers of book/experiments/pretraining_objectives.py, pretraining_models.py and pretraining_tasks.py (read by
book/pretraining-objectives.md), the fairer design of the experiment (pre-LN encoders, ELECTRA's shared
embeddings, T5's full-length sources, the learning-rate choice), and the
consistency of its committed results. Regenerate the results with `make experiments`.

The references are independent of the script: grammar labels are checked against a brute-force walk of the
grammar's rules from every start state (and against the states that really generated a sample), logistic
regression against its first-order optimality condition, the threshold against an exhaustive search, and the
committed files against counts recomputed from their own columns and from T5's formulas.
"""

import csv
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llmarch.data import default_grammar
from llmarch.layers import TransformerBlock
from llmarch.model import count_parameters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "experiments"))
po = pytest.importorskip("pretraining_objectives")
pm = pytest.importorskip("pretraining_models")
pt = pytest.importorskip("pretraining_tasks")

GRAMMAR = default_grammar()
STATES = list(GRAMMAR.rules)
NEXT = {s: {w: n for w, n, _ in options} for s, options in GRAMMAR.rules.items()}  # unifilar: word -> next state


def walk(start, words):
    """States before each word, following the rules from ``start``; None if a word is impossible."""
    path, state = [], start
    for w in words:
        if w not in NEXT[state]:
            return None
        path.append(state)
        state = NEXT[state][w]
    return path


def brute_force_emitters(words):
    """Per position t: the emitting state if every start state that can produce words[0..t] agrees, else -1."""
    out = []
    for t in range(len(words)):
        emitters = {p[t] for s in STATES if (p := walk(s, words[: t + 1])) is not None}
        out.append(STATES.index(emitters.pop()) if len(emitters) == 1 else -1)
    return out


def sample_windows(n, length, seed):
    ids = GRAMMAR.encode(GRAMMAR.sample(n * length, seed=seed)).numpy()
    return ids.reshape(n, length)


# ----------------------------------------------------------------------------------------------------------
# Grammar labels
# ----------------------------------------------------------------------------------------------------------

def test_emitting_states_match_a_brute_force_walk():
    windows = sample_windows(40, 12, seed=3)
    rng = np.random.default_rng(0)
    edited = pt.random_edit(windows, GRAMMAR.vocab_size, rng)
    possible = [w for w in edited if walk_any(GRAMMAR.decode(w))]
    for window in list(windows) + possible:
        expected = brute_force_emitters(GRAMMAR.decode(window))
        assert pt.emitting_states(GRAMMAR, window[None])[0].tolist() == expected


def walk_any(words):
    return any(walk(s, words) is not None for s in STATES)


def test_emitting_states_are_the_states_that_generated_the_text():
    words = GRAMMAR.sample(3000, seed=7)         # sampled from the start state S
    truth = walk("S", words)
    window = GRAMMAR.encode(words).numpy()[None]
    labels = pt.emitting_states(GRAMMAR, window)[0]
    known = labels >= 0
    assert known.mean() > 0.95                   # only the first few words are ambiguous
    assert all(STATES[label] == truth[t] for t, label in enumerate(labels) if label >= 0)


def test_emitting_states_refuse_an_impossible_window():
    with pytest.raises(ValueError, match="impossible"):
        pt.emitting_states(GRAMMAR, GRAMMAR.encode(". .".split()).numpy()[None])


def test_is_grammatical_matches_a_brute_force_walk():
    windows = sample_windows(300, 10, seed=5)
    edited = pt.random_edit(windows, GRAMMAR.vocab_size, np.random.default_rng(1))
    expected = [walk_any(GRAMMAR.decode(w)) for w in edited]
    assert pt.is_grammatical(GRAMMAR, edited).tolist() == expected
    assert pt.is_grammatical(GRAMMAR, windows).all()           # the grammar's own text is possible
    assert 0 < np.mean(expected) < 0.5                          # most edits break it, some do not
    # worked examples: "." always leads to S, which cannot emit "." or a verb
    for text, ok in ((". the cat sleeps", True), (". .", False), (". sleeps", False), ("cats sleep", True)):
        assert pt.is_grammatical(GRAMMAR, GRAMMAR.encode(text.split()).numpy()[None])[0] == ok, text


def test_random_edit_swaps_two_neighbours_or_replaces_one_word():
    windows = sample_windows(500, 8, seed=2)
    edited = pt.random_edit(windows, GRAMMAR.vocab_size, np.random.default_rng(3))
    n_swaps = 0
    for before, after in zip(windows, edited):
        diff = np.flatnonzero(before != after)
        assert len(diff) in (1, 2), (before, after)
        if len(diff) == 2:
            i, j = diff
            assert j == i + 1 and before[i] == after[j] and before[j] == after[i]
            n_swaps += 1
    assert 0.35 < n_swaps / len(windows) < 0.65
    with pytest.raises(ValueError, match="shape"):
        pt.random_edit(windows[0], GRAMMAR.vocab_size, np.random.default_rng(0))


def test_balanced_grammaticality_set():
    stream = GRAMMAR.encode(GRAMMAR.sample(20_000, seed=4)).numpy()
    ids, labels = pt.balanced_grammaticality_set(GRAMMAR, stream, 200, 9, np.random.default_rng(0))
    assert ids.shape == (200, 9) and labels.sum() == 100
    assert [walk_any(GRAMMAR.decode(w)) for w in ids] == labels.astype(bool).tolist()
    with pytest.raises(ValueError, match="even"):
        pt.balanced_grammaticality_set(GRAMMAR, stream, 7, 9, np.random.default_rng(0))


# ----------------------------------------------------------------------------------------------------------
# The topic grammar and documents
# ----------------------------------------------------------------------------------------------------------

def test_topic_grammar_keeps_the_state_chain_and_reweights_the_nouns():
    topic = pt.topic_grammar(GRAMMAR, {"cat", "dog"}, share=0.8)
    assert np.allclose(topic.transition_matrix(), GRAMMAR.transition_matrix())
    p = {w: prob for w, _, prob in topic.rules["NP_SG"]}
    # the docstring's worked example: six singular nouns share 0.7; cat and dog get 0.8 of it
    assert math.isclose(p["cat"], 0.28) and math.isclose(p["dog"], 0.28) and math.isclose(p["bird"], 0.035)
    assert math.isclose(p["big"], 0.05)                        # adjectives unchanged
    assert topic.entropy_rate() < GRAMMAR.entropy_rate()        # a topic makes word choice more predictable
    with pytest.raises(ValueError, match="share"):
        pt.topic_grammar(GRAMMAR, {"cat"}, share=1.0)
    with pytest.raises(ValueError, match="not in the grammar"):
        pt.topic_grammar(GRAMMAR, {"unicorn"}, share=0.5)


def test_documents_are_whole_sentences():
    doc = pt.sample_document(GRAMMAR, 200, seed=1)
    assert doc[-1] == "." and walk("S", doc) is not None and len(doc) <= 200


# ----------------------------------------------------------------------------------------------------------
# Probing and zero-shot helpers
# ----------------------------------------------------------------------------------------------------------

def test_logistic_regression_is_at_its_optimum():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=generator) * torch.tensor([1.0, 5.0, 0.1, 2.0, 1.0]) + 3.0
    y = (x[:, 0] + 0.2 * x[:, 1] + 0.3 * torch.randn(400, generator=generator) > 3.6).long()
    l2 = 1e-2
    layer = pt.fit_logistic_regression(x, y, 2, l2=l2, max_iter=500)
    # undo the folding: in standardised coordinates z = (x - m) / s the weights are W * s, bias b + W m
    x64 = x.double()
    mean, std = x64.mean(0), x64.std(0)
    w = (layer.weight.double() * std).detach().requires_grad_(True)
    b = (layer.bias.double() + layer.weight.double() @ mean).detach().requires_grad_(True)
    z = (x64 - mean) / std
    loss = torch.nn.functional.cross_entropy(z @ w.T + b, y) + l2 * w.pow(2).sum()
    loss.backward()
    assert w.grad.abs().max() < 1e-4 and b.grad.abs().max() < 1e-4
    assert (layer(x).argmax(1) == y).float().mean() > 0.85


def test_fit_threshold_is_the_best_threshold():
    rng = np.random.default_rng(0)
    for _ in range(50):
        scores = np.round(rng.normal(size=30), 1)                # rounded: ties happen
        labels = (scores + rng.normal(size=30) > 0).astype(int)
        theta = po.fit_threshold(scores, labels)
        candidates = np.concatenate([[scores.min() - 1], np.unique(scores)])
        best = max(np.mean((scores > c) == labels) for c in candidates)   # every distinct split
        assert np.mean((scores > theta) == labels) == best


# ----------------------------------------------------------------------------------------------------------
# The committed results
# ----------------------------------------------------------------------------------------------------------

DATA = ROOT / "book" / "data"


@pytest.fixture(scope="module")
def results():
    paths = [DATA / f"pretraining_objectives_{name}.csv" for name in ("runs", "downstream", "curves")]
    assert all(p.exists() for p in paths), "run `make experiments` to create the pretraining-objectives files"
    tables = []
    for path in paths:
        with path.open() as f:
            tables.append(list(csv.DictReader(f)))
    return (*tables, json.loads((DATA / "pretraining_objectives.json").read_text()))


def test_compute_is_equal_and_counted_consistently(results):
    runs, _, curves, summary = results
    budget = summary["budget_flops"]
    for row in runs:
        steps, per_step = int(row["steps"]), int(row["flops_per_step"])
        assert int(row["train_flops"]) == steps * per_step
        assert abs(steps * per_step - budget) <= per_step / 2, row["variant"]   # the nearest number of steps
        words = summary["settings"]["t5_words" if row["variant"] == "t5" else "window"]
        assert int(row["corpus_words"]) == steps * summary["settings"]["batch"] * words
        last = max(int(c["step"]) for c in curves if c["variant"] == row["variant"] and c["seed"] == row["seed"])
        assert last == steps


def test_t5_counts_and_task_settings(results):
    *_, summary = results
    settings = summary["settings"]
    num_noise = round(settings["t5_words"] * 0.15)               # 34 * 0.15 = 5.1: no tie, any rounding agrees
    num_spans = max(round(num_noise / 3), 1)
    assert (settings["t5_num_noise"], settings["t5_num_spans"]) == (num_noise, num_spans)
    # T5's sources ([CLS], the words left, one sentinel per span) are as long as the downstream inputs
    assert 1 + settings["t5_words"] - num_noise + num_spans == 1 + settings["window"] == 32
    assert abs(settings["nsp_notnext_fraction"] - 0.5) < 0.02
    tagging = summary["baselines"]["tagging"]
    assert tagging["majority"] < tagging["word_only"] < 1
    assert abs(summary["baselines"]["grammaticality"]["majority"] - 0.5) < 0.03


def test_every_evaluation_is_present_and_an_accuracy(results):
    runs, downstream, _, summary = results
    seeds = {str(s) for s in summary["seeds"]}
    assert len(seeds) >= 5
    variants = set(summary["variants"]) | set(summary["random_init"])
    got = {(r["variant"], r["seed"], r["task"], r["method"]) for r in downstream}
    for v in variants:
        for seed in seeds:
            for task in ("tagging", "grammaticality"):
                for method in ("probe", "finetune"):
                    assert (v, seed, task, method) in got
            if v in summary["zero_shot"]:
                assert (v, seed, "grammaticality", "zero_shot") in got
    assert all(0 <= float(r["accuracy"]) <= 1 for r in downstream)
    assert {(r["variant"], r["seed"]) for r in runs} == {(v, s) for v in summary["variants"] for s in seeds}


# ----------------------------------------------------------------------------------------------------------
# The fairer design: pre-LN encoders, ELECTRA's shared embeddings, T5's full-length sources, the LR choice
# ----------------------------------------------------------------------------------------------------------

TINY_DATA = torch.as_tensor(sample_windows(1, 2000, seed=9)[0])


def test_electra_generator_and_discriminator_share_their_embeddings():
    torch.manual_seed(0)
    electra = pm.Electra(TINY_DATA)
    shared = electra.discriminator.embeddings
    for name in ("tok_emb", "pos_emb", "type_emb", "norm"):
        for part in (electra.generator_encoder.embeddings, electra.generator_head.embeddings):
            for p_gen, p_disc in zip(getattr(part, name).parameters(), getattr(shared, name).parameters()):
                assert p_gen is p_disc, name
    # the generator reads the width-64 table through a projection to its own width, and its head is tied to it
    assert electra.generator_encoder.project.weight.shape == (pm.GENERATOR_D_MODEL, pm.D_MODEL)
    # counted once: the sum over the parts counts the shared embeddings three times
    parts = (electra.discriminator, electra.generator_encoder, electra.generator_head, electra.rtd_head)
    n_shared = sum(p.numel() for p in shared.parameters())
    assert count_parameters(electra) == sum(p.numel() for m in parts for p in m.parameters()) - 2 * n_shared
    # one gradient step moves what both networks read: perturbing the shared table changes both outputs
    ids = pt.with_cls(torch.as_tensor(sample_windows(2, pt.WINDOW, seed=4)))
    with torch.no_grad():
        before = electra.generator_head(electra.generator_encoder(ids)), electra.discriminator(ids)
        shared.tok_emb.weight[ids[0, 3]] += 1.0
        after = electra.generator_head(electra.generator_encoder(ids)), electra.discriminator(ids)
    assert not torch.allclose(before[0], after[0]) and not torch.allclose(before[1], after[1])


def test_every_encoder_but_the_control_is_pre_ln():
    torch.manual_seed(0)
    blocks = {name: [b for b in obj.modules() if isinstance(b, TransformerBlock)]
              for name, obj in (("mlm", pm.MaskedLM(TINY_DATA)), ("postln", pm.MaskedLM(TINY_DATA, post_ln=True)),
                                ("electra", pm.Electra(TINY_DATA)))}
    assert all(b.norm_first for name in ("mlm", "electra") for b in blocks[name]) and len(blocks["electra"]) == 4
    assert not any(b.norm_first for b in blocks["postln"])
    # pre-LN: the residual stream passes a block unnormalised, so a block whose sublayers output zero is the identity
    encoder = pm.MaskedLM(TINY_DATA).encoder
    x = torch.randn(2, 5, pm.D_MODEL)
    block = encoder.blocks[0]
    with torch.no_grad():
        for p in [*block.attn.parameters(), *block.ffn.parameters()]:
            p.zero_()
    assert torch.allclose(block(x), x)


def test_t5_sources_are_as_long_as_the_downstream_inputs():
    assert pm.T5_WORDS == 34
    torch.manual_seed(0)
    t5 = pm.SpanCorruption(TINY_DATA)
    sources, targets = t5.sources_and_targets(torch.Generator().manual_seed(1))
    assert sources.shape == (pm.BATCH, pt.WINDOW + 1) == (pm.BATCH, 32)
    # each source: [CLS], then the 34 words with 5 noise words replaced by 2 sentinels, none padding
    assert (sources[:, 0] == pt.CLS).all()
    assert ((sources >= pt.SENTINELS[0]).sum(1) == 2).all()
    # targets: <S0> span <S1> span, and <S2> when the source ends with words; the rest is ignored padding
    assert targets.shape == (pm.BATCH, 5 + 2 + 1)
    for source, target in zip(sources, targets):
        closing = int(source[-1] < pt.SENTINELS[0])
        assert (target[: 5 + 2 + closing] != pt.IGNORE).all() and (target[5 + 2 + closing:] == pt.IGNORE).all()
    seen = []  # the encoder's position table is looked up once per pass, for positions 0 .. T-1 of the source
    t5.t5.src_pos_emb.register_forward_hook(lambda module, args, out: seen.append(out.shape[-2]))
    t5.loss(torch.Generator().manual_seed(2))
    assert seen == [32]


def test_t5_sources_hold_words_at_every_position_and_round_trip():
    """Rolled masks: over 4,000 sources, every encoder position after [CLS] holds a word in some sources and a
    sentinel in others; putting each target span back in place of its sentinel gives the 34 words back."""
    generator = torch.Generator().manual_seed(3)
    words = torch.randint(0, pt.N_WORDS, (4000, pm.T5_WORDS), generator=generator)
    sources, targets = pm.t5_format(words, generator)
    is_word = sources < pt.N_WORDS
    assert is_word[:, 1:].any(0).all() and (~is_word[:, 1:]).any(0).all()
    for source, target, original in zip(sources[:200], targets[:200], words[:200]):
        spans, current = {}, None
        for token in target[target != pt.IGNORE].tolist():
            if token in pt.SENTINELS:
                current = spans.setdefault(token, [])
            else:
                current.append(token)
        rebuilt = [w for token in source[1:].tolist() for w in (spans[token] if token in pt.SENTINELS else [token])]
        assert rebuilt == original.tolist()
        assert all(len(spans[s]) > 0 for s in pt.SENTINELS[:2])  # two non-empty spans: no span cut by the roll


def test_t5_zero_shot_reads_each_word_where_the_decoder_predicts_it():
    """The scorer's log-probability of w_t equals a direct decode of its two-span source and target."""
    torch.manual_seed(0)
    t5 = pm.SpanCorruption(TINY_DATA)
    t5.eval()
    ids = pt.with_cls(torch.as_tensor(sample_windows(2, pt.WINDOW, seed=5)))
    scores = t5.word_log_probs(ids)
    assert scores.shape == (2, pt.WINDOW)
    for t in (1, 16, 20, 31):
        u = t + 15 if t + 15 <= pt.WINDOW else t - 15
        first, second = sorted((t, u))
        source = ids.clone()
        source[:, first], source[:, second] = pt.SENTINELS[0], pt.SENTINELS[1]
        target = torch.stack([torch.full((2,), pt.SENTINELS[0]), ids[:, first], torch.full((2,), pt.SENTINELS[1]),
                              ids[:, second]], dim=1)
        with torch.no_grad():
            log_probs = torch.log_softmax(t5.t5(source, pm.shift_right(target, pt.CLS)), dim=-1)
        position = 1 if t == first else 3
        assert torch.allclose(scores[:, t - 1], log_probs[torch.arange(2), position, ids[:, t]], atol=1e-5)


def test_nsp_pairs_are_32_tokens_like_the_downstream_inputs():
    docs = [torch.as_tensor(sample_windows(1, 300, seed=s)[0]).numpy() for s in (11, 12, 13)]
    pairs = po.pair_tensors(docs, seed=0)
    ids, types = pairs["input_ids"], pairs["token_type_ids"]
    assert ids.shape[1] == pt.WINDOW + 1 == 32
    a, b = ids[:, 1:16], ids[:, 17:31]
    assert (ids[:, 0] == pt.CLS).all() and (ids[:, 16] == pt.SEP).all() and (ids[:, 31] == pt.SEP).all()
    assert (a < pt.N_WORDS).all() and (b < pt.N_WORDS).all()                       # A of 15 words, B of 14
    assert (types[:, :17] == 0).all() and (types[:, 17:] == 1).all()
    segments = [seg.tolist() for doc in po.segment_documents(docs) for seg in doc]
    fronts = backs = 0
    for row_a, row_b in zip(a.tolist(), b.tolist()):
        assert row_a in segments
        fronts += any(row_b == seg[1:] for seg in segments)   # B lost its first word
        backs += any(row_b == seg[:-1] for seg in segments)   # or its last
        assert any(row_b in (seg[1:], seg[:-1]) for seg in segments)
    assert fronts > 0 and backs > 0


def test_select_lrs_takes_the_lowest_mean_heldout_loss():
    rows = []
    for name in po.SWEPT:
        for lr in po.SWEEP_LRS:
            for seed, noise in ((100, 0.01), (101, -0.01)):
                table = {1e-3: 1.5, 3e-3: 1.6, 1e-2: "nan"} if name == "t5" else {1e-3: 2.0, 3e-3: 1.9, 1e-2: 1.8}
                loss = table[lr]
                rows.append({"variant": name, "lr": f"{lr:g}", "seed": str(seed),
                             "heldout_loss": str(float(loss) + noise)})
    lrs = po.select_lrs(rows)
    assert lrs["clm"] == lrs["mlm"] == 1e-2 and lrs["t5"] == 1e-3          # NaN (diverged) never wins
    assert all(lrs[name] == lrs["mlm"] for name in po.LR_FROM)
    with pytest.raises(ValueError, match="same seeds"):
        po.select_lrs(rows[:-1])


def test_the_learning_rates_are_the_sweeps_best(results):
    runs, *_, summary = results
    with (DATA / "pretraining_objectives_sweep.csv").open() as f:
        sweep = list(csv.DictReader(f))
    sweep_seeds = {r["seed"] for r in sweep}
    assert len(sweep_seeds) >= 3 and not sweep_seeds & {str(s) for s in summary["seeds"]}  # seeds of its own
    losses = {}
    for r in sweep:
        losses.setdefault((r["variant"], float(r["lr"])), {})[r["seed"]] = float(r["heldout_loss"])
    lrs = summary["sweep"]["lrs"]
    for name in summary["sweep"]["swept"]:
        for lr in lrs:
            assert set(losses[name, lr]) == sweep_seeds, (name, lr)
        mean = {lr: sum(losses[name, lr].values()) / len(sweep_seeds) for lr in lrs}
        finite = {lr: m for lr, m in mean.items() if math.isfinite(m)}
        assert summary["lr"][name] == min(finite, key=finite.get), name
    for name, source in summary["sweep"]["lr_from"].items():
        assert summary["lr"][name] == summary["lr"][source]
    assert all(float(r["lr"]) == summary["lr"][r["variant"]] for r in runs)


def test_t5_diagnostic_inputs_are_pretraining_sources_with_the_words_tags():
    """The diagnostic's inputs in pretraining's format: each row is a T5 source of 32 tokens (two sentinels,
    rolled masks), every kept word carries the tag a brute-force walk of the grammar gives it, sentinels none."""
    td = pytest.importorskip("t5_diagnostics")
    stream = GRAMMAR.encode(GRAMMAR.sample(3000, seed=21)).numpy()
    ids, labels = td.pretraining_format_tagging(GRAMMAR, stream, 40, seed=5)
    assert ids.shape == labels.shape == (40, pt.WINDOW + 1)
    starts = np.random.default_rng(5).integers(0, len(stream) - pm.T5_WORDS, size=40)
    generator = torch.Generator().manual_seed(5)   # the masks, redrawn in the same order
    for row, start in enumerate(starts):
        words = stream[start: start + pm.T5_WORDS]
        tags = brute_force_emitters([GRAMMAR.vocab[w] for w in words])
        is_sentinel = ids[row] >= pt.SENTINELS[0]
        assert is_sentinel.sum() == 2 and (labels[row][is_sentinel] == pt.IGNORE).all()
        kept = ids[row][1:][~is_sentinel[1:]].tolist()
        positions = np.flatnonzero(~pm.t5_noise_mask(generator).numpy())
        assert kept == words[positions].tolist() and len(kept) == pm.T5_WORDS - 5
        expected = [tags[i] if tags[i] >= 0 else pt.IGNORE for i in positions]
        assert labels[row][1:][~is_sentinel[1:]].tolist() == expected
