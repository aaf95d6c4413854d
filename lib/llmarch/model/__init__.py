"""Decoder-only language models from GPT-1 to Llama 3, the BERT encoder, an encoder-decoder, and loading official
checkpoints into them.

Book: The Transformer block (``book/transformer-block.md``); From GPT-2 to Llama 3 (``book/modern-decoder.md``);
Pretraining objectives (``book/pretraining-objectives.md``).

Modules: ``config`` (:class:`GPTConfig` and presets), ``gpt`` (:class:`GPT`, counting, schedule, perplexity,
the tiny pretrained model), ``bert`` (:class:`BertConfig`, :class:`BertEncoder` and its task heads),
``encoder_decoder`` (:class:`EncoderDecoder`), ``loading`` (transformers checkpoints and safetensors folders).
"""

from llmarch.model.config import (
    ROPE_LAYOUTS, GPTConfig, gpt1_config, gpt2_config, llama_config, tiny_gpt_config,
)
from llmarch.model.gpt import (
    GPT, TINY_GPT_CHECKPOINT, count_parameters, load_tiny_gpt, noam_lr, perplexity,
)
from llmarch.model.bert import (
    BertClassificationHead, BertConfig, BertEncoder, BertForMaskedLM, BertForQuestionAnswering,
    BertForSequenceClassification, bert_config, key_padding_mask,
)
from llmarch.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig, shift_right
from llmarch.model.loading import SUPPORTED_MODEL_TYPES, config_from_hf, load_hf_state_dict, load_pretrained

__all__ = [
    "GPTConfig", "GPT", "gpt1_config", "gpt2_config", "llama_config", "tiny_gpt_config", "ROPE_LAYOUTS",
    "load_tiny_gpt", "TINY_GPT_CHECKPOINT", "count_parameters", "noam_lr", "perplexity",
    "config_from_hf", "load_hf_state_dict", "load_pretrained", "SUPPORTED_MODEL_TYPES",
    "BertConfig", "bert_config", "key_padding_mask", "BertEncoder", "BertForMaskedLM", "BertClassificationHead",
    "BertForSequenceClassification", "BertForQuestionAnswering",
    "EncoderDecoderConfig", "EncoderDecoder", "shift_right",
]
