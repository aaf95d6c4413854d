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
``missing``          no notebook with the expected name was submitted, or (a student of the roster) nothing at all
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
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import numpy as np

from autograder import assignments, gpu_benchmark
from autograder.checks import CheckResult, captured_files, expected_results, judge, pack_inputs, write_inputs
from autograder.intake import MAX_SIBLING_BYTES, Loaded, Submission, load
from autograder.notebooks import InvalidNotebook, Prepared, Template, parse_notebook, prepare
from autograder.runner import outputs_digest
from autograder.sandbox import Limits, SandboxResult, read_result_file, run_sandboxed, work_folder
from autograder.sandbox.removal import _remove_tree as remove_tree  # whatever the notebook left: a file, a link, a tree

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent
STATUSES = ("graded", "tampered", "timeout", "memory-limit", "crashed", "invalid-notebook", "missing", "grader-error")
MAX_RUN_RECORD_BYTES = 2**20
MAX_COLLECTED_BYTES = 256 * 2**20  # all captured results of one submission that a worker sends back
PHASE2_SECONDS = 120.0  # comparing one submission's captured results; far above what honest results need
NOTEBOOK_IN_SANDBOX = ".grader-notebook.ipynb"


@dataclass(frozen=True)
class Options:
    cell_timeout: float = 60.0
    notebook_timeout: float = 300.0
    memory_mb: int = 2048
    seed: int = 0
    secret: str = ""  # the course's secret (autograder/secret.py); the command line always sets one
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
    information: list[str] = field(default_factory=list)  # feedback only, never in the CSV: GPU speed
    seconds: float = 0.0  # wall time of grading it
    cpu_seconds: float | None = None  # CPU time the notebook used, as its cgroup counted it (None: not measured)

    @property
    def score(self) -> float:
        return sum(i.points or 0.0 for i in self.items)

    @property
    def tampered(self) -> bool:
        return bool(self.tampering)


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


def release_notebook(assignment: str) -> nbformat.NotebookNode:
    """The release notebook in ``exercises/``: the trusted copy of what is protected, graded and worth how much."""
    path = ROOT / "exercises" / assignment / assignments.load(assignment).NOTEBOOK
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `make assignments` to generate the release notebooks")
    return nbformat.read(path, as_version=4)


def release_template(assignment: str) -> tuple[Template, str]:
    return Template.from_release(release_notebook(assignment)), assignments.load(assignment).NOTEBOOK


