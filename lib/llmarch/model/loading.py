"""Loading official checkpoints (transformers' GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3 (text),
OLMo 2, Phi-3 and GPT-NeoX/Pythia layouts into :class:`GPT`; BERT's into :class:`BertForMaskedLM`,
:class:`BertForSequenceClassification` or :class:`BertForQuestionAnswering`).

Book: From GPT-2 to Llama 3, "Loading a real checkpoint". Book: Pretraining objectives, "The BERT encoder".

``config_from_hf(config_dict)`` reads a checkpoint's ``config.json`` (as a dict) into a :class:`GPTConfig` (a
:class:`BertConfig` for BERT); ``load_hf_state_dict(state_dict, config_dict)`` renames (and, for GPT-2's ``Conv1D``
and the fused projections of GPT-2, GPT-NeoX and Phi-3, transposes and splits) the weights into a model;
``load_pretrained(path)`` does both for a local folder of ``config.json`` and ``*.safetensors`` files. Nothing is
downloaded. Every config key is either used, checked against the one value this library implements, or known to be
irrelevant to the forward pass (metadata and training-only settings); any other key raises ``ValueError`` naming it,
so a checkpoint is never run as a different architecture silently.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from llmarch.model.bert import BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification
from llmarch.model.config import GPTConfig
from llmarch.model.gpt import GPT
from llmarch.model.loading_moe import MOE_MODEL_TYPES, MOE_WEIGHTS, moe_config_from_hf

__all__ = ["config_from_hf", "load_hf_state_dict", "load_pretrained", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("gpt2", "llama", "gpt_neox", "bert", "mistral", "qwen3", "qwen2", "gemma", "gemma2",
                         "gemma3_text", "olmo2", "phi3", *MOE_MODEL_TYPES)
# Llama's layout (RMSNorm, SwiGLU/GeGLU, rotate-half RoPE) with the differences config_from_hf reads per family.
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2", "phi3")

# Keys that do not change the forward pass at inference: metadata, tokens ids, generation, initialisation,
# dropout, and the heads of other task classes.
_IRRELEVANT_KEYS = {
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype", "torch_dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
    "initializer_range", "id2label", "label2id", "num_labels", "problem_type", "output_attentions",
    "output_hidden_states", "return_dict", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
    "tokenizer_class", "task_specific_params", "prefix", "finetuning_task", "torchscript", "tf_legacy_loss",
    "use_bfloat16", "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout", "hidden_dropout",
    "classifier_dropout", "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "reorder_and_upcast_attn", "pretraining_tp", "use_memory_efficient_attention",
    "n_ctx", "attention_probs_dropout_prob", "gradient_checkpointing", "cache_implementation",
}

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu"}


class _Keys:
    """Reads a config dict and remembers which keys were used, to name the ones that were not."""

    def __init__(self, config: dict):
        self.config, self.used = config, set()

    def get(self, key, default=None, required: bool = False):
        self.used.add(key)
        if required and key not in self.config:
            raise ValueError(f"the checkpoint config has no {key!r}, which a {self.config.get('model_type')} model needs")
        value = self.config.get(key, default)
        return default if value is None else value

    def expect(self, key, allowed, default):
        value = self.get(key, default)
        if value not in allowed:
            raise ValueError(f"the checkpoint config sets {key}={value!r}, which llmarch does not implement "
                             f"(supported: {sorted(map(repr, allowed))})")
        return value

    def check_all_used(self):
        unknown = sorted(set(self.config) - self.used - _IRRELEVANT_KEYS)
        if unknown:
            raise ValueError(f"unsupported config keys for model_type {self.config.get('model_type')!r}: {unknown}")


def _activation(keys: _Keys, key: str, default: str) -> str:
    name = keys.get(key, default)
    if name not in _ACTIVATIONS:
        raise ValueError(f"the checkpoint config sets {key}={name!r}; supported: {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def _one_value(name: str, *values):
    """The value of a setting that a config may spell in several places (``None`` where absent); ``ValueError``
    when two of them differ."""
    given = [v for v in values if v is not None]
    if any(v != given[0] for v in given):
        raise ValueError(f"the checkpoint config gives {name} two different values: {given}")
    return given[0] if given else None


def _rope_options(keys: _Keys, default_fraction: float = 1.0, params: dict | None = None) -> dict:
    """RoPE settings in either form: transformers 5's ``rope_parameters`` dict (or ``params``, one layer type's
    entry of it), or the older top-level ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``), ``partial_rotary_factor``
    (``rotary_pct``) and ``rope_scaling``."""
    params = dict((keys.get("rope_parameters") if params is None else params) or {})
    legacy = keys.get("rope_scaling")
    if legacy:
        params = {**dict(legacy), **params}
    # every spelling is read (so none is reported unused), and two spellings of one setting must agree
    base = _one_value("rope_theta", params.pop("rope_theta", None), keys.get("rope_theta"),
                      keys.get("rotary_emb_base")) or 10000.0
    fraction = _one_value("partial_rotary_factor", params.pop("partial_rotary_factor", None),
                          keys.get("partial_rotary_factor"), keys.get("rotary_pct")) or default_fraction
    scaling = params if params.get("rope_type", params.get("type", "default")) != "default" else None
    if scaling is not None and params.get("rope_type", params.get("type")) in ("yarn", "llama3"):
        # transformers' default: the original context is max_position_embeddings
        scaling.setdefault("original_max_position_embeddings", keys.get("max_position_embeddings", 2048))
    return {"rope_base": float(base), "rotary_fraction": float(fraction), "rope_scaling": scaling}


def _windows(keys: _Keys, model_type: str, n_layers: int) -> dict:
    """``sliding_window`` and ``layer_types`` of :class:`GPTConfig`. transformers marks each layer
    ``sliding_attention`` or ``full_attention`` (``layer_types``); older configs leave the list out and it follows
    the family's rule: Mistral and Phi-3 window every layer; Qwen 2/3 the layers from ``max_window_layers`` on,
    only with ``use_sliding_window``; Gemma 2 every other layer, from the first; Gemma 3 five of every six
    (``sliding_window_pattern``). Llama, Gemma (1) and OLMo 2 have no window (such a key is refused as unknown)."""
    if model_type in ("llama", "gemma", "olmo2"):
        return {"sliding_window": None, "layer_types": None}
    window, types = keys.get("sliding_window"), keys.get("layer_types")
    if model_type in ("qwen2", "qwen3"):
        use, first = keys.get("use_sliding_window", False), keys.get("max_window_layers", n_layers)
        window = window if use else None  # as transformers' config does
        rule = [i >= first for i in range(n_layers)]
    elif model_type == "gemma2":
        rule = [(i + 1) % 2 != 0 for i in range(n_layers)]
    elif model_type == "gemma3_text":
        pattern = keys.get("sliding_window_pattern", keys.get("_sliding_window_pattern", 6))
        rule = [(i + 1) % pattern != 0 for i in range(n_layers)]
    else:  # mistral, phi3
        rule = [True] * n_layers
    names = {"sliding_attention": "sliding", "full_attention": "full"}
    if types is None:
        types = ["sliding" if sliding else "full" for sliding in rule]
    else:
        if len(types) != n_layers or not set(types) <= set(names):
            raise ValueError(f"the checkpoint config sets layer_types={types!r}: llmarch implements one of "
                             f"{sorted(names)} per layer ({n_layers})")
        types = [names[t] for t in types]
    if window is None or "sliding" not in types:  # a sliding layer without a window attends to everything
        return {"sliding_window": None, "layer_types": None}
    return {"sliding_window": window, "layer_types": None if set(types) == {"sliding"} else tuple(types)}


def _gemma3_rope(keys: _Keys) -> dict:
    """Gemma 3's two RoPEs: ``rope_parameters`` per layer type (transformers 5) or the older ``rope_theta`` +
    ``rope_scaling`` (full layers) and ``rope_local_base_freq`` (sliding layers, never scaled)."""
    params = keys.get("rope_parameters") or {}
    if "full_attention" not in params:  # the older form
        return {**_rope_options(keys), "rope_local_base": float(keys.get("rope_local_base_freq", 10000.0))}
    local = dict(params.get("sliding_attention") or {})
    if local.pop("rope_type", "default") != "default" or set(local) - {"rope_theta"}:
        raise ValueError(f"the checkpoint config scales the sliding layers' RoPE ({params['sliding_attention']!r}), "
                         "which llmarch does not implement (only their base)")
    return {**_rope_options(keys, params=params["full_attention"]),
            "rope_local_base": float(local.get("rope_theta", 10000.0))}


def _llama_like(keys: _Keys, model_type: str) -> GPTConfig:
    """A :class:`GPTConfig` for Llama and the families that change parts of it: Mistral (sliding window), Qwen2
    (q, k, v biases, no o bias), Qwen3 (per-head QK-norm), Gemma (GeGLU, 1 + w RMSNorm, scaled embeddings),
    Gemma 2 (as Gemma with sandwich norms, ``query_pre_attn_scalar``, soft-capping, alternating windows), Gemma 3
    (as Gemma 2 with per-head QK-norm, 5:1 windows, two RoPE bases), OLMo 2 (norms on the outputs, QK-norm over the
    whole projections), Phi-3 (fused projections, which the weight map splits; partial rotary)."""
    d_model, n_heads = keys.get("hidden_size", required=True), keys.get("num_attention_heads", required=True)
    n_layers = keys.get("num_hidden_layers", required=True)
    head_dim = keys.get("head_dim")
    if head_dim is not None and d_model % n_heads == 0 and head_dim == d_model // n_heads:
        head_dim = None  # the default
    gemma = model_type in ("gemma", "gemma2", "gemma3_text")
    if model_type == "gemma":
        keys.expect("use_bidirectional_attention", {None, False}, None)
        family = dict(activation=_activation(keys, "hidden_act", "gelu_pytorch_tanh"), norm="rmsnorm_offset",
                      scale_embeddings=True)
    elif gemma:
        keys.get("hidden_act")  # older Gemma configs repeat hidden_activation under this name; transformers ignores it
        keys.expect("use_bidirectional_attention", {None, False}, None)
        family = dict(activation=_activation(keys, "hidden_activation", "gelu_pytorch_tanh"), norm="rmsnorm_offset",
                      norm_placement="sandwich", scale_embeddings=True,
                      attn_scale=float(keys.get("query_pre_attn_scalar", 256)) ** -0.5,
                      attn_softcap=keys.get("attn_logit_softcapping"),
                      final_softcap=keys.get("final_logit_softcapping"),
                      qk_norm="head" if model_type == "gemma3_text" else False)
    else:
        family = dict(activation=_activation(keys, "hidden_act", "silu"),
                      qk_norm={"qwen3": "head", "olmo2": "projection"}.get(model_type, False),
                      norm_placement="output" if model_type == "olmo2" else None)
    if model_type == "qwen2":  # q, k, v biases; none on the output projection or the MLP
        family |= dict(bias=True, attn_out_bias=False, mlp_bias=False)
    elif model_type == "phi3":
        keys.get("original_max_position_embeddings")  # used only by longrope scaling, which RoPE checks refuse
    else:
        bias = keys.get("attention_bias", False)
        mlp_bias = keys.get("mlp_bias", False) if model_type == "llama" else False
        family |= dict(bias=bias, mlp_bias=None if mlp_bias == bias else mlp_bias)
    rope = _gemma3_rope(keys) if model_type == "gemma3_text" else _rope_options(keys)
    base = dict(
        vocab_size=keys.get("vocab_size", required=True), context_length=keys.get("max_position_embeddings", 2048),
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=keys.get("num_key_value_heads", n_heads),
        d_ff=keys.get("intermediate_size", required=True), norm="rmsnorm", norm_eps=keys.get("rms_norm_eps", 1e-6),
        ffn="swiglu", bias=False, tie_embeddings=keys.get("tie_word_embeddings", gemma), pos_encoding="rope",
        rope_layout="half", head_dim=head_dim, **rope, **_windows(keys, model_type, n_layers),
    )
    return GPTConfig(**(base | family))


def _config_dict(config) -> dict:
    """A ``config.json`` dict, or a transformers config object (its ``to_dict()``)."""
    if hasattr(config, "to_dict") and not isinstance(config, dict):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise TypeError(f"config must be the checkpoint's config.json as a dict (or a transformers config), "
                        f"got {type(config).__name__}")
    return config


def config_from_hf(config) -> GPTConfig | BertConfig:
    """The :class:`GPTConfig` of a transformers ``config.json`` dict (``model_type`` one of
    ``SUPPORTED_MODEL_TYPES`` but ``bert``; see :func:`_llama_like` for the Llama-like families), or
    the :class:`BertConfig` of a ``bert`` one; a transformers config object is read through its ``to_dict()``.
    Raises ``ValueError`` naming an unsupported model type or key. BERT: only absolute positions
    (``position_embedding_type``), the encoder (``is_decoder``, ``add_cross_attention`` false) and a tied MLM
    decoder (``tie_word_embeddings``) are implemented; ``hidden_dropout_prob`` becomes the model's one dropout."""
    config = _config_dict(config)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported: use one of {SUPPORTED_MODEL_TYPES}")
    keys = _Keys(config)
    if model_type == "gpt2":
        d_model = keys.get("n_embd", required=True)
        keys.expect("scale_attn_weights", {True}, True)
        keys.expect("scale_attn_by_inverse_layer_idx", {False}, False)
        keys.expect("add_cross_attention", {False}, False)
        out = GPTConfig(
            vocab_size=keys.get("vocab_size", required=True), context_length=keys.get("n_positions", 1024),
            d_model=d_model, n_layers=keys.get("n_layer", required=True), n_heads=keys.get("n_head", required=True),
            d_ff=keys.get("n_inner"), activation=_activation(keys, "activation_function", "gelu_new"),
            norm_eps=keys.get("layer_norm_epsilon", 1e-5), tie_embeddings=keys.get("tie_word_embeddings", True),
        )
    elif model_type in _LLAMA_LIKE:
        out = _llama_like(keys, model_type)
    elif model_type in MOE_MODEL_TYPES:
        out = moe_config_from_hf(keys, model_type)
    elif model_type == "bert":
        keys.expect("position_embedding_type", {"absolute"}, "absolute")
        keys.expect("is_decoder", {False}, False)
        keys.expect("add_cross_attention", {False}, False)
        keys.expect("tie_word_embeddings", {True}, True)
        out = BertConfig(
            vocab_size=keys.get("vocab_size", required=True), d_model=keys.get("hidden_size", required=True),
            n_layers=keys.get("num_hidden_layers", required=True),
            n_heads=keys.get("num_attention_heads", required=True), d_ff=keys.get("intermediate_size", required=True),
            max_position_embeddings=keys.get("max_position_embeddings", 512),
            type_vocab_size=keys.get("type_vocab_size", 2), layer_norm_eps=keys.get("layer_norm_eps", 1e-12),
            dropout=keys.get("hidden_dropout_prob", 0.1), activation=_activation(keys, "hidden_act", "gelu"),
            pad_token_id=keys.get("pad_token_id"),
        )
    else:  # gpt_neox
        d_model = keys.get("hidden_size", required=True)
        out = GPTConfig(
            vocab_size=keys.get("vocab_size", required=True), context_length=keys.get("max_position_embeddings", 2048),
            d_model=d_model, n_layers=keys.get("num_hidden_layers", required=True),
            n_heads=keys.get("num_attention_heads", required=True), d_ff=keys.get("intermediate_size", 4 * d_model),
            activation=_activation(keys, "hidden_act", "gelu"), norm_eps=keys.get("layer_norm_eps", 1e-5),
            bias=keys.get("attention_bias", True), mlp_bias=None if keys.get("attention_bias", True) else True, tie_embeddings=keys.get("tie_word_embeddings", False),
            pos_encoding="rope", rope_layout="half", **_rope_options(keys, default_fraction=0.25),
            parallel_residual=keys.get("use_parallel_residual", True),
        )
    keys.check_all_used()
    return out


