"""benchmarks/bench_attention_gpu.py on a machine without CUDA: it says so and exits 0; its FLOP count is the
standard one (two matmuls, counted here multiply-add by multiply-add)."""

import importlib.util
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_attention_gpu.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_attention_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # module level imports only torch and the standard library
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would benchmark")
def test_script_without_cuda_prints_one_line_and_exits_0(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    csv_path = tmp_path / "out.csv"
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--csv", str(csv_path)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "skipped" in lines[0], result.stdout
    assert not csv_path.exists()  # nothing measured, nothing written (the book's data file is left alone)


def test_flop_count_is_two_matmuls_of_multiply_adds():
    bench = _load()
    B, H, T, d = 2, 3, 5, 4
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, d, generator=gen, dtype=torch.float64) for _ in range(3))
    out = torch.zeros(B, H, T, d, dtype=torch.float64)
    mults = 0
    for b, h, i in itertools.product(range(B), range(H), range(T)):
        s = torch.zeros(T, dtype=torch.float64)
        for j, c in itertools.product(range(T), range(d)):  # S = Q K^T
            s[j] += q[b, h, i, c] * k[b, h, j, c]
            mults += 1
        p = torch.softmax(s / d**0.5, 0)
        for c, j in itertools.product(range(d), range(T)):  # O = P V
            out[b, h, i, c] += p[j] * v[b, h, j, c]
            mults += 1
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert bench.attention_flops(B, H, T, d) == 2 * mults == 4 * B * H * T * T * d
    assert bench.attention_flops(B, H, T, d, causal=True) == 2 * B * H * T * T * d  # halved, the convention
    assert bench.attention_flops(B, H, T, d, pass_="forward+backward") == 3.5 * 4 * B * H * T * T * d
