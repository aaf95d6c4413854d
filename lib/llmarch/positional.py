"""Positional encodings: absolute (sinusoidal, learned), rotary (RoPE), relative (T5 buckets, Shaw et al.),
ALiBi, KERPLE, and none (NoPE).

Book: Positional encodings (``book/positional-encodings.md``) and Deriving RoPE (``book/rope.md``).

Conventions (DESIGN.md), stated once here:
- positions are 0-based; tensors are ``(batch..., seq, features)``, per-head ``(B, H, T, d_head)``;
- sinusoidal APE: ``PE[t, 2i] = sin(t / base**(2i/d))``, ``PE[t, 2i+1] = cos(t / base**(2i/d))``, ``i < d/2``;
- RoPE: position ``m`` rotates feature pair ``i`` by the angle ``m * theta_i`` with ``theta_i = base**(-2i/d)``;
  ``interleaved=True`` (default, the RoFormer paper) pairs adjacent features ``(2i, 2i+1)``;
  ``interleaved=False`` pairs ``i`` with ``i + d/2`` (the "rotate-half" layout of GPT-NeoX and Llama);
- T5 buckets take ``relative_position = key_position - query_position``, as the official implementation does;
- ALiBi, KERPLE and T5 return additive biases for the attention scores, shape ``(H, t_q, t_k)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from llmarch._checks import check_tensor, shape_str

__all__ = [
    "POS_ENCODINGS",
    "sinusoidal_encoding",
    "LearnedPositionalEmbedding",
    "rope_angles",
    "apply_rope",
    "ROPE_SCALING_TYPES",
    "check_rope_scaling",
    "rope_frequencies",
    "RotaryEmbedding",
    "apply_rope_complex",
    "rope_matrix",
    "t5_relative_bucket",
    "T5RelativeBias",
    "alibi_slopes",
    "alibi_bias",
    "ALiBi",
    "KERPLE_VARIANTS",
    "kerple_bias",
    "KerpleBias",
    "shaw_relative_positions",
    "ShawRelativePositions",
]

POS_ENCODINGS = ("none", "learned", "sinusoidal", "t5", "alibi", "rope", "kerple")
KERPLE_VARIANTS = ("log", "power")


def _check_even(d: int, what: str) -> None:
    if d < 2 or d % 2:
        raise ValueError(f"{what} needs an even feature dimension d >= 2, got d={d}")


def sinusoidal_encoding(n_positions: int, d: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """The fixed sinusoidal table of Vaswani et al. (2017), shape ``(n_positions, d)``.

    Book: Positional encodings, "Sinusoidal encodings".

    ``PE[t, 2i] = sin(t * omega_i)``, ``PE[t, 2i+1] = cos(t * omega_i)``, ``omega_i = base**(-2i/d)``.
    Computed in float64 on ``device`` and returned in float32.

    >>> sinusoidal_encoding(2, 4)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000],
            [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    _check_even(d, "sinusoidal_encoding")
    angles = rope_angles(torch.arange(n_positions, device=device), d, base)  # (T, d/2): t * omega_i
    pe = torch.empty(n_positions, d, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()


class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per absolute position (GPT-1/2, BERT): ``h_t = e(x_t) + p_t``.

    Book: Positional encodings, "Learned absolute encodings".

    ``forward(positions)`` maps long positions ``(...)`` to ``(..., d)``; positions beyond
    ``max_positions - 1`` have no vector, which is why learned APE cannot extrapolate.
    """

    def __init__(self, max_positions: int, d: int):
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.randn(max_positions, d) * 0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"position {int(positions.max())} has no learned embedding: only 0..{self.max_positions - 1} were trained"
            )
        return self.weight[positions]


def rope_angles(positions: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angles ``positions[..., None] * theta_i`` with ``theta_i = base**(-2i/d)``, ``i = 0..d/2-1``.

    Book: Deriving RoPE, "The frequency grid". Shape ``(*positions.shape, d/2)``, always float64: at
    position 10^4 a float32 angle is off by about 10^-3 rad.
    """
    _check_even(d, "rope_angles")
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)
    return positions.to(torch.float64)[..., None] * theta


def _positions_for(x: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    t = x.shape[-2]
    if positions is None:
        return torch.arange(t, device=x.device)
    if positions.shape[-1] != t:
        raise ValueError(f"positions has shape {shape_str(positions.shape)} but x has {t} positions (dimension -2)")
    return positions.to(x.device)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0,
               interleaved: bool = True, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding (Su et al., 2024): rotate each feature pair of ``x`` by ``m * theta_i``.

    Book: Deriving RoPE, "The rotation-matrix form".

    For the pair ``(a, b)`` of features and position ``m``: ``(a, b) -> (a cos - b sin, a sin + b cos)`` of the
    angle ``m * theta_i``. Pairs are ``(2i, 2i+1)`` when ``interleaved`` (RoFormer), ``(i, i + d/2)`` otherwise
    (rotate-half, GPT-NeoX/Llama). ``x (..., T, d)``; ``positions`` (long or float, broadcastable to
    ``(..., T)``) default to ``0..T-1``. Then ``<rope(q)_m, rope(k)_n>`` depends on ``m - n`` only.
    ``inv_freq (d/2,)`` replaces the frequencies ``theta_i = base**(-2i/d)`` (a scaled RoPE, see
    :func:`rope_frequencies`).
    """
    check_tensor("x", x, min_dim=2, floating=True)
    d = x.shape[-1]
    _check_even(d, "apply_rope")
    if inv_freq is None:
        angles = rope_angles(_positions_for(x, positions), d, base)  # (..., T, d/2), float64
    else:
        if tuple(inv_freq.shape) != (d // 2,):
            raise ValueError(f"inv_freq has shape {shape_str(inv_freq.shape)} but x has {d} features: expected ({d // 2},)")
        angles = _positions_for(x, positions).to(torch.float64)[..., None] * inv_freq.to(x.device, torch.float64)
    # cos and sin in float64, then cast: a float32 angle at position 1e5 is already off by ~5e-3 rad
    return _rotate_pairs(x, torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype), interleaved)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``(a, b) -> (a cos - b sin, a sin + b cos)`` on the feature pairs of ``x (..., T, d)``; ``cos``, ``sin``
    broadcast to ``(..., T, d/2)``."""
    d = x.shape[-1]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def apply_rope_complex(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """RoPE in complex form: read adjacent pairs as ``z_i = x_{2i} + 1j * x_{2i+1}`` and multiply by
    ``exp(1j * m * theta_i)``. Book: Deriving RoPE, "From complex numbers to rotations".
    Equals ``apply_rope(x, positions, base, interleaved=True)``."""
    check_tensor("x", x, min_dim=2, floating=True)
    _check_even(x.shape[-1], "apply_rope_complex")
    complex_dtype = torch.complex128 if x.dtype == torch.float64 else torch.complex64
    z = torch.view_as_complex(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
                              .reshape(*x.shape[:-1], -1, 2).contiguous())
    angles = rope_angles(_positions_for(x, positions), x.shape[-1], base)
    rotated = z * torch.polar(torch.ones_like(angles), angles).to(complex_dtype)
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)


ROPE_SCALING_TYPES = ("linear", "dynamic", "yarn", "llama3")

# The keys each scaling rule reads (named as in transformers' ``rope_parameters``), with their defaults.
_ROPE_SCALING_KEYS = {
    "linear": {"factor": None},
    "dynamic": {"factor": None},
    "yarn": {"factor": None, "original_max_position_embeddings": None, "beta_fast": 32.0, "beta_slow": 1.0,
             "attention_factor": None, "mscale": None, "mscale_all_dim": None, "truncate": True},
    "llama3": {"factor": None, "original_max_position_embeddings": None, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0},
}


def check_rope_scaling(scaling: dict | None) -> dict | None:
    """Validate a RoPE scaling rule and return it with its type under ``"rope_type"`` (the legacy key ``"type"``
    is accepted). Raises ``ValueError`` naming an unknown type, an unknown key or a missing ``factor``."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {scaling!r}")
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    if kind in (None, "default"):
        if scaling:
            raise ValueError(f"rope_scaling has no rope_type but sets {sorted(scaling)}")
        return None
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"rope_scaling type {kind!r} is not supported: use one of {ROPE_SCALING_TYPES}")
    unknown = sorted(set(scaling) - set(_ROPE_SCALING_KEYS[kind]))
    if unknown:
        raise ValueError(f"rope_scaling of type {kind!r} has unsupported keys {unknown}; "
                         f"it reads {sorted(_ROPE_SCALING_KEYS[kind])}")
    if not (isinstance(scaling.get("factor"), (int, float)) and scaling["factor"] > 0):
        raise ValueError(f"rope_scaling of type {kind!r} needs a positive 'factor', got {scaling.get('factor')!r}")
    return {"rope_type": kind, **{k: scaling.get(k, default) for k, default in _ROPE_SCALING_KEYS[kind].items()}}


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(d: int, base: float = 10000.0, scaling: dict | None = None, seq_len: int | None = None,
                     max_position_embeddings: int | None = None) -> tuple[torch.Tensor, float]:
    """The RoPE frequencies ``inv_freq (d/2,)`` (float64, on the CPU) and the attention factor of a scaling rule.

    Book: From GPT-2 to Llama 3, "Context extension".

    Unscaled: ``theta_i = base**(-2i/d)`` and factor 1. ``scaling`` (``rope_type`` and ``factor`` ``s``,
    keys as in transformers):
    - ``linear``: position interpolation (Chen et al., 2023), ``m -> m / s``, i.e. ``theta_i / s``;
    - ``dynamic``: dynamic NTK scaling: the base grows with the current length ``L = max(seq_len, L_max)``,
      ``base' = base * (s L / L_max - (s - 1))**(d / (d - 2))`` (``L_max = max_position_embeddings``);
    - ``yarn`` (Peng et al., 2023): per frequency a blend ``(1 - r_i) theta_i + r_i theta_i / s`` where the ramp
      ``r_i`` rises from 0 to 1 between the dimensions that turn ``beta_fast`` and ``beta_slow`` times over the
      original context ``L_0``, ``d_c(n) = d ln(L_0 / (2 pi n)) / (2 ln base)``; q and k are multiplied by the
      attention factor ``0.1 ln s + 1`` (so the logits by its square);
    - ``llama3`` (Meta, 2024): wavelengths ``2 pi / theta_i`` shorter than ``L_0 / high_freq_factor`` keep
      ``theta_i``, longer than ``L_0 / low_freq_factor`` become ``theta_i / s``, and in between
      ``(1 - g) theta_i / s + g theta_i`` with ``g = (L_0 / wavelength - low) / (high - low)``.
    """
    _check_even(d, "rope_frequencies")
    scaling = check_rope_scaling(scaling)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)
    if scaling is None:
        return theta, 1.0
    kind, s = scaling["rope_type"], float(scaling["factor"])
    original = scaling.get("original_max_position_embeddings") or max_position_embeddings
    if kind in ("dynamic", "yarn", "llama3") and original is None:
        raise ValueError(f"rope_scaling of type {kind!r} needs the original context length "
                         "(original_max_position_embeddings or max_position_embeddings)")
    if kind == "linear":
        return theta / s, 1.0
    if kind == "dynamic":
        if d < 4:
            raise ValueError(f"dynamic NTK scaling needs d >= 4, got d={d}")
        length = max(seq_len or 0, max_position_embeddings or original)
        scaled_base = base * (s * length / original - (s - 1)) ** (d / (d - 2))
        return scaled_base ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d), 1.0
    if kind == "yarn":
        def correction_dim(n_rotations):
            return d * math.log(original / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(scaling["beta_fast"]), correction_dim(scaling["beta_slow"])
        if scaling["truncate"]:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # a step instead of a ramp
        ramp = ((torch.arange(d // 2, dtype=torch.float64, device="cpu") - low) / (high - low)).clamp(0, 1)
        factor = scaling["attention_factor"]
        if factor is None:
            mscale, mscale_all = scaling["mscale"], scaling["mscale_all_dim"]
            factor = (_yarn_mscale(s, mscale) / _yarn_mscale(s, mscale_all) if mscale and mscale_all
                      else _yarn_mscale(s))
        return (1 - ramp) * theta + ramp * theta / s, float(factor)
    low_f, high_f = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])  # llama3
    wavelength = 2 * math.pi / theta
    smooth = (original / wavelength - low_f) / (high_f - low_f)
    blended = (1 - smooth) * theta / s + smooth * theta
    inv_freq = torch.where(wavelength > original / low_f, theta / s, blended)
    return torch.where(wavelength < original / high_f, theta, inv_freq), 1.0


class _ExactBuffers(nn.Module):
    """A module whose buffers are float64 constants computed once on the CPU: ``.to(device)`` moves them, but no
    ``.to(dtype)``, ``.half()`` or ``.bfloat16()`` ever rounds them (a bfloat16 RoPE frequency is off by up to
    0.4%, which at position 1000 turns into radians). Buffers are not saved in the state dict; a module built
    on the meta device gets real values back on its first move (``.to("cuda")``, or a dtype cast: the CPU)."""

    def _register_exact(self, name: str, value: torch.Tensor) -> None:
        self._exact = {**getattr(self, "_exact", {}), name: value.to(torch.float64).cpu()}
        self.register_buffer(name, value.to(torch.float64), persistent=False)

    def _apply(self, fn, recurse=True):
        current = {name: self._buffers.pop(name) for name in self._exact}
        super()._apply(fn, recurse)
        for name, exact in self._exact.items():  # where fn sends a tensor from here, with the exact values
            here = "cpu" if current[name].is_meta else current[name].device
            self._buffers[name] = exact.to(fn(torch.empty(0, dtype=torch.float64, device=here)).device)
        return self


class RotaryEmbedding(_ExactBuffers):
    """RoPE as a model applies it to per-head queries and keys: layout, partial rotation and scaling.

    Book: From GPT-2 to Llama 3, "RoPE" and "Context extension".

    The first ``rotary_dim`` features of each head (all ``d_head`` by default; GPT-J and GPT-NeoX rotate a
    fraction) are rotated by :func:`apply_rope` with the frequencies of :func:`rope_frequencies`, then multiplied
    by the scaling rule's attention factor; the other features pass unchanged. ``interleaved`` pairs ``(2i, 2i+1)``
    (RoFormer), otherwise ``(i, i + rotary_dim/2)`` (rotate-half, GPT-NeoX and Llama).
    Call it as ``rope(x, positions, seq_len=None)`` with ``x (..., T, d_head)`` and positions broadcastable to
    ``(..., T)``. The frequencies are the float64 buffer ``inv_freq (rotary_dim/2,)``, which ``.to(device)``
    moves (and no dtype cast rounds); dynamic NTK scaling recomputes them for the current length ``seq_len``
    (default ``max(positions) + 1``, which reads the positions back from the device). ``rotate(q, k, positions,
    seq_len, key)`` rotates both with one cos/sin table, and reuses the last table while ``key`` (any hashable
    naming the positions, e.g. ``(past, T)``) is unchanged: the layers of a model share one RoPE and one table.
    """

    def __init__(self, d_head: int, base: float = 10000.0, interleaved: bool = True, rotary_dim: int | None = None,
                 scaling: dict | None = None, max_position_embeddings: int | None = None):
        super().__init__()
        rotary_dim = d_head if rotary_dim is None else rotary_dim
        if not 0 < rotary_dim <= d_head or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and in (0, d_head={d_head}], got {rotary_dim}")
        self.d_head, self.rotary_dim, self.base, self.interleaved = d_head, rotary_dim, base, interleaved
        self.scaling, self.max_position_embeddings = check_rope_scaling(scaling), max_position_embeddings
        inv_freq, self.attention_factor = rope_frequencies(rotary_dim, base, self.scaling,
                                                           max_position_embeddings=max_position_embeddings)
        self._register_exact("inv_freq", inv_freq)
        self._table = (None, None, None)  # (key, cos, sin) of the last call of rotate

    def extra_repr(self) -> str:
        return (f"d_head={self.d_head}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}, scaling={self.scaling}")

    def forward(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        if x.shape[-1] != self.d_head:
            raise ValueError(f"x has shape {shape_str(x.shape)} but this RoPE is for d_head={self.d_head}")
        return self.rotate(x, None, positions, seq_len)[0]

    def _cos_sin(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int | None):
        """cos and sin ``(..., T, rotary_dim/2)`` in ``x``'s dtype, times the scaling's attention factor."""
        inv_freq, factor = self.inv_freq, self.attention_factor
        if self.scaling is not None and self.scaling["rope_type"] == "dynamic":
            if seq_len is None:
                seq_len = int(positions.max()) + 1 if positions.numel() else 0
            inv_freq, factor = rope_frequencies(self.rotary_dim, self.base, self.scaling, seq_len,
                                                self.max_position_embeddings)
        angles = positions.to(x.device, torch.float64)[..., None] * inv_freq.to(x.device)
        return (torch.cos(angles) * factor).to(x.dtype), (torch.sin(angles) * factor).to(x.dtype)

    def rotate(self, q: torch.Tensor, k: torch.Tensor | None, positions: torch.Tensor, seq_len: int | None = None,
               key=None):
        """``(rope(q), rope(k))`` (``k`` may be None) with one cos/sin table; see the class docstring."""
        for name, t in (("q", q), ("k", k)):
            if t is not None and t.shape[-1] != self.d_head:
                raise ValueError(f"{name} has shape {shape_str(t.shape)} but this RoPE is for d_head={self.d_head}")
        if positions.shape[-1] != q.shape[-2]:
            raise ValueError(f"positions has shape {shape_str(positions.shape)} but x has {q.shape[-2]} positions "
                             "(dimension -2)")
        # an inference-mode table cannot be saved for a later backward: the mode is part of the key
        full_key = None if key is None else (key, seq_len, q.device, q.dtype, torch.is_inference_mode_enabled())
        if full_key is not None and self._table[0] == full_key:
            cos, sin = self._table[1:]
        else:
            cos, sin = self._cos_sin(q, positions, seq_len)
            self._table = (full_key, cos, sin)
        return tuple(None if t is None else self._rotate_part(t, cos, sin) for t in (q, k))

    def _rotate_part(self, x, cos, sin):
        rotated = _rotate_pairs(x[..., : self.rotary_dim], cos, sin, self.interleaved)
        if self.rotary_dim == self.d_head:
            return rotated
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)


def rope_matrix(m: float, d: int, base: float = 10000.0, dtype=torch.float64) -> torch.Tensor:
    """The block-diagonal rotation ``R_m`` (``d x d``) with blocks ``[[cos, -sin], [sin, cos]]`` of the angles
    ``m * theta_i`` on adjacent pairs: ``apply_rope(x)[m] = R_m @ x[m]``. Book: Deriving RoPE,
    "The rotation-matrix form". ``R_m^T = R_{-m}`` and ``R_m R_n = R_{m+n}``."""
    _check_even(d, "rope_matrix")
    angles = rope_angles(torch.tensor(float(m), dtype=torch.float64), d, base)
    R = torch.zeros(d, d, dtype=torch.float64)
    for i, a in enumerate(angles.tolist()):
        c, s = math.cos(a), math.sin(a)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return R.to(dtype)


def t5_relative_bucket(relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32,
                       max_distance: int = 128) -> torch.Tensor:
    """T5's bucket index of ``relative_position = key_position - query_position`` (Raffel et al., 2020).

    Book: Positional encodings, "T5 relative buckets".

    Bidirectional: half the buckets for keys after the query (``relative_position > 0``), half for the rest.
    Within each half of ``n`` buckets, with ``r = |relative_position|`` (bidirectional) or
    ``r = max(-relative_position, 0)`` (causal) and ``n_exact = n // 2``:
    ``bucket = r`` if ``r < n_exact``, else
    ``min(n - 1, n_exact + floor(log(r / n_exact) / log(max_distance / n_exact) * (n - n_exact)))``.
    """
    check_tensor("relative_position", relative_position)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets = buckets + (rel > 0).long() * n
        r = rel.abs()
    else:
        r = (-rel).clamp(min=0)
    n_exact = n // 2
    if n_exact < 1:
        raise ValueError(f"num_buckets={num_buckets} is too small: each direction needs at least 2 buckets")
    # log(0) for r = 0 is never used: those positions are small and take the exact branch
    log_ratio = torch.log(r.clamp(min=1).double() / n_exact) / math.log(max_distance / n_exact)
    large = n_exact + (log_ratio * (n - n_exact)).long()
    large = large.clamp(max=n - 1)
    return buckets + torch.where(r < n_exact, r, large)


class T5RelativeBias(nn.Module):
    """A learned scalar per (bucket, head), added to the attention scores: ``b[h, i, j] = w[bucket(j - i), h]``.

    Book: Positional encodings, "T5 relative buckets". ``forward(t_q, t_k, offset=None)`` returns
    ``(n_heads, t_q, t_k)``; query ``i`` sits at position ``i + offset`` (default ``t_k - t_q``, the last
    ``t_q`` positions, as in cached decoding).
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, t_q: int, t_k: int, offset: int | None = None) -> torch.Tensor:
        offset = t_k - t_q if offset is None else offset
        device = self.embedding.weight.device
        rel = torch.arange(t_k, device=device)[None, :] - (torch.arange(t_q, device=device)[:, None] + offset)
        buckets = t5_relative_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return self.embedding(buckets).permute(2, 0, 1)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The head slopes of ALiBi (Press et al., 2022), as the official implementation computes them.

    Book: Positional encodings, "ALiBi".

    For ``n`` a power of two: the geometric sequence ``s_h = 2**(-8h/n)``, ``h = 1..n``. Otherwise, with ``p``
    the largest power of two below ``n``: the ``p`` slopes for ``p`` heads, then every other slope of the
    sequence for ``2p`` heads (``s_1, s_3, ...``) until there are ``n``.

    >>> alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039], dtype=torch.float64)
    """
    if n_heads < 1:
        raise ValueError(f"alibi_slopes needs n_heads >= 1, got {n_heads}")

    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(p)
    if p < n_heads:
        slopes += power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float64, device="cpu")


def alibi_bias(n_heads: int, t_q: int, t_k: int | None = None, offset: int | None = None,
               device=None) -> torch.Tensor:
    """ALiBi's additive bias ``b[h, i, j] = -s_h * (i + offset - j)``, shape ``(n_heads, t_q, t_k)``, float32.

    Book: Positional encodings, "ALiBi". Query ``i`` sits at position ``i + offset`` (default ``t_k - t_q``).
    Keys in the future get a positive bias; a causal mask removes them. Within a query row the bias differs
    from the official code's ``s_h * j`` only by a constant, which the softmax ignores.
    """
    return _alibi_from_slopes(alibi_slopes(n_heads).to(device), t_q, t_k, offset)


def _alibi_from_slopes(slopes: torch.Tensor, t_q: int, t_k: int | None, offset: int | None) -> torch.Tensor:
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if offset is None else offset
    i = torch.arange(t_q, device=slopes.device)[:, None] + offset
    distance = i - torch.arange(t_k, device=slopes.device)[None, :]
    return (-slopes.to(torch.float64)[:, None, None] * distance).float()


class ALiBi(_ExactBuffers):
    """ALiBi as an attention layer holds it: the slopes of :func:`alibi_slopes` as the float64 buffer ``slopes
    (n_heads,)``, which ``.to(device)`` moves; ``forward(t_q, t_k, offset=None)`` is :func:`alibi_bias` on
    the buffer's device. Book: Positional encodings, "ALiBi"."""

    def __init__(self, n_heads: int):
        super().__init__()
        self._register_exact("slopes", alibi_slopes(n_heads))

    def forward(self, t_q: int, t_k: int, offset: int | None = None) -> torch.Tensor:
        return _alibi_from_slopes(self.slopes, t_q, t_k, offset)


