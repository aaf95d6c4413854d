"""Reading an extractive answer off start and end scores.

Book: Pretraining objectives, "Extractive question answering".
"""

from __future__ import annotations

import torch

from llmarch._checks import check_tensor, shape_str
from llmarch.objectives._common import (_check_int)


# ----------------------------------------------------------------------------------------------------------
# Extractive question answering
# ----------------------------------------------------------------------------------------------------------

def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, max_answer_len: int):
    """The answer span of an extractive-QA head (Devlin et al., 2019, SQuAD): ``argmax_{s <= e < s + max_answer_len}
    start_logits[s] + end_logits[e]``. Book: Pretraining objectives, "Extractive question answering".

    ``start_logits, end_logits (T,)`` -> ``(start, end)`` as Python ints (inclusive); ``(B, T)`` -> two long
    tensors ``(B,)``. O(T * max_answer_len): for each length offset ``k = e - s`` the scores of all starts are
    ``start[:T-k] + end[k:]``. Ties go to the smallest start, then to the smallest end. ``-inf`` logits (positions
    that cannot hold an answer, such as the question) are allowed; ``nan`` and ``+inf`` are not.
    """
    check_tensor("start_logits", start_logits, floating=True)
    check_tensor("end_logits", end_logits, floating=True)
    if start_logits.shape != end_logits.shape or start_logits.dim() not in (1, 2) or start_logits.shape[-1] == 0:
        raise ValueError(f"start_logits {shape_str(start_logits.shape)} and end_logits {shape_str(end_logits.shape)} "
                         "must have the same shape, (T,) or (B, T) with T >= 1")
    for name, t in (("start_logits", start_logits), ("end_logits", end_logits)):
        if bool(torch.isnan(t).any()) or bool((t == float("inf")).any()):
            raise ValueError(f"{name} contains nan or +inf")
    max_answer_len = _check_int("max_answer_len", max_answer_len, 1)
    single = start_logits.dim() == 1
    start, end = (start_logits[None], end_logits[None]) if single else (start_logits, end_logits)
    t = start.shape[-1]
    k_max = min(max_answer_len, t)
    scores = torch.full((start.shape[0], t, k_max), float("-inf"), dtype=torch.promote_types(start.dtype, end.dtype),
                        device=start.device)
    for k in range(k_max):
        scores[:, : t - k, k] = start[:, : t - k] + end[:, k:]
    flat = scores.reshape(start.shape[0], -1)
    best = torch.argmax(flat, dim=-1)  # the first maximum in (start, offset) order: smallest start, then end
    s, k = best // k_max, best % k_max
    if single:
        return int(s[0]), int(s[0] + k[0])
    return s, s + k
