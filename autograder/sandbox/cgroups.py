"""Per-run cgroups (v1 and v2): the grader's own cgroups, found from /proc/self/mountinfo and
/proc/self/cgroup; the settings a run's `Limits` give; and `_RunCgroups`, which creates one run's
cgroups, reads their counters, kills their tasks and removes them."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from autograder.sandbox.limits import MB, Limits

log = logging.getLogger(__name__)


_CONTROLLERS = frozenset({"memory", "pids", "cpu", "cpuacct"})  # "cpuacct": usage (cpu.stat on v2)
_V2_LEAF = "llmarch-grader"  # where the grader's own processes move on cgroup v2 (see the package docstring)
_OPTIONAL_FILES = ("memory.memsw.limit_in_bytes", "memory.swap.max")  # absent without swap accounting
_CPU_PERIOD_US = 100_000  # CFS period of the cpu quota


def _read_text(path: Path | str) -> str:
    """The file's text, or "" when it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


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
