"""ps11-train's held-out verdict on outputs a notebook could return, and its "fix that first" hints.

The verdict (``ps11_train._verdict_heldout``) gets what the notebook's ``heldout_outputs`` returns: the trained
weights, which the grader's own Llama scores on sentences that never leave the grader, and the model's own logits on
pairs of sequences that share a prefix. Here it is fed directly: the reference trained once (the fixture of
test_wrong_variants_capstones.py), the grammar's exact probabilities with no Llama behind them, a model that reads
the next token, and a model whose earlier logits move when later tokens change.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autograder.assignments import ps11_train as m
from llmarch.data import default_grammar
from test_wrong_variants_capstones import PS11, VARIANTS, trained_state

SEEDS = range(3)


def grammar_logits(tokens: np.ndarray) -> np.ndarray:
    """The best possible logits for sequences that start at the grammar's start state: log p(next word | state),
    the state tracked exactly (the grammar is unifilar), -inf for words the state cannot emit. After a word the state
    cannot emit (the random tails of the pairs), every word gets log(1/V)."""
    grammar = default_grammar()
    word_id = {w: i for i, w in enumerate(grammar.vocab)}
    logits = np.full((*tokens.shape, grammar.vocab_size), -np.log(grammar.vocab_size))
    for b, row in enumerate(tokens):
        state = grammar.start
        for t, token in enumerate(row):
            if state is not None:
                state = {word_id[w]: nxt for w, nxt, _ in grammar.rules[state]}.get(int(token))
            if state is not None:
                logits[b, t] = -np.inf
                for w, _, p in grammar.rules[state]:
                    logits[b, t, word_id[w]] = np.log(p)
    return logits


@pytest.fixture(scope="module")
def trained() -> np.ndarray:
    """The reference's trained weights, flat, as ``heldout_outputs`` returns them."""
    return m.flatten({name: t.double().numpy() for name, t in trained_state().items()})