def _case_rng(key, code_digest: str, grade_id: str) -> np.random.Generator:
    """The hidden inputs of one check. ``key`` is the course's secret and the run's ``--seed`` (``_draw_key``), so
    nothing public predicts them; ``code_digest`` is everything submitted, not who submitted it: the same
    submission gets the same inputs (and score) under any name, and every changed one gets new ones, so feedback
    from earlier rounds cannot be collected into a table of answers."""
    digest = hashlib.sha256(f"{key}/{code_digest}/{grade_id}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _draw_key(options: Options):
    return f"{options.secret}/{options.seed}" if options.secret else options.seed


def _code_digest(notebook: nbformat.NotebookNode, siblings: dict[str, bytes] | None = None) -> str:
    """A digest of the prepared notebook's cells and of every file submitted beside it (name and content)."""
    files = sorted((name, hashlib.sha256(content).hexdigest()) for name, content in (siblings or {}).items())
    return hashlib.sha256(json.dumps([[c.source for c in notebook.cells], files]).encode()).hexdigest()


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
    details = []
    crashed = [c for c in cells if c["status"] == "crashed"]
    if crashed:  # the run ended well, so the rest ran; which cells crashed is the runner's (advisory) record
        more = f" and {len(crashed) - 1} more cell(s)" if len(crashed) > 1 else ""
        details.append(f"the notebook's process crashed in {_cell_name(crashed[0], origins)}{more}; a fresh "
                       "process ran the code cells before each such cell again and went on from the cell after it")
    if any(c["ename"] == "MemoryError" for c in cells):
        details.append("a cell raised MemoryError, but the sandbox saw no memory limit being hit, so this is "
                       "reported as an error of the notebook, not as memory-limit")
    return "graded", "; ".join(details)


def _cell_name(cell: dict, origins: list[str]) -> str:
    """A runner record's entry as the student knows the cell: ``your cell 4 (signal SIGSEGV)``."""
    where = origins[cell["index"]] if 0 <= cell["index"] < len(origins) else "a cell"
    if cell["status"] == "crashed":
        return f"{where} ({cell['ename']}{', ' + cell['evalue'] if cell['evalue'] else ''})"
    return f"{where}: {cell['ename']}: {cell['evalue']}"


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


@dataclass
class Phase1Result:
    """What phase 1 hands to phase 2: plain data, so that it can come back from a worker on another machine.
    ``status`` is set when the submission ended before its notebook could run (missing, invalid, grader-error)."""

    student: str
    status: str = ""
    detail: str = ""
    notes: list[str] = field(default_factory=list)
    prepared: Prepared | None = None
    cases: dict = field(default_factory=dict)  # grade_id -> the hidden cases
    expected: dict = field(default_factory=dict)  # grade_id -> the reference's answers
    run: SandboxResult | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # the captured results that judge() reads
    altered: list[str] = field(default_factory=list)  # checks whose results changed after their test cell
    cells: list[dict] = field(default_factory=list)  # the runner's record (untrusted)
    information: list[str] = field(default_factory=list)  # SubmissionResult.information
    seconds: float = 0.0


def _sealed(files: dict[str, bytes], workdir: Path, seals: dict[str, str]) -> tuple[dict[str, bytes], list[str]]:
    """The captured files that count, and the checks whose results changed after their test cell: a check's files
    count only when the supervisor sealed them right after its test cell (``runner.outputs_digest``, sent on the
    heartbeat) and they are unchanged; a check never sealed (its cell did not run) has no result."""
    altered = sorted(gid for gid, digest in seals.items() if outputs_digest(workdir, gid) != digest)
    kept = {name: data for name, data in files.items()
            if name.split("/")[1] in seals and name.split("/")[1] not in altered}
    return kept, altered


def _collect(workdir: Path, names: dict[str, int]) -> dict[str, bytes]:
    """The captured files ``names`` (path -> most bytes read) that exist as regular files, within one total."""
    files, total = {}, 0
    for name, limit in names.items():
        data = read_result_file(workdir, name, limit)
        if data is not None and total + len(data) <= MAX_COLLECTED_BYTES:
            files[name] = data
            total += len(data)
    return files


def run_phase1(assignment: str, student: str, loaded: Loaded, options: Options) -> Phase1Result:
    """Phase 1: prepare the notebook, compute the hidden cases and the reference's answers, run the notebook in
    the sandbox and collect what it captured. Runs in a local worker process or on a cluster worker; it reads
    nothing of the submissions folder (``loaded`` carries the bytes). Never raises."""
    started = time.monotonic()
    try:
        result = _phase1(assignment, student, loaded, options)
    except Exception as err:  # noqa: BLE001 - one submission's failure must not stop the others
        traceback.print_exc(file=sys.stderr)
        result = Phase1Result(student, "grader-error", _failure_detail(err))
    result.seconds = time.monotonic() - started
    return result


def _phase1(assignment: str, student: str, loaded: Loaded, options: Options) -> Phase1Result:
    if loaded.status:
        return Phase1Result(student, loaded.status, loaded.detail, list(loaded.notes))
    module = assignments.load(assignment)
    template, _ = release_template(assignment)
    try:
        prepared = prepare(parse_notebook(loaded.notebook), template)
    except InvalidNotebook as err:
        return Phase1Result(student, "invalid-notebook", str(err), list(loaded.notes))
    digest = _code_digest(prepared.notebook, loaded.siblings)
    checks = {item.grade_id: module.CHECKS[item.grade_id] for item in template.auto_items}
    cases = {gid: check.cases(_case_rng(_draw_key(options), digest, gid)) for gid, check in checks.items()}
    expected = {gid: expected_results(checks[gid], cases[gid], module.TRUSTED_CALLABLES) for gid in checks}
    limits = Limits(wall_seconds=options.notebook_timeout, cpu_seconds=int(options.notebook_timeout) + 30,
                    memory_mb=options.memory_mb, idle_seconds=options.cell_timeout)
    notes = list(loaded.notes) + list(prepared.notes)
    with work_folder(limits) as folder:
        workdir, inputs = folder / "submission", folder / "inputs"
        workdir.mkdir()
        inputs.mkdir()
        placed = _place_siblings(loaded.siblings, workdir)
        for name in getattr(module, "FILES", ()):  # data the release ships beside the notebook, always the trusted copy
            shutil.copyfile(ROOT / "exercises" / assignment / name, workdir / name)
        if placed:
            notes.append(f"files submitted beside the notebook were placed in its folder: {', '.join(placed)[:300]}")
        nbformat.write(prepared.notebook, workdir / NOTEBOOK_IN_SANDBOX)
        for gid, check in checks.items():
            write_inputs(gid, check, cases[gid], expected[gid], inputs)
        run = run_sandboxed(  # the hidden inputs go to the runner's supervisor only (see runner.py)
            [sys.executable, "/grader/runner.py", f"/submission/{NOTEBOOK_IN_SANDBOX}"],
            workdir, limits,
            ro_binds={PACKAGE / "runner.py": "/grader/runner.py", PACKAGE / "capture.py": "/grader/capture.py"},
            stdin_data=pack_inputs(inputs), unsafe_no_sandbox=options.unsafe_no_sandbox,
        )
        names = {name: limit for gid, check in checks.items()
                 for name, limit in captured_files(check, gid, expected[gid], cases[gid]).items()}
        files, altered = _sealed(_collect(workdir, names), workdir, run.seals)
        cells = parse_run_record(read_result_file(workdir, ".grader-run.json", MAX_RUN_RECORD_BYTES))
        information = (_gpu_benchmark(workdir, options, benchmark_program(template, prepared))
                       if getattr(module, "GPU_BENCHMARK", False) else [])
    return Phase1Result(student, "", "", notes, prepared, cases, expected, run, files, altered=altered, cells=cells,
                        information=information)


BENCHMARK_LIMITS = Limits(wall_seconds=300.0, cpu_seconds=300, memory_mb=16384, max_processes=256)


def benchmark_program(template: Template, prepared: Prepared) -> str:
    """What the GPU benchmark runs (``gpu_benchmark.kernel_program``): the release's set-up cell and the Triton
    kernel definitions of the submission's code cells, nothing else of the notebook."""
    cells = [c.source for c in prepared.notebook.cells if c.cell_type == "code" and "grader" not in c.metadata]
    return gpu_benchmark.kernel_program(template.protected[gpu_benchmark.SETUP_CELL].source, cells)


def _gpu_benchmark(workdir: Path, options: Options, program: str, cuda_available: bool | None = None) -> list[str]:
    """The feedback's information lines on the speed of the kernels (``gpu_benchmark.py``): where this machine
    has CUDA, a second sandboxed run, after the graded run and apart from it, that sees the GPU's device files and
    runs only ``program`` (``benchmark_program``), read-only, after any result file the graded run left is deleted;
    its outcome changes no point and no status, and any failure is one line "benchmark skipped: ..."."""
    try:
        if not (_torch_cuda_available() if cuda_available is None else cuda_available):
            return [gpu_benchmark.NO_GPU]
        remove_tree(workdir / gpu_benchmark.RESULT_FILE)
        devices = tuple(sorted(str(p) for p in Path("/dev").glob("nvidia*")))
        with tempfile.TemporaryDirectory() as folder:
            os.chmod(folder, 0o755)
            path = Path(folder) / "program.py"
            path.write_text(program, encoding="utf-8")
            path.chmod(0o644)
            run = run_sandboxed(
                [sys.executable, "/grader/gpu_benchmark.py", "/grader/program.py"], workdir, BENCHMARK_LIMITS,
                ro_binds={PACKAGE / "gpu_benchmark.py": "/grader/gpu_benchmark.py", path: "/grader/program.py"},
                devices=devices, unsafe_no_sandbox=options.unsafe_no_sandbox)
        raw = read_result_file(workdir, gpu_benchmark.RESULT_FILE, 2**16)
        if raw is None and run.killed_by:
            return [f"benchmark skipped: it was stopped ({run.killed_by} limit of the benchmark's sandbox)"]
        return gpu_benchmark.feedback_lines(gpu_benchmark.read_rows(raw))
    except Exception as err:  # noqa: BLE001 - information only: it must never change a grade
        return [f"benchmark skipped: {type(err).__name__}: {str(err)[:200]}"]


def _torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_phase2(assignment: str, phase1: Phase1Result, options: Options) -> SubmissionResult:
    """Phase 2, in the instructor's process: the status from what the sandbox observed, and every item's points
    from comparing the captured results with the reference's answers. Never raises."""
    started = time.monotonic()
    try:
        result = _phase2(assignment, phase1, options)
    except Exception as err:  # noqa: BLE001 - one submission's failure must not stop the others
        traceback.print_exc(file=sys.stderr)
        result = SubmissionResult(phase1.student, "grader-error", _failure_detail(err))
    result.seconds = phase1.seconds + time.monotonic() - started
    return result


def _phase2(assignment: str, phase1: Phase1Result, options: Options) -> SubmissionResult:
    module = assignments.load(assignment)
    template, _ = release_template(assignment)
    if phase1.status:
        return SubmissionResult(phase1.student, phase1.status, phase1.detail, _zero_items(template, "not graded"),
                                notes=phase1.notes)
    prepared, run = phase1.prepared, phase1.run
    status, detail = _status_from_run(run, phase1.cells, prepared.origins, options)
    checks = {item.grade_id: module.CHECKS[item.grade_id] for item in template.auto_items}
    items, phase2_error = _judge_all(template, checks, phase1.cases, phase1.expected, phase1.files, phase1.altered)
    if phase2_error:
        status, detail = "grader-error", phase2_error
    elif status == "graded" and prepared.tampering:
        status, detail = "tampered", "protected cells were changed; they were restored before grading"
    if status in ("timeout", "memory-limit", "crashed") and run.isolation:
        detail += f" [limits enforced by: {_describe_limits(run)}]"
    cell_errors = [("the process crashed in " if c["status"] == "crashed" else "") + _cell_name(c, prepared.origins)
                   for c in phase1.cells if c["status"] in ("error", "crashed")]
    return SubmissionResult(phase1.student, status, detail, items, prepared.tampering, cell_errors[:20],
                            prepared.answers, phase1.notes, phase1.information, cpu_seconds=run.cpu_seconds)


def _judge_one(check, gid: str, cases: list, expected: list, files: dict[str, bytes]) -> CheckResult:
    """One check's verdict. The captured files are the notebook's data, so anything they make the comparison
    raise (an integer array where a loss needs floats, a value no verdict foresaw) fails this check, with the
    reason; it never becomes the grader's error."""
    try:
        return judge(check, gid, cases, expected, files)
    except TimeoutError:
        raise
    except Exception as err:  # noqa: BLE001 - see the docstring
        return CheckResult(False, f"your results for this test could not be judged: {type(err).__name__}: "
                                  f"{str(err)[:200]}")


ALTERED = ("this test's results were changed after its test cell ran (a later cell rewrote, added or removed files "
           "in .grader-outputs/): they are not graded")


def _judge_all(template: Template, checks: dict, cases: dict, expected: dict, files: dict[str, bytes],
               altered: list[str] = ()) -> tuple[list[ItemResult], str]:
    """Every item's points from the captured outputs, within one time budget; an error message instead of
    raising if the budget runs out. The checks ``altered`` fail with ``ALTERED``."""
    items = []
    verdicts: dict[str, CheckResult] = {gid: CheckResult(False, ALTERED) for gid in altered if gid in checks}
    try:
        with _time_budget(PHASE2_SECONDS):
            for gid, check in checks.items():
                if gid not in verdicts:
                    verdicts[gid] = _judge_one(check, gid, cases[gid], expected[gid], files)
    except TimeoutError as err:
        problem = str(err)
    else:
        problem = ""
    failing_functions = {checks[gid].function for gid, verdict in verdicts.items() if not verdict.passed}
    for item in template.items:
        if item.kind == "manual":
            items.append(ItemResult(item.grade_id, "manual", None, item.points, "graded by your instructor"))
        elif item.grade_id in verdicts:
            verdict = verdicts[item.grade_id]
            message = verdict.message
            culprits = [f for f in checks[item.grade_id].depends_on if f in failing_functions]
            if not verdict.passed and culprits:
                message += (f" (this function uses your {' and '.join(culprits)}, which also fail"
                            f"{'s' if len(culprits) == 1 else ''} {'its' if len(culprits) == 1 else 'their'} "
                            "own tests: fix that first)")
            items.append(ItemResult(item.grade_id, "auto", item.points if verdict.passed else 0.0, item.points,
                                    message))
        else:
            items.append(ItemResult(item.grade_id, "auto", 0.0, item.points, "not graded: " + problem))
    return items, problem


def grade_one(assignment: str, student: str, submission: Submission, options: Options) -> SubmissionResult:
    """Both phases for one submission, in this process. Never raises: a failure of the grader itself becomes
    the status ``grader-error`` with the cause in the detail (and the traceback on stderr)."""
    try:
        loaded = load(submission, release_template(assignment)[1])
    except Exception as err:  # noqa: BLE001 - e.g. the folder vanished while the run went on
        loaded = Loaded(status="grader-error", detail=_failure_detail(err))
    return run_phase2(assignment, run_phase1(assignment, student, loaded, options), options)


def _failure_detail(err: BaseException) -> str:
    """The detail of a ``grader-error``: what failed in the grader itself."""
    if isinstance(err, BrokenProcessPool):
        return f"the grading worker process died: {err}"
    return f"the grader failed: {type(err).__name__}: {str(err)[:300]}"


def grade_all(assignment: str, submissions: dict[str, Submission], options: Options, workers: int,
              progress, scheduler: str | None = None) -> list[SubmissionResult]:
    """Grade every submission: in this process (``workers <= 1``), in ``workers`` local processes, or, with a
    ``scheduler`` address, phase 1 on the workers of a Dask cluster and phase 2 here. The results are the same
    either way and come back in student order. A worker that dies turns what it had not finished into
    ``grader-error``."""
    results: dict[str, SubmissionResult] = {}
    if scheduler:
        results = _grade_on_cluster(assignment, submissions, options, scheduler, progress)
    elif workers <= 1:
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
                except Exception as err:  # noqa: BLE001 - e.g. a result that could not be sent back
                    results[student] = SubmissionResult(student, "grader-error", _failure_detail(err))
                progress(len(results), len(submissions), student)
    return [results[s] for s in sorted(results)]


def _grade_on_cluster(assignment: str, submissions: dict[str, Submission], options: Options, scheduler: str,
                      progress) -> dict[str, SubmissionResult]:
    """Phase 1 of every submission as a task on the Dask cluster at ``scheduler`` (each worker needs bubblewrap
    and the course environment); the submissions are read, and phase 2 and every write happen, here."""
    from dask.distributed import Client
    from dask.distributed import as_completed as completed_on_cluster

    notebook = release_template(assignment)[1]
    results: dict[str, SubmissionResult] = {}
    with Client(scheduler, timeout="30s") as client:
        futures = {client.submit(run_phase1, assignment, student, load(submission, notebook), options,
                                 pure=False): student
                   for student, submission in submissions.items()}
        for future in completed_on_cluster(futures):
            student = futures[future]
            try:
                results[student] = run_phase2(assignment, future.result(), options)
            except Exception as err:  # noqa: BLE001 - a worker that died, a result that could not be sent back
                results[student] = SubmissionResult(student, "grader-error", _failure_detail(err))
            progress(len(results), len(submissions), student)
    return results