def _strip_prefix(state_dict: dict, prefixes: tuple[str, ...]) -> dict:
    out = {}
    for name, tensor in state_dict.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        out[name] = tensor
    return out


def _gpt2_weights(sd: dict, c: GPTConfig) -> tuple[dict, torch.Tensor | None, dict]:
    """GPT-2's ``Conv1D`` stores ``(in, out)`` matrices (``y = x W + b``), and ``c_attn`` holds q, k, v side by
    side: transpose, and split into three."""
    sd = _strip_prefix(sd, ("transformer.",))
    out = {"tok_emb.weight": sd.pop("wte.weight"), "pos_emb.weight": sd.pop("wpe.weight"),
           "norm_f.weight": sd.pop("ln_f.weight"), "norm_f.bias": sd.pop("ln_f.bias")}
    head = sd.pop("lm_head.weight", None)
    for i in range(c.n_layers):
        p, q = f"h.{i}.", f"blocks.{i}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            out[q + ours + ".weight"], out[q + ours + ".bias"] = sd.pop(p + theirs + ".weight"), sd.pop(p + theirs + ".bias")
        w, b = sd.pop(p + "attn.c_attn.weight").t(), sd.pop(p + "attn.c_attn.bias")
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[q + f"attn.{name}.weight"] = w[j * c.d_model:(j + 1) * c.d_model]
            out[q + f"attn.{name}.bias"] = b[j * c.d_model:(j + 1) * c.d_model]
        for ours, theirs in (("attn.o_proj", "attn.c_proj"), ("ffn.w1", "mlp.c_fc"), ("ffn.w2", "mlp.c_proj")):
            out[q + ours + ".weight"], out[q + ours + ".bias"] = sd.pop(p + theirs + ".weight").t(), sd.pop(p + theirs + ".bias")
        for buffer in ("attn.bias", "attn.masked_bias"):  # causal-mask buffers of old checkpoints
            sd.pop(p + buffer, None)
    return out, head, sd


