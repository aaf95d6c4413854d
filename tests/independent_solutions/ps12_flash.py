"""An independent solution of ps12-flash: written from the release notebook's text alone."""
ANSWERS = {
    "flash_fwd_kernel": '''@triton.jit
def flash_fwd_kernel(Q, K, V, O, LSE, scale, T, D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """One tile of BLOCK_M queries of one head: O = softmax(Q K^T * scale) V and LSE = log rowsum exp(Q K^T * scale),
    with the online softmax over tiles of BLOCK_N keys."""
    tile, head = tl.program_id(0), tl.program_id(1)
    offset = head * T * D
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    features = tl.arange(0, D)
    row_in = rows < T
    q = tl.load(Q + offset + rows[:, None] * D + features[None, :], mask=row_in[:, None], other=0.0)
    running_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    stop = T
    if IS_CAUSAL:
        stop = tl.minimum(T, (tile + 1) * BLOCK_M)
    for first_key in range(0, stop, BLOCK_N):
        keys = first_key + tl.arange(0, BLOCK_N)
        key_in = keys < T
        k = tl.load(K + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
        v = tl.load(V + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = key_in[None, :]
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        p = tl.exp(scores - new_max[:, None])
        alpha = tl.exp(running_max - new_max)
        running_sum = running_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        running_max = new_max
    tl.store(O + offset + rows[:, None] * D + features[None, :], acc / running_sum[:, None], mask=row_in[:, None])
    tl.store(LSE + head * T + rows, running_max + tl.log(running_sum), mask=row_in)
''',
    "flash_bwd_dkdv_kernel": '''@triton.jit
def flash_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, scale, T, D: tl.constexpr, IS_CAUSAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK and dV of one tile of BLOCK_N keys of one head, over the tiles of BLOCK_M queries that see it."""
    tile, head = tl.program_id(0), tl.program_id(1)
    offset = head * T * D
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    features = tl.arange(0, D)
    key_in = keys < T
    k = tl.load(K + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
    v = tl.load(V + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
    dk = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, D), dtype=tl.float32)
    first = 0
    if IS_CAUSAL:
        first = (tile * BLOCK_N // BLOCK_M) * BLOCK_M
    for first_query in range(first, T, BLOCK_M):
        rows = first_query + tl.arange(0, BLOCK_M)
        row_in = rows < T
        q = tl.load(Q + offset + rows[:, None] * D + features[None, :], mask=row_in[:, None], other=0.0)
        d_out = tl.load(DO + offset + rows[:, None] * D + features[None, :], mask=row_in[:, None], other=0.0)
        lse = tl.load(LSE + head * T + rows, mask=row_in, other=0.0)
        delta = tl.load(DELTA + head * T + rows, mask=row_in, other=0.0)
        # transposed tiles (keys x queries): P^T, dP^T and dS^T
        scores_t = tl.dot(k, tl.trans(q), input_precision="ieee") * scale
        visible = key_in[:, None] & row_in[None, :]
        if IS_CAUSAL:
            visible = visible & (keys[:, None] <= rows[None, :])
        p_t = tl.where(visible, tl.exp(scores_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t, d_out, input_precision="ieee")
        dp_t = tl.dot(v, tl.trans(d_out), input_precision="ieee")
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t, q, input_precision="ieee")
    tl.store(DK + offset + keys[:, None] * D + features[None, :], dk * scale, mask=key_in[:, None])
    tl.store(DV + offset + keys[:, None] * D + features[None, :], dv, mask=key_in[:, None])
''',
    "flash_bwd_dq_kernel": '''@triton.jit
def flash_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, scale, T, D: tl.constexpr, IS_CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one tile of BLOCK_M queries of one head, over the tiles of BLOCK_N keys it sees."""
    tile, head = tl.program_id(0), tl.program_id(1)
    offset = head * T * D
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    features = tl.arange(0, D)
    row_in = rows < T
    q = tl.load(Q + offset + rows[:, None] * D + features[None, :], mask=row_in[:, None], other=0.0)
    d_out = tl.load(DO + offset + rows[:, None] * D + features[None, :], mask=row_in[:, None], other=0.0)
    lse = tl.load(LSE + head * T + rows, mask=row_in, other=0.0)
    delta = tl.load(DELTA + head * T + rows, mask=row_in, other=0.0)
    dq = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    stop = T
    if IS_CAUSAL:
        stop = tl.minimum(T, (tile + 1) * BLOCK_M)
    for first_key in range(0, stop, BLOCK_N):
        keys = first_key + tl.arange(0, BLOCK_N)
        key_in = keys < T
        k = tl.load(K + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
        v = tl.load(V + offset + keys[:, None] * D + features[None, :], mask=key_in[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = row_in[:, None] & key_in[None, :]
        if IS_CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        p = tl.where(visible, tl.exp(scores - lse[:, None]), 0.0)
        dp = tl.dot(d_out, tl.trans(v), input_precision="ieee")
        dq += tl.dot(p * (dp - delta[:, None]), k, input_precision="ieee")
    tl.store(DQ + offset + rows[:, None] * D + features[None, :], dq * scale, mask=row_in[:, None])
''',
}
