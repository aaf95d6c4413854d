"""What keeps nbgrader's own ``autograde`` from overwriting the course grader's results.

The course folder's ``nbgrader_config.py`` (written by ``python -m autograder course``) sets
``c.Autograde.exporter_class = RefuseAutograde``. nbgrader creates the exporter in ``Autograde.start()``,
after finding the notebooks and before it touches anything (``--force``, which formgrader's Autograde button
passes, would first delete ``autograded/<student>/<assignment>/``; then it would write its own grades), so
``nbgrader autograde`` stops there: exit code 1 on the command line, and in formgrader an error whose log
says what to run instead.
"""

from nbconvert.exporters import NotebookExporter

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
