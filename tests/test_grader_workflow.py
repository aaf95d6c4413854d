"""The instructor's workflow through the CLI: reruns that merge and never lose results, intake as
learning-management systems export it, nbgrader's gradebook for written answers, the class report in a
browser, and grading on a real two-worker Dask cluster with the same result as a local run."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import release, submission, write

ROOT = Path(__file__).resolve().parents[1]
PS, NB, FULL = "ps1-attention", "ps1-attention.ipynb", 15
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n"
VOLATILE = ("seconds", "cpu_seconds")  # timing columns differ between runs

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")


def grade(subs: Path, out: Path, *extra: str) -> int:
    return grader_main(["grade", PS, str(subs), "--out", str(out), "--workers", "2", "--timeout", "10",
                        "--notebook-timeout", "60", *extra])


def rows_of(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def stable(row: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


# -- Reruns never lose results --------------------------------------------------------------------------------

def test_only_and_retry_failed_merge_and_keep_the_other_students(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(submission(PS, NB), subs / "alice", NB)
    write(release(PS, NB), subs / "bob", NB)
    (subs / "carol").mkdir()
    (subs / "carol" / NB).write_text('{"cells": [')  # broken: invalid-notebook
    assert grade(subs, out) == 0
    first = rows_of(out)
    assert {n: r["status"] for n, r in first.items()} == {"alice": "graded", "bob": "graded", "carol": "invalid-notebook"}
    alice_page = (out / "feedback" / "alice" / "ps1-attention.html").read_bytes()

    write(submission(PS, NB), subs / "bob", NB)  # bob finishes his work; --only regrades him alone
    assert grade(subs, out, "--only", "bob") == 0
    second = rows_of(out)
    assert second["bob"]["score"] == str(FULL)
    assert second["alice"] == first["alice"] and second["carol"] == first["carol"]  # byte for byte, timings too
    assert (out / "feedback" / "alice" / "ps1-attention.html").read_bytes() == alice_page

    write(submission(PS, NB), subs / "carol", NB)  # carol fixes her file; --retry-failed picks only her
    assert grade(subs, out, "--retry-failed") == 0
    third = rows_of(out)
    assert third["carol"]["status"] == "graded" and third["carol"]["score"] == str(FULL)
    assert third["alice"] == first["alice"] and third["bob"] == second["bob"]

    with pytest.raises(SystemExit, match="no submission named 'dave'"):
        grade(subs, out, "--only", "dave")


def test_a_run_killed_halfway_leaves_the_previous_grades(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(submission(PS, NB), subs / "alice", NB)
    assert grade(subs, out) == 0
    before = (out / "grades.csv").read_bytes()
    write(submission(PS, NB, answers={"causal_mask": "while True:\n    pass\n"}), subs / "slow", NB)
    process = subprocess.Popen([sys.executable, "-m", "autograder", "grade", PS, str(subs), "--out", str(out),
                                "--workers", "2", "--timeout", "30"], cwd=ROOT, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8)  # alice is done by now, slow is looping
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert (out / "grades.csv").read_bytes() == before
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


def test_an_output_folder_of_another_assignment_is_refused(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(submission(PS, NB), subs / "alice", NB)
    assert grade(subs, out) == 0
    with pytest.raises(SystemExit, match="holds the results of 'ps1-attention', not 'ps2-positions'"):
        grader_main(["grade", "ps2-positions", str(subs), "--out", str(out)])
    assert rows_of(out)["alice"]["score"] == str(FULL)


# -- Intake as learning-management systems export it -----------------------------------------------------------

def test_canvas_gradescope_and_odd_folders(tmp_path, capsys):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    solved = json.dumps(submission(PS, NB))
    empty = json.dumps(release(PS, NB))
    # Canvas: flat files; ann resubmitted twice (the newest counts), ben was late
    (subs / "smithann_1001_5001_ps1-attention.ipynb").write_text(empty)
    (subs / "smithann_1001_5002_ps1-attention-1.ipynb").write_text(empty)
    (subs / "smithann_1001_5003_ps1-attention-2.ipynb").write_text(solved)
    (subs / "jonesben_late_1002_5004_ps1-attention.ipynb").write_text(solved)
    # Gradescope/Moodle: a folder per student; one notebook under another name, and one with two candidates
    write(submission(PS, NB), subs / "cara", "my_attention.ipynb")
    write(submission(PS, NB), subs / "dan", "try1.ipynb")
    write(submission(PS, NB), subs / "dan", "try2.ipynb")
    (subs / "stray.ipynb").write_text(solved)
    (subs / "readme.txt").write_text("not a submission")
    assert grade(subs, out) == 0
    rows = rows_of(out)
    assert {n: (r["status"], r["score"]) for n, r in rows.items()} == {
        "smithann": ("graded", str(FULL)), "jonesben": ("graded", str(FULL)),
        "cara": ("graded", str(FULL)), "dan": ("missing", "0")}
    assert "my_attention.ipynb" in rows["cara"]["notes"]
    assert "try1.ipynb" in rows["dan"]["detail"] and "try2.ipynb" in rows["dan"]["detail"]
    warnings = capsys.readouterr().err
    for ignored in ("smithann_1001_5001_ps1-attention.ipynb", "smithann_1001_5002_ps1-attention-1.ipynb",
                    "stray.ipynb", "readme.txt"):
        assert f"warning: {ignored}" in warnings, ignored


def test_an_empty_submissions_folder_is_an_error(tmp_path):
    (tmp_path / "subs").mkdir()
    with pytest.raises(SystemExit, match="is empty"):
        grade(tmp_path / "subs", tmp_path / "out")
    with pytest.raises(SystemExit, match="cannot read the submissions folder"):
        grade(tmp_path / "absent", tmp_path / "out")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", PS, str(tmp_path / "subs"), "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "is empty" in done.stderr


# -- nbgrader's gradebook: written answers graded by hand ------------------------------------------------------

def test_gradebook_round_trip_with_a_manual_score(tmp_path):
    from nbgrader.api import Gradebook

    subs, out, database = tmp_path / "subs", tmp_path / "out", tmp_path / "course" / "gradebook.db"
    write(submission(PS, NB, answers={"causal_not_equivariant": "ANSWER-OF-ALICE"}), subs / "alice", NB)
    write(submission(PS, NB, answers={"softmax": WRONG_SOFTMAX}), subs / "bob", NB)
    assert grade(subs, out, "--gradebook", str(database)) == 0
    rows = rows_of(out)
    assert rows["alice"]["max_score"] == "17" and rows["alice"]["manual_pending"] == "2"

    url = f"sqlite:///{database}"
    with Gradebook(url) as gradebook:
        assert gradebook.find_submission(PS, "alice").score == FULL
        answer = gradebook.find_grade("causal_not_equivariant", "ps1-attention", PS, "alice")
        assert answer.needs_manual_grade and answer.max_score == 2
        answer.manual_score = 1.5  # what an instructor enters in formgrader
        gradebook.db.commit()
    assert grade(subs, out, "--only", "alice", "--gradebook", str(database)) == 0  # a regrade keeps it

    assert "ANSWER-OF-ALICE" in formgrader_page(database.parent, "alice")  # where the instructor grades it

    exported = tmp_path / "export.csv"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # nbgrader runs `alembic`
    subprocess.run([sys.executable, "-m", "nbgrader", "export", f"--db={url}", f"--to={exported}"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    with open(exported, newline="") as f:
        table = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(table["alice"]["raw_score"]) == FULL + 1.5  # the automatic and the manual points together
    assert float(table["alice"]["max_score"]) == FULL + 2
    assert float(table["bob"]["raw_score"]) == float(rows["bob"]["score"])


def formgrader_page(course: Path, student: str) -> str:
    """The HTML of formgrader's manual-grading page of ``student``'s ps1 notebook, from a Jupyter server started
    in the course folder (as an instructor would start JupyterLab there)."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "server", "--allow-root", "--no-browser",
                               f"--port={port}", "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=",
                               "--ServerApp.password="], cwd=course, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/formgrader"
    try:
        for _ in range(300):
            try:
                listing = urllib.request.urlopen(f"{base}/api/submitted_notebooks/{PS}/ps1-attention", timeout=5).read()
                break
            except OSError:
                time.sleep(0.2)
        notebook_id = next(s["id"] for s in json.loads(listing) if s["student"] == student)
        return urllib.request.urlopen(f"{base}/submissions/{notebook_id}/", timeout=30).read().decode()
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


