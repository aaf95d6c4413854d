"""An independent solution of ps8-objectives: written from the release notebook's text alone."""
ANSWERS = {
    "mlm_mask": '''def mlm_mask(ids, mask_id, vocab_size, special_mask, mask_prob=0.15, rng=None):
    """ids (...) integers, special_mask (...) bool -> (inputs, labels), both shaped like ids. Each non-special
    token is selected with probability mask_prob; a selected token becomes mask_id (80%), a uniform random id in
    [0, vocab_size) (10%) or stays (10%); labels = ids where selected, -100 elsewhere."""
    if rng is None:
        rng = np.random.default_rng()
    ids = np.asarray(ids)
    special = np.asarray(special_mask, dtype=bool)
    selected = (rng.random(ids.shape) < mask_prob) & ~special
    labels = np.full(ids.shape, -100, dtype=np.int64)
    labels[selected] = ids[selected]
    action = rng.random(ids.shape)                 # < 0.8: [MASK]; 0.8 .. 0.9: random id; >= 0.9: kept
    random_ids = rng.integers(0, vocab_size, size=ids.shape)
    inputs = np.array(ids, dtype=np.int64, copy=True)
    inputs[selected & (action < 0.8)] = mask_id
    replace = selected & (action >= 0.8) & (action < 0.9)
    inputs[replace] = random_ids[replace]
    return inputs, labels
''',
    "mlm_loss": '''def mlm_loss(logits, labels):
    """logits (..., V), labels (...) with -100 at unselected positions -> the mean cross-entropy over the
    selected positions (a float)."""
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    total, count = 0.0, 0
    for row, label in zip(flat_logits, flat_labels):
        if label == -100:
            continue
        top = row.max()
        total += top + np.log(np.sum(np.exp(row - top))) - row[label]
        count += 1
    return float(total / count)
''',
    "t5_span_counts": '''def t5_span_counts(length, noise_density=0.15, mean_span_length=3.0):
    """(n_noise, n_spans) of T5's random_spans_noise_mask: float32 arithmetic, round half to even,
    n_noise clipped to [1, length - 1], n_spans at least 1."""
    n_noise = int(np.round(np.float32(length) * np.float32(noise_density)))
    n_noise = min(max(n_noise, 1), length - 1)
    n_spans = int(np.round(np.float32(n_noise) / np.float32(mean_span_length)))
    return n_noise, max(n_spans, 1)
''',
    "t5_span_corruption": '''def t5_span_corruption(ids, noise_mask, sentinel_ids):
    """ids (L,), noise_mask (L,) bool -> (inputs, targets): noise span k becomes sentinel_ids[k] in inputs;
    targets = sentinel_ids[k] + span k for every span, then a closing sentinel if the last token is not noise."""
    inputs, targets = [], []
    span = 0
    previous_noise = False
    for token, noise in zip(ids, noise_mask):
        token, noise = int(token), bool(noise)
        if noise:
            if not previous_noise:
                inputs.append(int(sentinel_ids[span]))
                targets.append(int(sentinel_ids[span]))
                span += 1
            targets.append(token)
        else:
            inputs.append(token)
        previous_noise = noise
    if len(ids) and not bool(noise_mask[-1]):
        targets.append(int(sentinel_ids[span]))
    return np.array(inputs, dtype=np.int64), np.array(targets, dtype=np.int64)
''',
    "best_span": '''def best_span(start_logits, end_logits, max_answer_len):
    """argmax of start_logits[s] + end_logits[e] over s <= e < s + max_answer_len -> (s, e); ties go to the
    smallest s, then the smallest e."""
    T = len(start_logits)
    best, best_score = None, None
    for s in range(T):
        for e in range(s, min(T, s + max_answer_len)):
            score = float(start_logits[s]) + float(end_logits[e])
            if best is None or score > best_score:
                best, best_score = (s, e), score
    return best
''',
}
