"""README, "The course's secret": the hidden inputs depend on a per-course secret and on everything submitted,
so an answer key computed from the public repository earns nothing.

The attack is the red team's: a notebook with no softmax, whose ``softmax`` looks its answers up in an
``answers.npz`` placed beside it, computed offline with the public case generators and the reference for the
notebook's own code digest. Each of the two defences defeats it alone (the secret; the files beside the notebook
in the digest), and without both it earns the softmax cells in full, so the test can fail."""

from __future__ import annotations

import hashlib
import io
import os
import stat

import nbformat
import numpy as np
import pytest

from autograder import assignments, grade, secret
from autograder.__main__ import main as grader_main
from autograder.checks import expected_results
from autograder.intake import Submission
from autograder.notebooks import parse_notebook, prepare
from autograder.sandbox import bubblewrap_available
from submissions import submission, write

PS = "ps1-attention"
NB = assignments.load(PS).NOTEBOOK
SOFTMAX_CELLS = sorted(gid for gid, c in assignments.load(PS).CHECKS.items() if c.function == "softmax")

LOOKUP = '''
import hashlib
import numpy as np

_ANSWERS = dict(np.load("answers.npz")) if __import__("os").path.exists("answers.npz") else {}


def softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    key = "k" + hashlib.sha256(x.tobytes() + repr((x.shape, axis)).encode()).hexdigest()
    return _ANSWERS.get(key, np.zeros_like(x))
'''


def _key(x, axis) -> str:
    x = np.asarray(x, dtype=np.float64)
    return "k" + hashlib.sha256(x.tobytes() + repr((x.shape, axis)).encode()).hexdigest()


def answer_key(nb: nbformat.NotebookNode, draw_key, siblings: dict[str, bytes] | None = None) -> bytes:
    """``answers.npz`` for the softmax cells, from the public repository alone: the cases the grader draws under
    ``draw_key`` for this notebook's digest, and the reference's answers."""
    module = assignments.load(PS)
    template, _ = grade.release_template(PS)
    digest = grade._code_digest(prepare(parse_notebook(nbformat.writes(nb).encode()), template).notebook, siblings)
    answers = {}
    for gid in SOFTMAX_CELLS:
        check = module.CHECKS[gid]
        cases = check.cases(grade._case_rng(draw_key, digest, gid))
        for case, expected in zip(cases, expected_results(check, cases, module.TRUSTED_CALLABLES)):
            answers[_key(case.args[0], case.kwargs.get("axis", -1))] = expected
    buffer = io.BytesIO()
    np.savez(buffer, **answers)
    return buffer.getvalue()


def _softmax_points(tmp_path, options: grade.Options, siblings_in_digest: bool, monkeypatch) -> float:
    nb = submission(PS, NB, answers={"softmax": LOOKUP})
    if not siblings_in_digest:
        real = grade._code_digest
        monkeypatch.setattr(grade, "_code_digest", lambda notebook, siblings=None: real(notebook))
    folder = tmp_path / "mallory"
    write(nb, folder, NB)
    (folder / "answers.npz").write_bytes(answer_key(nb, 0))  # the public derivation: no secret, --seed 0
    result = grade.grade_one(PS, "mallory", Submission(folder, "folder"),
                             grade.Options(**{**options.__dict__, "cell_timeout": 20}))
    assert result.status == "graded", (result.status, result.detail)
    return sum(i.points for i in result.items if i.grade_id in SOFTMAX_CELLS)


needs_sandbox = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")


@needs_sandbox
def test_an_answer_key_from_the_public_repository_earns_nothing_and_each_defence_suffices(tmp_path, monkeypatch):
    full = sum(i.points for i in grade.release_template(PS)[0].auto_items if i.grade_id in SOFTMAX_CELLS)
    with monkeypatch.context() as m:  # neither defence: the attack works, so this test can fail
        assert _softmax_points(tmp_path / "none", grade.Options(), False, m) == full
    with monkeypatch.context() as m:
        assert _softmax_points(tmp_path / "secret", grade.Options(secret="0" * 64), False, m) == 0
    assert _softmax_points(tmp_path / "siblings", grade.Options(), True, monkeypatch) == 0


def test_the_hidden_inputs_change_with_the_secret_the_seed_and_every_file_beside_the_notebook():
    nb = prepare(parse_notebook(nbformat.writes(submission(PS, NB)).encode()), grade.release_template(PS)[0]).notebook
    check = assignments.load(PS).CHECKS["test_softmax_examples"]

    def first_random_case(options, siblings):
        rng = grade._case_rng(grade._draw_key(options), grade._code_digest(nb, siblings), "test_softmax_examples")
        return check.cases(rng)[-1].args[0]

    base = first_random_case(grade.Options(secret="a" * 64), {"helper.py": b"x = 1"})
    assert np.array_equal(base, first_random_case(grade.Options(secret="a" * 64), {"helper.py": b"x = 1"}))
    for options, siblings in [(grade.Options(secret="b" * 64), {"helper.py": b"x = 1"}),
                              (grade.Options(secret="a" * 64, seed=1), {"helper.py": b"x = 1"}),
                              (grade.Options(secret="a" * 64), {"helper.py": b"x = 2"}),
                              (grade.Options(secret="a" * 64), {"helper2.py": b"x = 1"}),
                              (grade.Options(secret="a" * 64), {})]:
        other = first_random_case(options, siblings)
        assert other.shape != base.shape or not np.array_equal(other, base), (options, siblings)


def test_the_secret_is_made_once_private_and_a_damaged_one_is_refused(tmp_path):
    path = tmp_path / "course" / secret.FILE_NAME
    value = secret.load_or_create(path)
    assert len(value) == 64 and int(value, 16) >= 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert secret.load_or_create(path) == value
    assert secret.load_or_create(tmp_path / "other") != value
    path.write_text("short")
    with pytest.raises(SystemExit, match="does not hold a grader secret"):
        secret.load_or_create(path)
    assert secret.default_path(tmp_path / "out", tmp_path / "course" / "gradebook.db") == path
    assert secret.default_path(tmp_path / "out", None) == tmp_path / "out" / secret.FILE_NAME


@needs_sandbox
def test_the_command_line_keeps_one_secret_per_course(tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    write(submission(PS, NB), subs / "alice", NB)
    kept = []
    for _ in range(2):
        assert grader_main(["grade", PS, str(subs), "--out", str(out), "--workers", "1", "--timeout", "20"]) == 0
        kept.append((out / secret.FILE_NAME).read_bytes())
    assert kept[0] == kept[1] and len(kept[0].strip()) == 64
    other = tmp_path / "elsewhere" / "s"
    assert grader_main(["grade", PS, str(subs), "--out", str(tmp_path / "out2"), "--workers", "1",
                        "--timeout", "20", "--secret", str(other)]) == 0
    assert other.exists() and not (tmp_path / "out2" / secret.FILE_NAME).exists()
