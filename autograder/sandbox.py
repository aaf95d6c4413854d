"""Run an untrusted command (a student's notebook) in a bubblewrap sandbox with resource limits.

This is the generic "run this argv in a sandbox" layer of the grader (DESIGN.md, "Assignments and
grading"). The trusted grader process makes the submission's folder (`work_folder`), starts the sandbox,
watches it until it ends and, afterwards, reads result files from the folder (use `read_result_file`,
which refuses symlinks). Everything `SandboxResult` reports was observed by this trusted process; nothing
the sandboxed code prints or writes decides it (only `last_heartbeat`, for messages, is the code's text).

Isolation model
---------------
Everything the argv starts (e.g. the notebook runner and any process a cell starts) runs inside one
bubblewrap (`bwrap`) sandbox:

* **File system.** A fresh root (read-only tmpfs) that contains only: `/usr` and the `/bin`, `/lib*`
  symlinks (read-only); a handful of `/etc` files (dynamic-linker cache, time zone, fonts, and
  generated `passwd`/`group`/`hosts`); the grader's Python installation and venv, read-only at their
  host paths (venv scripts use absolute paths); the caller's `ro_binds`; the submission folder,
  read-write at `/submission` (cwd and HOME); a private, size-limited `/tmp` and `/dev/shm`; a new
  `/proc` and a minimal `/dev` (plus the caller's `devices`, e.g. a GPU's, with /sys's device folders
  read-only). Nothing else of the host is visible -- in particular not the repository
  (`lib/`, `solutions/`, `autograder/`), other submissions or the gradebook, so the editable install
  of `llmarch` in the venv cannot be imported (its finder points at the unmounted `lib/`).
* **Namespaces.** New pid, network (loopback only), IPC, UTS and cgroup namespaces, `--new-session`
  (no terminal injection) and `--die-with-parent`. When the pid namespace's init dies the kernel kills
  every process in it, so no process survives the run.
* **Identity.** The code runs with no capabilities and `no_new_privs`, as:

  - grader running as root: a *slot uid* (gid the same) that no concurrent run shares. A grader process
    claims slots as it needs them, one per run in progress, with an exclusive `flock` on
    `/run/llmarch-sandbox-slots/slot-N.lock`, and keeps them until it exits; threads, worker processes
    and separate graders therefore never share a uid, so per-user budgets (RLIMIT_NPROC) are per run.
    Slot N is uid `SLOT_UID_BASE + N` = 2000000000 + N (N < 1024): systemd allocates nothing between
    its container ranges (up to 1879048191) and its foreign-uid range (from 2147352576), and useradd's
    /etc/subuid ranges end far below. bwrap runs privileged (no user namespace) and `setpriv` drops to
    the slot uid as the last step. A user namespace would not help here: bwrap maps the sandbox uid to
    the caller's real uid, so the "non-root" sandbox user would be host root (owner of every root-owned
    file that is mounted, creator of root-owned -- even setuid-root -- files in the submission folder,
    exempt from RLIMIT_NPROC). The work folder is chowned to the slot uid before the run.
  - grader running as an ordinary user U: uid U. bwrap uses a user namespace (`--uid 65534`, and
    `--disable-userns` so that no further namespaces can be made inside); files are owned by U.

Limits
------
The parent polls the running sandbox (every 50 ms at most) and kills it -- SIGKILL to bwrap, whose pid
namespace dies with it, and to every task of the run's cgroups -- for the first of these reasons, which
`SandboxResult.killed_by` names:

* ``"wall-clock"``: the run is older than `wall_seconds`.
* ``"idle"``: with `idle_seconds` set, the run gets the write end of a pipe (its number in the
  environment variable GRADER_HEARTBEAT_FD) and must write a line to it at least every `idle_seconds`
  (the notebook runner writes one per cell). Writing can only postpone this kill, and `wall_seconds`
  still applies.
* ``"cpu-time"``: the CPU time of all the run's processes together, as its cgroup counts it, exceeds
  `cpu_seconds` (RLIMIT_CPU applies the same number to each process anyway).
* ``"memory"``: without a memory cgroup, the *memory watchdog* found more than `memory_mb` resident:
  it sums RssAnon + RssShmem (file-backed pages are shared and reclaimable) over every descendant of
  bwrap -- orphans re-parent to the sandbox's init, itself a descendant -- every 0.1 s.

Per-run cgroups are created below the grader's own cgroups (so outer limits still apply), named
`llmarch-sandbox-<uuid>`, and removed afterwards; each controller falls back on its own, with a log
message, when it cannot be used:

* cgroup v1: the `memory` (limit, no swap), `pids`, `cpu` (CFS quota of `cpus` cores) and `cpuacct`
  (usage) hierarchies; OOM kills from memory.oom_control `oom_kill`.
* cgroup v2: one cgroup with memory.max, memory.swap.max=0, pids.max and cpu.max; OOM kills from
  memory.events `oom_kill`, usage from cpu.stat; killed through cgroup.kill. v2 lets a cgroup hand
  controllers to children only while it holds no processes itself, so the grader enables them in its
  own cgroup's subtree_control and, when the kernel refuses because processes are there, first moves
  those processes (the grader, and anything else in its cgroup) into a leaf `llmarch-grader`. Give the
  grader a cgroup of its own (a container, or a systemd unit with Delegate=yes).

What holds on each kind of host (`SandboxResult.isolation` says, per run, which mechanism was used):

* cgroup v1 or v2 (the grader may create cgroups): memory is bounded in total and OOM kills are counted
  by the kernel; the task count is exact; the run gets at most `cpus` cores, so a busy submission does
  not slow its neighbours; the run's total CPU time is measured (`cpu_seconds`) and bounded.
* no cgroup: memory by the watchdog (a fast allocator can overshoot for up to 0.1 s, so RLIMIT_AS at
  2 x memory_mb + 1 GiB per process stays as a backstop, loose because address space is far larger than
  resident memory; memory held outside any process -- pipe buffers, unmapped memfds -- is not seen);
  tasks by RLIMIT_NPROC, per slot uid as root and inside the user namespace otherwise; **no CPU bound**:
  at best the scheduler's autogroups (one per session, and bwrap starts one; where the kernel enables
  them) share the cores between runs, and a submission that gives each of its processes a session of its
  own defeats them and slows its neighbours down (benchmarks/bench_grading_neighbours.py: 8x);
  `cpu_seconds` is None and RLIMIT_CPU applies per process only.

Always: RLIMIT_FSIZE (`max_file_mb` per file) and RLIMIT_CORE=0 per process; `max_processes` counts
threads, and includes the two bubblewrap processes. stdout and stderr are drained concurrently; at most
`max_captured_output` bytes of each are kept (the first and the last half).

Disk
----
`work_folder` gives each submission a folder that, when the grader is root, is a tmpfs of `disk_mb`
(nosuid, nodev): a submission that fills it gets ENOSPC alone. tmpfs rather than a loop-mounted image
needs no loop device and no image file, and is freed at once by unmounting; its pages are charged to
the writer's memory cgroup, so with one, files also count toward `memory_mb`. Without root there is no mount and
only RLIMIT_FSIZE bounds each file. On exit the folder is unmounted (detached if still busy) and removed
by an iterative remover that handles any tree a submission can leave (depth beyond PATH_MAX, mode 000
directories, symlinks, fifos, sockets).

Best effort, not guarantees
---------------------------
* For a signal death bubblewrap exits with 128 + signal; an explicit `exit(128 + n)` looks the same
  and is reported as signal n.
* Code in the sandbox can still kill other processes of the same run (e.g. a cell can kill the runner,
  whose record then stays at "running").
* A grader killed by SIGKILL cannot clean up: its work folders stay mounted (source `llmarch-grade` in
  /proc/mounts) and its cgroups stay in place.
* `unsafe_no_sandbox=True` runs the argv directly, as the grader's own user, with the same cgroups,
  rlimits (except RLIMIT_NPROC), watchdogs and kills, cwd = workdir, but **no isolation at all**.
  Without a cgroup, a process that leaves the process group survives the run. For development only.

Example::

    with work_folder(Limits(wall_seconds=120)) as folder:
        (folder / "alice").mkdir()
        result = run_sandboxed([sys.executable, "/grader/run_notebook.py"], folder / "alice",
                               Limits(wall_seconds=120, idle_seconds=30),
                               ro_binds={Path("run_notebook.py"): "/grader/run_notebook.py"})
        results = read_result_file(folder / "alice", "results.json")
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import importlib.util
import itertools
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "SandboxError",
    "bubblewrap_available",
    "run_sandboxed",
    "read_result_file",
    "work_folder",
]

log = logging.getLogger(__name__)

SANDBOX_DIR = "/submission"
SANDBOX_UID = 65534  # inside the user namespace of a grader that is not root
SLOT_UID_BASE = 2_000_000_000  # a root grader's sandboxes run as SLOT_UID_BASE + slot (see the module docstring)
MAX_SLOTS = 1024
SLOT_DIR = Path("/run/llmarch-sandbox-slots")
MB = 1024 * 1024

# Host directories that are bound read-only (or recreated as the same symlink) inside the sandbox.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc entries the Python stack needs; the rest of /etc stays hidden.
_ETC_FILES = ("ld.so.cache", "localtime", "timezone", "nsswitch.conf", "alternatives", "fonts")
# ro_binds may not land inside these (they are read-only mounts or the student's own folder).
_DEVICE_SYS_DIRS = ("/sys/bus", "/sys/class", "/sys/dev", "/sys/devices", "/sys/module")  # read-only, with devices
_RESERVED_DESTINATIONS = ("/usr", "/etc", "/proc", "/dev", "/tmp", SANDBOX_DIR)
_POLL_SECONDS = 0.05  # longest pause between two checks of a running sandbox
_WATCHDOG_SECONDS = 0.1  # pause between two memory watchdog scans (each reads /proc)
_CPU_PERIOD_US = 100_000  # CFS period of the cpu quota


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run; the module docstring says how each is enforced."""

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


