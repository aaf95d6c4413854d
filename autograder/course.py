"""``python -m autograder course DIR``: an nbgrader course folder for this course, ready for a term.

It writes ``DIR/nbgrader_config.py`` (course id, exchange, nbgrader's own autograde switched off and its collect
checking owners, by ``autograder/nbgrader_guard.py``, and the ``alembic`` command found beside nbgrader's Python),
copies the release notebooks from ``exercises/`` into ``DIR/release/<assignment>/`` (what ``nbgrader
release_assignment`` publishes) and the sources from ``solutions/`` into ``DIR/source/<assignment>/`` (where
formgrader lists the assignments from), creates the exchange as the instructor's (``make_exchange``), and creates
``DIR/gradebook.db`` with every assignment, its graded cells and due date, and the students of a roster CSV.
Running it again updates the folder (it keeps grades).

Example::

    python -m autograder course course/ --exchange /srv/nbgrader/exchange --roster roster.csv \\
        --due "ps1-attention=2026-10-01 17:00 UTC"
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from autograder import assignments
from autograder.gradebook import DEFAULT_COURSE_ID, ensure_assignment, open_gradebook
from autograder.lateness import parse_time
from autograder.term import read_roster

ROOT = Path(__file__).resolve().parent.parent
CONFIG_MARK = "# Written by `python -m autograder course`"
CONFIG = CONFIG_MARK + """ (README, "Teach with it"); edit freely, it is not rewritten.
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets)
c.CourseDirectory.root = str(Path(__file__).resolve().parent)
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}

# nbgrader creates a new gradebook by running `alembic`, which lives beside nbgrader's own Python (the
# course's venv), not necessarily on the PATH of whoever runs nbgrader.
_bin = os.path.dirname(sys.executable)
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")

# The course is graded by `python -m autograder grade ASSIGNMENT --course {course_dir}`: nbgrader's own
# autograde (the command, or formgrader's Autograde button) refuses before it writes anything.
# nbgrader's collect only warns when a submission's folder belongs to another account than the student it names;
# OwnerCheckedCollect refuses it.
sys.path.insert(0, {repo!r})
from autograder.nbgrader_guard import OwnerCheckedCollect, RefuseAutograde  # noqa: E402

c.Autograde.exporter_class = RefuseAutograde
c.ExchangeFactory.collect = OwnerCheckedCollect

# nbgrader's generate_feedback (its GetGrades step) opens the gradebook without a course id, which adds a
# second course, "default_course": this course's id is the default instead.
import nbgrader.api  # noqa: E402

nbgrader.api.Gradebook.__init__.__defaults__ = ({course_id!r}, None)
"""

STUDENT_CONFIG = """# nbgrader configuration for students: ~/.jupyter/nbgrader_config.py (or /etc/jupyter/ for everyone)
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
"""


def _parse_due(values: list[str]) -> dict:
    due = {}
    for value in values:
        name, sep, when = value.partition("=")
        if not sep or name not in assignments.ASSIGNMENTS:
            raise SystemExit(f"--due {value!r}: write ASSIGNMENT=TIME with one of {', '.join(assignments.ASSIGNMENTS)}")
        try:
            due[name] = parse_time(when, f"--due {name}")
        except ValueError as err:
            raise SystemExit(str(err)) from None
    return due


def make_exchange(exchange: Path, course_id: str) -> None:
    """The exchange, the instructor's: its root 1777 (anyone may create a course there, and the sticky bit keeps
    anyone from renaming or replacing another's), ``<course_id>/`` and ``outbound/`` 0755, and ``inbound/`` 3733
    (students create their submission folders but cannot list, rename or remove anyone else's; the group bit as
    nbgrader sets it). A course folder that another account made first is refused: it could serve its own
    notebooks and read every submission."""
    exchange.mkdir(parents=True, exist_ok=True)
    exchange.chmod(0o1777)
    for path, mode in ((exchange / course_id, 0o755), (exchange / course_id / "outbound", 0o755),
                       (exchange / course_id / "inbound", 0o3733)):
        path.mkdir(exist_ok=True)
        if path.is_symlink() or path.lstat().st_uid != os.geteuid():
            raise SystemExit(f"{path} belongs to another account (uid {path.lstat().st_uid}): someone made it before "
                             "the course; remove it, check what it served, and run this again")
        path.chmod(mode)


def build(folder: Path, exchange: Path, course_id: str = DEFAULT_COURSE_ID, roster: Path | None = None,
          due: list[str] = (), names: list[str] = ()) -> None:
    """Create or update the course folder ``folder`` (see the module's text)."""
    from autograder.grade import release_notebook, release_template

    due_dates = _parse_due(list(due))
    names = list(names) or sorted(assignments.ASSIGNMENTS)
    unknown = [n for n in names if n not in assignments.ASSIGNMENTS]
    if unknown:
        raise SystemExit(f"--assignment: unknown {', '.join(unknown)}; known: {', '.join(assignments.ASSIGNMENTS)}")
    students = read_roster(roster)[1] if roster is not None else {}  # every input checked before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "nbgrader_config.py"
    if not config.exists():
        config.write_text(CONFIG.format(course_id=course_id, exchange=str(exchange.resolve()), repo=str(ROOT),
                                        course_dir=folder), encoding="utf-8")
    elif CONFIG_MARK not in config.read_text(encoding="utf-8"):
        print(f"note: {config} was not written by this command; it is kept as it is", file=sys.stderr)
    (folder / "student_nbgrader_config.py").write_text(
        STUDENT_CONFIG.format(course_id=course_id, exchange=str(exchange.resolve())), encoding="utf-8")
    make_exchange(exchange, course_id)
    for name in names:  # source/ is where formgrader lists the assignments from; release/ what students fetch
        shutil.copytree(ROOT / "solutions" / name, folder / "source" / name, dirs_exist_ok=True)
        shutil.copytree(ROOT / "exercises" / name, folder / "release" / name, dirs_exist_ok=True)
    with open_gradebook(folder / "gradebook.db", course_id) as gradebook:
        for name in names:
            template, notebook = release_template(name)
            ensure_assignment(gradebook, name, notebook, template, release_notebook(name), due_dates.get(name))
        for student, row in students.items():
            last, _, first = (row.get("Student") or "").partition(", ")
            gradebook.update_or_create_student(
                student, first_name=row.get("first_name") or first or None,
                last_name=row.get("last_name") or last or None, email=row.get("email") or None,
                lms_user_id=row.get("lms_user_id") or row.get("ID") or None)
    print(f"course folder {folder}: nbgrader_config.py, source/ and release/ ({len(names)} assignments), "
          f"gradebook.db ({len(students)} students from the roster), exchange {exchange}")
