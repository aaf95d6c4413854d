"""Tests of autograder/sandbox/: each hostile behaviour a submission may show, run as a small Python
program in the sandbox, and the outcome the grader relies on. Folders come from tmp_path.

Some tests need a capability of the machine (root, a cgroup controller) and skip with the reason
otherwise; none asserts how long something took (timing targets are in benchmarks/)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import uuid
from pathlib import Path

import pytest

from autograder import sandbox
from autograder.runner import MAX_CRASHES
from autograder.sandbox import Limits, SandboxUnavailable, bubblewrap_available, read_result_file, run_sandboxed

PYTHON = sys.executable
FAST = Limits(wall_seconds=20, cpu_seconds=20, memory_mb=512, max_processes=32, max_file_mb=8)
ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "autograder" / "runner.py"

needs_bwrap = pytest.mark.skipif(not bubblewrap_available(),
                                 reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a grader running as root (mounts, slot uids)")


def cgroup_mechanism(controller: str) -> str | None:
    """How this machine would enforce `controller` for a run ("cgroup v1", "cgroup v2"), or None."""
    cgroups = sandbox.cgroups._RunCgroups.create(Limits())
    try:
        return cgroups.mechanism(controller)
    finally:
        cgroups.remove()


def needs_cgroup(controller: str):
    return pytest.mark.skipif(cgroup_mechanism(controller) is None,
                              reason=f"the grader cannot create a {controller} cgroup (v1 or v2) on this machine")


def run_python(code: str, workdir: Path, limits: Limits = FAST, **kwargs) -> sandbox.SandboxResult:
    return run_sandboxed([PYTHON, "-c", textwrap.dedent(code)], workdir, limits, **kwargs)


def processes_mentioning(token: str) -> list[int]:
    """Pids of live processes whose command line contains `token` (the sandboxed code embeds it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if token.encode() in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.fixture
def created_cgroups(monkeypatch) -> list[Path]:
    """The cgroup directories this test's runs create (other graders may be running concurrently)."""
    created: list[Path] = []

    create = sandbox.cgroups._RunCgroups.create

    def recording_create(limits):
        cgroups = create(limits)
        created.extend(set(cgroups.dirs.values()))
        return cgroups

    monkeypatch.setattr(sandbox.cgroups._RunCgroups, "create", recording_create)
    return created


@pytest.fixture
def without_cgroups(monkeypatch):
    """Force the fallback of a machine where the grader may not create cgroups (in this process only; see
    test_fallback_without_cgroups_contains_bombs_beside_an_honest_run for the real thing)."""
    monkeypatch.setattr(sandbox.cgroups._RunCgroups, "create", lambda limits: sandbox.cgroups._RunCgroups({}))


# ------------------------------------------------------------------------------------------------
# Without bubblewrap
# ------------------------------------------------------------------------------------------------


def test_missing_bubblewrap_raises_with_actionable_message(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.run, "_find_bwrap", lambda: None)
    assert not bubblewrap_available()
    with pytest.raises(SandboxUnavailable) as error:
        run_sandboxed([PYTHON, "-c", "pass"], tmp_path)
    assert "apt-get install bubblewrap" in str(error.value)
    assert "--unsafe-no-sandbox" in str(error.value)


def test_unsafe_mode_runs_directly_with_limits_and_wall_clock(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.run, "_find_bwrap", lambda: None)  # works without bubblewrap
    script = tmp_path / "script.py"
    script.write_text("import os, resource, sys\n"
                      "print(os.getcwd(), os.environ['HOME'], resource.getrlimit(resource.RLIMIT_FSIZE)[0])\n")
    work = tmp_path / "work"
    work.mkdir()
    result = run_sandboxed([PYTHON, "/grader/script.py"], work, FAST, unsafe_no_sandbox=True,
                           ro_binds={script: "/grader/script.py"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(work), str(work), str(8 * 1024 * 1024)]
    assert result.isolation["uid"] == "the grader's own (no sandbox)"

    result = run_sandboxed([PYTHON, "-c", "while True: pass"], work, Limits(wall_seconds=1),
                           unsafe_no_sandbox=True)
    assert result.killed_by == "wall-clock" and result.timed_out and result.returncode is None


# ------------------------------------------------------------------------------------------------
# Unit tests of the helpers
# ------------------------------------------------------------------------------------------------


def test_bounded_capture_keeps_head_and_tail():
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as pipe:
        capture = sandbox.monitor._BoundedCapture(pipe, "stdout", limit=10)
        capture.start()
        for piece in (b"0123", b"456789ab", b"cdef"):
            os.write(write_end, piece)
        os.close(write_end)
        capture.join(5)
    assert capture.head == b"01234" and capture.kept_tail() == b"bcdef"
    assert "6 bytes of stdout dropped" in capture.text()
    assert capture.text().startswith("01234") and capture.text().endswith("bcdef")


def test_decode_status():
    assert sandbox.run._decode_status(0, sandboxed=True) == (0, None)
    assert sandbox.run._decode_status(139, sandboxed=True) == (-11, 11)  # bwrap: 128 + SIGSEGV
    assert sandbox.run._decode_status(-11, sandboxed=False) == (-11, 11)  # Popen convention
    assert sandbox.run._decode_status(139, sandboxed=False) == (139, None)


def test_result_statuses_come_from_the_parents_observations():
    def result(killed_by=None, oom_killed=False):
        return sandbox.SandboxResult(returncode=None, signal=None, killed_by=killed_by, oom_killed=oom_killed,
                                     stdout="", stderr="MemoryError", wall_seconds=1.0, cpu_seconds=None)

    assert not result().memory_exceeded and not result().timed_out  # stderr text is never believed
    assert result(oom_killed=True).memory_exceeded and result(killed_by="memory").memory_exceeded
    assert all(result(killed_by=k).timed_out for k in ("wall-clock", "idle", "cpu-time"))
    assert not result(killed_by="memory").timed_out


def test_read_result_file_refuses_symlinks_and_big_files(tmp_path):
    secret = tmp_path / "solutions.txt"
    secret.write_text("reference answer")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "result.json").write_text("{}")
    (work / "link.json").symlink_to(secret)
    (work / "linkdir").symlink_to(tmp_path)
    (work / "big.json").write_bytes(b"x" * 100)
    assert read_result_file(work, "result.json") == b"{}"
    assert read_result_file(work, "link.json") is None
    assert read_result_file(work, "linkdir/solutions.txt") is None
    assert read_result_file(work, "missing.json") is None
    assert read_result_file(work, "sub") is None
    assert read_result_file(work, "big.json", max_bytes=99) is None
    with pytest.raises(ValueError):
        read_result_file(work, "../solutions.txt")


HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_locate_cgroups_of_a_hybrid_host():
    v1, v2 = sandbox.cgroups._locate_cgroups(HYBRID_MOUNTINFO, "9:name=systemd:/\n8:pids:/grader\n4:memory:/a/b\n"
                                                       "2:cpu,cpuacct:/\n0::/user.slice\n")
    assert v1 == {"memory": Path("/sys/fs/cgroup/memory/a/b"), "pids": Path("/sys/fs/cgroup/pids/grader"),
                  "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"), "cpuacct": Path("/sys/fs/cgroup/cpu,cpuacct")}
    assert v2 == Path("/sys/fs/cgroup/unified/user.slice")


