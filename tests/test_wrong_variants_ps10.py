"""The classic wrong answers of ps10-parallel, and what each must cost: the same machinery and rules as
tests/test_wrong_variants.py (whose helpers this file uses), kept apart so that problem sets added at the same
time do not edit one file. Each variant loses exactly its cells under every seed, fails a visible test of its
own function, and a function that calls a broken one fails its visible tests exactly when it loses its hidden
cells, naming the broken one first."""

from __future__ import annotations


import pytest

import test_wrong_variants as base
from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import release, submission, write

PS10 = "ps10-parallel"
ALL_REDUCE = {"test_all_reduce"}
SCALER = {"test_loss_scaler_backoff", "test_loss_scaler_growth"}
FIRST = len(base.VARIANTS[PS10]), len(base.TEMPLATES)
# The two checks on real processes fork 2 or 3 ranks for each case: 3 seeds, as ps6's fits have (their fixed
# cases meet every failure class in every draw; tests/test_failure_classes.py checks 20 draws of them).
base.SEEDS_OF.update({"test_ddp_average": range(3), "test_zero1": range(3)})

reduce_scatter_with = base.template(PS10, "ring_reduce_scatter", """
def ring_reduce_scatter(buffers):
    out = np.array(buffers, dtype=float)
    world = out.shape[0]
    slices = chunk_slices(out.shape[1], world)
    for step in range(world - 1):
        sent = [(r, {chunk}) for r in range(world)]
        payloads = [out[r, slices[c]].copy() for r, c in sent]
        for (r, c), payload in zip(sent, payloads):
            out[(r + 1) % world, slices[c]] += payload
    return out
""", chunk="(r - step) % world")
base.variant(PS10, "reduce-scatter sends chunk r + s (the wrong way round)", "ring_reduce_scatter",
             {"test_reduce_scatter"} | ALL_REDUCE, reduce_scatter_with(chunk="(r + step) % world"))
base.variant(PS10, "reduce-scatter shortcut: every chunk of every rank is the full sum", "ring_reduce_scatter",
             {"test_reduce_scatter"}, """
def ring_reduce_scatter(buffers):
    buffers = np.asarray(buffers, dtype=float)
    return np.tile(buffers.sum(axis=0), (buffers.shape[0], 1))
""")
base.variant(PS10, "reduce-scatter in place (changes the caller's buffers)", "ring_reduce_scatter",
             {"test_reduce_scatter"}, """
def ring_reduce_scatter(buffers):
    out = np.asarray(buffers, dtype=float)
    world = out.shape[0]
    slices = chunk_slices(out.shape[1], world)
    for step in range(world - 1):
        sent = [(r, (r - step) % world) for r in range(world)]
        payloads = [out[r, slices[c]].copy() for r, c in sent]
        for (r, c), payload in zip(sent, payloads):
            out[(r + 1) % world, slices[c]] += payload
    return out
""")
base.variant(PS10, "reduce-scatter stops one step early", "ring_reduce_scatter", {"test_reduce_scatter"} | ALL_REDUCE,
             reduce_scatter_with(chunk="(r - step) % world if step < world - 2 else r"))

all_gather_with = base.template(PS10, "ring_all_gather", """
def ring_all_gather(buffers):
    out = np.array(buffers, dtype=float)
    world = out.shape[0]
    slices = chunk_slices(out.shape[1], world)
    for step in range(world - 1):
        sent = [(r, {chunk}) for r in range(world)]
        payloads = [out[r, slices[c]].copy() for r, c in sent]
        for (r, c), payload in zip(sent, payloads):
            out[(r + 1) % world, slices[c]] {combine} payload
    return out
""", chunk="(r + 1 - step) % world", combine="=")
base.variant(PS10, "all-gather sends chunk r - s (reduce-scatter's order)", "ring_all_gather",
             {"test_all_gather"} | ALL_REDUCE, all_gather_with(chunk="(r - step) % world"))
base.variant(PS10, "all-gather adds instead of overwriting", "ring_all_gather", {"test_all_gather"} | ALL_REDUCE,
             all_gather_with(combine="+="))

