"""The grader against hostile and honest-but-unusual submissions, by class of failure (see autograder/grade.py):

1. the grader never crashes and never trusts what student code wrote (run records, .npy headers, hash floods,
   nasty trees, broken zips);
2. honest work is graded the way Jupyter runs it (helpers written with %%writefile, nbformat 3, lists for
   tuples, pasted test cells, stripped metadata);
3. statuses come from what the sandbox observed, and tampering is always reported;
4. one submission cannot hurt another (disk);
5. feedback never shows expected values, and the same notebook gets the same score under any name;
6. the submissions folder is untrusted too (links, names, stray files);
7. the notebook cannot reach a test cell's hidden inputs before that cell runs, nor write the heartbeat.

Most cases are graded together through the CLI in one run with two workers, as an instructor would; then a
``--workers 1`` run and a run with the work folders on a small tmpfs.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.__main__ import main as grader_main
from autograder.sandbox import Limits, bubblewrap_available, sweep_leftovers, work_folder
from submissions import release, submission, write
from test_wrong_variants import harnesses  # noqa: F401 - the fixture, for the ps7 cases below

ROOT = Path(__file__).resolve().parents[1]
PS, NB, FULL = "ps1-attention", "ps1-attention.ipynb", 15
OUT = "/submission/.grader-outputs"

pytestmark = pytest.mark.skipif(not bubblewrap_available(), reason="bubblewrap (Debian package) is not installed")

# name -> (builder(submissions_folder, name), status, score, tampered); a name is also the student's entry name
CASES: dict[str, tuple] = {}


def case(name, status, score, tampered="no"):
    def register(builder):
        CASES[name] = (builder, status, score, tampered)
        return builder
    return register


def solved(folder: Path, name: str, **kwargs) -> Path:
    return write(submission(PS, NB, **kwargs), folder / name, NB)


# Ends the run for good: a crash of the kernel alone costs only its cell (runner.py), so these cells kill the
# runner's supervisor, the kernel's parent.
KILL_RUNNER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"


def final_cell(code: str) -> list[str]:
    """A last cell that runs after every test cell has been captured."""
    return [code]


# -- 1. The grader never crashes and never trusts student-written files ---------------------------------------

@case("run-record-wrong-types", "crashed", FULL)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(
        "import json, os\njson.dump({'cells': 5, 'kernel': ['finished']}, open('/submission/.grader-run.json', 'w'))\n"
        + KILL_RUNNER))


@case("run-record-bad-cells", "crashed", FULL)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(
        "import json, os\njson.dump({'cells': [{'index': 'x'}, 7], 'kernel': 'finished'}, "
        "open('/submission/.grader-run.json', 'w'))\n" + KILL_RUNNER))


@case("run-record-forged-timeout", "crashed", FULL)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(
        "import json, os\njson.dump({'cells': [], 'kernel': 'timeout'}, open('/submission/.grader-run.json', 'w'))\n"
        + KILL_RUNNER))


@case("npy-enormous-shape", "graded", FULL - 1)
def _(folder, name):
    forge = (f"import os\npath = '{OUT}/test_softmax_axis/case0_out0.npy'\nraw = open(path, 'rb').read()\n"
             "start = raw.index(b'(')\nend = raw.index(b')', start)\n"
             "header = raw[:start] + b'(10**15,)' + raw[end + 1:raw.index(b'\\n') + 1]\n"
             "open(path, 'wb').write(header + raw[raw.index(b'\\n') + 1:])\n")
    solved(folder, name, extra_cells=final_cell(forge))


@case("npy-object-dtype", "graded", FULL - 1)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(
        f"np.save('{OUT}/test_softmax_axis/case0_out0.npy', np.array([{{'a': 1}}], dtype=object), allow_pickle=True)\n"))


@case("npy-truncated", "graded", FULL - 1)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(
        f"p = '{OUT}/test_softmax_axis/case0_out0.npy'\nd = open(p, 'rb').read()\nopen(p, 'wb').write(d[:-5])\n"))


@case("deep-tree-and-modes", "graded", FULL)
def _(folder, name):
    nasty = ("import os\nos.makedirs('/submission/deep', exist_ok=True)\nos.chdir('/submission/deep')\n"
             "for _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
             "open('f', 'w').write('x')\nos.chdir('/submission')\n"
             "os.makedirs('locked/inner', exist_ok=True)\nopen('locked/inner/f', 'w').write('x')\n"
             "os.chmod('locked/inner', 0)\nos.chmod('locked', 0o200)\n"
             "os.symlink('/etc/passwd', 'link')\nos.symlink('/', 'rootlink')\nos.mkfifo('fifo')\n")
    solved(folder, name, extra_cells=final_cell(nasty))


def _zip_with(folder: Path, name: str, patch) -> None:
    """A zip of the solved notebook whose bytes ``patch(data, local_offset, central_offset)`` then changes."""
    src = solved(folder / "_src", name)
    target = folder / f"{name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(src, NB)
    shutil.rmtree(folder / "_src")
    data = bytearray(target.read_bytes())
    patch(data, 0, data.index(b"PK\x01\x02"))
    target.write_bytes(bytes(data))


@case("zip-encrypted", "invalid-notebook", 0)
def _(folder, name):
    def encrypt_flag(data, local, central):
        data[local + 6] |= 1
        data[central + 8] |= 1
    _zip_with(folder, name, encrypt_flag)


@case("zip-unsupported-method", "invalid-notebook", 0)
def _(folder, name):
    def method_97(data, local, central):
        data[local + 8:local + 10] = struct.pack("<H", 97)
        data[central + 10:central + 12] = struct.pack("<H", 97)
    _zip_with(folder, name, method_97)


@case("zip-lying-sizes", "invalid-notebook", 0)
def _(folder, name):
    def small_sizes(data, local, central):  # claims the notebook is 100 bytes: the CRC then cannot match
        data[local + 22:local + 26] = struct.pack("<I", 100)
        data[central + 24:central + 28] = struct.pack("<I", 100)
    _zip_with(folder, name, small_sizes)


@case("zip-bomb-claims", "invalid-notebook", 0)
def _(folder, name):
    def huge_sizes(data, local, central):  # claims 4 GB uncompressed
        data[local + 22:local + 26] = struct.pack("<I", 2**32 - 1)
        data[central + 24:central + 28] = struct.pack("<I", 2**32 - 1)
    _zip_with(folder, name, huge_sizes)


@case("zip-garbage", "invalid-notebook", 0)
def _(folder, name):
    (folder / f"{name}.zip").write_bytes(b"PK\x03\x04" + os.urandom(2000))


# -- 2. Honest work, graded the way Jupyter runs it -----------------------------------------------------------

@case("writefile-helper", "graded", FULL)
def _(folder, name):
    from submissions import solution_sources
    helper = "%%writefile softmax_helper.py\nimport numpy as np\n\n" + solution_sources(PS, NB)["softmax"] + "\n"
    nb = submission(PS, NB, answers={"softmax": "from softmax_helper import softmax"})
    index = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    nb.cells.insert(index, nbformat.v4.new_code_cell(helper))
    write(nb, folder / name, NB)


@case("helper-file-beside-notebook", "graded", FULL)
def _(folder, name):
    from submissions import solution_sources
    solved(folder, name, answers={"softmax": "from mysoftmax import softmax"})
    (folder / name / "mysoftmax.py").write_text("import numpy as np\n\n" + solution_sources(PS, NB)["softmax"] + "\n")


@case("nbformat-3", "graded", FULL)
def _(folder, name):
    (folder / name).mkdir()
    (folder / name / NB).write_text(nbformat.writes(nbformat.convert(submission(PS, NB), 3), version=3))


@case("list-instead-of-tuple", "graded", FULL)
def _(folder, name):
    from submissions import solution_sources
    sdpa = solution_sources(PS, NB)["scaled_dot_product_attention"].replace(
        "return np.matmul(weights, v), weights", "return [np.matmul(weights, v), weights]")
    assert "return [" in sdpa
    solved(folder, name, answers={"scaled_dot_product_attention": sdpa})


@case("torch-tensor-results", "graded", FULL)
def _(folder, name):
    from submissions import solution_sources
    soft = solution_sources(PS, NB)["softmax"].replace("def softmax(", "def _np_softmax(")
    soft += "\nimport torch\n\ndef softmax(x, axis=-1):\n    return torch.from_numpy(_np_softmax(x, axis))\n"
    solved(folder, name, answers={"softmax": soft})


@case("pasted-test-cell-copy", "graded", FULL)
def _(folder, name):
    nb = submission(PS, NB)
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_examples")
    copy = nbformat.from_dict(dict(test))
    copy["id"] = "pasted-copy-1"
    nb.cells.insert(1, copy)  # above the definition of softmax: running it there would fail
    write(nb, folder / name, NB)


@case("stripped-metadata", "graded", FULL)
def _(folder, name):
    nb = submission(PS, NB)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "causal_not_equivariant":
            cell.source = "Because the mask ties each output to its position: ANSWER-KEPT."
        cell.metadata.pop("nbgrader", None)
    write(nb, folder / name, NB)


def _cell_index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


@case("no-cell-ids-copy-above", "graded", FULL)
def _(folder, name):
    """An editor that drops cell ids (nbformat 4.4), and a copy of a test cell pasted above its function."""
    nb = submission(PS, NB)
    copy = nbformat.from_dict(dict(nb.cells[_cell_index(nb, "test_causal_mask")]))
    nb.cells.insert(_cell_index(nb, "causal_mask"), copy)
    for cell in nb.cells:
        cell.pop("id", None)
    nb.nbformat_minor = 4
    (folder / name).mkdir()
    (folder / name / NB).write_text(nbformat.writes(nb, version=nbformat.NO_CONVERT))


@case("several-copies-no-ids", "graded", FULL)
def _(folder, name):
    """Copies of the three softmax tests pasted right after the set-up cell, in order, in a notebook re-saved
    with new cell ids: each copy's release neighbour is another copy (issue 33)."""
    nb = submission(PS, NB)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test_softmax")]
    for offset, test in enumerate(tests):
        nb.cells.insert(2 + offset, nbformat.from_dict(dict(test)))
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"resaved{index}"
    write(nb, folder / name, NB)


