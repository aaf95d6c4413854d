"""An independent solution of ps2-positions: written from the release notebook's text alone."""
ANSWERS = {
    "sinusoidal_encoding": '''def sinusoidal_encoding(n_positions, d, base=10000.0):
    """(n_positions, d) table: PE[t, 2i] = sin(t / base**(2i/d)), PE[t, 2i+1] = cos(t / base**(2i/d))."""
    table = np.zeros((n_positions, d))
    t = np.arange(n_positions, dtype=float)
    for i in range(d // 2):
        angle = t / base ** (2 * i / d)
        table[:, 2 * i] = np.sin(angle)
        table[:, 2 * i + 1] = np.cos(angle)
    return table
''',
    "alibi_slopes": '''def alibi_slopes(n_heads):
    """The ALiBi slope of each head, as an array of shape (n_heads,)."""
    def geometric(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 1
    while p * 2 <= n_heads:
        p *= 2
    if p == n_heads:
        return np.array(geometric(n_heads))
    extra = geometric(2 * p)[0::2][: n_heads - p]
    return np.array(geometric(p) + extra)
''',
    "t5_bucket": '''def t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """Bucket of each relative position (key - query), elementwise."""
    r = np.asarray(relative_position).astype(np.int64)
    if bidirectional:
        n = num_buckets // 2
        start = np.where(r > 0, n, 0)
        distance = np.abs(r)
    else:
        n = num_buckets
        start = np.zeros_like(r)
        distance = np.maximum(-r, 0)
    exact = n // 2
    safe = np.maximum(distance, 1).astype(float)  # the log is only used where distance >= exact >= 1
    log_bucket = exact + np.floor(np.log(safe / exact) / np.log(max_distance / exact) * (n - exact))
    log_bucket = np.minimum(n - 1, log_bucket).astype(np.int64)
    return (start + np.where(distance < exact, distance, log_bucket)).astype(np.int64)
''',
    "apply_rope": '''def apply_rope(x, positions, base=10000.0):
    """Rotate adjacent feature pairs of x (..., T, d) by positions[t] * base**(-2i/d)."""
    x = np.asarray(x, dtype=float)
    d = x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    angles = np.asarray(positions, dtype=float)[:, None] * theta[None, :]
    pairs = x[..., 0::2] + 1j * x[..., 1::2]
    rotated = pairs * np.exp(1j * angles)
    out = np.empty_like(x)
    out[..., 0::2] = rotated.real
    out[..., 1::2] = rotated.imag
    return out
''',
}
