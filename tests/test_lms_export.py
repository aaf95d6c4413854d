"""A real Canvas gradebook export works as it comes (README, "Export to an LMS"): Canvas's test student, columns
for only some of the course's assignments, other columns of Canvas's own, and points possible that differ from
the course's. The reference is the file's own content: what Canvas would import."""

from __future__ import annotations

import csv

import pytest

from autograder.__main__ import main as grader_main

HEADER = ("Student,ID,SIS User ID,SIS Login ID,Section,Quiz 1 (77),ps1-attention (4242),Current Score,"
          "Unposted Current Score,Final Score\n")
POINTS = "    Points Possible,,,,,10,20,(read only),(read only),(read only)\n"
ROWS = ('"A, Alice",101,s101,alice,S1,9,,0,0,0\n'
        '"Student, Test",999,,,S1,,,,,\n'
        '"B, Bob",102,s102,bob,S1,7,,0,0,0\n')


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course folder made from the Canvas export (the test student included), two assignments."""
    tmp = tmp_path_factory.mktemp("term")
    (tmp / "canvas.csv").write_text(HEADER + POINTS + ROWS)
    assert grader_main(["course", str(tmp / "course"), "--exchange", str(tmp / "exchange"), "--roster",
                        str(tmp / "canvas.csv"), "--assignment", "ps1-attention", "--assignment", "ps2-positions"]) == 0
    return tmp


def _export(course, *extra) -> list[list[str]]:
    out = course / "import.csv"
    assert grader_main(["export", "--course", str(course / "course"), "--canvas", str(course / "canvas.csv"),
                        "--to", str(out), *extra]) == 0
    with open(out, newline="") as f:
        return list(csv.reader(f))


def test_the_test_student_is_left_out_and_only_canvas_columns_are_exported(course, capsys):
    table = _export(course)
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "ps1-attention (4242)"]
    assert [row[3] for row in table[2:]] == ["alice", "bob"]  # no "Student, Test"
    err = capsys.readouterr().err
    assert "test student" in err and "no column for ps2-positions" in err
    assert "out of 20 points, the course's ps1-attention out of 17" in err
    assert float(table[1][5]) == 17  # as they are, with a warning


def test_rescale_scales_the_points_to_canvas_and_one_assignment_can_be_chosen(course):
    table = _export(course, "--rescale", "--assignment", "ps1-attention")
    assert float(table[1][5]) == 20 and [float(r[5]) for r in table[2:]] == [0.0, 0.0]


def test_an_empty_login_that_is_not_the_test_student_names_the_option_and_writes_nothing(course, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + POINTS + ROWS + '"C, Carol",103,s103,,S1,,,,,\n')
    out = tmp_path / "import.csv"
    with pytest.raises(SystemExit, match=r"--canvas .*line 6: the column 'SIS Login ID' is empty \(C, Carol\)"):
        grader_main(["export", "--course", str(course / "course"), "--canvas", str(bad), "--to", str(out)])
    assert not out.exists()
    with pytest.raises(SystemExit, match=r"--roster .*line 6"):
        grader_main(["course", str(tmp_path / "new"), "--exchange", str(tmp_path / "ex"), "--roster", str(bad)])
    assert not (tmp_path / "new").exists()  # checked before anything was written
