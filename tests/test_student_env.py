"""`make student-links` (the end of `make student-env`, README "Teach with it", step 1): the student
environment's `nbgrader` and `jupyter` on every account's PATH, as links in STUDENT_BIN, never replacing a file
of another installation. A stand-in environment (two scripts) keeps it fast; `make student-env` itself ends by
running the linked `nbgrader` as the account `nobody`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def links(venv: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "student-links", f"STUDENT_VENV={venv}", f"STUDENT_BIN={bin_dir}"],
                          cwd=ROOT, capture_output=True, text=True)


def test_student_commands_are_linked_into_the_shared_bin_and_foreign_files_are_kept(tmp_path):
    venv, bin_dir = tmp_path / "llmarch-env", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    for command in ("nbgrader", "jupyter"):
        script = venv / "bin" / command
        script.write_text(f"#!/bin/sh\necho {command}-of-the-course \"$@\"\n")
        script.chmod(0o755)
    for _ in range(2):  # a second run (make student-env again) keeps the links
        done = links(venv, bin_dir)
        assert done.returncode == 0, done.stdout + done.stderr
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    for command in ("nbgrader", "jupyter"):
        assert os.readlink(bin_dir / command) == str(venv / "bin" / command)
        ran = subprocess.run([command, "--version"], env=env, capture_output=True, text=True)
        assert ran.stdout.strip() == f"{command}-of-the-course --version"

    (bin_dir / "jupyter").unlink()
    (bin_dir / "jupyter").write_text("#!/bin/sh\necho the-system-jupyter\n")  # another installation's command
    done = links(venv, bin_dir)
    assert done.returncode != 0 and "is not a link into" in done.stdout
    assert (bin_dir / "jupyter").read_text().endswith("the-system-jupyter\n")

    done = links(tmp_path / "no-env", tmp_path / "bin2")
    assert done.returncode != 0 and "run make student-env first" in done.stdout
    assert not (tmp_path / "bin2").exists()