@case("answer-split-in-three", "graded", FULL)
def _(folder, name):
    """JupyterLab's split cell, twice: every part keeps the answer cell's metadata."""
    nb = submission(PS, NB)
    index = _cell_index(nb, "causal_not_equivariant")
    parts = ["PART-ONE of my answer.", "PART-TWO, the argument.", "PART-THREE, the example."]
    nb.cells[index].source = parts[0]
    for k, text in enumerate(parts[1:], start=1):
        piece = nbformat.from_dict(dict(nb.cells[index]))
        piece["id"], piece["source"] = f"split-part-{k}", text
        nb.cells.insert(index + k, piece)
    write(nb, folder / name, NB)


@case("upper-case-extension", "graded", FULL)
def _(folder, name):
    path = solved(folder, name)
    (path.parent / "work").mkdir()
    path.rename(path.parent / "work" / "PS1-Attention.IPYNB")


@case("zip-upper-case-extension", "graded", FULL)
def _(folder, name):
    with zipfile.ZipFile(folder / f"{name}.zip", "w") as zf:
        zf.writestr("submission/ps1-attention.IpYnB", nbformat.writes(submission(PS, NB)))


@case("zip-helper-name-too-long", "graded", FULL)
def _(folder, name):
    from submissions import solution_sources
    helper = "import numpy as np\n\n" + solution_sources(PS, NB)["softmax"] + "\n"
    with zipfile.ZipFile(folder / f"{name}.zip", "w") as zf:
        zf.writestr(NB, nbformat.writes(submission(PS, NB)))
        zf.writestr("h" * 400 + ".py", helper)  # no file system takes this name
        zf.writestr("myhelper.py", helper)


