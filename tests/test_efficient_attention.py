"""llmarch.efficient's attention paths: sparse masks against brute-force loops over their definitions, every
attention path against torch's SDPA or dense masked attention, FlashAttention's gradients against autograd through
dense attention, the Triton kernel in triton's interpreter, paged attention against contiguous attention."""

import doctest
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import llmarch.efficient as eff
from llmarch.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from llmarch.efficient import (
    BACKENDS,
    LinformerSelfAttention,
    PagedKVCache,
    attention,
    attention_memory_bytes,
    bigbird_mask,
    block_permutation_mask,
    blockwise_attention,
    dense_mask_mod,
    dilated_window_mask,
    fixed_mask,
    flash_attention,
    flex_alibi,
    flex_attention_with,
    flex_sliding_window,
    flex_t5,
    global_local_mask,
    kv_cache_bytes,
    paged_attention,
    repeat_kv,
    select_backend,
    sliding_window_mask,
    strided_mask,
    triton_flash_attention,
)
from llmarch.positional import T5RelativeBias, alibi_bias, alibi_slopes

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_MISSING = "triton is not installed (pip install triton==3.7.1, the version torch 2.13 pins)"
F64 = dict(atol=1e-10, rtol=1e-10)  # float64: the tiled sums differ from the dense ones by rounding only
F32 = dict(atol=1e-5, rtol=1e-5)


def randn(*shape, seed=0, dtype=torch.float64, requires_grad=False):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return t.requires_grad_(requires_grad)


def brute_mask(T, allowed):
    """The (T, T) mask with M[i, j] = allowed(i, j), by two Python loops."""
    return torch.tensor([[bool(allowed(i, j)) for j in range(T)] for i in range(T)])