# -- The class report -------------------------------------------------------------------------------------------

def test_class_report_in_a_browser(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium (Debian package) is not installed")
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(submission(PS, NB), subs / "alice", NB)
    write(release(PS, NB), subs / "bob", NB)
    write(submission(PS, NB, answers={"causal_mask": "while True:\n    pass\n"}), subs / "slowpoke", NB)
    assert grade(subs, out) == 0
    requests = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("request", lambda r: requests.append(r.url))
        page.goto((out / "report.html").as_uri())
        headings = page.locator("h2").all_inner_texts()
        assert headings == ["Statuses", "Scores", "Students", "Test cells", "Failures by cell",
                            "Late submissions, extensions and times taken otherwise", "Slowest submissions",
                            "Submissions that hit a limit"]
        svg = page.locator("figure svg")
        assert svg.count() == 1 and svg.bounding_box()["height"] > 100  # the histogram is drawn
        tables = page.locator("table").all_inner_texts()
        assert "graded\t2" in tables[0] and "timeout\t1" in tables[0]
        assert "test_softmax_examples\t1\t0.67\t67%" in tables[2]  # 2 of 3 got it
        failures = {line.split("\t")[0]: line for line in tables[3].splitlines()[1:]}
        assert "bob" in failures["test_softmax_examples"] and "alice" not in failures["test_softmax_examples"]
        assert tables[5].splitlines()[1].startswith("slowpoke")
        assert "slowpoke\ttimeout" in tables[6]
        shots = ROOT / "_build" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "grader-report.png"), full_page=True)
        browser.close()
    assert all(url.startswith("file://") for url in requests), requests  # works offline




def test_grading_on_a_dask_cluster_equals_a_local_run(tmp_path, dask_cluster):
    subs = tmp_path / "subs"
    write(submission(PS, NB), subs / "alice", NB)
    write(submission(PS, NB, answers={"softmax": WRONG_SOFTMAX}), subs / "bob", NB)
    write(release(PS, NB), subs / "carol", NB)
    (subs / "dave").mkdir()
    (subs / "dave" / NB).write_text("not json")
    write(submission(PS, NB, answers={"causal_mask": "import os\nos._exit(0)\n"}), subs / "erin", NB)
    assert grade(subs, tmp_path / "local") == 0
    assert grade(subs, tmp_path / "cluster", "--scheduler", dask_cluster) == 0
    local, cluster = rows_of(tmp_path / "local"), rows_of(tmp_path / "cluster")
    assert {n: stable(r) for n, r in cluster.items()} == {n: stable(r) for n, r in local.items()}
    assert {n: r["status"] for n, r in cluster.items()} == {
        "alice": "graded", "bob": "graded", "carol": "graded", "dave": "invalid-notebook", "erin": "graded"}
    for name in local:
        assert (tmp_path / "cluster" / "feedback" / name / "ps1-attention.html").exists()
