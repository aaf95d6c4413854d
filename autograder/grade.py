"""Grading a folder of submissions: phase 1 in the sandbox, phase 2 here, in parallel workers.

Each worker grades one submission at a time and returns a plain result; only the main process writes the
gradebook, the CSV and the feedback files. Every submission ends in exactly one status:

``graded``           ran to the end; points are what the hidden checks gave
``tampered``         graded with protected cells restored, and the edits are listed for the instructor
``timeout``          a cell or the whole notebook ran past its time limit; checks captured before it count
``memory-limit``     the notebook used more memory than allowed; checks captured before it count
``crashed``          the kernel or the runner died (segfault, ``os._exit``, ...); checks captured before it count
``invalid-notebook`` the file is not a readable notebook (not UTF-8, not JSON, not the Jupyter format)
``missing``          no notebook with the expected name was submitted
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import zipfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from autograder import assignments
from autograder.checks import judge, write_inputs
from autograder.notebooks import InvalidNotebook, Template, parse_notebook, prepare
from autograder.sandbox import Limits, read_result_file, run_sandboxed

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
STATUSES = ("graded", "tampered", "timeout", "memory-limit", "crashed", "invalid-notebook", "missing")
MAX_ZIP_BYTES = 50 * 2**20


@dataclass(frozen=True)
class Options:
    cell_timeout: float = 60.0
    notebook_timeout: float = 300.0
    memory_mb: int = 2048
    seed: int = 0
    unsafe_no_sandbox: bool = False


@dataclass
class ItemResult:
    grade_id: str
    kind: str
    points: float | None  # None: to be graded by hand
    max_points: float
    message: str


@dataclass
class SubmissionResult:
    student: str
    status: str
    detail: str = ""
    items: list[ItemResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)

    @property
    def score(self) -> float:
        return sum(i.points or 0.0 for i in self.items)


def release_template(assignment: str) -> tuple[Template, str]:
    module = assignments.load(assignment)
    path = ROOT / "exercises" / assignment / module.NOTEBOOK
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `make assignments` to generate the release notebooks")
    return Template.from_release(nbformat.read(path, as_version=4)), module.NOTEBOOK


def find_submissions(folder: Path) -> dict[str, Path]:
    """``folder/<student>/`` directories and ``folder/<student>.zip`` files, by student name."""
    if not folder.is_dir():
        raise SystemExit(f"submissions folder {folder} does not exist")
    found = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and not entry.name.startswith("."):
            found[entry.name] = entry
        elif entry.suffix == ".zip" and entry.is_file():
            found.setdefault(entry.stem, entry)
    return found


def _read_from_zip(path: Path, notebook: str) -> tuple[bytes | None, list[str]]:
    """The bytes of ``notebook`` anywhere inside the zip (LMS exports nest folders), and the other names seen."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(".ipynb") and "__MACOSX" not in n]
            matches = [n for n in names if Path(n).name == notebook]
            if not matches:
                return None, names
            info = zf.getinfo(matches[0])
            if info.file_size > MAX_ZIP_BYTES:
                raise InvalidNotebook(f"{notebook} in the zip is {info.file_size / 2**20:.0f} MB")
            return zf.read(info), names
    except zipfile.BadZipFile:
        raise InvalidNotebook(f"{path.name} is not a readable zip file") from None


def _read_from_folder(path: Path, notebook: str) -> tuple[bytes | None, list[str]]:
    candidates = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    for p in candidates:
        if p.name == notebook and p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                return f.read(MAX_ZIP_BYTES + 1), []
    return None, [str(p.relative_to(path)) for p in candidates]