@case("outputs-make-it-35mb", "graded", FULL)
def _(folder, name):
    """Saved outputs (a figure, a long print) and a pasted image make the file far larger than its code."""
    nb = submission(PS, NB)
    figure = {"image/png": "iVBORw0KGgo" + "A" * (20 * 2**20), "text/plain": "<Figure>"}
    nb.cells[_cell_index(nb, "softmax")].outputs = [
        nbformat.v4.new_output("display_data", data=figure),
        nbformat.v4.new_output("stream", name="stdout", text="0.5 " * (2 * 2**20))]
    text = nb.cells[_cell_index(nb, "softmax-text")]
    text["attachments"] = {"plot.png": {"image/png": "B" * (7 * 2**20)}}
    write(nb, folder / name, NB)


@case("extra-cells-raise", "graded", FULL)
def _(folder, name):
    solved(folder, name, extra_cells=["raise ValueError('my own experiment')", "raise MemoryError('fake')",
                                      "import sys\nprint('MemoryError', file=sys.stderr)\nsys.exit(3)"])


@case("int-mask", "graded", FULL - 1)
def _(folder, name):
    solved(folder, name, answers={"causal_mask": "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=int))\n"})


# -- 3. Statuses tell the truth ------------------------------------------------------------------------------

@case("tampered-and-timeout", "timeout", 3, tampered="yes")
def _(folder, name):
    nb = submission(PS, NB, answers={"causal_mask": "while True:\n    pass\n"})
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_examples":
            c.source = "pass"
    write(nb, folder / name, NB)


@case("tampered-and-memory", "memory-limit", 3, tampered="yes")
def _(folder, name):
    nb = submission(PS, NB, answers={"causal_mask": "hog = []\nwhile True:\n    hog.append(np.ones(2**23))\n"})
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax_axis":
            c.metadata["nbgrader"]["points"] = 50
    write(nb, folder / name, NB)


