"""Command line of the grader.

    python -m autograder generate [ASSIGNMENT ...]          release notebooks: solutions/ -> exercises/ (nbgrader)
    python -m autograder grade ASSIGNMENT SUBMISSIONS_DIR --out OUT_DIR [--workers N] [--timeout SECONDS]
                               [--notebook-timeout SECONDS] [--memory MB] [--seed N] [--unsafe-no-sandbox]
                               [--only NAME ... | --retry-failed] [--gradebook PATH] [--scheduler ADDRESS]

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


def _select(args, submissions: dict, existing: dict) -> dict:
    """The submissions this run grades: all, ``--only`` names, or ``--retry-failed`` (no finished row yet)."""
    from autograder.results import FINISHED, csv_safe

    if args.only:
        unknown = [name for name in args.only if name not in submissions]
        if unknown:
            raise SystemExit(f"--only: no submission named {', '.join(map(repr, unknown))} in {args.submissions}")
        return {name: submissions[name] for name in args.only}
    if args.retry_failed:
        return {name: sub for name, sub in submissions.items()
                if existing.get(csv_safe(name), {}).get("status") not in FINISHED}
    return submissions


def grade(args) -> int:
    from autograder.feedback import write_feedback
    from autograder.grade import Options, grade_all, release_template
    from autograder.intake import find_submissions
    from autograder.report import write_report
    from autograder.results import merge, prepare_output_dir, read_rows, write_rows
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
    submissions, warnings = find_submissions(Path(args.submissions), notebook, exclude=out)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    prepare_output_dir(out, args.assignment, template)
    existing = read_rows(out / "grades.csv")
    selected = _select(args, submissions, existing)
    options = Options(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout, memory_mb=args.memory,
                      seed=args.seed, unsafe_no_sandbox=args.unsafe_no_sandbox)
    started = time.monotonic()
    results = grade_all(args.assignment, selected, options, args.workers, _progress, scheduler=args.scheduler)
    rows = merge(existing, results, template)
    write_rows(rows, template, out / "grades.csv")
    auto_max = sum(i.points for i in template.auto_items)
    for result in results:
        try:
            write_feedback(result, args.assignment, notebook, auto_max, out)
        except Exception as err:  # noqa: BLE001 - one page that cannot be written must not lose the others
            print(f"warning: could not write the feedback of {result.student!r}: {err}", file=sys.stderr)
    if args.gradebook:
        from autograder.grade import release_notebook
        from autograder.gradebook import record

        record(Path(args.gradebook), args.assignment, notebook, template, results, release_notebook(args.assignment))
    write_report(rows, template, args.assignment, out / "report.html")
    elapsed = time.monotonic() - started
    print(f"\n{'student':<24} {'status':<17} {'tampered':<9} score")
    for r in results:
        print(f"{r.student[:24]:<24} {r.status:<17} {'yes' if r.tampered else 'no':<9} {r.score:g} / {auto_max:g}")
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    kept = len(rows) - len(results)
    print(f"\n{len(results)} submissions graded in {elapsed:.1f} s ({summary or 'none'})"
          + (f"; {kept} earlier results kept" if kept else "")
          + f"; wrote {out / 'grades.csv'}, {out / 'report.html'} and {out / 'feedback'}/")
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
    again = gr.add_mutually_exclusive_group()
    again.add_argument("--only", action="append", metavar="NAME",
                       help="grade only this student (repeatable); the other rows are kept")
    again.add_argument("--retry-failed", action="store_true",
                       help="grade only the students whose status is not graded or tampered (or who have no row)")
    gr.add_argument("--gradebook", metavar="PATH",
                    help="also record every submission in this nbgrader gradebook database (sqlite file)")
    gr.add_argument("--scheduler", metavar="ADDRESS",
                    help="run phase 1 on the workers of this Dask cluster (e.g. tcp://10.0.0.5:8786)")
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(args.assignments)
        return 0
    return grade(args)


if __name__ == "__main__":
    sys.exit(main())
