"""A pasted copy of a test cell (Jupyter's copy and paste keeps its nbgrader metadata and gives it a new cell id,
or none in an editor that drops ids) never costs the original's points, wherever it sits (notebooks.prepare).

The property: the cell that counts for a grade_id is the original, or a copy with nothing but copies between
it and the original (it then runs at the same point of the notebook). Checked in-process for a copy of every
test cell of ps1 at every position, and for several copies; one notebook of the class runs through the sandbox
in tests/test_grader_hostile.py ("several-copies-no-ids").
"""

from __future__ import annotations

import copy
import itertools

import pytest

from autograder.grade import release_template
from autograder.notebooks import _identify, _originals, prepare
from submissions import submission

PS = "ps1-attention"
TEMPLATE, NB = release_template(PS)
AUTO = [item.grade_id for item in TEMPLATE.auto_items]
ID_MODES = ("release ids", "no ids", "all ids new")


def _grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def _with_copies(pastes, id_mode):
    """The solved ps1 notebook with a copy of test cell ``gid`` inserted before cell ``position`` (of the
    notebook as it is then) for each ``(gid, position)``; returns it and the copies (cell objects)."""
    nb = submission(PS, NB)
    copies = []
    for gid, position in pastes:
        pasted = copy.deepcopy(next(c for c in nb.cells if _grade_id(c) == gid and c not in copies))
        pasted["id"] = f"pasted{len(copies)}"
        nb.cells.insert(position, pasted)
        copies.append(pasted)
    for index, cell in enumerate(nb.cells):
        if id_mode == "no ids":
            cell.pop("id", None)
        elif id_mode == "all ids new":  # e.g. a notebook re-saved by a tool that makes new ids
            cell["id"] = f"new{index:05d}"
    return nb, copies


def _counts_where_it_should(nb, copies, gid):
    chosen = _originals(nb, _identify(nb, TEMPLATE), TEMPLATE)[gid]
    original = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == gid and not any(c is k for k in copies))
    between = nb.cells[min(chosen, original):max(chosen, original) + 1]
    return all(any(c is k for k in copies) or c is nb.cells[original] for c in between)


@pytest.mark.parametrize("id_mode", ID_MODES)
@pytest.mark.parametrize("gid", AUTO)
def test_one_copy_at_any_position(gid, id_mode):
    for position in range(len(submission(PS, NB).cells) + 1):
        nb, copies = _with_copies([(gid, position)], id_mode)
        assert _counts_where_it_should(nb, copies, gid), (gid, position, id_mode)


@pytest.mark.parametrize("id_mode", ID_MODES)
def test_copies_of_neighbouring_test_cells_above_their_function(id_mode):
    """Copies of the three softmax tests, pasted right after the set-up cell in their release order: each
    copy's neighbour in the release order is now another copy, so no rule of the form 'after the release
    cell before it' finds the original."""
    softmax_tests = [g for g in AUTO if g.startswith("test_softmax")]
    nb, copies = _with_copies([(g, 2 + k) for k, g in enumerate(softmax_tests)], id_mode)
    for gid in softmax_tests:
        assert _counts_where_it_should(nb, copies, gid), (gid, id_mode)


@pytest.mark.parametrize("id_mode", ID_MODES)
def test_several_copies_of_one_cell(id_mode):
    """Two copies of one test cell: both above its function, one above and one below, both far below."""
    gid = "test_sdpa_mask"
    size = len(submission(PS, NB).cells)
    for first, second in itertools.combinations(range(0, size + 1, 3), 2):
        nb, copies = _with_copies([(gid, second), (gid, first)], id_mode)
        assert _counts_where_it_should(nb, copies, gid), (first, second, id_mode)


def test_the_prepared_notebook_runs_the_original_and_notes_the_copy():
    """Through prepare: the capture stands where the original was, and the copy is noted, not run."""
    nb, _ = _with_copies([("test_causal_mask", 2)], "no ids")
    prepared = prepare(nb, TEMPLATE)
    original = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == "test_causal_mask" and i != 2)
    assert [o for o in prepared.origins if "test_causal_mask" in o] == \
        [f"test cell 'test_causal_mask' (your cell {original + 1})"]
    assert prepared.notes == ["a copy of the read-only cell 'test_causal_mask' (your cell 3) was not run"]
    assert not prepared.tampering
