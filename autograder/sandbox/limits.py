"""The vocabulary of the sandbox: the limits of one run (`Limits`), what the trusted parent observed
(`SandboxResult`), its two errors, and the constants (paths, uids, `MB`) the other modules share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


SANDBOX_DIR = "/submission"
SANDBOX_UID = 65534  # inside the user namespace of a grader that is not root
SLOT_UID_BASE = 2_000_000_000  # a root grader's sandboxes run as SLOT_UID_BASE + slot (see the package docstring)
MAX_SLOTS = 1024
SLOT_DIR = Path("/run/llmarch-sandbox-slots")
MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run; the package docstring says how each is enforced."""

    wall_seconds: float = 300.0  # whole run; then everything in the sandbox is killed
    idle_seconds: float | None = None  # kill when no heartbeat line came for this long (None: no heartbeat)
    cpu_seconds: int = 300  # RLIMIT_CPU per process, and the run's total CPU time where a cgroup counts it
    cpus: float = 1.0  # cores the whole run may use at once (cgroup cpu quota)
    memory_mb: int = 2048  # total memory of the run (cgroup, else the memory watchdog)
    max_processes: int = 64  # tasks (processes + threads) in the sandbox: cgroup pids.max, else RLIMIT_NPROC
    max_file_mb: int = 64  # RLIMIT_FSIZE: largest file the code may write
    disk_mb: int = 512  # size of the work_folder's tmpfs (when the grader is root)
    max_captured_output: int = 1_000_000  # bytes of stdout/stderr kept (the rest is drained and dropped)


@dataclass
class SandboxResult:
    """What happened in one sandboxed run, as the trusted parent observed it."""

    returncode: int | None  # exit status; -N for death by signal N; None when the parent killed the run
    signal: int | None  # signal that ended the main process, if any (None when the parent killed it)
    killed_by: str | None  # why the parent killed the run: "wall-clock", "idle", "cpu-time", "memory"; or None
    oom_killed: bool  # the kernel OOM-killed a process of the run's memory cgroup
    stdout: str  # truncated to max_captured_output, with a note when truncated
    stderr: str
    wall_seconds: float
    cpu_seconds: float | None  # CPU time of all the run's processes, from its cgroup; None without one
    isolation: dict[str, str] = field(default_factory=dict)  # limit -> what enforced it, e.g. {"memory": "cgroup v1"}
    last_heartbeat: str | None = None  # last heartbeat line (at most 100 characters; written by the sandboxed code)
    seals: dict[str, str] = field(default_factory=dict)  # test cell -> digest of its results, from the heartbeat

    @property
    def memory_exceeded(self) -> bool:
        return self.oom_killed or self.killed_by == "memory"

    @property
    def timed_out(self) -> bool:
        return self.killed_by in ("wall-clock", "idle", "cpu-time")


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or a helper it needs) is missing, so untrusted code cannot be isolated."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up (a problem of the grader's machine, not of the submission)."""
