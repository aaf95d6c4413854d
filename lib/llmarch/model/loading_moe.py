"""Loading mixture-of-experts checkpoints (transformers' Mixtral and DeepSeek-V3) into :class:`GPT`; registered in
:mod:`llmarch.model.loading`, whose ``config_from_hf``, ``load_hf_state_dict`` and ``load_pretrained`` read them.

Book: From GPT-2 to Llama 3, "After Llama 3".

- ``mixtral``: Mistral's decoder with every FFN a top-2 of 8 (``num_experts_per_tok`` of ``num_local_experts``)
  ``softmax_topk`` mixture (:class:`llmarch.moe.MoEConfig`).
- ``deepseek_v3``: multi-head latent attention (:class:`llmarch.mla.MLAConfig`), the first
  ``first_k_dense_replace`` layers dense, the others ``n_shared_experts`` shared plus ``num_experts_per_tok`` of
  ``n_routed_experts`` experts chosen by the ``sigmoid_bias`` router (``e_score_correction_bias``, groups).
  The multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the next-token forward pass and
  are dropped, as transformers drops them.

Expert weights come in either layout: transformers 5's fused ``experts.gate_up_proj (E, 2 d_ff, d)`` and
``experts.down_proj (E, d, d_ff)``, or the released files' one matrix per expert (Mixtral's
``block_sparse_moe.experts.{e}.w1/w2/w3``, DeepSeek's ``mlp.experts.{e}.gate_proj/up_proj/down_proj``).
"""

from __future__ import annotations

import llmarch.model.loading as hf  # its helpers are read at call time: loading imports this module
from llmarch.mla import MLAConfig
from llmarch.model.config import GPTConfig
from llmarch.moe import MoEConfig

__all__ = ["MOE_MODEL_TYPES", "moe_config_from_hf", "MOE_WEIGHTS"]

MOE_MODEL_TYPES = ("mixtral", "deepseek_v3")


