"""``OUT_DIR/report.html``: the class at a glance, for the instructor, built from every row of ``grades.csv``.

One self-contained page (the histogram is inline SVG; no script, font or style is fetched), so it opens
offline: counts per status over the whole roster (students who did not submit are ``missing``), the
distribution of scores, every student's total (with the manual points from the gradebook where they were
given, and the late penalty), each test cell's mean as a fraction of its points and full-marks rate, who
failed each cell and its most common failure messages (numbers replaced by ``#``), the late submissions,
extensions and submission times taken otherwise (no readable ``timestamp.txt``), the slowest submissions, and
the submissions that hit a limit.
"""

from __future__ import annotations

import html
import io
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from autograder.lateness import TIME_NOTE
from autograder.results import atomic_write_text

LIMIT_STATUSES = ("timeout", "memory-limit")

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; line-height: 1.45; color: #222; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; } td, th { border-bottom: 1px solid #ddd; padding: .3rem .7rem;
text-align: left; vertical-align: top; } td.num, th.num { text-align: right; } .bar { background: #4a78b5; height: .8rem; }
figure { margin: 0 0 1.5rem; } figcaption { color: #555; font-size: .9rem; }
"""


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _histogram_svg(scores: list[float], max_score: float) -> str:
    """The distribution of the automatically graded scores as an inline SVG figure (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    bins = [b - 0.5 for b in range(int(max_score) + 2)] if max_score <= 60 else 20
    ax.hist(scores, bins=bins, color="#4a78b5", edgecolor="white")
    ax.set_xlabel("automatically graded score")
    ax.set_ylabel("submissions")
    ax.set_xlim(-0.5, max_score + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]  # drop the XML prologue and doctype: it is embedded in HTML


def _failures(item, rows_list, records: dict) -> tuple[str, str]:
    """Who lost points on an automatically graded cell, and its three most common messages."""
    failed = [r["student"] for r in rows_list
              if r["status"] != "missing" and (_number(r.get(item.grade_id, "")) or 0.0) < item.points]
    messages: Counter = Counter()
    for record in records.values():
        for got in record.get("items", []):
            if got.get("grade_id") == item.grade_id and (got.get("points") or 0.0) < item.points:
                messages[re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", str(got.get("message", ""))[:300])] += 1
    common = "<br>".join(f"{n} &times; {html.escape(text)}" for text, n in messages.most_common(3))
    return ", ".join(html.escape(name) for name in failed) or "nobody", common


def _time_notes(row: dict[str, str]) -> str:
    """The notes of a row on its submission time (``lateness.TIME_NOTE``): a time taken otherwise, a late flag."""
    return "; ".join(n for n in row.get("notes", "").lstrip("'").split("; ") if n.startswith(TIME_NOTE))


def _student_rows(rows_list, totals: dict) -> str:
    """One line per student: automatic points, total (with manual points where given), penalty, final."""
    e = html.escape
    lines = []
    for r in rows_list:
        total = totals.get(r.get("id"), _number(r["score"]) or 0.0)
        penalty = _number(r.get("penalty", "")) or 0.0
        late = _number(r.get("late_seconds", ""))
        lines.append(f"<tr><td>{e(r['student'])}</td><td>{e(r['status'])}</td><td class='num'>{e(r['score'])}</td>"
                     f"<td class='num'>{total:g}</td><td class='num'>{penalty:g}</td>"
                     f"<td class='num'>{max(0.0, total - penalty):g} / {e(r['max_score'])}</td>"
                     f"<td class='num'>{'' if not late else f'{late / 3600:.1f} h'}</td>"
                     f"<td class='num'>{e(r.get('manual_pending', ''))}</td></tr>")
    return "".join(lines)


def render(rows: dict[str, dict[str, str]], template, assignment: str, records: dict | None = None,
           totals: dict | None = None) -> str:
    """The page; ``records``: id -> ``results.write_record``'s record, ``totals``: id -> points with the
    manual grades (from the gradebook)."""
    e = html.escape
    records, totals = records or {}, totals or {}
    rows_list = list(rows.values())
    auto_max = sum(i.points for i in template.auto_items)
    counts: dict[str, int] = {}
    for row in rows_list:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    status_rows = "".join(f"<tr><td>{e(status)}</td><td class='num'>{n}</td></tr>" for status, n in sorted(counts.items()))
    submitted = [r for r in rows_list if r["status"] != "missing"]
    scores = [s for s in (_number(r["score"]) for r in submitted) if s is not None]

    cell_rows, failure_rows = [], []
    for item in template.items:
        if item.kind == "manual":
            cell_rows.append(f"<tr><td>{e(item.grade_id)}</td><td class='num'>{item.points:g}</td>"
                             "<td colspan='2'>written answer, graded by hand</td></tr>")
            continue
        points = [p for p in (_number(r.get(item.grade_id, "")) for r in submitted) if p is not None]
        mean = sum(points) / len(points) / item.points if points and item.points else 0.0
        full = sum(p == item.points for p in points) / len(points) if points else 0.0
        cell_rows.append(f"<tr><td>{e(item.grade_id)}</td><td class='num'>{item.points:g}</td>"
                         f"<td class='num'>{mean:.2f}</td><td class='num'>{full:.0%} "
                         f"<div class='bar' style='width:{full * 8:.2f}rem'></div></td></tr>")
        who, common = _failures(item, rows_list, records)
        failure_rows.append(f"<tr><td>{e(item.grade_id)}</td><td>{who}</td><td>{common}</td></tr>")

    late_rows = "".join(f"<tr><td>{e(r['student'])}</td><td>{e(r.get('submitted_at', ''))}</td>"
                        f"<td class='num'>{e(r.get('extension', ''))}</td>"
                        f"<td class='num'>{(_number(r.get('late_seconds', '')) or 0) / 3600:.1f}</td>"
                        f"<td class='num'>{e(r.get('penalty', ''))}</td><td>{e(_time_notes(r))}</td></tr>"
                        for r in rows_list if (_number(r.get("late_seconds", "")) or 0) > 0 or r.get("extension")
                        or _time_notes(r)) or "<tr><td colspan='6'>none</td></tr>"
    slowest = sorted(submitted, key=lambda r: _number(r.get("seconds", "")) or 0.0, reverse=True)[:10]
    slow_rows = "".join(f"<tr><td>{e(r['student'])}</td><td>{e(r['status'])}</td>"
                        f"<td class='num'>{e(r.get('seconds', ''))}</td><td class='num'>{e(r.get('cpu_seconds', ''))}</td></tr>"
                        for r in slowest)
    limited = [r for r in rows_list if r["status"] in LIMIT_STATUSES]
    limit_rows = "".join(f"<tr><td>{e(r['student'])}</td><td>{e(r['status'])}</td><td>{e(r['detail'])}</td></tr>"
                         for r in limited) or "<tr><td colspan='3'>none</td></tr>"
    histogram = _histogram_svg(scores, auto_max) if scores else "<p>No scores yet.</p>"
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(assignment)}: class report</title><style>{_STYLE}</style></head>
<body>
<h1>{e(assignment)}: class report</h1>
<p>{len(rows_list)} students, {len(submitted)} submissions; automatically graded points out of {auto_max:g}.
Generated {generated} from grades.csv{" and the gradebook" if totals else ""}.</p>
<h2>Statuses</h2>
<table><tr><th>status</th><th class='num'>students</th></tr>{status_rows}</table>
<h2>Scores</h2>
<figure>{histogram}<figcaption>Automatically graded scores of all {len(scores)} submissions.</figcaption></figure>
<h2>Students</h2>
<table><tr><th>student</th><th>status</th><th class='num'>automatic</th><th class='num'>with manual</th>
<th class='num'>penalty</th><th class='num'>final</th><th class='num'>late</th><th class='num'>to grade by hand</th></tr>
{_student_rows(rows_list, totals)}</table>
<h2>Test cells</h2>
<table><tr><th>cell</th><th class='num'>points</th><th class='num'>mean (fraction)</th><th class='num'>full marks</th></tr>{''.join(cell_rows)}</table>
<h2>Failures by cell</h2>
<table><tr><th>cell</th><th>students who lost its points</th><th>most common messages</th></tr>{''.join(failure_rows)}</table>
<h2>Late submissions, extensions and times taken otherwise</h2>
<table><tr><th>student</th><th>submitted</th><th class='num'>extension</th><th class='num'>hours late</th>
<th class='num'>penalty</th><th>note</th></tr>{late_rows}</table>
<h2>Slowest submissions</h2>
<table><tr><th>student</th><th>status</th><th class='num'>seconds</th><th class='num'>CPU seconds</th></tr>{slow_rows}</table>
<h2>Submissions that hit a limit</h2>
<table><tr><th>student</th><th>status</th><th>detail</th></tr>{limit_rows}</table>
</body></html>
"""


def write_report(rows: dict[str, dict[str, str]], template, assignment: str, path: Path, records: dict | None = None,
                 totals: dict | None = None) -> None:
    atomic_write_text(path, render(rows, template, assignment, records, totals))
