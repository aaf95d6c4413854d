"""llmarch.decoding against brute force on toy models, and generate with and without the KV cache."""

import itertools
import math

import pytest
import torch

from llmarch.decoding import (
    beam_search,
    contrastive_search,
    exhaustive_search,
    generate,
    gpt_hidden_states,
    gpt_next_logprobs,
    greedy_decode,
    sample_next,
    temperature_scale,
    top_k_filter,
    top_p_filter,
)
from llmarch.model import GPT, GPTConfig


def markov_model(table):
    """A toy model: next-token log-probabilities depend on the last token only (a V x V table of probs)."""
    logp = torch.log(torch.tensor(table, dtype=torch.float64))
    return lambda seq: logp[seq[-1]]


# token 0: start; greedy takes 1 (p=0.6) but every continuation of 1 is flat, while 2 (p=0.4) -> 3 (p=0.9)
TRAP = [[0.0, 0.6, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25], [0.05, 0.05, 0.0, 0.9], [0.25, 0.25, 0.25, 0.25]]


def brute_force_best(next_logprobs, prompt, n, vocab):
    best, best_score = None, -math.inf
    for tail in itertools.product(range(vocab), repeat=n):
        seq, score = list(prompt), 0.0
        for t in tail:
            score += float(next_logprobs(seq)[t])
            seq.append(t)
        if score > best_score:
            best, best_score = seq, score
    return best, best_score


def test_top_k_keeps_the_k_largest_and_ties():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9]])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [[True, False, True, False, True]]
    tied = top_k_filter(torch.tensor([1.0, 2.0, 2.0, 3.0]), 2)
    assert torch.isfinite(tied).tolist() == [False, True, True, True]  # ties at the threshold are kept
    torch.testing.assert_close(top_k_filter(logits, 10), logits)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        top_k_filter(logits, 0)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.7, 0.9, 0.999, 1.0])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(9, generator=g, dtype=torch.float64) * 2
        probs = torch.softmax(logits, 0).tolist()
        order = sorted(range(9), key=lambda i: -probs[i])
        kept, mass = set(), 0.0
        for i in order:  # brute force: add the most probable tokens until their mass reaches p
            kept.add(i)
            mass += probs[i]
            if mass >= p:
                break
        assert {i for i in range(9) if torch.isfinite(top_p_filter(logits, p)[i])} == kept


def test_top_p_one_keeps_every_token_in_float32():
    # the smallest set with mass >= 1 is every token of positive probability; a float32 cumulative sum
    # over 1000 sorted probabilities rounds up to 1 before the tail, which must not remove the tail
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.all(torch.softmax(logits, -1) > 0)
    assert torch.isfinite(top_p_filter(logits, 1.0)).all()


def test_top_p_is_batched_and_keeps_at_least_one():
    logits = torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    out = top_p_filter(logits, 0.01)
    assert torch.isfinite(out).tolist() == [[True, False, False], [False, False, True]]


def test_sampling_follows_the_tempered_distribution():
    logits = torch.tensor([1.0, 0.0, -1.0, 0.5])
    g = torch.Generator().manual_seed(0)
    n = 40_000
    draws = sample_next(logits.expand(n, 4), temperature=0.7, generator=g)
    freq = torch.bincount(draws, minlength=4).double() / n
    expected = torch.softmax(logits.double() / 0.7, 0)
    assert torch.all((freq - expected).abs() < 4 * torch.sqrt(expected * (1 - expected) / n)), (freq, expected)
    assert sample_next(logits, top_k=1).item() == 0
    with pytest.raises(ValueError, match="temperature must be > 0"):
        temperature_scale(logits, 0.0)


def test_greedy_misses_the_most_probable_sequence_that_exhaustive_finds():
    model = markov_model(TRAP)
    assert greedy_decode(model, [0], 2) == [0, 1, 0]  # 0.6 * 0.25 = 0.15 (first of the tied 0.25s)
    best, score = exhaustive_search(model, [0], 2)
    assert best == [0, 2, 3] and score == pytest.approx(math.log(0.4 * 0.9))
    assert (best, pytest.approx(score)) == brute_force_best(model, [0], 2, 4)


