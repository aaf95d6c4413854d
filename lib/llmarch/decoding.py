"""Decoding: turning next-token distributions into text. Search (greedy, beam, exhaustive, contrastive) and
sampling (temperature, top-k, top-p), plus ``generate`` for a ``GPT`` with its KV cache.

Book: Decoding (``book/decoding.md``).

Conventions: the search functions are model-agnostic. They take ``next_logprobs(seq: list[int]) -> Tensor[V]``,
the log-probabilities of the next token after the token list ``seq`` (use :func:`gpt_next_logprobs` for a
``GPT``). Sequences are returned **with** the prompt; scores count only the generated tokens. A sequence ends
after ``eos_id`` (which is kept) or after ``max_new_tokens`` tokens. Filters act on the last dimension of
logits and set removed entries to ``-inf``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from llmarch._checks import check_tensor

__all__ = [
    "temperature_scale",
    "top_k_filter",
    "top_p_filter",
    "sample_next",
    "greedy_decode",
    "beam_search",
    "exhaustive_search",
    "contrastive_search",
    "contrastive_decoding",
    "gpt_next_logprobs",
    "gpt_hidden_states",
    "generate",
]

NextLogprobs = Callable[[list], torch.Tensor]


def temperature_scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / T``: ``T < 1`` sharpens the distribution, ``T > 1`` flattens it. Book: Decoding, "Temperature"."""
    check_tensor("logits", logits, floating=True)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy decoding for T -> 0), got {temperature}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits (and any tied with the k-th), set the rest to ``-inf``.
    Book: Decoding, "Top-k and top-p sampling".

    >>> top_k_filter(torch.tensor([1.0, 3.0, 2.0]), 2)
    tensor([-inf, 3., 2.])
    """
    check_tensor("logits", logits, min_dim=1, floating=True)
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    if k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020): keep the smallest set of most probable tokens whose total
    probability reaches ``p`` (always at least the most probable one); the rest become ``-inf``.
    Book: Decoding, "Top-k and top-p sampling".

    A token is kept when the probability of the tokens ranked above it (sorted, ties in index order) is still
    below ``p``: for probabilities ``[0.5, 0.3, 0.2]`` and ``p = 0.7`` the first two are kept. ``p = 1`` keeps
    every token (a rounded cumulative sum can reach 1 before the last token).
    """
    check_tensor("logits", logits, min_dim=1, floating=True)
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    if p == 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above each one
    remove_sorted = before >= p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample token ids from ``logits (..., V)``: temperature first, then top-k, then top-p (the order of
    Hugging Face's samplers). Returns a long tensor of shape ``logits.shape[:-1]``. Book: Decoding, "Sampling"."""
    logits = temperature_scale(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits.float(), dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def _check_prompt(prompt, max_new_tokens):
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
        raise TypeError(f"prompt must be a list of int token ids, got {type(prompt).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return list(prompt)


def greedy_decode(next_logprobs: NextLogprobs, prompt: list[int], max_new_tokens: int, eos_id: int | None = None) -> list[int]:
    """Append the most probable next token until ``eos_id`` or ``max_new_tokens``. Book: Decoding, "Greedy search"."""
    seq = _check_prompt(prompt, max_new_tokens)
    for _ in range(max_new_tokens):
        token = int(torch.argmax(next_logprobs(seq)))
        seq.append(token)
        if token == eos_id:
            break
    return seq


def _normalised(score: float, generated: int, length_penalty: float) -> float:
    return score / (max(generated, 1) ** length_penalty)


def _expand(next_logprobs: NextLogprobs, live: list, n: int) -> list[tuple[list[int], float]]:
    """The ``n`` best one-token extensions ``(beam + [token], score + log p)`` of the live beams, best first; ties
    go to the earlier beam, then to the lower token id. A beam contributes at most its own ``n`` best tokens,
    which is all the top ``n`` over every (beam, token) pair can use."""
    candidates = []
    for beam, score in live:
        values, tokens = torch.sort(next_logprobs(beam), descending=True, stable=True)
        candidates += [(beam + [int(t)], score + float(lp)) for lp, t in zip(values[:n], tokens[:n])]
    candidates.sort(key=lambda c: c[1], reverse=True)  # stable: keeps the tie order above
    return candidates[:n]


def beam_search(next_logprobs: NextLogprobs, prompt: list[int], beam_size: int, max_new_tokens: int,
                eos_id: int | None = None, length_penalty: float = 0.0,
                early_stopping: bool | str | None = None) -> list[tuple[list[int], float]]:
    """Keep the ``beam_size`` best partial sequences at every step. Book: Decoding, "Beam search".

    Each step extends every live beam by every token and keeps the ``beam_size`` highest sums of
    log-probabilities; a beam that emits ``eos_id`` is finished and leaves the beam. The search ends after
    ``max_new_tokens`` steps or when no beam is live. Returns the finished and live sequences, best first,
    scored ``sum log p / (generated length ** length_penalty)`` (``length_penalty = 0``: plain sum).
    With ``beam_size = 1`` this is greedy search. Ties go to the earlier beam, then to the lower token id
    (as ``argmax`` in :func:`greedy_decode`).

    ``early_stopping=None`` (the default) is the shrinking beam above. ``True``, ``False`` or ``"never"`` run
    Hugging Face's beam search instead (``model.generate(num_beams=beam_size, early_stopping=...)``), whose
    beam never shrinks: see :func:`_hf_beam_search` for its rule. Its scores are ``sequences_scores``.
    """
    seq = _check_prompt(prompt, max_new_tokens)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if not (early_stopping is None or isinstance(early_stopping, bool) or early_stopping == "never"):
        raise ValueError(f"early_stopping must be None, True, False or 'never', got {early_stopping!r}")
    if early_stopping is not None:
        return _hf_beam_search(next_logprobs, seq, beam_size, max_new_tokens, eos_id, length_penalty, early_stopping)
    live, finished = [(seq, 0.0)], []
    for _ in range(max_new_tokens):
        live_next = []
        for beam, score in _expand(next_logprobs, live, beam_size):
            (finished if beam[-1] == eos_id else live_next).append((beam, score))
        live = live_next
        if not live:
            break
    n_prompt = len(seq)
    results = [(b, _normalised(s, len(b) - n_prompt, length_penalty)) for b, s in finished + live]
    return sorted(results, key=lambda r: r[1], reverse=True)[:beam_size]


def _hf_beam_search(next_logprobs: NextLogprobs, prompt: list[int], k: int, max_new_tokens: int,
                    eos_id: int | None, length_penalty: float, early_stopping: bool | str) -> list[tuple[list[int], float]]:
    """Beam search as Hugging Face ``transformers`` (5.x, ``GenerationMixin._beam_search``) runs it.
    Book: Decoding, "Beam search".

    The beam always holds ``k`` live sequences, and finished ones go to a pool of the ``k`` best. At step ``t``
    (``t`` tokens generated, the new one included):

    1. Take the ``2k`` best candidates over all (beam, token) pairs, by summed log-probability.
    2. A candidate among the first ``k`` of them that ends in ``eos_id`` -- or any of the first ``k`` at the
       last step ``t = max_new_tokens`` -- enters the pool with score ``sum log p / t ** length_penalty``
       (``t`` counts the eos but not the prompt); the pool keeps its ``k`` best. An eos candidate ranked ``k``
       or lower is dropped.
    3. The ``k`` best candidates not ending in eos are the next beam (there are at least ``k`` of the ``2k``).
    4. Stop once the pool holds ``k`` sequences and ``early_stopping`` is ``True``, or it holds ``k`` and the
       best live beam cannot beat the worst of them by the estimate ``sum log p / L ** length_penalty``, with
       ``L = max_new_tokens`` for ``"never"`` with ``length_penalty > 0`` (an upper bound: the sum only falls)
       and ``L = t`` otherwise (the heuristic of ``False``: exact only for ``length_penalty <= 0``).

    Returns the pool, best first. Differs from the shrinking beam when a beam ends: the beam is refilled from
    the next candidates, so search goes on among ``k`` live sequences. (Matches ``transformers`` when the
    vocabulary has at least ``2k`` tokens; its scores are float32, these float64.)
    """
    pool: list[tuple[list[int], float]] = []  # (sequence, normalised score), best first, at most k
    live = [(prompt, 0.0)]
    for t in range(1, max_new_tokens + 1):
        candidates = _expand(next_logprobs, live, 2 * k)
        last = t == max_new_tokens
        pool += [(b, s / t ** length_penalty) for b, s in candidates[:k] if last or b[-1] == eos_id]
        pool = sorted(pool, key=lambda r: r[1], reverse=True)[:k]
        live = [(b, s) for b, s in candidates if b[-1] != eos_id][:k]
        if not live:  # only with a vocabulary smaller than 2k
            break
        if last or len(pool) < k:
            continue
        if early_stopping is True:
            break
        horizon = max_new_tokens if early_stopping == "never" and length_penalty > 0 else t
        if live[0][1] / horizon ** length_penalty <= pool[-1][1]:
            break
    if not pool:  # max_new_tokens == 0
        pool = [(prompt, 0.0)]
    return pool


def exhaustive_search(next_logprobs: NextLogprobs, prompt: list[int], max_new_tokens: int,
                      eos_id: int | None = None) -> tuple[list[int], float]:
    """The most probable continuation by enumerating every sequence: ``V^max_new_tokens`` of them (a sequence
    stops at ``eos_id``). Exponential: for checking the other searches on toy models. Book: Decoding,
    "Exhaustive search"."""
    seq = _check_prompt(prompt, max_new_tokens)
    best, best_score = seq, -math.inf if max_new_tokens else 0.0
    frontier = [(seq, 0.0)]
    for step in range(max_new_tokens):
        grown = []
        for beam, score in frontier:
            for token, lp in enumerate(next_logprobs(beam).tolist()):
                if lp == -math.inf:
                    continue
                extended, total = beam + [token], score + lp
                if token == eos_id or step == max_new_tokens - 1:
                    if total > best_score:
                        best, best_score = extended, total
                else:
                    grown.append((extended, total))
        frontier = grown
    return best, best_score


def contrastive_decoding(expert_logprobs: NextLogprobs, amateur_logprobs: NextLogprobs, prompt: list[int],
                         max_new_tokens: int, alpha: float = 0.1, eos_id: int | None = None) -> list[int]:
    """Contrastive decoding (Li et al., 2023), greedy: two models, an *expert* and a weaker *amateur*.
    Book: Decoding, "Contrastive search".

    Each step appends ``argmax_{v in V_head} log p_expert(v) - log p_amateur(v)`` over the plausible tokens
    ``V_head = {v : p_expert(v) >= alpha * max_w p_expert(w)}`` (the adaptive plausibility constraint, which keeps
    the amateur from promoting tokens the expert finds implausible). ``alpha = 1`` is the expert's greedy
    search. Ties go to the lower token id. Not to be confused with :func:`contrastive_search` (one model).
    """
    seq = _check_prompt(prompt, max_new_tokens)
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    for _ in range(max_new_tokens):
        expert, amateur = expert_logprobs(seq), amateur_logprobs(seq)
        if expert.shape != amateur.shape:
            raise ValueError(f"the expert gives {tuple(expert.shape)} log-probabilities but the amateur "
                             f"{tuple(amateur.shape)}: they need the same vocabulary")
        plausible = expert >= expert.max() + math.log(alpha)
        token = int(torch.where(plausible, expert - amateur, -torch.inf).argmax())
        seq.append(token)
        if token == eos_id:
            break
    return seq


def contrastive_search(next_logprobs: NextLogprobs, hidden_states: Callable[[list], torch.Tensor], prompt: list[int],
                       max_new_tokens: int, k: int = 4, alpha: float = 0.6, eos_id: int | None = None) -> list[int]:
    """Contrastive search (Su et al., 2022): among the ``k`` most probable next tokens choose

    ``argmax_v (1 - alpha) p(v | x) - alpha max_j cos(h_v, h_j)``,

    where ``h_j`` are the hidden states of the tokens so far and ``h_v`` that of the candidate appended to them
    (the degeneration penalty: a token whose representation repeats the context is penalised).
    ``hidden_states(seq) -> Tensor[len(seq), d]``. ``alpha = 0`` is greedy search. Book: Decoding,
    "Contrastive search".
    """
    seq = _check_prompt(prompt, max_new_tokens)
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    for _ in range(max_new_tokens):
        probs = next_logprobs(seq).exp()
        top = torch.topk(probs, min(k, probs.shape[-1]))
        best, best_score = None, -math.inf
        for p, v in zip(top.values.tolist(), top.indices.tolist()):
            h = hidden_states(seq + [v])
            penalty = F.cosine_similarity(h[-1:], h[:-1], dim=-1).max().item() if len(seq) else 0.0
            score = (1 - alpha) * p - alpha * penalty
            if score > best_score:
                best, best_score = v, score
        seq.append(best)
        if best == eos_id:
            break
    return seq


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def gpt_next_logprobs(model) -> NextLogprobs:
    """Adapter: ``seq -> log softmax(model(seq))[-1]`` for a ``GPT`` (no cache; for the search functions).
    The ids go to the model's device; the log-probabilities (float64) stay there."""

    @torch.no_grad()
    def next_logprobs(seq):
        ids = torch.tensor([seq], device=_model_device(model))
        return torch.log_softmax(model(ids)[0, -1].double(), dim=-1)

    return next_logprobs


def gpt_hidden_states(model) -> Callable[[list], torch.Tensor]:
    """Adapter: ``seq -> `` the final hidden states ``(len(seq), d_model)`` of a ``GPT`` (for contrastive search),
    on the model's device."""

    @torch.no_grad()
    def hidden_states(seq):
        return model.features(torch.tensor([seq], device=_model_device(model)))[0]

    return hidden_states


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, greedy: bool = False, eos_id: int | None = None,
             generator: torch.Generator | None = None, use_cache: bool = True) -> torch.Tensor:
    """Extend ``prompt_ids (B, T)`` by sampling (or greedy decoding) ``max_new_tokens`` tokens from a ``GPT``.

    Book: Decoding, "The KV cache". With ``use_cache`` the prompt is run once and each step feeds only the new
    token through the model's :class:`~llmarch.kv_cache.KVCache` (``model.new_kv_cache()``: a rolling cache of
    at most ``sliding_window`` keys per layer for a model with a window); the output is the same as recomputing the
    whole sequence every step (``use_cache=False``). Rows that emitted ``eos_id`` keep emitting it.
    Returns ``(B, T + max_new_tokens)``.
    """
    check_tensor("prompt_ids", prompt_ids, dims=2)
    was_training = model.training
    model.eval()
    cache = model.new_kv_cache() if use_cache else None
    seq, step_input = prompt_ids, prompt_ids
    done = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else seq, kv_cache=cache)[:, -1].double()
        if greedy:
            token = logits.argmax(dim=-1)
        else:
            token = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            token = torch.where(done, torch.full_like(token, eos_id), token)
            done |= token == eos_id
        seq = torch.cat([seq, token[:, None]], dim=1)
        step_input = token[:, None]
    model.train(was_training)
    return seq
