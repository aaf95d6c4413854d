"""The exchange is the instructor's (README, "Teach with it"): no student can take over the course's folder in it,
and nbgrader's collect, as the course configures it, refuses a submission made in another student's name.

Real accounts: the system's ``nobody`` and ``daemon`` play two students (their folders are made as root and
given to them, as nbgrader's submit would leave them); nbgrader's own ``collect`` is the command under test."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.__main__ import main as grader_main
from autograder.course import make_exchange
from submissions import release, write

ROOT = Path(__file__).resolve().parents[1]
PS, NB = "ps1-attention", "ps1-attention.ipynb"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives folders to other accounts: needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_exchange_is_sticky_and_the_course_folders_are_the_instructors(tmp_path):
    make_exchange(tmp_path / "exchange", "llmarch")
    assert _mode(tmp_path / "exchange") == 0o1777
    assert _mode(tmp_path / "exchange" / "llmarch") == 0o755
    assert _mode(tmp_path / "exchange" / "llmarch" / "outbound") == 0o755
    assert _mode(tmp_path / "exchange" / "llmarch" / "inbound") == 0o3733


@needs_root
def test_a_course_folder_another_account_made_first_is_refused(tmp_path):
    (tmp_path / "exchange" / "llmarch").mkdir(parents=True)
    os.chown(tmp_path / "exchange" / "llmarch", pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(SystemExit, match="belongs to another account"):
        make_exchange(tmp_path / "exchange", "llmarch")


def _submit(inbound: Path, student: str, owner: str, when: str, marker: str) -> None:
    folder = inbound / f"{student}+{PS}+{when}+{marker}"
    write(release(PS, NB), folder, NB)
    (folder / "timestamp.txt").write_text(when)
    (folder / "marker.txt").write_text(marker)
    uid = pwd.getpwnam(owner).pw_uid
    for path in (folder, *folder.iterdir()):
        os.chown(path, uid, -1)


@needs_root
def test_collect_refuses_a_submission_in_another_students_name_and_keeps_the_students_own(tmp_path):
    course, exchange = tmp_path / "course", tmp_path / "exchange"
    assert grader_main(["course", str(course), "--exchange", str(exchange), "--assignment", PS]) == 0
    inbound = exchange / "llmarch" / "inbound"
    _submit(inbound, "nobody", "nobody", "2026-10-01 10:00:00.000000 UTC", "own")
    _submit(inbound, "nobody", "daemon", "2026-10-01 11:00:00.000000 UTC", "forged")  # later, by daemon
    _submit(inbound, "daemon", "nobody", "2026-10-01 12:00:00.000000 UTC", "forged-only")  # daemon never submitted
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "nbgrader", "collect", PS], cwd=course, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (course / "submitted" / "nobody" / PS / "marker.txt").read_text() == "own"
    assert not (course / "submitted" / "daemon").exists()
    assert "refused daemon+" in done.stderr and "belongs to another account" in done.stderr
    assert "refused nobody+" in done.stderr  # the forgery beside nobody's own submission is reported too


def test_grading_a_course_whose_configuration_lacks_the_guards_says_what_to_add(tmp_path, capsys):
    course = tmp_path / "course"
    (course / "submitted" / "amy" / PS).mkdir(parents=True)
    (course / "submitted" / "amy" / PS / NB).write_text("not a notebook")
    (course / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'x'\n")
    assert grader_main(["grade", PS, "--course", str(course), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "lacks the course's guards" in err and "c.ExchangeFactory.collect = OwnerCheckedCollect" in err
