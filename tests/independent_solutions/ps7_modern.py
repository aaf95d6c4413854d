"""An independent solution of ps7-modern: written from the release notebook's text alone."""
ANSWERS = {
    "rms_norm": '''def rms_norm(x, weight, eps=1e-6):
    """x (..., d), weight (d,) -> weight * x / sqrt(mean(x**2 over the last axis) + eps), shape (..., d)."""
    x = np.asarray(x, dtype=np.float64)
    mean_square = np.einsum("...i,...i->...", x, x) / x.shape[-1]
    return np.asarray(weight, dtype=np.float64) * x / np.sqrt(mean_square + eps)[..., None]
''',
    "swiglu": '''def swiglu(x, w_gate, w_up, w_down):
    """x (..., d), w_gate (d_ff, d), w_up (d_ff, d), w_down (d, d_ff) -> (..., d):
    w_down (silu(w_gate x) * w_up x), with silu(z) = z * sigmoid(z)."""
    x = np.asarray(x, dtype=np.float64)
    gate = np.tensordot(x, np.asarray(w_gate, dtype=np.float64), axes=([-1], [1]))
    up = np.tensordot(x, np.asarray(w_up, dtype=np.float64), axes=([-1], [1]))
    hidden = gate / (1.0 + np.exp(-gate)) * up
    return np.tensordot(hidden, np.asarray(w_down, dtype=np.float64), axes=([-1], [1]))
''',
    "rope_rotate_half": '''def rope_rotate_half(x, positions, base=10000.0):
    """x (..., T, d), positions (T,) -> (..., T, d): rotate the feature pairs (i, i + d/2) of token t by the angle
    positions[t] * theta_i, theta_i = base**(-2i/d)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    half = d // 2
    out = np.empty_like(x)
    m = np.asarray(positions, dtype=np.float64)
    for i in range(half):
        angle = m * base ** (-2.0 * i / d)           # (T,)
        c, s = np.cos(angle), np.sin(angle)
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * c - b * s
        out[..., i + half] = a * s + b * c
    return out
''',
    "grouped_query_attention": '''def grouped_query_attention(q, k, v, is_causal=False):
    """q (B, H, T, d), k (B, H_kv, T_k, d), v (B, H_kv, T_k, d_v) -> (B, H, T, d_v); query head h uses key/value
    head h // (H // H_kv); causal: query i sits at position T_k - T + i."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, H, T, d = q.shape
    H_kv, T_k = k.shape[1], k.shape[2]
    group = H // H_kv
    mask = None
    if is_causal:
        mask = np.arange(T_k)[None, :] <= (T_k - T + np.arange(T))[:, None]
    heads = []
    for h in range(H):
        c = h // group
        heads.append(dense_attention(q[:, h], k[:, c], v[:, c], mask=mask))
    return np.stack(heads, axis=1)
''',
    "llama3_inv_freq": '''def llama3_inv_freq(d, base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192):
    """The (d/2,) RoPE frequencies of Llama 3's rule: theta_i = base**(-2i/d) is kept where the wavelength
    2 pi / theta_i < L0 / high_freq_factor, divided by factor where it is > L0 / low_freq_factor, blended between."""
    L0 = original_max_position_embeddings
    result = []
    for i in range(d // 2):
        theta = base ** (-2.0 * i / d)
        wavelength = 2 * np.pi / theta
        if wavelength < L0 / high_freq_factor:
            result.append(theta)
        elif wavelength > L0 / low_freq_factor:
            result.append(theta / factor)
        else:
            gamma = (L0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            result.append((1 - gamma) * theta / factor + gamma * theta)
    return np.array(result, dtype=np.float64)
''',
    "rolling_cache_step": '''def rolling_cache_step(keys, values, positions, q, k_new, v_new, window, sinks=4):
    """One step of a rolling cache with attention sinks: attend each new query over the sinks and its last
    window - sinks tokens, then keep what the newest query could see."""
    keys, values, q, k_new, v_new = (np.asarray(a, dtype=np.float64) for a in (keys, values, q, k_new, v_new))
    old = [int(p) for p in positions]
    first = old[-1] + 1 if old else 0
    new = list(range(first, first + q.shape[1]))
    every = old + new
    k_all = np.concatenate([keys, k_new], axis=1)
    v_all = np.concatenate([values, v_new], axis=1)

    def visible(i):
        return [c for c, j in enumerate(every) if j <= i and (j < sinks or i - j < window - sinks)]

    out = np.zeros((q.shape[0], q.shape[1], v_all.shape[2]))
    for r, i in enumerate(new):
        cols = visible(i)
        scores = np.einsum("hd,hkd->hk", q[:, r], k_all[:, cols]) / np.sqrt(q.shape[2])
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        out[:, r] = np.einsum("hk,hkd->hd", w, v_all[:, cols])
    kept = visible(new[-1])
    return out, k_all[:, kept], v_all[:, kept], np.array([every[c] for c in kept], dtype=np.int64)
''',
}
