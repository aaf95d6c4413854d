"""FlashAttention-2 as Triton kernels (forward, and a backward in two kernels), imported and defined lazily
on first use (:func:`_triton_kernels`) so that ``llmarch`` imports without triton. On CPU tensors the kernels
run in triton's interpreter, which needs ``TRITON_INTERPRET=1`` set before anything imports triton.

Book: Efficient attention, "GPU paths".
"""

from __future__ import annotations

import math
import os

import torch
from torch.autograd.function import once_differentiable

from llmarch._checks import shape_str
from llmarch.efficient._validation import _check_qkv

__all__ = ["TRITON_VERSION", "triton_flash_attention"]


TRITON_VERSION = "3.7.1"  # the version torch 2.13 pins (its CUDA wheel's requirement)
_TRITON = {}


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_kernels():
    """Import triton and define the kernels on first use, so that ``llmarch`` imports without triton.

    ``TRITON_INTERPRET=1`` must be set before anything imports triton: ``triton.language`` builds its helpers
    (``tl.zeros``, ...) for the GPU compiler or for the interpreter when it is imported, and importing
    ``torch.utils.flop_counter`` or using ``torch.compile`` imports it. Setting it later raises a RuntimeError
    that says so (instead of the interpreter's "Cannot call @triton.jit'd outside of the scope of a kernel")."""
    if _TRITON:
        return _TRITON
    try:
        import triton
        import triton.language as tl
    except ImportError as err:
        raise ImportError(
            "triton_flash_attention needs the triton package: pip install triton==" + TRITON_VERSION +
            " (the version torch 2.13 pins; wheels for Linux x86_64 only). On a machine without a CUDA GPU, set "
            "TRITON_INTERPRET=1 before triton is imported to run the kernel in triton's interpreter."
        ) from err
    from triton.runtime.jit import JITFunction

    if _triton_interpreting() and isinstance(tl.zeros, JITFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton had been imported (importing torch.utils.flop_counter or "
            "using torch.compile imports it), so triton.language is built for the GPU compiler and the "
            "interpreter cannot run the kernels: set TRITON_INTERPRET=1 before anything imports triton, "
            "e.g. in the environment of the process or before `import torch`"
        )

    @triton.jit
    def fwd_kernel(Q, K, V, O, LSE, scale, T_Q, T_K, D, causal_offset,
                   stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt, stride_ob, stride_ot,
                   IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT_DTYPE: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :],
                    mask=(rows[:, None] < T_Q) & d_ok[None, :], other=0.0).to(DOT_DTYPE)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = T_K
        if IS_CAUSAL:  # the last query of this tile sees keys up to (pid_m + 1) * BLOCK_M - 1 + causal_offset
            hi = tl.minimum(T_K, (pid_m + 1) * BLOCK_M + causal_offset)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            kt = tl.load(K + bh * stride_kb + cols[None, :] * stride_kt + offs_d[:, None],
                         mask=(cols[None, :] < T_K) & d_ok[:, None], other=0.0).to(DOT_DTYPE)
            s = tl.dot(q, kt, input_precision="ieee") * scale
            ok = (cols[None, :] < T_K) & (rows[:, None] >= 0)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            vb = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :],
                         mask=(cols[:, None] < T_K) & d_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), vb, input_precision="ieee")
            m_i = m_new
        seen = l_i > 0.0
        l_safe = tl.where(seen, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(seen, m_i + tl.log(l_safe), float("-inf"))
        tl.store(O + bh * stride_ob + rows[:, None] * stride_ot + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=(rows[:, None] < T_Q) & d_ok[None, :])
        tl.store(LSE + bh * T_Q + rows, lse, mask=rows < T_Q)

    @triton.jit
    def bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, scale, T_Q, T_K, D, causal_offset,
                        stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                        IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
        # one program per tile of keys: loops over the query tiles that can see it (no atomics needed)
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        kv_mask = (cols[:, None] < T_K) & d_ok[None, :]
        k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo = 0
        if IS_CAUSAL:  # the first query that sees key pid_n * BLOCK_N is i = pid_n * BLOCK_N - causal_offset
            lo = tl.maximum(0, pid_n * BLOCK_N - causal_offset)
            lo = (lo // BLOCK_M) * BLOCK_M
        for start_m in range(lo, T_Q, BLOCK_M):
            rows = start_m + offs_m
            q_mask = (rows[:, None] < T_Q) & d_ok[None, :]
            q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
            do = tl.load(DO + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
            q, do = q.to(DOT_DTYPE), do.to(DOT_DTYPE)
            lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=float("inf"))
            delta = tl.load(DELTA + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            ok = (rows[:, None] < T_Q) & (cols[None, :] < T_K)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p).to(DOT_DTYPE), do, input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(DOT_DTYPE), q, input_precision="ieee")
        tl.store(DK + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], dv.to(DV.dtype.element_ty),
                 mask=kv_mask)

    @triton.jit
    def bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, scale, T_Q, T_K, D, causal_offset,
                      stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
                      IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q_mask = (rows[:, None] < T_Q) & d_ok[None, :]
        q = tl.load(Q + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :], mask=q_mask, other=0.0)
        q, do = q.to(DOT_DTYPE), do.to(DOT_DTYPE)
        lse = tl.load(LSE + bh * T_Q + rows, mask=rows < T_Q, other=float("inf"))
        delta = tl.load(DELTA + bh * T_Q + rows, mask=rows < T_Q, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        hi = T_K
        if IS_CAUSAL:
            hi = tl.minimum(T_K, (pid_m + 1) * BLOCK_M + causal_offset)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            kv_mask = (cols[:, None] < T_K) & d_ok[None, :]
            k = tl.load(K + bh * stride_kb + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + bh * stride_vb + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
            k, v = k.to(DOT_DTYPE), v.to(DOT_DTYPE)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            ok = (rows[:, None] < T_Q) & (cols[None, :] < T_K)
            if IS_CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + causal_offset)
            p = tl.where(ok, tl.exp(s - lse[:, None]), 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(DOT_DTYPE), k, input_precision="ieee")
        tl.store(DQ + bh * stride_qb + rows[:, None] * stride_qt + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=q_mask)

    _TRITON.update(triton=triton, tl=tl, fwd=fwd_kernel, bwd_dkdv=bwd_dkdv_kernel, bwd_dq=bwd_dq_kernel,
                   interpret=_triton_interpreting())
    return _TRITON


# Launch settings per kernel: (rows of queries, columns of keys) per tile, warps, software-pipelining stages.
# Not measured here (no GPU in this session): the forward keeps the 64 x 64 tiles and Triton's default 4 warps
# and 3 stages that were measured best on an H100 (../shared/measurements, block-size table); the backward takes
# the shapes of Triton's fused-attention tutorial and FlashAttention-2 (Dao, 2023, section 3.3): the dK/dV
# kernel holds a tall tile of 128 keys in registers and streams thin 32-query tiles past it, the dQ kernel the
# transpose (128 queries, 32-key steps), so each program reuses its resident tile across many cheap loads; deeper
# pipelines (5 stages) hide the loads at d <= 64, and at d = 128 the larger tiles leave shared memory for 3
# stages and want 8 warps. float32 doubles every tile's bytes: half the depth, 2 stages. "Per kernel" is the
# point: the backward used to share the forward's tiles and Triton's defaults.
_GPU_SETTINGS = {  # (kernel, head dim bound, dtype class) -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
    ("fwd", 64, "half"): (64, 64, 4, 3), ("fwd", 128, "half"): (64, 64, 4, 3), ("fwd", 256, "half"): (64, 32, 4, 2),
    ("dkdv", 64, "half"): (32, 128, 4, 5), ("dkdv", 128, "half"): (32, 128, 8, 3), ("dkdv", 256, "half"): (16, 64, 4, 2),
    ("dq", 64, "half"): (128, 32, 4, 5), ("dq", 128, "half"): (128, 32, 8, 3), ("dq", 256, "half"): (64, 16, 4, 2),
}
# Under the interpreter (CPU tests) tiles are small, and unequal so that the two loop directions are exercised.
_INTERPRETER_TILES = {"fwd": (32, 32), "dkdv": (16, 32), "dq": (32, 16)}


def _launch_config(kern, kernel: str, q: torch.Tensor, tiles: tuple[int, int] | None = None) -> dict:
    """Constexprs and launch options of ``kernel`` (``"fwd"``, ``"dkdv"`` or ``"dq"``) for ``q``'s head dim
    and dtype; ``tiles`` overrides ``(BLOCK_M, BLOCK_N)``."""
    tl = kern["tl"]
    d = q.shape[-1]
    block_d = max(16, 1 << (d - 1).bit_length())
    if kern["interpret"]:
        # The interpreter's bf16/fp16 dot is wrong: under it every dot runs in float32.
        block_m, block_n = tiles or _INTERPRETER_TILES[kernel]
        return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DOT_DTYPE=tl.float32)
    bound = 64 if block_d <= 64 else 128 if block_d <= 128 else 256
    block_m, block_n, warps, stages = _GPU_SETTINGS[(kernel, bound, "half")]
    if q.dtype == torch.float32:
        block_m, block_n, stages = max(16, block_m // 2), max(16, block_n // 2), 2
    block_m, block_n = tiles or (block_m, block_n)
    dot_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[q.dtype]
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DOT_DTYPE=dot_dtype, num_warps=warps,
                num_stages=stages)