def test_locate_cgroups_v2_in_a_container_and_after_moving_into_the_leaf():
    # A container sees its own sub-tree mounted at /sys/fs/cgroup (mountinfo root "/docker/c1"), and a
    # path with a space, which mountinfo escapes.
    mountinfo = "50 40 0:30 /docker/c1 /sys/fs/my\\040cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert sandbox.cgroups._locate_cgroups(mountinfo, "0::/docker/c1\n") == ({}, Path("/sys/fs/my cgroup"))
    assert sandbox.cgroups._locate_cgroups(mountinfo, "0::/docker/c1/svc\n") == ({}, Path("/sys/fs/my cgroup/svc"))
    # An earlier run moved the grader into the leaf: runs still go into the leaf's parent.
    in_leaf = f"0::/docker/c1/{sandbox.cgroups._V2_LEAF}\n"
    assert sandbox.cgroups._locate_cgroups(mountinfo, in_leaf) == ({}, Path("/sys/fs/my cgroup"))
    # A cgroup outside the mounted sub-tree cannot be reached.
    assert sandbox.cgroups._locate_cgroups(mountinfo, "0::/other\n") == ({}, None)
    assert sandbox.cgroups._locate_cgroups("", "") == ({}, None)


def test_cgroup_counters_v1_and_v2_from_files(tmp_path):
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (v1 / "cpuacct.usage").write_text("1500000000\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")

    first = sandbox.cgroups._RunCgroups({"memory": v1, "cpuacct": v1})
    assert not first.oom_killed() and first.cpu_seconds() == 1.5
    assert first.mechanism("memory") == "cgroup v1" and first.mechanism("pids") is None
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert first.oom_killed()

    second = sandbox.cgroups._RunCgroups({"memory": v2, "pids": v2, "cpu": v2, "cpuacct": v2}, v2=v2)
    assert second.oom_killed() and second.cpu_seconds() == 2.5
    assert second.mechanism("cpu") == "cgroup v2" and second.procs_files() == [str(v2 / "cgroup.procs")]
    assert sandbox.cgroups._RunCgroups({}).cpu_seconds() is None and not sandbox.cgroups._RunCgroups({}).oom_killed()


def test_cgroup_v2_delegation_against_an_imitated_kernel(tmp_path, monkeypatch):
    """The cgroup v2 path on plain files that behave like the kernel's: enabling a controller for the
    children of a cgroup that holds processes fails with EBUSY, and writing a pid into cgroup.procs
    moves the process out of its old cgroup."""
    mount = tmp_path / "cgroup2"
    grader = mount / "grader.service"
    grader.mkdir(parents=True)
    (grader / "cgroup.controllers").write_text("cpuset io memory pids\n")  # no cpu handed down
    (grader / "cgroup.subtree_control").write_text("")
    (grader / "cgroup.procs").write_text("100\n101\n")
    own = {"path": "/grader.service"}
    files = {"/proc/self/mountinfo": f"50 40 0:30 / {mount} rw - cgroup2 cgroup2 rw\n",
             "/proc/self/cgroup": lambda: f"0::{own['path']}\n"}
    read_text, write_text = sandbox.cgroups._read_text, Path.write_text

    def kernel_read(path):
        text = files.get(str(path))
        return read_text(path) if text is None else text() if callable(text) else text

    def kernel_write(path, text, *args, **kwargs):
        if path.name == "cgroup.subtree_control":
            if read_text(path.with_name("cgroup.procs")).split():
                raise OSError(errno.EBUSY, "processes in the cgroup")
            if text[1:] not in read_text(path.with_name("cgroup.controllers")).split():
                raise OSError(errno.ENOENT, "controller not available")
            return write_text(path, f"{read_text(path)} {text[1:]}")
        if path.name == "cgroup.procs":
            for procs in mount.rglob("cgroup.procs"):
                write_text(procs, "".join(f"{pid}\n" for pid in procs.read_text().split() if pid != text))
            return write_text(path, f"{read_text(path)}{text}\n")
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(sandbox.cgroups, "_read_text", kernel_read)
    monkeypatch.setattr(Path, "write_text", kernel_write)
    limits = Limits(memory_mb=256, max_processes=10, cpus=0.5)

    first = sandbox.cgroups._RunCgroups.create(limits)
    leaf = grader / sandbox.cgroups._V2_LEAF
    assert (grader / "cgroup.procs").read_text() == "" and leaf.joinpath("cgroup.procs").read_text().split() == ["100", "101"]
    assert set((grader / "cgroup.subtree_control").read_text().split()) == {"memory", "pids"}
    assert first.v2.parent == grader and first.procs_files() == [str(first.v2 / "cgroup.procs")]
    assert (first.v2 / "memory.max").read_text() == str(256 * 2**20) and (first.v2 / "pids.max").read_text() == "10"
    assert {c: first.mechanism(c) for c in ("memory", "pids", "cpu", "cpuacct")} == {
        "memory": "cgroup v2", "pids": "cgroup v2", "cpu": None, "cpuacct": "cgroup v2"}  # usage: cpu.stat

    own["path"] = f"/grader.service/{sandbox.cgroups._V2_LEAF}"  # later runs start from inside the leaf
    second = sandbox.cgroups._RunCgroups.create(limits)
    assert second.v2.parent == grader and second.v2 != first.v2 and not (leaf / sandbox.cgroups._V2_LEAF).exists()


