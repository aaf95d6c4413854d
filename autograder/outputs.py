"""Writing a run's outputs in an order that survives a kill, under a lock that keeps concurrent runs apart.

Into one ``--out`` folder, and into one gradebook, one run at a time (``results.locked``): the run first records whose outputs it is
about to write (``results.mark_pending``), then writes the feedback pages, the gradebook and the
``autograded/`` notebooks, then ``grades.csv`` (re-read under the lock and merged, so a concurrent run's rows
stay), then ``report.html``, and only then clears the record. A run killed anywhere in between leaves its
students listed as pending, and ``--retry-failed`` grades them again, so every output ends consistent.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from autograder.feedback import folder_name, write_feedback
from autograder.results import (LOCK, clear_pending, csv_safe, locked, mark_pending, merge, read_records,
                                read_rows, result_row, write_record, write_rows)


def _autograded(assignment: str, notebook: str, results, submissions) -> dict:
    """student -> the notebook for ``autograded/`` (``nbfeedback``), from the submission read again here."""
    from autograder.grade import release_notebook
    from autograder.intake import load
    from autograder.nbfeedback import autograded_notebook

    release = release_notebook(assignment)
    notebooks = {}
    for result in results:
        submission = submissions.get(result.student)
        data = load(submission, notebook).notebook if submission is not None else None
        notebooks[result.student] = autograded_notebook(release, data, result, assignment)
    return notebooks


def write_outputs(assignment: str, notebook: str, template, results, submissions: dict, term, timings: dict,
                  out: Path, gradebook: Path | None) -> dict[str, dict[str, str]]:
    """Feedback, records, gradebook, grades.csv and report.html of ``results``, in that order, under the
    output folder's lock. -> every row of grades.csv."""
    from autograder.report import write_report

    auto_max = sum(i.points for i in template.auto_items)
    with contextlib.ExitStack() as held:  # always the output folder first, then the gradebook: no deadlock
        held.enter_context(locked(out / LOCK))
        if gradebook is not None:
            held.enter_context(locked(gradebook.with_name(f".{gradebook.name}.lock")))
        mark_pending(out, [csv_safe(r.student) for r in results])
        for result in results:
            try:
                write_feedback(result, assignment, notebook, auto_max, out, timings.get(result.student))
            except Exception as err:  # noqa: BLE001 - one page that cannot be written must not lose the others
                print(f"warning: could not write the feedback of {result.student!r}: {err}", file=sys.stderr)
            write_record(out, folder_name(result.student), result)
        totals = {}
        if gradebook is not None:
            from autograder.grade import release_notebook
            from autograder.gradebook import manual_state, record

            record(gradebook, assignment, notebook, template, results, release_notebook(assignment), term,
                   timings, _autograded(assignment, notebook, results, submissions))
            totals = {csv_safe(i): state for i, state in manual_state(gradebook, assignment).items()}  # as rows
        rows = [result_row(r, template, term.student_id(r.student), timings.get(r.student),
                           term.lms_ids.get(r.student, "")) for r in results]
        merged = merge(read_rows(out / "grades.csv"), rows)
        for row in merged.values():
            if row["id"] in totals:
                row["manual_pending"] = f"{totals[row['id']][1]:g}"
        write_rows(merged, template, out / "grades.csv")
        write_report(merged, template, assignment, out / "report.html", read_records(out),
                     {student: total for student, (total, _) in totals.items()})
        clear_pending(out)
    return merged