class _TritonFlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal_offset, tiles):
        kern = _triton_kernels()
        lead, t_q, t_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
        q3, k3, v3 = (x.reshape(-1, x.shape[-2], d).contiguous() for x in (q, k, v))
        bh = q3.shape[0]
        o3 = torch.empty_like(q3)
        lse = torch.empty(bh, t_q, dtype=torch.float32, device=q.device)
        cfg = _launch_config(kern, "fwd", q, tiles)
        grid = (kern["triton"].cdiv(t_q, cfg["BLOCK_M"]), bh)
        is_causal = causal_offset is not None
        kern["fwd"][grid](q3, k3, v3, o3, lse, scale, t_q, t_k, d, causal_offset or 0,
                          q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
                          o3.stride(0), o3.stride(1), IS_CAUSAL=is_causal, **cfg)
        ctx.save_for_backward(q3, k3, v3, o3, lse)  # only tensors: other tests read saved_tensors for the lse
        ctx.config = (scale, causal_offset, q.shape, k.shape)
        return o3.reshape(*lead, t_q, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        kern = _triton_kernels()
        q3, k3, v3, o3, lse = ctx.saved_tensors
        scale, causal_offset, q_shape, k_shape = ctx.config
        bh, t_q, d = q3.shape
        t_k = k3.shape[1]
        do3 = dout.reshape(bh, t_q, d).contiguous()
        delta = (do3.float() * o3.float()).sum(-1)  # rowsum(dO * O), computed once outside the kernels
        dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        is_causal = causal_offset is not None
        strides = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1))
        cdiv = kern["triton"].cdiv
        cfg = _launch_config(kern, "dkdv", q3)  # one program per tile of BLOCK_N keys
        kern["bwd_dkdv"][(cdiv(t_k, cfg["BLOCK_N"]), bh)](q3, k3, v3, do3, lse, delta, dk, dv, scale, t_q, t_k, d,
                                                          causal_offset or 0, *strides, IS_CAUSAL=is_causal, **cfg)
        cfg = _launch_config(kern, "dq", q3)  # one program per tile of BLOCK_M queries
        kern["bwd_dq"][(cdiv(t_q, cfg["BLOCK_M"]), bh)](q3, k3, v3, do3, lse, delta, dq, scale, t_q, t_k, d,
                                                        causal_offset or 0, *strides, IS_CAUSAL=is_causal, **cfg)
        return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(k_shape), None, None, None


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                           scale: float | None = None, *, causal_offset: int = 0, block_q: int | None = None,
                           block_k: int | None = None) -> torch.Tensor:
    """:func:`flash_attention` as Triton kernels: the forward and both backward passes (FlashAttention-2).

    Book: Efficient attention, "GPU paths".

    Shapes: ``q, k, v (..., T, d)`` with equal leading dimensions (``t_q`` and ``t_k`` may differ; ``v`` has
    the same ``d``) -> ``(..., t_q, d)``; float16, bfloat16 or float32. ``is_causal`` and ``causal_offset`` as
    in :func:`flash_attention`. One program per tile of ``block_q`` queries (default 64; 32 in the interpreter)
    walks the key tiles of ``block_k`` with the online softmax and stores the output and row logsumexp; the
    backward has one kernel per key tile (``dK, dV``) and one per query tile (``dQ``), so no atomics, each with
    its own tiles, warps and pipeline depth per head dim and dtype (``_GPU_SETTINGS``); ``block_q`` and
    ``block_k`` set the forward's tiles only.
    Accumulation is in float32; float32 inputs use exact ("ieee") dot products, not TF32.

    Needs ``triton`` (``pip install triton==3.7.1``) and either a CUDA GPU or ``TRITON_INTERPRET=1`` set before
    triton is first imported, e.g. before ``import torch`` (triton's interpreter runs the same kernels on CPU
    tensors, slowly; every dot in float32).
    """
    _check_qkv(q, k, v)
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"q has shape {shape_str(q.shape)} but v has shape {shape_str(v.shape)}: "
                         "triton_flash_attention needs d_v == d_k")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"triton_flash_attention supports float16, bfloat16 and float32, got {q.dtype}")
    if isinstance(causal_offset, bool) or not isinstance(causal_offset, int):
        raise ValueError(f"causal_offset must be an integer, got {causal_offset!r}")
    kern = _triton_kernels()
    if q.device.type != "cuda" and not kern["interpret"]:
        raise RuntimeError(
            f"q is on {q.device}: triton_flash_attention runs on a CUDA GPU; to run it on CPU tensors set "
            "TRITON_INTERPRET=1 in the environment before triton is imported (slow, for testing)"
        )
    tiles = None
    if block_q is not None or block_k is not None:
        default = _launch_config(kern, "fwd", q)
        tiles = (block_q or default["BLOCK_M"], block_k or default["BLOCK_N"])
        for name, b in zip(("block_q", "block_k"), tiles):
            if b < 16 or b & (b - 1):
                raise ValueError(f"{name}={b} must be a power of two >= 16 (tl.dot and tl.arange need it)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _TritonFlashAttentionFunction.apply(q, k, v, scale, causal_offset if is_causal else None, tiles)
