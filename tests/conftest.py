"""Shared test set-up.

Without a GPU, ``TRITON_INTERPRET=1`` is set for the whole session (see below). Tests marked ``cuda`` are
skipped, with a reason, where torch sees no CUDA GPU (the marker alone does that;
a test may still add its own ``skipif`` for other needs, such as triton). ``dask_cluster`` is a real Dask
cluster on loopback, used by the grader's and the web-data pipeline's ``--scheduler`` tests."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Without a CUDA GPU, triton's kernels run only in its interpreter, and triton reads TRITON_INTERPRET once, when it
# is first imported: by a kernel test, or by torch.utils.flop_counter in any other test. So the variable is set
# here, before any test module is collected, unless the caller chose; with a GPU the kernels are compiled.
if "TRITON_INTERPRET" not in os.environ and not any(Path("/dev").glob("nvidia[0-9]*")):
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    import torch  # only when a cuda-marked test was collected

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked cuda: needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in cuda_items:
        item.add_marker(skip)


@pytest.fixture
def dask_cluster(tmp_path):
    """A real cluster on loopback: `dask scheduler` and two `dask worker` processes (one task at a time each)."""
    dask = Path(sys.executable).with_name("dask")
    scheduler_file = tmp_path / "scheduler.json"
    common = ["--no-dashboard"]
    processes = [subprocess.Popen([str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                   "--scheduler-file", str(scheduler_file), *common],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        for _ in range(300):
            if scheduler_file.exists() and scheduler_file.stat().st_size:
                break
            time.sleep(0.1)
        for _ in range(2):
            processes.append(subprocess.Popen(
                [str(dask), "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "1", "--nthreads", "1",
                 "--host", "127.0.0.1", *common], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
        address = json.loads(scheduler_file.read_text())["address"]
        from dask.distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