# ----------------------------------------------------------------------------------------------
# Discovery
# ----------------------------------------------------------------------------------------------


def _find_bwrap() -> str | None:
    """Path of the bwrap executable, or None (tests monkeypatch this)."""
    return shutil.which("bwrap")


def bubblewrap_available() -> bool:
    """True if bubblewrap is installed, i.e. `run_sandboxed` can isolate code."""
    return _find_bwrap() is not None


def _python_runtime_dirs() -> list[Path]:
    """Host directories that hold the grader's interpreter and venv, e.g.

    [/root/.pyenv/versions/3.11.7, /work/main/.venv]. Directories under /usr are already visible.
    """
    dirs = [Path(sys.base_prefix).resolve(), Path(os.path.realpath(sys.executable)).parents[1]]
    if sys.prefix != sys.base_prefix:  # running in a venv: bind it at the same path, unresolved
        dirs.append(Path(sys.prefix).absolute())
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and not _is_under(d, Path("/usr")) and d not in unique:
            unique.append(d)
    return unique


# Trusted packages that must never be importable in the sandbox: the reference implementation and the grader.
_TRUSTED_PACKAGES = ("llmarch", "autograder")


def _check_trusted_packages_hidden(visible_dirs: list[Path]) -> None:
    """Refuse to run if a trusted package lives inside a directory the sandbox sees (e.g. `pip install .`
    instead of the editable install copied `llmarch` into the venv's site-packages)."""
    for name in _TRUSTED_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in [spec.origin, *(spec.submodule_search_locations or [])] if spec else []:
            if location and any(_is_under(os.path.realpath(location), d.resolve()) for d in visible_dirs):
                raise SandboxError(
                    f"package {name!r} is installed at {location}, inside {visible_dirs} which the sandbox "
                    f"mounts: students could import it. Install the course package editable "
                    f"(pip install -e .) so that it stays in the repository.")


def _is_under(path: Path | str, parent: Path | str) -> bool:
    """`_is_under("/usr/lib", "/usr")` is True; `_is_under("/usrx", "/usr")` is False."""
    return Path(path) == Path(parent) or Path(parent) in Path(path).parents


