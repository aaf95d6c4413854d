"""Phase 1 of grading, inside the sandbox: execute the prepared notebook's code cells, one by one.

Copied read-only into every sandbox as ``/grader/runner.py`` and started there as
``python /grader/runner.py NOTEBOOK``, with the hidden inputs of every test cell on standard input (a zip of
``<check>/spec.json`` and its arrays, written by ``checks.pack_inputs``; nothing when there are none). Two
processes, so that the notebook's code cannot write what the grader trusts:

* the **supervisor** (this process, as started) reads the notebook and its standard input to the end, makes
  itself non-dumpable (``PR_SET_DUMPABLE`` 0: a process of the same uid can then neither ptrace it nor open its
  ``/proc/<pid>/fd``, ``mem`` or ``environ``) and starts the kernel. It alone holds the heartbeat pipe (its
  number in ``GRADER_HEARTBEAT_FD``; not inherited by the kernel). It hands the kernel one cell at a time,
  writes ``cell <index>`` to the heartbeat before each, and ``done`` only after the kernel answered for the
  last cell and ended. The trusted grader kills the run when no line arrives for the cell timeout
  (``Limits.idle_seconds``), so the wall clock of every cell is measured by code the notebook cannot reach
  (from the moment the cell is sent until the kernel answers, or a notebook answers for it: see below).
* the **kernel** (``runner.py --kernel``) runs each cell in an IPython shell, the way a Jupyter kernel does
  (magics, ``get_ipython()``, displays; the notebook's folder is the working directory and is on
  ``sys.path``). A test cell (a prepared cell whose metadata names a check, ``{"grader": {"capture": id}}``)
  is not run as code: the supervisor sends that check's hidden inputs with it, and only then, and the
  kernel calls ``capture.capture`` on them. The graded functions are looked up through what the release's
  read-only cells (``{"grader": {"release": id}}``) bound, kept right after each ran (``_kept``,
  ``_calling_namespace``): a student's later cell that redefines a read-only wrapper or launcher changes
  nothing. Right after a test cell, the supervisor seals what it captured (``outputs_digest``, a heartbeat
  line ``captured <check> <digest>``): files a later cell changes are refused by the grader. No file holds the
  inputs of a later test cell, and they are not sent before the cell before them has been answered for.

A kernel that dies while it runs a cell (a segfault, an abort, ``os._exit``) or answers nonsense costs that
cell only: the supervisor records it, starts a fresh kernel, runs the code cells before it again (not the test
cells: their results are already captured; not cells lost to an earlier crash), each under its own heartbeat
line, and goes on from the next cell. Cells that need what the lost cell defined fail on their own. A crash
while cells run again counts too; after ``MAX_CRASHES`` crashes the next one ends the run without ``done``,
and so does the first death by a limit's signal (``LIMIT_SIGNALS``: ``SIGKILL``, sent by the out-of-memory
killer, and ``SIGXCPU``, by ``RLIMIT_CPU``): the supervisor exits with that kernel's status, or dies of its
signal. The notebook's wall clock is kept by the grader across kernels, and so are its memory and CPU time
where a cgroup bounds them.

The notebook shares the kernel's process, so it can reach both pipes (their numbers are in the kernel's
``argv`` and ``/proc/self/fd``) and answer for the kernel. An answer that comes while the supervisor's last
message is still unread in its pipe is refused, and the cell counts as crashed: the kernel reads all of a cell
before it runs it. A notebook that also reads the supervisor's messages itself can still answer for a cell
before that cell has finished: it then receives the next cell (a test cell's hidden inputs) while its earlier
code still runs, and may run that capture itself, longer than the cell timeout, within the notebook's limit.
It gains time for a slow function, nothing else: the inputs hold no expected values, and come only after the
cell before them was answered for. It can also kill the supervisor (same uid), which ends the run as crashed.

``.grader-run.json`` beside the notebook (written by the supervisor, but inside the submission's folder, so
advisory only) records each executed cell's index and status (``ok``; ``error`` with the exception's name and
message; ``crashed`` with ``signal SIGSEGV`` or ``exit code 1`` as its name) and ``"kernel"``: ``running``
until the last cell is done, then ``finished``. Its space is reserved first, so a notebook that fills its disk
does not stop it.
"""

import argparse
import fcntl
import io
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import zipfile

