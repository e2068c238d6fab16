"""The HTML page: one self-contained document.  A header (source, first and last fact, window),
then per job queue a usage chart per capacity unit (with its shares' limits, its over-capacity
note and who-lent-to-whom table), the waiting chart, the jobs still waiting and the
preemptions; a footer on how to read it.  The data is one JSON object in a
<script type="application/json" id="report-data"> element (`report_data` reads it back);
Chart.js and the drawing script are inlined after it.  No URL is loaded: it works offline.
"""

from __future__ import annotations

import json
import re
from typing import Any

from quotasched.services.explain.story import when

from . import script, series, tables
from .formatting import _e
from .lent import _lent_table, _share_legend, _summary, lent_values
from .model import Chart, QueueReport, Report
from .timeaxis import TimeAxis

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d1d1f; margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 16px 24px 8px; }
h1 { font-size: 21px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 22px 0 4px; border-bottom: 1px solid #ddd; padding-bottom: 2px; }
h3 { font-size: 15px; margin: 14px 0 2px; }
p { margin: 3px 0; }
.source, .notes, .more { color: #444; font-size: 13px; }
.plot { position: relative; height: 300px; margin: 4px 0; }
.plot.waiting { height: 200px; }
.shares { display: flex; flex-wrap: wrap; gap: 2px 18px; font-size: 13px; margin: 2px 0 6px; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: -1px;
          border: 1px solid #0003; }
.meta { color: #666; }
p.over { background: #fdecea; border-left: 4px solid #d62728; padding: 5px 9px; margin: 6px 0; }
.none { color: #555; font-style: italic; }
.row { display: flex; flex-wrap: wrap; gap: 6px 28px; align-items: flex-start; }
table { border-collapse: collapse; margin: 6px 0 4px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 2px 0 4px; white-space: nowrap; }
th, td { border: 1px solid #d6d6d6; padding: 2px 8px; text-align: left; vertical-align: top; }
thead th { background: #f4f4f4; font-weight: 600; }
td.n, table.lent td { text-align: right; font-variant-numeric: tabular-nums; }
table.lent td { white-space: nowrap; }
table.waiting td, table.preemptions td { white-space: nowrap; }
table.waiting td.reason { white-space: normal; }
td.blocked { color: #a01c1c; }
code.id { color: #666; font-size: 12px; }
table.lent td.total, table.lent tfoot td { font-weight: 600; }
table.lent .h { color: #777; font-weight: 400; font-size: 12px; margin-left: 4px; }
footer { margin-top: 18px; color: #444; font-size: 12.5px; border-top: 1px solid #ddd;
         padding-top: 6px; }
"""

DATA_ID = "report-data"


def render_html(report: Report) -> str:
    axis = TimeAxis(report.origin, report.last_at)
    data: dict[str, Any] = {
        "source": report.source, "position": report.last_seq, "facts": report.facts,
        "firstAt": report.origin, "lastAt": report.last_at,
        "firstFact": axis.stamp(report.origin), "lastFact": axis.stamp(report.last_at),
        "time": {"mode": axis.mode, "origin": report.origin, "title": axis.title},
        "charts": [], "queues": [],
    }  # fmt: skip
    names = [queue.job_queue for queue in report.queues]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"/>',
           f"<title>quotasched report: {_e(', '.join(names) or 'no job queues')}</title>",
           f"<style>{CSS}</style></head><body><main>", _header(report, axis)]  # fmt: skip
    out += [f'<p class="notes">{_e(note)}</p>' for note in report.notes]
    if not report.queues:
        out.append('<p class="none">No job queue to chart.</p>')
    for queue in report.queues:
        out.append(_queue(report, queue, axis, data))
    out.append(_FOOTER)
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    out += ["</main>", f'<script type="application/json" id="{DATA_ID}">{text}</script>',
            f"<script>{script.inline(script.chart_js())}</script>",
            f"<script>{script.inline(script.DRAW_JS)}</script>", "</body></html>"]  # fmt: skip
    return "\n".join(out) + "\n"


def report_data(html: str) -> dict[str, Any]:
    """The JSON a report page carries (its charts' data and its tables' rows)."""
    found = re.search(f'<script type="application/json" id="{DATA_ID}">(.*?)</script>', html,
                      re.S)  # fmt: skip
    if found is None:
        raise ValueError("not a quotasched report page")
    return json.loads(found.group(1))


def _header(report: Report, axis: TimeAxis) -> str:
    same = len({(q.t0, q.t1) for q in report.queues}) <= 1
    window = (f"window {axis.stamp(report.t0)} to {axis.stamp(report.t1)}" if same else
              f"window from each job queue's start (below) to {axis.stamp(report.t1)}")
    rule = ("Times are UTC." if axis.clock else
            f"The log's times are logical seconds (its first fact is at {when(report.origin)}), "
            "not clock times: the page shows time elapsed since the first fact.")  # fmt: skip
    preempted = sum(len(q.preemptions) for q in report.queues)
    waiting = sum(len(q.waiting_at_end) for q in report.queues)
    return ("<header><h1>Capacity by quota share: usage, borrowing, waiting, preemptions</h1>"
            f'<p class="source">From <code>{_e(report.source)}</code> at position '
            f"{report.last_seq:,} ({report.facts:,} facts): first fact "
            f"<b>{_e(axis.stamp(report.origin))}</b>, last fact "
            f"<b>{_e(axis.stamp(report.last_at))}</b>; {_e(window)}. {_e(rule)} "
            f"{preempted:,} preemption{'s' if preempted != 1 else ''}, {waiting:,} "
            f"job{'s' if waiting != 1 else ''} waiting at the end.</p></header>")  # fmt: skip


def _queue(report: Report, queue: QueueReport, axis: TimeAxis, data: dict) -> str:
    entry: dict[str, Any] = {"jobQueue": queue.job_queue, "t0": queue.t0, "t1": queue.t1,
                             "charts": []}  # fmt: skip
    out = [f'<section class="queue" data-job-queue="{_e(queue.job_queue)}">'
           f"<h2>Job queue {_e(queue.job_queue)}</h2>"]  # fmt: skip
    if (queue.t0, queue.t1) != (report.t0, report.t1):
        out.append(f'<p class="source">Window: {_e(axis.stamp(queue.t0))} to '
                   f"{_e(axis.stamp(queue.t1))}.</p>")  # fmt: skip
    for chart in queue.charts:
        out.append(_usage(report, chart, axis, data, entry))
    if not queue.charts:
        out.append('<p class="none">No quota share or capacity to chart.</p>')
    spec = series.waiting_chart(queue, report.shares, axis)
    out.append("<h3>Waiting jobs</h3>")
    if spec is None:
        out.append('<p class="none">No job waited in this window.</p>')
        entry["waitingChart"] = None
    else:
        entry["waitingChart"] = _add(data, spec)
        out.append(_canvas(entry["waitingChart"], "waiting",
                           f"jobs waiting per share in {queue.job_queue}"))  # fmt: skip
        out.append(_averaged_note(spec))
    waiting_html, entry["waitingAtEnd"] = tables.waiting_table(queue, axis)
    preempt_html, entry["preemptions"] = tables.preemption_table(queue, axis)
    out += [waiting_html, "<h3>Preemptions</h3>", preempt_html, "</section>"]
    data["queues"].append(entry)
    return "".join(out)


def _usage(report: Report, chart: Chart, axis: TimeAxis, data: dict, entry: dict) -> str:
    spec = series.usage_chart(chart, report.shares, axis)
    note, spec["overCapacity"] = tables.over_capacity(chart, axis)
    spec["lent"] = lent_values(chart)
    index = _add(data, spec)
    entry["charts"].append(index)
    return (f'<section class="chart" data-job-queue="{_e(chart.job_queue)}" '
            f'data-capacity-unit="{_e(chart.capacity_unit)}"><h3>{_e(chart.capacity_unit)}</h3>'
            + _share_legend(report, chart)
            + _canvas(index, "usage", f"usage of {chart.capacity_unit} per quota share")
            + _averaged_note(spec) + note + _summary(chart) + _lent_table(report, chart)
            + "</section>")  # fmt: skip


def _add(data: dict, spec: dict) -> int:
    data["charts"].append(spec)
    return len(data["charts"]) - 1


def _canvas(index: int, kind: str, label: str) -> str:
    return (f'<div class="plot {kind}"><canvas data-chart="{index}" role="img" '
            f'aria-label="{_e(label)}"></canvas></div>')


def _averaged_note(spec: dict) -> str:
    if not spec["averaged"]:
        return ""
    return ('<p class="notes">This chart has more changes than it has room for: it shows time '
            "averages over equal columns (the same instance-seconds); the tables are "
            "exact.</p>")  # fmt: skip


_FOOTER = (
    "<footer><p><b>How to read it.</b> A usage chart stacks, per quota share, its own quota in "
    "use (solid, up to its limit) and then what it borrowed beyond its limit (hatched in its "
    "colour). The black line is the service environment's capacity; usage above it (after the "
    "capacity was lowered under running jobs) is hatched red and told in a note. Triangles at "
    "the bottom are preemptions (listed in the table). The waiting chart counts jobs RUNNABLE "
    "per share; hatched ones are blocked: as configured they can never fit.</p>"
    "<p><b>Who lent to whom.</b> The log records how much a job borrowed, not from whom: "
    "borrowing is pooled per job queue and capacity unit. At every instant each borrowing "
    "share's borrowed instances are attributed to the lending shares (LEND or "
    "LEND_AND_BORROW) pro rata to their idle quota at that instant (limit − in use, "
    "<code>share_usage.lendable_idle</code>): borrower b takes B<sub>b</sub> · "
    "I<sub>l</sub> / max(I, B) from lender l, where I and B are the queue's total idle "
    "lendable quota and total borrowing; what idle quota cannot back (B &gt; I: only after "
    "a limit was lowered, or a share deleted, under running jobs) is shown as not backed. "
    "Integrated over the window this gives instance-seconds; a lender's total equals the "
    "utilization rollup's <code>lent_s</code>.</p></footer>"
)