def test_beam_search_interpolates_between_greedy_and_exhaustive():
    model = markov_model(TRAP)
    assert beam_search(model, [0], 1, 2)[0][0] == greedy_decode(model, [0], 2)
    best, score = beam_search(model, [0], 2, 2)[0]
    assert best == [0, 2, 3] and score == pytest.approx(math.log(0.36))
    g = torch.Generator().manual_seed(3)
    table = torch.softmax(torch.randn(5, 5, generator=g), -1).tolist()
    random_model = markov_model(table)
    for n in (1, 2, 3):
        exact = brute_force_best(random_model, [1], n, 5)
        assert beam_search(random_model, [1], 5 ** n, n)[0][0] == exact[0]
        assert exhaustive_search(random_model, [1], n)[0] == exact[0]


def test_beam_scores_and_length_penalty_and_eos():
    model = markov_model(TRAP)
    results = beam_search(model, [0], 3, 3, eos_id=3, length_penalty=1.0)
    for seq, score in results:
        logp = sum(float(model(seq[:i])[seq[i]]) for i in range(1, len(seq)))
        assert score == pytest.approx(logp / (len(seq) - 1))
        assert 3 not in seq[:-1], "a sequence ends at its first eos"
    assert [s for _, s in results] == sorted((s for _, s in results), reverse=True)
    assert results[0][0] == [0, 2, 3]  # ends early at eos with the best average log-probability


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, context_length=32, d_model=16, n_layers=2, n_heads=2, pos_encoding="rope")).eval()


def test_gpt_adapters_and_contrastive_search_with_alpha_zero_is_greedy(gpt):
    next_lp, hidden = gpt_next_logprobs(gpt), gpt_hidden_states(gpt)
    prompt = [1, 4, 2]
    torch.testing.assert_close(next_lp(prompt), torch.log_softmax(gpt(torch.tensor([prompt]))[0, -1].double(), -1))
    assert hidden(prompt).shape == (3, 16)
    assert contrastive_search(next_lp, hidden, prompt, 6, k=4, alpha=0.0) == greedy_decode(next_lp, prompt, 6)
    penalised = contrastive_search(next_lp, hidden, prompt, 6, k=4, alpha=0.9)
    assert len(penalised) == 9 and penalised[:3] == prompt


def test_generate_with_cache_equals_without(gpt):
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    torch.testing.assert_close(generate(gpt, prompt, 8, greedy=True), generate(gpt, prompt, 8, greedy=True, use_cache=False))
    a = generate(gpt, prompt, 8, top_k=5, generator=torch.Generator().manual_seed(7))
    b = generate(gpt, prompt, 8, top_k=5, generator=torch.Generator().manual_seed(7), use_cache=False)
    assert torch.equal(a, b) and a.shape == (2, 11)
    greedy = generate(gpt, prompt[:1], 5, greedy=True)[0].tolist()
    assert greedy == greedy_decode(gpt_next_logprobs(gpt), [1, 2, 3], 5)


def test_generate_pads_finished_rows_with_eos(gpt):
    out = generate(gpt, torch.tensor([[1, 2]] * 4), 10, temperature=2.0, eos_id=0,
                   generator=torch.Generator().manual_seed(0))
    for row in out.tolist():
        if 0 in row[2:]:
            first = row.index(0, 2)
            assert all(t == 0 for t in row[first:])


def test_contrastive_decoding_on_a_worked_example():
    """Li et al. (2023): argmax of log p_expert - log p_amateur over V_head = {p_expert >= alpha max p_expert}."""
    from llmarch.decoding import contrastive_decoding

    expert = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    amateur = torch.tensor([0.6, 0.1, 0.299, 0.001]).log()
    # ratios p_e / p_a: 0.83, 3.0, 0.50, 50.0
    run = lambda alpha: contrastive_decoding(lambda s: expert, lambda s: amateur, [0], 1, alpha=alpha)[-1]
    assert run(0.2) == 1      # V_head = {0, 1, 2}: token 3 (ratio 50) is implausible for the expert
    assert run(0.05) == 3     # V_head = all four
    assert run(0.9) == 0      # V_head = {0}: the expert's greedy choice
    with pytest.raises(ValueError, match="alpha"):
        contrastive_decoding(lambda s: expert, lambda s: amateur, [0], 1, alpha=0.0)
