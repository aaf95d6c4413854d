"""llmarch.train: the loss is the mean cross-entropy, evaluation scores held-out tokens once, training learns."""

import math

import pytest
import torch

from llmarch.data import default_grammar, synthetic_corpus
from llmarch.model import GPT, GPTConfig
from llmarch.train import evaluate, lm_loss, train, warmup_cosine_lr


def test_lm_loss_is_mean_negative_log_probability():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 4, 2], [1, 1, 3]])
    manual = -sum(
        logits[b, t, targets[b, t]] - torch.logsumexp(logits[b, t], 0) for b in range(2) for t in range(3)
    ) / 6
    torch.testing.assert_close(lm_loss(logits, targets), manual)
    with pytest.raises(ValueError, match=r"logits has shape \(2, 3, 5\) but targets has shape \(2, 4\)"):
        lm_loss(logits, torch.zeros(2, 4, dtype=torch.long))


def test_evaluate_of_an_untrained_uniform_model_is_log_vocab():
    class Uniform(torch.nn.Module):
        def forward(self, idx):
            return torch.zeros(*idx.shape, 7)

    assert evaluate(Uniform(), torch.randint(0, 7, (200,)), context_length=9) == pytest.approx(math.log(7))


def test_warmup_cosine_schedule_endpoints():
    assert warmup_cosine_lr(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert warmup_cosine_lr(9, 1.0, 10, 100) == pytest.approx(1.0)
    assert warmup_cosine_lr(100, 1.0, 10, 100) == pytest.approx(0.1)


def test_warmup_cosine_lr_is_cosine_schedule_read_one_step_ahead_in_the_warm_up():
    """One schedule in the library: the loop's is optim.cosine_schedule (DESIGN.md's contract), its values
    those of the formula it always had (GPT-1's: (s + 1) / w in the warm-up, cosine to 10% after)."""
    for warmup, total in [(10, 100), (50, 1200), (0, 30), (5, 5)]:
        for step in range(total + 3):
            if step < warmup:
                expected = 3e-3 * (step + 1) / warmup
            else:
                progress = min(1.0, (step - warmup) / max(1, total - warmup))
                expected = 3e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
            assert warmup_cosine_lr(step, 3e-3, warmup, total) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="step must be >= 0"):  # the contract's checks hold here too
        warmup_cosine_lr(-1, 3e-3, 10, 100)


def test_short_training_beats_the_unigram_baseline_and_is_reproducible():
    g = default_grammar()
    train_data, eval_data = synthetic_corpus(20_000, seed=1), synthetic_corpus(3_000, seed=2)
    counts = torch.bincount(train_data, minlength=g.vocab_size).double()
    probs = counts[counts > 0] / counts.sum()
    unigram_entropy = float(-(probs * probs.log()).sum())

    def run():
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=g.vocab_size, context_length=32, d_model=32, n_layers=1, n_heads=2))
        return train(model, train_data, steps=120, context_length=32, batch_size=16, lr=3e-3, warmup=10,
                     eval_data=eval_data, eval_every=60)

    first, second = run(), run()
    assert first.steps == [60, 120] and first.tokens == [60 * 16 * 32, 120 * 16 * 32]
    assert first.eval_loss == second.eval_loss, "same seed, same result"
    assert first.eval_loss[-1] < unigram_entropy - 0.2, (first.eval_loss, unigram_entropy)
    assert first.eval_loss[-1] > g.entropy_rate() - 0.05, "no model can beat the entropy rate by much"