# transformers' names of each block's norms -> llmarch's, by norm placement: Llama's post_attention_layernorm is the
# FFN's input norm; OLMo 2's normalises the attention output, and Gemma has four norms.
_LLAMA_NORM_NAMES = {
    "pre": {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"},
    "output": {"post_attention_layernorm": "norm1", "post_feedforward_layernorm": "norm2"},
    "sandwich": {"input_layernorm": "norm1", "post_attention_layernorm": "post_norm1",
                 "pre_feedforward_layernorm": "norm2", "post_feedforward_layernorm": "post_norm2"},
}


def _llama_weights(sd: dict, c: GPTConfig) -> tuple[dict, torch.Tensor | None, dict]:
    sd = _strip_prefix(sd, ("model.",))
    out = {"tok_emb.weight": sd.pop("embed_tokens.weight"), "norm_f.weight": sd.pop("norm.weight")}
    head = sd.pop("lm_head.weight", None)
    names = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj", "self_attn.v_proj": "attn.v_proj",
             "self_attn.o_proj": "attn.o_proj", "mlp.gate_proj": "ffn.w1", "mlp.up_proj": "ffn.w3",
             "mlp.down_proj": "ffn.w2"} | _LLAMA_NORM_NAMES[c.placement]
    if c.qk_norm:  # Qwen3, Gemma 3 (per head), OLMo 2 (whole projection)
        names |= {"self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"}
    for i in range(c.n_layers):
        for theirs, ours in names.items():
            out[f"blocks.{i}.{ours}.weight"] = sd.pop(f"layers.{i}.{theirs}.weight")
            if f"layers.{i}.{theirs}.bias" in sd:  # attention_bias / mlp_bias
                out[f"blocks.{i}.{ours}.bias"] = sd.pop(f"layers.{i}.{theirs}.bias")
        sd.pop(f"layers.{i}.self_attn.rotary_emb.inv_freq", None)  # a buffer in old checkpoints
    return out, head, sd


