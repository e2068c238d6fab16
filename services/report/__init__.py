"""`quotasched report`: who used, borrowed and lent capacity, who waited and who was preempted,
read from the projection: its DuckDB file, or the running projector over NATS.

    write_report("report.html", db="q.duckdb")                          # every queue, whole log
    write_report("report.html", nats_url="nats://127.0.0.1:4222")       # a live service
    write_report("report.png", db="q.duckdb", job_queues=["training"], t_from=..., t_to=...)

One self-contained HTML file: the charts are drawn in the browser by Chart.js (the web view's
vendored copy, inlined) from data the Python side computed (one JSON object in the page,
`page.report_data` reads it back); no URL is loaded, so the file works offline and can be
mailed or attached to a ticket.  A PNG is a screenshot of that page taken by headless
Chromium (when it is installed), cropped to its content.

Per job queue:

- a usage chart per capacity unit (`share_usage` step functions, `capacity_changes`):
  stacked, every share's own-quota usage, min(in use, limit), solid in its colour, then what
  it borrowed beyond its limit, hatched in its colour; the service environment's capacity as a
  black line.  Usage above the capacity (possible only after the capacity was lowered under
  running jobs: lowering preempts nothing, spec ruling 3) is stacked on the line, hatched red,
  and a note under the chart says when and by how much.  Preemptions are triangles on the
  time axis.  Under it, who lent to whom (below), in instance-seconds.
- a waiting chart: per share, the jobs RUNNABLE over time, hatched those blocked (a
  ShareBlocked reason: as configured they can never fit); the jobs still waiting at the end of
  the window with share, priority, since when, why it waits (the core's reason,
  `jobs.reasons`) and last status reason; and a table of every preemption (time, victim and preemptor with their shares, reason, outcome).
  (jobs.py reads them from `job_events`, `job_submitted` and `preemptions`.)

A chart with more than MAX_EXACT_STEPS changes is drawn as time averages over equal columns
(same areas, so the same instance-seconds; a few MB instead of hundreds); tables stay exact.

Time, one rule for the page (timeaxis.py): a log on a real clock (first fact's `at` >= 1e9,
every live service) is shown in UTC: axis ticks "08:00" (dated on the first tick and each new
day: "2026-12-01 08:00"), header and tables in ISO ("2026-12-01T08:00:00Z").  A log on a
logical clock (a replayed example starting at 0) is shown as time elapsed since the first
fact ("+1 h 30 min"), never as a clock time.  `t_from` / `t_to` are the facts' `at`; by
default a queue's window runs from its creation -- or, when its first quarter ran nothing,
from a round time just before its first dispatch -- to the last fact.  A step function holds
from its change until the next one; of several changes at one instant only the last holds.

Attribution ("who lent to whom").  The log records how much an attempt borrowed, never from
whom: borrowing is pooled per job queue and capacity unit.  The report attributes it as the
utilization rollups do (projections/rollups.py, `lent_s`): at every instant, with B_b the
instances share b borrows (share_usage.borrowed), I_l the lendable idle quota of share l
(share_usage.lendable_idle: limit - in_use for a LEND or LEND_AND_BORROW share, 0 for RESERVE),
B = sum B_b and I = sum I_l,

    b borrowed from l:          B_b * I_l / max(I, B)
    b's borrowing not backed:   B_b * (1 - I / max(I, B))      (0 whenever B <= I)

i.e. every borrower takes from every lender pro rata to the lenders' idle quota at that moment.
Integrated over time these give instance-seconds; a borrower's row always adds up to the
integral of its `borrowed`, and a lender's column to the rollups' `lent_s`.

Reading (readers.py): a DuckDB file is opened read-only, which fails while a projector holds
it; `nats_url` asks that projector instead (`qm.proj.sql`): the very same statements, pinned to
one position.  The package, one module per concept: model (the data and `attribute`),
readers, load and jobs (reading), timeaxis (the time rule), series (the charts' data),
lent and tables (the tables under the charts), formatting, script (Chart.js and the drawing
script), page (the HTML), png (the Chromium screenshot), style (colours, limits); this module
is the public face.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from . import png, style  # noqa: F401 (style: tests lower style.MAX_EXACT_STEPS)
from .load import load
from .model import (  # noqa: F401
    Chart, Piece, Preemption, QueueReport, Report, ReportError, ReportUsageError, ShareAt,
    ShareInfo, Step, WaitingJob, WaitStep, attribute,
)  # fmt: skip
from .page import render_html, report_data
from .png import CHROMIUM_NAMES, chromium, html_to_png  # noqa: F401
from .readers import DuckDBReader, ProjectorReader, Reader, open_reader  # noqa: F401
from .timeaxis import TimeAxis  # noqa: F401


def build(db: str | None = None, job_queues: list[str] | None = None,
          t_from: float | None = None, t_to: float | None = None, *,
          nats_url: str | None = None) -> Report:  # fmt: skip
    """The report's data, from the file `db` (it wins when both are given) or the projector."""
    with open_reader(db, nats_url) as reader:
        return load(reader, job_queues, t_from, t_to)


def write_report(out: str, db: str | None = None, job_queues: list[str] | None = None,
                 t_from: float | None = None, t_to: float | None = None, *,
                 nats_url: str | None = None) -> Report:  # fmt: skip
    """Write `out` (.html, or .png through headless Chromium); returns what was drawn."""
    suffix = Path(out).suffix.lower()
    if suffix not in (".html", ".htm", ".png"):
        raise ReportUsageError(f"--out {out}: the report is written as .html (or .png)")
    if suffix == ".png" and png.chromium() is None:
        raise png.no_chromium(out)  # before any work is done
    report = build(db, job_queues, t_from, t_to, nats_url=nats_url)
    text = render_html(report)
    if suffix == ".png":
        with tempfile.TemporaryDirectory(prefix="quotasched-report-") as directory:
            page = os.path.join(directory, "report.html")
            Path(page).write_text(text, encoding="utf-8")
            html_to_png(page, out)
    else:
        Path(out).write_text(text, encoding="utf-8")
    return report


__all__ = ["Report", "ReportError", "ReportUsageError", "attribute", "build", "html_to_png",
           "load", "open_reader", "render_html", "report_data", "write_report"]  # fmt: skip
