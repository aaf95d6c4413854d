"""Reading the submissions folder, which is untrusted: names, links and archives all come from students.

Layouts, as learning-management systems export them:

- one folder per student, ``alice/ps1-attention.ipynb`` (Gradescope, Moodle; the notebook may sit in a
  sub-folder; files beside it come along);
- one zip per student, ``alice.zip`` (the notebook anywhere inside);
- Canvas's flat files, ``<name>_<userid>_<submissionid>_<file>.ipynb`` (``_late`` may follow the name), where a
  resubmitted file may carry ``-1``, ``-2`` before ``.ipynb``: the newest one of each user id is graded, the
  others are listed in a warning. Files are grouped by the user id, not the name (which a student may set): two
  user ids with one name are two students, ``<name> (Canvas user <id>)``, with a warning.

A student's folder or zip that holds exactly one notebook under another name is graded, with a note; several
candidates are reported. Every entry of the folder ends in exactly one submission (a row of grades.csv) or one
warning. Symbolic links are never followed: a linked entry is a submission that cannot be graded.
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from autograder.notebooks import MAX_NOTEBOOK_BYTES, InvalidNotebook, without_outputs
from autograder.sandbox import read_result_file

MAX_ZIP_BYTES = 50 * 2**20  # a submitted zip, and the notebook file (outputs are then removed: see load)
MAX_SIBLING_BYTES = 10 * 2**20  # files beside the notebook (helpers, data) brought along, in total
MAX_SIBLING_FILES = 50
CANVAS_NAME = re.compile(r"^(?P<name>[^_/]+?)(?:_late)?_(?P<user>\d+)_(?P<submission>\d+)_(?P<file>.+?)(?:-(?P<copy>\d+))?(?P<ext>\.ipynb)$",
                         re.IGNORECASE)


@dataclass(frozen=True)
class Submission:
    """One student's entry: a folder, a zip, a Canvas file, or a link (``problem`` says why it cannot be graded)."""

    path: Path
    kind: str  # "folder", "zip", "file" (Canvas) or "link"
    problem: str = ""
    bookkeeping: tuple[str, ...] = ()  # files beside the notebook that are not the student's (nbgrader's own)


@dataclass
class Loaded:
    """What the instructor's process read of one submission: the notebook's bytes and the files beside it, or
    the status and detail that end it before anything runs."""

    notebook: bytes | None = None
    siblings: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    status: str = ""  # "missing" or "invalid-notebook" when it cannot run
    detail: str = ""


HASH_SUFFIX = re.compile(r" \[[0-9a-f]{8}\]$")


def student_name(entry_name: str) -> str:
    """A printable, unique student name for a file name: names that are not valid UTF-8 or hold control
    characters are shown with replacement characters and a short hash of the real name, e.g.
    ``student_name("b\\udcffob")`` -> ``"b\ufffdob [5a1c…]"``. A name that already ends like such a hash gets one
    too, so no folder can be named as another student's printed name."""
    clean = entry_name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    clean = "".join(ch if ch.isprintable() else "?" for ch in clean)
    if clean != entry_name or HASH_SUFFIX.search(clean):
        clean += f" [{hashlib.sha256(os.fsencode(entry_name)).hexdigest()[:8]}]"
    return clean


def _distinct(name: str, entry_name: str, taken: dict, warnings: list[str]) -> str:
    """``name``, or, when another entry already has that printed name (two short hashes that collide), the name
    with the whole hash of the real one, and a warning: two entries never share one row."""
    if name not in taken:
        return name
    distinct = f"{name} [{hashlib.sha256(os.fsencode(entry_name)).hexdigest()}]"
    warnings.append(f"{name}: two entries print as this name; this one is graded as {distinct}")
    return distinct