RECORD_RESERVE = 256 * 1024  # bytes of disk set aside for the record before any cell runs
MAX_REPLY_BYTES = 2**20  # one answer of the kernel
KERNEL_EXIT_SECONDS = 2.0  # how long the kernel may take to flush its output and exit after the last cell
MAX_CRASHES = 5  # kernel crashes a run survives (ps12's forward kernel alone is called by 3 test cells)
LIMIT_SIGNALS = (signal.SIGKILL, signal.SIGXCPU)  # a kernel killed by one of these ends the run at once


def open_record(path):
    """Create the record and reserve its space, so that a notebook that fills its disk cannot stop it being
    written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, RECORD_RESERVE)
    except OSError:  # the file system cannot reserve: write without
        pass
    return fd


def write_record(fd, cells, kernel):
    """Overwrite the record in place, padded with spaces (still valid JSON) to the reserved size, so that no
    new space is needed; if even that fails, the previous record stays."""
    data = json.dumps({"cells": cells, "kernel": kernel}).encode()
    try:
        os.pwrite(fd, data.ljust(RECORD_RESERVE), 0)
    except OSError:
        pass


def heartbeat(fd, line):
    if fd is None:
        return
    try:
        os.write(fd, f"{line}\n".encode())
    except OSError:
        pass


# -- Messages between supervisor and kernel: an 8-byte length, a JSON header, then the payload's files ----------

def _read_exactly(fd, count):
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send(fd, header, files=None):
    """Write one message: ``header`` (a dict) and ``files`` ({name: bytes}, sent after it in order)."""
    files = files or {}
    header = dict(header, files=[[name, len(data)] for name, data in files.items()])
    raw = json.dumps(header).encode()
    os.write(fd, struct.pack("<Q", len(raw)) + raw)
    for data in files.values():
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def receive(fd, limit=None):
    """One message from ``fd`` as ``(header, files)``; ``(None, {})`` at the end of the pipe, or when the
    message is malformed or longer than ``limit`` bytes."""
    size = _read_exactly(fd, 8)
    if size is None:
        return None, {}
    length = struct.unpack("<Q", size)[0]
    if limit is not None and length > limit:
        return None, {}
    raw = _read_exactly(fd, length)
    try:
        header = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        return None, {}
    files = {}
    for name, count in header.get("files", []):
        data = _read_exactly(fd, count)
        if data is None:
            return None, {}
        files[name] = data
    return header, files


# -- What a test cell wrote, sealed -------------------------------------------------------------------------------

OUTPUTS = ".grader-outputs"  # capture.OUTPUTS, relative to the notebook's folder
MAX_SEALED_BYTES = 512 * 2**20  # what one check's digest reads at most


def outputs_digest(folder, check):
    """A digest of everything in ``<folder>/.grader-outputs/<check>/``: each entry's name and kind, and each
    regular file's bytes (no link followed, at most ``MAX_SEALED_BYTES`` read). The supervisor writes it to the
    heartbeat right after the check's test cell (``captured <check> <digest>``); the grader computes it again on
    the files it collects, so results that a later cell changed, added or removed are noticed."""
    import hashlib

    digest, budget = hashlib.sha256(), MAX_SEALED_BYTES
    flags = os.O_RDONLY | os.O_NOFOLLOW
    try:
        top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            outputs = os.open(OUTPUTS, flags | os.O_DIRECTORY, dir_fd=top)
        finally:
            os.close(top)
        try:
            fd = os.open(str(check), flags | os.O_DIRECTORY, dir_fd=outputs)
        finally:
            os.close(outputs)
    except OSError:
        return "none"
    try:
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            regular = entry.is_file(follow_symlinks=False)
            digest.update(f"{entry.name}\0{'file' if regular else 'other'}\0".encode("utf-8", "surrogateescape"))
            if regular:
                with open(os.open(entry.name, flags | os.O_NONBLOCK, dir_fd=fd), "rb") as f:  # never a fifo's wait
                    while budget > 0 and (chunk := f.read(min(2**20, budget))):
                        digest.update(chunk)
                        budget -= len(chunk)
    except OSError:
        return "unreadable"
    finally:
        os.close(fd)
    return digest.hexdigest()[:32] if budget > 0 else "too-large"


# -- The supervisor ----------------------------------------------------------------------------------------------

def _read_cells(notebook):
    """``(source, check id or None, whether it is a read-only cell of the release)`` for every code cell of the
    prepared notebook."""
    with open(notebook, encoding="utf-8") as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    return [("".join(c["source"]) if isinstance(c["source"], list) else c["source"],
             c.get("metadata", {}).get("grader", {}).get("capture"),
             bool(c.get("metadata", {}).get("grader", {}).get("release"))) for c in cells]


def _hidden_inputs(stream):
    """``{check id: {file name: bytes}}`` from the zip on ``stream`` (read to its end); ``{}`` when empty."""
    data = stream.read()
    if not data:
        return {}
    inputs = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            check, _, file = name.partition("/")
            inputs.setdefault(check, {})[file] = archive.read(name)
    return inputs


def _no_dumping():
    """Make this process non-dumpable (Linux prctl PR_SET_DUMPABLE = 4, value 0)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _cell_entry(index, reply):
    """The record's entry for a cell from the kernel's answer (plain fields, truncated)."""
    if reply.get("status") == "error":
        return {"index": index, "status": "error", "ename": str(reply.get("ename", ""))[:200],
                "evalue": str(reply.get("evalue", ""))[:1000]}
    return {"index": index, "status": "ok"}


