"""Noisy neighbours: how much slower an honest submission is graded beside one that keeps every core busy.

    python benchmarks/bench_grading_neighbours.py [--repeats 3] [--notebook-timeout 20]

Grades two copies of an honest ps6-scaling submission (the instructor's solutions) through the real CLI,
`python -m autograder grade`: alone (--workers 1, one after the other), then beside a hostile submission
(--workers 2: the hog takes one worker, the honest copies go through the other). The hog is the same
notebook with a first cell that forks 50 processes, each in a session of its own, and spins with them
until the grader stops it at --notebook-timeout. The time compared is the second honest copy's own
grading (the `seconds` column of grades.csv), which lies wholly within the hog's run and, in both
settings, in a worker that already graded one submission. Each setting is repeated and the median kept.
Prints both times, the ratio and the target (<= 1.5x), which the sandbox's per-run CPU cgroup
(Limits.cpus, 1 core by default) is there to meet.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from submissions import submission, write  # noqa: E402  (the tests' builder of solved notebooks)

ASSIGNMENT = "ps6-scaling"
NOTEBOOK = "ps6-scaling.ipynb"
HOG_CELL = """\
import os
for _ in range(50):
    if os.fork() == 0:
        os.setsid()  # a session, hence a scheduler autogroup, of its own: a bigger share without cgroups
        break
while True:
    pass
"""
HONEST = ("honest1", "honest2")  # graded in this order; honest2 is timed


def make_submissions(folder: Path, with_hog: bool) -> None:
    for name in HONEST:
        write(submission(ASSIGNMENT, NOTEBOOK), folder / name, NOTEBOOK)
    if with_hog:
        hog = submission(ASSIGNMENT, NOTEBOOK)
        hog.cells.insert(0, nbformat.v4.new_code_cell(HOG_CELL))  # busy from the start of the notebook
        write(hog, folder / "hog", NOTEBOOK)


def grade(folder: Path, workers: int, notebook_timeout: float) -> dict[str, dict[str, str]]:
    """Grade every submission in `folder`; the rows of grades.csv by student."""
    out = folder.parent / f"{folder.name}-out"
    subprocess.run([sys.executable, "-m", "autograder", "grade", ASSIGNMENT, str(folder), "--out", str(out),
                    "--workers", str(workers), "--notebook-timeout", str(notebook_timeout)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    if "seconds" not in rows[HONEST[1]]:
        raise SystemExit("grades.csv has no `seconds` column (wall seconds of each submission's grading)")
    return rows


def honest_seconds(tmp: Path, with_hog: bool, repeats: int, notebook_timeout: float) -> float:
    times = []
    for i in range(repeats):
        folder = tmp / f"{'beside-hog' if with_hog else 'alone'}-{i}"
        make_submissions(folder, with_hog)
        rows = grade(folder, 2 if with_hog else 1, notebook_timeout)
        for name in HONEST:
            if rows[name]["status"] != "graded":
                raise SystemExit(f"an honest submission was not graded: {rows[name]}")
        if with_hog and i == 0:
            print(f"hog: {rows['hog']['status']} after {rows['hog']['seconds']} s ({rows['hog']['detail'][:150]})")
        times.append(float(rows[HONEST[1]]["seconds"]))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--notebook-timeout", type=float, default=20.0,
                        help="seconds per notebook: how long the hog runs (the honest one needs a few)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        alone = honest_seconds(Path(tmp), False, args.repeats, args.notebook_timeout)
        beside = honest_seconds(Path(tmp), True, args.repeats, args.notebook_timeout)
    print(f"{os.cpu_count()} cores, median of {args.repeats} runs each")
    print(f"honest {ASSIGNMENT} graded alone:                  {alone:6.2f} s")
    print(f"honest {ASSIGNMENT} graded beside a 50-process hog: {beside:6.2f} s")
    print(f"slowdown beside the hog: {beside / alone:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