def _phi3_weights(sd: dict, c: GPTConfig) -> tuple[dict, torch.Tensor | None, dict]:
    """Phi-3 fuses the projections: the rows of ``qkv_proj`` are ``[q (H d) | k (H_kv d) | v (H_kv d)]``, those of
    ``gate_up_proj`` ``[gate (d_ff) | up (d_ff)]``. Split them into Llama's names, then map those."""
    sd = _strip_prefix(sd, ("model.",))
    q_rows, kv_rows = c.n_heads * c.d_head, (c.n_kv_heads or c.n_heads) * c.d_head
    for i in range(c.n_layers):
        p = f"layers.{i}."
        qkv = sd.pop(p + "self_attn.qkv_proj.weight").split([q_rows, kv_rows, kv_rows])
        for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv):
            sd[p + f"self_attn.{name}.weight"] = part
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = sd.pop(p + "mlp.gate_up_proj.weight").chunk(2)
    return _llama_weights(sd, c)


def _neox_weights(sd: dict, c: GPTConfig) -> tuple[dict, torch.Tensor | None, dict]:
    """GPT-NeoX fuses q, k, v per head: the rows of ``query_key_value`` are ``(head, [q|k|v], d_head)``."""
    sd = _strip_prefix(sd, ("gpt_neox.",))
    out = {"tok_emb.weight": sd.pop("embed_in.weight"), "norm_f.weight": sd.pop("final_layer_norm.weight"),
           "norm_f.bias": sd.pop("final_layer_norm.bias")}
    head = sd.pop("embed_out.weight", sd.pop("lm_head.weight", None))  # transformers 5 names it lm_head
    names = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "attention.dense": "attn.o_proj",
             "mlp.dense_h_to_4h": "ffn.w1", "mlp.dense_4h_to_h": "ffn.w2"}
    for i in range(c.n_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        for theirs, ours in names.items():
            out[q + ours + ".weight"] = sd.pop(p + theirs + ".weight")
            if p + theirs + ".bias" in sd:  # attention_bias
                out[q + ours + ".bias"] = sd.pop(p + theirs + ".bias")
        for kind in ("weight", "bias"):
            key = p + "attention.query_key_value." + kind
            if kind == "weight" or key in sd:
                fused = sd.pop(key).reshape(c.n_heads, 3, c.d_head, -1)
                for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                    part = fused[:, j].reshape(c.d_model, -1)
                    out[q + f"attn.{name}.{kind}"] = part if kind == "weight" else part.reshape(-1)
        for buffer in ("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq"):
            sd.pop(p + buffer, None)
    return out, head, sd


def _decoder_only(weights):
    """A GPT weight map -> ``(model factory, tensors, leftovers)``; an untied model takes the output-layer weight."""
    def mapper(sd: dict, c: GPTConfig):
        out, head, left = weights(sd, c)
        if not c.tie_embeddings:
            if head is None:
                raise ValueError("the config has tie_word_embeddings=False but the state dict has no output-layer "
                                 "weight")
            out["lm_head.weight"] = head
        return functools.partial(GPT, c), out, left
    return mapper


_BERT_LAYER_NAMES = {
    "attention.self.query": "attn.q_proj", "attention.self.key": "attn.k_proj", "attention.self.value": "attn.v_proj",
    "attention.output.dense": "attn.o_proj", "attention.output.LayerNorm": "norm1", "intermediate.dense": "ffn.w1",
    "output.dense": "ffn.w2", "output.LayerNorm": "norm2",
}


def _pop_tied(sd: dict, name: str, source: torch.Tensor, source_name: str) -> None:
    """Drop the copy of a tied tensor that a state dict may hold, after checking that it is a copy."""
    tensor = sd.pop(name, None)
    if tensor is not None and not torch.equal(tensor, source):
        raise ValueError(f"{name} differs from {source_name}: llmarch's BERT ties them (tie_word_embeddings=True)")


def _bert_weights(sd: dict, c: BertConfig):
    """BERT's task head is read off the tensors: ``qa_outputs`` (``BertForQuestionAnswering``), ``classifier``
    (``BertForSequenceClassification``, ``num_labels`` from its shape), else ``cls.predictions``
    (``BertForMaskedLM``). Pretraining checkpoints (``BertForPreTraining``, e.g. bert-base-uncased) also hold the
    pooler and the next-sentence head ``cls.seq_relationship``; the masked LM does not use them and they are
    dropped, as transformers drops them when it loads such a file into ``BertForMaskedLM``."""
    sd = _strip_prefix(sd, ("bert.",))
    out = {"bert.tok_emb.weight": sd.pop("embeddings.word_embeddings.weight"),
           "bert.pos_emb.weight": sd.pop("embeddings.position_embeddings.weight"),
           "bert.type_emb.weight": sd.pop("embeddings.token_type_embeddings.weight"),
           "bert.norm_emb.weight": sd.pop("embeddings.LayerNorm.weight"),
           "bert.norm_emb.bias": sd.pop("embeddings.LayerNorm.bias")}
    for buffer in ("embeddings.position_ids", "embeddings.token_type_ids"):  # buffers in old checkpoints
        sd.pop(buffer, None)
    for i in range(c.n_layers):
        for theirs, ours in _BERT_LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                out[f"bert.blocks.{i}.{ours}.{kind}"] = sd.pop(f"encoder.layer.{i}.{theirs}.{kind}")
    if "qa_outputs.weight" in sd:
        out["qa_outputs.weight"], out["qa_outputs.bias"] = sd.pop("qa_outputs.weight"), sd.pop("qa_outputs.bias")
        return functools.partial(BertForQuestionAnswering, c), out, sd
    if "classifier.weight" in sd:
        for ours, theirs in (("head.pooler", "pooler.dense"), ("head.classifier", "classifier")):
            out[ours + ".weight"], out[ours + ".bias"] = sd.pop(theirs + ".weight"), sd.pop(theirs + ".bias")
        num_labels = out["head.classifier.weight"].shape[0]
        return functools.partial(BertForSequenceClassification, c, num_labels), out, sd
    p = "cls.predictions."
    for ours, theirs in (("transform", "transform.dense"), ("transform_norm", "transform.LayerNorm")):
        out[ours + ".weight"], out[ours + ".bias"] = sd.pop(p + theirs + ".weight"), sd.pop(p + theirs + ".bias")
    out["decoder.bias"] = sd.pop(p + "bias")
    _pop_tied(sd, p + "decoder.weight", out["bert.tok_emb.weight"], "the word embeddings")
    _pop_tied(sd, p + "decoder.bias", out["decoder.bias"], p + "bias")
    if "cls.seq_relationship.weight" in sd:  # a BertForPreTraining checkpoint: drop the NSP head and its pooler
        for name in ("cls.seq_relationship.weight", "cls.seq_relationship.bias", "pooler.dense.weight",
                     "pooler.dense.bias"):
            sd.pop(name, None)
    return functools.partial(BertForMaskedLM, c), out, sd


_WEIGHT_MAPS = {"gpt2": _decoder_only(_gpt2_weights), "llama": _decoder_only(_llama_weights),
                "gpt_neox": _decoder_only(_neox_weights), "bert": _bert_weights,
                "phi3": _decoder_only(_phi3_weights),
                **{name: _decoder_only(weights) for name, weights in MOE_WEIGHTS.items()}}
_WEIGHT_MAPS |= {name: _decoder_only(_llama_weights) for name in _LLAMA_LIKE if name != "phi3"}


def _shared_parameters(model: torch.nn.Module) -> dict[str, str]:
    """``{name: name of the parameter it shares}`` for tied parameters (e.g. an output layer tied to the embedding)."""
    first, shared = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            shared[name] = first[id(p)]
        else:
            first[id(p)] = name
    return shared


def load_hf_state_dict(state_dict: dict, config) -> torch.nn.Module:
    """A model holding the weights of a transformers checkpoint, in eval mode and in the weights' dtype.

    ``state_dict``: the checkpoint's tensors, with or without the base-model prefix: the names of
    ``GPT2LMHeadModel``, ``GPTNeoXForCausalLM``, or the ``...ForCausalLM`` of a Llama-like family
    (-> :class:`GPT`), or of
    ``BertForMaskedLM`` (-> :class:`BertForMaskedLM`; ``BertForPreTraining`` files too, without their NSP head),
    ``BertForSequenceClassification`` or ``BertForQuestionAnswering`` (-> the llmarch class of the same name).
    ``config``: its ``config.json`` as a dict (or a transformers config object), with RoPE settings as
    ``rope_theta`` + ``rope_scaling`` or as transformers 5's ``rope_parameters``.
    Raises ``ValueError`` naming unsupported config keys, and missing, unexpected or mis-shaped tensors.
    """
    return _build(state_dict, config, copy=True)


def _build(state_dict: dict, config, copy: bool) -> torch.nn.Module:
    """``load_hf_state_dict``; ``copy=False`` lets the model own the given tensors (a freshly read file)."""
    config = _config_dict(config)
    model_config = config_from_hf(config)
    tensors = {name: t.detach().clone() if copy else t for name, t in state_dict.items()}
    floating = [t.dtype for t in tensors.values() if torch.is_tensor(t) and t.is_floating_point()]
    try:
        make, mapped, left = _WEIGHT_MAPS[config["model_type"]](tensors, model_config)
    except KeyError as err:
        raise ValueError(f"the state dict has no tensor {err.args[0]!r}, which a {config['model_type']} checkpoint "
                         f"with {model_config.n_layers} layers has") from None
    if left:
        raise ValueError(f"unexpected tensors in the state dict: {sorted(left)[:10]}")
    with torch.device("meta"):
        model = make()
    shared = _shared_parameters(model)
    expected = {name: t for name, t in model.state_dict().items() if name not in shared}
    missing, extra = sorted(set(expected) - set(mapped)), sorted(set(mapped) - set(expected))
    if missing or extra:
        raise ValueError(f"the checkpoint does not fit the config: missing {missing[:10]}, unexpected {extra[:10]}")
    for name, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"tensor {name} has shape {tuple(tensor.shape)} but the config implies "
                             f"{tuple(expected[name].shape)}")
    model.load_state_dict({name: t.contiguous() for name, t in mapped.items()}, strict=False, assign=True)
    for name, source in shared.items():  # assign=True replaced the shared parameter: tie it again
        module, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module), attr, model.get_parameter(source))
    model.to(floating[0] if floating else torch.float32)
    return model.eval()


def load_pretrained(path: str | Path) -> torch.nn.Module:
    """A :class:`GPT` (or a BERT model, see :func:`load_hf_state_dict`) from a local checkpoint folder:
    ``config.json`` and one or more ``*.safetensors`` files (shards are all read). Nothing is downloaded; a
    missing file raises ``FileNotFoundError`` naming it."""
    from safetensors.torch import load_file

    folder = Path(path)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} is missing: load_pretrained needs a folder with config.json")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors file in {folder}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from None
    state_dict = {}
    for shard in shards:
        state_dict.update(load_file(str(shard)))
    return _build(state_dict, config, copy=False)