@case("kills-itself", "crashed", FULL)  # SIGKILL, the out-of-memory killer's signal, ends the run (runner.py)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"))


# Notebook code: the paths /proc/<pid>/fd/<n> of every process the notebook can list (its own only if asked).
OPEN_FILES = """
import os
def open_files(own=False):
    for pid in filter(str.isdigit, os.listdir('/proc')):
        if int(pid) == os.getpid() and not own:
            continue
        try:
            entries = os.listdir(f'/proc/{pid}/fd')
        except OSError:
            continue
        for entry in entries:
            yield f'/proc/{pid}/fd/{entry}'
"""

# Writes `line` to every pipe the notebook can reach outside its own process: the heartbeat's number from the
# environment, if the notebook has it, and each pipe of another process through /proc/<pid>/fd.
FORGE_PIPES = OPEN_FILES + """
def forge(line):
    fds = [int(os.environ['GRADER_HEARTBEAT_FD'])] if 'GRADER_HEARTBEAT_FD' in os.environ else []
    for fd in fds:
        try:
            os.write(fd, line)
        except OSError:
            pass
    for path in open_files():
        try:
            if os.readlink(path).startswith('pipe:'):
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, line)
                os.close(fd)
        except OSError:
            pass
"""


@case("forges-done-then-exits", "crashed", FULL)
def _(folder, name):
    solved(folder, name, extra_cells=final_cell(FORGE_PIPES + "forge(b'done\\n')\n" + KILL_RUNNER))


@case("forges-beats-from-a-thread", "timeout", FULL)
def _(folder, name):
    keep_alive = ("import threading, time\ndef beat():\n    while True:\n        forge(b'cell 1\\n')\n"
                  "        time.sleep(0.2)\nthreading.Thread(target=beat, daemon=True).start()\ntime.sleep(25)\n")
    solved(folder, name, extra_cells=final_cell(FORGE_PIPES + keep_alive))


@case("disk-filler", "graded", FULL)
def _(folder, name):
    fill = ("import os\ntry:\n    for i in range(1000):\n        with open(f'/submission/fill{i}', 'wb') as f:\n"
            "            f.write(b'x' * (60 * 2**20))\nexcept OSError as err:\n    print('stopped:', err)\n")
    solved(folder, name, extra_cells=final_cell(fill))


# -- 7. Hidden inputs are out of reach until their test cell runs --------------------------------------------

# A first cell that looks everywhere it can for the hidden cases (files, other processes' open files,
# environments and memory) and, if it finds any, ends the notebook at once.
HUNT = OPEN_FILES + """
def _hunt():
    needles = [('spec' + '.json').encode(), ('"ret' + 'urns": ').encode()]
    import sys
    python = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    for top in ('/grader', '/tmp', '/submission', '/run', '/var', '/dev/shm', '/home'):
        for folder, _, files in os.walk(top):
            if (os.path.realpath(folder) + os.sep).startswith(python):
                continue  # the Python the sandbox runs (a clone under /tmp or /home brings its .venv along)
            if any(f == 'spec' + '.json' or f.endswith(('.npy', '.zip')) for f in files):
                return 'file in ' + folder
    for pid in filter(str.isdigit, os.listdir('/proc')):
        for what in ('environ', 'mem') if int(pid) != os.getpid() else ():
            try:
                with open(f'/proc/{pid}/{what}', 'rb') as f:
                    if what == 'environ':
                        f.read()
                return f'/proc/{pid}/{what} is readable'
            except OSError:
                pass
    for path in open_files(own=True):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(fd, 2**20)
        except OSError:
            data = b''
        os.close(fd)
        if any(needle in data for needle in needles):  # built here, so not in IPython's history
            return path + ' -> ' + os.readlink(path)
    return None
_found = _hunt()
if _found:
    print('FOUND', _found, flush=True)
    os.kill(os.getppid(), 9)  # the run ends crashed (a crash of the kernel alone costs only its cell)
"""


@case("hunts-hidden-inputs-first", "graded", FULL)
def _(folder, name):
    nb = submission(PS, NB)
    nb.cells.insert(0, nbformat.v4.new_code_cell(HUNT))
    write(nb, folder / name, NB)


# -- 6. The submissions folder is untrusted ------------------------------------------------------------------

@case("link-to-solutions", "invalid-notebook", 0)
def _(folder, name):
    (folder / name).symlink_to(ROOT / "solutions" / PS)


@case("zip-link", "invalid-notebook", 0)
def _(folder, name):
    real = folder.parent / "elsewhere.zip"
    with zipfile.ZipFile(real, "w") as zf:
        zf.writestr(NB, nbformat.writes(submission(PS, NB)))
    (folder / f"{name}.zip").symlink_to(real)