def find_submissions(folder: Path, notebook: str, exclude: Path | None = None) -> tuple[dict[str, Submission], list[str]]:
    """Student name -> submission, and warnings for every entry that is not one. ``exclude`` (the output folder)
    is skipped. An empty or unreadable folder is an error (SystemExit) rather than "0 submissions"."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as err:
        raise SystemExit(f"cannot read the submissions folder {folder}: {err.strerror or err}") from None
    if not entries:
        raise SystemExit(f"the submissions folder {folder} is empty")
    found: dict[str, Submission] = {}
    warnings: list[str] = []
    canvas: dict[str, list[tuple[tuple[int, int], str, Path]]] = {}
    for entry in entries:
        name = student_name(entry.name)
        path = Path(entry.path)
        if exclude is not None and path.resolve() == exclude.resolve():
            warnings.append(f"{name}: skipped, it is the output folder")
            continue
        if entry.is_symlink():
            stem = _distinct(name[:-4] if name.lower().endswith(".zip") else name, entry.name, found, warnings)
            found[stem] = Submission(path, "link", f"{name} is a symbolic link (to {os.readlink(entry.path)[:200]}); "
                                                   "the grader never follows links")
        elif entry.is_dir(follow_symlinks=False):
            found[_distinct(name, entry.name, found, warnings)] = Submission(path, "folder")
        elif entry.is_file(follow_symlinks=False) and name.lower().endswith(".zip"):
            stem = name[:-4]
            if stem in found:  # sorted: a folder "alice" comes before "alice.zip"
                warnings.append(f"{name}: ignored, the folder {stem}/ is graded for this student")
            else:
                found[stem] = Submission(path, "zip")
        elif entry.is_file(follow_symlinks=False) and (match := CANVAS_NAME.match(name)):
            order = (int(match["submission"]), int(match["copy"] or 0))
            canvas.setdefault((match["name"], match["user"]), []).append((order, name, path))
        elif entry.is_file(follow_symlinks=False) and _is_notebook_name(name):
            warnings.append(f"{name}: ignored, a notebook outside any student folder whose name is not "
                            "Canvas's <name>_<userid>_<submissionid>_<file>.ipynb")
        else:
            warnings.append(f"{name}: ignored, not a student folder, a .zip or a Canvas notebook")
    users_of: dict[str, list[str]] = {}
    for name, user in canvas:
        users_of.setdefault(name, []).append(user)
    for (name, user), files in canvas.items():
        student = name
        if len(users_of[name]) > 1:  # namesakes: one row per Canvas user id, never one student for both
            student = _distinct(f"{name} (Canvas user {user})", f"{name}_{user}", found, warnings)
            warnings.append(f"{name}: Canvas files of {len(users_of[name])} user ids share this name; user {user} "
                            f"is graded as {student}")
        files.sort()
        *older, (_, newest, path) = files
        for _, old, _ in older:
            warnings.append(f"{old}: ignored, {student} has a newer submission ({newest})")
        if student in found:
            warnings.append(f"{newest}: ignored, {student} also has a folder or zip, which is graded")
        else:
            found[student] = Submission(path, "file")
    return found, warnings


def _is_notebook_name(name: str) -> bool:
    return name.lower().endswith(".ipynb")


def _usable_file_name(name: str) -> bool:
    """Whether a file submitted beside the notebook can be written under its own name on Linux: at most
    NAME_MAX (255) bytes, no NUL, not ``.`` or ``..``. A zip can hold names that no file system takes."""
    encoded = os.fsencode(name)
    return 0 < len(encoded) <= 255 and b"\0" not in encoded and name not in (".", "..")


class _SizeLimitExceeded(InvalidNotebook):
    pass


def _read_bounded(handle, limit: int, what: str) -> bytes:
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise _SizeLimitExceeded(f"{what} is larger than {limit // 2**20} MB")
    return data


def _pick(names: list[str], notebook: str) -> tuple[str | None, list[str]]:
    """The notebook to grade among the paths ``names``: the one with the expected file name (in any case, as
    Canvas matches names; of several, the least deep, then the first by path, whatever the archive's order, with
    a note naming the others), else the only notebook there is (with a note), else None."""
    exact = sorted((n for n in names if n.rsplit("/", 1)[-1].casefold() == notebook.casefold()),
                   key=lambda n: (n.count("/"), n))
    if len(exact) > 1:
        others = ", ".join(exact[1:4]) + (" ..." if len(exact) > 4 else "")
        return exact[0], [f"graded {exact[0]} of {len(exact)} notebooks named {notebook} (also: {others})"]
    if exact:
        return exact[0], []
    if len(names) == 1:
        return names[0], [f"graded {names[0]}: the only notebook submitted, although it is not named {notebook}"]
    return None, []


def _read_from_zip(path: Path, notebook: str) -> Loaded:
    """The notebook anywhere inside the zip, and the files beside it. Every way a zip can be broken
    (encrypted, unsupported compression, sizes or checksums that lie, truncated) is ``InvalidNotebook``; reads
    are bounded whatever the headers claim."""
    try:
        if path.stat().st_size > MAX_ZIP_BYTES:
            raise InvalidNotebook(f"{path.name} is larger than {MAX_ZIP_BYTES // 2**20} MB")
        with zipfile.ZipFile(path) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir() and "__MACOSX" not in i.filename
                     and ".ipynb_checkpoints" not in i.filename]
            candidates = [i.filename for i in infos if _is_notebook_name(i.filename)]
            chosen, notes = _pick(candidates, notebook)
            if chosen is None:
                return Loaded(status="missing", detail=_missing(notebook, candidates))
            info = zf.getinfo(chosen)
            if info.flag_bits & 0x1:
                raise InvalidNotebook(f"{chosen} in {path.name} is encrypted")
            with zf.open(info) as f:
                data = _read_bounded(f, MAX_ZIP_BYTES, f"{chosen} in {path.name}")
            if len(data) != info.file_size:
                raise InvalidNotebook(f"{path.name} is not a readable zip file: it says {chosen} has "
                                      f"{info.file_size} bytes, but it holds {len(data)}")
            folder = chosen.rsplit("/", 1)[0] if "/" in chosen else ""
            siblings = {}
            for other in infos:
                other_folder = other.filename.rsplit("/", 1)[0] if "/" in other.filename else ""
                if other is info or other_folder != folder or other.flag_bits & 0x1 or len(siblings) >= MAX_SIBLING_FILES:
                    continue
                if not _usable_file_name(other.filename.rsplit("/", 1)[-1]):
                    notes.append(f"a file beside the notebook was left out: its name cannot be a file name "
                                 f"here ({other.filename[:60]!r}...)")
                    continue
                try:
                    with zf.open(other) as f:
                        siblings[other.filename.rsplit("/", 1)[-1]] = _read_bounded(f, MAX_SIBLING_BYTES, other.filename)
                except Exception:  # noqa: BLE001 - a broken extra file is not the notebook's problem
                    continue
            return Loaded(data, siblings, notes)
    except InvalidNotebook:
        raise
    except Exception as err:  # noqa: BLE001 - zipfile and its decompressors (zlib, bz2, lzma) raise many types
        raise InvalidNotebook(f"{path.name} is not a readable zip file ({type(err).__name__}: {str(err)[:200]})") from None


def _read_from_folder(path: Path, notebook: str) -> Loaded:
    """Like ``_read_from_zip`` for a folder: symbolic links (to files or folders) are never followed."""
    candidates = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".ipynb_checkpoints")
        candidates += [Path(dirpath) / f for f in sorted(filenames) if _is_notebook_name(f)]
    links = [c for c in candidates if c.is_symlink()]
    real = [str(c.relative_to(path)) for c in candidates if not c.is_symlink()]
    chosen, notes = _pick(real, notebook)
    if chosen is None:
        linked = [c for c in links if c.name == notebook]
        if linked:
            raise InvalidNotebook(f"{linked[0].relative_to(path)} is a symbolic link; the grader never follows links")
        return Loaded(status="missing", detail=_missing(notebook, real))
    candidate = path / chosen
    data = read_result_file(candidate.parent, candidate.name, MAX_ZIP_BYTES)  # no links followed, bounded
    if data is None:
        raise InvalidNotebook(f"{chosen} is not a regular file of at most {MAX_ZIP_BYTES // 2**20} MB")
    siblings = {}
    for entry in sorted(os.scandir(candidate.parent), key=lambda e: e.name)[: MAX_SIBLING_FILES + 1]:
        if entry.name != candidate.name and entry.is_file(follow_symlinks=False):
            content = read_result_file(candidate.parent, entry.name, MAX_SIBLING_BYTES)
            if content is not None:
                siblings[entry.name] = content
    return Loaded(data, siblings, notes)


def _read_canvas_file(path: Path, notebook: str) -> Loaded:
    data = read_result_file(path.parent, path.name, MAX_ZIP_BYTES)
    if data is None:
        raise InvalidNotebook(f"{path.name} is not a regular file of at most {MAX_ZIP_BYTES // 2**20} MB")
    return Loaded(data, {}, [f"graded the Canvas file {path.name}"])


def _missing(notebook: str, found: list[str]) -> str:
    if len(found) > 1:
        return f"no notebook named {notebook}, and several others, so none was chosen: {', '.join(found[:5])}"
    return f"no notebook named {notebook}"


def load(submission: Submission, notebook: str) -> Loaded:
    """Read one submission in the instructor's process (workers, local or on a cluster, get bytes). A notebook
    file over ``MAX_NOTEBOOK_BYTES`` (and up to ``MAX_ZIP_BYTES``) loses its saved outputs, with a note."""
    if submission.problem:
        return Loaded(status="invalid-notebook", detail=submission.problem)
    reader = {"zip": _read_from_zip, "folder": _read_from_folder, "file": _read_canvas_file}[submission.kind]
    try:
        loaded = reader(submission.path, notebook)
    except InvalidNotebook as err:
        return Loaded(status="invalid-notebook", detail=str(err))
    for name in submission.bookkeeping:
        loaded.siblings.pop(name, None)
    if loaded.notebook is not None and len(loaded.notebook) > MAX_NOTEBOOK_BYTES:
        loaded.notebook, note = without_outputs(loaded.notebook)
        if note:
            loaded.notes.append(note)
    return loaded
