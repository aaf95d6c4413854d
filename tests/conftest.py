"""Tests marked ``cuda`` are skipped, with a reason, where torch sees no CUDA GPU (the marker alone does that;
a test may still add its own ``skipif`` for other needs, such as triton)."""

import pytest


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