@torch.no_grad()
def own_logits(weights: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """A correct model's logits with these weights: the reference's, in float32 as the notebook trains."""
    return m._loaded(m.MODEL_CONFIG, weights).float()(torch.as_tensor(pairs)).double().numpy()


def draw(seed: int) -> list:
    return m._heldout(np.random.default_rng(seed))


def test_the_trained_reference_passes(trained):
    for seed in SEEDS:
        cases = draw(seed)
        assert m._verdict_heldout(cases, [(trained, own_logits(trained, cases[0].args[0]))]) is None, seed


def test_the_grammars_own_probabilities_without_a_llama_earn_nothing(trained):
    """Pasting the exact next-word probabilities: they are causal and score about the entropy rate, but there are no
    weights of the stated shape to score, or the weights are untrained."""
    untrained = m.flatten({name: t.numpy() for name, t in m.reference_llama(m.MODEL_CONFIG).state_dict().items()})
    for seed in SEEDS:
        cases = draw(seed)
        best = grammar_logits(cases[0].args[0])
        assert "weights" in m._verdict_heldout(cases, [(np.zeros(0), best)])
        assert "weights" in m._verdict_heldout(cases, [(trained[:-1], best)])
        assert "the target is below" in m._verdict_heldout(cases, [(untrained, best)])


def test_a_model_that_reads_the_next_token_sees_the_future(trained):
    """Logits that put the next token of each row first (a mask off by one learns this: loss 0.026)."""
    cases = draw(0)
    pairs = cases[0].args[0]
    cheat = np.zeros((*pairs.shape, 36))
    cheat[np.arange(len(pairs))[:, None], np.arange(pairs.shape[1] - 1), pairs[:, 1:]] = 10.0
    assert "sees the future" in m._verdict_heldout(cases, [(trained, cheat)])


def test_logits_that_move_when_later_tokens_change_see_the_future(trained):
    """Changes below the floor's reach: one pair's last shared position moves by 1e-3 (above the float32 tolerance),
    then by 1e-6 (float32 rounding: passes)."""
    for seed in SEEDS:
        cases = draw(seed)
        case = cases[0]
        logits = own_logits(trained, case.args[0])
        i = int(seed) * 7 % len(case.prefixes)
        for change, passes in ((1e-3, False), (1e-6, True)):
            moved = logits.copy()
            moved[2 * i + 1, case.prefixes[i] - 1] += change
            verdict = m._verdict_heldout(cases, [(trained, moved)])
            assert (verdict is None) if passes else ("sees the future" in verdict), (seed, change, verdict)


@torch.no_grad()
def test_the_trusted_loss_has_the_floor_too(trained):
    """Sentences the trained model itself writes, greedily, score far below the entropy rate with the grader's own
    Llama: the floor catches them (with honest logits for the causality part)."""
    cases = draw(0)
    model = m._loaded(m.MODEL_CONFIG, trained)
    tokens = torch.as_tensor(cases[0].heldout[:4, :1])  # four sentences: 256 tokens
    while tokens.shape[1] < cases[0].heldout.shape[1]:
        tokens = torch.cat([tokens, model(tokens)[:, -1:].argmax(-1)], dim=1)
    cases[0].heldout = tokens.numpy()
    assert m.reference_heldout_loss(trained, cases[0].heldout) < m.LOSS_FLOOR
    verdict = m._verdict_heldout(cases, [(trained, own_logits(trained, cases[0].args[0]))])
    assert "sees the future" in verdict and "held-out loss" in verdict


def test_depends_on_names_the_sets_checked_functions():
    """grade.py names a culprit when a check fails and a function of its ``depends_on`` fails its own check: the
    entries must be functions of the set's checks (not class names), or no hint ever fires."""
    functions = {check.function for check in m.CHECKS.values()}
    for gid, check in m.CHECKS.items():
        assert set(check.depends_on) <= functions - {check.function}, (gid, set(check.depends_on) - functions)


@pytest.mark.parametrize("v", VARIANTS[PS11], ids=[v.name for v in VARIANTS[PS11]])
def test_every_lost_cell_but_the_root_says_what_to_fix_first(v):
    """With grade.py's rule (a failing check's ``depends_on`` among the failing functions), every cell a variant
    loses gets a "fix that first" hint except those of one function, the one the variant broke first (a RoPE bug
    costs 12 of 23 points; 10 of them point at rope_forward)."""
    failing = {m.CHECKS[gid].function for gid in v.loses}
    unexplained = {m.CHECKS[gid].function for gid in v.loses if not set(m.CHECKS[gid].depends_on) & failing}
    assert len(unexplained) == 1, (sorted(v.loses), unexplained)


@pytest.mark.parametrize("fast", [
    "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(t, t, dtype=torch.bool).tril())"])
def test_an_honest_float32_fast_path_keeps_the_held_out_points(fast, tmp_path, monkeypatch):
    """A causal fast path in float32 (what the causality check runs) agrees with itself to far below the tolerance:
    the held-out check passes it, through capture and judge, under three seeds."""
    from autograder import capture
    from autograder.checks import OUTPUTS, expected_results, judge, write_inputs
    from test_wrong_variants import Variant
    from test_wrong_variants_capstones import _namespace, attention_with_fast_path

    monkeypatch.chdir(tmp_path)
    ns = _namespace(PS11, Variant("a causal fast path", "Attention", frozenset(), attention_with_fast_path(fast)))
    gid = "test_heldout_loss"
    check = m.CHECKS[gid]
    for seed in SEEDS:
        cases = check.cases(np.random.default_rng(seed))
        expected = expected_results(check, cases, {})
        write_inputs(gid, check, cases, expected, tmp_path / f"in{seed}")
        capture.capture(gid, namespace=ns, inputs=str(tmp_path / f"in{seed}"), outputs=str(tmp_path / f"out{seed}"))
        files = {f"{OUTPUTS}/{gid}/{p.name}": p.read_bytes() for p in (tmp_path / f"out{seed}" / gid).iterdir()}
        result = judge(check, gid, cases, expected, files)
        assert result.passed, (seed, result.message)


def test_a_rope_bug_says_to_fix_rope_first_through_grade_py(tmp_path, monkeypatch):
    """grade.py's own ``_judge_all`` on a RoPE variant's captured outputs (seed 0): of the 12 points it loses, every
    cell but test_rope names rope_forward and says to fix that first."""
    from autograder import capture
    from autograder.checks import OUTPUTS
    from autograder.grade import _judge_all, release_template
    from test_wrong_variants_capstones import FastHarness, _namespace

    monkeypatch.chdir(tmp_path)
    v = next(v for v in VARIANTS[PS11] if v.name == "RoPE rotates the other way")
    harness, ns = FastHarness(PS11, tmp_path / "harness"), _namespace(PS11, v)
    cases, expected, files = {}, {}, {}
    for gid in m.CHECKS:
        cases[gid], expected[gid] = harness.expected(0, gid)
        capture.capture(gid, namespace=ns, inputs=str(tmp_path / "harness" / "inputs-0"), outputs=str(tmp_path / "out"))
        files.update({f"{OUTPUTS}/{gid}/{p.name}": p.read_bytes() for p in (tmp_path / "out" / gid).iterdir()})
    items, problem = _judge_all(release_template(PS11)[0], m.CHECKS, cases, expected, files)
    lost = {item.grade_id: item for item in items if item.kind == "auto" and item.points == 0}
    assert not problem and set(lost) == v.loses and sum(item.max_points for item in lost.values()) == 12
    for gid, item in lost.items():
        hinted = "rope_forward" in item.message and "fix that first" in item.message
        assert hinted == (gid != "test_rope"), (gid, item.message[-300:])
