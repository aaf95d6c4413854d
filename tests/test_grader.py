"""The grader end to end (real nbgrader release, real sandbox, real kernels) against hostile submissions.

All submissions are graded together in one run with two workers, as an instructor would; each case then
checks its own status and points, and that nobody else was affected.
"""

from __future__ import annotations

import csv
import html
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import release, submission, write

ROOT = Path(__file__).resolve().parents[1]
PS = "ps1-attention"
NB = "ps1-attention.ipynb"
FULL = 15  # automatically graded points of ps1
# A wrong softmax also breaks attention and multi-head attention, which use it: only causal_mask (1 point) and
# equivariance_error (2 points, it is handed its functions) still pass. A cheat must earn no more than that.
WRONG_SOFTMAX_SCORE = 3
SOFTMAX_ITEMS = ("test_softmax_examples", "test_softmax_stability", "test_softmax_axis")

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")

WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    return np.zeros_like(x)\n"

# name -> (builder(folder), expected status, expected score or None to skip the score check)
CASES = {}


def case(name, status, score):
    def register(builder):
        CASES[name] = (builder, status, score)
        return builder

    return register


@case("solution", "graded", FULL)
def _(folder):
    write(submission(PS, NB), folder, NB)


@case("untouched-release", "graded", 0)
def _(folder):
    write(release(PS, NB), folder, NB)


@case("infinite-loop", "timeout", 1 + 1 + 1)  # softmax is graded before the loop starts
def _(folder):
    write(submission(PS, NB, extra_cells=[], answers={"causal_mask": "while True:\n    pass\n"}), folder, NB)


@case("loop-ignoring-interrupts", "timeout", 3)
def _(folder):
    loop = ("import signal\nfor s in (signal.SIGINT, signal.SIGTERM):\n    signal.signal(s, signal.SIG_IGN)\n"
            "while True:\n    try:\n        pass\n    except BaseException:\n        pass\n")
    write(submission(PS, NB, answers={"causal_mask": loop}), folder, NB)


@case("memory-bomb", "memory-limit", 3)
def _(folder):
    write(submission(PS, NB, answers={"causal_mask": "hog = []\nwhile True:\n    hog.append(np.ones(2**23))  # 64 MB, touched\n"}),
          folder, NB)


@case("fork-bomb", None, None)
def _(folder):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    write(submission(PS, NB, answers={"causal_mask": bomb}), folder, NB)


@case("segfault", "graded", FULL - 1)  # the crash costs its cell only (tests/test_grader_crashes.py)
def _(folder):
    write(submission(PS, NB, answers={"causal_mask": "import ctypes\nctypes.string_at(0)\n"}), folder, NB)


@case("os-exit", "graded", FULL - 1)
def _(folder):
    write(submission(PS, NB, answers={"causal_mask": "import os\nos._exit(0)\n"}), folder, NB)


@case("huge-output", "graded", FULL)
def _(folder):
    write(submission(PS, NB, extra_cells=["for _ in range(200):\n    print('x' * 2**20)\n"]), folder, NB)


@case("deleted-test-cell", "tampered", FULL)
def _(folder):
    nb = submission(PS, NB)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "test_softmax_axis"]
    write(nb, folder, NB)


@case("edited-test-cell", "tampered", FULL - 1)
def _(folder):
    nb = submission(PS, NB, answers={"softmax": WRONG_SOFTMAX.replace("np.zeros_like(x)", "np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True)")})
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_stability":
            c.source = "pass  # nothing to see here"
    write(nb, folder, NB)


@case("edited-points", "tampered", FULL)
def _(folder):
    nb = submission(PS, NB)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "test_sdpa_small":
            c.metadata["nbgrader"]["points"] = 100
    write(nb, folder, NB)