base.variant(PS10, "all-gather in place (changes the caller's buffers)", "ring_all_gather", {"test_all_gather"}, """
def ring_all_gather(buffers):
    world = buffers.shape[0]
    slices = chunk_slices(buffers.shape[1], world)
    for step in range(world - 1):
        sent = [(r, (r + 1 - step) % world) for r in range(world)]
        payloads = [buffers[r, slices[c]].copy() for r, c in sent]
        for (r, c), payload in zip(sent, payloads):
            buffers[(r + 1) % world, slices[c]] = payload
    return buffers
""")

base.variant(PS10, "all-reduce averages instead of summing", "ring_all_reduce", ALL_REDUCE, """
def ring_all_reduce(buffers):
    return ring_all_gather(ring_reduce_scatter(buffers)) / np.shape(buffers)[0]
""")
base.variant(PS10, "all-reduce without the all-gather", "ring_all_reduce", ALL_REDUCE, """
def ring_all_reduce(buffers):
    return ring_reduce_scatter(buffers)
""")

bytes_with = base.template(PS10, "ring_bytes_sent", """
def ring_bytes_sent(n_bytes, world_size, op):
    one_pass = {one_pass}
    return float({total})
""", one_pass="(world_size - 1) / world_size * n_bytes", total='2 * one_pass if op == "all_reduce" else one_pass')
base.variant(PS10, "all-reduce costs one pass (no factor 2)", "ring_bytes_sent", {"test_ring_bytes"},
             bytes_with(total="one_pass"))
base.variant(PS10, "each step sends the whole message", "ring_bytes_sent", {"test_ring_bytes"},
             bytes_with(one_pass="(world_size - 1) * n_bytes"))

zero_with = base.template(PS10, "zero_memory", """
def zero_memory(n_params, world_size, stage, k=12):
    own = {own}
    weights = 2 * (own if stage >= {weights} else n_params)
    grads = 2 * (own if stage >= {grads} else n_params)
    states = {k} * (own if stage >= 1 else n_params)
    return np.asarray(weights + grads + states, dtype=np.int64) * np.ones(world_size, dtype=np.int64)
""", own="np.array([n_params // world_size + (r < n_params % world_size) for r in range(world_size)])",
    weights="3", grads="2", k="k")
base.variant(PS10, "ZeRO-2 also divides the weights", "zero_memory", {"test_zero_memory"}, zero_with(weights="2"))
base.variant(PS10, "ZeRO-1 also divides the gradients", "zero_memory", {"test_zero_memory"}, zero_with(grads="1"))
base.variant(PS10, "ZeRO-3 keeps the weights whole", "zero_memory", {"test_zero_memory"}, zero_with(weights="4"))
base.variant(PS10, "optimiser state fixed at 12 bytes (k ignored)", "zero_memory", {"test_zero_memory"},
             zero_with(k="12"))
base.variant(PS10, "ZeRO shards rounded down (the remainder kept by no GPU)", "zero_memory", {"test_zero_memory"},
             zero_with(own="n_params // world_size"))
base.variant(PS10, "ZeRO: the last GPU keeps the remainder", "zero_memory", {"test_zero_memory"},
             zero_with(own="np.array([n_params // world_size + (n_params % world_size if r == world_size - 1 else 0) "
                           "for r in range(world_size)])"))

gpipe_with = base.template(PS10, "gpipe_schedule", """
def gpipe_schedule(p, m, t_backward=1):
    turn = m + p - 1
    grid = np.zeros((p, turn * (1 + t_backward)), dtype=int)
    for s in range(p):
        for i in range(m):
            grid[s, s + i] = i + 1
            start = {backward}
            grid[s, start:start + {length}] = -(i + 1)
    return grid
""", backward="turn + ((p - 1 - s) + i) * t_backward", length="t_backward")
base.variant(PS10, "GPipe backwards run from the first stage", "gpipe_schedule", {"test_gpipe_schedule"},
             gpipe_with(backward="turn + (s + i) * t_backward"))
