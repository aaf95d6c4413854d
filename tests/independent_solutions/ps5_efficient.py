"""An independent solution of ps5-efficient: written from the release notebook's text alone."""
ANSWERS = {
    "sliding_window_mask": '''def sliding_window_mask(T, w, causal=True):
    """Boolean (T, T): causal M[i, j] = 0 <= i - j < w; bidirectional M[i, j] = |i - j| <= w // 2."""
    mask = np.zeros((T, T), dtype=bool)
    for i in range(T):
        if causal:
            mask[i, max(0, i - w + 1): i + 1] = True
        else:
            mask[i, max(0, i - w // 2): i + w // 2 + 1] = True
    return mask
''',
    "merge_softmax_stats": '''def merge_softmax_stats(m1, l1, m2, l2):
    """Statistics (max, sum of exp(x - max)) of two blocks -> those of their union; entry by entry."""
    m1, l1, m2, l2 = (np.asarray(a, dtype=float) for a in (m1, l1, m2, l2))
    m = np.maximum(m1, m2)
    empty = np.isneginf(m)
    reference = np.where(empty, 0.0, m)  # any finite value: both factors are 0 where the union is empty
    factor1 = np.where(np.isneginf(m1), 0.0, np.exp(np.where(np.isneginf(m1), reference, m1) - reference))
    factor2 = np.where(np.isneginf(m2), 0.0, np.exp(np.where(np.isneginf(m2), reference, m2) - reference))
    return m, factor1 * l1 + factor2 * l2
''',
    "online_softmax": '''def online_softmax(x, block_size):
    """Softmax along the last axis of x (..., n), statistics merged block by block.
    Returns (p (..., n), m_run (..., n_blocks), l_run (..., n_blocks))."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    m_history, l_history = [], []
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size]
        m_block = block.max(axis=-1)
        finite_max = np.where(np.isneginf(m_block), 0.0, m_block)
        l_block = np.exp(block - finite_max[..., None]).sum(axis=-1)  # exp(-inf) = 0 in an empty block
        m, l = merge_softmax_stats(m, l, m_block, l_block)
        m_history.append(m)
        l_history.append(l)
    p = np.exp(x - m[..., None]) / l[..., None]
    return p, np.stack(m_history, axis=-1), np.stack(l_history, axis=-1)
''',
    "tiled_attention": '''def tiled_attention(q, k, v, block_size, is_causal=False):
    """Exact attention, keys visited in blocks with an online softmax.
    q (..., t_q, d), k (..., t_k, d), v (..., t_k, d_v) -> (out (..., t_q, d_v), lse (..., t_q))."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    t_q, d = q.shape[-2], q.shape[-1]
    t_k = k.shape[-2]
    m = np.full(q.shape[:-1], -np.inf)
    l = np.zeros(q.shape[:-1])
    acc = np.zeros(q.shape[:-1] + (v.shape[-1],))
    query_index = np.arange(t_q)[:, None]
    for start in range(0, t_k, block_size):
        stop = min(start + block_size, t_k)
        s = np.einsum("...id,...jd->...ij", q, k[..., start:stop, :]) / np.sqrt(d)
        if is_causal:
            s = np.where(np.arange(start, stop)[None, :] <= query_index, s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1))
        finite_new = np.where(np.isneginf(m_new), 0.0, m_new)
        rescale = np.where(np.isneginf(m), 0.0, np.exp(np.where(np.isneginf(m), finite_new, m) - finite_new))
        weights = np.exp(s - finite_new[..., None])
        l = rescale * l + weights.sum(axis=-1)
        acc = rescale[..., None] * acc + np.einsum("...ij,...jv->...iv", weights, v[..., start:stop, :])
        m = m_new
    return acc / l[..., None], m + np.log(l)
''',
    "grouped_query_attention": '''def grouped_query_attention(q, k, v, is_causal=False):
    """q (B, H, t_q, d), k (B, H_kv, t_k, d), v (B, H_kv, t_k, d_v) -> (B, H, t_q, d_v);
    query head h uses key/value head h // (H // H_kv)."""
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    B, H, t_q, d = q.shape
    H_kv, t_k = k.shape[1], k.shape[2]
    g = H // H_kv
    grouped = q.reshape(B, H_kv, g, t_q, d)
    scores = np.einsum("bcgid,bcjd->bcgij", grouped, k) / np.sqrt(d)
    if is_causal:
        visible = np.arange(t_k)[None, :] <= np.arange(t_q)[:, None] + (t_k - t_q)
        scores = np.where(visible, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bcgij,bcjv->bcgiv", weights, v)
    return out.reshape(B, H, t_q, v.shape[-1])
''',
    "decode_step": '''def decode_step(q, k_new, v_new, k_cache, v_cache):
    """Append the new keys/values to the grouped cache, attend causally from the new queries.
    Returns (out (B, H, t_new, d_v), k_cache (B, H_kv, t_past + t_new, d), v_cache (B, H_kv, t_past + t_new, d_v))."""
    k_all = np.concatenate([k_cache, k_new], axis=2)
    v_all = np.concatenate([v_cache, v_new], axis=2)
    H, t_new = q.shape[1], q.shape[2]
    t_past = k_all.shape[2] - t_new
    g = H // k_all.shape[1]
    mask = np.arange(k_all.shape[2])[None, :] <= t_past + np.arange(t_new)[:, None]
    heads = [dense_attention(q[:, h], k_all[:, h // g], v_all[:, h // g], mask=mask) for h in range(H)]
    return np.stack(heads, axis=1), k_all, v_all
''',
}
