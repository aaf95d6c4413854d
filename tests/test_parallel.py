"""llmarch.parallel on gloo with 2 and 4 CPU processes: DDP, ZeRO-1 and FSDP against a single process on the
concatenated batches and against torch's DistributedDataParallel and fully_shard, from the same initial
weights; the bytes each rank holds; the pipeline schedules against the bubble formula.

Each world size is spawned once (module-scoped fixture); every rank runs the scenarios and returns numbers
that the tests below check. Tolerances: Adam divides by sqrt(v), so a gradient that differs in its last
float32 bits (the ranks sum in another order) moves a weight by up to ~1e-5 after a few steps of lr 1e-2.
torch's oracles run with 2 processes only, to keep the file fast."""

import copy
import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from llmarch.model import GPT, GPTConfig
from llmarch.optim import AdamW
from llmarch.parallel import DDP, FSDP, ShardedOptimizer, bubble_fraction, pipeline_schedule, run_distributed
from llmarch.parallel.ring import ring_bytes_sent
from llmarch.train import LossScaler, train_step

CONFIG = dict(vocab_size=13, context_length=8, d_model=16, n_layers=2, n_heads=2)  # tied embeddings
STEPS, GLOBAL_BATCH = 2, 8


def _model(seed):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**CONFIG))


def _batches(step):
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, 13, (GLOBAL_BATCH, 8), generator=gen)
    return x, torch.randint(0, 13, (GLOBAL_BATCH, 8), generator=gen)


def _local(step, rank, world):
    x, y = _batches(step)
    return x.chunk(world)[rank], y.chunk(world)[rank]


def _max_diff(state, reference):
    return max((state[k].float() - reference[k].float()).abs().max().item() for k in reference)


def _reference(micro=1):
    """One process, the whole global batch, our AdamW."""
    model = _model(0)
    model.pos_emb.weight.requires_grad_(False)
    opt = AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(STEPS):
        x, y = _batches(step)
        train_step(model, opt, list(zip(x.chunk(micro), y.chunk(micro))))
    return {k: v.detach() for k, v in model.named_parameters()}


def _ddp(rank, world, reference):
    """rank 0's weights win at wrap (the others start elsewhere), tiny buckets, a frozen table, tied
    embeddings, gradient accumulation over 2 micro-batches."""
    model = _model(rank)
    model.pos_emb.weight.requires_grad_(False)
    ddp = DDP(model, bucket_size_mb=0.002)
    opt = AdamW([p for p in ddp.parameters() if p.requires_grad], lr=1e-2)
    frozen = model.pos_emb.weight.detach().clone()
    for step in range(STEPS):
        x, y = _local(step, rank, world)
        train_step(ddp, opt, list(zip(x.chunk(2), y.chunk(2))))
    x, y = _local(0, rank, world)  # the hooks launch every bucket's all-reduce before the backward returns
    F.cross_entropy(ddp(x).flatten(0, 1), y.flatten()).backward()
    launched_in_backward = all(bucket.handle is not None for bucket in ddp.buckets)
    ddp.finish_gradient_synchronization()
    weights = {k: v.detach() for k, v in model.named_parameters()}
    return weights, {"ddp_buckets": len(ddp.buckets), "ddp_launched_in_backward": launched_in_backward, "ddp_vs_single": _max_diff(weights, reference),
                     "ddp_frozen_unchanged": torch.equal(frozen, weights["pos_emb.weight"])
                     and model.pos_emb.weight.grad is None}