def sdpa(q, k, v, mask=None, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


def grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def test_docstring_examples():
    assert doctest.testmod(eff, raise_on_error=False).failed == 0


# --- sparse attention patterns: brute force from the definitions ------------------------------------------


@pytest.mark.parametrize("T,w", [(1, 1), (7, 1), (7, 3), (9, 4), (6, 10)])
def test_sliding_window_mask(T, w):
    assert torch.equal(sliding_window_mask(T, w), brute_mask(T, lambda i, j: i - w + 1 <= j <= i))
    assert torch.equal(sliding_window_mask(T, w, causal=False), brute_mask(T, lambda i, j: abs(i - j) <= w // 2))


@pytest.mark.parametrize("T,w,dilation", [(10, 3, 1), (12, 3, 2), (13, 4, 3)])
def test_dilated_window_mask(T, w, dilation):
    causal = brute_mask(T, lambda i, j: any(i - j == m * dilation for m in range(w)))
    assert torch.equal(dilated_window_mask(T, w, dilation), causal)
    both = brute_mask(T, lambda i, j: any(abs(i - j) == m * dilation for m in range(w // 2 + 1)))
    assert torch.equal(dilated_window_mask(T, w, dilation, causal=False), both)
    assert torch.equal(dilated_window_mask(T, w, 1), sliding_window_mask(T, w))


@pytest.mark.parametrize("T,stride", [(9, 3), (16, 4), (11, 4), (5, 1)])
def test_strided_mask_is_the_union_of_the_papers_two_heads(T, stride):
    # Child et al. (2019): A1 = {max(0, i - l), ..., i}, A2 = {j <= i : (i - j) mod l == 0}
    a1 = brute_mask(T, lambda i, j: max(0, i - stride) <= j <= i)
    a2 = brute_mask(T, lambda i, j: j <= i and (i - j) % stride == 0)
    assert torch.equal(strided_mask(T, stride), a1 | a2)
    as_stated = brute_mask(T, lambda i, j: j <= i and ((i - j) < stride or (i - j) % stride == 0))
    assert torch.equal(strided_mask(T, stride), as_stated)


@pytest.mark.parametrize("T,stride,c", [(12, 4, 1), (12, 4, 2), (10, 3, 3), (7, 2, 1)])
def test_fixed_mask(T, stride, c):
    expected = brute_mask(
        T, lambda i, j: j <= i and (j // stride == i // stride or j % stride in range(stride - c, stride))
    )
    assert torch.equal(fixed_mask(T, stride, c), expected)


def test_fixed_mask_worked_example():
    # stride 4, c = 1: the summary cells are positions 3, 7, 11, ...
    assert fixed_mask(8, 4)[6].nonzero().flatten().tolist() == [3, 4, 5, 6]


@pytest.mark.parametrize("causal", [False, True])
def test_global_local_mask(causal):
    T, w, g = 11, 3, [0, 5]
    window = (lambda i, j: 0 <= i - j < w) if causal else (lambda i, j: abs(i - j) <= w // 2)
    expected = brute_mask(T, lambda i, j: (window(i, j) or i in g or j in g) and (j <= i or not causal))
    assert torch.equal(global_local_mask(T, w, g, causal=causal), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_bigbird_mask(causal):
    T, w, n_global, n_random = 20, 3, 2, 3
    m = bigbird_mask(T, w, n_global, n_random, seed=7, causal=causal)
    base = global_local_mask(T, w, range(n_global), causal=causal)
    assert m.dtype == torch.bool and m.shape == (T, T)
    assert torch.equal(m, bigbird_mask(T, w, n_global, n_random, seed=7, causal=causal))  # deterministic
    assert not torch.equal(m, bigbird_mask(T, w, n_global, n_random, seed=8, causal=causal))
    assert torch.equal(m & base, base)  # global + window are all there
    for i in range(n_global, T):  # and exactly n_random more keys (as many as are left, if fewer)
        left = int((~base[i])[: i + 1].sum()) if causal else int((~base[i]).sum())
        assert int(m[i].sum() - base[i].sum()) == min(n_random, left)
    if causal:
        assert not (m & ~causal_mask(T)).any()


@pytest.mark.parametrize(
    "T,n,perm", [(8, 2, [1, 0]), (12, 3, [2, 0, 1]), (10, 3, [1, 2, 0]), (7, 4, None), (3, 5, [4, 3, 2, 1, 0])]
)
def test_block_permutation_mask_matches_the_materials_definition(T, n, perm):
    p = list(range(n)) if perm is None else perm
    expected = brute_mask(T, lambda i, j: p[(i * n) // T] == (j * n) // T)
    assert torch.equal(block_permutation_mask(T, n, perm), expected)


@pytest.mark.parametrize(
    "T,n,perm", [(12, 3, [2, 0, 1]), (10, 3, [1, 2, 0]), (7, 4, [3, 2, 1, 0]), (3, 5, [4, 3, 2, 1, 0])]
)
def test_blockwise_attention_equals_masked_dense_attention(T, n, perm):
    q, k, v = (randn(2, 3, T, 8, seed=s, requires_grad=True) for s in range(3))
    out = blockwise_attention(q, k, v, n, perm)
    expected = sdpa(q, k, v, mask=block_permutation_mask(T, n, perm))
    torch.testing.assert_close(out, expected, **F64)
    g = randn(*out.shape, seed=9)
    torch.testing.assert_close(grads(out, (q, k, v), g), grads(expected, (q, k, v), g), **F64)
    if T < n:  # queries whose key block is empty see nothing: zeros, as dense masked attention gives
        empty = ~block_permutation_mask(T, n, perm).any(dim=-1)
        assert empty.any() and (out[..., empty, :] == 0).all()


def test_blockwise_attention_one_permutation_per_head():
    T, n = 10, 2
    perms = torch.tensor([[0, 1], [1, 0]])
    q, k, v = (randn(2, 2, T, 4, seed=s) for s in range(3))
    masks = torch.stack([block_permutation_mask(T, n, p) for p in perms])  # (H, T, T)
    torch.testing.assert_close(blockwise_attention(q, k, v, n, perms), sdpa(q, k, v, mask=masks), **F64)


def test_mask_errors_name_the_problem():
    with pytest.raises(ValueError, match="permutation of 0..2"):
        block_permutation_mask(6, 3, [0, 0, 1])
    with pytest.raises(ValueError, match="w must be an integer >= 1"):
        sliding_window_mask(5, 0)
    with pytest.raises(ValueError, match="c=5 summary positions"):
        fixed_mask(8, 4, c=5)
    with pytest.raises(ValueError, match=r"global_tokens must be positions in 0..4"):
        global_local_mask(5, 3, [7])
    with pytest.raises(ValueError, match=r"perm has shape \(3, 2\).*q has shape \(1, 2, 6, 4\)"):
        blockwise_attention(randn(1, 2, 6, 4), randn(1, 2, 6, 4), randn(1, 2, 6, 4), 2, [[0, 1], [1, 0], [0, 1]])


# --- Linformer ---------------------------------------------------------------------------------------------


def test_linformer_matches_its_formula_head_by_head():
    torch.manual_seed(0)
    d_model, n_heads, seq_len, rank = 12, 3, 10, 4
    lin = LinformerSelfAttention(d_model, n_heads, seq_len, rank).double()
    x = randn(2, seq_len, d_model)
    Q, K, V = lin.q_proj(x), lin.k_proj(x), lin.v_proj(x)
    d = d_model // n_heads
    heads = []
    for h in range(n_heads):
        cols = slice(h * d, (h + 1) * d)
        A = torch.softmax(Q[..., cols] @ (lin.E @ K[..., cols]).transpose(-2, -1) / d**0.5, dim=-1)  # (B, T, k)
        assert A.shape == (2, seq_len, rank)
        heads.append(A @ (lin.F @ V[..., cols]))  # O = A F V
    torch.testing.assert_close(lin(x), lin.o_proj(torch.cat(heads, dim=-1)), **F64)
    # a shorter input: the first T columns of E and F, the same as zero rows appended to K and V
    t = 6
    x_short = x[:, :t]
    Qs, Ks, Vs = lin.q_proj(x_short), lin.k_proj(x_short), lin.v_proj(x_short)
    Kpad = torch.cat([Ks, Ks.new_zeros(2, seq_len - t, d_model)], dim=1)
    Vpad = torch.cat([Vs, Vs.new_zeros(2, seq_len - t, d_model)], dim=1)
    heads = []
    for h in range(n_heads):
        cols = slice(h * d, (h + 1) * d)
        A = torch.softmax(Qs[..., cols] @ (lin.E @ Kpad[..., cols]).transpose(-2, -1) / d**0.5, dim=-1)
        heads.append(A @ (lin.F @ Vpad[..., cols]))
    torch.testing.assert_close(lin(x_short), lin.o_proj(torch.cat(heads, dim=-1)), **F64)


def test_linformer_with_identity_projections_is_multi_head_attention():
    torch.manual_seed(1)
    d_model, n_heads, T = 8, 2, 5
    lin = LinformerSelfAttention(d_model, n_heads, seq_len=T, k=T).double()
    mha = MultiHeadAttention(d_model, n_heads).double()
    with torch.no_grad():
        lin.E.copy_(torch.eye(T))
        lin.F.copy_(torch.eye(T))
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(lin, name).load_state_dict(getattr(mha, name).state_dict())
    x = randn(3, T, d_model)
    torch.testing.assert_close(lin(x), mha(x), **F64)


def test_linformer_errors_and_sharing():
    lin = LinformerSelfAttention(8, 2, seq_len=6, k=3, share_kv=True)
    assert lin.F is lin.E
    with pytest.raises(ValueError, match=r"x has shape \(1, 7, 8\).*T <= seq_len=6"):
        lin(torch.zeros(1, 7, 8))
    with pytest.raises(ValueError, match="not divisible"):
        LinformerSelfAttention(9, 2, 6, 3)


# --- FlashAttention (pure torch) ----------------------------------------------------------------------------

FLASH_SHAPES = [  # (t_q, t_k, block_q, block_k)
    (64, 64, 16, 16),  # a multiple of the blocks
    (50, 50, 16, 16),  # not a multiple
    (23, 50, 8, 16),  # fewer queries than keys
    (50, 23, 16, 8),  # more queries than keys
    (7, 7, 64, 64),  # one partial tile
]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("t_q,t_k,block_q,block_k", FLASH_SHAPES)
def test_flash_attention_forward_and_gradients_match_sdpa_float64(t_q, t_k, block_q, block_k, is_causal):
    q = randn(2, 3, t_q, 16, seed=1, requires_grad=True)
    k = randn(2, 3, t_k, 16, seed=2, requires_grad=True)
    v = randn(2, 3, t_k, 12, seed=3, requires_grad=True)  # d_v != d_k
    out = flash_attention(q, k, v, is_causal=is_causal, block_q=block_q, block_k=block_k)
    expected = sdpa(q, k, v, is_causal=is_causal)  # torch's is_causal is top-left, like ours
    torch.testing.assert_close(out, expected, **F64)
    g = randn(*out.shape, seed=4)
    torch.testing.assert_close(grads(out, (q, k, v), g), grads(expected, (q, k, v), g), **F64)


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_float32_matches_sdpa(is_causal):
    q, k, v = (randn(2, 4, 70, 32, seed=s, dtype=torch.float32, requires_grad=True) for s in range(3))
    out = flash_attention(q, k, v, is_causal=is_causal)
    expected = sdpa(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, expected, **F32)
    g = randn(*out.shape, seed=5, dtype=torch.float32)
    torch.testing.assert_close(grads(out, (q, k, v), g), grads(expected, (q, k, v), g), **F32)


def test_flash_attention_backward_is_the_custom_function_not_autograd_through_the_loop():
    q, k, v = (randn(1, 1, 40, 8, seed=s, requires_grad=True) for s in range(3))
    out = flash_attention(q, k, v, block_q=8, block_k=8)
    assert type(out.grad_fn).__name__ == "_FlashAttentionFunctionBackward"
    assert all(fn is None or type(fn).__name__ == "AccumulateGrad" for fn, _ in out.grad_fn.next_functions)
    # and the gradients pass torch's finite-difference check
    small = [randn(1, 2, 5, 3, seed=s, requires_grad=True) for s in range(3)]
    assert torch.autograd.gradcheck(lambda a, b, c: flash_attention(a, b, c, True, None, 2, 2), small)


def test_flash_attention_bottom_right_causal_offset_and_masks():
    t_q, t_k = 6, 20
    q, k, v = randn(2, 2, t_q, 8, seed=1), randn(2, 2, t_k, 8, seed=2), randn(2, 2, t_k, 8, seed=3)
    for offset in (t_k - t_q, 3, -2):  # -2: the first two queries see nothing and get zeros
        expected = scaled_dot_product_attention(q, k, v, mask=causal_mask(t_q, t_k, offset=offset))
        out = flash_attention(q, k, v, is_causal=True, causal_offset=offset, block_q=4, block_k=4)
        torch.testing.assert_close(out, expected, **F64)
    mask = randn(2, 1, t_q, t_k, seed=4) > 0.3  # broadcast over heads
    mask[0, 0, 1] = False  # a query that sees nothing
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, mask=mask, block_q=4, block_k=8)
    expected = sdpa(q, k, v, mask=mask)
    torch.testing.assert_close(out, expected, **F64)
    assert (out[0, :, 1] == 0).all()
    g = randn(*out.shape, seed=5)
    torch.testing.assert_close(grads(out, (q, k, v), g), grads(expected, (q, k, v), g), **F64)


def test_flash_attention_is_causal_by_perturbation():
    q, k, v = randn(1, 2, 30, 8, seed=1), randn(1, 2, 30, 8, seed=2), randn(1, 2, 30, 8, seed=3)
    out = flash_attention(q, k, v, is_causal=True, block_q=8, block_k=8)
    k2, v2 = k.clone(), v.clone()
    k2[..., 17:, :] += 5.0
    v2[..., 17:, :] -= 3.0
    out2 = flash_attention(q, k2, v2, is_causal=True, block_q=8, block_k=8)
    assert torch.equal(out[..., :17, :], out2[..., :17, :])
    assert not torch.allclose(out[..., 17:, :], out2[..., 17:, :])


def test_flash_attention_is_stable_for_huge_logits():
    q, k, v = randn(1, 1, 20, 4, seed=1) * 1e3, randn(1, 1, 20, 4, seed=2) * 1e3, randn(1, 1, 20, 4, seed=3)
    out = flash_attention(q, k, v, block_q=4, block_k=4)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, sdpa(q, k, v), **F64)


def test_flash_attention_half_precision_accumulates_in_float32():
    q, k, v = (randn(1, 2, 50, 16, seed=s, dtype=torch.float32) for s in range(3))
    out = flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert out.dtype == torch.bfloat16
    # bf16 has 8 significant bits: inputs and output are rounded to ~0.4%
    rounded = (t.bfloat16().float() for t in (q, k, v))
    torch.testing.assert_close(out.float(), sdpa(*rounded, is_causal=True), atol=2e-2, rtol=2e-2)


def test_flash_attention_errors_name_the_shapes():
    q = randn(2, 3, 5, 8)
    with pytest.raises(ValueError, match=r"q has shape \(2, 3, 5, 8\) but k has shape \(2, 3, 5, 4\)"):
        flash_attention(q, randn(2, 3, 5, 4), randn(2, 3, 5, 4))
    with pytest.raises(ValueError, match=r"k has shape \(2, 3, 5, 8\) but v has shape \(2, 3, 6, 8\)"):
        flash_attention(q, q, randn(2, 3, 6, 8))
    with pytest.raises(ValueError, match=r"same leading"):
        flash_attention(q, randn(2, 1, 5, 8), randn(2, 1, 5, 8))
    with pytest.raises(ValueError, match=r"mask has shape \(4, 5\).*\(2, 3, 5, 5\)"):
        flash_attention(q, q, q, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        flash_attention(q, q, q, mask=torch.zeros(5, 5))


# --- Triton ----------------------------------------------------------------------------------------------


def run_python(code: str, env_extra: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_triton_is_optional_and_its_errors_say_what_to_do():
    result = run_python("""
        import importlib.util
        import sys
        import torch
        has_triton = importlib.util.find_spec("triton") is not None
        sys.modules["triton"] = None  # as if triton were not installed
        import llmarch.efficient as eff
        q = torch.zeros(1, 1, 4, 16)
        try:
            eff.triton_flash_attention(q, q, q)
        except ImportError as err:
            print("ImportError:", err)
        if has_triton:  # installed, but no GPU and no interpreter
            del sys.modules["triton"]
            try:
                eff.triton_flash_attention(q, q, q)
            except RuntimeError as err:
                print("RuntimeError:", err)
    """)
    assert result.returncode == 0, result.stderr
    assert "ImportError: triton_flash_attention needs the triton package: pip install triton==3.7.1" in result.stdout
    if HAS_TRITON:
        assert "RuntimeError: q is on cpu" in result.stdout and "TRITON_INTERPRET=1" in result.stdout


@pytest.mark.skipif(not HAS_TRITON, reason=TRITON_MISSING)
def test_interpreter_switched_on_after_triton_was_imported_is_reported():
    # importing torch's FLOP counter imports triton; TRITON_INTERPRET=1 set afterwards cannot take effect
    result = run_python("""
        import os
        import torch
        import torch.utils.flop_counter
        os.environ["TRITON_INTERPRET"] = "1"
        from llmarch.efficient import triton_flash_attention
        q = torch.zeros(1, 1, 16, 16)
        try:
            triton_flash_attention(q, q, q)
        except RuntimeError as err:
            print("RuntimeError:", err)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RuntimeError: TRITON_INTERPRET=1 was set after triton had been imported" in result.stdout
    assert "before anything imports triton" in result.stdout


@pytest.mark.skipif(not HAS_TRITON, reason=TRITON_MISSING)
def test_triton_kernels_in_the_interpreter_match_sdpa():
    # TRITON_INTERPRET must be set before triton defines the kernels: a fresh interpreter with it in the env.
    result = run_python("""
        import json
        import torch
        import torch.nn.functional as F
        from llmarch.attention import causal_mask
        from llmarch.efficient import attention, triton_flash_attention

        def randn(*shape, seed):
            return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()

        errors = {}
        for is_causal, t_q, t_k, offset in [(False, 40, 40, 0), (True, 40, 40, 0), (False, 23, 50, 0),
                                            (True, 23, 50, 0), (True, 23, 50, 27), (True, 50, 23, 0)]:
            q, k, v = randn(1, 2, t_q, 16, seed=1), randn(1, 2, t_k, 16, seed=2), randn(1, 2, t_k, 16, seed=3)
            out = triton_flash_attention(q, k, v, is_causal=is_causal, causal_offset=offset, block_q=16, block_k=16)
            mask = causal_mask(t_q, t_k, offset=offset) if is_causal else None
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
            grads = torch.autograd.grad(out, (q, k, v), g)
            ref_grads = torch.autograd.grad(ref, (q, k, v), g)
            errors[f"{is_causal} {t_q} {t_k} {offset}"] = [
                (out - ref).abs().max().item(), *[(a - b).abs().max().item() for a, b in zip(grads, ref_grads)]]
        q, k, v = (torch.randn(1, 2, 33, 16, generator=torch.Generator().manual_seed(s)) for s in range(3))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        errors["dispatcher"] = [(attention(q, k, v, is_causal=True, backend="triton") - ref).abs().max().item()]
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        ref_bf16 = F.scaled_dot_product_attention(qb.float(), kb.float(), vb.float(), is_causal=True)
        out_bf16 = triton_flash_attention(qb, kb, vb, is_causal=True)
        errors["bfloat16"] = [(out_bf16.float() - ref_bf16).abs().max().item(), str(out_bf16.dtype)]
        print(json.dumps(errors))
    """, env_extra={"TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for case, errs in errors.items():
        if case == "bfloat16":
            assert errs[1] == "torch.bfloat16" and errs[0] < 2e-2, errs  # bf16 output rounding
        else:
            assert max(errs) < 1e-5, (case, errs)  # float32 everywhere


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not HAS_TRITON, reason=TRITON_MISSING)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_triton_on_gpu_matches_sdpa(dtype):
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set: this test is for the compiled kernels")
    q, k, v = (randn(2, 4, 300, 64, seed=s, dtype=torch.float32).to("cuda", dtype).requires_grad_() for s in range(3))
    # the reference: float32 leaves holding the same (rounded) values, so its gradients are float32 too
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    for is_causal in (False, True):
        out = triton_flash_attention(q, k, v, is_causal=is_causal)
        ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=is_causal)
        tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(out.float(), ref, **tol)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)
        ref_grads = torch.autograd.grad(ref, (q32, k32, v32), g.float())
        for a, b in zip(grads, ref_grads):
            assert a.dtype == dtype
            torch.testing.assert_close(a.float(), b, **(tol if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_flex_and_auto_dispatch_on_gpu():
    q, k, v = (randn(1, 2, 256, 64, seed=s).to("cuda", torch.float16) for s in range(3))
    mask = sliding_window_mask(256, 32, device="cuda")
    assert select_backend(q) == "sdpa" and select_backend(q, mask) == "flex"
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(attention(q, k, v, mask=mask).float(), ref, atol=2e-2, rtol=2e-2)


# --- FlexAttention (eager on CPU) -------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_flex_sliding_window_matches_masked_dense_attention(causal):
    q, k, v = (randn(2, 2, 40, 16, seed=s) for s in range(3))
    expected = scaled_dot_product_attention(q, k, v, mask=sliding_window_mask(40, 7, causal=causal))
    torch.testing.assert_close(flex_sliding_window(q, k, v, 7, causal=causal), expected, **F64)


@pytest.mark.parametrize("t_q,t_k", [(30, 30), (10, 30)])
def test_flex_alibi_matches_alibi_bias(t_q, t_k):
    q, k, v = randn(1, 4, t_q, 8, seed=1), randn(1, 4, t_k, 8, seed=2), randn(1, 4, t_k, 8, seed=3)
    bias = alibi_bias(4, t_q, t_k).double()  # queries are the last t_q positions
    expected = scaled_dot_product_attention(q, k, v, bias=bias, mask=causal_mask(t_q, t_k, offset=t_k - t_q))
    torch.testing.assert_close(flex_alibi(q, k, v, alibi_slopes(4)), expected, **F64)


def test_flex_t5_matches_t5_relative_bias():
    rel = T5RelativeBias(n_heads=2, num_buckets=16, max_distance=20).double()
    torch.nn.init.normal_(rel.embedding.weight, generator=torch.Generator().manual_seed(0))
    q, k, v = (randn(2, 2, 40, 8, seed=s) for s in range(3))
    with torch.no_grad():
        expected = scaled_dot_product_attention(q, k, v, bias=rel(40, 40), is_causal=True)
        out = flex_t5(q, k, v, rel.embedding.weight, num_buckets=16, max_distance=20)
    torch.testing.assert_close(out, expected, **F64)


def test_flex_with_any_dense_mask_and_no_cpu_backward():
    mask = bigbird_mask(40, 5, n_global=2, n_random=3, seed=0)
    q, k, v = (randn(1, 2, 40, 8, seed=s) for s in range(3))
    torch.testing.assert_close(flex_attention_with(q, k, v, mask_mod=dense_mask_mod(mask)),
                               scaled_dot_product_attention(q, k, v, mask=mask), **F64)
    with pytest.raises(RuntimeError, match="no backward on CPU"):
        flex_attention_with(q.requires_grad_(), k, v)


# --- the dispatcher --------------------------------------------------------------------------------------

CPU_BACKENDS = [b for b in BACKENDS if b != "triton"]  # triton runs on CPU only in the interpreter (tested above)


@pytest.mark.parametrize("case", ["plain", "causal", "mask", "mask+causal", "gqa", "t_q<t_k"])
def test_every_backend_gives_the_same_result(case):
    t_q = 12 if case == "t_q<t_k" else 33
    h_kv = 2 if case == "gqa" else 4
    q, k, v = randn(2, 4, t_q, 16, seed=1), randn(2, h_kv, 33, 16, seed=2), randn(2, h_kv, 33, 16, seed=3)
    mask = sliding_window_mask(33, 9, causal=False)[:t_q] if "mask" in case else None
    is_causal = "causal" in case or case == "t_q<t_k"
    expected = scaled_dot_product_attention(q, repeat_kv(k, 4 // h_kv), repeat_kv(v, 4 // h_kv), mask=mask,
                                            is_causal=is_causal)
    for backend in CPU_BACKENDS + ["auto"]:
        out = attention(q, k, v, mask=mask, is_causal=is_causal, backend=backend)
        torch.testing.assert_close(out, expected, **F64, msg=lambda m: f"backend {backend}: {m}")


def test_differentiable_backends_give_the_same_gradients():
    q, k, v = (randn(1, 2, 20, 8, seed=s, requires_grad=True) for s in range(3))
    g = randn(1, 2, 20, 8, seed=9)
    grads = {b: torch.autograd.grad(attention(q, k, v, is_causal=True, backend=b), (q, k, v), g)
             for b in ("reference", "sdpa", "flash")}
    torch.testing.assert_close(grads["flash"], grads["reference"], **F64)
    torch.testing.assert_close(grads["sdpa"], grads["reference"], **F64)


def test_auto_rule_and_dispatcher_errors():
    q = randn(1, 2, 5, 8)
    assert select_backend(q) == "sdpa" and select_backend(q, torch.ones(5, 5, dtype=torch.bool)) == "sdpa"
    with pytest.raises(ValueError, match="backend must be 'auto' or one of"):
        attention(q, q, q, backend="cudnn")
    with pytest.raises(ValueError, match="mask must be boolean"):
        attention(q, q, q, mask=torch.zeros(5, 5))
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        attention(q, randn(1, 3, 5, 8), randn(1, 3, 5, 8))
    with pytest.raises(ValueError, match="'triton' cannot take a mask"):
        attention(q, q, q, mask=torch.ones(5, 5, dtype=torch.bool), backend="triton")


# --- the KV cache: sizes and sharing -------------------------------------------------------------------------


def test_kv_cache_bytes_for_real_models():
    gib = 2**30
    assert kv_cache_bytes(32, 32, 128, 4096) == 2 * gib  # Llama-2-7B, fp16, 4096 tokens
    assert kv_cache_bytes(32, 32, 128, 1) == 512 * 2**10  # the material's "per token": 0.5 MiB
    assert kv_cache_bytes(80, 8, 128, 4096) == 1.25 * gib  # Llama-2-70B: GQA with 8 key/value heads
    assert kv_cache_bytes(32, 8, 128, 8192, batch=4) == 4 * gib  # Llama-3-8B, 8192 tokens, batch 4
    assert kv_cache_bytes(32, 1, 128, 4096) * 32 == kv_cache_bytes(32, 32, 128, 4096)  # MQA: 32x smaller
    with pytest.raises(ValueError, match="n_kv_heads must be an integer >= 1"):
        kv_cache_bytes(32, 0, 128, 4096)


def test_attention_memory_bytes_counts_the_tensors_of_naive_attention():
    # GPT-2 small, one sample, float32: Q, K, V (12 heads of 1024 x 64) + scores + weights (12 x 1024 x 1024)
    assert attention_memory_bytes(1, 1024, 768, 12, bytes_per_elem=4) == 4 * (3 * 1024 * 768 + 2 * 12 * 1024**2)
    B, T, d_model, H = 2, 24, 16, 4
    q, k, v = (torch.zeros(B, H, T, d_model // H, dtype=torch.float16) for _ in range(3))
    z = q @ k.transpose(-2, -1)
    a = torch.softmax(z.float(), dim=-1).half()
    counted = sum(t.numel() * t.element_size() for t in (q, k, v, z, a))
    assert attention_memory_bytes(B, T, d_model, H) == counted


def test_repeat_kv_shares_each_kv_head_with_consecutive_query_heads():
    x = randn(2, 3, 5, 4)
    y = repeat_kv(x, 2)
    assert y.shape == (2, 6, 5, 4)
    for h in range(6):
        assert torch.equal(y[:, h], x[:, h // 2])  # the grouping of MultiHeadAttention(n_kv_heads=3)


# --- paged attention ---------------------------------------------------------------------------------------


def test_paged_attention_equals_contiguous_attention_with_interleaved_appends():
    h_kv, h, d, bs = 2, 4, 8, 4
    cache = PagedKVCache(n_blocks=16, block_size=bs, n_kv_heads=h_kv, d_head=d, dtype=torch.float64)
    contiguous = {s: (torch.zeros(h_kv, 0, d, dtype=torch.float64),) * 2 for s in (10, 11, 12)}
    gen = torch.Generator().manual_seed(0)
    schedule = [(10, 5), (11, 1), (12, 9), (10, 3), (11, 6), (10, 1), (12, 1), (11, 1)]  # (sequence, new tokens)
    for step, (s, t_new) in enumerate(schedule):
        k_new = torch.randn(h_kv, t_new, d, generator=gen, dtype=torch.float64)
        v_new = torch.randn(h_kv, t_new, d, generator=gen, dtype=torch.float64)
        cache.append(s, k_new, v_new)
        k_all, v_all = (torch.cat([old, new], dim=1) for old, new in zip(contiguous[s], (k_new, v_new)))
        contiguous[s] = (k_all, v_all)
        torch.testing.assert_close(cache.gather(s), (k_all, v_all), atol=0, rtol=0)
        # a decoding step (T_q = 1) for every sequence started so far, at once
        present = [sid for sid in (12, 10, 11) if cache.length(sid)]
        q = torch.randn(len(present), h, 1, d, generator=gen, dtype=torch.float64)
        out = paged_attention(q, cache, present)
        for r, sid in enumerate(present):
            ks, vs = contiguous[sid]
            expected = sdpa(q[r : r + 1], repeat_kv(ks[None], h // h_kv), repeat_kv(vs[None], h // h_kv))
            torch.testing.assert_close(out[r : r + 1], expected, **F64)
    assert [cache.length(s) for s in (10, 11, 12)] == [9, 8, 10]
    # blocks were handed out as needed, so the sequences' blocks interleave in the pool
    assert sorted(cache.block_tables[10]) != list(range(min(cache.block_tables[10]), max(cache.block_tables[10]) + 1))
    assert cache.wasted_slots() == (12 - 9) + (8 - 8) + (12 - 10)
    # a chunk of 3 new queries per sequence: causal, the queries being the last 3 positions
    q = torch.randn(2, h, 3, d, generator=gen, dtype=torch.float64)
    out = paged_attention(q, cache, [12, 10])
    for r, sid in enumerate((12, 10)):
        ks, vs = (repeat_kv(t[None], h // h_kv) for t in contiguous[sid])
        n = ks.shape[-2]
        expected = scaled_dot_product_attention(q[r : r + 1], ks, vs, mask=causal_mask(3, n, offset=n - 3))
        torch.testing.assert_close(out[r : r + 1], expected, **F64)


def test_paged_cache_frees_and_reuses_blocks():
    cache = PagedKVCache(n_blocks=4, block_size=2, n_kv_heads=1, d_head=3)
    a, b = torch.randn(1, 3, 3), torch.randn(1, 2, 3)
    cache.append(0, a, a)
    cache.append(1, b, b)
    assert cache.n_free_blocks == 1
    with pytest.raises(RuntimeError, match="needs 2 more blocks of 2 tokens but only 1 are free"):
        cache.append(1, torch.randn(1, 3, 3), torch.randn(1, 3, 3))
    assert cache.length(1) == 2 and cache.n_free_blocks == 1  # nothing changed
    freed = list(cache.block_tables[0])
    cache.free(0)
    assert cache.n_free_blocks == 3
    c = torch.randn(1, 5, 3)
    cache.append(2, c, c)
    assert set(freed) <= set(cache.block_tables[2])
    torch.testing.assert_close(cache.gather(2)[0], c, atol=0, rtol=0)
    torch.testing.assert_close(cache.gather(1)[0], b, atol=0, rtol=0)  # untouched by the reuse
    with pytest.raises(KeyError, match="sequence 0 is not in the cache"):
        cache.gather(0)
    with pytest.raises(ValueError, match=r"k has shape \(2, 1, 3\) but the cache holds"):
        cache.append(1, torch.randn(2, 1, 3), torch.randn(2, 1, 3))
    with pytest.raises(ValueError, match=r"q has shape \(1, 2, 1, 4\)"):
        paged_attention(torch.randn(1, 2, 1, 4), cache, [1])