@case("linked-subfolder", "missing", 0)
def _(folder, name):
    (folder / name).mkdir()
    (folder / name / "work").symlink_to(ROOT / "solutions" / PS)


@case("linked-notebook", "invalid-notebook", 0)
def _(folder, name):
    (folder / name).mkdir()
    (folder / name / NB).symlink_to(ROOT / "solutions" / PS / NB)


@case("=HYPERLINK(\"http:evil\")", "graded", 0)
def _(folder, name):
    write(release(PS, NB), folder / name, NB)


@case("+cmd", "graded", 0)
def _(folder, name):
    write(release(PS, NB), folder / name, NB)


@case("@SUM(1)", "graded", 0)
def _(folder, name):
    write(release(PS, NB), folder / name, NB)


@case(".dot-student", "graded", FULL)
def _(folder, name):
    solved(folder, name)


@case("..sneaky", "graded", FULL)
def _(folder, name):
    solved(folder, name)


@case("new\nline", "graded", 0)
def _(folder, name):
    write(release(PS, NB), folder / name, NB)


@case("caf\udce9", "graded", 0)  # the bytes b"caf\xe9": not UTF-8
def _(folder, name):
    write(release(PS, NB), folder / name, NB)


# -- Running them --------------------------------------------------------------------------------------------

def build_all(subs: Path, names) -> None:
    subs.mkdir(parents=True, exist_ok=True)
    for name in names:
        CASES[name][0](subs, name)


def read_rows(out: Path) -> dict[str, dict]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


def row_for(rows: dict, name: str) -> dict:
    """The CSV row of an entry name (formula names are stored with a leading apostrophe, control characters
    as '?' with a hash)."""
    if name in rows:
        return rows[name]
    if "'" + name in rows:
        return rows["'" + name]
    printable = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    printable = "".join(ch if ch.isprintable() else "?" for ch in printable)
    matches = [r for key, r in rows.items() if key.startswith(printable + " [")]
    assert len(matches) == 1, (name, list(rows))
    return matches[0]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    subs = base / "submissions"
    build_all(subs, CASES)
    (subs / "notes.txt").write_text("a stray file: a warning, not a row")
    solved(subs, "dave")
    shutil.make_archive(str(subs / "dave"), "zip", subs / "dave")  # dave/ and dave.zip: one row and a warning
    out = base / "out"
    args = ["grade", PS, str(subs), "--out", str(out), "--workers", "2", "--timeout", "10",
            "--notebook-timeout", "60", "--memory", "1024"]
    assert grader_main(args) == 0
    return base, subs, out, read_rows(out)


def test_at_least_thirty_hostile_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", list(CASES))
def test_case_gets_its_status_points_and_tampered_flag(name, graded):
    _, _, out, rows = graded
    _, status, score, tampered = CASES[name]
    row = row_for(rows, name)
    assert (row["status"], float(row["score"]), row["tampered"]) == (status, score, tampered), row
    assert row["max_score"] == str(FULL + 2)  # with the written answer, graded by hand


def test_every_entry_is_one_row_or_one_warning(graded, capsys):
    _, subs, _, rows = graded
    assert len(rows) == len(CASES) + 1  # every case and dave; notes.txt and dave.zip are warnings
    assert row_for(rows, "dave")["status"] == "graded"


def test_spreadsheet_formulas_are_neutralised(graded):
    _, _, out, _ = graded
    text = (out / "grades.csv").read_text(encoding="utf-8")
    for line in csv.reader(text.splitlines()):
        for cell in line:
            assert cell[:1] not in ("=", "+", "@"), cell
    assert "'=HYPERLINK" in text and "'+cmd" in text and "'@SUM(1)" in text


def test_unprintable_names_are_shown_with_a_hash(graded):
    _, _, _, rows = graded
    assert len([name for name in rows if re.fullmatch(r"new\?line \[[0-9a-f]{8}\]", name)]) == 1
    assert len([name for name in rows if re.fullmatch("caf\ufffd \\[[0-9a-f]{8}\\]", name)]) == 1


def test_feedback_stays_inside_the_feedback_folder(graded):
    base, _, out, rows = graded
    pages = sorted((out / "feedback").rglob("*.html"))
    assert len(pages) == len(rows)
    for page in pages:
        assert page.resolve().parent.parent == (out / "feedback").resolve()
        assert not page.parent.name.startswith(".")
    assert not any(p.name.endswith(".html") for p in base.iterdir())


