"""An independent solution of ps1-attention: written from the release notebook's text alone."""
ANSWERS = {
    "softmax": '''def softmax(x, axis=-1):
    """Numerically stable softmax of the array x along axis; returns an array of the same shape."""
    x = np.asarray(x, dtype=float)
    moved = np.moveaxis(x, axis, -1)
    shifted = moved - np.max(moved, axis=-1)[..., None]
    exps = np.exp(shifted)
    return np.moveaxis(exps / np.sum(exps, axis=-1)[..., None], -1, axis)
''',
    "causal_mask": '''def causal_mask(T):
    """Boolean (T, T) array: mask[i, j] is True when query i may attend to key j, i.e. j <= i."""
    rows = np.arange(T)[:, None]
    cols = np.arange(T)[None, :]
    return cols <= rows
''',
    "scaled_dot_product_attention": '''def scaled_dot_product_attention(q, k, v, mask=None):
    """q (..., T_q, d), k (..., T_k, d), v (..., T_k, d_v), mask broadcastable to (..., T_q, T_k) or None.
    Returns (output (..., T_q, d_v), weights (..., T_q, T_k))."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    d = q.shape[-1]
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(d)
    if mask is not None:
        scores = np.where(np.asarray(mask, dtype=bool), scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return np.einsum("...qk,...kv->...qv", weights, v), weights
''',
    "multi_head_attention": '''def multi_head_attention(x, W_q, W_k, W_v, W_o, n_heads, mask=None):
    """x (..., T, d_model); W_* (d_model, d_model); returns (..., T, d_model)."""
    x = np.asarray(x, dtype=float)
    d_model = x.shape[-1]
    d_h = d_model // n_heads
    q, k, v = x @ W_q, x @ W_k, x @ W_v
    heads = []
    for h in range(n_heads):
        cols = slice(h * d_h, (h + 1) * d_h)
        out, _ = scaled_dot_product_attention(q[..., cols], k[..., cols], v[..., cols], mask=mask)
        heads.append(out)
    return np.concatenate(heads, axis=-1) @ W_o
''',
    "equivariance_error": '''def equivariance_error(f, x, perm):
    """max |f(x[perm]) - f(x)[perm]| as a float."""
    x = np.asarray(x)
    perm = np.asarray(perm)
    first = np.asarray(f(x[perm]), dtype=float)
    second = np.asarray(f(x), dtype=float)[perm]
    return float(np.max(np.abs(first - second)))
''',
}
