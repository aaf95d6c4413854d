"""An independent solution of ps10-parallel: written from the release notebook's text alone."""
ANSWERS = {
    "ring_reduce_scatter": '''def ring_reduce_scatter(buffers):
    """(N, n) -> (N, n): in step s = 0..N-2 rank r sends chunk (r - s) % N to rank (r + 1) % N, which adds it."""
    state = np.array(buffers, dtype=np.float64, copy=True)
    world = state.shape[0]
    chunks = chunk_slices(state.shape[1], world)
    for step in range(world - 1):
        messages = [state[r, chunks[(r - step) % world]].copy() for r in range(world)]  # all ranks send at once
        for sender, message in enumerate(messages):
            state[(sender + 1) % world, chunks[(sender - step) % world]] += message
    return state
''',
    "ring_all_gather": '''def ring_all_gather(buffers):
    """(N, n) -> (N, n): rank r owns chunk (r + 1) % N; in step s it sends chunk (r + 1 - s) % N to rank
    (r + 1) % N, which overwrites its copy."""
    state = np.array(buffers, dtype=np.float64, copy=True)
    world = state.shape[0]
    chunks = chunk_slices(state.shape[1], world)
    for step in range(world - 1):
        messages = [state[r, chunks[(r + 1 - step) % world]].copy() for r in range(world)]
        for sender, message in enumerate(messages):
            state[(sender + 1) % world, chunks[(sender + 1 - step) % world]] = message
    return state
''',
    "ring_all_reduce": '''def ring_all_reduce(buffers):
    """(N, n) -> (N, n): reduce-scatter, then all-gather; every row becomes the sum of the rows."""
    return ring_all_gather(ring_reduce_scatter(buffers))
''',
    "ring_bytes_sent": '''def ring_bytes_sent(n_bytes, world_size, op):
    """Bytes each rank sends in a ring reduce_scatter, all_gather or all_reduce of an n_bytes message."""
    phases = {"reduce_scatter": 1, "all_gather": 1, "all_reduce": 2}[op]
    chunk = n_bytes / world_size
    return float(phases * (world_size - 1) * chunk)
''',
    "zero_memory": '''def zero_memory(n_params, world_size, stage, k=12):
    \"\"\"(world_size,) int array: bytes of model states each GPU keeps under ZeRO stage 0-3.\"\"\"
    kept = np.array([c.stop - c.start for c in chunk_slices(n_params, world_size)], dtype=np.int64)
    whole = np.full(world_size, n_params, dtype=np.int64)
    weights = 2 * (kept if stage == 3 else whole)
    gradients = 2 * (kept if stage in (2, 3) else whole)
    optimiser = k * (kept if stage in (1, 2, 3) else whole)
    return weights + gradients + optimiser
''',
    "gpipe_schedule": '''def gpipe_schedule(p, m, t_backward=1):
    \"\"\"GPipe's rules simulated event by event: each operation starts when its stage is free and its input is
    ready; a grid of micro-batch labels (forward i + 1, backward -(i + 1), idle 0).\"\"\"
    forward_end = np.zeros((p, m), dtype=np.int64)
    backward_end = np.zeros((p, m), dtype=np.int64)
    ops = []
    for s in range(p):
        free = 0
        for i in range(m):
            begin = max(free, forward_end[s - 1, i] if s > 0 else 0)
            forward_end[s, i] = free = begin + 1
            ops.append((s, begin, 1, i + 1))
    free_at = forward_end[:, m - 1].copy()
    for s in range(p - 1, -1, -1):
        for i in range(m):
            ready = backward_end[s + 1, i] if s < p - 1 else forward_end[s, i]
            begin = max(free_at[s], ready)
            backward_end[s, i] = free_at[s] = begin + t_backward
            ops.append((s, begin, t_backward, -(i + 1)))
    grid = np.zeros((p, int(backward_end.max())), dtype=np.int64)
    for s, begin, length, label in ops:
        grid[s, begin:begin + length] = label
    return grid
''',
    "pipeline_bubble": '''def pipeline_bubble(schedule):
    """Idle fraction of a (p, T) schedule (0 = idle) over slots 0 .. last slot in which any stage works."""
    busy = np.asarray(schedule) != 0
    working_slots = np.flatnonzero(busy.any(axis=0))
    if working_slots.size == 0:
        return 0.0
    span = busy[:, :working_slots[-1] + 1]
    return float(1.0 - span.sum() / span.size)
''',
    "loss_scale_trace": '''def loss_scale_trace(overflows, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    """(scales, taken): the scale used in each step and whether the step was taken."""
    scale, clean = float(init_scale), 0
    scales, taken = [], []
    for overflow in overflows:
        scales.append(scale)
        if overflow:
            taken.append(False)
            scale *= backoff_factor
            clean = 0
        else:
            taken.append(True)
            clean += 1
            if clean == growth_interval:
                scale *= growth_factor
                clean = 0
    return np.array(scales, dtype=np.float64), np.array(taken, dtype=bool)
''',
    "tp_mlp_partials": '''def tp_mlp_partials(x, w1, w2, t):
    \"\"\"(t, n, d): rank r's partial output relu(x w1[:, cols_r]) w2[cols_r, :], cols_r = chunk_slices(h, t)[r].\"\"\"
    x, w1, w2 = (np.asarray(a, dtype=np.float64) for a in (x, w1, w2))
    out = np.zeros((t, x.shape[0], w2.shape[1]))
    for rank, columns in enumerate(chunk_slices(w1.shape[1], t)):
        hidden = np.maximum(x @ w1[:, columns], 0.0)  # each rank's slice of the hidden layer, no communication
        out[rank] = hidden @ w2[columns, :]
    return out
''',
    "average_gradients": '''def average_gradients(params, bucket_numel):
    \"\"\"Average every p.grad over the ranks, one dist.all_reduce per bucket (reverse parameter order, at most
    bucket_numel elements unless one parameter is larger); returns the buckets as lists of parameter indices.\"\"\"
    buckets = []
    for index in range(len(params) - 1, -1, -1):
        count = params[index].numel()
        if buckets and sum(params[i].numel() for i in buckets[-1]) + count <= bucket_numel:
            buckets[-1].append(index)
        else:
            buckets.append([index])
    size = dist.get_world_size()
    for bucket in buckets:
        grads = [params[i].grad for i in bucket]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(part.reshape(g.shape) / size)
    return buckets
''',
    "zero1_step": '''def zero1_step(params, momentum, lr, beta):
    \"\"\"ZeRO-1 SGD with momentum: reduce-scatter the padded flat gradients (average), update this rank's shard of
    the momentum (in place) and of the parameters, all-gather the parameters into params.\"\"\"
    n, r, s = dist.get_world_size(), dist.get_rank(), momentum.numel()
    pad = n * s - sum(p.numel() for p in params)
    flat_grad = torch.nn.functional.pad(torch.cat([p.grad.flatten() for p in params]), (0, pad))
    mine = torch.zeros(s, dtype=flat_grad.dtype)
    dist.reduce_scatter_single(mine, flat_grad)
    with torch.no_grad():
        momentum.mul_(beta).add_(mine / n)
        weights = torch.nn.functional.pad(torch.cat([p.flatten() for p in params]), (0, pad))
        gathered = torch.empty_like(weights)
        dist.all_gather_single(gathered, weights[r * s:(r + 1) * s] - lr * momentum)
        for p, part in zip(params, torch.split(gathered[:weights.numel() - pad], [p.numel() for p in params])):
            p.copy_(part.reshape(p.shape))
''',
}