base.variant(PS10, "GPipe backwards in reverse micro-batch order", "gpipe_schedule", {"test_gpipe_schedule"},
             gpipe_with(backward="turn + ((p - 1 - s) + (m - 1 - i)) * t_backward"))
base.variant(PS10, "GPipe backwards of one slot whatever t_backward", "gpipe_schedule", {"test_gpipe_schedule"},
             gpipe_with(length="1"))
base.variant(PS10, "GPipe stages wait one slot per stage for a backward of t_backward slots", "gpipe_schedule",
             {"test_gpipe_schedule"}, gpipe_with(backward="turn + (p - 1 - s) + i * t_backward"))

bubble_with = base.template(PS10, "pipeline_bubble", """
def pipeline_bubble(schedule):
    busy = np.asarray(schedule) != 0
    working = np.flatnonzero(busy.any(axis=0))
    if working.size == 0:
        return {empty}
    span = {span}
    return float(1.0 - span.sum() / span.size)
""", empty="0.0", span="busy[:, : working[-1] + 1]")
base.variant(PS10, "bubble counts the idle columns after the last operation", "pipeline_bubble",
             {"test_pipeline_bubble"}, bubble_with(span="busy"))
base.variant(PS10, "bubble of the first stage only", "pipeline_bubble", {"test_pipeline_bubble"},
             bubble_with(span="busy[:1, : working[-1] + 1]"))
base.variant(PS10, "bubble starts at the first operation (leading idle slots dropped)", "pipeline_bubble",
             {"test_pipeline_bubble"}, bubble_with(span="busy[:, working[0] : working[-1] + 1]"))

scaler_with = base.template(PS10, "loss_scale_trace", """
def loss_scale_trace(overflows, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, clean = float(init_scale), 0
    scales, taken = [], []
    for overflow in overflows:
        {record}
        taken.append({taken})
        if overflow:
            scale = {backoff}
            clean = {reset}
        else:
            clean += 1
            if clean == {interval}:
                scale = {grow}
                clean = 0
        {record_after}
    return np.array(scales, dtype=float), np.array(taken, dtype=bool)
""", record="scales.append(scale)", taken="not overflow", reset="0", interval="growth_interval",
    record_after="pass", backoff="scale * backoff_factor", grow="scale * growth_factor")
base.variant(PS10, "loss scale recorded after its update", "loss_scale_trace", SCALER,
             scaler_with(record="pass", record_after="scales.append(scale)"))
base.variant(PS10, "an overflow does not restart the clean count", "loss_scale_trace", {"test_loss_scaler_growth"},
             scaler_with(reset="clean"))
base.variant(PS10, "grows after growth_interval + 1 clean steps", "loss_scale_trace", {"test_loss_scaler_growth"},
             scaler_with(interval="growth_interval + 1"))
base.variant(PS10, "an overflowing step is still taken", "loss_scale_trace", SCALER, scaler_with(taken="True"))
base.variant(PS10, "loss scale floored at 1 (the text states no floor)", "loss_scale_trace", SCALER,
             scaler_with(backoff="max(scale * backoff_factor, 1.0)"))
base.variant(PS10, "loss scale capped at 2**24 when it grows (the text states no ceiling)", "loss_scale_trace",
             {"test_loss_scaler_growth"}, scaler_with(grow="min(scale * growth_factor, 2.0**24)"))
base.variant(PS10, "grows after growth_interval - 1 clean steps", "loss_scale_trace", {"test_loss_scaler_growth"},
             scaler_with(interval="growth_interval - 1"))

tp_with = base.template(PS10, "tp_mlp_partials", """
def tp_mlp_partials(x, w1, w2, t):
    x, w1, w2 = (np.asarray(a, dtype=float) for a in (x, w1, w2))
    shards = {shards}
    return np.stack([{partial} for cols in shards]){scale}
""", shards="chunk_slices(w1.shape[1], t)", partial="np.maximum(x @ w1[:, cols], 0.0) @ w2[cols, :]", scale="")
base.variant(PS10, "tensor parallel: relu applied to the partial outputs", "tp_mlp_partials", {"test_tp_partials"},
             tp_with(partial="np.maximum(x @ w1[:, cols] @ w2[cols, :], 0.0)"))
