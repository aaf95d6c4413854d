"""A whole term with nbgrader's own commands and a real exchange folder: a course folder made by
`python -m autograder course` from Canvas's own export (with its test student), three students with separate
HOMEs (--student), release -> fetch -> submit (one on time by an extension, one late, one never) -> collect ->
the course's grader -> formgrader's assignment list and a manual grade through its HTTP API -> Autograde clicked
in formgrader (refused, nothing changed) -> generate_feedback -> release_feedback -> fetch_feedback -> a regrade
of one student's changed notebook, its feedback generated, released and fetched again -> nbgrader export and
`python -m autograder export --canvas`.

The references are nbgrader's own: its commands' results, its export, its formgrader API."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from autograder.sandbox import bubblewrap_available
from submissions import release, solution_sources, submission, write

ROOT = Path(__file__).resolve().parents[1]
PS, NB = "ps1-attention", "ps1-attention.ipynb"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n"
SOFTMAX_CELLS = ("test_softmax_examples", "test_softmax_stability", "test_softmax_axis")

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")


def run(args, cwd: Path, home: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """A command as a person would run it: the venv's python by its path, the venv NOT on PATH (nbgrader must
    cope: it runs `alembic`), its own HOME for a student."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if Path(p).resolve() != Path(sys.executable).parent.resolve())
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "lib"), str(ROOT)])
    if home is not None:
        env["HOME"] = str(home)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def nbgrader(*args, cwd: Path, home: Path | None = None, check: bool = True):
    return run(["-m", "nbgrader", *args], cwd, home, check)


