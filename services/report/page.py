"""The HTML page: one self-contained document (inline CSS and SVG, no scripts, fonts or URLs)
with a header, the legend, one section per chart (share legend, chart, summary, who-lent-to-whom
table) and a footer that says how to read it; and page_height, the screenshot's height estimate.
"""

from __future__ import annotations

import math
import re

from . import style
from .chart_svg import _chart_svg
from .formatting import TimeFormat, _e, _time_step
from .lent import _lent_table, _share_legend, _summary
from .model import Chart, Report
from .style import MARKER, MARKER_GAP, MAX_LANES, PLOT_H, REASONS, TOP
from .symbols import _defs, _swatch

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1d1d1f; margin: 24px 32px; background: #fff; max-width: 1180px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 28px 0 2px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 15px; margin: 18px 0 4px; }
.source, .notes { color: #555; margin: 2px 0; font-size: 13px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 12px 0 4px; font-size: 13px;
          color: #333; }
.legend span, .shares .share { display: inline-flex; align-items: center; gap: 4px; }
.shares { display: flex; flex-wrap: wrap; gap: 4px 20px; margin: 4px 0 2px; font-size: 13px; }
.meta { color: #666; }
svg.swatch { vertical-align: middle; }
svg.defs { position: absolute; }
svg.usage { display: block; margin: 4px 0 0; font-size: 12px; }
svg.usage .grid line { stroke: #e6e6e6; stroke-width: 1; }
svg.usage .tick { fill: #444; font-size: 12px; }
svg.usage .axis-title { fill: #333; font-size: 12.5px; }
svg.usage .axis, svg.usage .tick-mark { stroke: #555; stroke-width: 1; }
svg.usage .limit { fill: none; stroke-width: 1.6; stroke-dasharray: 6 3; }
svg.usage .capacity { fill: none; stroke: #111; stroke-width: 2.4; }
svg.usage .guide { stroke-width: 1; stroke-dasharray: 2 3; opacity: 0.55; }
svg.usage .slot-label { font-size: 12px; font-weight: 600; }
svg.usage .cap-label { font-size: 12px; font-weight: 700; }
svg.usage .borrowed { shape-rendering: crispEdges; }
.summary { margin: 4px 0 6px; }
table.lent { border-collapse: collapse; margin: 6px 0 4px; font-size: 13px; }
table.lent caption { text-align: left; font-weight: 600; padding: 2px 0 4px; white-space: nowrap; }
table.lent th, table.lent td { border: 1px solid #d6d6d6; padding: 3px 10px; }
table.lent thead th { background: #f4f4f4; font-weight: 600; }
table.lent tbody th, table.lent tfoot th { text-align: left; font-weight: 600; }
table.lent td { text-align: right; font-variant-numeric: tabular-nums; }
table.lent td.total, table.lent tfoot td { font-weight: 600; }
table.lent tfoot { background: #fafafa; }
table.lent .h { color: #777; font-weight: 400; font-size: 12px; margin-left: 4px; }
.none { color: #555; font-style: italic; }
footer { margin-top: 28px; color: #444; font-size: 12.5px; border-top: 1px solid #ddd;
         padding-top: 8px; }
footer code { font-size: 12px; }
"""


def _format(report: Report, t0: float, t1: float) -> TimeFormat:
    return TimeFormat(report.origin, t1 - t0, _time_step(t1 - t0))


def render_html(report: Report) -> str:
    fmt = _format(report, report.t0, report.t1)
    same_window = len({(c.t0, c.t1) for c in report.charts}) <= 1
    queues: list[str] = []
    for chart in report.charts:
        if chart.job_queue not in queues:
            queues.append(chart.job_queue)
    out = _head(report, fmt, same_window, queues)
    for note in report.notes:
        out.append(f'<p class="notes">{_e(note)}</p>')
    out.append(_legend())
    if not report.charts:
        out.append('<p class="none">No job queue with quota shares or capacity to chart.</p>')
    current = None
    for chart in report.charts:
        if chart.job_queue != current:
            current = chart.job_queue
            out.append(f"<h2>Job queue {_e(current)}</h2>")
            if not same_window:
                qfmt = _format(report, chart.t0, chart.t1)
                out.append(f'<p class="source">Window: {qfmt(chart.t0, exact=True)} to '
                           f"{qfmt(chart.t1, exact=True)} after the first fact (at "
                           f"{chart.t0:g} to {chart.t1:g}).</p>")  # fmt: skip
        out.append(_chart_section(report, chart))
    out.append(_footer())
    return "".join(out) + "\n"


def _head(report: Report, fmt: TimeFormat, same_window: bool, queues: list[str]) -> list[str]:
    """The document's head, the page title and the source line (database, facts, window)."""
    preempted = sum(len(c.preemptions) for c in report.charts)
    return ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"/>',
            f"<title>quotasched report: {_e(', '.join(queues) or 'no job queues')}</title>",
            f"<style>{CSS}</style></head><body>", _defs(report),
            "<header><h1>Capacity by quota share: usage, borrowing, lending, preemptions</h1>",
            f'<p class="source">Generated from <code>{_e(report.db_path)}</code>: '
            f"{report.facts:,} facts, last seq {report.last_seq}, last fact at "
            f"{report.last_at:g} ({fmt(report.last_at, exact=True)} after the first fact). "
            + (f"Window: {fmt(report.t0, exact=True)} to {fmt(report.t1, exact=True)} "
               f"(at {report.t0:g} to {report.t1:g}); " if same_window else
               f"Window: from each job queue's start (below) to {fmt(report.t1, exact=True)} "
               f"(at {report.t1:g}); ")
            + f"job queues: {_e(', '.join(queues))}; "
            f"{preempted} preemption{'s' if preempted != 1 else ''} marked.</p>"]  # fmt: skip


def _legend() -> str:
    """The page legend (closes the header): what solid, hatched, dashed and markers mean."""
    return (
        '<div class="legend">'
        f'<span>{_swatch("own", 0)} own quota in use (solid)</span>'
        f'<span>{_swatch("borrowed", 0)} borrowed, drawn in the lender\'s slot (hatched, '
        "borrower's colour)</span>"
        f'<span>{_swatch("slot", 0)} a share\'s slot: its limit, stacked (dashed top)</span>'
        f'<span>{_swatch("capacity", 0)} service environment capacity</span>'
        + "".join(f'<span>{_swatch(reason, 0)} preemption: {label}</span>'
                  for reason, (_, _, label) in REASONS.items())
        + "</div></header>"
    )  # fmt: skip


def _chart_section(report: Report, chart: Chart) -> str:
    """One chart's section: heading, share legend, the SVG, the averages note when dense,
    the summary and the who-lent-to-whom table."""
    out = [f'<section class="chart" data-job-queue="{_e(chart.job_queue)}" '
           f'data-capacity-unit="{_e(chart.capacity_unit)}">'
           f"<h3>{_e(chart.capacity_unit)}</h3>"]  # fmt: skip
    out.append(_share_legend(report, chart))
    svg, dense = _chart_svg(report, chart, _format(report, chart.t0, chart.t1))
    out.append(svg)
    if dense:
        out.append(f'<p class="notes">{len(chart.steps):,} changes in this window, more '
                   "than the chart has pixel columns: it shows time averages per column "
                   "(the same instance-seconds); the table is exact.</p>")  # fmt: skip
    out.append(_summary(chart))
    out.append(_lent_table(report, chart))
    out.append("</section>")
    return "".join(out)


def _footer() -> str:
    """How to read the chart, and the who-lent-to-whom rule, in words."""
    return (
        "<footer><p><b>How to read it.</b> Each quota share owns a slot of the chart, stacked "
        "in creation order: the slot's height is the share's limit, its dashed top the stacked "
        "limits. Solid: the share's own quota in use, from the bottom of its slot; the rest of "
        "a slot is idle quota. Hatched: capacity a share borrowed beyond its limit, in the "
        "borrower's colour, drawn in the idle part of the slots it was lent from. Markers on "
        "the time axis are preemptions (hover for victim, preemptor and reason).</p>"
        "<p><b>Who lent to whom.</b> The log records how much a job borrowed, not from whom: "
        "borrowing is pooled per job queue and capacity unit. At every instant each borrowing "
        "share's borrowed instances are attributed to the lending shares (LEND or "
        "LEND_AND_BORROW) pro rata to their idle quota at that instant (limit − in use, "
        "<code>share_usage.lendable_idle</code>): borrower b takes B<sub>b</sub> · "
        "I<sub>l</sub> / max(I, B) from lender l, where I and B are the queue's total idle "
        "lendable quota and total borrowing; what idle quota cannot back (B &gt; I: only after "
        "a limit was lowered, or a share deleted, under running jobs) is shown as not backed. Integrated over the "
        "window this gives instance-seconds; a lender's total equals the utilization rollup's "
        "<code>lent_s</code>.</p></footer></body></html>"
    )


def page_height(report: Report) -> int:
    """A generous estimate of the rendered page's height (CSS pixels at the PNG's 1240 px
    width), for the screenshot: better some white at the bottom than a cut-off table."""
    height = 200 + 22 * len(report.notes)
    current = None
    for chart in report.charts:
        if chart.job_queue != current:
            current = chart.job_queue
            height += 80
        lanes = min(MAX_LANES, max(1, len(chart.preemptions)))
        height += 40 + 24 * math.ceil(len(chart.shares) / 4)  # heading, share legend
        height += TOP + PLOT_H + lanes * (MARKER + MARKER_GAP) + 60  # the chart
        # the averages note (style.MAX_EXACT_STEPS read at call time, as in frames)
        height += 24 if len(chart.steps) > style.MAX_EXACT_STEPS else 0
        summary = re.sub(r"<[^>]+>", "", _summary(chart))
        height += 24 * math.ceil(len(summary) / 150) + 10
        borrowers = sum(1 for v in chart.borrowed_s.values() if v > 0)
        height += (borrowers + 2) * 30 + 80 if borrowers else 40
    return int(height * 1.04) + 200
