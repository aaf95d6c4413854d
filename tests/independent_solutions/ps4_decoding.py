"""An independent solution of ps4-decoding: written from the release notebook's text alone."""
ANSWERS = {
    "top_k_filter": '''def top_k_filter(logits, k):
    """logits (..., V) -> same shape, entries smaller than the k-th largest of their row set to -inf."""
    logits = np.asarray(logits, dtype=float)
    vocab = logits.shape[-1]
    if k >= vocab:
        return logits.copy()
    kth_largest = np.sort(logits, axis=-1)[..., vocab - k]
    return np.where(logits >= kth_largest[..., None], logits, -np.inf)
''',
    "top_p_filter": '''def top_p_filter(logits, p):
    """logits (..., V) -> same shape, tokens outside the nucleus of probability p set to -inf."""
    logits = np.asarray(logits, dtype=float)
    if p >= 1:
        return logits.copy()
    rows = logits.reshape(-1, logits.shape[-1])
    out = np.full_like(rows, -np.inf)
    for r, row in enumerate(rows):
        exps = np.exp(row - row.max())
        probs = exps / exps.sum()
        order = sorted(range(len(row)), key=lambda i: (-probs[i], i))
        above = 0.0
        for rank, i in enumerate(order):
            if rank > 0 and above >= p:
                break
            out[r, i] = row[i]
            above += probs[i]
    return out.reshape(logits.shape)
''',
    "sample_with_temperature": '''def sample_with_temperature(logits, temperature, u):
    """The token index i with cumsum(softmax(logits / temperature))[i] > u for the first time."""
    scaled = np.asarray(logits, dtype=float) / temperature
    exps = np.exp(scaled - scaled.max())
    probs = exps / exps.sum()
    running = np.cumsum(probs)
    above = np.nonzero(running > u)[0]
    if len(above):
        return int(above[0])
    return int(np.nonzero(probs > 0)[0][-1])  # rounding left the total below u: the last possible token
''',
    "beam_search_step": '''def beam_search_step(beams, scores, logprobs, beam_size):
    """One beam-search step: returns (new_beams (beam_size, t + 1), new_scores (beam_size,)), best first."""
    beams = np.asarray(beams)
    logprobs = np.asarray(logprobs, dtype=float)
    candidates = []
    for b in range(logprobs.shape[0]):
        for v in range(logprobs.shape[1]):
            candidates.append((-(scores[b] + logprobs[b, v]), b, v))
    candidates.sort()
    chosen = candidates[:beam_size]
    new_beams = np.array([list(beams[b]) + [v] for _, b, v in chosen], dtype=beams.dtype)
    new_scores = np.array([-negated for negated, _, _ in chosen], dtype=float)
    return new_beams, new_scores
''',
    "cached_attention_step": '''def cached_attention_step(q, k, v, k_cache, v_cache):
    """Append k, v to the caches and attend from q over every cached position."""
    q = np.asarray(q, dtype=float)
    k_cache = np.vstack([np.asarray(k_cache, dtype=float).reshape(-1, len(k)), np.asarray(k, dtype=float)[None]])
    v_cache = np.vstack([np.asarray(v_cache, dtype=float).reshape(-1, len(v)), np.asarray(v, dtype=float)[None]])
    scores = k_cache @ q / np.sqrt(len(q))
    weights = np.exp(scores - scores.max())
    weights = weights / weights.sum()
    return weights @ v_cache, k_cache, v_cache
''',
}