def test_heartbeat_keeps_the_last_complete_line():
    read_end, write_end = os.pipe()
    heartbeat = sandbox.monitor._Heartbeat(read_end, now=0.0)
    try:
        heartbeat.poll()
        assert heartbeat.last_line is None and heartbeat.last_time == 0.0
        os.write(write_end, b"cell 0\ncell 1\ncel")
        heartbeat.poll()
        assert heartbeat.last_line == "cell 1" and heartbeat.last_time > 0
        before = heartbeat.last_time
        for _ in range(3):  # no newline: no heartbeat, and nothing piles up
            os.write(write_end, b"x" * 50_000)
            heartbeat.poll()
        assert heartbeat.last_time == before and len(heartbeat.partial) <= heartbeat.MAX_LINE
        os.write(write_end, b"\n" + b"y" * 500 + b"\n")
        heartbeat.poll()
        assert heartbeat.last_line == "y" * heartbeat.MAX_LINE
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.fixture
def scratch(tmp_path):
    """tmp_path for the deep trees below, which pytest's own cleanup cannot remove: whatever a failing test
    leaves there goes with rm -rf."""
    yield tmp_path
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


def make_nasty_tree(root: Path, outside: Path, depth: int = 3000) -> None:
    """Everything a submission can leave behind that shutil.rmtree or a naive walk trips over."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):  # far deeper than PATH_MAX (4096 bytes) and the recursion limit
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.open("deep.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
    os.close(fd)
    for mode in (0o000, 0o200, 0o100):
        locked = root / f"locked{mode:o}"
        (locked / "inner").mkdir(parents=True)
        (locked / "inner" / "file").write_text("x")
        (locked / "inner").chmod(mode)
        locked.chmod(mode)
    (root / "to-outside").symlink_to(outside)  # must be removed, never followed
    (root / "loop").symlink_to(root / "loop")
    os.mkfifo(root / "fifo")  # opening it would block
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "s"))
    if os.geteuid() == 0:
        (root / "foreign").write_text("owned by someone else")
        os.chown(root / "foreign", 12345, 12345)


# ------------------------------------------------------------------------------------------------
# Work folders and the remover
# ------------------------------------------------------------------------------------------------


def test_remove_tree_removes_any_tree_and_follows_no_link(scratch):
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the submission's")
    tree = scratch / "tree"
    tree.mkdir()
    make_nasty_tree(tree, outside)
    sandbox.removal._remove_tree(tree)
    assert not tree.exists() and os.listdir(scratch) == ["outside"]
    assert (outside / "keep.txt").read_text() == "not the submission's"


def test_work_folder_is_removed_even_when_the_block_raises(scratch):
    with pytest.raises(RuntimeError, match="grading failed"):
        with sandbox.work_folder(FAST, parent=scratch) as folder:
            assert folder.parent == scratch and folder.name.startswith("llmarch-grade-")
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            make_nasty_tree(folder, scratch, depth=500)
            raise RuntimeError("grading failed")
    assert os.listdir(scratch) == []
    assert str(folder) not in Path("/proc/self/mountinfo").read_text()


def nasty_tree_code(base: str) -> str:
    """Code for the sandbox that leaves, in `base`, what make_nasty_tree leaves (as the sandbox's user)."""
    return textwrap.dedent(f"""
        import os, socket
        os.makedirs("{base}/deep", exist_ok=True)
        os.chdir("{base}/deep")
        for _ in range(3000):
            os.mkdir("d")
            os.chdir("d")
        open("bottom.txt", "w").write("x")
        os.chdir("{base}")
        for name, mode in (("locked", 0o000), ("writeonly", 0o200)):
            os.makedirs(name + "/inner")
            open(name + "/inner/f", "w").write("x")
            os.chmod(name + "/inner", mode)
            os.chmod(name, mode)
        os.symlink("/usr", "usr-link")
        os.symlink("/grader/keep", "grader-link")
        os.mkfifo("fifo")
        socket.socket(socket.AF_UNIX).bind("{base}/sock")
        os.chdir("/submission")
        print("built")
    """)


@needs_bwrap
def test_a_tree_built_by_the_sandbox_is_removed(scratch):
    keep = scratch / "keep"
    keep.write_text("grader's file")
    keep.chmod(0o644)
    work = scratch / "plain"
    work.mkdir()
    result = run_python(nasty_tree_code("/submission"), work, ro_binds={keep: "/grader/keep"})
    assert result.stdout == "built\n", result.stderr[-2000:]
    sandbox.removal._remove_tree(work)
    assert not work.exists() and keep.read_text() == "grader's file"

    parent = scratch / "folders"
    parent.mkdir()
    with sandbox.work_folder(FAST, parent=parent) as folder:
        (folder / "submission").mkdir()
        result = run_python(nasty_tree_code("/submission"), folder / "submission", ro_binds={keep: "/grader/keep"})
        assert result.stdout == "built\n", result.stderr[-2000:]
    assert os.listdir(parent) == [] and keep.read_text() == "grader's file"


@needs_bwrap
def test_remove_tree_as_an_ordinary_user(scratch):
    """Without root's permission override the remover must open up mode 000 directories itself. Inside
    the sandbox the code runs as an ordinary user, so the remover runs there, from a copy of removal.py."""
    keep = scratch / "keep"
    keep.write_text("grader's file")
    keep.chmod(0o644)
    work = scratch / "work"
    work.mkdir()
    result = run_python(nasty_tree_code("/submission/tree") + textwrap.dedent("""
        import sys
        from pathlib import Path
        sys.path.insert(0, "/grader")
        import remover
        assert os.geteuid() != 0
        remover._remove_tree(Path("/submission/tree"))
        print(os.listdir("/submission"))
    """), work, ro_binds={keep: "/grader/keep", Path(sandbox.removal.__file__): "/grader/remover.py"})
    assert result.stdout == "built\n[]\n", result.stderr[-2000:]
    assert keep.read_text() == "grader's file"


@needs_root
@needs_bwrap
def test_a_full_disk_fails_only_its_own_submission(tmp_path):
    limits = Limits(wall_seconds=20, memory_mb=512, max_file_mb=64, disk_mb=8)
    filler = """
        import errno, itertools
        try:
            for i in itertools.count():
                with open(f"fill{i}.bin", "wb") as f:
                    f.write(b"x" * 2**20)
        except OSError as e:
            print("disk full", errno.errorcode[e.errno], "after", i, "MB")
    """
    honest = """
        import time
        time.sleep(1)  # while the filler's disk is full
        open("answer.bin", "wb").write(b"y" * 3 * 2**20)
        print(len(open("answer.bin", "rb").read()))
    """
    results = {}

    def grade(name: str, code: str) -> None:
        with sandbox.work_folder(limits, parent=tmp_path) as folder:
            (folder / "submission").mkdir()
            results[name] = run_python(code, folder / "submission", limits)

    threads = [threading.Thread(target=grade, args=args) for args in (("filler", filler), ("honest", honest))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert "disk full ENOSPC after" in results["filler"].stdout, results["filler"]
    assert int(results["filler"].stdout.split()[-2]) <= 8  # the folder's own 8 MB, not the host's disk
    assert results["honest"].returncode == 0 and results["honest"].stdout == f"{3 * 2**20}\n", results["honest"]
    assert results["honest"].isolation["disk"] == "tmpfs 8 MB"
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------
# Hostile submissions
# ------------------------------------------------------------------------------------------------


@needs_bwrap
def test_clean_environment_identity_and_cwd(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADER_SECRET", "hunter2")
    result = run_python("""
        import os, json, pwd
        print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "uid": os.getuid(),
                          "home": pwd.getpwuid(os.getuid()).pw_dir}))
    """, tmp_path, env={"EXTRA": "1"})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert "GRADER_SECRET" not in seen["env"] and seen["env"]["EXTRA"] == "1"
    assert "GRADER_HEARTBEAT_FD" not in seen["env"]  # only with Limits.idle_seconds
    assert seen["env"]["HOME"] == "/submission" and seen["cwd"] == "/submission" and seen["home"] == "/submission"
    assert seen["env"]["MPLBACKEND"] == "Agg" and seen["env"]["OMP_NUM_THREADS"] == "1"
    if os.geteuid() == 0:
        assert sandbox.SLOT_UID_BASE <= seen["uid"] < sandbox.SLOT_UID_BASE + sandbox.MAX_SLOTS
        assert tmp_path.stat().st_uid == seen["uid"]
    else:
        assert seen["uid"] == sandbox.SANDBOX_UID
    assert result.isolation["uid"].startswith(str(seen["uid"]))
    assert set(result.isolation) == {"memory", "pids", "cpu", "disk", "uid"}


@needs_bwrap
def test_infinite_loop_ignoring_signals_is_killed_with_all_descendants(tmp_path):
    token = uuid.uuid4().hex
    result = run_python(f"""
        import os, signal, time
        token = "{token}"
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if os.fork() == 0:          # double fork into a new session: a daemon ignoring signals
            os.setsid()
            if os.fork() == 0:
                while True: pass
            os._exit(0)
        print("looping", flush=True)
        while True:
            try:
                pass
            except KeyboardInterrupt:
                pass
    """, tmp_path, Limits(wall_seconds=1.5))
    assert result.killed_by == "wall-clock" and result.timed_out and result.returncode is None
    assert "looping" in result.stdout
    assert result.wall_seconds >= 1.5  # not killed early
    assert processes_mentioning(token) == []


@pytest.mark.parametrize("bomb", [
    "x = []\nwhile True: x.append(bytearray(16 * 2**20))",                 # growing list, touched memory
    "import numpy as np\nx = np.ones(64 * 2**20)",                          # 512 MiB > the 256 MiB limit
    "import torch\nx = torch.ones(128 * 2**20)",                            # 512 MiB tensor
], ids=["growing-list", "numpy-over-limit", "torch-over-limit"])
@needs_bwrap
def test_memory_bomb_is_stopped_and_reported(tmp_path, bomb):
    result = run_python(bomb, tmp_path, Limits(wall_seconds=30, memory_mb=256, max_processes=32))
    assert not result.timed_out
    assert result.memory_exceeded, (result, result.stderr[-2000:])
    if result.isolation["memory"].startswith("cgroup"):
        assert result.oom_killed and result.signal == signal.SIGKILL
    else:
        assert result.killed_by == "memory"
    # The grader is fine and the next sandbox starts normally.
    assert run_python("print('ok')", tmp_path).stdout == "ok\n"


@needs_bwrap
def test_memory_error_text_is_not_believed(tmp_path):
    """Only the kernel's OOM counter or the parent's watchdog make memory_exceeded; a student can print
    anything, and an allocation the kernel refuses outright is the notebook's own error."""
    result = run_python("""
        import sys
        print("MemoryError: Cannot allocate memory std::bad_alloc", file=sys.stderr, flush=True)
        import numpy as np
        np.ones(10**13)  # 80 TB: refused at once, raises MemoryError
    """, tmp_path, Limits(wall_seconds=30, memory_mb=256))
    assert result.returncode == 1 and "MemoryError" in result.stderr
    assert not result.memory_exceeded and not result.oom_killed and result.killed_by is None


@pytest.mark.parametrize("bomb", [
    """
    import os
    while True:
        try:
            os.fork()
        except OSError:
            print("fork refused", flush=True)
    """,
    """
    import subprocess, sys, time
    children = []
    while True:
        try:
            children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        except OSError:
            print("spawn refused", flush=True)
            time.sleep(0.01)
    """,
], ids=["os-fork", "subprocess"])
@needs_bwrap
def test_fork_bomb_is_contained(tmp_path, bomb):
    token = uuid.uuid4().hex
    result = run_python(f"token = '{token}'\n" + textwrap.dedent(bomb), tmp_path,
                        Limits(wall_seconds=3, max_processes=24))
    assert result.killed_by == "wall-clock"
    assert "refused" in result.stdout  # the process limit, not the clock, stopped the growth
    assert processes_mentioning(token) == []
    assert subprocess.run(["true"]).returncode == 0  # the machine can still start processes


@needs_bwrap
def test_segfault_is_reported_as_sigsegv(tmp_path):
    result = run_python("import ctypes\nctypes.string_at(0)", tmp_path)
    assert result.signal == signal.SIGSEGV and result.returncode == -signal.SIGSEGV
    assert not result.timed_out and not result.memory_exceeded and result.killed_by is None


@needs_bwrap
def test_os_exit_code_is_passed_through(tmp_path):
    result = run_python("import os\nprint('bye', flush=True)\nos._exit(3)", tmp_path)
    assert result.returncode == 3 and result.signal is None and result.stdout == "bye\n"


@needs_bwrap
def test_cpu_time_limit_of_one_process(tmp_path):
    result = run_python("while True: pass", tmp_path, Limits(wall_seconds=20, cpu_seconds=1))
    assert result.killed_by != "wall-clock"
    # RLIMIT_CPU (SIGXCPU, then SIGKILL) or the cgroup's total, whichever notices first
    assert result.signal in (signal.SIGXCPU, signal.SIGKILL) or result.killed_by == "cpu-time", result


SPINNERS = """
    import os, time
    for _ in range(2):
        if os.fork() == 0:
            while True: pass
    time.sleep(600)
"""


@needs_cgroup("cpuacct")
@needs_bwrap
def test_cpu_time_of_all_processes_together_is_bounded(tmp_path):
    """Two processes at 1 s of CPU each stay under RLIMIT_CPU=2; the run's total is what counts."""
    result = run_python(SPINNERS, tmp_path, Limits(wall_seconds=20, cpu_seconds=2, cpus=2))
    assert result.killed_by == "cpu-time" and result.timed_out and result.returncode is None
    assert result.cpu_seconds >= 2


@needs_cgroup("cpu")
@needs_bwrap
def test_cpu_quota_bounds_the_whole_run(tmp_path):
    """Two spinning processes with half a core: the run gets half a core of CPU time, not two cores."""
    result = run_python(SPINNERS, tmp_path, Limits(wall_seconds=2, cpus=0.5))
    assert result.killed_by == "wall-clock"
    assert result.isolation["cpu"].endswith("cpu quota (0.5 CPU)")
    assert 0.2 < result.cpu_seconds <= 0.5 * result.wall_seconds * 1.25 + 0.2, result.cpu_seconds


HEARTBEAT_THEN = """
    import os, sys, time
    fd = int(os.environ["GRADER_HEARTBEAT_FD"])
    os.write(fd, b"cell 0\\n")
    print("started", flush=True)
    {then}
"""


@needs_bwrap
def test_no_heartbeat_for_idle_seconds_kills_the_run(tmp_path):
    result = run_python(HEARTBEAT_THEN.format(then="time.sleep(600)"), tmp_path,
                        Limits(wall_seconds=30, idle_seconds=1))
    assert result.killed_by == "idle" and result.timed_out and result.returncode is None
    assert result.last_heartbeat == "cell 0" and result.stdout == "started\n"
    assert result.wall_seconds >= 1  # not killed early


@needs_bwrap
def test_heartbeats_only_postpone_the_kill_up_to_the_wall_clock(tmp_path):
    result = run_python(HEARTBEAT_THEN.format(then="""
    while True:
        os.write(fd, b"cell 0\\n")
        time.sleep(0.05)"""), tmp_path, Limits(wall_seconds=2, idle_seconds=0.5))
    assert result.killed_by == "wall-clock" and result.last_heartbeat == "cell 0"


def write_notebook(path: Path, sources: list[str]) -> None:
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None}
             for s in sources]
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": "# title", "metadata": {}}] + cells,
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def run_runner(work: Path, sources: list[str], limits: Limits) -> tuple[sandbox.SandboxResult, dict]:
    write_notebook(work / "nb.ipynb", sources)
    result = run_sandboxed([PYTHON, "/grader/runner.py", "/submission/nb.ipynb"], work, limits,
                           ro_binds={RUNNER: "/grader/runner.py"})
    return result, json.loads(read_result_file(work, ".grader-run.json"))


@needs_bwrap
def test_runner_runs_cells_like_a_kernel_and_records_every_cell(tmp_path):
    result, record = run_runner(tmp_path, [
        'import sys\nsys.path.insert(0, "/grader")',  # what the prepared notebook's first cell does
        "%%writefile helper.py\ndef answer():\n    return 42\n",
        "import os, sys, helper\nprint(helper.answer(), os.getcwd(), sys.path[:2])",
        "raise ValueError('wrong')",
        "print('after the error')",
    ], Limits(wall_seconds=60, idle_seconds=30))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "42 /submission ['/grader', '/submission']" in result.stdout and "after the error" in result.stdout
    assert record == {"cells": [{"index": 0, "status": "ok"}, {"index": 1, "status": "ok"},
                                {"index": 2, "status": "ok"},
                                {"index": 3, "status": "error", "ename": "ValueError", "evalue": "wrong"},
                                {"index": 4, "status": "ok"}], "kernel": "finished"}
    assert result.last_heartbeat == "done" and result.killed_by is None


@needs_bwrap
def test_runner_cell_timeout_is_enforced_by_the_parent(tmp_path):
    result, record = run_runner(tmp_path, [
        "print('first')",
        # ignores signals and never returns: only the parent can stop it
        "import signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass",
        "print('never')",
    ], Limits(wall_seconds=60, idle_seconds=2))
    assert result.killed_by == "idle" and result.last_heartbeat == "cell 1"
    assert record == {"cells": [{"index": 0, "status": "ok"}], "kernel": "running"}
    assert "never" not in result.stdout


SEGFAULT = "import ctypes\nctypes.string_at(0)"


@needs_bwrap
def test_runner_goes_on_after_a_crash_in_a_fresh_kernel(tmp_path):
    """A crashed cell is recorded and lost; the code cells before it run again in a fresh kernel (each time),
    and the run goes on from the next cell to the end."""
    result, record = run_runner(tmp_path, [
        "x = 1\nopen('runs', 'a').write('x')",
        "y = 2\n" + SEGFAULT,
        "print('x is', x, 'y' in globals())",
        "import os\nos._exit(3)",
        "print('end', x)",
    ], Limits(wall_seconds=60, idle_seconds=30))
    assert result.returncode == 0 and result.last_heartbeat == "done", result.stderr[-3000:]
    assert record == {"cells": [{"index": 0, "status": "ok"},
                                {"index": 1, "status": "crashed", "ename": "signal SIGSEGV", "evalue": ""},
                                {"index": 2, "status": "ok"},
                                {"index": 3, "status": "crashed", "ename": "exit code 3", "evalue": ""},
                                {"index": 4, "status": "ok"}], "kernel": "finished"}
    assert "x is 1 False" in result.stdout and "end 1" in result.stdout
    assert (tmp_path / "runs").read_text() == "xxx"  # once, then once after each crash


@needs_bwrap
@pytest.mark.parametrize("cells, signal_number", [
    ([SEGFAULT] * (MAX_CRASHES + 1), signal.SIGSEGV),
    (["import os\nos.kill(os.getpid(), 9)"], signal.SIGKILL),  # the out-of-memory killer's signal: at once
])
def test_runner_ends_the_run_after_too_many_crashes_or_a_limit_signal(cells, signal_number, tmp_path):
    result, record = run_runner(tmp_path, cells + ["print('never')"], Limits(wall_seconds=60, idle_seconds=30))
    assert result.signal == signal_number and result.last_heartbeat != "done", result.stderr[-3000:]
    assert "never" not in result.stdout
    assert [c["status"] for c in record["cells"]] == ["crashed"] * len(cells)
    assert record["kernel"] == "running"


@needs_bwrap
def test_runner_refuses_an_answer_to_a_cell_the_kernel_has_not_read(tmp_path):
    """A thread of the notebook writes well-formed answers to the reply pipe (its number is in the kernel's
    argv) without reading the supervisor's messages: the answer that comes while the next cell is still unread
    is refused, so no cell is recorded as run that did not run."""
    forge = ("import sys, threading, time\nsys.path.insert(0, '/grader')\nimport runner\n"
             "reply_fd = int(sys.argv[sys.argv.index('--kernel') + 2])\n"
             "def forge():\n    while True:\n        time.sleep(0.5)\n        runner.send(reply_fd, {'status': 'ok'})\n"
             "threading.Thread(target=forge, daemon=True).start()")
    result, record = run_runner(tmp_path, [forge, "import time\ntime.sleep(4)", "print('cell 2 ran')",
                                           "print('cell 3 ran')"], Limits(wall_seconds=60, idle_seconds=30))
    statuses = {cell["index"]: cell for cell in record["cells"]}
    for index in (2, 3):
        assert statuses[index]["status"] != "ok" or f"cell {index} ran" in result.stdout, (record, result.stdout)
    refused = [c for c in record["cells"] if c.get("ename") == "an answer came before the cell was read"]
    assert refused and all(c["status"] == "crashed" for c in refused), record


@needs_root
@needs_bwrap
def test_runner_records_every_cell_when_the_notebook_fills_its_disk(tmp_path):
    limits = Limits(wall_seconds=60, idle_seconds=30, max_file_mb=64, disk_mb=8)
    with sandbox.work_folder(limits, parent=tmp_path) as folder:
        (folder / "submission").mkdir()
        result, record = run_runner(folder / "submission", [
            "import itertools\ntry:\n    for i in itertools.count():\n"
            "        open(f'fill{i}', 'wb').write(b'x' * 2**20)\nexcept OSError as e:\n    print('full:', e)",
            "print('after')",
        ], limits)
    assert "No space left on device" in result.stdout and "after" in result.stdout, result.stderr[-2000:]
    assert record == {"cells": [{"index": 0, "status": "ok"}, {"index": 1, "status": "ok"}], "kernel": "finished"}


@needs_bwrap
def test_huge_output_is_truncated_without_buffering(tmp_path):
    limit = 100_000
    tracemalloc.start()
    try:
        result = run_python("""
            import sys
            block = b"x" * 2**20
            for _ in range(200):          # 200 MiB on stdout
                sys.stdout.buffer.write(block)
            sys.stderr.write("e" * 5_000_000 + "END")
        """, tmp_path, Limits(wall_seconds=30, max_captured_output=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.returncode == 0 and not result.timed_out
    assert len(result.stdout) < limit + 200 and "bytes of stdout dropped" in result.stdout
    assert result.stderr.endswith("END") and len(result.stderr) < limit + 200
    assert peak < 20 * 2**20  # the parent never held more than a few chunks


@needs_bwrap
def test_repository_and_other_folders_are_invisible(tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "marker.txt").write_text("secret")
    other_student = tmp_path / "bob"
    other_student.mkdir()
    (other_student / "notebook.ipynb").write_text("{}")
    work = tmp_path / "alice"
    work.mkdir()
    repo = ROOT
    paths = [solutions / "marker.txt", other_student, tmp_path, repo / "lib", repo / "solutions",
             repo / "autograder", repo / "tests", repo / "exercises", Path("/root/.ssh"), sandbox.SLOT_DIR]
    result = run_python(f"""
        import os
        for p in {[str(p) for p in paths]!r}:
            print(p, os.path.exists(p))
        print("ls repo", sorted(os.listdir({str(repo)!r})) if os.path.exists({str(repo)!r}) else [])
    """, work)
    assert result.returncode == 0, result.stderr
    for path in paths:
        assert f"{path} False" in result.stdout
    # at most the virtual environment (bound read-only when it lives inside the repository) is visible
    assert "ls repo ['.venv']" in result.stdout or "ls repo []" in result.stdout, result.stdout


@needs_bwrap
def test_llmarch_and_autograder_are_not_importable(tmp_path):
    result = run_python("""
        for name in ("llmarch", "autograder"):
            try:
                __import__(name)
                print(name, "IMPORTED")
            except ModuleNotFoundError:
                print(name, "missing")
        import numpy
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["llmarch", "missing", "autograder", "missing"]


@needs_bwrap
def test_refuses_to_mount_a_copy_of_the_reference(tmp_path):
    """A non-editable install would put llmarch inside the mounted venv; mounting the repo likewise."""
    with pytest.raises(sandbox.SandboxError, match="llmarch"):
        run_python("pass", tmp_path, ro_binds={ROOT / "lib": "/grader/lib"})


@needs_bwrap
def test_network_is_unreachable_but_loopback_works(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:  # a service on the grader's loopback
        port = server.getsockname()[1]
        result = run_python(f"""
            import socket
            for address in [("1.1.1.1", 53), ("127.0.0.1", {port})]:
                try:
                    socket.create_connection(address, timeout=3).close()
                    print(address, "CONNECTED")
                except OSError as e:
                    print(address, "failed", e.errno)
            inside = socket.create_server(("127.0.0.1", 0))  # loopback inside (Jupyter needs it)
            socket.create_connection(inside.getsockname(), timeout=3).close()
            print("loopback ok")
        """, tmp_path)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing reached the listen backlog
            server.accept()
    assert result.returncode == 0, result.stderr
    assert "CONNECTED" not in result.stdout and result.stdout.count("failed") == 2
    assert "loopback ok" in result.stdout


@needs_bwrap
def test_writes_only_inside_submission(tmp_path):
    venv_file = Path(sys.prefix) / "x"
    result = run_python(f"""
        import os
        for path in ["/usr/x", "/work/x", "{venv_file}", "/etc/x", "/x", "/root/x", "/dev/x", "/proc/x"]:
            try:
                open(path, "w").write("pwned")
                print(path, "WRITTEN")
            except OSError:
                print(path, "refused")
        open("/submission/out.txt", "w").write("hello")
        open("/tmp/scratch", "w").write("private tmp works")
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "WRITTEN" not in result.stdout and result.stdout.count("refused") == 8
    assert (tmp_path / "out.txt").read_text() == "hello"
    assert not Path("/work/x").exists() and not Path("/usr/x").exists()


@needs_bwrap
def test_file_size_limit(tmp_path):
    result = run_python("""
        try:
            open("big.bin", "wb").write(b"x" * (2 * 2**20))
        except OSError as e:
            print("refused", e.errno)
    """, tmp_path, Limits(wall_seconds=20, max_file_mb=1))
    assert f"refused {errno.EFBIG}" in result.stdout
    assert (tmp_path / "big.bin").stat().st_size <= 2**20


@needs_bwrap
def test_killing_parent_or_init_does_not_escape(tmp_path):
    result = run_python("""
        import os, signal
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as e:
                print("kill refused", e.errno)
        print("still running", os.getppid())
    """, tmp_path)
    assert result.returncode == 0 and "still running 1" in result.stdout


@needs_bwrap
def test_ro_binds_are_visible_and_read_only(tmp_path):
    runner = tmp_path / "runner.py"
    runner.write_text("print('runner ran')\n")
    work = tmp_path / "work"
    work.mkdir()
    result = run_sandboxed([PYTHON, "/grader/runner.py"], work, FAST, ro_binds={runner: "/grader/runner.py"})
    assert result.stdout == "runner ran\n", result.stderr
    result = run_python("open('/grader/runner.py', 'w')", work, ro_binds={runner: "/grader/runner.py"})
    assert result.returncode == 1 and "Read-only file system" in result.stderr
    with pytest.raises(ValueError, match="inside"):
        run_python("pass", work, ro_binds={runner: "/submission/runner.py"})


@needs_bwrap
def test_parallel_runs_do_not_interfere(tmp_path, created_cgroups):
    results = {}

    def run(i: int) -> None:
        work = tmp_path / f"student{i}"
        work.mkdir()
        results[i] = run_python(f"import os, time; time.sleep(0.5); open('n.txt', 'w').write('{i}'); "
                                f"print(os.getuid())", work)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(results[i].returncode == 0 for i in range(4)), results
    assert [(tmp_path / f"student{i}" / "n.txt").read_text() for i in range(4)] == ["0", "1", "2", "3"]
    if os.geteuid() == 0:  # concurrent runs get distinct slot uids, hence separate RLIMIT_NPROC budgets
        assert len({results[i].stdout for i in range(4)}) == 4
    if cgroup_mechanism("memory"):
        assert len(created_cgroups) >= 4  # one per run (and hierarchy), with distinct names
    assert len(set(created_cgroups)) == len(created_cgroups)
    assert [d for d in created_cgroups if d.exists()] == []


@needs_bwrap
def test_jupyter_kernel_runs_a_cell_inside_the_sandbox(tmp_path):
    """nbclient starts an ipykernel inside the sandbox (over loopback TCP) with the default limits and
    executes a cell (the grader uses runner.py instead, but a student's code may start a kernel)."""
    result = run_python("""
        import nbclient, nbformat
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1+1")])
        nbclient.NotebookClient(nb, timeout=60, kernel_name="python3").execute()
        print("result:", nb.cells[0].outputs[0]["data"]["text/plain"])
    """, tmp_path, Limits(wall_seconds=60))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "result: 2" in result.stdout


# ------------------------------------------------------------------------------------------------
# cgroup v2
# ------------------------------------------------------------------------------------------------


@needs_cgroup("memory")
@needs_bwrap
def test_cgroup_v2_limits_memory_and_counts_cpu(tmp_path):
    if cgroup_mechanism("memory") != "cgroup v2":
        pytest.skip("the memory controller is on cgroup v1 here (or the grader may not delegate v2 "
                    "controllers); the v2 path is covered by the unit tests above")
    result = run_python("x = bytearray(400 * 2**20)\nx[::4096] = b'y' * (len(x) // 4096)", tmp_path,
                        Limits(wall_seconds=30, memory_mb=256))
    assert result.oom_killed and result.isolation["memory"] == "cgroup v2"
    assert result.cpu_seconds is not None and result.cpu_seconds > 0


# ------------------------------------------------------------------------------------------------
# Without cgroups: watchdog and per-slot budgets
# ------------------------------------------------------------------------------------------------


@needs_bwrap
def test_fallback_watchdog_stops_a_growing_process(tmp_path, without_cgroups):
    result = run_python("x = []\nwhile True: x.append(bytearray(16 * 2**20)); x[-1][::4096] = b'y' * 4096",
                        tmp_path, Limits(wall_seconds=20, memory_mb=256, max_processes=4096))
    assert result.killed_by == "memory" and result.memory_exceeded and not result.oom_killed
    assert result.isolation["memory"].startswith("memory watchdog") and result.cpu_seconds is None


@needs_bwrap
def test_fallback_still_kills_every_process_at_the_wall_clock(tmp_path, without_cgroups):
    token = uuid.uuid4().hex
    result = run_python(f"""
        import os, signal
        token = "{token}"
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                while True: pass
            os._exit(0)
        while True: pass
    """, tmp_path, Limits(wall_seconds=1, max_processes=4096))
    assert result.killed_by == "wall-clock"
    assert processes_mentioning(token) == []  # the pid namespace died with bwrap


FALLBACK_DRIVER = """
import json, multiprocessing, sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from autograder import sandbox

def run(job):
    name, code, limits, folder = job
    work = Path(folder) / name
    work.mkdir()
    result = sandbox.run_sandboxed([sys.executable, "-c", code], work, sandbox.Limits(**limits))
    return name, {"returncode": result.returncode, "killed_by": result.killed_by, "stdout": result.stdout[-2000:],
                  "stderr": result.stderr[-2000:], "isolation": result.isolation}

if __name__ == "__main__":
    mountinfo, proc_cgroup = Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    if sandbox.cgroups._locate_cgroups(mountinfo, proc_cgroup) != ({}, None):
        sys.exit(77)  # cgroups are mounted somewhere we did not hide
    jobs = json.loads(sys.argv[1])
    with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        print(json.dumps(dict(pool.map(run, jobs))))
"""


@needs_root
@needs_bwrap
def test_fallback_without_cgroups_contains_bombs_beside_an_honest_run(tmp_path):
    """In a mount namespace without any cgroup file system, three worker processes grade at once: a
    multi-process memory bomb, a fork bomb and an honest program that starts a few processes itself."""
    token = uuid.uuid4().hex
    memory_bomb = textwrap.dedent(f"""
        import os, time
        token = "{token}"
        for _ in range(4):  # each process stays below RLIMIT_AS; together they are far above memory_mb
            if os.fork() == 0:
                block = b"x" * (300 * 2**20)
                time.sleep(600)
        time.sleep(600)
    """)
    fork_bomb = textwrap.dedent(f"""
        import os, time
        token = "{token}"
        while True:
            try:
                os.fork()
            except OSError:
                print("fork refused", flush=True)
                time.sleep(0.01)
    """)
    honest = textwrap.dedent("""
        import subprocess, sys, time
        time.sleep(1)  # the fork bomb is at its limit by now
        children = [subprocess.Popen([sys.executable, "-c", "print('child')"]) for _ in range(8)]
        print(sum(child.wait() for child in children), "failed")
    """)
    jobs = [("memory", memory_bomb, {"wall_seconds": 30, "memory_mb": 512, "max_processes": 32}, str(tmp_path)),
            ("fork", fork_bomb, {"wall_seconds": 4, "max_processes": 24}, str(tmp_path)),
            ("honest", honest, {"wall_seconds": 30, "max_processes": 24}, str(tmp_path))]
    if shutil.which("unshare") is None:
        pytest.skip("util-linux's unshare is needed to hide the cgroups")
    driver = tmp_path / "driver.py"
    driver.write_text(FALLBACK_DRIVER)
    hide_cgroups = 'umount -R /sys/fs/cgroup || exit 77; exec "$0" "$@"'
    done = subprocess.run(["unshare", "--mount", "sh", "-c", hide_cgroups, PYTHON, str(driver), json.dumps(jobs)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode == 77:
        pytest.skip(f"cannot hide this machine's cgroups in a mount namespace: {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)

    assert results["memory"]["killed_by"] == "memory", results["memory"]
    assert results["memory"]["isolation"]["memory"].startswith("memory watchdog")
    assert results["fork"]["killed_by"] == "wall-clock" and "fork refused" in results["fork"]["stdout"]
    assert results["fork"]["isolation"]["pids"] == "RLIMIT_NPROC on a per-slot uid"
    assert results["honest"]["returncode"] == 0, results["honest"]
    assert results["honest"]["stdout"].split("\n")[-2] == "0 failed"
    assert len({r["isolation"]["uid"] for r in results.values()}) == 3
    assert processes_mentioning(token) == []


def test_launcher_failure_raises_sandbox_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.cgroups._RunCgroups, "procs_files",
                        lambda self: [str(tmp_path / "no" / "cgroup.procs")])
    with pytest.raises(sandbox.SandboxError, match="could not start the sandbox"):
        run_sandboxed([PYTHON, "-c", "pass"], tmp_path, FAST, unsafe_no_sandbox=True)


def test_heartbeat_keeps_the_seals_of_test_cells():
    """The supervisor's ``captured <check> <digest>`` lines (runner.py): the grader keeps each check's latest."""
    read_end, write_end = os.pipe()
    heartbeat = sandbox.monitor._Heartbeat(read_end, now=0.0)
    try:
        os.write(write_end, b"cell 3\ncaptured test_a 0123abcd\ncaptured test_b ff\ncaptured test_a 99\ncell 4\n")
        heartbeat.poll()
        assert heartbeat.seals == {"test_a": "99", "test_b": "ff"} and heartbeat.last_line == "cell 4"
    finally:
        os.close(read_end)
        os.close(write_end)
