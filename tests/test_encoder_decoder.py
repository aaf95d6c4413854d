"""llmarch.model.EncoderDecoder: against torch's nn.Transformer (same weights), decoder causality and source
padding by perturbation, cache == no cache, and two tiny trainings that need cross-attention: copying a random
sequence, and filling T5-style sentinel spans."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmarch.attention import causal_mask
from llmarch.kv_cache import KVCache
from llmarch.model import EncoderDecoder, EncoderDecoderConfig, shift_right


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is faster than several, and does not wait for cores other tests use."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    config = dict(vocab_size=17, max_source_length=12, max_target_length=10, d_model=24, n_heads=3,
                  n_encoder_layers=2, n_decoder_layers=2)
    model = EncoderDecoder(EncoderDecoderConfig(**{**config, **kw})).double().eval()
    with torch.no_grad():  # non-trivial norms and biases, so a misplaced one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    return model


def _batch(seed=1):
    """Sources of 12, 8 and 3 real tokens (right-padded with 0) and decoder inputs of 10 tokens."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 17, (3, 12), generator=g)
    src_mask = (torch.arange(12)[None, :] < torch.tensor([[12], [8], [3]])).long()
    return src.masked_fill(src_mask == 0, 0), src_mask, torch.randint(1, 17, (3, 10), generator=g)


def _copy_attention(ours, theirs):
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.load_state_dict(ours.o_proj.state_dict())


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
def test_matches_torch_transformer_with_the_same_weights():
    """torch's nn.Transformer with norm_first=True is the same architecture: pre-LN encoder and decoder layers,
    each stack ending in a LayerNorm; only the embeddings and the tied output layer are outside it."""
    model = _model()
    c = model.config
    ref = nn.Transformer(c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, dim_feedforward=4 * c.d_model,
                         dropout=0.0, activation="gelu", batch_first=True, norm_first=True,
                         dtype=torch.float64).eval()
    with torch.no_grad():
        for ours, theirs in zip(model.encoder_blocks, ref.encoder.layers):
            _copy_attention(ours.attn, theirs.self_attn)
            for a, b in ((ours.ffn.w1, theirs.linear1), (ours.ffn.w2, theirs.linear2), (ours.norm1, theirs.norm1),
                         (ours.norm2, theirs.norm2)):
                b.load_state_dict(a.state_dict())
        for ours, theirs in zip(model.decoder_blocks, ref.decoder.layers):
            _copy_attention(ours.attn, theirs.self_attn)
            _copy_attention(ours.cross_attn, theirs.multihead_attn)
            for a, b in ((ours.ffn.w1, theirs.linear1), (ours.ffn.w2, theirs.linear2), (ours.norm1, theirs.norm1),
                         (ours.norm_cross, theirs.norm2), (ours.norm2, theirs.norm3)):
                b.load_state_dict(a.state_dict())
        ref.encoder.norm.load_state_dict(model.encoder_norm.state_dict())
        ref.decoder.norm.load_state_dict(model.decoder_norm.state_dict())
    src, src_mask, tgt_in = _batch()
    src_emb = model.tok_emb(src) + model.src_pos_emb.weight[:12]
    tgt_emb = model.tok_emb(tgt_in) + model.tgt_pos_emb.weight[:10]
    padding = src_mask == 0  # torch's key_padding_mask: True = ignore
    with torch.no_grad():
        hidden = ref(src_emb, tgt_emb, tgt_mask=~causal_mask(10), src_key_padding_mask=padding,
                     memory_key_padding_mask=padding)
        expected = hidden @ model.tok_emb.weight.T
        got = model(src, tgt_in, src_mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_decoder_is_causal_by_perturbation():
    model = _model()
    src, src_mask, tgt_in = _batch()
    changed = tgt_in.clone()
    changed[:, 6:] = (changed[:, 6:] + 1 + torch.arange(4)) % 17
    with torch.no_grad():
        before, after = model(src, tgt_in, src_mask), model(src, changed, src_mask)
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=0)
    assert not torch.allclose(after[:, 6:], before[:, 6:])