@contextmanager
def formgrader(course: Path):
    """A Jupyter server in the course folder, as an instructor starts JupyterLab there; yields a function
    ``api(method, path, body=None) -> parsed JSON`` for formgrader's HTTP API (``api("PAGE", path)``: the
    HTML of a formgrader page)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "server", "--allow-root", "--no-browser",
                               f"--port={port}", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=",
                               "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True"],
                              cwd=course, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/formgrader/api"

    def api(method: str, path: str, body=None):
        if method == "PAGE":
            with urllib.request.urlopen(base.removesuffix("/api") + path, timeout=120) as response:
                return response.read().decode()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(base + path, data=data, method=method)
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    try:
        for _ in range(600):
            try:
                api("GET", "/status")
                break
            except OSError:
                time.sleep(0.2)
        yield api
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def export_rows(path: Path, key: str) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r[key]: r for r in csv.DictReader(f)}


def test_a_term_through_nbgrader(tmp_path):
    course, exchange, homes = tmp_path / "course", tmp_path / "exchange", tmp_path / "home"
    canvas = tmp_path / "canvas-export.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section,ps1-attention (4242)\n"
                      "    Points Possible,,,,,17\n"
                      "\"A, Alice\",101,s101,alice,S1,\n\"B, Bob\",102,s102,bob,S1,\n\"C, Carol\",103,s103,carol,S2,\n"
                      "\"Student, Test\",999,,,S1,\n")  # Canvas's test student: no SIS Login ID
    due = datetime.now(timezone.utc) - timedelta(minutes=30)  # everyone is late, alice has an extension
    run(["-m", "autograder", "course", str(course), "--exchange", str(exchange), "--roster", str(canvas),
         "--due", f"{PS}={due:%Y-%m-%d %H:%M:%S} UTC", "--assignment", PS], tmp_path)
    (tmp_path / "extensions.csv").write_text(f"student,assignment,hours\nalice,{PS},48\n")

    nbgrader("release_assignment", PS, cwd=course)
    own_code = solution_sources(PS, NB)["softmax"] + "\n# ALICE-OWN-LINE\n"
    for student, answers in (("alice", {"softmax": own_code}), ("bob", {"softmax": WRONG_SOFTMAX}),
                             ("carol", None)):
        home = homes / student
        (home / ".jupyter").mkdir(parents=True)
        (home / ".jupyter" / "nbgrader_config.py").write_text((course / "student_nbgrader_config.py").read_text())
        nbgrader("fetch_assignment", PS, cwd=home, home=home)
        assert (home / PS / NB).exists()
        if student == "bob":  # a first, empty submission; the resubmission below is the one that counts
            write(release(PS, NB), home / PS, NB)
            nbgrader("submit", PS, "--student", student, cwd=home, home=home)
            time.sleep(1.1)  # nbgrader's submissions are named by the second
        if answers is not None:  # carol never submits
            write(submission(PS, NB, answers=answers), home / PS, NB)
            nbgrader("submit", PS, "--student", student, cwd=home, home=home)
    nbgrader("collect", PS, cwd=course)
    assert sorted(p.name for p in (course / "submitted").iterdir()) == ["alice", "bob"]

    grade = ["-m", "autograder", "grade", PS, "--course", str(course), "--workers", "2", "--timeout", "20",
             "--extensions", str(tmp_path / "extensions.csv"), "--late-penalty", "10%/hour"]
    run(grade, tmp_path)
    rows = export_rows(course / "grader" / PS / "grades.csv", "student")
    assert {s: r["status"] for s, r in rows.items()} == {"alice": "graded", "bob": "graded", "carol": "missing"}
    assert rows["alice"]["score"] == "15" and rows["alice"]["late_seconds"] == "0"
    assert rows["alice"]["penalty"] == "0" and rows["alice"]["extension"] == "48h"
    assert {s: r["lms_id"] for s, r in rows.items()} == {"alice": "101", "bob": "102", "carol": "103"}
    assert not [r for r in rows.values() if "timestamp.txt" in r["notes"] or "submission_secret" in r["notes"]]
    assert "48h" in (course / "grader" / PS / "report.html").read_text()
    bob_page = (course / "grader" / PS / "feedback" / "bob" / "ps1-attention.html").read_text()
    assert "late penalty: 1.7 points" in bob_page
    # bob's resubmission was graded: its causal mask passes, which his first, empty submission could not
    assert all(rows["bob"][cell] == "0" for cell in SOFTMAX_CELLS) and rows["bob"]["test_causal_mask"] == "1"
    assert 1800 <= int(rows["bob"]["late_seconds"]) < 3600 and rows["bob"]["penalty"] == "1.7"  # 10% of 17
    assert rows["carol"]["manual_pending"] == "0" and rows["carol"]["submitted_at"] == ""
    for student in ("alice", "bob"):  # nbgrader's files travel with the graded notebook
        for name in ("timestamp.txt", "submission_secret.txt"):
            assert (course / "autograded" / student / PS / name).read_text() == \
                (course / "submitted" / student / PS / name).read_text()

    with formgrader(course) as api:
        assert PS in {a["name"] for a in api("GET", "/assignments")}  # Manage Assignments lists it
        listed = {s["student"]: s for s in api("GET", f"/submissions/{PS}")}
        assert listed["alice"]["autograded"] and listed["bob"]["autograded"]
        assert not any(s.get("submitted") and not s.get("autograded") for s in listed.values())
        notebooks = {s["student"]: s for s in api("GET", f"/submitted_notebooks/{PS}/ps1-attention")}
        grades = {g["name"]: g for g in api("GET", f"/grades?submission_id={notebooks['alice']['id']}")}
        assert grades["causal_not_equivariant"]["needs_manual_grade"]
        manual_page = api("PAGE", f"/submissions/{notebooks['bob']['id']}/")  # where the instructor grades
        assert "zeros_like" in manual_page and "Hidden tests failed" in manual_page
        api("PUT", f"/grade/{grades['causal_not_equivariant']['id']}", {"manual_score": 1.5})
        comments = {c["name"]: c for c in api("GET", f"/comments?submission_id={notebooks['alice']['id']}")}
        api("PUT", f"/comment/{comments['causal_not_equivariant']['id']}", {"manual_comment": "A-COMMENT-FOR-ALICE"})
        before = {s["student"]: s["score"] for s in api("GET", f"/submissions/{PS}")}
        notebook_before = (course / "autograded" / "bob" / PS / NB).read_bytes()
        clicked = api("POST", f"/submission/{PS}/bob/autograde")  # formgrader's Autograde button (--force)
        assert clicked["success"] is False and "switched off" in clicked["log"]
        after = {s["student"]: s["score"] for s in api("GET", f"/submissions/{PS}")}
        assert after == before and before["alice"] == 16.5
        assert (course / "autograded" / "bob" / PS / NB).read_bytes() == notebook_before
    refused = nbgrader("autograde", PS, "--force", cwd=course, check=False)
    assert refused.returncode != 0 and "switched off" in refused.stderr

    nbgrader("generate_feedback", PS, cwd=course)
    nbgrader("release_feedback", PS, cwd=course)
    for student in ("alice", "bob"):
        home = homes / student
        nbgrader("fetch_feedback", PS, "--student", student, cwd=home, home=home)
        pages = list((home / PS / "feedback").glob(f"*/{PS}.html"))
        assert len(pages) == 1, pages
        page = pages[0].read_text()
        assert "Hidden tests passed" in page  # the hidden-case results
        assert ("ALICE-OWN-LINE" in page) == (student == "alice")  # and the student's own code
        if student == "bob":
            assert "Hidden tests failed" in page and "zeros_like" in page
        else:
            assert "16.5" in page and "A-COMMENT-FOR-ALICE" in page  # with the manual grade and comment

    # a regrade of the same submission (its time unchanged): the instructor replaces bob's notebook, regrades
    # him alone, and generates and releases feedback as before; nbgrader alone would skip him
    write(submission(PS, NB), course / "submitted" / "bob" / PS, NB)
    run([*grade, "--only", "bob"], tmp_path)
    regraded = export_rows(course / "grader" / PS / "grades.csv", "student")["bob"]
    assert float(regraded["score"]) > float(rows["bob"]["score"])
    nbgrader("generate_feedback", PS, cwd=course)
    nbgrader("release_feedback", PS, cwd=course)
    nbgrader("fetch_feedback", PS, "--student", "bob", cwd=homes / "bob", home=homes / "bob")
    (page,) = list((homes / "bob" / PS / "feedback").glob(f"*/{PS}.html"))
    shown = float(re.search(r"\(Score: ([\d.]+) / 17\.0\)", page.read_text())[1])
    assert shown == round(float(regraded["score"]) - float(regraded["penalty"]), 2)
    assert "zeros_like" not in page.read_text()
    rows["bob"] = regraded

    nbgrader("export", "--to", str(tmp_path / "nbgrader.csv"), cwd=course)
    exported = {r["student_id"]: r for r in csv.DictReader(open(tmp_path / "nbgrader.csv"))}
    assert float(exported["alice"]["score"]) == 16.5
    assert float(exported["bob"]["late_submission_penalty"]) == 1.7
    assert float(exported["bob"]["score"]) == float(rows["bob"]["score"]) - 1.7
    assert float(exported["carol"]["score"]) == 0 and exported["carol"]["timestamp"] == ""
    with sqlite3.connect(course / "gradebook.db") as db:  # one course: no stray "default_course"
        assert [r[0] for r in db.execute("SELECT id FROM course")] == ["llmarch"]
    run(["-m", "autograder", "export", "--course", str(course), "--canvas", str(canvas),
         "--to", str(tmp_path / "canvas-import.csv")], tmp_path)
    with open(tmp_path / "canvas-import.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "ps1-attention (4242)"]
    assert table[1][0].strip() == "Points Possible" and float(table[1][5]) == 17
    imported = {r[3]: r for r in table[2:]}
    assert imported["alice"][:5] == ["A, Alice", "101", "s101", "alice", "S1"]
    assert {s: float(r[5]) for s, r in imported.items()} == {
        s: float(exported[s]["score"]) for s in ("alice", "bob", "carol")}
