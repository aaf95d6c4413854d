"""The bubblewrap command line of one run: what the sandbox sees of the host (system directories, a few
/etc files, the grader's Python runtime, the caller's read-only binds; never the trusted packages),
who the code runs as, its clean environment, and the checks of the caller's arguments."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from autograder.sandbox.cgroups import _RunCgroups
from autograder.sandbox.limits import MB, SANDBOX_DIR, Limits, SandboxError, SandboxUnavailable


# Host directories that are bound read-only (or recreated as the same symlink) inside the sandbox.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc entries the Python stack needs; the rest of /etc stays hidden.
_ETC_FILES = ("ld.so.cache", "localtime", "timezone", "nsswitch.conf", "alternatives", "fonts")
# ro_binds may not land inside these (they are read-only mounts or the student's own folder).
_DEVICE_SYS_DIRS = ("/sys/bus", "/sys/class", "/sys/dev", "/sys/devices", "/sys/module")  # read-only, with devices
_RESERVED_DESTINATIONS = ("/usr", "/etc", "/proc", "/dev", "/tmp", SANDBOX_DIR)


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
