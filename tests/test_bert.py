"""llmarch's BERT against transformers' own BERT classes (BertForMaskedLM, BertForSequenceClassification,
BertForQuestionAnswering, BertForPreTraining), built from small configs with random weights (nothing is
downloaded), loaded with ``llmarch.model.load_hf_state_dict`` / ``load_pretrained`` and compared output by output,
with segments (token_type_ids mixed 0/1) and padding masks.

Tolerances: ``max |ours - theirs| <= tol * max |theirs|`` over the real (unpadded) positions, ``tol = 1e-5`` in
float32 and ``1e-10`` in float64. Unlike Llama's code (see test_hf_equivalence.py), transformers' BERT computes
everything in the model's dtype (nn.LayerNorm, erf GELU, eager softmax, a mask in the embeddings' dtype), so the
float64 oracle runs unmodified.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the test oracle (pip install -e '.[test]')")

from llmarch.model import (  # noqa: E402
    GPT, BertConfig, BertEncoder, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, GPTConfig,
    bert_config, config_from_hf, count_parameters, load_hf_state_dict, load_pretrained,
)

TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
DTYPES = [torch.float32, torch.float64]
VOCAB, LENGTH = 61, 24


def _hf_config(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
                max_position_embeddings=32, type_vocab_size=2)
    return transformers.BertConfig(**{**base, **kw})


def _hf_model(cls, dtype, seed=0, **config):
    torch.manual_seed(seed)
    hf_config = _hf_config(**config)
    hf_config._attn_implementation = "eager"
    model = cls(hf_config)
    with torch.no_grad():  # non-trivial norms and biases, so a missing or misplaced one shows
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    return model.to(dtype).eval()


def _inputs(batch=3, length=LENGTH, seed=1):
    """Ids, segments (A then B, the boundary differs per row) and a padding mask (rows of 24, 17 and 6 tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    boundary = torch.tensor([10, 5, 3])[:batch, None]
    token_type_ids = (torch.arange(length)[None, :] >= boundary).long()
    attention_mask = (torch.arange(length)[None, :] < torch.tensor([length, 17, 6])[:batch, None]).long()
    return ids, token_type_ids, attention_mask


def _assert_close(got, theirs, real, dtype, what):
    err = float((got - theirs)[real].abs().max() / theirs[real].abs().max())
    assert err <= TOL[dtype], f"{what} differ: max relative error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_lm_matches_transformers_with_segments_and_padding(dtype):
    hf = _hf_model(transformers.BertForMaskedLM, dtype)
    ours = load_hf_state_dict(hf.state_dict(), hf.config)
    assert isinstance(ours, BertForMaskedLM) and next(ours.parameters()).dtype == dtype
    assert ours.decoder.weight is ours.bert.tok_emb.weight
    ids, segments, mask = _inputs()
    real = mask.bool()
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=segments, attention_mask=mask).logits
        _assert_close(ours(ids, segments, mask), theirs, real, dtype, "MLM logits")
        _assert_close(ours.encode(ids, segments, mask),
                      hf.bert(ids, token_type_ids=segments, attention_mask=mask).last_hidden_state, real, dtype,
                      "hidden states")
        everything = torch.ones_like(real)  # no mask, default segments (all A)
        _assert_close(ours(ids), hf(ids).logits, everything, dtype, "unmasked MLM logits")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sequence_classification_head_matches_transformers(dtype):
    hf = _hf_model(transformers.BertForSequenceClassification, dtype, num_labels=3)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    assert isinstance(ours, BertForSequenceClassification) and ours.num_labels == 3
    ids, segments, mask = _inputs()
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=segments, attention_mask=mask).logits
        got = ours(ids, segments, mask)
    assert got.shape == (3, 3)
    _assert_close(got, theirs, torch.ones_like(got, dtype=torch.bool), dtype, "class logits")


@pytest.mark.parametrize("dtype", DTYPES)
def test_question_answering_head_matches_transformers(dtype):
    hf = _hf_model(transformers.BertForQuestionAnswering, dtype)
    ours = load_hf_state_dict(hf.state_dict(), hf.config.to_dict())
    assert isinstance(ours, BertForQuestionAnswering)
    ids, segments, mask = _inputs()
    with torch.no_grad():
        out = hf(ids, token_type_ids=segments, attention_mask=mask)
        start, end = ours(ids, segments, mask)
    assert start.shape == end.shape == ids.shape
    _assert_close(start, out.start_logits, mask.bool(), dtype, "start logits")
    _assert_close(end, out.end_logits, mask.bool(), dtype, "end logits")


def test_padded_positions_do_not_change_real_outputs():
    """Tokens and segments at padded positions are invisible to the real tokens, and a padded row computes what
    the same row computes alone, unpadded."""
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, d_model=32, n_heads=4, max_position_embeddings=LENGTH))
    model = model.double().eval()
    ids, segments, mask = _inputs()
    real = mask.bool()
    changed_ids = torch.where(real, ids, (ids + 7) % VOCAB)
    changed_segments = torch.where(real, segments, 1 - segments)
    assert not torch.equal(changed_ids, ids)
    before = model(ids, segments, mask)
    after = model(changed_ids, changed_segments, mask)
    torch.testing.assert_close(after[real], before[real], rtol=0, atol=1e-12)
    alone = model(ids[1:2, :17], segments[1:2, :17])
    torch.testing.assert_close(before[1, :17], alone[0], rtol=0, atol=1e-12)
    assert not torch.allclose(model(changed_ids, changed_segments)[real], before[real])  # without the mask it leaks


