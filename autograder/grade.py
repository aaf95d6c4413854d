"""Grading a folder of submissions: phase 1 in the sandbox, phase 2 here, in parallel workers.

Each worker grades one submission at a time and returns a plain result; only the main process writes the
gradebook, the CSV and the feedback files. Every submission ends in exactly one status:

``graded``           ran to the end; points are what the hidden checks gave
``tampered``         graded with protected cells restored, and the edits are listed for the instructor
``timeout``          the grader stopped the notebook: a cell or the whole notebook ran past its time limit, or it
                     used up its CPU time; checks captured before it count
``memory-limit``     the notebook used more memory than allowed (the kernel's OOM counter of the submission's
                     cgroup, or the grader's memory watchdog, saw it); checks captured before it count
``crashed``          the notebook process died (a signal, ``os._exit``, ...); checks captured before it count
``invalid-notebook`` the file is not a readable notebook (not UTF-8, not JSON, not the Jupyter format, a broken or
                     encrypted zip, a symbolic link)
``missing``          no notebook with the expected name was submitted
``grader-error``     the grader itself failed on this submission; the detail names the cause

Statuses come only from what the grader observed from outside the sandbox (its own kills, the cgroup's OOM
counter, the exit status). Text the notebook printed and files it wrote are never believed; where they are the
only hint (a cell that raised ``MemoryError`` without an observed limit), the detail says so. Tampering is
reported in its own column whatever the status.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import signal
import stat
import sys
import threading
import time
import traceback
import zipfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from autograder import assignments
from autograder.checks import CheckResult, expected_results, judge, write_inputs
from autograder.notebooks import InvalidNotebook, Template, parse_notebook, prepare
from autograder.sandbox import Limits, read_result_file, run_sandboxed, work_folder

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
STATUSES = ("graded", "tampered", "timeout", "memory-limit", "crashed", "invalid-notebook", "missing", "grader-error")
MAX_ZIP_BYTES = 50 * 2**20  # a submitted zip, and the notebook inside it
MAX_SIBLING_BYTES = 10 * 2**20  # files beside the notebook (helpers, data) copied into the work folder, in total
MAX_SIBLING_FILES = 50
MAX_RUN_RECORD_BYTES = 2**20
PHASE2_SECONDS = 120.0  # comparing one submission's captured results; far above what honest results need
NOTEBOOK_IN_SANDBOX = ".grader-notebook.ipynb"


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
    tampering: list[str] = field(default_factory=list)  # edits to protected cells
    cell_errors: list[str] = field(default_factory=list)
    answers: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # informational: copies ignored, files found, ...
    seconds: float = 0.0  # wall time of grading it
    cpu_seconds: float | None = None  # CPU time the notebook used, as its cgroup counted it (None: not measured)

    @property
    def score(self) -> float:
        return sum(i.points or 0.0 for i in self.items)

    @property
    def tampered(self) -> bool:
        return bool(self.tampering)


# ----------------------------------------------------------------------------------------------
# The submissions folder (untrusted: names, links and archives come from students)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """One entry of the submissions folder: a student's folder or zip, or an entry that cannot be graded
    (``problem`` says why, e.g. a symbolic link, which is never followed)."""

    path: Path
    kind: str  # "folder", "zip" or "link"
    problem: str = ""


def student_name(entry_name: str) -> str:
    """A printable, unique student name for a file name: names that are not valid UTF-8 or hold control
    characters are shown with replacement characters and a short hash of the real name, e.g.
    ``student_name("b\\udcffob")`` -> ``"b�ob [5a1c…]"``."""
    clean = entry_name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    clean = "".join(ch if ch.isprintable() else "?" for ch in clean)
    if clean != entry_name:
        clean += f" [{hashlib.sha256(os.fsencode(entry_name)).hexdigest()[:8]}]"
    return clean


def find_submissions(folder: Path, exclude: Path | None = None) -> tuple[dict[str, Submission], list[str]]:
    """Every entry of ``folder`` ends in exactly one submission (a row) or one warning:
    ``<student>/`` folders (dot-folders too) and ``<student>.zip`` files are submissions; symbolic links are
    submissions that cannot be graded; anything else is a warning. ``exclude`` (the output folder) is skipped."""
    if not folder.is_dir():
        raise SystemExit(f"submissions folder {folder} does not exist")
    found: dict[str, Submission] = {}
    warnings: list[str] = []
    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    for entry in entries:
        name = student_name(entry.name)
        path = Path(entry.path)
        if exclude is not None and path.resolve() == exclude.resolve():
            warnings.append(f"{name}: skipped, it is the output folder")
            continue
        if entry.is_symlink():
            stem = name[:-4] if name.endswith(".zip") else name
            target = os.readlink(entry.path)
            found[stem] = Submission(path, "link", f"{name} is a symbolic link (to {target[:200]}); "
                                                   "the grader never follows links")
        elif entry.is_dir(follow_symlinks=False):
            found[name] = Submission(path, "folder")
        elif entry.is_file(follow_symlinks=False) and name.lower().endswith(".zip"):
            stem = name[:-4]
            if stem in found:  # sorted: a folder "alice" comes before "alice.zip"
                warnings.append(f"{name}: ignored, the folder {stem}/ is graded for this student")
            else:
                found[stem] = Submission(path, "zip")
        else:
            warnings.append(f"{name}: ignored, not a student folder or a .zip")
    return found, warnings


class _SizeLimitExceeded(InvalidNotebook):
    pass


def _read_bounded(handle, limit: int, what: str) -> bytes:
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise _SizeLimitExceeded(f"{what} is larger than {limit // 2**20} MB")
    return data


def _read_from_zip(path: Path, notebook: str) -> tuple[bytes | None, dict[str, bytes], list[str]]:
    """The bytes of ``notebook`` anywhere inside the zip (LMS exports nest folders), the files beside it, and
    the other notebook names seen. Every way a zip can be broken (encrypted, unsupported compression, sizes
    or checksums that lie, truncated) is ``InvalidNotebook``; reads are bounded whatever the headers claim."""
    try:
        if path.stat().st_size > MAX_ZIP_BYTES:
            raise InvalidNotebook(f"{path.name} is larger than {MAX_ZIP_BYTES // 2**20} MB")
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir() and "__MACOSX" not in i.filename]
            matches = [i for i in infos if i.filename.rsplit("/", 1)[-1] == notebook]
            names = [i.filename for i in infos if i.filename.endswith(".ipynb")]
            if not matches:
                return None, {}, names
            info = matches[0]
            if info.flag_bits & 0x1:
                raise InvalidNotebook(f"{notebook} in {path.name} is encrypted")
            with zf.open(info) as f:
                data = _read_bounded(f, MAX_ZIP_BYTES, f"{notebook} in {path.name}")
            if len(data) != info.file_size:
                raise InvalidNotebook(f"{path.name} is not a readable zip file: it says {notebook} has "
                                      f"{info.file_size} bytes, but it holds {len(data)}")
            folder = info.filename.rsplit("/", 1)[0] if "/" in info.filename else ""
            siblings = {}
            for other in infos:
                other_folder = other.filename.rsplit("/", 1)[0] if "/" in other.filename else ""
                if other is info or other_folder != folder or other.flag_bits & 0x1:
                    continue
                if len(siblings) >= MAX_SIBLING_FILES:
                    break
                try:
                    with zf.open(other) as f:
                        siblings[other.filename.rsplit("/", 1)[-1]] = _read_bounded(f, MAX_SIBLING_BYTES, other.filename)
                except (_SizeLimitExceeded, zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, OSError):
                    continue  # a broken extra file is not the notebook's problem
            return data, siblings, names
    except InvalidNotebook:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError, OSError,
            ValueError, OverflowError) as err:  # bad CRC, lying sizes, unsupported compression, password needed
        raise InvalidNotebook(f"{path.name} is not a readable zip file ({type(err).__name__}: {str(err)[:200]})") from None
    except Exception as err:  # noqa: BLE001 - the decompressors (zlib, bz2, lzma) raise their own error types
        raise InvalidNotebook(f"{path.name} is not a readable zip file ({type(err).__name__})") from None


def _read_regular_file(directory_fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's bytes, opened without following links; None for anything else or if over ``limit``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def _read_from_folder(path: Path, notebook: str) -> tuple[bytes | None, dict[str, bytes], list[str]]:
    """Like ``_read_from_zip`` for a folder: symbolic links (to files or folders) are never followed."""
    candidates = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".ipynb_checkpoints")
        candidates += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".ipynb")]
    named = [c for c in candidates if c.name == notebook]
    if named and all(c.is_symlink() for c in named):
        raise InvalidNotebook(f"{named[0].relative_to(path)} is a symbolic link; the grader never follows links")
    for candidate in named:
        if candidate.is_symlink():
            continue
        directory_fd = os.open(candidate.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            data = _read_regular_file(directory_fd, candidate.name, MAX_ZIP_BYTES)
            if data is None:
                raise InvalidNotebook(f"{notebook} is not a regular file of at most {MAX_ZIP_BYTES // 2**20} MB")
            siblings = {}
            for entry in sorted(os.scandir(directory_fd), key=lambda e: e.name)[: MAX_SIBLING_FILES + 1]:
                if entry.name != candidate.name and entry.is_file(follow_symlinks=False):
                    content = _read_regular_file(directory_fd, entry.name, MAX_SIBLING_BYTES)
                    if content is not None:
                        siblings[entry.name] = content
            return data, siblings, []
        finally:
            os.close(directory_fd)
    return None, {}, [str(p.relative_to(path)) for p in candidates]


def _place_siblings(siblings: dict[str, bytes], workdir: Path) -> list[str]:
    """Write the files the student submitted beside the notebook into the work folder (the notebook's folder,
    as in Jupyter), within a total size budget; the grader's own names are never overwritten."""
    placed, total = [], 0
    for name, content in siblings.items():
        if name.startswith(".grader") or "/" in name or name in (".", "..") or total + len(content) > MAX_SIBLING_BYTES:
            continue
        (workdir / name).write_bytes(content)
        placed.append(name)
        total += len(content)
    return placed