def kerple_bias(n_heads: int, t_q: int, t_k: int | None = None, variant: str = "log", r1=1.0, r2=1.0,
                offset: int | None = None) -> torch.Tensor:
    """KERPLE's additive bias (Chi et al., 2022), shape ``(n_heads, t_q, t_k)``, with ``n = |i + offset - j|``:

    - ``variant="log"``:   ``b[h, i, j] = -r1[h] * log(1 + r2[h] * n)``;
    - ``variant="power"``: ``b[h, i, j] = -r1[h] * n ** r2[h]``, with ``0 < r2 <= 2``.

    Book: Positional encodings, "KERPLE: kernels of the distance". ``r1`` and ``r2`` are positive floats or
    ``(n_heads,)`` tensors (gradients flow through them); query ``i`` sits at position ``i + offset`` (default
    ``t_k - t_q``). The power variant with ``r2 = 1`` and ``r1`` the ALiBi slopes is ALiBi on every causal entry.
    Computed in the dtype of the tensor parameters (float32 for plain numbers), on their device.
    """
    if variant not in KERPLE_VARIANTS:
        raise ValueError(f"KERPLE variant must be one of {KERPLE_VARIANTS}, got {variant!r}")
    t_k = t_q if t_k is None else t_k
    offset = t_k - t_q if offset is None else offset
    like = next((r for r in (r1, r2) if isinstance(r, torch.Tensor)), None)
    factory = {"dtype": torch.float32} if like is None else {"dtype": like.dtype, "device": like.device}
    r1, r2 = (torch.as_tensor(r, **factory) for r in (r1, r2))
    for name, r in (("r1", r1), ("r2", r2)):
        if r.numel() not in (1, n_heads) or r.dim() > 1:
            raise ValueError(f"{name} has shape {shape_str(r.shape)}: expected a number or ({n_heads},), one per head")
    r1, r2 = (r.expand(n_heads)[:, None, None] for r in (r1, r2))
    if (r1 <= 0).any() or (r2 <= 0).any() or (variant == "power" and (r2 > 2).any()):
        bound = "0 < r2 <= 2" if variant == "power" else "r2 > 0"
        raise ValueError(f"KERPLE's {variant} kernel needs r1 > 0 and {bound}, got r1={r1.flatten().tolist()}, "
                         f"r2={r2.flatten().tolist()}")
    return _kerple_kernel(t_q, t_k, offset, variant, r1, r2)


