"""Removing a tree a submission left behind, whatever it holds: any depth (beyond PATH_MAX), mode 000
directories, symlinks (never followed), fifos and sockets (never opened). Standard library only, so
that a test can also run it inside the sandbox, as an ordinary user."""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def _remove_tree(path: Path) -> None:
    """Delete `path` and everything below it, whatever a submission left there: any depth (beyond
    PATH_MAX and the recursion limit), directories without permissions, symlinks (removed, never
    followed), fifos and sockets (never opened), files of any owner.

    Every call takes one name relative to an open directory: a non-empty subdirectory is moved up into
    `path` itself and emptied there in a later pass, so no path grows and nothing recurses.
    """
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except FileNotFoundError:
        return
    _make_accessible(path, None)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fresh_names = (f".removing-{i}" for i in itertools.count())
        while names := os.listdir(top):
            for name in names:
                _remove_entry(top, name, fresh_names)
    finally:
        os.close(top)
    os.rmdir(path)


def _remove_entry(top: int, name: str, fresh_names: Iterator[str]) -> None:
    """Remove `name` in directory `top`: a non-directory at once, a directory after deleting its
    non-directories and moving its subdirectories up into `top`."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=top, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=top)
        return
    _make_accessible(name, top)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    try:
        for child in os.listdir(fd):
            if not stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(child, dir_fd=fd)
                continue
            _make_accessible(child, fd)  # moving a directory rewrites its "..": that needs write permission
            for new_name in fresh_names:
                try:
                    os.rename(child, new_name, src_dir_fd=fd, dst_dir_fd=top)
                    break
                except OSError as exc:  # the submission used that name: take the next
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                        raise
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=top)


def _make_accessible(name: str | Path, dir_fd: int | None) -> None:
    """Give a directory of the tree mode 0700, which a non-root owner needs to list, enter and change it
    (root may anyway). The caller checked it is a directory; nothing of the run is alive to swap it."""
    if os.geteuid() != 0:
        os.chmod(name, 0o700, dir_fd=dir_fd)
