"""Command line of the grader.

    python -m autograder generate [ASSIGNMENT ...]          release notebooks: solutions/ -> exercises/ (nbgrader)
    python -m autograder grade ASSIGNMENT [SUBMISSIONS_DIR --out OUT_DIR] [--course DIR] [--nbgrader-layout]
                               [--workers N] [--timeout SECONDS] [--notebook-timeout SECONDS] [--memory MB]
                               [--seed N] [--secret FILE] [--unsafe-no-sandbox] [--only NAME ... | --retry-failed]
                               [--gradebook PATH] [--roster CSV] [--due TIME] [--extensions CSV] [--late-penalty RATE]
                               [--late-cutoff DURATION] [--scheduler ADDRESS]
    python -m autograder course DIR --exchange DIR [--roster CSV] [--due ASSIGNMENT=TIME ...]
    python -m autograder export (--course DIR | --gradebook PATH) --to CSV [--canvas ROSTER_CSV [--rescale] |
                                --moodle] [--assignment NAME ...]

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


def _select(args, submissions: dict, existing: dict, pending: set[str], term) -> dict:
    """The submissions this run grades: all, ``--only`` names, or ``--retry-failed`` (no finished row yet, a
    row whose outputs a killed run was writing, or a submission the gradebook does not hold)."""
    from autograder.results import FINISHED, csv_safe

    if args.only:
        unknown = [name for name in args.only if name not in submissions]
        if unknown:
            raise SystemExit(f"--only: no submission named {', '.join(map(repr, unknown))} in {args.submissions}")
        return {name: submissions[name] for name in args.only}
    if args.retry_failed:
        return {name: sub for name, sub in submissions.items()
                if existing.get(csv_safe(name), {}).get("status") not in FINISHED or csv_safe(name) in pending
                or (term.recorded is not None and term.student_id(name) not in term.recorded)}
    return submissions


def _locations(args) -> tuple[Path, Path, Path | None]:
    """(submissions folder, output folder, gradebook) from the arguments; ``--course DIR`` gives
    ``DIR/submitted``, ``DIR/grader/<assignment>`` and ``DIR/gradebook.db`` where they are not named."""
    course = Path(args.course) if args.course else None
    if course is not None and not (course / "nbgrader_config.py").exists():
        raise SystemExit(f"--course {course} is not an nbgrader course folder (no nbgrader_config.py); "
                         "make one with `python -m autograder course DIR`")
    if course is not None:
        from autograder.nbgrader_guard import GUARD_LINES

        config = (course / "nbgrader_config.py").read_text(encoding="utf-8", errors="replace")
        lacking = [line for line in GUARD_LINES if line not in config]
        if lacking:
            print(f"warning: {course}/nbgrader_config.py lacks the course's guards: nbgrader's autograde could "
                  "overwrite these grades and its collect accepts a submission made in another student's name. "
                  "Add these lines (with the repository on sys.path):\n    " + "\n    ".join(GUARD_LINES),
                  file=sys.stderr)
    submissions = Path(args.submissions) if args.submissions else course / "submitted" if course else None
    out = Path(args.out) if args.out else course / "grader" / args.assignment if course else None
    if submissions is None or out is None:
        raise SystemExit("name the submissions folder and --out, or give --course DIR")
    gradebook = Path(args.gradebook) if args.gradebook else course / "gradebook.db" if course else None
    return submissions, out, gradebook


def grade(args) -> int:
    from autograder.grade import Options, SubmissionResult, _zero_items, grade_all, release_template
    from autograder.lateness import Policy, timing
    from autograder.results import prepare_output_dir, read_pending, read_rows
    from autograder.sandbox import bubblewrap_available
    from autograder.term import gather

    template, notebook = release_template(args.assignment)
    if args.unsafe_no_sandbox:
        print("WARNING: --unsafe-no-sandbox: submissions run with your permissions, network and files. "
              "Use this only for code you trust.", file=sys.stderr)
    elif not bubblewrap_available():
        raise SystemExit("bubblewrap (bwrap) is not installed, so student code cannot be isolated; refusing to run it. "
                         "Install the Debian package `bubblewrap` (make setup does), or pass --unsafe-no-sandbox "
                         "if you trust every submission.")
    folder, out, gradebook = _locations(args)
    args.submissions = str(folder)
    try:
        policy = Policy.parse(args.late_penalty, args.late_cutoff)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if gradebook is not None:
        from autograder.gradebook import check_writable

        check_writable(gradebook)  # before anyone is graded
    submissions, term, warnings = gather(folder, args.assignment, notebook, out, gradebook,
                                         Path(args.roster) if args.roster else None,
                                         Path(args.extensions) if args.extensions else None, args.due,
                                         args.nbgrader_layout)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    prepare_output_dir(out, args.assignment, template)
    from autograder import secret

    course_secret = secret.load_or_create(Path(args.secret) if args.secret else secret.default_path(out, gradebook))
    selected = _select(args, submissions, read_rows(out / "grades.csv"), read_pending(out), term)
    options = Options(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout, memory_mb=args.memory,
                      seed=args.seed, secret=course_secret, unsafe_no_sandbox=args.unsafe_no_sandbox)
    started = time.monotonic()
    results = grade_all(args.assignment, selected, options, args.workers, _progress, scheduler=args.scheduler)
    if not args.only:
        results += [SubmissionResult(s, "missing", f"no submission of {args.assignment}",
                                     _zero_items(template, "not submitted")) for s in term.absent]
    max_score = sum(i.points for i in template.items)
    timings = {r.student: timing(term.submitted_at.get(r.student), term.due, term.extensions.get(r.student),
                                 policy, max_score, r.student in term.late_flag, term.time_notes.get(r.student, ""))
               for r in results if r.student in submissions}
    from autograder.outputs import write_outputs

    rows = write_outputs(args.assignment, notebook, template, results, submissions, term, timings, out, gradebook)
    elapsed = time.monotonic() - started
    auto_max = sum(i.points for i in template.auto_items)
    manual_max = max_score - auto_max
    print(f"\n{'student':<24} {'status':<17} {'tampered':<9} automatic score"
          + (f" (written answers, {manual_max:g} points, are graded by hand)" if manual_max else ""))
    for r in results:
        print(f"{r.student[:24]:<24} {r.status:<17} {'yes' if r.tampered else 'no':<9} {r.score:g} / {auto_max:g}")
    counts = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    kept = len(rows) - len(results)
    print(f"\n{len(results)} students in {elapsed:.1f} s ({summary or 'none'})"
          + (f"; {kept} earlier results kept" if kept else "")
          + f"; wrote {out / 'grades.csv'}, {out / 'report.html'} and {out / 'feedback'}/"
          + (f"; recorded in {gradebook}" if gradebook else ""))
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
    gr.add_argument("submissions", nargs="?",
                    help="SUBMISSIONS_DIR/<student>/<notebook>.ipynb, SUBMISSIONS_DIR/<student>.zip, Canvas's "
                         "files, or nbgrader's submitted/<student>/<assignment>/ (default with --course)")
    gr.add_argument("--nbgrader-layout", action="store_true",
                    help="SUBMISSIONS_DIR is nbgrader's submitted/<student>/<assignment>/ (the default only inside "
                         "a course folder; otherwise every entry is read as one student's upload)")
    gr.add_argument("--out", help="the output folder (default with --course: COURSE/grader/ASSIGNMENT)")
    gr.add_argument("--course", metavar="DIR",
                    help="an nbgrader course folder: its submitted/, gradebook.db (roster, due date) and autograded/")
    gr.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    gr.add_argument("--timeout", type=float, default=60.0, help="seconds per cell (default 60)")
    gr.add_argument("--notebook-timeout", type=float, default=300.0, help="seconds per notebook (default 300)")
    gr.add_argument("--memory", type=int, default=2048, help="MB per submission (default 2048)")
    gr.add_argument("--seed", type=int, default=0,
                    help="mixed with the course's secret into the hidden inputs (default 0)")
    gr.add_argument("--secret", metavar="FILE",
                    help="the course's secret, made on first use (default: grader_secret beside the gradebook, else "
                         "in --out)")
    gr.add_argument("--unsafe-no-sandbox", action="store_true", help="run submissions without bubblewrap")
    again = gr.add_mutually_exclusive_group()
    again.add_argument("--only", action="append", metavar="NAME",
                       help="grade only this student (repeatable); the other rows are kept")
    again.add_argument("--retry-failed", action="store_true",
                       help="grade only the students whose status is not graded or tampered (or who have no row)")
    gr.add_argument("--gradebook", metavar="PATH",
                    help="also record every submission in this nbgrader gradebook database (sqlite file)")
    gr.add_argument("--roster", metavar="CSV",
                    help="every student of this roster gets a row (nbgrader's id,first_name,... or Canvas's export)")
    gr.add_argument("--due", metavar="TIME", help="due date, e.g. '2026-10-01 17:00 UTC' (default: the gradebook's)")
    gr.add_argument("--extensions", metavar="CSV", help="per-student extensions: student,assignment,hours")
    gr.add_argument("--late-penalty", default="none", metavar="RATE",
                    help="none (default), or a rate per started hour or day late: 10%%/day, 2%%/hour")
    gr.add_argument("--late-cutoff", metavar="DURATION", help="no points when later than this, e.g. 72h or 3d")
    gr.add_argument("--scheduler", metavar="ADDRESS",
                    help="run phase 1 on the workers of this Dask cluster (e.g. tcp://10.0.0.5:8786)")
    co = sub.add_parser("course", help="create or update an nbgrader course folder for a term")
    co.add_argument("folder")
    co.add_argument("--exchange", required=True, help="nbgrader's exchange folder, e.g. /srv/nbgrader/exchange")
    co.add_argument("--course-id", default="llmarch")
    co.add_argument("--roster", metavar="CSV", help="students: nbgrader's id,first_name,last_name,email or Canvas's export")
    co.add_argument("--due", action="append", default=[], metavar="ASSIGNMENT=TIME")
    co.add_argument("--assignment", action="append", default=[], help="only these assignments (repeatable)")
    ex = sub.add_parser("export", help="the term's grades, one row per student, for a learning-management system")
    ex.add_argument("--course", metavar="DIR", help="the course folder (its gradebook.db)")
    ex.add_argument("--gradebook", metavar="PATH")
    ex.add_argument("--to", required=True, metavar="CSV")
    form = ex.add_mutually_exclusive_group()
    form.add_argument("--canvas", metavar="ROSTER_CSV", help="Canvas's import format, from Canvas's gradebook export")
    form.add_argument("--moodle", action="store_true", help="Moodle's grade import format")
    ex.add_argument("--assignment", action="append", default=[], help="only this assignment (repeatable)")
    ex.add_argument("--rescale", action="store_true",
                    help="with --canvas: scale each assignment's points to Canvas's points possible")
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(args.assignments)
        return 0
    if args.command == "course":
        from autograder.course import build

        build(Path(args.folder), Path(args.exchange), args.course_id, Path(args.roster) if args.roster else None,
              args.due, args.assignment)
        return 0
    if args.command == "export":
        from autograder.export import export

        if not (args.gradebook or args.course):
            raise SystemExit("export: give --course DIR or --gradebook PATH")
        export(Path(args.gradebook) if args.gradebook else Path(args.course) / "gradebook.db", Path(args.to),
               Path(args.canvas) if args.canvas else None, args.moodle, args.assignment, args.rescale)
        return 0
    return grade(args)


if __name__ == "__main__":
    sys.exit(main())
