"""ps10-parallel answered from the notebook's text alone (tests/test_independent_solutions.py): each collective
simulates the ring with explicit per-rank message lists, the loss scale keeps its state in a dict."""

ANSWERS = {
    "ring_reduce_scatter": '''
def ring_reduce_scatter(buffers):
    state = [np.array(row, dtype=float) for row in np.asarray(buffers)]
    world = len(state)
    chunks = chunk_slices(state[0].size, world) if world else []
    for s in range(world - 1):
        messages = {(r + 1) % world: ((r - s) % world, state[r][chunks[(r - s) % world]].copy())
                    for r in range(world)}
        for receiver, (chunk, data) in messages.items():
            state[receiver][chunks[chunk]] = state[receiver][chunks[chunk]] + data
    return np.stack(state)
''',
    "ring_all_gather": '''
def ring_all_gather(buffers):
    state = [np.array(row, dtype=float) for row in np.asarray(buffers)]
    world = len(state)
    chunks = chunk_slices(state[0].size, world) if world else []
    for s in range(world - 1):
        messages = {(r + 1) % world: ((r + 1 - s) % world, state[r][chunks[(r + 1 - s) % world]].copy())
                    for r in range(world)}
        for receiver, (chunk, data) in messages.items():
            state[receiver][chunks[chunk]] = data
    return np.stack(state)
''',
    "ring_all_reduce": '''
def ring_all_reduce(buffers):
    return ring_all_gather(ring_reduce_scatter(buffers))
''',
    "ring_bytes_sent": '''
def ring_bytes_sent(n_bytes, world_size, op):
    passes = {"reduce_scatter": 1, "all_gather": 1, "all_reduce": 2}[op]
    return float(passes * (world_size - 1) * (n_bytes / world_size))
''',
    "zero_memory": '''
def zero_memory(n_params, world_size, stage, k=12):
    divided = {0: (1, 1, 1), 1: (1, 1, world_size), 2: (1, world_size, world_size),
               3: (world_size, world_size, world_size)}[stage]
    return float(sum(size * n_params / d for size, d in zip((2, 2, k), divided)))
''',
    "gpipe_schedule": '''
def gpipe_schedule(p, m):
    slots = 2 * (m + p - 1)
    grid = np.zeros((p, slots), dtype=np.int64)
    for stage in range(p):
        grid[stage, stage:stage + m] = np.arange(1, m + 1)
        first_backward = (m + p - 1) + (p - 1 - stage)
        grid[stage, first_backward:first_backward + m] = -np.arange(1, m + 1)
    return grid
''',
    "pipeline_bubble": '''
def pipeline_bubble(schedule):
    grid = np.asarray(schedule)
    working_columns = [t for t in range(grid.shape[1]) if np.any(grid[:, t] != 0)]
    if not working_columns:
        return 0.0
    span = grid[:, : working_columns[-1] + 1]
    return float(np.count_nonzero(span == 0) / span.size)
''',
    "loss_scale_trace": '''
def loss_scale_trace(overflows, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    state = {"scale": float(init_scale), "clean": 0}
    scales, taken = [], []
    for overflow in list(overflows):
        scales.append(state["scale"])
        taken.append(not bool(overflow))
        if overflow:
            state["scale"], state["clean"] = state["scale"] * backoff_factor, 0
            continue
        state["clean"] += 1
        if state["clean"] >= growth_interval:
            state["scale"], state["clean"] = state["scale"] * growth_factor, 0
    return np.asarray(scales, dtype=float), np.asarray(taken, dtype=bool)
''',
}