def _zero1(rank, world, reference):
    """The bare model: rank 0's trainable weights win at construction (the frozen table agrees already);
    the optimiser reduce-scatters, updates its shard, all-gathers; two parameter groups (two flat vectors)."""
    model = _model(rank)
    model.pos_emb.weight.requires_grad_(False)
    model.pos_emb.weight.data.copy_(_model(0).pos_emb.weight)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = ShardedOptimizer([{"params": trainable[:5]}, {"params": trainable[5:]}], AdamW, lr=1e-2)
    for step in range(STEPS):
        train_step(model, opt, [_local(step, rank, world)])
    sizes = [sum(p.numel() for p in trainable[:5]), sum(p.numel() for p in trainable[5:])]
    return {"zero1_vs_single": _max_diff(dict(model.named_parameters()), reference),
            "zero1_state_bytes": opt.local_state_bytes(),
            # m and v of a -(-n // world)-element shard, and a float step, per group
            "zero1_expected_state_bytes": sum(2 * 4 * -(-n // world) + 4 for n in sizes)}


def _fsdp(rank, world, reference):
    model = _model(rank)
    model.pos_emb.weight.requires_grad_(False)
    fsdp = FSDP(model)
    during = []  # inside w2's forward, only w2 is gathered: every earlier matrix was freed after its use
    model.blocks[1].ffn.w2.register_forward_pre_hook(lambda m, args: during.append(fsdp.rank_bytes()["gathered"]))
    opt = AdamW([p for p in fsdp.parameters() if p.requires_grad], lr=1e-2)
    for step in range(STEPS):
        train_step(fsdp, opt, [_local(step, rank, world)])
    full = fsdp.gather_full_params()
    return {"fsdp_vs_single": _max_diff(full, reference),
            "fsdp_names": list(full) == list(_model(0).state_dict()),
            "fsdp_bytes": fsdp.rank_bytes(),
            "matrix_bytes": sum(p.numel() * 4 for p in _model(0).parameters() if p.dim() == 2),  # tied: once
            "fsdp_sharded_modules": sorted(fsdp.sharded), "fsdp_gathered_in_w2": during,
            "w2_bytes": fsdp.sharded["blocks.1.ffn.w2"].full.numel() * 4}


def _torch_ddp(rank, world, ours):
    """torch's DistributedDataParallel from the same weights and batches as ``ours`` saw in _ddp."""
    theirs = _model(0)
    theirs.pos_emb.weight.requires_grad_(False)
    torch_ddp = torch.nn.parallel.DistributedDataParallel(theirs)
    opt = AdamW([p for p in torch_ddp.parameters() if p.requires_grad], lr=1e-2)
    for step in range(STEPS):
        train_step(torch_ddp, opt, [_local(step, rank, world)])
    return _max_diff(ours, dict(theirs.named_parameters()))


def _torch_fully_shard(rank, world):
    """torch's fully_shard (FSDP2) and ours from the same weights, torch's AdamW on both sides."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fsdp, theirs = FSDP(_model(0)), _model(0)
    fully_shard(theirs, mesh=init_device_mesh("cpu", (world,)))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False) for m in (fsdp, theirs)]
    for step in range(STEPS):
        for m, o in zip((fsdp, theirs), opts):
            train_step(m, o, [_local(step, rank, world)], grad_clip=None)
    return _max_diff(fsdp.gather_full_params(), {k: v.full_tensor() for k, v in theirs.named_parameters()})


def _fsdp_bf16(rank, world):
    """bf16 compute, fp32 master shards, against one process under bf16 autocast."""
    fsdp, single = FSDP(_model(0), compute_dtype=torch.bfloat16), _model(0)
    opt, opt_single = AdamW(fsdp.parameters(), lr=1e-3), AdamW(single.parameters(), lr=1e-3)
    for step in range(STEPS):
        train_step(fsdp, opt, [_local(step, rank, world)])
        train_step(single, opt_single, [_batches(step)], precision="bf16")
    return {"fsdp_bf16_master_dtypes": sorted({str(p.dtype) for p in fsdp.parameters()}),
            "fsdp_bf16_vs_single_bf16": _max_diff(fsdp.gather_full_params(), dict(single.named_parameters()))}


_RING_OP = {"all_reduce": "all_reduce", "reduce_scatter_single": "reduce_scatter",
            "all_gather_single": "all_gather", "broadcast": "all_gather"}  # a broadcast costs an all-gather


@contextmanager
def _counting(world):
    """The bytes each rank sends (ring model, ``ring_bytes_sent`` of the full tensor) in the collectives called
    inside, over tensors of more than one element; the 1-element ones (flags, norms) are counted apart."""
    counts = {"bytes": 0.0, "calls": 0, "scalars": 0}
    originals = {name: getattr(dist, name) for name in _RING_OP}

    def counted(name):
        def collective(*args, **kwargs):
            full = args[1] if name == "reduce_scatter_single" else args[0]
            if full.numel() == 1:
                counts["scalars"] += 1
            else:
                counts["bytes"] += ring_bytes_sent(full.numel() * full.element_size(), world, _RING_OP[name])
                counts["calls"] += 1
            return originals[name](*args, **kwargs)
        return collective

    for name in _RING_OP:  # the library calls dist.<name> at call time
        setattr(dist, name, counted(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def _communication(rank, world):
    """Bytes of one training step per rank with DDP, ZeRO-1 and FSDP, every parameter trainable."""
    batch, out = [_local(0, rank, world)], {}
    ddp = DDP(_model(0))
    with _counting(world) as out["ddp"]:
        train_step(ddp, AdamW(ddp.parameters(), lr=1e-2), batch)
    model = _model(0)
    opt = ShardedOptimizer(model.parameters(), AdamW, lr=1e-2)
    with _counting(world) as out["zero1"]:
        train_step(model, opt, batch)
    fsdp = FSDP(_model(0))
    with _counting(world) as out["fsdp"]:
        train_step(fsdp, AdamW(fsdp.parameters(), lr=1e-2), batch)
    out["params"] = sum(p.numel() for p in model.parameters())
    out["fsdp_gathered"] = [s.full.numel() for s in fsdp.sharded.values()]  # per module using a matrix
    out["fsdp_replicated"] = sum(p.numel() for p in fsdp.replicated)
    return out


class _Branches(torch.nn.Module):
    """``head(tanh(a x) + b x)``, or ``head(tanh(a x))`` when ``b`` is not used."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a, self.b, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def forward(self, x, use_b):
        h = torch.tanh(self.a(x))
        return self.head(h + self.b(x) if use_b else h)


def _uses_b(step, rank):
    """b is used by every rank at steps 0 and 3, by rank 0 only at step 1, by none at step 2."""
    return step in (0, 3) or (step == 1 and rank == 0)


def _unused(rank, world, **ddp_kwargs):
    """Ours with find_unused_parameters=True against torch's, one bucket per parameter, b unused on some
    ranks or on all; then ours without it, b unused everywhere."""
    gen = torch.Generator().manual_seed(9)
    data = [(torch.randn(8, 4, generator=gen).chunk(world)[rank], torch.randn(8, 1, generator=gen).chunk(world)[rank])
            for _ in range(4)]
    ours = DDP(_Branches(), bucket_size_mb=1e-5, **ddp_kwargs)
    theirs = torch.nn.parallel.DistributedDataParallel(_Branches(), find_unused_parameters=True)
    opts = [AdamW(m.parameters(), lr=1e-2) for m in (ours, theirs)]
    diffs = []
    for step, (x, y) in enumerate(data):
        for model, opt in zip((ours, theirs), opts):
            F.mse_loss(model(x, _uses_b(step, rank)), y).backward()
            if model is ours:
                ours.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
        diffs.append(_max_diff(dict(ours.module.named_parameters()), dict(theirs.module.named_parameters())))
    strict = DDP(_Branches(), bucket_size_mb=1e-5)
    F.mse_loss(strict(*data[0][:1], False), data[0][1]).backward()
    try:
        strict.finish_gradient_synchronization()
        error = ""
    except RuntimeError as e:
        error = str(e)
    F.mse_loss(strict(data[0][0], True), data[0][1]).backward()  # the group still works after the error
    strict.finish_gradient_synchronization()
    return {"unused_vs_torch": diffs, "unused_strict_error": error}


def _fp16_overflow(rank, world):
    """fp16 with a loss scaler under DDP; the last rank's logits become infinite at step 1 (a forward overflow
    on that rank only). SGD: Adam would turn fp16's rounding of near-zero gradients into steps of +-lr."""
    model = _model(0)
    ddp, scaler = DDP(model), LossScaler()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    poisoned = [False]
    model.register_forward_hook(lambda m, args, out: out * math.inf if poisoned[0] else None)
    steps = []
    for step in range(3):
        before = [p.detach().clone() for p in model.parameters()]
        poisoned[0] = step == 1 and rank == world - 1
        result = train_step(ddp, opt, [_local(step, rank, world)], precision="fp16", scaler=scaler)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        steps.append((bool(result.skipped), scaler.get_scale(), unchanged))
    return {"fp16_steps": steps, "fp16_weights": {k: v.detach() for k, v in model.named_parameters()}}


def _fsdp_reduce_dtype(rank, world):
    """bf16 compute on Linear layers only (autocast casts their weights to bf16 as FSDP's gather does): the
    weight gradients FSDP reduce-scatters, against every rank's own bf16-autocast gradient averaged in
    float32; relative error with ``reduce_dtype`` float32 and with the default (bf16)."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(world * 4, 16, generator=torch.Generator().manual_seed(4)).chunk(world)[rank]
    single = copy.deepcopy(net)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        single(x).float().pow(2).mean().backward()
    errors = []
    for reduce_dtype in (torch.float32, None):
        fsdp = FSDP(copy.deepcopy(net), compute_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        fsdp(x).float().pow(2).mean().backward()
        worst = 0.0
        for path, sharded in fsdp.sharded.items():
            reference = single.get_submodule(path).weight.grad.clone()
            dist.all_reduce(reference)
            flat = F.pad(reference.flatten() / world, (0, sharded.full.numel() - sharded.numel))
            mine = flat.chunk(world)[rank]
            worst = max(worst, ((sharded.shard.grad - mine).abs().max() / mine.abs().max()).item())
        errors.append(worst)
    return {"fsdp_reduce_fp32_error": errors[0], "fsdp_reduce_bf16_error": errors[1]}


def _scenarios(rank, world, with_torch_oracles):
    reference = _reference()
    ddp_weights, out = _ddp(rank, world, reference)
    out.update(**_zero1(rank, world, reference), **_fsdp(rank, world, reference))
    out.update(communication=_communication(rank, world), **_unused(rank, world, find_unused_parameters=True),
               **_fp16_overflow(rank, world))
    if with_torch_oracles:
        out["ddp_vs_torch_ddp"] = _torch_ddp(rank, world, ddp_weights)
        out["fsdp_vs_torch_fully_shard"] = _torch_fully_shard(rank, world)
        out.update(**_fsdp_bf16(rank, world), **_fsdp_reduce_dtype(rank, world))
    return out


@pytest.fixture(scope="module", params=[2, 4])
def results(request):
    return request.param, run_distributed(_scenarios, request.param, request.param == 2)


def test_ddp_equals_one_process_on_the_concatenated_batches(results):
    world, ranks = results
    for r in ranks:
        assert r["ddp_buckets"] > 3  # the tiny bucket size really splits the gradients
        assert r["ddp_vs_single"] < 5e-5
        assert r["ddp_frozen_unchanged"] and r["ddp_launched_in_backward"]


def _torch_oracles(results):
    if results[0] != 2:
        pytest.skip("torch's oracles run with 2 processes only (test time)")
    return results[1]


def test_ddp_equals_torch_distributed_data_parallel(results):
    for r in _torch_oracles(results):
        assert r["ddp_vs_torch_ddp"] < 5e-5


def test_zero1_equals_one_process_and_divides_the_optimizer_state(results):
    world, ranks = results
    for r in ranks:
        assert r["zero1_vs_single"] < 5e-5
        assert r["zero1_state_bytes"] == r["zero1_expected_state_bytes"]


def test_fsdp_equals_one_process_and_divides_the_matrices(results):
    world, ranks = results
    for r in ranks:
        assert r["fsdp_vs_single"] < 5e-5 and r["fsdp_names"]  # gather_full_params has state_dict's keys
        # every Linear and the (tied) embeddings are sharded; the shards hold 1/N of the matrices
        assert "tok_emb" in r["fsdp_sharded_modules"] and "lm_head" in r["fsdp_sharded_modules"]
        assert "blocks.1.ffn.w2" in r["fsdp_sharded_modules"]
        padding = 4 * len(r["fsdp_sharded_modules"])  # at most world - 1 float32 zeros per matrix, /world
        assert 0 <= r["fsdp_bytes"]["shards"] - r["matrix_bytes"] / world <= padding
        assert r["fsdp_bytes"]["gathered"] == 0  # nothing left gathered after the step
        assert r["fsdp_gathered_in_w2"] == [r["w2_bytes"]] * STEPS


def test_fsdp_equals_torch_fully_shard(results):
    for r in _torch_oracles(results):
        assert r["fsdp_vs_torch_fully_shard"] < 5e-5


def test_fsdp_with_bf16_compute_keeps_fp32_master_shards(results):
    for r in _torch_oracles(results):
        assert r["fsdp_bf16_master_dtypes"] == ["torch.float32"]
        assert r["fsdp_bf16_vs_single_bf16"] < 1e-2  # bf16 has 8 bits of mantissa; ranks sum in another order


def test_fsdp_can_reduce_its_bf16_gradients_in_float32(results):
    for r in _torch_oracles(results):
        assert r["fsdp_reduce_fp32_error"] < 1e-6  # the float32 sum of the ranks' bf16 gradients
        assert r["fsdp_reduce_bf16_error"] > 1e-4  # the default rounds the sum to bf16's 8 bits


def test_zero1_moves_the_bytes_of_ddp(results):
    """The paper's accounting: DDP all-reduces the gradients, 2(N-1)/N of them per rank; ZeRO-1
    reduce-scatters them and all-gathers the weights, the same; FSDP gathers each matrix twice (forward and
    backward) and reduce-scatters its gradient, 3(N-1)/N, and all-reduces the rest."""
    world, ranks = results
    ring = lambda elements, op: ring_bytes_sent(4 * elements, world, op)  # noqa: E731  float32
    for r in ranks:
        c = r["communication"]
        assert r["communication"]["params"] % world == 0  # no padding: exact equality
        assert c["ddp"]["bytes"] == ring(c["params"], "all_reduce")
        assert c["zero1"]["bytes"] == c["ddp"]["bytes"] and c["zero1"]["calls"] == 2  # one group, one of each
        assert c["fsdp"]["bytes"] == (sum(3 * ring(n, "all_gather") for n in c["fsdp_gathered"])
                                      + ring(c["fsdp_replicated"], "all_reduce"))


def test_ddp_with_unused_parameters_equals_torch_ddp_and_raises_without_the_flag(results):
    world, ranks = results
    for r in ranks:
        assert max(r["unused_vs_torch"]) < 1e-6  # b used by all, by rank 0 only, by none, by all again
        assert "b.weight" in r["unused_strict_error"] and "find_unused_parameters=True" in r["unused_strict_error"]
        assert "a.weight" not in r["unused_strict_error"]


def _unused_on_rank_1_only(rank, world, error_dir):
    ddp = DDP(_Branches(), bucket_size_mb=1e-5)
    F.mse_loss(ddp(torch.ones(2, 4), rank == 0), torch.zeros(2, 1)).backward()
    try:
        ddp.finish_gradient_synchronization()
    except RuntimeError as e:
        (error_dir / f"rank{rank}.txt").write_text(str(e))
        raise


def test_ddp_without_the_flag_raises_when_a_parameter_is_unused_on_one_rank_only(tmp_path):
    """That rank raises, naming the parameter; the other waits in its all-reduce until the launcher stops it
    (torch's DDP errors the same way), instead of all ranks going on with wrong gradients."""
    with pytest.raises(Exception):  # rank 1's error, or rank 0's once rank 1 has left the group
        run_distributed(_unused_on_rank_1_only, 2, tmp_path)
    error = (tmp_path / "rank1.txt").read_text()
    assert "b.weight" in error and "a.weight" not in error and "find_unused_parameters=True" in error


def _grad_scaler_reference(steps=3, overflow_step=1):
    """One process, the whole batch, torch.amp.GradScaler; the logits infinite at ``overflow_step``."""
    model = _model(0)
    opt, scaler = torch.optim.SGD(model.parameters(), lr=0.5), torch.amp.GradScaler("cpu")
    scales = []
    for step in range(steps):
        x, y = _batches(step)
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(x)
        logits = logits.float() * (math.inf if step == overflow_step else 1.0)
        scaler.scale(F.cross_entropy(logits.flatten(0, 1), y.flatten())).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return scales, {k: v.detach() for k, v in model.named_parameters()}


def test_fp16_overflow_on_one_rank_is_skipped_by_every_rank_like_grad_scaler(results):
    world, ranks = results
    scales, weights = _grad_scaler_reference()
    for r in ranks:  # every rank skipped step 1 only, kept its weights there and backed off as torch does
        assert [s[0] for s in r["fp16_steps"]] == [False, True, False]
        assert [s[1] for s in r["fp16_steps"]] == scales == [2.0**16, 2.0**15, 2.0**15]
        assert [s[2] for s in r["fp16_steps"]] == [False, True, False]
        assert _max_diff(r["fp16_weights"], ranks[0]["fp16_weights"]) == 0
        assert _max_diff(r["fp16_weights"], weights) < 2e-4  # fp16 sums in another order


def test_wrappers_need_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DDP(_model(0))


@pytest.mark.parametrize("p,m", [(4, 8), (3, 1), (1, 5)])
def test_simulated_pipeline_schedules_have_the_bubble_of_the_formula(p, m):
    gpipe, one_f_one_b = pipeline_schedule(p, m, "gpipe"), pipeline_schedule(p, m, "1f1b")
    for schedule in (gpipe, one_f_one_b):
        assert schedule.bubble == pytest.approx(bubble_fraction(p, m))
        assert schedule.makespan == pytest.approx((m + p - 1) * 3.0)
    assert gpipe.peak_in_flight == [m] * p
    assert one_f_one_b.peak_in_flight == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("world,n", [(2, 6), (3, 7), (4, 4), (5, 3)])
def test_ring_simulation_reduces_to_the_sum_and_each_rank_owns_its_chunk(world, n):
    from llmarch.parallel.ring import chunk_slices, ring_all_reduce, ring_reduce_scatter

    x = np.random.default_rng(world).normal(size=(world, n))
    np.testing.assert_allclose(ring_all_reduce(x), np.broadcast_to(x.sum(0), x.shape), rtol=1e-12, atol=1e-12)
    scattered = ring_reduce_scatter(x)
    for r, owned in enumerate(chunk_slices(n, world)[1:] + chunk_slices(n, world)[:1]):
        np.testing.assert_allclose(scattered[r, owned], x[:, owned].sum(0), rtol=1e-12, atol=1e-12)


def test_ring_bytes_sent():
    from llmarch.parallel.ring import ring_bytes_sent

    assert ring_bytes_sent(1000, 4, "all_reduce") == 1500 and ring_bytes_sent(1000, 4, "all_gather") == 750
    assert ring_bytes_sent(1000, 1, "reduce_scatter") == 0


def test_every_collective_buffer_lives_on_the_models_device():
    """The GPU code path proved on the CPU: the model on the meta device (shapes, no data), a fake process
    group of 2 ranks, and the device of every tensor handed to a collective recorded, for DDP, ZeRO-1, FSDP
    (forward, backward, synchronisation, clipping, gathering the full weights) and the loss scaler.
    A buffer made on the CPU by default (``torch.zeros(())``, ``torch.empty(n)``) would show up as ``cpu``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    devices = []
    originals = {name: getattr(dist, name) for name in _RING_OP}

    def recorded(name):
        def collective(*args, **kwargs):
            devices.extend((name, t.device.type) for t in args[:2] if isinstance(t, torch.Tensor))
            return originals[name](*args, **kwargs)
        return collective

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        for name in _RING_OP:
            setattr(dist, name, recorded(name))
        with torch.device("meta"):
            models = [_model(0) for _ in range(3)]
            x, y = torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (2, 8))
        loss = lambda m: F.cross_entropy(m(x).flatten(0, 1), y.flatten())  # noqa: E731
        ddp = DDP(models[0])
        loss(ddp).backward()
        ddp.finish_gradient_synchronization()
        zero1 = ShardedOptimizer(models[1].parameters(), AdamW, lr=1e-2)
        loss(models[1]).backward()
        zero1.finish_gradient_synchronization()
        zero1.clip_grad_norm(1.0)
        zero1.step()
        fsdp = FSDP(models[2])  # no autocast on meta
        loss(fsdp).backward()
        fsdp.finish_gradient_synchronization()
        fsdp.clip_grad_norm(1.0)
        assert all(t.device.type == "meta" for t in fsdp.gather_full_params().values())
        with pytest.raises(RuntimeError, match="meta"):  # the flag is reduced on the device; reading it ends meta
            LossScaler().unscale_(zero1)
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        dist.destroy_process_group()
    assert {op for op, _ in devices} == set(_RING_OP)  # every kind of collective was seen
    assert [d for d in devices if d[1] != "meta"] == []


def test_ring_collectives_accept_lists_and_name_a_bad_shape():
    from llmarch.parallel.ring import ring_all_reduce, ring_reduce_scatter

    rows = [[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]]
    np.testing.assert_array_equal(ring_all_reduce(rows), [[11.0, 22.0, 33.0]] * 2)
    np.testing.assert_array_equal(ring_reduce_scatter(rows), ring_reduce_scatter(np.array(rows)))
    with pytest.raises(ValueError, match=r"shape \(N, n\)"):
        ring_all_reduce([1.0, 2.0])
