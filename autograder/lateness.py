"""Submission times, due dates, extensions and the late policy.

Times are kept as naive UTC datetimes, as nbgrader's gradebook keeps them (``nbgrader.utils.parse_utc``), so
that what the grader computes and what ``nbgrader export`` computes from the same gradebook agree.

The policy is a flag of ``python -m autograder grade``::

    --late-penalty none          no penalty (the default); lateness is still reported
    --late-penalty 10%/day       10% of the assignment's points per started day late
    --late-penalty 2%/hour       2% per started hour
    --late-cutoff 72h            after 72 hours (or 3d) late: no points at all

The penalty is in points: ``fraction * max_score`` with ``fraction = min(1, rate * ceil(late / unit))``, or
1 after the cutoff; a student's final score is ``max(0, points - penalty)``, the rule of ``nbgrader export``.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

UNITS = {"h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
TIME_NOTE = "submission time: "  # how every note on a submission's time begins (grades.csv's notes, the report)


def parse_time(text: str, what: str) -> datetime:
    """A timestamp as nbgrader writes it (``2026-10-01 17:03:12.123456 UTC``) or ISO 8601, as naive UTC;
    ``ValueError`` naming ``what`` otherwise. A time without a zone is taken as UTC."""
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(text.strip())
    except (ValueError, OverflowError, TypeError) as err:
        raise ValueError(f"{what}: {text.strip()[:60]!r} is not a date and time ({err})") from None


def parse_duration(text: str, what: str) -> float:
    """``72h``, ``3d``, ``1.5hour`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(h|hour|d|day)s?\s*", text)
    if not match:
        raise ValueError(f"{what}: {text!r} is not a duration such as 48h or 2d")
    return float(match[1]) * UNITS[match[2]]


@dataclass(frozen=True)
class Policy:
    """``rate`` (fraction of the points) per started ``unit_seconds`` late; no points after ``cutoff_seconds``."""

    rate: float = 0.0
    unit_seconds: float = 86400.0
    cutoff_seconds: float | None = None

    @classmethod
    def parse(cls, penalty: str = "none", cutoff: str | None = None) -> "Policy":
        """``Policy.parse("10%/day", "72h")`` -> ``Policy(0.1, 86400.0, 259200.0)``."""
        cutoff_seconds = parse_duration(cutoff, "--late-cutoff") if cutoff else None
        if penalty.strip() == "none":
            return cls(0.0, 86400.0, cutoff_seconds)
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)%\s*/\s*(hour|day|h|d)\s*", penalty)
        if not match:
            raise ValueError(f"--late-penalty: {penalty!r} is not 'none' or a rate such as 10%/day or 2%/hour")
        return cls(float(match[1]) / 100, UNITS[match[2]], cutoff_seconds)

    def penalty(self, late_seconds: float, max_score: float) -> float:
        """Points taken off a submission ``late_seconds`` late, out of ``max_score``."""
        if late_seconds <= 0:
            return 0.0
        if self.cutoff_seconds is not None and late_seconds > self.cutoff_seconds:
            return max_score
        units = math.ceil(late_seconds / self.unit_seconds)
        return round(min(1.0, self.rate * units) * max_score, 6)


def read_extensions(path: Path, assignment: str) -> dict[str, timedelta]:
    """A CSV of extensions, ``student,assignment,hours`` (a blank assignment: every assignment) -> student ->
    extension for ``assignment``. A row that cannot be read is an error naming its line."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))
    except OSError as err:
        raise SystemExit(f"--extensions {path}: {err.strerror or err}") from None
    if rows and not {"student", "hours"} <= set(rows[0]):
        raise SystemExit(f"--extensions {path}: the header must name the columns student, assignment, hours")
    extensions = {}
    for line, row in enumerate(rows, start=2):
        if (row.get("assignment") or "").strip() not in ("", assignment):
            continue
        try:
            hours = float(row["hours"])
        except (TypeError, ValueError):
            raise SystemExit(f"--extensions {path}, line {line}: hours {row.get('hours')!r} is not a number") from None
        if not row["student"] or hours < 0 or not math.isfinite(hours):
            raise SystemExit(f"--extensions {path}, line {line}: needs a student and hours >= 0")
        extensions[row["student"].strip()] = timedelta(hours=hours)
    return extensions


@dataclass(frozen=True)
class Timing:
    """When one submission came in and what that costs. ``late_seconds`` is None when only a late flag is
    known (Canvas's ``_late`` marker without a time)."""

    submitted_at: datetime | None = None
    late_seconds: float | None = 0.0
    penalty: float = 0.0
    extension: timedelta | None = None
    note: str = ""


def timing(submitted_at: datetime | None, due: datetime | None, extension: timedelta | None, policy: Policy,
           max_score: float, late_flag: bool = False, note: str = "") -> Timing:
    """Lateness and penalty of one submission: late by ``submitted_at - (due + extension)`` where both are
    known; only flagged late (no penalty, a note) where the LMS says late without a time. ``note`` says how
    ``submitted_at`` was found, where it is not the submission's own time."""
    if submitted_at is None or due is None:
        if late_flag:
            return Timing(submitted_at, None, 0.0, extension, f"{TIME_NOTE}the LMS marks this submission late, but "
                                                              "gives no time: no penalty was applied")
        return Timing(submitted_at, None if due is not None else 0.0, 0.0, extension, note)
    late = max(0.0, (submitted_at - (due + (extension or timedelta()))).total_seconds())
    return Timing(submitted_at, late, policy.penalty(late, max_score), extension, note)


def format_hours(extension: timedelta | None) -> str:
    """An extension as grades.csv and the report show it: ``48h``, ``1.5h``; blank for none."""
    return "" if not extension else f"{extension.total_seconds() / 3600:g}h"


def format_time(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S UTC")