base.variant(PS10, "tensor parallel: the last rank takes the remainder columns", "tp_mlp_partials",
             {"test_tp_partials"},
             tp_with(shards="[slice(r * (w1.shape[1] // t), (r + 1) * (w1.shape[1] // t) if r < t - 1 else None) "
                            "for r in range(t)]"))
base.variant(PS10, "tensor parallel: ranks without columns left out", "tp_mlp_partials", {"test_tp_partials"},
             tp_with(shards="[c for c in chunk_slices(w1.shape[1], t) if c.stop > c.start]"))
base.variant(PS10, "tensor parallel: partial outputs averaged (divided by t)", "tp_mlp_partials",
             {"test_tp_partials"}, tp_with(scale=" / t"))
base.variant(PS10, "tensor parallel: W1 split by rows, W2 by columns", "tp_mlp_partials", {"test_tp_partials"},
             tp_with(partial="np.maximum(x[:, cols] @ w1[cols, :], 0.0) @ w2[:, cols]"))

ddp_with = base.template(PS10, "average_gradients", """
def average_gradients(params, bucket_numel):
    buckets, size = [], 0
    for index in {walk}:
        numel = params[index].grad.numel()
        if buckets and size + numel <= bucket_numel:
            buckets[-1].append(index)
            size += numel
        else:
            buckets.append([index])
            size = numel
    world = dist.get_world_size()
    for bucket in {order}:
        flat = torch.cat([params[i].grad.reshape(-1) for i in bucket])
        dist.all_reduce(flat)
        {average}
        start = 0
        for i in bucket:
            grad = params[i].grad
            grad.copy_(flat[start:start + grad.numel()].view_as(grad))
            start += grad.numel()
    return buckets
""", walk="reversed(range(len(params)))", order="buckets", average="flat /= world")
base.variant(PS10, "DDP sums the gradients instead of averaging", "average_gradients", {"test_ddp_average"},
             ddp_with(average="pass"))
base.variant(PS10, "DDP reduces the buckets in a per-rank order", "average_gradients", {"test_ddp_average"},
             ddp_with(order="(buckets if dist.get_rank() == 0 else buckets[::-1])"))
base.variant(PS10, "DDP buckets in forward parameter order", "average_gradients", {"test_ddp_average"},
             ddp_with(walk="range(len(params))"))

zero1_with = base.template(PS10, "zero1_step", """
def zero1_step(params, momentum, lr, beta):
    world, rank, shard = dist.get_world_size(), dist.get_rank(), momentum.numel()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    grads = torch.cat([grads, grads.new_zeros(shard * world - grads.numel())])
    grad_shard = torch.empty(shard, dtype=grads.dtype)
    dist.reduce_scatter_single(grad_shard, grads)
    grad_shard /= {divide}
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in params])
        flat = torch.cat([flat, flat.new_zeros(shard * world - flat.numel())])
        momentum.mul_(beta).add_(grad_shard)
        own = flat[rank * shard:(rank + 1) * shard] - lr * momentum
        {gather}
        start = 0
        for p in params:
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()
""", divide="world", gather="dist.all_gather_single(flat, own)")
base.variant(PS10, "ZeRO-1 sums the gradients instead of averaging", "zero1_step", {"test_zero1"},
             zero1_with(divide="1"))
base.variant(PS10, "ZeRO-1 forgets the all-gather (only the own shard is updated)", "zero1_step", {"test_zero1"},
             zero1_with(gather="flat[rank * shard:(rank + 1) * shard] = own"))
base.variant(PS10, "ZeRO-1 rank updates the full state (all-reduce, a full momentum of its own)", "zero1_step",
             {"test_zero1"}, """
_full_momentum = []


def zero1_step(params, momentum, lr, beta):
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(grads)
    grads /= dist.get_world_size()
    if not _full_momentum:
        _full_momentum.append(torch.zeros_like(grads))
    full = _full_momentum[0]
    full.mul_(beta).add_(grads)
    with torch.no_grad():
        start = 0
        for p in params:
            p -= lr * full[start:start + p.numel()].view_as(p)
            start += p.numel()
""")