def _kerple_kernel(t_q: int, t_k: int, offset: int, variant: str, r1: torch.Tensor, r2: torch.Tensor):
    """:func:`kerple_bias` without the checks, for ``r1, r2`` of shape ``(H, 1, 1)`` known to be valid."""
    position = torch.arange(t_q, device=r1.device)[:, None] + offset
    distance = (position - torch.arange(t_k, device=r1.device)[None, :]).abs().to(r1.dtype)
    if variant == "log":
        return -r1 * torch.log1p(r2 * distance)
    # n ** r2 at n = 0 is 0; its derivative in r2 there (0 * log 0) would be nan, so n = 0 is taken apart
    powered = torch.where(distance > 0, distance.clamp(min=1) ** r2, torch.zeros_like(distance))
    return -r1 * powered


class KerpleBias(nn.Module):
    """KERPLE's bias with learned, positive per-head ``r1`` and ``r2`` (:func:`kerple_bias`).

    Book: Positional encodings, "KERPLE: kernels of the distance". Positivity is built into the parametrisation
    instead of clamping: ``r = softplus(raw)`` (and ``r2 = 2 sigmoid(raw)`` for the power variant, so ``0 < r2 < 2``).
    Initialisation, per head, as the authors' code (github.com/chijames/KERPLE, ``megatron/mpu/layers.py``) draws
    it: the parameter in ``[0, 2)`` is the log kernel's coefficient (``ParallelKerpleLog.bias_p``) but the power
    kernel's exponent (``ParallelKerplePower.bias_p``), so ``log``: ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``; ``power``:
    ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``; draws are clamped to at least 0.01 (their ``eps``), the power exponent
    to at most 1.99 (2 itself has no finite ``raw``).
    ``forward(t_q, t_k, offset=None)`` returns ``(n_heads, t_q, t_k)`` as :class:`T5RelativeBias` does.
    """

    def __init__(self, n_heads: int, variant: str = "log"):
        super().__init__()
        if variant not in KERPLE_VARIANTS:
            raise ValueError(f"KERPLE variant must be one of {KERPLE_VARIANTS}, got {variant!r}")
        self.n_heads, self.variant = n_heads, variant
        coefficient_range, inner_range = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        r1 = torch.rand(n_heads).mul(coefficient_range).clamp(min=1e-2)
        r2 = torch.rand(n_heads).mul(inner_range).clamp(1e-2, 1.99)
        self.raw_r1 = nn.Parameter(r1.expm1().log())  # the inverse of softplus
        self.raw_r2 = nn.Parameter(r2.expm1().log() if variant == "log" else torch.logit(r2 / 2))

    @property
    def r1(self) -> torch.Tensor:
        return nn.functional.softplus(self.raw_r1)

    @property
    def r2(self) -> torch.Tensor:
        return nn.functional.softplus(self.raw_r2) if self.variant == "log" else 2 * torch.sigmoid(self.raw_r2)

    def forward(self, t_q: int, t_k: int, offset: int | None = None) -> torch.Tensor:
        offset = t_k - t_q if offset is None else offset  # r1, r2 > 0 by construction: no check (and no sync)
        return _kerple_kernel(t_q, t_k, offset, self.variant, self.r1[:, None, None], self.r2[:, None, None])