def test_padded_source_positions_are_invisible():
    """Other tokens at padded source positions change nothing, and a padded row computes what the same source
    computes alone; a real source token changes every target position (cross-attention reads the source)."""
    model = _model()
    src, src_mask, tgt_in = _batch()
    with torch.no_grad():
        before = model(src, tgt_in, src_mask)
        after = model(torch.where(src_mask.bool(), src, (src + 5) % 17), tgt_in, src_mask)
        alone = model(src[1:2, :8], tgt_in[1:2])
        source_changed = src.clone()
        source_changed[:, 0] = (source_changed[:, 0] + 1) % 17
        moved = model(source_changed, tgt_in, src_mask)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
    torch.testing.assert_close(before[1], alone[0], rtol=0, atol=1e-12)
    assert ((moved - before).abs().amax(dim=-1) > 1e-6).all()


def test_cached_decoding_equals_a_full_recompute():
    model = _model()
    src, src_mask, tgt_in = _batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt_in, memory, src_mask)
        cache = KVCache(model.config.n_decoder_layers)
        pieces = [model.decode(tgt_in[:, :4], memory, src_mask, kv_cache=cache)]
        pieces += [model.decode(tgt_in[:, u:u + 1], memory, src_mask, kv_cache=cache) for u in range(4, 10)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-12)
    cached = model.generate(src, 10, src_mask)
    assert cached.shape == (3, 10)
    assert torch.equal(cached, model.generate(src, 10, src_mask, use_cache=False))


def test_shift_right_is_teacher_forcing_input():
    targets = torch.tensor([[15, 7, 8, 16, 9], [15, 3, 16, 4, -100]])
    assert shift_right(targets, start_token_id=0).tolist() == [[0, 15, 7, 8, 16], [0, 15, 3, 16, 4]]
    assert shift_right(torch.tensor([[5, -100, -100]]), 0, pad_token_id=2).tolist() == [[0, 5, 2]]