def test_symlinked_solutions_are_never_graded_as_the_students_work(graded):
    _, _, out, rows = graded
    assert "symbolic link" in row_for(rows, "link-to-solutions")["detail"]
    assert "symbolic link" in row_for(rows, "zip-link")["detail"]


def test_statuses_say_what_was_observed(graded):
    _, _, _, rows = graded
    assert "MemoryError" in row_for(rows, "extra-cells-raise")["detail"]  # said, but not believed
    assert "out-of-memory" in row_for(rows, "tampered-and-memory")["detail"] or \
        "watchdog" in row_for(rows, "tampered-and-memory")["detail"]
    assert "edited" in row_for(rows, "tampered-and-timeout")["notes"]
    assert "points of 'test_softmax_axis' were changed" in row_for(rows, "tampered-and-memory")["notes"]
    assert "copy" in row_for(rows, "pasted-test-cell-copy")["notes"]


def test_written_answer_survives_stripped_metadata(graded):
    _, _, out, _ = graded
    page = next((out / "feedback").glob("stripped-metadata*/*.html")).read_text()
    assert "ANSWER-KEPT" in page


def test_intake_notes_say_what_was_changed(graded):
    _, _, out, rows = graded
    assert "left out" in row_for(rows, "zip-helper-name-too-long")["notes"]
    assert "myhelper.py" in row_for(rows, "zip-helper-name-too-long")["notes"]
    assert "outputs, which were removed" in row_for(rows, "outputs-make-it-35mb")["notes"]
    page = next((out / "feedback").glob("answer-split-in-three*/*.html")).read_text()
    assert all(part in page for part in ("PART-ONE", "PART-TWO", "PART-THREE"))
    assert "copy" in row_for(rows, "no-cell-ids-copy-above")["notes"]
    assert row_for(rows, "several-copies-no-ids")["notes"].count("was not run") == 3


def test_int_mask_message_names_the_dtype(graded):
    _, _, out, rows = graded
    assert row_for(rows, "int-mask")["test_causal_mask"] == "0"
    page = (out / "feedback" / "int-mask" / "ps1-attention.html").read_text()
    assert "expected a boolean array, got dtype int64" in page


def test_feedback_never_shows_expected_values(graded):
    _, _, out, _ = graded
    for page in (out / "feedback").glob("*/*.html"):
        text = page.read_text()
        assert not re.search(r"expected -?\d", text), page
        assert "BEGIN HIDDEN TESTS" not in text


def test_same_notebook_same_row_under_any_name(graded):
    _, _, _, rows = graded
    same = [row_for(rows, n) for n in ("=HYPERLINK(\"http:evil\")", "+cmd", "@SUM(1)", "new\nline")]
    drop = ("student", "id", "seconds", "cpu_seconds")
    assert all({k: v for k, v in r.items() if k not in drop} == {k: v for k, v in same[0].items() if k not in drop}
               for r in same)


