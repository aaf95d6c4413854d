"""What keeps nbgrader's own ``autograde`` from overwriting the course grader's results, and its ``collect`` from
taking one student's submission for another's.

The course folder's ``nbgrader_config.py`` (written by ``python -m autograder course``) sets
``c.Autograde.exporter_class = RefuseAutograde``. nbgrader creates the exporter in ``Autograde.start()``,
after finding the notebooks and before it touches anything (``--force``, which formgrader's Autograde button
passes, would first delete ``autograded/<student>/<assignment>/``; then it would write its own grades), so
``nbgrader autograde`` stops there: exit code 1 on the command line, and in formgrader an error whose log
says what to run instead.
"""

import os
import pwd

from nbconvert.exporters import NotebookExporter
from nbgrader.exchange.default.collect import ExchangeCollect

MESSAGE = ("nbgrader autograde is switched off in this course: its hidden tests run outside the notebook, in "
           "the course's grader, so nbgrader's autograde would replace correct grades with wrong ones. Nothing "
           "was changed. Grade with `python -m autograder grade ASSIGNMENT --course COURSE_FOLDER` "
           "(README, 'Teach with it'); it updates the gradebook and autograded/ that formgrader shows.")


class RefuseAutograde(NotebookExporter):
    """An exporter that refuses to be created: nbgrader's Autograde converter fails before it writes."""

    def __init__(self, *args, parent=None, **kwargs):
        from nbgrader.converters.base import NbGraderException

        if parent is not None:
            parent.log.error(MESSAGE)
        raise NbGraderException(MESSAGE)


# The lines a course's nbgrader_config.py needs (``python -m autograder course`` writes them; ``grade --course``
# names the ones an older or hand-made configuration lacks).
GUARD_LINES = ("from autograder.nbgrader_guard import OwnerCheckedCollect, RefuseAutograde",
               "c.Autograde.exporter_class = RefuseAutograde",
               "c.ExchangeFactory.collect = OwnerCheckedCollect")


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's collect, refusing every submission in ``inbound/`` whose folder is owned neither by the account it
    names (``<student>+<assignment>+<time>+<random>``) nor by the instructor: nbgrader itself only logs "cheating attempt?" and collects
    it, so anyone could submit as a classmate. A refused folder is reported as an error and never chosen: the
    student's own latest submission is collected instead."""

    def _owned(self, record) -> bool:
        """The folder belongs to the student it names, or to the instructor who collects (a submission made on a
        student's behalf: no student can create a file that the instructor owns)."""
        try:
            uid = os.lstat(os.path.join(self.inbound_path, record["filename"])).st_uid
            return uid == os.geteuid() or pwd.getpwuid(uid).pw_name == record["username"]
        except (KeyError, OSError):
            return False

    def _sort_by_timestamp(self, records):
        owned = [r for r in records if self._owned(r)]
        if owned:
            for record in records:
                if record not in owned:
                    self._refuse(record)
        return super()._sort_by_timestamp(owned or records)  # never empty: collect picks the first

    def _refuse(self, record):
        self.log.error(f"refused {record['filename']}: it names {record['username']!r}, but its folder in "
                       "inbound/ belongs to another account (OwnerCheckedCollect)")

    def copy_files(self):
        for record in self.src_records:
            if not self._owned(record):
                self._refuse(record)
        self.src_records = [r for r in self.src_records if self._owned(r)]
        super().copy_files()
