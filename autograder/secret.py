"""The course's secret: the hidden inputs depend on it, so that nothing in the public repository can predict them.

One random value per course, made on first use and kept in a file only its owner can read: beside the gradebook
(``--course DIR`` or ``--gradebook PATH``), else in the output folder, unless ``--secret FILE`` names another. It is
never part of the repository (``.gitignore`` lists its name) and never reaches a student: the sandbox sees the
inputs drawn from it, not the secret. Keep it for the whole term: the same notebook then gets the same inputs at
every regrade. To rotate it (a new term, or a leak), delete the file; the next run makes a new one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE_NAME = "grader_secret"
SECRET_BYTES = 32


def default_path(out: Path, gradebook: Path | None) -> Path:
    """Where the secret lives when ``--secret`` is not given: beside the gradebook, else in the output folder."""
    return (gradebook.parent if gradebook is not None else out) / FILE_NAME


def load_or_create(path: Path) -> str:
    """The secret in ``path`` (64 hex digits), made (mode 0600, written whole or not at all) when the file does not
    exist. A file that exists but holds no such value is refused: a wrong secret would silently change every
    student's hidden inputs."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_hex(SECRET_BYTES)
        partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")  # runs in threads share a pid
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        try:
            os.link(partial, path)  # fails if another run made it meanwhile: then that one's value is read below
        except FileExistsError:
            pass
        finally:
            partial.unlink()
    try:
        value = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise SystemExit(f"cannot read the course's secret {path}: {err}") from None
    if len(value) != 2 * SECRET_BYTES or any(c not in "0123456789abcdef" for c in value):
        raise SystemExit(f"{path} does not hold a grader secret (64 hex digits); restore it from a backup, or delete "
                         "it to make a new one (every hidden input then changes)")
    return value
