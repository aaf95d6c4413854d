"""Watching a running sandbox from the trusted parent: the memory watchdog (the process tree and its
resident memory), the heartbeat pipe, `_monitor`, which says when and why to kill the run, and the
bounded capture of its stdout and stderr."""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from autograder.sandbox.cgroups import _RunCgroups
from autograder.sandbox.limits import MB, Limits


_POLL_SECONDS = 0.05  # longest pause between two checks of a running sandbox
_WATCHDOG_SECONDS = 0.1  # pause between two memory watchdog scans (each reads /proc)


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
    """The read end of the heartbeat pipe: remembers when the last complete line arrived, and the line; and the
    seals of the test cells, the lines ``captured <check> <digest>`` (``runner.outputs_digest``), as
    ``check -> digest``."""

    MAX_LINE = 100
    MAX_SEALS = 10_000

    def __init__(self, fd: int, now: float):
        self.fd: int | None = fd
        self.last_time, self.last_line, self.partial = now, None, b""
        self.seals: dict[str, str] = {}
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
        for line in lines:
            words = line.decode("utf-8", errors="replace").split(" ")
            if len(words) == 3 and words[0] == "captured" and len(self.seals) < self.MAX_SEALS:
                self.seals[words[1][:self.MAX_LINE]] = words[2][:64]
        if lines:
            self.last_time = time.monotonic()
            self.last_line = lines[-1][:self.MAX_LINE].decode("utf-8", errors="replace")


def _monitor(pid: int, limits: Limits, cgroups: _RunCgroups, heartbeat: _Heartbeat | None,
             start: float) -> str | None:
    """Wait until child `pid` exits, or until the run must be killed; returns the reason to kill (see the
    package docstring), or None once it exited. The child is left a zombie (WNOWAIT), so its pid stays
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
