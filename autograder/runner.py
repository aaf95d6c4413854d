"""Phase 1 of grading, inside the sandbox: execute the prepared notebook's code cells, one by one, in-process.

Copied read-only into every sandbox as ``/grader/runner.py`` and started there as
``python /grader/runner.py NOTEBOOK``. The cells run in an IPython shell in this process, the way a Jupyter
kernel runs them (magics, ``get_ipython()``, displays; the notebook's folder is the working directory and is on
``sys.path``), without the cost of starting a kernel and talking to it over ZMQ.

Progress goes two ways, both advisory (the sandbox, not this process, decides how a run ended):

* the heartbeat: one line per cell start (``cell <index>``) and ``done`` at the end, written to the pipe
  whose number is in ``GRADER_HEARTBEAT_FD``. The trusted grader kills the run when no line arrives for the
  cell timeout (``Limits.idle_seconds``), so a cell that ignores signals or holds the interpreter lock is
  stopped all the same;
* ``.grader-run.json`` beside the notebook, rewritten in place after every cell (its space is reserved
  first, so a notebook that fills its disk does not stop it), so that whatever kills the run, the cells
  before it are recorded: each executed cell's index and status (``ok``; ``error`` with the exception name
  and message), and ``"kernel"``: ``running`` until the last cell is done, then ``finished``.

A submission that kills this process (``os._exit``, a segfault) leaves the record at ``running``.
"""

import argparse
import json
import os
import sys


RECORD_RESERVE = 256 * 1024  # bytes of disk set aside for the record before any cell runs


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
    except OSError:  # the notebook may have closed the pipe; only its own run suffers
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebook")
    args = parser.parse_args()
    with open(args.notebook, encoding="utf-8") as f:
        sources = [c["source"] for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    sources = ["".join(s) if isinstance(s, list) else s for s in sources]

    # As in a kernel started for this notebook: files it writes (%%writefile helper.py) are importable.
    folder = os.path.dirname(os.path.abspath(args.notebook))
    os.chdir(folder)
    sys.path.insert(0, folder)
    record = open_record(os.path.join(folder, ".grader-run.json"))
    beat_fd = int(os.environ["GRADER_HEARTBEAT_FD"]) if "GRADER_HEARTBEAT_FD" in os.environ else None

    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    cells = []
    write_record(record, cells, "running")
    for index, source in enumerate(sources):
        heartbeat(beat_fd, f"cell {index}")
        result = shell.run_cell(source, store_history=True)
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            cells.append({"index": index, "status": "ok"})
        else:
            cells.append({"index": index, "status": "error", "ename": type(error).__name__[:200],
                          "evalue": str(error)[:1000]})
        write_record(record, cells, "running")
    write_record(record, cells, "finished")
    for stream in (sys.stdout, sys.stderr):  # os._exit below would drop what they still buffer
        try:
            stream.flush()
        except Exception:  # the notebook may have replaced or closed them
            pass
    heartbeat(beat_fd, "done")
    os._exit(0)  # skip interpreter teardown: nothing a submission registered (atexit, threads) runs after this


if __name__ == "__main__":
    main()
