"""``python -m llmarch.train`` through its real command line: ``--nproc 2`` and the torchrun form that also
runs on several nodes (here one), each giving the loss curve of a single process on the same batches."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torch

from llmarch.parallel.spawn import free_port
from llmarch.train import launch
from llmarch.train.launch import parse_args, train_gpt

COMMON = ["--steps", "3", "--warmup", "1", "--tokens", "20000", "--global-batch", "4", "--context", "16",
          "--d-model", "32", "--layers", "1", "--heads", "2"]


def _curve(path):
    with open(path) as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def _run(command, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def single_process_curve(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    return [row["loss"] for row in train_gpt(0, 1, parse_args([*COMMON, "--out", str(out)]))]


def test_nproc_2_with_fsdp_gives_the_single_process_curve(tmp_path, single_process_curve):
    done = _run([sys.executable, "-m", "llmarch.train", "--nproc", "2", "--strategy", "fsdp", *COMMON,
                 "--out", str(tmp_path)], tmp_path)
    assert "wrote" in done.stdout
    assert _curve(tmp_path / "losses.csv") == pytest.approx(single_process_curve, rel=1e-4)


def test_torchrun_form_runs_ddp_on_one_node(tmp_path, single_process_curve):
    torchrun = Path(sys.executable).with_name("torchrun")
    _run([str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
          "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "-m", "llmarch.train", "--strategy", "ddp", *COMMON,
          "--out", str(tmp_path)], tmp_path)
    assert _curve(tmp_path / "losses.csv") == pytest.approx(single_process_curve, rel=1e-4)
    assert (tmp_path / "step-000003" / "rank0.pt").exists()  # the end of the run, replicated state: one file


def test_command_line_errors_are_clear():
    with pytest.raises(SystemExit):
        parse_args(["--global-batch", "6", "--micro-batches", "4"])
    with pytest.raises(SystemExit):
        parse_args(["--checkpoint-every", "2"])  # where to? needs --out


class _Stop(Exception):
    pass


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two CUDA GPUs as torch would report them, ``set_device`` and the process group recorded (no GPU here)."""
    calls = {"set_device": [], "backend": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls["set_device"].append(d))

    def init_process_group(backend, *args, **kwargs):
        calls["backend"].append(backend)
        raise _Stop  # the real group would need the GPUs

    monkeypatch.setattr(launch.dist, "init_process_group", init_process_group)
    return calls


def test_torchrun_on_gpus_takes_nccl_and_the_gpu_of_local_rank(fake_gpus, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(_Stop):
        launch.main(["--strategy", "ddp", *COMMON])
    assert fake_gpus == {"set_device": [1], "backend": ["nccl"]}  # set before the group is made


def test_nproc_uses_nccl_with_a_gpu_per_process_and_gloo_otherwise(fake_gpus, monkeypatch):
    backends = []
    monkeypatch.setattr(launch, "run_distributed", lambda fn, n, args, backend, threads: backends.append(backend)
                        or [[{"loss": 0.0}]])
    for nproc, device in [(2, "auto"), (3, "auto"), (2, "cpu")]:
        launch.main(["--nproc", str(nproc), "--strategy", "ddp", "--device", device, *COMMON])
    assert backends == ["nccl", "gloo", "gloo"]  # 3 processes on 2 GPUs: the CPU
    with pytest.raises(SystemExit, match="a GPU per process"):
        launch.main(["--nproc", "3", "--strategy", "ddp", "--device", "cuda", *COMMON])


def test_run_distributed_puts_rank_r_on_gpu_r_under_nccl(fake_gpus, monkeypatch):
    from llmarch.parallel import spawn

    monkeypatch.setenv("MASTER_ADDR", "")  # restored afterwards: the entry point sets both
    monkeypatch.setenv("MASTER_PORT", "")
    with pytest.raises(_Stop):
        spawn._entry(1, None, 2, 0, "nccl", torch.get_num_threads(), "unused", ())
    assert fake_gpus == {"set_device": [1], "backend": ["nccl"]}


@pytest.mark.cuda
@pytest.mark.parametrize("nproc", [1, 2])
def test_torchrun_with_nccl_on_gpus_gives_the_single_process_curve(tmp_path, nproc):
    """The real GPU path (``make test-gpu``): torchrun, NCCL, each process on GPU LOCAL_RANK, every strategy,
    against one process on GPU 0; in fp16 with an overflow injected on the last rank at step 1, too."""
    if torch.cuda.device_count() < nproc:
        pytest.skip(f"{nproc} processes need {nproc} GPUs, this machine has {torch.cuda.device_count()}")
    torchrun = Path(sys.executable).with_name("torchrun")
    for precision in ("fp32", "fp16"):
        extra = ["--device", "cuda", "--precision", precision] + (["--inject-overflow", "1"] * (precision == "fp16"))
        single = train_gpt(0, 1, parse_args([*COMMON, *extra]))
        for strategy in ("ddp", "zero1", "fsdp"):
            out = tmp_path / f"{precision}-{strategy}"
            _run([str(torchrun), "--standalone", "--nproc-per-node", str(nproc), "-m", "llmarch.train",
                  "--strategy", strategy, *COMMON, *extra, "--out", str(out)], tmp_path)
            with open(out / "losses.csv") as f:
                rows = list(csv.DictReader(f))
            assert [row["skipped"] != "" for row in rows] == [precision == "fp16" and s == 1 for s in range(3)]
            losses = [float(row["loss"]) for row in rows]
            expected = [row["loss"] for row in single]
            if precision == "fp16":  # the overflow step's loss is NaN on both sides
                losses, expected = losses[:1] + losses[2:], expected[:1] + expected[2:]
            assert losses == pytest.approx(expected, rel=1e-3 if precision == "fp32" else 1e-2), strategy