def shaw_relative_positions(t_q: int, t_k: int, max_distance: int, offset: int | None = None) -> torch.Tensor:
    """Indices ``clip(j - i, -k, k) + k`` in ``0..2k`` of Shaw et al. (2018)'s relative embeddings, shape
    ``(t_q, t_k)``, with query ``i`` at position ``i + offset`` (default ``t_k - t_q``).

    Book: Positional encodings, "Relative encodings with clipping".
    """
    if max_distance < 0:
        raise ValueError(f"max_distance must be >= 0, got {max_distance}")
    offset = t_k - t_q if offset is None else offset
    rel = torch.arange(t_k)[None, :] - (torch.arange(t_q)[:, None] + offset)
    return rel.clamp(-max_distance, max_distance) + max_distance


class ShawRelativePositions(nn.Module):
    """Shaw et al. (2018): learned key and value vectors per clipped relative distance.

    Book: Positional encodings, "Relative encodings with clipping".

    ``e_ij = q_i . (k_j + a^K_ij) / sqrt(d)``, ``z_i = sum_j alpha_ij (v_j + a^V_ij)`` with
    ``a_ij = w[clip(j - i, -k, k)]``. ``forward(q, k, v, mask=None)`` on ``(B, H, T, d)`` tensors returns
    ``(B, H, T_q, d)``; the mask follows the library convention (True = may attend).
    """

    def __init__(self, d_head: int, max_distance: int):
        super().__init__()
        self.max_distance = max_distance
        self.key = nn.Embedding(2 * max_distance + 1, d_head)
        self.value = nn.Embedding(2 * max_distance + 1, d_head)

    def forward(self, q, k, v, mask=None, is_causal=False):
        t_q, t_k = q.shape[-2], k.shape[-2]
        idx = shaw_relative_positions(t_q, t_k, self.max_distance).to(q.device)
        a_k, a_v = self.key(idx), self.value(idx)  # (t_q, t_k, d)
        scores = (q @ k.transpose(-1, -2) + torch.einsum("...id,ijd->...ij", q, a_k)) / math.sqrt(q.shape[-1])
        if is_causal:  # queries are the last t_q positions
            tri = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q)
            mask = tri if mask is None else mask & tri
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        return w @ v + torch.einsum("...ij,ijd->...id", w, a_v)
