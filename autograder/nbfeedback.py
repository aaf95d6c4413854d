"""The autograded notebook: what formgrader shows for grading by hand, and what nbgrader's
``generate_feedback`` turns into the student's feedback page.

It is the student's own notebook as graded: the student's code and written answers in their cells (outputs
dropped: they were never run by the grader; the student's Markdown shown as its source, escaped, since
formgrader renders it in the instructor's Jupyter, where a live script could act as the instructor), read-only
cells restored from the release notebook (so no hidden test source, which the release does not hold), and under
each test cell, as that cell's output, its points
and the grader's message for its hidden cases (a stream output, which every renderer escapes). A first cell
gives the status and what the grader noted (exception messages and file names escaped, verbatim). The
release's nbgrader metadata is kept on every graded and answer cell, so formgrader and ``generate_feedback``
find the grades and comments in the gradebook.
"""

from __future__ import annotations

import copy
import html

import nbformat
from nbformat.v4 import new_markdown_cell, new_output

from autograder.feedback import STATUS_TEXT
from autograder.notebooks import InvalidNotebook, Template, _identify, parse_notebook

MAX_MESSAGE_CHARS = 2000


def _result_output(item) -> nbformat.NotebookNode:
    if item.points is None:
        text = f"Written answer, {item.max_points:g} points: graded by your instructor.\n"
    else:
        verdict = "passed" if item.points == item.max_points else "failed"
        text = (f"Hidden tests {verdict}: {item.points:g} / {item.max_points:g} points. "
                f"{item.message[:MAX_MESSAGE_CHARS]}\n")
    return new_output("stream", name="stdout", text=text)


def _verbatim(texts: list[str]) -> str:
    """Untrusted texts (the student's Markdown, exception messages, file names) as a Markdown cell may hold them: one
    HTML ``<pre>`` block with every text escaped, so no tag, link, style or Markdown in them is live wherever
    the notebook is rendered (formgrader, ``generate_feedback``'s page), and MathJax skips it."""
    return ("<pre style=\"white-space: pre-wrap\">" + "\n".join(html.escape(t, quote=True) for t in texts)
            + "</pre>")


def _status_cell(result, assignment: str) -> nbformat.NotebookNode:
    """The first cell: the status (the grader's own words) and, verbatim, the detail and notes."""
    lines = [f"**{html.escape(assignment)}: graded by the course's autograder.** Status: `{result.status}`. "
             f"{STATUS_TEXT[result.status]}"]
    untrusted = [result.detail] if result.detail else []
    untrusted += [f"- {note}" for note in result.tampering + result.notes + result.cell_errors[:5]]
    if untrusted:
        lines.append(_verbatim(untrusted))
    lines.append("Under each test cell: its points and what the hidden tests found.")
    return new_markdown_cell("\n\n".join(lines))


def _submitted_cells(submitted: bytes | None, template: Template) -> list[tuple[nbformat.NotebookNode, str | None]]:
    """The submission's cells with the release grade_id of each (None for the student's own), or nothing
    when the notebook cannot be read."""
    if submitted is None:
        return []
    try:
        nb = parse_notebook(submitted)
    except InvalidNotebook:
        return []
    return list(zip(nb.cells, _identify(nb, template)))


def autograded_notebook(release: nbformat.NotebookNode, submitted: bytes | None, result,
                        assignment: str) -> nbformat.NotebookNode:
    """The notebook of ``result`` (a ``grade.SubmissionResult``) for ``autograded/``: see the module's text."""
    template = Template.from_release(release)
    release_cells = {c.metadata["nbgrader"]["grade_id"]: c for c in release.cells
                     if c.metadata.get("nbgrader", {}).get("grade_id")}
    items = {i.grade_id: i for i in result.items}
    cells = [_status_cell(result, assignment)]
    placed: set[str] = set()

    def place(gid: str, student_source: str | None) -> None:
        cell = copy.deepcopy(release_cells[gid])
        meta = cell.metadata["nbgrader"]
        students = gid in result.answers or (meta.get("solution") and student_source is not None)
        if students:
            cell.source = result.answers.get(gid, student_source)
        if students and cell.cell_type == "markdown":
            cell.source = _verbatim([cell.source])  # the student's Markdown: shown as its source, never live
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if gid in items:
                cell.outputs.append(_result_output(items[gid]))
        cells.append(cell)
        placed.add(gid)

    for cell, gid in _submitted_cells(submitted, template):
        if gid in release_cells:
            if gid not in placed:  # a pasted copy of a cell is left out: the original counts
                place(gid, cell.source)
        elif cell.cell_type == "code":
            cells.append(nbformat.v4.new_code_cell(cell.source))
        elif cell.cell_type == "markdown":
            cells.append(new_markdown_cell(_verbatim([cell.source])))
    for gid in release_cells:
        if gid not in placed:  # deleted, or nothing readable was submitted: the release cell
            place(gid, None)
    notebook = copy.deepcopy(release)
    notebook.cells = cells
    return notebook