def test_one_worker_gives_the_same_rows(graded, tmp_path):
    base, subs, _, rows = graded
    names = ["run-record-bad-cells", "npy-object-dtype", "zip-lying-sizes", "nbformat-3", "list-instead-of-tuple",
             "stripped-metadata", "link-to-solutions", "+cmd"]
    quick = tmp_path / "subs"
    build_all(quick, names)
    out = tmp_path / "out"
    assert grader_main(["grade", PS, str(quick), "--out", str(out), "--workers", "1", "--timeout", "10",
                        "--notebook-timeout", "60", "--memory", "1024"]) == 0
    for name, row in read_rows(out).items():
        before = {k: v for k, v in rows[name].items() if k not in ("seconds", "cpu_seconds")}
        assert {k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")} == before, name


def test_a_grader_failure_is_reported_and_the_rest_graded(tmp_path, monkeypatch):
    import autograder.grade as grade

    real_prepare = grade.prepare

    def failing_prepare(nb, template):
        if any("TRIGGER-GRADER-BUG" in c.source for c in nb.cells):
            raise RuntimeError("simulated bug in the grader")
        return real_prepare(nb, template)

    monkeypatch.setattr(grade, "prepare", failing_prepare)
    subs = tmp_path / "subs"
    solved(subs, "ok")
    solved(subs, "unlucky", extra_cells=["# TRIGGER-GRADER-BUG"])
    out = tmp_path / "out"
    assert grader_main(["grade", PS, str(subs), "--out", str(out), "--workers", "1", "--timeout", "10"]) == 3
    rows = read_rows(out)
    assert rows["ok"]["status"] == "graded" and rows["ok"]["score"] == str(FULL)
    assert rows["unlucky"]["status"] == "grader-error"
    assert "simulated bug in the grader" in rows["unlucky"]["detail"]
    assert "not your fault" in (out / "feedback" / "unlucky" / "ps1-attention.html").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the work folders needs root")
def test_work_folders_on_a_small_file_system(tmp_path):
    """The grader's work folders on a 64 MB tmpfs: a submission that fills its disk and one that leaves a
    3,000-deep tree fail alone (the others are graded), and nothing is left behind."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    try:
        subs = tmp_path / "subs"
        build_all(subs, ["disk-filler", "deep-tree-and-modes"])
        solved(subs, "neighbour")
        out = tmp_path / "out"
        env = {**os.environ, "TMPDIR": str(small)}
        done = subprocess.run([sys.executable, "-m", "autograder", "grade", PS, str(subs), "--out", str(out),
                               "--workers", "2", "--timeout", "10", "--notebook-timeout", "60", "--memory", "1024"],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        rows = read_rows(out)
        assert {n: (r["status"], r["score"]) for n, r in rows.items()} == {
            "disk-filler": ("graded", str(FULL)), "deep-tree-and-modes": ("graded", str(FULL)),
            "neighbour": ("graded", str(FULL))}
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


HASH_FLOOD = ("import json\nkeys = [k * (2**61 - 1) for k in range(1, 120001)]  # all hash to 0\n"
              "json.dump({'dict': [[k, 1] for k in keys]}, "
              "open('/submission/.grader-outputs/test_pair_stats/case0_out.json', 'w'))\n")


@pytest.mark.parametrize("assignment,answers,extra,item", [
    # ps3: a forged result whose 120,000 dict keys share one hash (O(n^2) to build) is refused in O(n log n)
    ("ps3-tokenizers", None, [HASH_FLOOD], "test_pair_stats"),
    # ps4: a beam step that returns a list of its two arrays, as the visible test unpacks it
    ("ps4-decoding", "list", [], None),
])
def test_other_assignments(assignment, answers, extra, item, tmp_path):
    from autograder.assignments import load
    from submissions import solution_sources

    notebook = load(assignment).NOTEBOOK
    if answers == "list":
        sources = solution_sources(assignment, notebook)
        step = sources["beam_search_step"]
        returns = re.findall(r"^    return (.+)$", step, flags=re.M)
        assert returns, step
        answers = {"beam_search_step": step.replace(f"return {returns[-1]}", f"return [{returns[-1]}]")}
    subs = tmp_path / "subs"
    write(submission(assignment, notebook, answers=answers, extra_cells=extra), subs / "student", notebook)
    out = tmp_path / "out"
    assert grader_main(["grade", assignment, str(subs), "--out", str(out), "--workers", "1", "--timeout", "20"]) == 0
    row = read_rows(out)["student"]
    assert row["status"] == "graded", row
    failed = [gid for gid in load(assignment).CHECKS if row[gid] == "0"]
    assert failed == ([] if item is None else [item]), row


# -- 8. Leftovers: a grader killed halfway leaves nothing that the next one does not remove ---------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="a work folder is a tmpfs mount only when the grader is root")
def test_a_killed_grader_leaves_nothing_that_the_next_one_does_not_remove(tmp_path):
    killed = ("import os, signal, sys\nfrom pathlib import Path\nfrom autograder.sandbox import Limits, work_folder\n"
              "with work_folder(Limits(disk_mb=8), parent=Path(sys.argv[1])) as folder:\n"
              "    (folder / 'submission').mkdir()\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "lib")])}
    assert subprocess.run([sys.executable, "-c", killed, str(tmp_path)], env=env).returncode == -9
    left = list(tmp_path.glob("llmarch-grade-*"))
    assert len(left) == 1 and os.path.ismount(left[0]) and (left[0] / "submission").is_dir()
    with work_folder(Limits(disk_mb=8), parent=tmp_path) as live:  # a grader at work: its folder is locked
        assert sweep_leftovers(tmp_path, min_age=0) == [str(left[0])]
        assert live.is_dir() and not left[0].exists()
    assert list(tmp_path.iterdir()) == []



# -- 9. ps7: torch tensors are answers, and the float64 contract is the same in visible and hidden tests -------

def _ps7_returning(dtype: str) -> dict:
    """ps7's solution namespace with every graded function returning a torch tensor of ``dtype``."""
    import numpy as np
    import torch
    from test_wrong_variants import _namespace

    ns = _namespace("ps7-modern")

    def as_torch(value):
        return tuple(map(as_torch, value)) if isinstance(value, tuple) else torch.from_numpy(np.asarray(value)).to(
            getattr(torch, dtype))

    for name in ("rms_norm", "swiglu", "rope_rotate_half", "grouped_query_attention", "llama3_inv_freq",
                 "rolling_cache_step"):
        ns[name] = (lambda f: lambda *a, **k: as_torch(f(*a, **k)))(ns[name])
    return ns


def test_ps7_torch_answers_pass_visible_and_hidden_tests_and_float32_fails_both_by_name(harnesses):
    from test_wrong_variants import _test_cells, _visible_failures

    cells = _test_cells("ps7-modern")
    ns = _ps7_returning("float64")
    assert _visible_failures("ps7-modern", ns, cells) == {}
    assert harnesses("ps7-modern").lost(ns, 0) == set()
    ns = _ps7_returning("float32")
    failures = _visible_failures("ps7-modern", ns, cells)
    assert set(failures) == set(cells) and all("float32" in m for m in failures.values()), failures
    assert harnesses("ps7-modern").lost(ns, 0) == set(cells)


# -- 10. Statuses never come from the notebook's files: an answer that makes judging raise fails its own check ---

def test_an_answer_that_makes_the_comparison_raise_fails_that_check_not_the_submission():
    """README, "Phase 2": everything the sandbox left behind is untrusted data. A captured result the judge cannot
    handle (the red team's int64 logits made a cross-entropy raise) is that check's failure, with the reason; it
    never turns the submission's status into grader-error."""
    import numpy as np

    from autograder.checks import OUTPUTS, Case, Check
    from autograder.grade import _judge_one

    def loss_verdict(cases, returned):
        import torch
        import torch.nn.functional as F

        logits = torch.as_tensor(returned[0][0])
        return None if float(F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))) < 10 else "high"

    check = Check("logits", lambda rng: [Case((np.zeros(2),))], lambda x: np.zeros((2, 3)), verdict=loss_verdict)
    files = {f"{OUTPUTS}/t/case0_out0.npy": _npy(np.zeros((2, 3), dtype=np.int64))}
    result = _judge_one(check, "t", check.cases(None), [np.zeros((2, 3))], files)
    assert not result.passed and result.message.startswith("your results for this test could not be judged: ")
    files = {f"{OUTPUTS}/t/case0_out0.npy": _npy(np.zeros((2, 3)))}
    assert _judge_one(check, "t", check.cases(None), [np.zeros((2, 3))], files).passed