# ----------------------------------------------------------------------------------------------
# One submission
# ----------------------------------------------------------------------------------------------


def release_template(assignment: str) -> tuple[Template, str]:
    module = assignments.load(assignment)
    path = ROOT / "exercises" / assignment / module.NOTEBOOK
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `make assignments` to generate the release notebooks")
    return Template.from_release(nbformat.read(path, as_version=4)), module.NOTEBOOK


def _case_rng(seed: int, code_digest: str, grade_id: str) -> np.random.Generator:
    """The hidden inputs depend on the submitted code, not on who submitted it: the same notebook gets the same
    inputs (and score) under any name, and every changed submission gets new ones, so feedback from earlier
    rounds cannot be collected into a table of answers."""
    digest = hashlib.sha256(f"{seed}/{code_digest}/{grade_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _code_digest(notebook: nbformat.NotebookNode) -> str:
    return hashlib.sha256(json.dumps([c.source for c in notebook.cells]).encode()).hexdigest()


def parse_run_record(raw: bytes | None) -> list[dict]:
    """The runner's record of executed cells (written inside the sandbox, so untrusted): a list of
    ``{"index": int, "status": str, "ename": str, "evalue": str}``, every field type-checked and truncated;
    anything malformed gives ``[]``."""
    try:
        record = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (ValueError, RecursionError):
        return []
    if not isinstance(record, dict) or not isinstance(record.get("cells"), list):
        return []
    cells = []
    for cell in record["cells"][:10_000]:
        if not isinstance(cell, dict) or type(cell.get("index")) is not int or not isinstance(cell.get("status"), str):
            return []
        cells.append({"index": cell["index"], "status": cell["status"][:20],
                      "ename": str(cell.get("ename", ""))[:100], "evalue": str(cell.get("evalue", ""))[:300]})
    return cells


def _describe_limits(run) -> str:
    """How the sandbox enforced its limits ("memory: cgroup v1, ..."); the uid slot differs from run to run."""
    return ", ".join(f"{what}: {how}" for what, how in run.isolation.items() if what != "uid")


def _status_from_run(run, cells: list[dict], origins: list[str], options: Options) -> tuple[str, str]:
    """(status, detail) from what the sandbox observed; the runner's heartbeat (its last line is ``done`` when
    every cell ran) and its record of cell errors only add context."""
    if run.memory_exceeded:
        how = ("the kernel's out-of-memory killer stopped a process of the notebook" if run.oom_killed
               else "the grader's memory watchdog stopped the notebook")
        return "memory-limit", f"the notebook used more than {options.memory_mb} MB of memory: {how}"
    if run.killed_by == "wall-clock":
        return "timeout", f"the whole notebook ran past its limit of {options.notebook_timeout:g} s and was stopped"
    if run.killed_by == "idle":
        last = run.last_heartbeat or ""
        index = int(last.split()[1]) if last.startswith("cell ") and last.split()[1:2] and last.split()[1].isdigit() else None
        where = f" (the runner last reported starting {origins[index]})" if index is not None and index < len(origins) else ""
        return "timeout", f"a cell ran past its limit of {options.cell_timeout:g} s and the notebook was stopped{where}"
    if run.killed_by == "cpu-time":
        return "timeout", "the notebook used up its CPU time and was stopped"
    if run.signal is not None:
        try:
            name = signal.Signals(run.signal).name
        except ValueError:
            name = str(run.signal)
        return "crashed", f"the notebook process was killed by signal {name}; the cells after it were not run"
    if run.returncode != 0 or run.last_heartbeat != "done":
        return "crashed", (f"the notebook process stopped before the end (exit code {run.returncode}); "
                           "the cells after that point were not run")
    detail = ""
    if any(c["ename"] == "MemoryError" for c in cells):
        detail = ("a cell raised MemoryError, but the sandbox saw no memory limit being hit, so this is reported "
                  "as an error of the notebook, not as memory-limit")
    return "graded", detail


@contextlib.contextmanager
def _time_budget(seconds: float):
    """Raise TimeoutError in this block after ``seconds`` (in the main thread of a process; elsewhere the
    bounds on sizes alone apply). Phase 2 reads untrusted results, so it gets a deadline of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"comparing the results took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _zero_items(template: Template, message: str) -> list[ItemResult]:
    return [ItemResult(i.grade_id, i.kind, 0.0 if i.kind == "auto" else None, i.points, message) for i in template.items]


def _grade(assignment: str, student: str, submission: Submission, options: Options) -> SubmissionResult:
    module = assignments.load(assignment)
    template, notebook_name = release_template(assignment)
    not_graded = _zero_items(template, "not graded")
    if submission.problem:
        return SubmissionResult(student, "invalid-notebook", submission.problem, not_graded)
    try:
        reader = _read_from_zip if submission.kind == "zip" else _read_from_folder
        data, siblings, others = reader(submission.path, notebook_name)
        if data is None:
            seen = f" (found: {', '.join(others[:5])})" if others else ""
            return SubmissionResult(student, "missing", f"no notebook named {notebook_name}{seen}", not_graded)
        prepared = prepare(parse_notebook(data), template)
    except InvalidNotebook as err:
        return SubmissionResult(student, "invalid-notebook", str(err), not_graded)

    digest = _code_digest(prepared.notebook)
    checks = {item.grade_id: module.CHECKS[item.grade_id] for item in template.auto_items}
    cases = {gid: check.cases(_case_rng(options.seed, digest, gid)) for gid, check in checks.items()}
    expected = {gid: expected_results(checks[gid], cases[gid], module.TRUSTED_CALLABLES) for gid in checks}
    limits = Limits(wall_seconds=options.notebook_timeout, cpu_seconds=int(options.notebook_timeout) + 30,
                    memory_mb=options.memory_mb, idle_seconds=options.cell_timeout)
    notes = list(prepared.notes)
    with work_folder(limits) as folder:
        workdir, inputs = folder / "submission", folder / "inputs"
        workdir.mkdir()
        inputs.mkdir()
        placed = _place_siblings(siblings, workdir)
        if placed:
            notes.append(f"files submitted beside the notebook were placed in its folder: {', '.join(placed)[:300]}")
        nbformat.write(prepared.notebook, workdir / NOTEBOOK_IN_SANDBOX)
        for gid, check in checks.items():
            write_inputs(gid, check, cases[gid], expected[gid], inputs)
        run = run_sandboxed(
            [sys.executable, "/grader/runner.py", f"/submission/{NOTEBOOK_IN_SANDBOX}"],
            workdir, limits,
            ro_binds={PACKAGE / "runner.py": "/grader/runner.py", PACKAGE / "capture.py": "/grader/capture.py",
                      inputs: "/grader/inputs"},
            unsafe_no_sandbox=options.unsafe_no_sandbox,
        )
        cells = parse_run_record(read_result_file(workdir, ".grader-run.json", MAX_RUN_RECORD_BYTES))
        status, detail = _status_from_run(run, cells, prepared.origins, options)
        items, phase2_error = _judge_all(template, checks, cases, expected, workdir)
    if phase2_error:
        status, detail = "grader-error", phase2_error
    elif status == "graded" and prepared.tampering:
        status, detail = "tampered", "protected cells were changed; they were restored before grading"
    if status in ("timeout", "memory-limit", "crashed") and run.isolation:
        detail += f" [limits enforced by: {_describe_limits(run)}]"
    cell_errors = [f"{prepared.origins[c['index']] if 0 <= c['index'] < len(prepared.origins) else 'a cell'}: "
                   f"{c['ename']}: {c['evalue']}" for c in cells if c["status"] == "error"]
    return SubmissionResult(student, status, detail, items, prepared.tampering, cell_errors[:20], prepared.answers,
                            notes, cpu_seconds=run.cpu_seconds)


def _judge_all(template: Template, checks: dict, cases: dict, expected: dict, workdir: Path) -> tuple[list[ItemResult], str]:
    """Phase 2: every item's points from the captured outputs, within one time budget; an error message
    instead of raising if the budget runs out."""
    items = []
    verdicts: dict[str, CheckResult] = {}
    try:
        with _time_budget(PHASE2_SECONDS):
            for gid, check in checks.items():
                verdicts[gid] = judge(check, gid, cases[gid], expected[gid], workdir)
    except TimeoutError as err:
        problem = str(err)
    else:
        problem = ""
    for item in template.items:
        if item.kind == "manual":
            items.append(ItemResult(item.grade_id, "manual", None, item.points, "graded by your instructor"))
        elif item.grade_id in verdicts:
            verdict = verdicts[item.grade_id]
            items.append(ItemResult(item.grade_id, "auto", item.points if verdict.passed else 0.0, item.points,
                                    verdict.message))
        else:
            items.append(ItemResult(item.grade_id, "auto", 0.0, item.points, "not graded: " + problem))
    return items, problem


def grade_one(assignment: str, student: str, submission: Submission, options: Options) -> SubmissionResult:
    """Both phases for one submission. Never raises: a failure of the grader itself becomes the status
    ``grader-error`` with the cause in the detail (and the traceback on stderr)."""
    started = time.monotonic()
    try:
        result = _grade(assignment, student, submission, options)
    except Exception as err:  # noqa: BLE001 - one submission's grading failure must not stop the others
        traceback.print_exc(file=sys.stderr)
        result = SubmissionResult(student, "grader-error", f"the grader failed: {type(err).__name__}: {str(err)[:300]}")
    result.seconds = time.monotonic() - started
    return result


def grade_all(assignment: str, submissions: dict[str, Submission], options: Options, workers: int,
              progress) -> list[SubmissionResult]:
    """Grade every submission in ``workers`` processes; results come back in student order. A worker process
    that dies (killed by the host, say) turns the submissions it had not finished into ``grader-error``."""
    results: dict[str, SubmissionResult] = {}
    if workers <= 1:
        for student, submission in submissions.items():
            results[student] = grade_one(assignment, student, submission, options)
            progress(len(results), len(submissions), student)
    else:
        # spawn, not fork: a forked copy of a process whose torch/OpenMP threads already ran can deadlock
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(grade_one, assignment, s, sub, options): s for s, sub in submissions.items()}
            for future in as_completed(futures):
                student = futures[future]
                try:
                    results[student] = future.result()
                except BrokenProcessPool as err:
                    results[student] = SubmissionResult(student, "grader-error",
                                                        f"the grading worker process died: {err}")
                except Exception as err:  # noqa: BLE001 - e.g. a result that could not be sent back
                    results[student] = SubmissionResult(student, "grader-error",
                                                        f"the grader failed: {type(err).__name__}: {str(err)[:300]}")
                progress(len(results), len(submissions), student)
    return [results[s] for s in sorted(results)]


# ----------------------------------------------------------------------------------------------
# Writing results
# ----------------------------------------------------------------------------------------------


def csv_safe(text: str) -> str:
    """Text a spreadsheet shows as text: a leading ``= + - @`` (or tab, carriage return) would make it a
    formula, so it gets a leading apostrophe. ``csv_safe("=HYPERLINK(...)")`` -> ``"'=HYPERLINK(...)"``."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_csv(results: list[SubmissionResult], template: Template, path: Path) -> None:
    """``grades.csv``, written to a temporary file and renamed, so a run killed halfway leaves the old one."""
    import csv

    max_score = sum(i.points for i in template.auto_items)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "status", "tampered", "score", "max_score", *[i.grade_id for i in template.items],
                         "seconds", "cpu_seconds", "detail", "notes"])
        for r in results:
            by_id = {i.grade_id: i for i in r.items}
            cols = []
            for item in template.items:
                got = by_id.get(item.grade_id)
                cols.append("" if got is None or got.points is None else f"{got.points:g}")
            notes = "; ".join(r.tampering + r.notes)
            writer.writerow([csv_safe(r.student), r.status, "yes" if r.tampered else "no", f"{r.score:g}",
                             f"{max_score:g}", *cols, f"{r.seconds:.1f}",
                             "" if r.cpu_seconds is None else f"{r.cpu_seconds:.1f}", csv_safe(r.detail), csv_safe(notes)])
    os.replace(temporary, path)


def clean_output_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "feedback").mkdir(exist_ok=True)