def _case_rng(seed: int, student: str, grade_id: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{student}/{grade_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _status_from_run(sandbox, run: dict | None) -> tuple[str, str]:
    cells = (run or {}).get("cells", []) if isinstance(run, dict) else []
    memory_error = any(isinstance(c, dict) and c.get("ename") == "MemoryError" for c in cells)
    if sandbox.memory_exceeded or memory_error:
        return "memory-limit", "the notebook ran out of memory"
    kernel = run.get("kernel") if isinstance(run, dict) else None
    if sandbox.timed_out:
        return "timeout", "the whole notebook ran past its time limit and was stopped"
    if kernel == "timeout":
        return "timeout", "a cell ran past its time limit; the cells after it were not run"
    if kernel == "died":
        return "crashed", "the Python kernel died (the notebook crashed or exited); the cells after it were not run"
    if run is None or sandbox.returncode != 0:
        return "crashed", "the notebook runner did not finish normally"
    return "graded", ""


def _load_run(workdir: Path) -> dict | None:
    data = read_result_file(workdir, ".grader-run.json", 2**20)
    try:
        run = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return run if isinstance(run, dict) else None


def grade_one(assignment: str, student: str, source: Path, options: Options) -> SubmissionResult:
    """Both phases for one submission; never raises for anything the submission does."""
    module = assignments.load(assignment)
    template, notebook_name = release_template(assignment)
    items_zero = [
        ItemResult(i.grade_id, i.kind, 0.0 if i.kind == "auto" else None, i.points, "not graded")
        for i in template.items
    ]
    try:
        reader = _read_from_zip if source.suffix == ".zip" else _read_from_folder
        data, others = reader(source, notebook_name)
        if data is None:
            seen = f" (found: {', '.join(others[:5])})" if others else ""
            return SubmissionResult(student, "missing", f"no notebook named {notebook_name}{seen}", items_zero)
        prepared = prepare(parse_notebook(data), template)
    except InvalidNotebook as err:
        return SubmissionResult(student, "invalid-notebook", str(err), items_zero)

    with tempfile.TemporaryDirectory(prefix="llmarch-grade-") as tmp:
        workdir, inputs = Path(tmp) / "submission", Path(tmp) / "inputs"
        workdir.mkdir()
        inputs.mkdir()
        nbformat.write(prepared.notebook, workdir / "notebook.ipynb")
        cases = {}
        for item in template.auto_items:
            check = module.CHECKS[item.grade_id]
            cases[item.grade_id] = check.cases(_case_rng(options.seed, student, item.grade_id))
            write_inputs(item.grade_id, check.function, cases[item.grade_id], inputs, check.output)
        limits = Limits(wall_seconds=options.notebook_timeout, cpu_seconds=int(options.notebook_timeout) + 30,
                        memory_mb=options.memory_mb)
        sandbox = run_sandboxed(
            [sys.executable, "/grader/runner.py", "/submission/notebook.ipynb",
             "--cell-timeout", str(options.cell_timeout)],
            workdir, limits,
            ro_binds={PACKAGE / "runner.py": "/grader/runner.py", PACKAGE / "capture.py": "/grader/capture.py",
                      inputs: "/grader/inputs"},
            unsafe_no_sandbox=options.unsafe_no_sandbox,
        )
        run = _load_run(workdir)
        status, detail = _status_from_run(sandbox, run)
        items = []
        for item in template.items:
            if item.kind == "manual":
                items.append(ItemResult(item.grade_id, "manual", None, item.points, "graded by your instructor"))
                continue
            verdict = judge(module.CHECKS[item.grade_id], item.grade_id, cases[item.grade_id],
                            workdir, module.TRUSTED_CALLABLES)
            items.append(ItemResult(item.grade_id, "auto", item.points if verdict.passed else 0.0, item.points,
                                    verdict.message))
    if status == "graded" and prepared.tampering:
        status, detail = "tampered", "protected cells were changed; they were restored before grading"
    cell_errors = []
    for c in (run or {}).get("cells", []):
        if isinstance(c, dict) and c.get("status") == "error":
            cell_errors.append(f"{str(c.get('ename'))[:100]}: {str(c.get('evalue'))[:300]}")
    return SubmissionResult(student, status, detail, items, prepared.tampering, cell_errors[:20], prepared.answers)


def grade_all(assignment: str, submissions: dict[str, Path], options: Options, workers: int, progress) -> list[SubmissionResult]:
    """Grade every submission in ``workers`` processes; results come back in student order."""
    results = {}
    if workers <= 1:
        for student, path in submissions.items():
            results[student] = grade_one(assignment, student, path, options)
            progress(len(results), len(submissions), student)
    else:
        # spawn, not fork: a forked copy of a process whose torch/OpenMP threads already ran can deadlock
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(grade_one, assignment, s, p, options): s for s, p in submissions.items()}
            for future in as_completed(futures):
                student = futures[future]
                try:
                    results[student] = future.result()
                except Exception as err:  # a grader bug must not lose the other submissions
                    results[student] = SubmissionResult(student, "crashed", f"internal grader error: {err!r}")
                progress(len(results), len(submissions), student)
    return [results[s] for s in sorted(results)]


def write_csv(results: list[SubmissionResult], template: Template, path: Path) -> None:
    import csv

    max_score = sum(i.points for i in template.auto_items)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "status", "score", "max_score", *[i.grade_id for i in template.items], "detail"])
        for r in results:
            by_id = {i.grade_id: i for i in r.items}
            cols = []
            for item in template.items:
                got = by_id.get(item.grade_id)
                cols.append("" if got is None or got.points is None else f"{got.points:g}")
            writer.writerow([r.student, r.status, f"{r.score:g}", f"{max_score:g}", *cols, r.detail])


def clean_output_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "feedback", ignore_errors=True)
    os.makedirs(out / "feedback")
