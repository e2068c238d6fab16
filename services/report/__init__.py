"""`quotasched report`: who used, borrowed and lent capacity, drawn from a projection database.

    write_report("q.duckdb", "report.html")                        # every queue, whole log
    write_report("q.duckdb", "report.png", job_queues=["training"], t_from=28800, t_to=43200)

One self-contained HTML file: inline SVG and a little CSS, no scripts, no fonts, no URLs, so it
can be mailed or attached to a ticket as it is.  A PNG is a screenshot of that HTML taken by
headless Chromium (when it is installed).

One chart per job queue and capacity unit, read from the `share_usage` and `queue_usage` step
functions and the `preemptions` table (projections/views.py, schema.py):

- Every quota share owns a horizontal *slot* of the chart: the shares are stacked in creation
  order and share k's slot runs from the sum of the limits of the shares before it to that sum
  plus its own limit; the dashed line in the share's colour is the top of its slot (the stacked
  limits).  The slot is tinted faintly in the share's colour.
- A share's own-quota usage, min(in_use, limit), is a solid step area from the bottom of its
  slot.  So the unused part of a slot is the share's idle quota.
- A share's borrowed usage, max(in_use - limit, 0), is hatched in the share's colour and drawn
  *inside the idle part of the slots it was lent from* (attribution below), so a hatched blue
  block in the orange slot reads "blue ran on orange's idle quota".  Borrowing no idle quota
  backs (it happens only after a limit was lowered under running jobs) is hatched above the
  top slot.
- The black step line is the service environment's capacity (`queue_usage.capacity`); where
  it is below the stacked limits the slots above it cannot be used.
- Preemptions are marked on the time axis, coloured (and shaped) by reason; hovering one names
  the victim, the preemptor, both shares, the reason and the outcome.  A preemption is marked
  on the chart of every unit its victim's attempt held (so once for a single-unit job).
- A chart of more than MAX_EXACT_STEPS changes is drawn as time averages per pixel column
  (same areas, so the same instance-seconds; a few MB of SVG instead of hundreds); its
  tables stay exact.

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

Time: the x axis is labelled from the first fact of the log (seconds for a short log, h:mm
otherwise).  `t_from` / `t_to` are logical times (the facts' `at`); by default the window runs
from the first fact -- or, when the first quarter of the log ran nothing, from shortly before
the first dispatch -- to the last fact.  A step function holds from its change until the next
one; of several changes at one instant only the last one holds for a positive time.

The package, one module per concept: model (the data and `attribute`), load (reading the
projection), formatting (numbers, times, escaping), frames (what a chart draws, and its scale),
symbols (hatches, markers, swatches), chart_svg (one chart), lent (the tables under a chart),
page (the HTML page), png (the Chromium screenshot), style (colours and geometry); this
module is the public face.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Everything the single module services/report.py offered is still importable from here.
from . import png, style  # noqa: F401 (style: tests lower style.MAX_EXACT_STEPS)
from .formatting import TimeFormat  # noqa: F401
from .frames import Frame, frames  # noqa: F401
from .load import load
from .model import (  # noqa: F401
    Chart, Piece, Preemption, Report, ReportError, ReportUsageError, ShareAt, ShareInfo, Step,
    attribute,
)  # fmt: skip
from .page import CSS, page_height, render_html  # noqa: F401
from .png import CHROMIUM_NAMES, chromium, html_to_png  # noqa: F401
from .style import (  # noqa: F401
    DARK, EPS, LEFT, MARKER, MARKER_GAP, MAX_EXACT_STEPS, MAX_GUIDES, MAX_LANES, MIN_WIDTH,
    OTHER_REASON, PALETTE, PLOT_H, REASONS, RIGHT, TOP, WIDTH,
)  # fmt: skip


def build(db_path: str, job_queues: list[str] | None = None, t_from: float | None = None,
          t_to: float | None = None) -> Report:  # fmt: skip
    from quotasched.projections import store

    with store.open(db_path, read_only=True) as projection:
        return load(projection.con, db_path, job_queues, t_from, t_to)


def write_report(db_path: str, out: str, job_queues: list[str] | None = None,
                 t_from: float | None = None, t_to: float | None = None) -> Report:  # fmt: skip
    """Write `out` (.html, or .png through headless Chromium); returns what was drawn."""
    suffix = Path(out).suffix.lower()
    if suffix not in (".html", ".htm", ".png"):
        raise ReportUsageError(f"--out {out}: the report is written as .html (or .png)")
    if suffix == ".png" and png.chromium() is None:
        raise png.no_chromium(out)  # before any work is done
    report = build(db_path, job_queues, t_from, t_to)
    text = render_html(report)
    if suffix == ".png":
        with tempfile.TemporaryDirectory(prefix="quotasched-report-") as directory:
            page = os.path.join(directory, "report.html")
            Path(page).write_text(text, encoding="utf-8")
            html_to_png(page, out, page_height(report))
    else:
        Path(out).write_text(text, encoding="utf-8")
    return report


__all__ = ["Report", "ReportError", "ReportUsageError", "attribute", "build", "html_to_png",
           "load", "render_html", "write_report"]  # fmt: skip