def _read_text(path: Path | str) -> str:
    """The file's text, or "" when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------
# cgroups (v1 and v2)
# ----------------------------------------------------------------------------------------------

_CONTROLLERS = frozenset({"memory", "pids", "cpu", "cpuacct"})  # "cpuacct": usage (cpu.stat on v2)
_V2_LEAF = "llmarch-grader"  # where the grader's own processes move on cgroup v2 (see the module docstring)
_OPTIONAL_FILES = ("memory.memsw.limit_in_bytes", "memory.swap.max")  # absent without swap accounting


@dataclass(frozen=True)
class _Mount:
    """A cgroup file system in /proc/self/mountinfo."""

    fstype: str  # "cgroup" (v1) or "cgroup2"
    root: str  # the hierarchy's path that is mounted ("/" unless only a sub-tree is)
    point: Path
    options: frozenset[str]  # super options; for v1 they name the controllers, e.g. {"rw", "memory"}


def _parse_mountinfo(text: str) -> list[_Mount]:
    r"""The cgroup mounts in /proc/self/mountinfo text, whose lines look like
    `35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory` (paths escape " " as \040)."""
    def unescape(path: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)

    mounts = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            mounts.append(_Mount(tail[0], unescape(fields[3]), Path(unescape(fields[4])),
                                 frozenset(tail[2].split(","))))
    return mounts


def _parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> this process's cgroup path, from /proc/self/cgroup text: "4:memory:/a" gives
    {"memory": "/a"}, "1:cpu,cpuacct:/b" gives both, and the cgroup v2 line "0::/c" gives {"": "/c"}."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _visible_path(mount: _Mount, own: str) -> Path | None:
    """Where cgroup `own` of the mounted hierarchy is, or None when the mount shows another sub-tree.

    A mount of root "/docker/x" at /sys/fs/cgroup shows cgroup "/docker/x/y" at /sys/fs/cgroup/y.
    """
    root = mount.root.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return None
    return mount.point / own[len(root):].lstrip("/")


def _locate_cgroups(mountinfo: str, proc_cgroup: str) -> tuple[dict[str, Path], Path | None]:
    """The grader's own cgroups: {v1 controller: directory} for the controllers runs use, and the cgroup v2
    directory below which runs go (None without a cgroup2 mount)."""
    own = _parse_proc_cgroup(proc_cgroup)
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for mount in _parse_mountinfo(mountinfo):
        if mount.fstype == "cgroup":
            for controller in _CONTROLLERS & mount.options:
                path = _visible_path(mount, own[controller]) if controller in own else None
                if path is not None:
                    v1.setdefault(controller, path)
        elif "" in own and v2 is None:
            v2 = _visible_path(mount, own[""])
    if v2 is not None and v2.name == _V2_LEAF:
        v2 = v2.parent  # moved into the leaf by an earlier run: runs go beside it
    return v1, v2


def _cgroup_settings(limits: Limits, version: int) -> dict[str, list[tuple[str, str]]]:
    """Controller -> (file, value) to write into a run's cgroup, in order."""
    memory = str(limits.memory_mb * MB)
    quota = str(max(1000, int(limits.cpus * _CPU_PERIOD_US)))  # the kernel's minimum quota is 1 ms
    if version == 1:
        return {"memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
                "pids": [("pids.max", str(limits.max_processes))],
                "cpu": [("cpu.cfs_period_us", str(_CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)]}
    return {"memory": [("memory.max", memory), ("memory.swap.max", "0")],
            "pids": [("pids.max", str(limits.max_processes))],
            "cpu": [("cpu.max", f"{quota} {_CPU_PERIOD_US}")]}


def _make_cgroup(directory: Path, controllers: list[str], settings: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Create `directory` and configure each controller; returns those that work (none: directory removed)."""
    try:
        directory.mkdir()
    except OSError as exc:
        log.info("cannot create cgroup %s (%s): %s fall back", directory, exc, ", ".join(controllers))
        return []
    working = []
    for controller in controllers:
        try:
            for filename, value in settings.get(controller, []):
                if filename in _OPTIONAL_FILES and not (directory / filename).exists():
                    continue
                (directory / filename).write_text(value)
            working.append(controller)
        except OSError as exc:
            log.warning("cannot configure %s in %s: %s; it falls back", controller, directory, exc)
    if not working:
        _rmdir_quietly(directory)
    return working


def _enable_v2_controllers(parent: Path, wanted: set[str]) -> set[str]:
    """Let children of the grader's v2 cgroup `parent` use the `wanted` controllers, as far as the kernel
    allows; returns those enabled. When the kernel refuses with EBUSY (processes in `parent`), they are
    moved into the leaf `parent/llmarch-grader` first."""
    available = set(_read_text(parent / "cgroup.controllers").split())
    if wanted - available:
        log.info("cgroup v2 controllers %s are not available in %s", ", ".join(sorted(wanted - available)), parent)
    for _ in range(3):  # a process the grader starts meanwhile can land in `parent` again
        enabled = set(_read_text(parent / "cgroup.subtree_control").split())
        busy = False
        for controller in sorted((wanted & available) - enabled):
            try:
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            except OSError as exc:
                busy = busy or exc.errno == errno.EBUSY
                if exc.errno != errno.EBUSY:
                    log.info("cannot enable the %s controller in %s: %s", controller, parent, exc)
        if not busy:
            break
        _move_processes(parent, parent / _V2_LEAF)
    return set(_read_text(parent / "cgroup.subtree_control").split()) & wanted


def _move_processes(source: Path, leaf: Path) -> None:
    try:
        leaf.mkdir(exist_ok=True)
    except OSError as exc:
        log.info("cannot create %s: %s", leaf, exc)
        return
    for pid in _read_text(source / "cgroup.procs").split():
        try:
            (leaf / "cgroup.procs").write_text(pid)
        except OSError:
            pass  # exited meanwhile, or a kernel thread


def _read_counters(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file ("oom_kill 2\\nusage_usec 1500\\n") as a dict; {} if unreadable."""
    counters = {}
    for line in _read_text(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counters[parts[0]] = int(parts[1])
    return counters


class _RunCgroups:
    """The cgroups of one run: `dirs` maps each controller in use ("memory", "pids", "cpu", "cpuacct") to its
    directory; on cgroup v2 they all share the directory `v2`, whose cpu.stat stands in for cpuacct.
    `create` makes them below the grader's own cgroups; `remove` deletes them."""

    def __init__(self, dirs: dict[str, Path], v2: Path | None = None):
        self.dirs, self.v2 = dirs, v2

    @classmethod
    def create(cls, limits: Limits) -> _RunCgroups:
        v1_parents, v2_parent = _locate_cgroups(_read_text("/proc/self/mountinfo"), _read_text("/proc/self/cgroup"))
        name = f"llmarch-sandbox-{uuid.uuid4().hex}"
        by_directory: dict[Path, list[str]] = {}  # v1 controllers mounted together share a directory
        for controller, parent in sorted(v1_parents.items()):
            by_directory.setdefault(parent / name, []).append(controller)
        dirs: dict[str, Path] = {}
        for directory, controllers in by_directory.items():
            dirs.update(dict.fromkeys(_make_cgroup(directory, controllers, _cgroup_settings(limits, 1)), directory))
        missing = _CONTROLLERS - dirs.keys()
        if v2_parent is None or not missing:
            return cls(dirs)
        wanted = _enable_v2_controllers(v2_parent, missing - {"cpuacct"}) | (missing & {"cpuacct"})
        working = _make_cgroup(v2_parent / name, sorted(wanted), _cgroup_settings(limits, 2)) if wanted else []
        dirs.update(dict.fromkeys(working, v2_parent / name))
        return cls(dirs, v2_parent / name if working else None)

    def has(self, controller: str) -> bool:
        return controller in self.dirs

    def mechanism(self, controller: str) -> str | None:
        """"cgroup v1" or "cgroup v2" when `controller` is in use, else None."""
        if controller not in self.dirs:
            return None
        return "cgroup v2" if self.dirs[controller] == self.v2 else "cgroup v1"

    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files the launcher writes its pid to."""
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def _pids(self) -> set[int]:
        return {int(p) for d in set(self.dirs.values()) for p in _read_text(d / "cgroup.procs").split()}

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the cgroups until they are empty; False if some survived `timeout`."""
        if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.v2 / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout
        while pids := self._pids():
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def oom_killed(self) -> bool:
        """Did the kernel OOM-kill a process of the memory cgroup (its `oom_kill` counter)?"""
        directory = self.dirs.get("memory")
        if directory is None:
            return False
        counters = _read_counters(directory / ("memory.events" if directory == self.v2 else "memory.oom_control"))
        return counters.get("oom_kill", 0) > 0

    def cpu_seconds(self) -> float | None:
        """CPU time used by the run's processes so far, or None when no cgroup counts it."""
        directory = self.dirs.get("cpuacct")
        if directory is None:
            return None
        if directory == self.v2:
            usage_usec = _read_counters(directory / "cpu.stat").get("usage_usec")
            return None if usage_usec is None else usage_usec / 1e6
        usage_ns = _read_text(directory / "cpuacct.usage").strip()
        return int(usage_ns) / 1e9 if usage_ns.isdigit() else None

    def remove(self) -> None:
        """Remove the (empty) cgroups; tasks can take a moment to leave after SIGKILL, so retry briefly."""
        for directory in set(self.dirs.values()):
            for _ in range(200):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("cannot remove cgroup %s: %s", directory, exc)
                        break
                    time.sleep(0.01)
            else:
                log.warning("cgroup %s still busy; left in place", directory)
        self.dirs, self.v2 = {}, None


def _rmdir_quietly(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()


# ----------------------------------------------------------------------------------------------
# Slot uids (grader running as root)
# ----------------------------------------------------------------------------------------------


class _UidSlots:
    """The slots this process holds (see the module docstring): `acquire` hands out a free one, claiming a
    new slot (its lock file, held open until the process exits) when all are in use; `release` returns it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._owner: int | None = None  # pid whose slots `_free` lists
        self._free: list[int] = []

    def acquire(self) -> int:
        with self._lock:
            if self._owner != os.getpid():  # a forked child shares its parent's locks; it claims its own
                self._owner, self._free = os.getpid(), []
            return self._free.pop() if self._free else self._claim()

    def release(self, slot: int) -> None:
        with self._lock:
            if self._owner == os.getpid():
                self._free.append(slot)

    @staticmethod
    def _claim() -> int:
        with contextlib.suppress(FileExistsError):
            SLOT_DIR.mkdir(mode=0o700)
        info = os.lstat(SLOT_DIR)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise SandboxError(f"{SLOT_DIR} must be a directory of uid {os.geteuid()} that no one else can write")
        for slot in range(MAX_SLOTS):
            fd = os.open(SLOT_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return slot  # `fd` stays open, and the slot locked, for the life of this process
        raise SandboxError(f"all {MAX_SLOTS} sandbox uid slots in {SLOT_DIR} are in use")


_SLOTS = _UidSlots()


# ----------------------------------------------------------------------------------------------
# Watching a running sandbox: memory watchdog and heartbeat
# ----------------------------------------------------------------------------------------------


def _process_tree(root: int) -> list[int]:
    """`root` and every descendant of it, from a snapshot of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # after "pid (comm) state"
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def _resident_bytes(pids: list[int]) -> int:
    """Resident anonymous and shared memory (RssAnon + RssShmem) of the processes `pids`."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith((b"RssAnon:", b"RssShmem:")):
                        total += int(line.split()[1]) * 1024  # kB
        except (OSError, IndexError, ValueError):
            continue
    return total


class _Heartbeat:
    """The read end of the heartbeat pipe: remembers when the last complete line arrived, and the line."""

    MAX_LINE = 100

    def __init__(self, fd: int, now: float):
        self.fd: int | None = fd
        self.last_time, self.last_line, self.partial = now, None, b""
        os.set_blocking(fd, False)

    def poll(self) -> None:
        """Take in what arrived, without waiting. One read per call: the monitor calls it once per pause,
        so a run that floods the pipe costs the parent no more than one that does not."""
        if self.fd is None:
            return
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if not data:  # every writer closed it: no heartbeat can come any more
            self.fd = None
            return
        *lines, partial = (self.partial + data).split(b"\n")
        self.partial = partial[-self.MAX_LINE:]  # a flood without newlines cannot grow it
        if lines:
            self.last_time = time.monotonic()
            self.last_line = lines[-1][:self.MAX_LINE].decode("utf-8", errors="replace")


def _monitor(pid: int, limits: Limits, cgroups: _RunCgroups, heartbeat: _Heartbeat | None,
             start: float) -> str | None:
    """Wait until child `pid` exits, or until the run must be killed; returns the reason to kill (see the
    module docstring), or None once it exited. The child is left a zombie (WNOWAIT), so its pid stays
    reserved until Popen.wait() reaps it."""
    deadline = start + limits.wall_seconds
    watchdog = not cgroups.has("memory")
    delay, next_scan = 0.001, start
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        now = time.monotonic()
        if now >= deadline:
            return "wall-clock"
        pause = min(delay, deadline - now)
        if heartbeat is not None:
            heartbeat.poll()
            idle_deadline = heartbeat.last_time + limits.idle_seconds
            if now >= idle_deadline:
                return "idle"
            pause = min(pause, idle_deadline - now)
        used = cgroups.cpu_seconds()
        if used is not None and used > limits.cpu_seconds:
            return "cpu-time"
        if watchdog and now >= next_scan:
            next_scan = now + _WATCHDOG_SECONDS
            if _resident_bytes(_process_tree(pid)) > limits.memory_mb * MB:
                return "memory"
        time.sleep(pause)
        delay = min(delay * 2, _POLL_SECONDS)
    return None


# ----------------------------------------------------------------------------------------------
# Output capture
# ----------------------------------------------------------------------------------------------


class _BoundedCapture(threading.Thread):
    """Drain a pipe to EOF keeping only the first and the last `limit // 2` bytes.

    With limit=10, writing b"0123456789abcdef" keeps b"01234" + b"bcdef" and `text()` reports
    6 dropped bytes between them. Memory stays O(limit) however much is written.
    """

    CHUNK = 64 * 1024

    def __init__(self, pipe, name: str, limit: int):
        super().__init__(name=f"sandbox-{name}-reader", daemon=True)
        self.pipe, self.stream_name, self.limit = pipe, name, max(limit, 0)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def run(self) -> None:
        fd = self.pipe.fileno()
        try:
            while chunk := os.read(fd, self.CHUNK):
                self._add(chunk)
        except OSError:
            pass

    def _add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        keep = self.limit - self.limit // 2
        self.tail.append(chunk[-keep:] if keep else b"")
        self.tail_size += len(self.tail[-1])
        while self.tail and self.tail_size - len(self.tail[0]) >= keep:
            self.tail_size -= len(self.tail.popleft())

    def kept_tail(self) -> bytes:
        keep = self.limit - self.limit // 2
        return b"".join(self.tail)[-keep:] if keep else b""

    def text(self) -> str:
        tail = self.kept_tail()
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return (bytes(self.head) + tail).decode("utf-8", errors="replace")
        note = (f"\n[... sandbox: {dropped} bytes of {self.stream_name} dropped; "
                f"only the first and last {self.limit // 2} bytes are kept ...]\n")
        return self.head.decode("utf-8", errors="replace") + note + tail.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------
# Launching
# ----------------------------------------------------------------------------------------------

# Runs (trusted, outside the sandbox) between fork and bwrap: joins the run's cgroups and sets the
# rlimits, so that bwrap and everything it starts inherit them with no race. Any failure is written
# to the status pipe, which is close-on-exec: the parent reads EOF iff the exec succeeded.
_LAUNCHER = r"""
import json, os, resource, sys
config = json.loads(sys.argv[1])
status_fd = config["status_fd"]
os.set_inheritable(status_fd, False)
try:
    for procs_file in config["cgroup_procs"]:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
    for name, (soft, hard) in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.execv(sys.argv[2], sys.argv[2:])
except BaseException as exc:
    os.write(status_fd, f"{type(exc).__name__}: {exc}".encode())
    os._exit(125)
"""


def _address_space_backstop_mb(limits: Limits) -> int:
    """RLIMIT_AS per process without a memory cgroup: far above `memory_mb`, because address space exceeds
    resident memory (libraries, allocator arenas), so that the watchdog, not this, normally stops a bomb."""
    return 2 * limits.memory_mb + 1024


def _rlimits(limits: Limits, cgroups: _RunCgroups, nproc_in_launcher: bool) -> dict[str, tuple[int, int]]:
    """The rlimits the launcher sets (names of the `resource` module -> (soft, hard))."""
    rlimits = {
        # At the soft limit the kernel sends SIGXCPU (which code can ignore), at the hard one SIGKILL.
        "RLIMIT_CPU": (limits.cpu_seconds, limits.cpu_seconds + 2),
        "RLIMIT_FSIZE": (limits.max_file_mb * MB, limits.max_file_mb * MB),
        "RLIMIT_CORE": (0, 0),
    }
    if not cgroups.has("memory"):
        backstop = _address_space_backstop_mb(limits) * MB
        rlimits["RLIMIT_AS"] = (backstop, backstop)
    if not cgroups.has("pids") and nproc_in_launcher:
        rlimits["RLIMIT_NPROC"] = (limits.max_processes, limits.max_processes)
    return rlimits


class _BwrapCommand:
    """Builds the bwrap command line; `data_fds` are pipes whose contents bwrap copies into files."""

    def __init__(self, bwrap: str):
        self.args: list[str] = [bwrap]
        self.data_fds: list[int] = []
        self.dirs: set[str] = set()

    def add(self, *args: str | Path) -> None:
        self.args.extend(str(a) for a in args)

    def ensure_parents(self, dest: str) -> None:
        """Create the missing ancestors of `dest` as 0755 directories (bwrap would make them 0700)."""
        for parent in reversed(Path(dest).parents):
            if str(parent) != "/" and str(parent) not in self.dirs:
                self.add("--perms", "0755", "--dir", parent)
                self.dirs.add(str(parent))

    def ro_bind(self, source: Path | str, dest: str) -> None:
        self.ensure_parents(dest)
        self.add("--ro-bind", source, dest)

    def data_file(self, text: str, dest: str) -> None:
        read_end, write_end = os.pipe()
        os.write(write_end, text.encode())  # small: fits in the pipe buffer
        os.close(write_end)
        self.data_fds.append(read_end)
        self.add("--perms", "0644", "--ro-bind-data", str(read_end), dest)


def _bwrap_argv(bwrap: str, argv: list[str], workdir: Path, limits: Limits, ro_binds: dict[Path, str],
                cgroups: _RunCgroups, uid: int, privileged: bool, devices: tuple[str, ...] = ()) -> _BwrapCommand:
    """The full command: bwrap options, then (inside) setpriv or prlimit if needed, then `argv`, run as `uid`."""
    runtime_dirs = _python_runtime_dirs()
    _check_trusted_packages_hidden(runtime_dirs + [Path(source) for source in ro_binds])
    if privileged:
        setpriv = _util_linux_tool("setpriv", "to drop root privileges in the sandbox")
        inner_prefix = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    elif not cgroups.has("pids"):
        # Set inside the user namespace, where the kernel counts only this sandbox's tasks; set outside,
        # it would count every process of the grader's user.
        prlimit = _util_linux_tool("prlimit", "to limit the number of processes")
        inner_prefix = [prlimit, f"--nproc={limits.max_processes}:{limits.max_processes}", "--"]
    else:
        inner_prefix = []

    cmd = _BwrapCommand(bwrap)
    cmd.add("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "sandbox", "--die-with-parent", "--new-session")
    if privileged:
        # Keep only what is needed until setpriv has dropped to `uid` (setpriv then clears every
        # capability): to chdir into the work folder (mode 0700, owner `uid`) and to switch user.
        cmd.add("--cap-drop", "ALL", "--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP")
    else:
        cmd.add("--unshare-user", "--uid", str(uid), "--gid", str(uid), "--disable-userns")

    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            cmd.add("--symlink", os.readlink(path), path)
        elif os.path.isdir(path):
            cmd.ro_bind(path, path)
    cmd.add("--perms", "0755", "--dir", "/etc")
    cmd.dirs.add("/etc")
    for name in _ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            cmd.add("--ro-bind", f"/etc/{name}", f"/etc/{name}")
    generated = {
        "passwd": f"student:x:{uid}:{uid}:sandbox:{SANDBOX_DIR}:/usr/sbin/nologin\n",
        "group": f"student:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }
    for name, text in generated.items():
        cmd.data_file(text, f"/etc/{name}")

    cmd.add("--proc", "/proc", "--dev", "/dev")
    for device in devices:  # e.g. a GPU's /dev/nvidia*, which the CUDA driver also reads /sys about
        cmd.add("--dev-bind", device, device)
    for directory in _DEVICE_SYS_DIRS if devices else ():
        if os.path.isdir(directory):
            cmd.ro_bind(directory, directory)
    tmpfs_bytes = str(max(limits.memory_mb // 4, 16) * MB)  # its pages also count in the memory cgroup
    cmd.add("--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", "/dev/shm", "--remount-ro", "/dev")
    cmd.add("--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", "/tmp")

    for directory in runtime_dirs:
        cmd.ro_bind(directory, str(directory))
    for source, dest in ro_binds.items():
        cmd.ro_bind(source, dest)
    cmd.add("--bind", workdir, SANDBOX_DIR, "--chdir", SANDBOX_DIR, "--remount-ro", "/", "--")
    cmd.add(*inner_prefix, *argv)
    return cmd


def _util_linux_tool(name: str, purpose: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"{name} (Debian package util-linux) is needed {purpose}; install it")
    return path


def _sandbox_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The complete environment inside the sandbox: nothing of the grader's environment leaks in."""
    bin_dirs = []
    if sys.prefix != sys.base_prefix:
        bin_dirs.append(str(Path(sys.prefix).absolute() / "bin"))
    bin_dirs += ["/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        "PATH": ":".join(bin_dirs),
        "HOME": SANDBOX_DIR,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "MPLBACKEND": "Agg",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        # Threads count against max_processes; BLAS and OpenMP would otherwise start one per core.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # Caches and runtime files go to the private /tmp rather than into the student's folder.
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "IPYTHONDIR": "/tmp/ipython",
        "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
        "XDG_CACHE_HOME": "/tmp/cache",
    }
    env.update(extra or {})
    return env


def _translate_paths(value: str, mapping: dict[str, str]) -> str:
    """Rewrite a sandbox path into the host path it is bound from (used without a sandbox), e.g.

    with {"/submission": "/srv/work/alice"}: "/submission/out.json" -> "/srv/work/alice/out.json".
    """
    for inside, host in mapping.items():
        if value == inside or value.startswith(inside + "/"):
            return host + value[len(inside):]
    return value


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """lchown `root` and everything below it (never following symlinks)."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _validate(workdir: Path, ro_binds: dict[Path, str], privileged: bool) -> None:
    """Fail early, with a message the caller can act on, on mistakes bwrap would report obscurely."""
    if not workdir.is_dir():
        raise ValueError(f"workdir {workdir} is not a directory")
    for source, dest in ro_binds.items():
        source = Path(source)
        if not source.exists():
            raise ValueError(f"ro_binds source {source} does not exist")
        if not dest.startswith("/") or dest.rstrip("/") == "":
            raise ValueError(f"ro_binds destination {dest!r} must be an absolute path below /")
        if any(_is_under(dest, reserved) for reserved in _RESERVED_DESTINATIONS):
            raise ValueError(f"ro_binds destination {dest!r} is inside {_RESERVED_DESTINATIONS}, "
                             f"which the sandbox mounts itself; choose e.g. /grader/...")
        if privileged and not source.stat().st_mode & 0o004:
            raise ValueError(f"ro_binds source {source} is not world-readable, but the sandbox runs as "
                             f"a uid of its own; chmod it o+r (and o+x for a directory)")


def _decode_status(returncode: int, sandboxed: bool) -> tuple[int, int | None]:
    """(returncode, signal): a Popen status -N, or bwrap's 128 + N, means death by signal N.

    `_decode_status(139, True)` is (-11, 11) (SIGSEGV); `_decode_status(3, True)` is (3, None).
    """
    if returncode < 0:
        return returncode, -returncode
    if sandboxed and 128 < returncode < 128 + signal.NSIG:
        return -(returncode - 128), returncode - 128
    return returncode, None


def _isolation(limits: Limits, cgroups: _RunCgroups, workdir: Path, identity: str, nproc: str) -> dict[str, str]:
    """Limit -> the mechanism that enforces it in this run (SandboxResult.isolation)."""
    cpu = cgroups.mechanism("cpu")
    return {
        "memory": cgroups.mechanism("memory")
        or f"memory watchdog + RLIMIT_AS {_address_space_backstop_mb(limits)} MB per process",
        "pids": cgroups.mechanism("pids") or nproc,
        "cpu": f"{cpu} cpu quota ({limits.cpus:g} CPU)" if cpu else "none (RLIMIT_CPU per process only)",
        "disk": next((limit for folder, limit in _WORK_FOLDERS.items() if _is_under(workdir, folder)),
                     "RLIMIT_FSIZE per file only"),
        "uid": identity,
    }


def run_sandboxed(argv: list[str], workdir: Path, limits: Limits = Limits(), *,
                  ro_binds: dict[Path, str] | None = None,
                  env: dict[str, str] | None = None,
                  stdin_data: bytes | None = None,
                  devices: tuple[str, ...] = (),
                  unsafe_no_sandbox: bool = False) -> SandboxResult:
    """Run `argv` in a sandbox with `workdir` read-write at /submission (cwd and HOME); see the module
    docstring for what is isolated and limited.

    ro_binds: extra read-only host files or directories -> absolute path inside the sandbox (not under
        /usr, /etc, /proc, /dev, /tmp or /submission), e.g. {Path("run.py"): "/grader/run.py"}.
    env: added to the sandbox's clean environment.
    stdin_data: what the command reads on its standard input (a pipe that ends after it; default: nothing).
        Once read, no copy of it is left in the sandbox (the grader's hidden inputs travel this way).
    devices: host device files bound into the sandbox's /dev at the same paths (a GPU's ``/dev/nvidia*``); the
        sandbox then also sees /sys's device directories read-only. Default: none, a minimal /dev.
    unsafe_no_sandbox: run without isolation (cgroups, rlimits and the parent's kills only); argv and env
        values that start with /submission or a ro_binds destination are rewritten to the host paths.

    Raises SandboxUnavailable when bwrap is missing (unless unsafe_no_sandbox), SandboxError when the
    launcher could not start, ValueError for invalid arguments. Whatever the submission does, it
    returns a SandboxResult once nothing of the run is left.
    """
    workdir = Path(workdir).resolve()  # lchown must not stop at a symlink
    ro_binds = {Path(source).absolute(): dest for source, dest in (ro_binds or {}).items()}
    privileged = os.geteuid() == 0
    sandbox_env = _sandbox_env(env)
    bwrap = None if unsafe_no_sandbox else _find_bwrap()
    if not unsafe_no_sandbox and bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, so student code cannot be isolated. Install it "
            "(Debian/Ubuntu: `apt-get install bubblewrap`) or, only for trusted code, pass "
            "--unsafe-no-sandbox (unsafe_no_sandbox=True).")
    _validate(workdir, ro_binds, privileged and not unsafe_no_sandbox)
    for device in devices:
        if not device.startswith("/dev/") or ".." in device or not os.path.exists(device):
            raise ValueError(f"device {device!r} is not an existing path under /dev/")

    slot = None
    cgroups = _RunCgroups({})
    child_fds: list[int] = []  # the child's copies are what it needs; the parent closes its own afterwards
    heartbeat_fd = None
    try:
        cgroups = _RunCgroups.create(limits)
        if privileged and not unsafe_no_sandbox:
            slot = _SLOTS.acquire()
        if limits.idle_seconds is not None:
            heartbeat_fd, heartbeat_write = os.pipe()
            child_fds.append(heartbeat_write)
            sandbox_env["GRADER_HEARTBEAT_FD"] = str(heartbeat_write)
        if unsafe_no_sandbox:
            mapping = {SANDBOX_DIR: str(workdir), **{dest: str(src) for src, dest in ro_binds.items()}}
            command = [_translate_paths(a, mapping) for a in argv]
            sandbox_env = {k: _translate_paths(v, mapping) for k, v in sandbox_env.items()}
            cwd = str(workdir)
            # As root RLIMIT_NPROC is not enforced; as user U it would count all of U's processes.
            nproc_in_launcher, identity, nproc = False, "the grader's own (no sandbox)", "none"
        else:
            assert bwrap is not None
            sandbox_uid = SANDBOX_UID if slot is None else SLOT_UID_BASE + slot
            if privileged:
                _chown_tree(workdir, sandbox_uid, sandbox_uid)
            built = _bwrap_argv(bwrap, argv, workdir, limits, ro_binds, cgroups, sandbox_uid, privileged, devices)
            child_fds += built.data_fds
            command, cwd = built.args, "/"
            nproc_in_launcher = privileged  # root is exempt until setpriv; see _bwrap_argv otherwise
            if privileged:
                identity, nproc = f"{sandbox_uid} (slot {slot})", "RLIMIT_NPROC on a per-slot uid"
            else:
                identity, nproc = f"{SANDBOX_UID} in a user namespace", "RLIMIT_NPROC in a user namespace"
        isolation = _isolation(limits, cgroups, workdir, identity, nproc)
        return _run(command, cwd, sandbox_env, limits, cgroups, child_fds, heartbeat_fd,
                    _rlimits(limits, cgroups, nproc_in_launcher), isolation, sandboxed=not unsafe_no_sandbox,
                    stdin_data=stdin_data)
    finally:
        for fd in child_fds + ([heartbeat_fd] if heartbeat_fd is not None else []):
            with contextlib.suppress(OSError):
                os.close(fd)
        cgroups.remove()
        if slot is not None:
            _SLOTS.release(slot)  # every process of the run, and so of the slot uid, is gone


def _run(command: list[str], cwd: str, env: dict[str, str], limits: Limits, cgroups: _RunCgroups,
         child_fds: list[int], heartbeat_fd: int | None, rlimits: dict[str, tuple[int, int]],
         isolation: dict[str, str], sandboxed: bool, stdin_data: bytes | None = None) -> SandboxResult:
    executable = shutil.which(command[0], path=env["PATH"]) if "/" not in command[0] else command[0]
    if executable is None:
        raise ValueError(f"{command[0]!r} not found on the sandbox PATH {env['PATH']}")
    status_read, status_write = os.pipe()
    config = {"cgroup_procs": cgroups.procs_files(), "rlimits": rlimits, "status_fd": status_write}
    stdin_read, feeder = _stdin_feeder(stdin_data)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(config), executable, *command[1:]],
            stdin=stdin_read, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
            pass_fds=[status_write, *child_fds], start_new_session=True)
    finally:
        os.close(status_write)
        if stdin_read != subprocess.DEVNULL:
            os.close(stdin_read)
    if feeder is not None:
        feeder.start()
    readers = [_BoundedCapture(proc.stdout, "stdout", limits.max_captured_output),
               _BoundedCapture(proc.stderr, "stderr", limits.max_captured_output)]
    for reader in readers:
        reader.start()
    heartbeat = _Heartbeat(heartbeat_fd, start) if heartbeat_fd is not None else None
    killed_by = None
    try:
        with os.fdopen(status_read, "rb") as status:
            launch_error = status.read().decode(errors="replace")
        if launch_error:
            raise SandboxError(f"could not start the sandbox: {launch_error}")
        killed_by = _monitor(proc.pid, limits, cgroups, heartbeat, start)
    finally:
        # Also after a normal exit: kills leftovers of an unsandboxed run (a sandbox has none: its pid
        # namespace died with it), and anything if the grader itself is interrupted. The exited main
        # process is still unreaped here, so its pid cannot have been reused as another group's id.
        _kill_process_group(proc.pid)
        proc.wait()
        if not cgroups.kill_all():
            log.warning("processes of the run survived SIGKILL for 5 s: %s", cgroups.dirs)
        wall_seconds = time.monotonic() - start
        for reader in readers:
            # EOF comes once the last writer is dead; only an unsandboxed run without cgroup can leave one.
            reader.join(timeout=5.0)
            if reader.is_alive():
                log.warning("a process of the unsandboxed run still holds its %s; not waiting",
                            reader.stream_name)
        proc.stdout.close()
        proc.stderr.close()

    if heartbeat is not None:
        heartbeat.poll()  # the lines written just before the exit
    if killed_by is not None:
        returncode, signal_number = None, None
    else:
        returncode, signal_number = _decode_status(proc.returncode, sandboxed)
    stdout, stderr = readers
    return SandboxResult(
        returncode=returncode,
        signal=signal_number,
        killed_by=killed_by,
        oom_killed=cgroups.oom_killed(),
        stdout=stdout.text(),
        stderr=stderr.text(),
        wall_seconds=wall_seconds,
        cpu_seconds=cgroups.cpu_seconds(),
        isolation=isolation,
        last_heartbeat=heartbeat.last_line if heartbeat is not None else None,
    )


def _stdin_feeder(data: bytes | None) -> tuple[int, threading.Thread | None]:
    """The run's standard input: DEVNULL, or the read end of a pipe and a thread that writes ``data`` into it
    and closes it (it ends early, quietly, if the run stops reading)."""
    if data is None:
        return subprocess.DEVNULL, None
    read_end, write_end = os.pipe()

    def feed():
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
        except OSError:  # the run ended or closed its standard input
            pass
        finally:
            os.close(write_end)

    return read_end, threading.Thread(target=feed, name="sandbox-stdin", daemon=True)


def _kill_process_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------
# Work folders
# ----------------------------------------------------------------------------------------------

_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2  # <sys/mount.h>
_WORK_FOLDERS: dict[Path, str] = {}  # this process's mounted work folders -> their disk limit, for `isolation`


@contextlib.contextmanager
def work_folder(limits: Limits, parent: Path | None = None, prefix: str = "llmarch-grade-") -> Iterator[Path]:
    """A fresh private folder (mode 0700) under `parent` (default: the temporary directory) for one
    submission; on exit it is removed with everything in it, also when the block raised.

    As root it is a tmpfs of `limits.disk_mb` (see the module docstring), so a sandbox whose workdir is
    inside it cannot fill the host's disk; otherwise, or if the mount fails, a plain folder.
    """
    if (str(parent), prefix) not in _SWEPT:  # once per process
        _SWEPT.add((str(parent), prefix))
        sweep_leftovers(parent, prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent)).resolve()
    held = None
    try:
        mounted = os.geteuid() == 0 and _mount_tmpfs(path, limits.disk_mb)
        if mounted:
            _WORK_FOLDERS[path] = f"tmpfs {limits.disk_mb} MB"
        held = os.open(path, os.O_RDONLY | os.O_DIRECTORY)  # what the path shows now: see sweep_leftovers
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            if mounted:
                del _WORK_FOLDERS[path]
                _unmount(path)
    finally:
        if held is not None:
            os.close(held)
        _remove_tree(path)


STALE_FOLDER_SECONDS = 60.0  # an unlocked work folder this old belongs to no grader (it locks it at once)
STALE_CGROUP_SECONDS = 600.0  # an empty run cgroup this old belongs to no run (a live run's is never empty long)
_SWEPT: set[tuple[str, str]] = set()  # (parent, prefix) already swept by this process


def sweep_leftovers(parent: Path | None = None, prefix: str = "llmarch-grade-",
                    min_age: float = STALE_FOLDER_SECONDS) -> list[str]:
    """Remove what a grader killed without cleaning up (SIGKILL, a Dask worker that died) left behind (every
    ``work_folder`` does this once per process): work folders named ``prefix*`` under ``parent`` (default: the temporary directory) that no process
    holds locked and that are older than ``min_age`` seconds (each live one is ``flock``-ed by its grader,
    once its tmpfs is mounted, until it is removed; the kernel drops the lock when the process dies, in any pid
    namespace), unmounting their tmpfs first; and this grader's sibling cgroups
    ``llmarch-sandbox-*`` that are empty and older than ``STALE_CGROUP_SECONDS``. Returns what was removed.
    What cannot be removed (a mount or cgroup another namespace holds) is logged and left."""
    folder = Path(parent or tempfile.gettempdir())
    removed = []
    for path in folder.glob(f"{prefix}*"):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if time.time() - os.fstat(fd).st_mtime < min_age:
                raise BlockingIOError  # so new that its grader may not have locked it yet
        except OSError:  # a live grader holds it
            os.close(fd)
            continue
        try:
            if os.path.ismount(path):
                _unmount(path)
            _remove_tree(path)
            removed.append(str(path))
        except OSError as exc:
            log.warning("cannot remove the stale work folder %s: %s", path, exc)
        finally:
            os.close(fd)
    try:
        v1_parents, v2_parent = _locate_cgroups(_read_text("/proc/self/mountinfo"), _read_text("/proc/self/cgroup"))
    except OSError:
        return removed
    for cgroup_parent in {*v1_parents.values(), *([v2_parent] if v2_parent else [])}:
        for cgroup in cgroup_parent.glob("llmarch-sandbox-*"):
            try:
                empty = not _read_text(cgroup / "cgroup.procs").strip()
                if empty and time.time() - cgroup.stat().st_mtime > STALE_CGROUP_SECONDS:
                    cgroup.rmdir()
                    removed.append(str(cgroup))
            except OSError:
                continue
    if removed:
        log.warning("removed what earlier grader runs left behind: %s", ", ".join(removed)[:1000])
    return removed


def _libc_call(name: str, *args) -> None:
    """Call libc's `name`; raise OSError if it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    try:
        _libc_call("mount", b"llmarch-grade", os.fsencode(path), b"tmpfs", ctypes.c_ulong(_MS_NOSUID | _MS_NODEV),
                   f"size={size_mb}m,mode=0700".encode())
    except OSError as exc:
        log.warning("cannot mount a tmpfs on %s (%s): its disk use is bounded per file only", path, exc)
        return False
    return True


def _unmount(path: Path) -> None:
    """Unmount `path`; detached (MNT_DETACH) so that it goes even while something still uses it."""
    try:
        _libc_call("umount2", os.fsencode(path), _MNT_DETACH)
    except OSError as exc:
        log.warning("cannot unmount %s: %s", path, exc)


def _remove_tree(path: Path) -> None:
    """Delete `path` and everything below it, whatever a submission left there: any depth (beyond
    PATH_MAX and the recursion limit), directories without permissions, symlinks (removed, never
    followed), fifos and sockets (never opened), files of any owner.

    Every call takes one name relative to an open directory: a non-empty subdirectory is moved up into
    `path` itself and emptied there in a later pass, so no path grows and nothing recurses.
    """
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except FileNotFoundError:
        return
    _make_accessible(path, None)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fresh_names = (f".removing-{i}" for i in itertools.count())
        while names := os.listdir(top):
            for name in names:
                _remove_entry(top, name, fresh_names)
    finally:
        os.close(top)
    os.rmdir(path)


def _remove_entry(top: int, name: str, fresh_names: Iterator[str]) -> None:
    """Remove `name` in directory `top`: a non-directory at once, a directory after deleting its
    non-directories and moving its subdirectories up into `top`."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=top)
        return
    _make_accessible(name, top)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    try:
        for child in os.listdir(fd):
            if not stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(child, dir_fd=fd)
                continue
            _make_accessible(child, fd)  # moving a directory rewrites its "..": that needs write permission
            for new_name in fresh_names:
                try:
                    os.rename(child, new_name, src_dir_fd=fd, dst_dir_fd=top)
                    break
                except OSError as exc:  # the submission used that name: take the next
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                        raise
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=top)


def _make_accessible(name: str | Path, dir_fd: int | None) -> None:
    """Give a directory of the tree mode 0700, which a non-root owner needs to list, enter and change it
    (root may anyway). The caller checked it is a directory; nothing of the run is alive to swap it."""
    if os.geteuid() != 0:
        os.chmod(name, 0o700, dir_fd=dir_fd)


# ----------------------------------------------------------------------------------------------
# Reading results
# ----------------------------------------------------------------------------------------------


def read_result_file(workdir: Path, name: str, max_bytes: int = 10 * MB) -> bytes | None:
    """Read a file the sandboxed code wrote into `workdir`, safely: None if it is missing, not a regular
    file, a symlink (which would make the trusted grader read e.g. solutions/ on the student's behalf),
    reached through a symlinked directory, or larger than `max_bytes`.

    `read_result_file(work, "results.json")` -> b'{"cells": ...}'.
    """
    workdir = Path(workdir)
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"{name!r} must be a relative path inside the work folder")
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in relative.parts[:-1]:
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(relative.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            return None
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        os.close(file_fd)
        return None
    with os.fdopen(file_fd, "rb") as f:
        data = f.read(max_bytes + 1)
    return data if len(data) <= max_bytes else None
