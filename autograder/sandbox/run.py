"""`run_sandboxed`: start a command through the launcher (which joins the run's cgroups and sets its
rlimits), in bubblewrap unless told otherwise; watch it, kill what is left of it, and report a
`SandboxResult`. `bubblewrap_available` says whether it can isolate code on this machine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder.sandbox.bwrap_command import _bwrap_argv, _is_under, _sandbox_env, _validate
from autograder.sandbox.cgroups import _RunCgroups
from autograder.sandbox.folders import _WORK_FOLDERS
from autograder.sandbox.limits import (MB, SANDBOX_DIR, SANDBOX_UID, SLOT_UID_BASE, Limits, SandboxError,
                                       SandboxResult, SandboxUnavailable)
from autograder.sandbox.monitor import _BoundedCapture, _Heartbeat, _monitor
from autograder.sandbox.slots import _SLOTS

log = logging.getLogger(__name__)


def _find_bwrap() -> str | None:
    """Path of the bwrap executable, or None (tests monkeypatch this)."""
    return shutil.which("bwrap")


def bubblewrap_available() -> bool:
    """True if bubblewrap is installed, i.e. `run_sandboxed` can isolate code."""
    return _find_bwrap() is not None


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
    """Run `argv` in a sandbox with `workdir` read-write at /submission (cwd and HOME); see the package
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
        seals=dict(heartbeat.seals) if heartbeat is not None else {},
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
