"""``python -m llmarch.train`` through its real command line: ``--nproc 2`` and the torchrun form that also
runs on several nodes (here one), each giving the loss curve of a single process on the same batches."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmarch.parallel.spawn import free_port
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
    assert (tmp_path / "checkpoint.pt").exists()


def test_command_line_errors_are_clear():
    with pytest.raises(SystemExit):
        parse_args(["--global-batch", "6", "--micro-batches", "4"])
