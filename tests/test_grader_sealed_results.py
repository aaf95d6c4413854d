"""README, "How it grades": a test cell's results are what the student's function returned when that cell ran.
The red team's ps1 notebook had a wrong causal_mask and a later cell that rewrote the captured files in
.grader-outputs/ with the right masks: 15/15. The supervisor now seals each check's files right after its test
cell (a digest on the heartbeat, which the notebook cannot write), and the grader refuses files that changed."""

from __future__ import annotations

import pytest

from autograder import assignments
from autograder.__main__ import main as grader_main
from autograder.sandbox import bubblewrap_available
from submissions import submission, write
from test_wrong_variants import read_grades

PS1 = "ps1-attention"
WRONG_MASK = "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool), k=-1)\n"
REWRITE = '''
import glob, os
for path in glob.glob(".grader-outputs/test_causal_mask/case*_out0.npy"):
    n = np.load(path).shape[0]
    np.save(path, np.tril(np.ones((n, n), dtype=bool)))
'''
ADD = '''
import os
os.makedirs(".grader-outputs/test_softmax_axis", exist_ok=True)
np.save(".grader-outputs/test_softmax_axis/case9_out0.npy", np.zeros(3))
'''


@pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")
def test_results_rewritten_or_added_by_a_later_cell_are_refused_and_honest_results_count(tmp_path):
    notebook = assignments.load(PS1).NOTEBOOK
    subs = tmp_path / "subs"
    write(submission(PS1, notebook, answers={"causal_mask": WRONG_MASK}), subs / "control", notebook)
    write(submission(PS1, notebook, answers={"causal_mask": WRONG_MASK}, extra_cells=[REWRITE]), subs / "rewrite",
          notebook)
    write(submission(PS1, notebook, extra_cells=[ADD]), subs / "added", notebook)
    write(submission(PS1, notebook), subs / "honest", notebook)
    assert grader_main(["grade", PS1, str(subs), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    rows = read_grades(tmp_path / "out")
    assert rows["control"]["test_causal_mask"] == "0" and rows["rewrite"]["test_causal_mask"] == "0"
    assert rows["rewrite"]["score"] == rows["control"]["score"]
    assert rows["added"]["test_softmax_axis"] == "0" and float(rows["added"]["score"]) == 14
    assert float(rows["honest"]["score"]) == 15
    page = next((tmp_path / "out" / "feedback").glob("rewrite*/*.html")).read_text()
    assert "changed after its test cell ran" in page
