"""Slot uids, for a grader running as root: every run in progress gets a uid that no concurrent run
shares, claimed with an exclusive `flock` on a lock file (the package docstring, "Identity")."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading

from autograder.sandbox.limits import MAX_SLOTS, SLOT_DIR, SandboxError


class _UidSlots:
    """The slots this process holds (see the package docstring): `acquire` hands out a free one, claiming a
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