def moe_config_from_hf(keys, model_type: str) -> GPTConfig:
    """The :class:`GPTConfig` of a ``mixtral`` or ``deepseek_v3`` config read through ``loading``'s key reader
    ``keys`` (which names every key left unread). transformers' Mixtral balancing loss counts each token's
    ``top_k`` choices, ``top_k`` times :func:`llmarch.moe.load_balancing_loss`: its ``router_aux_loss_coef``
    becomes ``balance_coef = top_k * router_aux_loss_coef``. Router jitter and DeepSeek's sequence-wise loss
    switches are training settings, read and not used."""
    d_model, n_heads = keys.get("hidden_size", required=True), keys.get("num_attention_heads", required=True)
    top_k = keys.get("num_experts_per_tok", 2)
    keys.get("output_router_logits")  # whether transformers returns the router logits: no effect on the logits
    common = dict(vocab_size=keys.get("vocab_size", required=True), d_model=d_model, n_heads=n_heads,
                  context_length=keys.get("max_position_embeddings", 4096),
                  n_layers=keys.get("num_hidden_layers", required=True),
                  d_ff=keys.get("intermediate_size", required=True),
                  activation=hf._activation(keys, "hidden_act", "silu"), norm="rmsnorm",
                  norm_eps=keys.get("rms_norm_eps", 1e-6), ffn="swiglu",
                  tie_embeddings=keys.get("tie_word_embeddings", False), pos_encoding="rope", rope_layout="half",
                  **hf._rope_options(keys))
    if model_type == "mixtral":
        keys.expect("head_dim", {None, d_model // n_heads}, None)
        keys.get("router_jitter_noise")
        moe = MoEConfig(n_experts=keys.get("num_local_experts", required=True), top_k=top_k,
                        balance_coef=top_k * keys.get("router_aux_loss_coef", 0.001), z_coef=0.0)
        return GPTConfig(**common, n_kv_heads=keys.get("num_key_value_heads", n_heads), bias=False,
                         sliding_window=keys.get("sliding_window"), moe=moe)
    keys.expect("num_key_value_heads", {n_heads}, n_heads)
    keys.expect("scoring_func", {"sigmoid"}, "sigmoid")
    keys.expect("topk_method", {"noaux_tc"}, "noaux_tc")
    keys.expect("moe_layer_freq", {1}, 1)
    for training_only in ("num_nextn_predict_layers", "ep_size", "seq_aux"):
        keys.get(training_only)
    mla = MLAConfig(kv_lora_rank=keys.get("kv_lora_rank", required=True), q_lora_rank=keys.get("q_lora_rank"),
                    qk_nope_head_dim=keys.get("qk_nope_head_dim", required=True),
                    qk_rope_head_dim=keys.get("qk_rope_head_dim", required=True),
                    v_head_dim=keys.get("v_head_dim", required=True), rope_interleave=keys.get("rope_interleave", True))
    keys.expect("head_dim", {None, mla.qk_rope_head_dim}, None)  # transformers derives both
    keys.expect("qk_head_dim", {None, mla.qk_nope_head_dim + mla.qk_rope_head_dim}, None)
    moe = MoEConfig(n_experts=keys.get("n_routed_experts", required=True), top_k=top_k,
                    d_expert=keys.get("moe_intermediate_size", required=True),
                    n_shared_experts=keys.get("n_shared_experts", 0), router="sigmoid_bias",
                    n_group=keys.get("n_group", 1), topk_group=keys.get("topk_group", 1),
                    norm_topk_prob=keys.get("norm_topk_prob", True),
                    routed_scaling_factor=float(keys.get("routed_scaling_factor", 1.0)),
                    first_dense_layers=keys.get("first_k_dense_replace", 0),
                    balance_coef=keys.get("aux_loss_alpha", 0.0), z_coef=0.0)
    return GPTConfig(**common, bias=keys.get("attention_bias", False), moe=moe, mla=mla)


def _pop_experts(sd: dict, fused: str, per_expert: str, names: tuple[str, str, str], n_experts: int) -> list:
    """``[(w1, w3, w2)] * n_experts`` (gate, up, down) from the fused tensors ``fused + "gate_up_proj"`` and
    ``fused + "down_proj"``, or from ``per_expert.format(e) + name + ".weight"`` for ``names`` (gate, up, down)."""
    if fused + "gate_up_proj" in sd:
        gate_up, down = sd.pop(fused + "gate_up_proj"), sd.pop(fused + "down_proj")
        return [(*gate_up[e].chunk(2, dim=0), down[e]) for e in range(n_experts)]
    return [tuple(sd.pop(per_expert.format(e) + name + ".weight") for name in names) for e in range(n_experts)]


def _put_swiglu(out: dict, prefix: str, weights) -> None:
    for name, w in zip(("w1", "w3", "w2"), weights):
        out[f"{prefix}{name}.weight"] = w


def _mixtral_weights(sd: dict, c: GPTConfig):
    sd = hf._strip_prefix(sd, ("model.",))
    out = {"tok_emb.weight": sd.pop("embed_tokens.weight"), "norm_f.weight": sd.pop("norm.weight")}
    head = sd.pop("lm_head.weight", None)
    for i in range(c.n_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        for theirs, ours in (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"),
                             *((f"self_attn.{n}", f"attn.{n}") for n in ("q_proj", "k_proj", "v_proj", "o_proj"))):
            out[f"{q}{ours}.weight"] = sd.pop(f"{p}{theirs}.weight")
        moe = "mlp." if f"{p}mlp.gate.weight" in sd else "block_sparse_moe."
        out[f"{q}ffn.router.weight"] = sd.pop(f"{p}{moe}gate.weight")
        experts = _pop_experts(sd, f"{p}mlp.experts.", p + "block_sparse_moe.experts.{}.", ("w1", "w3", "w2"),
                               c.moe.n_experts)
        for e, weights in enumerate(experts):
            _put_swiglu(out, f"{q}ffn.experts.{e}.", weights)
    return out, head, sd


_MLA_NAMES = {"q_proj": "q_proj", "q_a_proj": "q_a_proj", "q_a_layernorm": "q_a_norm", "q_b_proj": "q_b_proj",
              "kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm", "kv_b_proj": "kv_b_proj",
              "o_proj": "o_proj"}


def _deepseek_v3_weights(sd: dict, c: GPTConfig):
    sd = hf._strip_prefix(sd, ("model.",))
    out = {"tok_emb.weight": sd.pop("embed_tokens.weight"), "norm_f.weight": sd.pop("norm.weight")}
    head = sd.pop("lm_head.weight", None)
    for name in [n for n in sd if n.startswith(f"layers.{c.n_layers}.")]:  # multi-token prediction
        del sd[name]
    swiglu = ("gate_proj", "up_proj", "down_proj")
    for i in range(c.n_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        out[f"{q}norm1.weight"] = sd.pop(f"{p}input_layernorm.weight")
        out[f"{q}norm2.weight"] = sd.pop(f"{p}post_attention_layernorm.weight")
        for theirs, ours in _MLA_NAMES.items():
            for kind in ("weight", "bias"):
                if f"{p}self_attn.{theirs}.{kind}" in sd:
                    out[f"{q}attn.{ours}.{kind}"] = sd.pop(f"{p}self_attn.{theirs}.{kind}")
        if not c.moe.is_moe_layer(i):
            _put_swiglu(out, f"{q}ffn.", [sd.pop(f"{p}mlp.{n}.weight") for n in swiglu])
            continue
        out[f"{q}ffn.router.weight"] = sd.pop(f"{p}mlp.gate.weight")
        out[f"{q}ffn.expert_bias"] = sd.pop(f"{p}mlp.gate.e_score_correction_bias")
        for e, weights in enumerate(_pop_experts(sd, f"{p}mlp.experts.", p + "mlp.experts.{}.", swiglu,
                                                 c.moe.n_experts)):
            _put_swiglu(out, f"{q}ffn.experts.{e}.", weights)
        if c.moe.n_shared_experts:
            _put_swiglu(out, f"{q}ffn.shared.", [sd.pop(f"{p}mlp.shared_experts.{n}.weight") for n in swiglu])
    return out, head, sd


MOE_WEIGHTS = {"mixtral": _mixtral_weights, "deepseek_v3": _deepseek_v3_weights}
