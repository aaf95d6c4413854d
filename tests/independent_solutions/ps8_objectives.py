"""ps8-objectives answered from the notebook's text alone (tests/test_independent_solutions.py): the mask draws
its random numbers in another order than the solution (the fate first, then the selection, one token axis flat),
the loss uses logsumexp by hand, the span corruption walks over runs."""

ANSWERS = {
    "mlm_mask": '''
def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    rng = np.random.default_rng() if rng is None else rng
    ids = np.asarray(ids)
    flat = ids.reshape(-1).copy()
    fate = rng.random(flat.size)
    replacement = rng.integers(0, vocab_size, size=flat.size)
    chosen = (rng.random(flat.size) < mask_prob) & ~np.asarray(special_mask, dtype=bool).reshape(-1)
    labels = np.full(flat.size, -100, dtype=np.int64)
    labels[chosen] = flat[chosen]
    flat[chosen & (fate < 0.8)] = mask_id
    swap = chosen & (fate >= 0.8) & (fate < 0.9)
    flat[swap] = replacement[swap]
    return flat.reshape(ids.shape), labels.reshape(ids.shape)
''',
    "mlm_loss": '''
def mlm_loss(logits, labels):
    logits = np.asarray(logits, dtype=float)
    labels = np.asarray(labels).reshape(-1)
    rows = logits.reshape(-1, logits.shape[-1])
    keep = labels != -100
    rows, targets = rows[keep], labels[keep]
    top = rows.max(axis=1)
    log_norm = top + np.log(np.sum(np.exp(rows - top[:, None]), axis=1))
    return float(np.mean(log_norm - rows[np.arange(len(rows)), targets]))
''',
    "t5_span_counts": '''
def t5_span_counts(length, noise_density=0.15, mean_span_length=3.0):
    noise = int(np.round(np.float32(length) * np.float32(noise_density)))
    noise = int(np.clip(noise, 1, length - 1))
    spans = int(np.round(np.float32(noise) / np.float32(mean_span_length)))
    return noise, max(1, spans)
''',
    "t5_span_corruption": '''
def t5_span_corruption(ids, noise_mask, sentinel_ids):
    ids, noise = list(np.asarray(ids)), [bool(x) for x in np.asarray(noise_mask)]
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or noise[i] != noise[start]:
            runs.append((noise[start], ids[start:i]))
            start = i
    inputs, targets, span = [], [], 0
    for is_noise, tokens in runs:
        if is_noise:
            inputs.append(sentinel_ids[span])
            targets += [sentinel_ids[span]] + tokens
            span += 1
        else:
            inputs += tokens
    if runs and not runs[-1][0]:
        targets.append(sentinel_ids[span])
    return np.array(inputs, dtype=np.int64), np.array(targets, dtype=np.int64)
''',
    "best_span": '''
def best_span(start_logits, end_logits, max_answer_len):
    a, b = np.asarray(start_logits, dtype=float), np.asarray(end_logits, dtype=float)
    best, answer = None, (0, 0)
    for s in range(len(a)):
        for e in range(s, min(len(b), s + max_answer_len)):
            if best is None or a[s] + b[e] > best:
                best, answer = a[s] + b[e], (s, e)
    return answer
''',
}