def test_bert_is_bidirectional_unlike_gpt():
    """Changing the last token changes the outputs at every earlier position of BERT, and at none of GPT's."""
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(vocab_size=VOCAB, d_model=32, n_heads=4)).eval()
    gpt = GPT(GPTConfig(vocab_size=VOCAB, d_model=32, n_heads=4, n_layers=2)).eval()
    ids = _inputs()[0][:, :12]
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        bert_delta = (bert(changed) - bert(ids))[:, :-1].abs().amax(dim=-1)
        gpt_delta = (gpt(changed) - gpt(ids))[:, :-1].abs().amax(dim=-1)
    assert (bert_delta > 1e-6).all(), "some earlier position of BERT did not see the last token"
    assert (gpt_delta == 0).all()


def test_a_pretraining_checkpoint_loads_as_masked_lm(tmp_path):
    """bert-base-uncased's files hold BertForPreTraining (MLM + pooler + NSP head); saved and read back with
    load_pretrained (safetensors drops the tied decoder), the MLM logits match its prediction logits."""
    hf = _hf_model(transformers.BertForPreTraining, torch.float32)
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    assert isinstance(ours, BertForMaskedLM)
    ids, segments, mask = _inputs()
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=segments, attention_mask=mask).prediction_logits
        _assert_close(ours(ids, segments, mask), theirs, mask.bool(), torch.float32, "MLM logits")


def test_untied_decoder_and_missing_tensors_are_refused():
    hf = _hf_model(transformers.BertForMaskedLM, torch.float32)
    state = {name: t.clone() for name, t in hf.state_dict().items()}
    state["cls.predictions.decoder.weight"] += 1.0
    with pytest.raises(ValueError, match="decoder.weight"):
        load_hf_state_dict(state, hf.config)
    state = hf.state_dict()
    state.pop("cls.predictions.transform.LayerNorm.weight")
    with pytest.raises(ValueError, match="transform.LayerNorm.weight"):
        load_hf_state_dict(state, hf.config)
    with pytest.raises(ValueError, match="unexpected"):
        load_hf_state_dict({**hf.state_dict(), "bert.extra.weight": torch.zeros(2)}, hf.config)


@pytest.mark.parametrize("change,message", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"is_decoder": True}, "is_decoder"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
    ({"hidden_act": "quick_gelu"}, "hidden_act"),
    ({"embedding_size": 16}, "embedding_size"),
    ({"hidden_size": 50}, "not divisible"),
])
def test_unsupported_config_keys_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**_hf_config().to_dict(), **change})


# bert-base-uncased's config.json as the hub serves it (a pre-transformers-5 file).
BERT_BASE_CONFIG_JSON = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
    "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "transformers_version": "4.6.0.dev0", "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522,
}


def test_published_config_reads_as_the_preset_with_transformers_parameter_count():
    assert config_from_hf(BERT_BASE_CONFIG_JSON) == bert_config("bert-base-uncased")
    with torch.device("meta"):
        ours = BertForMaskedLM(bert_config("bert-base-uncased"))
        theirs = transformers.BertForMaskedLM(transformers.BertConfig(**BERT_BASE_CONFIG_JSON))
    assert count_parameters(ours) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("call,message", [
    (lambda m, ids, seg, mask: m(ids.float()), "torch.long"),
    (lambda m, ids, seg, mask: m(torch.zeros(2, 40, dtype=torch.long)), "positions"),
    (lambda m, ids, seg, mask: m(ids, seg + 1), "token_type_ids"),
    (lambda m, ids, seg, mask: m(ids, seg[:, :5]), "token_type_ids"),
    (lambda m, ids, seg, mask: m(ids, seg, mask[:, :5]), "attention_mask"),
    (lambda m, ids, seg, mask: m(ids, seg, mask.float()), "bool or integer"),
    (lambda m, ids, seg, mask: m(ids, seg, 2 * mask), "only 0"),
    (lambda m, ids, seg, mask: m(ids, seg, torch.zeros_like(mask)), "every position"),
])
def test_bad_inputs_raise_naming_the_problem(call, message):
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, d_model=16, n_heads=2, max_position_embeddings=32))
    with pytest.raises(ValueError, match=message):
        call(model, *_inputs())


def test_an_encoder_moves_between_task_models():
    """Fine-tuning starts from the pretrained encoder: the classifier's features are then the MLM model's."""
    config = BertConfig(vocab_size=VOCAB, d_model=16, n_heads=2)
    mlm, clf = BertForMaskedLM(config).eval(), BertForSequenceClassification(config, num_labels=4).eval()
    ids, segments, mask = _inputs()
    assert not torch.allclose(clf.encode(ids, segments, mask), mlm.encode(ids, segments, mask))
    clf.bert.load_state_dict(mlm.bert.state_dict())
    torch.testing.assert_close(clf.encode(ids, segments, mask), mlm.encode(ids, segments, mask), rtol=0, atol=0)
    assert clf(ids, segments, mask).shape == (3, 4) and isinstance(clf.bert, BertEncoder)
