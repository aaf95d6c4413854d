"""``beam_search(..., early_stopping=...)`` against Hugging Face ``transformers`` (a test-only oracle).

A small random ``GPT2LMHeadModel`` gives the next-token distributions; ``model.generate(num_beams=k, ...)`` must
return the same hypotheses, in the same order, as :func:`llmarch.decoding.beam_search` with the same
``early_stopping`` and ``length_penalty``. ``transformers`` computes (and accumulates) log-probabilities in
float32 whatever the model's dtype, so its ``sequences_scores`` are compared to 1e-5; our own scores are checked
exactly against a float64 recomputation of ``sum log p / generated_length ** length_penalty``.
"""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (test-only oracle) is not installed")

from llmarch.decoding import beam_search  # noqa: E402

V, EOS, PAD = 24, 5, 23
MAX_NEW = 8
PROMPTS = ([3, 7], [11, 2, 9, 4])


def _model(seed):
    """Random GPT-2 in float64 whose ``EOS`` is likely enough that beams end often: the final layer norm's bias
    adds ``bias . wte[v]`` to every logit ``v``, so a bias along ``wte[EOS]`` favours ``EOS``."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                     initializer_range=0.3, bos_token_id=0, eos_token_id=EOS, pad_token_id=PAD)
    model = transformers.GPT2LMHeadModel(config).double().eval()
    with torch.no_grad():
        w = model.transformer.wte.weight[EOS]
        model.transformer.ln_f.bias.copy_(2.5 * w / w.norm() ** 2)  # EOS logit + 2.5
    return model


@pytest.fixture(scope="module")
def models():
    return {seed: _model(seed) for seed in (0, 1, 2)}


def _next_logprobs(model):
    """float32 log-softmax as ``transformers`` computes it (so both searches see the same numbers), as float64."""

    @torch.no_grad()
    def next_logprobs(seq):
        return torch.log_softmax(model(torch.tensor([seq])).logits[0, -1].float(), dim=-1).double()

    return next_logprobs


def _hf_beam_search(model, prompt, k, length_penalty, early_stopping):
    config = transformers.GenerationConfig(
        num_beams=k, num_return_sequences=k, do_sample=False, max_new_tokens=MAX_NEW, min_length=0,
        min_new_tokens=None, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=None, length_penalty=length_penalty,
        early_stopping=early_stopping, repetition_penalty=1.0, no_repeat_ngram_size=0, bad_words_ids=None,
        num_beam_groups=1, diversity_penalty=0.0, temperature=None, top_k=None, top_p=None,
        output_scores=True, return_dict_in_generate=True, use_cache=True)
    model.generation_config = config
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    results = []
    for row, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        generated = row[len(prompt):]
        if EOS in generated:  # padding follows the first eos
            generated = generated[:generated.index(EOS) + 1]
        results.append((prompt + generated, score))
    return results


def _score(next_logprobs, prompt, seq, length_penalty):
    total = sum(float(next_logprobs(seq[:i])[seq[i]]) for i in range(len(prompt), len(seq)))
    return total / (len(seq) - len(prompt)) ** length_penalty


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_matches_transformers(models, seed, k, length_penalty, early_stopping):
    model = models[seed]
    next_logprobs = _next_logprobs(model)
    for prompt in PROMPTS:
        expected = _hf_beam_search(model, prompt, k, length_penalty, early_stopping)
        got = beam_search(next_logprobs, prompt, k, MAX_NEW, eos_id=EOS, length_penalty=length_penalty,
                          early_stopping=early_stopping)
        assert [s for s, _ in got] == [s for s, _ in expected], (prompt, got, expected)
        for (seq, score), (_, hf_score) in zip(got, expected):
            assert score == pytest.approx(hf_score, rel=1e-5, abs=1e-5)
            assert score == pytest.approx(_score(next_logprobs, prompt, seq, length_penalty), rel=1e-12, abs=1e-12)
            assert EOS not in seq[len(prompt):-1] and len(seq) <= len(prompt) + MAX_NEW


def test_the_sweep_exercises_eos_and_each_stopping_rule(models):
    """The comparison above is only as good as its cases: beams must end in eos, and the three stopping rules
    must disagree somewhere (so each is actually checked)."""
    ended, differ = {True: 0, False: 0, "never": 0}, set()
    for seed, model in models.items():
        next_logprobs = _next_logprobs(model)
        for prompt in PROMPTS:
            for k in (2, 3, 4):
                for lp in (0.0, 1.0, 2.0):
                    runs = {es: beam_search(next_logprobs, prompt, k, MAX_NEW, eos_id=EOS, length_penalty=lp,
                                            early_stopping=es) for es in (True, False, "never")}
                    for es, results in runs.items():
                        ended[es] += sum(seq[-1] == EOS for seq, _ in results)
                    differ |= {(a, b) for a in runs for b in runs if a != b and runs[a] != runs[b]}
    assert min(ended.values()) >= 20, ended  # of 162 hypotheses per rule
    assert {(True, False), (True, "never"), (False, "never")} <= differ


def _old_beam_search(next_logprobs, prompt, beam_size, max_new_tokens, eos_id=None, length_penalty=0.0):
    """The shrinking beam as it was before ``early_stopping`` existed (a frozen copy, to pin the default)."""
    live, finished = [(list(prompt), 0.0)], []
    for _ in range(max_new_tokens):
        candidates = []
        for beam, score in live:
            values, tokens = torch.sort(next_logprobs(beam), descending=True, stable=True)
            candidates += [(beam + [int(t)], score + float(lp)) for lp, t in zip(values[:beam_size], tokens[:beam_size])]
        candidates.sort(key=lambda c: c[1], reverse=True)
        live = []
        for beam, score in candidates[:beam_size]:
            (finished if beam[-1] == eos_id else live).append((beam, score))
        if not live:
            break
    results = [(b, s / max(len(b) - len(prompt), 1) ** length_penalty) for b, s in finished + live]
    return sorted(results, key=lambda r: r[1], reverse=True)[:beam_size]


@pytest.mark.parametrize("seed", [0, 1])
def test_early_stopping_none_is_the_shrinking_beam(models, seed):
    next_logprobs = _next_logprobs(models[seed])
    for prompt in PROMPTS:
        for k, lp in ((1, 0.0), (2, 1.0), (3, 0.0), (4, 2.0)):
            expected = _old_beam_search(next_logprobs, prompt, k, 6, eos_id=EOS, length_penalty=lp)
            assert beam_search(next_logprobs, prompt, k, 6, eos_id=EOS, length_penalty=lp) == expected
            assert beam_search(next_logprobs, prompt, k, 6, eos_id=EOS, length_penalty=lp,
                               early_stopping=None) == expected


@pytest.mark.parametrize("bad", ["always", "True", 1, 0, 0.5])
def test_early_stopping_is_validated(bad):
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(lambda seq: torch.zeros(4), [0], 2, 3, early_stopping=bad)


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_beam_search_on_a_loaded_llmarch_model_matches_transformers(models, early_stopping):
    """The same comparison with llmarch's own GPT, loaded from the transformers model's weights."""
    from llmarch.decoding import gpt_next_logprobs
    from llmarch.model import load_hf_state_dict

    hf = models[1]
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    float64_logprobs = gpt_next_logprobs(ours)

    def next_logprobs(seq):  # rounded to float32 as transformers rounds its scores, so near-ties order alike
        return float64_logprobs(seq).float().double()

    for prompt in PROMPTS:
        got = beam_search(next_logprobs, prompt, 3, MAX_NEW, eos_id=EOS, length_penalty=1.0,
                          early_stopping=early_stopping)
        expected = _hf_beam_search(hf, prompt, 3, 1.0, early_stopping)
        assert [seq for seq, _ in got] == [seq for seq, _ in expected]
        assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-5, abs=1e-5)
