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

Modules
-------
``limits`` (`Limits`, `SandboxResult`, the errors, shared constants); ``removal`` (the tree remover);
``cgroups`` (per-run cgroups); ``slots`` (slot uids); ``monitor`` (watchdog, heartbeat, output capture);
``folders`` (work folders, leftovers, result files); ``bwrap_command`` (what the sandbox sees); ``run``
(`run_sandboxed`). Each imports only from those before it.

Example::

    with work_folder(Limits(wall_seconds=120)) as folder:
        (folder / "alice").mkdir()
        result = run_sandboxed([sys.executable, "/grader/run_notebook.py"], folder / "alice",
                               Limits(wall_seconds=120, idle_seconds=30),
                               ro_binds={Path("run_notebook.py"): "/grader/run_notebook.py"})
        results = read_result_file(folder / "alice", "results.json")
"""

# The public API and the constants callers use, re-exported; private helpers stay in their modules.
from autograder.sandbox.folders import (STALE_CGROUP_SECONDS, STALE_FOLDER_SECONDS, read_result_file,
                                        sweep_leftovers, work_folder)
from autograder.sandbox.limits import (MAX_SLOTS, MB, SANDBOX_DIR, SANDBOX_UID, SLOT_DIR, SLOT_UID_BASE, Limits,
                                       SandboxError, SandboxResult, SandboxUnavailable)
from autograder.sandbox.run import bubblewrap_available, run_sandboxed

__all__ = [
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "SandboxError",
    "bubblewrap_available",
    "run_sandboxed",
    "read_result_file",
    "work_folder",
    "sweep_leftovers",
    "STALE_FOLDER_SECONDS",
    "STALE_CGROUP_SECONDS",
    "SANDBOX_DIR",
    "SANDBOX_UID",
    "SLOT_UID_BASE",
    "SLOT_DIR",
    "MAX_SLOTS",
    "MB",
]