@case("wrong-softmax", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    write(submission(PS, NB, answers={"softmax": WRONG_SOFTMAX}), folder, NB)


@case("monkeypatched-comparisons", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    patch = ("import builtins, numpy\nnumpy.allclose = lambda *a, **k: True\nnumpy.testing.assert_allclose = lambda *a, **k: None\n"
             "numpy.array_equal = lambda *a, **k: True\nbuiltins.all = lambda *a, **k: True\nbuiltins.any = lambda *a, **k: False\n"
             "numpy.abs = lambda x: numpy.zeros_like(x)\n" + WRONG_SOFTMAX)
    write(submission(PS, NB, answers={"softmax": patch}), folder, NB)


@case("always-equal-object", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    sneaky = ("class Anything:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
              "    def __array__(self, *a, **k): raise TypeError('no')\n"
              "def softmax(x, axis=-1):\n    return Anything()\n")
    write(submission(PS, NB, answers={"softmax": sneaky}), folder, NB)


@case("ndarray-subclass", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    sneaky = ("class Liar(np.ndarray):\n    def __eq__(self, other): return np.ones(np.shape(other), bool)\n"
              "    def __sub__(self, other): return np.zeros(np.shape(other))\n"
              "def softmax(x, axis=-1):\n    return np.zeros_like(x).view(Liar)\n")
    write(submission(PS, NB, answers={"softmax": sneaky}), folder, NB)


@case("reads-solutions-and-lib", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    steal = (
        f"import glob\nfound = [p for pattern in ('{ROOT}/solutions/**/*.ipynb', '{ROOT}/lib/llmarch/*.py',"
        f" '{ROOT}/autograder/*.py', '/work/**/solutions/**/*.ipynb', '/root/**/*.ipynb')"
        " for p in glob.glob(pattern, recursive=True)]\n"
        "if found:\n    exec(" + repr(submission(PS, NB).cells[3].source) + ")\nelse:\n" + "\n".join(
            "    " + line for line in WRONG_SOFTMAX.splitlines()) + "\n"
    )
    write(submission(PS, NB, answers={"softmax": steal}), folder, NB)


@case("imports-llmarch", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    cheat = ("try:\n    import torch\n    from llmarch.attention import softmax as _ref\n"
             "    def softmax(x, axis=-1):\n        return _ref(torch.tensor(x), dim=axis).numpy()\n"
             "except ImportError:\n" + "\n".join("    " + line for line in WRONG_SOFTMAX.splitlines()) + "\n")
    write(submission(PS, NB, answers={"softmax": cheat}), folder, NB)


@case("forged-outputs", "graded", WRONG_SOFTMAX_SCORE)
def _(folder):
    out = "/submission/.grader-outputs"
    forge = (f"import os\nos.makedirs('{out}/test_softmax_axis', exist_ok=True)\n"
             f"os.symlink('/etc', '{out}/test_softmax_examples')\n"
             f"os.symlink('/etc/passwd', '{out}/test_softmax_axis/case0_out0.npy')\n"
             f"np.save('{out}/test_softmax_axis/case1_out0.npy', np.array([object()]), allow_pickle=True)\n"
             + WRONG_SOFTMAX)
    write(submission(PS, NB, answers={"softmax": forge}), folder, NB)


@case("network", "graded", FULL)
def _(folder):
    net = ("import socket\nfor host in [('1.1.1.1', 53), ('127.0.0.1', 22), ('pypi.org', 443)]:\n"
           "    try:\n        socket.create_connection(host, timeout=2).close()\n        raise SystemExit('connected')\n"
           "    except OSError:\n        pass\n")
    write(submission(PS, NB, extra_cells=[net]), folder, NB)


@case("writes-outside", "graded", FULL)
def _(folder):
    vandal = (f"for p in ['{ROOT}/grades.csv', '{ROOT}/solutions/x', '/tmp/../etc/x', '{ROOT.parent}/out/grades.csv']:\n"
              "    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\n")
    write(submission(PS, NB, extra_cells=[vandal]), folder, NB)


@case("malformed-json", "invalid-notebook", 0)
def _(folder):
    folder.mkdir()
    (folder / NB).write_text('{"cells": [ {"cell_type": "code", ')


@case("non-utf8", "invalid-notebook", 0)
def _(folder):
    folder.mkdir()
    (folder / NB).write_bytes(b'{"cells": [], "metadata": {"x": "\xff\xfe"}, "nbformat": 4, "nbformat_minor": 5}')


@case("missing", "missing", 0)
def _(folder):
    folder.mkdir()
    (folder / "notes.txt").write_text("I forgot")


@case("wrong-name", "graded", FULL)  # the only notebook in the folder is graded, with a note
def _(folder):
    write(submission(PS, NB), folder, "ps1.ipynb")


@case("zip-export", "graded", FULL)
def _(folder):
    inner = write(submission(PS, NB), folder.parent / "_zip-src" / "submission", NB)
    with zipfile.ZipFile(folder.parent / f"{folder.name}.zip", "w") as zf:
        zf.write(inner, f"lms-export/{folder.name}/{NB}")
    shutil.rmtree(folder.parent / "_zip-src")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("grading")
    subs = base / "submissions"
    subs.mkdir()
    for name, (build, _, _) in CASES.items():
        build(subs / name)
    out = base / "out"
    assert grader_main(["grade", PS, str(subs), "--out", str(out), "--workers", "2", "--timeout", "10",
                        "--notebook-timeout", "60", "--memory", "1024"]) == 0
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return base, subs, out, rows


@pytest.mark.parametrize("name", list(CASES))
def test_submission_gets_its_expected_status_and_points(name, graded):
    _, _, out, rows = graded
    _, status, score = CASES[name]
    row = rows[name]
    if status is not None:
        assert row["status"] == status, f"{name}: {row}"
    else:  # the fork bomb: contained, whatever the kernel made of it
        assert row["status"] in {"graded", "timeout", "crashed"}, row
    if score is not None and name == "monkeypatched-comparisons":  # patching builtins may break more of it
        assert float(row["score"]) <= score, f"{name}: {row}"
    elif score is not None:
        assert float(row["score"]) == score, f"{name}: {row}"
    assert float(row["max_score"]) == FULL + 2  # and the 2-point written answer, pending unless nothing readable came in
    assert row["manual_pending"] == ("0" if row["status"] in {"missing", "invalid-notebook"} else "2")
    html = (out / "feedback" / name / "ps1-attention.html").read_text()
    assert f"Status: {row['status']}" in html


def test_feedback_never_shows_hidden_test_source(graded):
    _, _, out, _ = graded
    for page in (out / "feedback").glob("*/*.html"):
        text = page.read_text()
        assert "HIDDEN TESTS" not in text and "check_close(" not in text, page


def test_a_failing_hidden_case_shows_its_note_in_the_feedback(graded):
    """The feedback page names the first failing hidden case by its one-line note (the wrong softmax fails the
    first case of test_softmax_examples, whose cases begin with the same deterministic ones for every seed)."""
    _, _, out, _ = graded
    cases = assignments.load(PS).CHECKS["test_softmax_examples"].cases(np.random.default_rng(0))
    page = (out / "feedback" / "wrong-softmax" / "ps1-attention.html").read_text()
    row = next(line for line in page.split("<tr>") if line.startswith("<td>test_softmax_examples</td>"))
    assert html.escape(f"hidden case 1 of {len(cases)} ({cases[0].note}), softmax(") in row, row


def test_nothing_escaped_the_sandbox(graded):
    assert not (ROOT / "grades.csv").exists()
    assert not (ROOT / "solutions" / "x").exists()
    assert not (ROOT.parent / "out" / "grades.csv").exists()


def test_parallel_grading_equals_sequential(graded, tmp_path):
    base, subs, _, rows = graded
    quick = tmp_path / "subs"
    quick.mkdir()
    for name in ("solution", "untouched-release", "edited-points", "malformed-json", "zip-export", "imports-llmarch"):
        src = subs / name
        if src.is_dir():
            shutil.copytree(src, quick / name)
        else:
            shutil.copy(subs / f"{name}.zip", quick / f"{name}.zip")
    out = tmp_path / "out"
    assert grader_main(["grade", PS, str(quick), "--out", str(out), "--workers", "1", "--timeout", "10"]) == 0
    with open(out / "grades.csv", newline="") as f:
        sequential = {r["student"]: r for r in csv.DictReader(f)}
    for name, row in sequential.items():
        assert {k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")} == \
            {k: v for k, v in rows[name].items() if k not in ("seconds", "cpu_seconds")}, name


@pytest.mark.parametrize("assignment,full", [("ps2-positions", 13), ("ps3-tokenizers", 16), ("ps4-decoding", 11),
                                             ("ps5-efficient", 18), ("ps6-scaling", 14),
                                             ("ps7-modern", 20), ("ps8-objectives", 16), ("ps9-data", 17)])
def test_other_assignments_score_full_marks_and_zero(assignment, full, tmp_path):
    notebook = f"{assignment}.ipynb"
    subs = tmp_path / "subs"
    write(submission(assignment, notebook), subs / "solved", notebook)
    write(release(assignment, notebook), subs / "untouched", notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", assignment, str(subs), "--out", str(out), "--workers", "2", "--timeout", "10"]) == 0
    with open(out / "grades.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    manual = float(rows["solved"]["manual_pending"])
    assert rows["solved"]["status"] == "graded" and rows["solved"]["score"] == str(full)
    assert float(rows["solved"]["max_score"]) == full + manual
    assert rows["untouched"]["status"] == "graded" and rows["untouched"]["score"] == "0"
