"""Training: the honest single-process loop the book's experiments use (:mod:`llmarch.train.loop`), and a
training stack written from scratch (:mod:`llmarch.train.stack`, :mod:`llmarch.train.precision`) that the
distributed launcher (``python -m llmarch.train --nproc N``, :mod:`llmarch.train.launch`) runs.

Book: The Transformer block, "Training a tiny GPT"; Training at scale.
"""

from llmarch.train.loop import TrainResult, evaluate, lm_loss, train, train_tiny_gpt, warmup_cosine_lr
from llmarch.train.precision import (
    LossScaler,
    MemoryBudget,
    checkpoint_blocks,
    memory_budget,
    model_state_bytes,
    saved_tensor_bytes,
)
from llmarch.train.stack import (
    MemmapBatches,
    StepResult,
    clip_grad_norm,
    load_checkpoint,
    save_checkpoint,
    train_step,
    weight_decay_groups,
    write_token_file,
)

__all__ = [
    "lm_loss", "evaluate", "warmup_cosine_lr", "TrainResult", "train", "train_tiny_gpt",
    "clip_grad_norm", "weight_decay_groups", "write_token_file", "MemmapBatches", "save_checkpoint",
    "load_checkpoint", "StepResult", "train_step",
    "LossScaler", "checkpoint_blocks", "saved_tensor_bytes", "MemoryBudget", "memory_budget", "model_state_bytes",
]