def _npy(array) -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# -- 11. Bounded trusted work: a notebook of 60,000 empty cells is refused before it is validated ----------------

def test_a_notebook_of_too_many_cells_is_refused_quickly_and_one_of_many_cells_is_not():
    """README, "Grading": a notebook file may have up to 50 MB, and preparation must stay bounded. The red team's
    60,000 empty cells (7.8 MB) took 31 s of the grader's own time; the cap is checked before nbformat validates."""
    import json

    from autograder.notebooks import MAX_CELLS, InvalidNotebook, parse_notebook

    def notebook(cells: int) -> bytes:
        cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": ""}
        return json.dumps({"cells": [cell] * cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()

    with pytest.raises(InvalidNotebook, match=f"60000 cells; the limit is {MAX_CELLS}"):
        parse_notebook(notebook(60_000))
    assert len(parse_notebook(notebook(MAX_CELLS)).cells) == MAX_CELLS
    v3 = {"worksheets": [{"cells": [{"cell_type": "code", "input": "", "outputs": [], "metadata": {}}] * 3000}],
          "metadata": {}, "nbformat": 3, "nbformat_minor": 0}
    with pytest.raises(InvalidNotebook, match="3000 cells"):
        parse_notebook(json.dumps(v3).encode())


# -- 12. Tampering means what the README says: any changed points or grade flag of a known cell is reported -------

def test_points_raised_on_a_written_answer_or_an_answer_cell_made_graded_are_tampering():
    """README, status table: ``tampered``: read-only cells or points were edited. The red team raised a written
    answer's points to 100 and made a code answer cell a graded cell worth 50: neither was reported."""
    from autograder.grade import release_template
    from autograder.notebooks import prepare

    template, notebook = release_template("ps1-attention")
    answer = next(i.grade_id for i in template.items if i.kind == "manual")
    nb = submission("ps1-attention", notebook)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") == answer:
            meta["points"] = 100
        elif meta.get("grade_id") == "softmax":
            meta.update(grade=True, points=50)
    tampering = prepare(nb, template).tampering
    assert any(f"points of {answer!r} were changed" in t and "to 100" in t for t in tampering), tampering
    assert any("'softmax' was made a graded cell" in t for t in tampering), tampering
    assert any("points of 'softmax' were changed from none to 50" in t for t in tampering), tampering
    assert prepare(submission("ps1-attention", notebook), template).tampering == []  # an honest notebook