def test_learns_to_copy_through_cross_attention(one_thread):
    """The decoder input is the copy so far, so only cross-attention can tell it the next source token. After 300
    Adam steps (about 2 s) held-out sequences are copied exactly; with an end token, generation stops there."""
    torch.manual_seed(0)
    vocab, length = 12, 6
    model = EncoderDecoder(EncoderDecoderConfig(vocab_size=vocab, max_source_length=length,
                                                max_target_length=length, d_model=32, n_heads=4,
                                                n_encoder_layers=1, n_decoder_layers=1))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        src = torch.randint(1, vocab, (32, length), generator=g)
        loss = F.cross_entropy(model(src, shift_right(src, 0)).flatten(0, 1), src.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    held_out = torch.randint(1, vocab, (200, length), generator=g)
    with torch.no_grad():
        held_loss = F.cross_entropy(model(held_out, shift_right(held_out, 0)).flatten(0, 1), held_out.flatten())
    assert held_loss < 0.1, f"held-out copy loss {held_loss:.3f} (uniform guessing: {torch.log(torch.tensor(11.)):.2f})"
    exact = (model.generate(held_out, length) == held_out).all(dim=1).float().mean()
    assert exact >= 0.95, f"only {exact:.0%} of held-out sequences copied exactly"
    end = 11  # an ordinary token used as the end token: copying stops at its first occurrence, then pads
    src = torch.tensor([[3, 11, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6], [4, 4, 4, 11, 2, 2]])
    out = model.generate(src, length, eos_token_id=end)
    assert out.tolist() == [[3, 11, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6], [4, 4, 4, 11, 0, 0]]
    assert model.generate(src[:1], length, eos_token_id=end).shape == (1, 2)  # every row ended: it stops


# Span corruption in T5's format, with the noise spans given (the objective's random spans are
# llmarch.objectives.t5_span_corruption's job): each span becomes a sentinel in the input, and the target is each
# sentinel followed by its span, with no end token.
def _span_corrupt(ids: list, spans: list, sentinels: list) -> tuple[list, list]:
    inputs, targets, previous = [], [], 0
    for sentinel, (start, end) in zip(sentinels, spans):
        inputs += ids[previous:start] + [sentinel]
        targets += [sentinel] + ids[start:end]
        previous = end
    return inputs + ids[previous:], targets


def test_span_corruption_format_on_a_worked_example():
    inputs, targets = _span_corrupt(list("abcdefgh"), [(2, 4), (6, 7)], ["<X>", "<Y>"])
    assert inputs == ["a", "b", "<X>", "e", "f", "<Y>", "h"] and targets == ["<X>", "c", "d", "<Y>", "g"]


def test_trains_on_span_corruption_batches(one_thread):
    """Sequences count up (``x_t = a + t mod 12``), so a missing span follows from what surrounds it. Inputs
    (B, S) right-padded with a source mask, targets (B, U) padded with -100, decoder input shift_right(targets):
    after 200 steps the held-out loss is far below guessing (ln 15 = 2.71)."""
    count, length, sentinels, vocab = 12, 10, [13, 14], 15

    def batch(n, g):
        sources, targets = [], []
        for _ in range(n):
            start = int(torch.randint(0, count, (1,), generator=g))
            l1, l2 = torch.randint(1, 4, (2,), generator=g).tolist()
            a1 = int(torch.randint(0, length - l1 - l2 - 1, (1,), generator=g))
            a2 = int(torch.randint(a1 + l1 + 1, length - l2 + 1, (1,), generator=g))
            ids = [(start + t) % count + 1 for t in range(length)]
            source, target = _span_corrupt(ids, [(a1, a1 + l1), (a2, a2 + l2)], sentinels)
            sources.append(source)
            targets.append(target)
        s, u = max(map(len, sources)), max(map(len, targets))
        src = torch.tensor([x + [0] * (s - len(x)) for x in sources])
        src_mask = torch.tensor([[1] * len(x) + [0] * (s - len(x)) for x in sources])
        return src, src_mask, torch.tensor([y + [-100] * (u - len(y)) for y in targets])

    torch.manual_seed(1)
    model = EncoderDecoder(EncoderDecoderConfig(vocab_size=vocab, max_source_length=length, max_target_length=length,
                                                d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(11)

    def loss_on(src, src_mask, targets):
        logits = model(src, shift_right(targets, 0), src_mask)
        assert logits.shape == (*targets.shape, vocab)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)

    for _ in range(200):
        loss = loss_on(*batch(32, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        held_loss = float(loss_on(*batch(200, g)))
    assert held_loss < 0.5, f"held-out span-corruption loss {held_loss:.3f}"


@pytest.mark.parametrize("call,message", [
    (lambda m, src, mask, tgt: m(src.float(), tgt), "torch.long"),
    (lambda m, src, mask, tgt: m(src, tgt, mask[:, :4]), "src_mask"),
    (lambda m, src, mask, tgt: m(src, torch.zeros(3, 11, dtype=torch.long)), "max_target_length"),
    (lambda m, src, mask, tgt: m(torch.zeros(3, 13, dtype=torch.long), tgt), "positions"),
    (lambda m, src, mask, tgt: m(src, tgt + 17), "vocab_size"),
    (lambda m, src, mask, tgt: m.decode(tgt, torch.zeros(2, 12, 24, dtype=torch.float64)), "memory"),
    (lambda m, src, mask, tgt: m.generate(src, 0), "max_new_tokens"),
    (lambda m, src, mask, tgt: m.generate(src, 3, eos_token_id=17), "eos_token_id"),
])
def test_bad_inputs_raise_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call(_model(), *_batch())


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="n_heads"):
        EncoderDecoderConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        EncoderDecoderConfig(vocab_size=10, decoder_start_token_id=10)
