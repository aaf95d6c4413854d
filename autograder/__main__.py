"""Command line of the grader.

    python -m autograder generate [ASSIGNMENT ...]          release notebooks: solutions/ -> exercises/ (nbgrader)
    python -m autograder grade ASSIGNMENT SUBMISSIONS_DIR --out OUT_DIR [--workers N] [--timeout SECONDS]
                               [--memory MB] [--seed N] [--unsafe-no-sandbox]

The exit code is 0 when the grader itself worked, whatever the submissions did, and 3 when it failed on some
submission (status grader-error; every other submission is still graded and grades.csv is written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from autograder import assignments


def generate(names: list[str], release_dir: Path | None = None) -> None:
    """Run nbgrader's generate_assignment with the course configuration (autograder/nbgrader_config.py)."""
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(Path(__file__).parent)).load_config()
    if release_dir is not None:
        config.CourseDirectory.release_directory = str(release_dir)
    # The release needs no database: the grader reads graded cells and points from the release notebook.
    config.merge(Config({"GenerateAssignment": {"force": True, "no_database": True}, "SaveCells": {"enabled": False}}))
    for name in names or sorted(assignments.ASSIGNMENTS):
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = name
        GenerateAssignment(coursedir=coursedir, config=config).start()
        print(f"generated {name}")


def _progress(done: int, total: int, student: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    end = "\n" if done == total or not sys.stderr.isatty() else ""
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {student[:30]:<30}{end}")
    sys.stderr.flush()


def grade(args) -> int:
    from autograder.feedback import write_feedback
    from autograder.grade import Options, clean_output_dir, find_submissions, grade_all, release_template, write_csv
    from autograder.sandbox import bubblewrap_available

    template, notebook = release_template(args.assignment)
    if args.unsafe_no_sandbox:
        print("WARNING: --unsafe-no-sandbox: submissions run with your permissions, network and files. "
              "Use this only for code you trust.", file=sys.stderr)
    elif not bubblewrap_available():
        raise SystemExit("bubblewrap (bwrap) is not installed, so student code cannot be isolated; refusing to run it. "
                         "Install the Debian package `bubblewrap` (make setup does), or pass --unsafe-no-sandbox "
                         "if you trust every submission.")
    out = Path(args.out)
    submissions, warnings = find_submissions(Path(args.submissions), exclude=out)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    clean_output_dir(out)
    options = Options(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout, memory_mb=args.memory,
                      seed=args.seed, unsafe_no_sandbox=args.unsafe_no_sandbox)
    started = time.monotonic()
    results = grade_all(args.assignment, submissions, options, args.workers, _progress)
    max_score = sum(i.points for i in template.auto_items)
    write_csv(results, template, out / "grades.csv")
    for result in results:
        try:
            write_feedback(result, args.assignment, notebook, max_score, out)
        except Exception as err:  # noqa: BLE001 - one page that cannot be written must not lose the others
            print(f"warning: could not write the feedback of {result.student!r}: {err}", file=sys.stderr)
    elapsed = time.monotonic() - started
    print(f"\n{'student':<24} {'status':<17} {'tampered':<9} score")
    for r in results:
        print(f"{r.student[:24]:<24} {r.status:<17} {'yes' if r.tampered else 'no':<9} {r.score:g} / {max_score:g}")
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"\n{len(results)} submissions in {elapsed:.1f} s ({summary}); wrote {out / 'grades.csv'} and {out / 'feedback'}/")
    if counts.get("grader-error"):
        print(f"error: the grader failed on {counts['grader-error']} submission(s); see their detail column",
              file=sys.stderr)
        return 3
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="release notebooks from solutions/ into exercises/ with nbgrader")
    gen.add_argument("assignments", nargs="*")
    gr = sub.add_parser("grade", help="grade a folder of submissions")
    gr.add_argument("assignment")
    gr.add_argument("submissions", help="SUBMISSIONS_DIR/<student>/<notebook>.ipynb or SUBMISSIONS_DIR/<student>.zip")
    gr.add_argument("--out", required=True)
    gr.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    gr.add_argument("--timeout", type=float, default=60.0, help="seconds per cell (default 60)")
    gr.add_argument("--notebook-timeout", type=float, default=300.0, help="seconds per notebook (default 300)")
    gr.add_argument("--memory", type=int, default=2048, help="MB per submission (default 2048)")
    gr.add_argument("--seed", type=int, default=0, help="seed of the hidden inputs (default 0)")
    gr.add_argument("--unsafe-no-sandbox", action="store_true", help="run submissions without bubblewrap")
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(args.assignments)
        return 0
    return grade(args)


if __name__ == "__main__":
    sys.exit(main())