VARIANTS = base.VARIANTS[PS10][FIRST[0]:]
TEMPLATES = base.TEMPLATES[FIRST[1]:]
IDS = [v.name for v in VARIANTS]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return base.Harness(PS10, tmp_path_factory.mktemp(PS10))


@pytest.mark.parametrize("cell,fill", [(c, f) for _, c, f in TEMPLATES], ids=[c for _, c, _ in TEMPLATES])
def test_a_template_filled_with_its_right_parts_is_a_correct_answer(cell, fill, harness):
    ns = base._namespace(PS10, base.Variant("right", cell, frozenset(), fill()))
    assert harness.lost(ns, 0) == set()
    assert base._visible_failures(PS10, ns, base._test_cells(PS10)) == {}


def test_every_graded_function_has_wrong_variants():
    checks = assignments.load(PS10).CHECKS.values()
    functions = {base.HARNESS_CALLS.get(check.function, check.function) for check in checks}
    assert functions <= {v.cell for v in VARIANTS}, functions - {v.cell for v in VARIANTS}


@pytest.mark.parametrize("v", VARIANTS, ids=IDS)
def test_a_wrong_variant_loses_exactly_its_cells_under_every_seed(v, harness):
    base.assert_loses_exactly(harness, base._namespace(PS10, v), v)


@pytest.mark.parametrize("v", VARIANTS, ids=IDS)
def test_a_wrong_variant_fails_a_visible_test_of_its_function(v):
    own = base._own_cells(PS10, v)
    assert base._visible_failures(PS10, base._namespace(PS10, v), own), f"{v.name} passes every visible test"


DEPENDENT = [v for v in VARIANTS if any(v.cell in c.depends_on for c in assignments.load(PS10).CHECKS.values())]


@pytest.mark.parametrize("v", DEPENDENT, ids=[v.name for v in DEPENDENT])
def test_visible_tests_of_callers_fail_when_hidden_ones_do_and_name_the_broken_function(v):
    checks = assignments.load(PS10).CHECKS
    ns = base._namespace(PS10, v)
    for caller in sorted({c.function for c in checks.values() if v.cell in c.depends_on}):
        cells = {gid for gid, check in checks.items() if check.function == caller}
        failures = base._visible_failures(PS10, ns, cells)
        assert bool(failures) == bool(cells & v.loses), (caller, failures, sorted(cells & v.loses))
        for gid, message in failures.items():
            assert f"{caller} uses your {v.cell}, which" in message and f"fix {v.cell} first" in message, message


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_twenty_copies_get_identical_rows_through_the_command_line(tmp_path):
    v = next(v for v in VARIANTS if v.name == "an overflow does not restart the clean count")
    nb = base._notebook(PS10, v)
    base.write_copies(nb, tmp_path / "subs", base._notebook_name(PS10))
    out = tmp_path / "out"
    assert grader_main(["grade", PS10, str(tmp_path / "subs"), "--out", str(out), "--workers", "2",
                        "--timeout", "20"]) == 0
    base.assert_copies_identical(base.read_grades(out), PS10, v.loses)


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_the_solution_scores_full_marks_and_the_release_zero_through_the_command_line(tmp_path):
    notebook = base._notebook_name(PS10)
    write(submission(PS10, notebook), tmp_path / "subs" / "solved", notebook)
    write(release(PS10, notebook), tmp_path / "subs" / "untouched", notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", PS10, str(tmp_path / "subs"), "--out", str(out), "--workers", "2",
                        "--timeout", "10"]) == 0
    rows = base.read_grades(out)
    assert rows["solved"]["status"] == "graded" and rows["solved"]["score"] == "24"  # + 2 written, by hand
    assert float(rows["solved"]["max_score"]) == 24 + float(rows["solved"]["manual_pending"])
    assert rows["untouched"]["status"] == "graded" and rows["untouched"]["score"] == "0"