def _unread(fd):
    """How many bytes written to the pipe ``fd`` (either end) are still unread (Linux ``FIONREAD``)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def _how_it_ended(status):
    """``signal SIGSEGV`` or ``exit code 1``, from a ``Popen.returncode``."""
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"exit code {status}"


class Kernel:
    """One kernel process and the supervisor's ends of its two pipes."""

    def __init__(self, notebook):
        self.stopped = False  # whether the supervisor killed it
        self.refused = ""  # why its last answer was not taken, if it was not
        command_read, self.command_write = os.pipe()
        self.reply_read, reply_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--kernel", str(command_read), str(reply_write), notebook],
            stdin=subprocess.DEVNULL, pass_fds=(command_read, reply_write), close_fds=True)
        os.close(command_read)
        os.close(reply_write)

    def ask(self, header, files=None):
        """Send one cell and wait for the answer; None when the kernel is gone or answered nonsense (``refused``
        then says why): an answer that comes while part of the cell is still unread in its pipe is not the
        kernel's, which reads all of a cell before it runs it."""
        try:
            send(self.command_write, header, files)
        except OSError:
            return None
        reply, _ = receive(self.reply_read, MAX_REPLY_BYTES)
        if reply is not None and _unread(self.command_write):
            self.refused = "an answer came before the cell was read"
            return None
        return reply

    def end(self, politely):
        """Stop the kernel (asking it to exit first when ``politely``) and return its exit status."""
        if politely:
            try:
                send(self.command_write, {"exit": True})
                self.process.wait(timeout=KERNEL_EXIT_SECONDS)
            except (OSError, subprocess.TimeoutExpired):
                pass
        else:  # its pipe ended: give a dying kernel a moment to finish dying, so its own status is seen
            try:
                self.process.wait(timeout=KERNEL_EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.stopped = True
        for fd in (self.command_write, self.reply_read):
            os.close(fd)
        return self.process.wait()


def supervise(notebook):
    cells = _read_cells(notebook)
    inputs = _hidden_inputs(sys.stdin.buffer)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the pipe the inputs came on is empty now; nothing of them stays open
    os.close(null)
    beat_fd = int(os.environ.pop("GRADER_HEARTBEAT_FD")) if "GRADER_HEARTBEAT_FD" in os.environ else None
    _no_dumping()

    folder = os.path.dirname(os.path.abspath(notebook))
    record = open_record(os.path.join(folder, ".grader-run.json"))
    kernel = Kernel(notebook)
    executed, skipped = [], set()  # record entries; cells lost to a crash, never run again
    replay = []  # code cells to run again in a fresh kernel before the next cell
    index = 0  # the next cell to run for the first time
    write_record(record, executed, "running")
    while index < len(cells):
        current = replay[0] if replay else index
        source, check, release = cells[current]
        heartbeat(beat_fd, f"cell {current}")
        reply = (kernel.ask({"capture": check}, inputs.pop(check, {})) if check
                 else kernel.ask({"run": source, "release": release}))
        if reply is not None and check:
            heartbeat(beat_fd, f"captured {check} {outputs_digest(folder, check)}")
        if reply is not None:
            if replay:
                replay.pop(0)
            else:
                executed.append(_cell_entry(index, reply))
                write_record(record, executed, "running")
                index += 1
            continue
        status = kernel.end(politely=False)
        executed.append({"index": current, "status": "crashed", "ename": kernel.refused or _how_it_ended(status),
                         "evalue": "while it ran again after a later cell crashed" if replay else ""})
        write_record(record, executed, "running")
        limit = -status in LIMIT_SIGNALS and not kernel.stopped
        if limit or sum(entry["status"] == "crashed" for entry in executed) > MAX_CRASHES:  # end as the kernel did
            if status < 0:
                if -status not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(-status, signal.SIG_DFL)
                os.kill(os.getpid(), -status)
            os._exit(status if status > 0 else 1)
        skipped.add(current)
        index = max(index, current + 1)
        replay = [j for j in range(index) if cells[j][1] is None and j not in skipped]
        kernel = Kernel(notebook)
    kernel.end(politely=True)
    write_record(record, executed, "finished")
    heartbeat(beat_fd, "done")
    os._exit(0)


# -- The kernel ----------------------------------------------------------------------------------------------

def _load_capture():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capture.py")
    spec = importlib.util.spec_from_file_location("capture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bound_names(shell, source):
    """The names a cell binds at its top level (functions, classes, imports, assignments); none if it does not
    parse."""
    import ast

    try:
        tree = ast.parse(shell.transform_cell(source))
    except (SyntaxError, ValueError, RecursionError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _kept(namespace, names):
    """What a read-only cell bound, kept so that nothing the notebook does later reaches it: an immutable tuple of
    ``(name, value)``, a function kept as the parts it is made of (its code object cannot change; the function
    object's ``__code__`` can)."""
    import types

    kept = []
    for name in sorted(names):
        value = namespace[name]
        if isinstance(value, types.FunctionType):
            value = (value.__code__, value.__name__, value.__defaults__, value.__closure__,
                     tuple((value.__kwdefaults__ or {}).items()))
        kept.append((name, value))
    return tuple(kept)


def _calling_namespace(user_ns, release):
    """What a test cell's capture looks the graded functions up in: the notebook's namespace, with every name a
    read-only cell of the release bound as that cell bound it (``release``: the ``_kept`` tuples), its functions
    made again from their parts, looking their globals up here. A later cell of the student's that redefines a
    wrapper (``flash_output``) or a launcher it calls (``run_forward``), or swaps its ``__code__``, changes
    nothing; the student's own functions are found as usual. (Code that rewrites objects of its own process at a
    lower level, e.g. library modules' functions or memory through ctypes, is beyond what a capture in that
    process can prevent.)"""
    import types

    namespace = dict(user_ns)
    for name, value in release:
        if isinstance(value, tuple) and len(value) == 5 and isinstance(value[0], types.CodeType):
            code, function_name, defaults, closure, kwdefaults = value
            value = types.FunctionType(code, namespace, function_name, defaults, closure)
            value.__kwdefaults__ = dict(kwdefaults) or None
        namespace[name] = value
    return namespace


def run_kernel(command_fd, reply_fd, notebook):
    # As in a kernel started for this notebook: files it writes (%%writefile helper.py) are importable.
    folder = os.path.dirname(os.path.abspath(notebook))
    os.chdir(folder)
    sys.path.insert(0, folder)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    capture = None
    release = ()  # what the release's read-only cells bound (_kept), latest last
    while True:
        message, files = receive(command_fd)
        if message is None or "exit" in message:
            break
        reply = {"status": "ok"}
        if "capture" in message:
            try:
                capture = capture or _load_capture()
                capture.capture(str(message["capture"]), namespace=_calling_namespace(shell.user_ns, release),
                                inputs=files)
            except Exception as err:  # noqa: BLE001 - the notebook may have broken what capture needs
                reply = {"status": "error", "ename": type(err).__name__, "evalue": str(err)}
        else:
            result = shell.run_cell(message["run"], store_history=True)
            if message.get("release"):
                release += _kept(shell.user_ns, _bound_names(shell, message["run"]) & set(shell.user_ns))
            error = result.error_before_exec or result.error_in_exec
            if error is not None:
                reply = {"status": "error", "ename": type(error).__name__, "evalue": str(error)[:1000]}
        send(reply_fd, reply)
    for stream in (sys.stdout, sys.stderr):  # os._exit below would drop what they still buffer
        try:
            stream.flush()
        except Exception:  # the notebook may have replaced or closed them
            pass
    os._exit(0)  # skip interpreter teardown: nothing a submission registered (atexit, threads) runs after this


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", nargs=2, type=int, metavar=("COMMAND_FD", "REPLY_FD"))
    parser.add_argument("notebook")
    args = parser.parse_args()
    if args.kernel:
        run_kernel(*args.kernel, args.notebook)
    else:
        supervise(args.notebook)


if __name__ == "__main__":
    main()
