"""The assignments the grader knows, by name: each module has ``NOTEBOOK`` (the file students submit),
``CHECKS`` (grade_id -> trusted check) and ``TRUSTED_CALLABLES``; optionally ``FILES``, data files the release
ships beside the notebook, which the grader copies into every submission's folder, and ``GPU_BENCHMARK``, true
where the feedback reports the speed of the student's GPU kernels (``autograder/gpu_benchmark.py``)."""

import importlib

ASSIGNMENTS = {
    "ps1-attention": "autograder.assignments.ps1_attention",
    "ps2-positions": "autograder.assignments.ps2_positions",
    "ps3-tokenizers": "autograder.assignments.ps3_tokenizers",
    "ps4-decoding": "autograder.assignments.ps4_decoding",
    "ps5-efficient": "autograder.assignments.ps5_efficient",
    "ps6-scaling": "autograder.assignments.ps6_scaling",
    "ps7-modern": "autograder.assignments.ps7_modern",
    "ps8-objectives": "autograder.assignments.ps8_objectives",
    "ps9-data": "autograder.assignments.ps9_data",
    "ps10-parallel": "autograder.assignments.ps10_parallel",
    "ps11-train": "autograder.assignments.ps11_train",
    "ps12-flash": "autograder.assignments.ps12_flash",
}


def load(name: str):
    if name not in ASSIGNMENTS:
        raise SystemExit(f"unknown assignment {name!r}; known: {', '.join(sorted(ASSIGNMENTS))}")
    return importlib.import_module(ASSIGNMENTS[name])
