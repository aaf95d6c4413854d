"""Work folders and results: `work_folder` (a private folder per submission, a tmpfs when the grader
is root), `sweep_leftovers` (what a grader killed without cleaning up left behind), and
`read_result_file` (what the sandboxed code wrote, read without following its symlinks)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from autograder.sandbox.cgroups import _locate_cgroups, _read_text
from autograder.sandbox.limits import MB, Limits
from autograder.sandbox.removal import _remove_tree

log = logging.getLogger(__name__)


_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2  # <sys/mount.h>
_WORK_FOLDERS: dict[Path, str] = {}  # this process's mounted work folders -> their disk limit, for `isolation`


@contextlib.contextmanager
def work_folder(limits: Limits, parent: Path | None = None, prefix: str = "llmarch-grade-") -> Iterator[Path]:
    """A fresh private folder (mode 0700) under `parent` (default: the temporary directory) for one
    submission; on exit it is removed with everything in it, also when the block raised.

    As root it is a tmpfs of `limits.disk_mb` (see the package docstring), so a sandbox whose workdir is
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
    ``work_folder`` does this once per process): work folders named ``prefix*`` under ``parent`` (default: the
    temporary directory) that no process holds locked and that are older than ``min_age`` seconds (each live one is
    ``flock``-ed by its grader, once its tmpfs is mounted, until it is removed; the kernel drops the lock when the
    process dies, in any pid namespace), unmounting their tmpfs first; and this grader's sibling cgroups
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
