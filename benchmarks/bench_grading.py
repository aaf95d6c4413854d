"""Grading throughput: our sandboxed, parallel grader vs plain `nbgrader autograde`, same submissions, one run.

    python benchmarks/bench_grading.py [--submissions 40] [--dask]

The submissions are copies of the gradable demo submissions in autograder/demo/ (a full solution, a partial
one, an untouched release, one with an edited test cell). Plain nbgrader grades them one after the other in
one process with no isolation; ours runs each in a bubblewrap sandbox, two phases, on all cores. With --dask,
ours also grades the same batch on a two-worker Dask cluster (LocalCluster: two worker processes, one task each).
Prints seconds per submission for each and the ratio; the target is ours >= 4x plain nbgrader on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = "ps1-attention"
NOTEBOOK = "ps1-attention.ipynb"
DEMO_STUDENTS = ("alice", "bob", "carol", "erin")


def make_submissions(folder: Path, count: int) -> list[str]:
    names = []
    for i in range(count):
        demo = DEMO_STUDENTS[i % len(DEMO_STUDENTS)]
        name = f"student{i:03d}-{demo}"
        (folder / name).mkdir(parents=True)
        shutil.copy(ROOT / "autograder" / "demo" / demo / NOTEBOOK, folder / name / NOTEBOOK)
        names.append(name)
    return names


def time_ours(subs: Path, out: Path, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", ASSIGNMENT, str(subs), "--out", str(out),
                    "--workers", str(os.cpu_count()), *extra], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_ours_on_dask(subs: Path, out: Path) -> float:
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        return time_ours(subs, out, "--scheduler", cluster.scheduler_address)


def time_plain_nbgrader(course: Path, subs: Path, names: list[str]) -> float:
    (course / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "solutions" / ASSIGNMENT, course / "source" / ASSIGNMENT)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.course_id = 'bench'\nc.ExecutePreprocessor.timeout = 60\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    nbgrader = [sys.executable, "-m", "nbgrader"]
    subprocess.run([*nbgrader, "generate_assignment", ASSIGNMENT], cwd=course, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for name in names:
        target = course / "submitted" / name / ASSIGNMENT
        target.mkdir(parents=True)
        shutil.copy(subs / name / NOTEBOOK, target / NOTEBOOK)
    start = time.perf_counter()
    subprocess.run([*nbgrader, "autograde", ASSIGNMENT], cwd=course, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=40)
    parser.add_argument("--dask", action="store_true", help="also grade the batch on a two-worker Dask cluster")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        names = make_submissions(tmp / "subs", args.submissions)
        ours = time_ours(tmp / "subs", tmp / "out")
        on_dask = time_ours_on_dask(tmp / "subs", tmp / "out-dask") if args.dask else None
        plain = time_plain_nbgrader(tmp / "course", tmp / "subs", names)
    n = args.submissions
    print(f"{n} submissions, {os.cpu_count()} cores")
    print(f"plain nbgrader autograde (1 process, no sandbox): {plain:7.1f} s  {plain / n:.3f} s per submission")
    print(f"llmarch autograder (sandboxed, {os.cpu_count()} workers):   {ours:7.1f} s  {ours / n:.3f} s per submission")
    if on_dask is not None:
        print(f"llmarch autograder on a 2-worker Dask cluster:    {on_dask:7.1f} s  {on_dask / n:.3f} s per submission")
    print(f"throughput ratio ours / plain nbgrader: {plain / ours:.2f}x (target >= 4x)")


if __name__ == "__main__":
    main()
