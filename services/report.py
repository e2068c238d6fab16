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
"""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Share colours, in creation order within a job queue (no red: red marks preemptions).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#ff9da7", "#8cd17d", "#bab0ac", "#1b9e77", "#7570b3", "#e7298a", "#a6761d",
           "#17becf", "#bcbd22", "#6b6ecf", "#d6616b", "#637939", "#ce6dbd")  # fmt: skip


def _darker(hex_colour: str, factor: float = 0.62) -> str:
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c * factor):02x}" for c in rgb)


DARK = tuple(_darker(colour) for colour in PALETTE)  # lines and text in a share's colour
REASONS = {  # reason: (colour, shape, label)
    "CROSS_SHARE_RECLAIM": ("#d62728", "triangle", "cross-share reclaim"),
    "IN_SHARE_PRIORITY": ("#1f1f1f", "diamond", "in-share priority"),
}
OTHER_REASON = ("#888888", "circle", "other")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
                  "chrome", "headless_shell")  # fmt: skip

# Chart geometry (SVG user units = CSS pixels).
WIDTH, PLOT_H = 1120, 300
LEFT, RIGHT, TOP = 64, 190, 18
MARKER, MARKER_GAP = 11, 2
EPS = 1e-9
MIN_WIDTH = 1.5  # px: a borrowed piece stays visible however short it was
MAX_EXACT_STEPS = 1500  # more steps than this in a chart: draw time averages per pixel column
MAX_LANES = 3  # rows of preemption markers under the time axis
MAX_GUIDES = 40  # more preemptions than this in a chart: markers only, no guide lines


class ReportError(RuntimeError):
    """The report cannot be made (no facts, no Chromium for a PNG ...)."""


class ReportUsageError(ReportError):
    """The request itself is wrong: unknown job queue, empty window, unknown output type."""


# ---------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ShareAt:
    in_use: int = 0
    limit: int = 0
    borrowed: int = 0
    lendable_idle: int = 0

    @property
    def own(self) -> int:
        return max(0, min(self.in_use, self.limit))


@dataclass
class Step:
    """[a, b): every share's usage and the queue's capacity are constant."""

    a: float
    b: float
    capacity: int
    shares: dict[str, ShareAt]


@dataclass(frozen=True)
class Piece:
    """Part of a borrower's borrowing during a step: from `lender`'s idle quota, or not backed
    by any idle quota (lender None).  `amount` is in instances (fractional when pro rata)."""

    borrower: str
    lender: str | None
    amount: float


@dataclass(frozen=True)
class Preemption:
    seq: int
    at: float
    job_id: str
    attempt: int
    preemptor_job_id: str
    reason: str
    outcome: str
    quota_share: str
    preemptor_share: str | None


@dataclass
class Chart:
    job_queue: str
    capacity_unit: str
    shares: list[str]
    steps: list[Step]
    preemptions: list[Preemption]
    t0: float
    t1: float
    borrowed_s: dict[str, float] = field(default_factory=dict)
    lent_s: dict[tuple[str, str], float] = field(default_factory=dict)  # (borrower, lender)
    unbacked_s: dict[str, float] = field(default_factory=dict)
    used_s: dict[str, float] = field(default_factory=dict)


@dataclass
class ShareInfo:
    job_queue: str
    name: str
    colour: int  # index into PALETTE
    strategy: str | None
    deleted: bool


@dataclass
class Report:
    db_path: str
    facts: int
    last_seq: int
    origin: float  # `at` of the first fact: time labels count from here
    last_at: float
    t0: float  # the earliest chart's start (charts start per job queue unless --from)
    t1: float
    charts: list[Chart]
    shares: dict[tuple[str, str], ShareInfo]
    notes: list[str] = field(default_factory=list)


def attribute(step: Step) -> list[Piece]:
    """Who borrowed from whom during one step (the rule in the module docstring)."""
    borrowers = [(name, s.borrowed) for name, s in step.shares.items() if s.borrowed > 0]
    if not borrowers:
        return []
    lenders = [(name, s.lendable_idle) for name, s in step.shares.items() if s.lendable_idle > 0]
    total_b = sum(b for _, b in borrowers)
    total_i = sum(i for _, i in lenders)
    scale = max(total_b, total_i)
    pieces = []
    for name, b in borrowers:
        for lender, idle in lenders:
            pieces.append(Piece(name, lender, b * idle / scale))
        if total_b > total_i:
            pieces.append(Piece(name, None, b * (1 - total_i / scale)))
    return pieces


# ---------------------------------------------------------------------------------- loading


def load(con, db_path: str, job_queues: list[str] | None = None, t_from: float | None = None,
         t_to: float | None = None) -> Report:  # fmt: skip
    """Read everything the report draws from an open projection connection."""
    position, facts, last_at = con.execute(
        "SELECT position, facts_applied, last_at FROM projection_state").fetchone()
    if not facts:
        raise ReportError(f"{db_path} holds no facts yet: nothing to chart")
    origin = con.execute('SELECT min("at") FROM fact_log').fetchone()[0]
    known = [row[0] for row in con.execute(
        "SELECT job_queue FROM (SELECT job_queue, min(seq) AS s FROM queue_config GROUP BY ALL) "
        "ORDER BY s").fetchall()]  # fmt: skip
    if job_queues:
        unknown = [q for q in job_queues if q not in known]
        if unknown:
            raise ReportUsageError(f"no job queue {unknown[0]!r} in {db_path}; it knows: "
                              + (", ".join(known) or "none"))  # fmt: skip
        queues = [q for q in known if q in job_queues]
    else:
        queues = known
    notes = []
    t1 = last_at if t_to is None else float(t_to)
    if t1 > last_at:
        notes.append(f"--to {t_to:g} is after the last fact ({last_at:g}): the charts end there")
        t1 = last_at
    if t_from is not None and not t1 > float(t_from):
        raise ReportUsageError(f"empty time window: from {float(t_from):g} to {t1:g} (the log runs "
                          f"from {origin:g} to {last_at:g})")  # fmt: skip
    if not t1 > origin:
        raise ReportError(f"every fact in {db_path} is at the same instant ({origin:g}) or "
                          f"--to is before the first fact: there is no time to chart")  # fmt: skip
    shares = _shares(con, queues)
    charts = []
    starts = [origin]
    for queue in queues:
        t0 = _default_start(con, queue, origin, t1) if t_from is None else float(t_from)
        starts.append(t0)
        units = [row[0] for row in con.execute(
            "SELECT DISTINCT capacity_unit FROM share_usage WHERE job_queue = $q UNION "
            "SELECT DISTINCT capacity_unit FROM capacity_changes WHERE job_queue = $q "
            "ORDER BY 1", {"q": queue}).fetchall()]  # fmt: skip
        for unit in units:
            charts.append(_chart(con, queue, unit, t0, t1, shares))
    t0 = min(starts[1:]) if len(starts) > 1 else origin
    return Report(db_path, facts, position, origin, last_at, t0, t1, charts, shares, notes)


def _default_start(con, queue: str, origin: float, t1: float) -> float:
    """Where a job queue's chart starts: when the queue was created, unless it dispatched
    nothing in the first quarter of its life: then a round time (a tick of the axis) just
    before its first dispatch."""
    created, first = con.execute(
        'SELECT (SELECT min("at") FROM queue_config WHERE job_queue = $q), '
        '(SELECT min("at") FROM allocation_starts WHERE job_queue = $q)', {"q": queue}
    ).fetchone()  # fmt: skip
    created = origin if created is None or created >= t1 else created
    if first is None or first >= t1 or first - created <= 0.25 * (t1 - created):
        return created
    step = _time_step(t1 - first)
    return max(created, origin + math.floor((first - origin) / step) * step)


def _shares(con, queues: list[str]) -> dict[tuple[str, str], ShareInfo]:
    rows = con.execute(
        "SELECT job_queue, quota_share, min(seq) AS created, "
        "arg_max(strategy, seq) FILTER (WHERE NOT deleted) AS strategy, "
        "arg_max(deleted, seq) AS deleted FROM share_config WHERE list_contains($q, job_queue) "
        "GROUP BY ALL ORDER BY created", {"q": queues}).fetchall()  # fmt: skip
    found: dict[tuple[str, str], ShareInfo] = {}
    count: dict[str, int] = {}
    for queue, share, _created, strategy, deleted in rows:
        index = count.get(queue, 0)
        count[queue] = index + 1
        found[(queue, share)] = ShareInfo(queue, share, index % len(PALETTE), strategy,
                                          bool(deleted))  # fmt: skip
    return found


def _chart(con, queue: str, unit: str, t0: float, t1: float,
           shares: dict[tuple[str, str], ShareInfo]) -> Chart:  # fmt: skip
    params = {"q": queue, "u": unit, "t1": t1}
    changes = con.execute(
        'SELECT seq, "at", quota_share, in_use, "limit", borrowed, lendable_idle, NULL '
        'FROM share_usage WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1 '
        'UNION ALL SELECT seq, "at", NULL, NULL, NULL, NULL, NULL, capacity FROM queue_usage '
        'WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1 ORDER BY seq, 3 NULLS LAST',
        params).fetchall()  # fmt: skip
    names = sorted({row[2] for row in changes if row[2] is not None},
                   key=lambda s: (list(shares).index((queue, s)) if (queue, s) in shares
                                  else len(shares), s))  # fmt: skip
    for name in names:  # a share the config tables do not know (should not happen): still drawn
        if (queue, name) not in shares:
            index = sum(1 for q, _ in shares if q == queue)
            shares[(queue, name)] = ShareInfo(queue, name, index % len(PALETTE), None, False)
    steps = _steps(changes, t0, t1)
    preemptions = [Preemption(*row) for row in con.execute(
        'SELECT p.seq, p."at", p.job_id, p.attempt, p.preemptor_job_id, p.reason, p.outcome, '
        "p.quota_share, p.preemptor_share FROM preemptions p WHERE p.job_queue = $q "
        'AND p."at" BETWEEN $t0 AND $t1 AND ($u IN (SELECT a.capacity_unit FROM allocations a '
        "WHERE a.job_id = p.job_id AND a.attempt = p.attempt) OR NOT EXISTS (SELECT 1 FROM "
        "allocations a WHERE a.job_id = p.job_id AND a.attempt = p.attempt)) ORDER BY p.seq",
        {**params, "t0": t0}).fetchall()]  # fmt: skip
    chart = Chart(queue, unit, names, steps, preemptions, t0, t1)
    for step in steps:
        d = step.b - step.a
        for name, s in step.shares.items():
            chart.used_s[name] = chart.used_s.get(name, 0.0) + s.in_use * d
            if s.borrowed:
                chart.borrowed_s[name] = chart.borrowed_s.get(name, 0.0) + s.borrowed * d
        for piece in attribute(step):
            if piece.lender is None:
                chart.unbacked_s[piece.borrower] = chart.unbacked_s.get(piece.borrower, 0.0) \
                    + piece.amount * d
            else:
                key = (piece.borrower, piece.lender)
                chart.lent_s[key] = chart.lent_s.get(key, 0.0) + piece.amount * d
    return chart


def _steps(changes: list[tuple], t0: float, t1: float) -> list[Step]:
    """The step function of every share and the capacity, clipped to [t0, t1)."""
    state: dict[str, ShareAt] = {}
    capacity = 0
    steps: list[Step] = []
    index = 0
    while index < len(changes):
        at = changes[index][1]
        while index < len(changes) and changes[index][1] <= at:  # every change at this instant
            _seq, _at, share, in_use, limit, borrowed, idle, cap = changes[index]
            if share is None:
                capacity = cap
            else:
                state[share] = ShareAt(in_use, limit, borrowed, idle)
            index += 1
        b = changes[index][1] if index < len(changes) else t1
        a, b = max(at, t0), min(b, t1)
        if b > a:
            if steps and steps[-1].capacity == capacity and steps[-1].shares == state \
                    and steps[-1].b == a:  # fmt: skip
                steps[-1].b = b
            else:
                steps.append(Step(a, b, capacity, dict(state)))
    return steps


# ---------------------------------------------------------------------------------- drawing


def _time_step(span: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                 10800, 14400, 21600, 43200, 86400, 172800, 604800):  # fmt: skip
        if span / step <= 10:
            return step
    return 604800 * math.ceil(span / 604800 / 10)


class TimeFormat:
    """Labels counted from the first fact: seconds for a short window, h:mm otherwise."""

    def __init__(self, origin: float, span: float, step: float):
        self.origin = origin
        self.seconds = span <= 180
        self.with_s = step < 60
        self.days = span >= 3 * 86400

    @property
    def unit(self) -> str:
        if self.seconds:
            return "seconds"
        return ("d h:mm" if self.days else "h:mm") + (":ss" if self.with_s else "")

    def __call__(self, t: float, exact: bool = False) -> str:
        rel = t - self.origin
        if self.seconds:
            return f"{rel:g}s"
        sign = "-" if rel < 0 else ""
        total = abs(rel)
        whole = int(total)
        h, rest = divmod(whole, 3600)
        m, s = divmod(rest, 60)
        days = ""
        if self.days:
            d, h = divmod(h, 24)
            days = f"{d}d "
        text = f"{sign}{days}{h}:{m:02d}"
        if self.with_s or exact:
            text += f":{s:02d}"
            if exact and total - whole > 1e-6:
                text += f"{total - whole:.3f}"[1:]
        return text


def _num(v: float) -> str:
    """An SVG coordinate."""
    text = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _qty(v: float) -> str:
    """Instance-seconds (or instances) for people: thousands separators, 1 decimal if needed."""
    if abs(v - round(v)) < 0.05:
        return f"{round(v):,}"
    return f"{v:,.1f}"


def _hours(v: float) -> str:
    return f"{v / 3600:,.2f} h"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _value_ticks(top: float) -> tuple[float, float]:
    """(tick step, axis maximum) for 0..top instances."""
    top = max(top, 1)
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000):
        if top / step <= 8:
            break
    else:
        step = 10 ** math.ceil(math.log10(top / 8))
    return step, math.ceil(top * 1.08 / step) * step


@dataclass
class Frame:
    """What one stretch [a, b) of a chart draws: a step of the step function, or (dense mode)
    the time average of the steps in one pixel column.  pieces: (borrower, lender or None) ->
    instances, in the order they are stacked."""

    a: float
    b: float
    capacity: float
    limit: dict[str, float]
    own: dict[str, float]
    pieces: dict[tuple[str, str | None], float]


def _ordered(chart: Chart, pieces: list[Piece]) -> dict[tuple[str, str | None], float]:
    rank = {name: index for index, name in enumerate(chart.shares)}
    pieces = sorted(pieces, key=lambda p: (rank.get(p.lender, len(rank)) if p.lender else
                                           len(rank), rank.get(p.borrower, len(rank))))  # fmt: skip
    return {(p.borrower, p.lender): p.amount for p in pieces}


def frames(chart: Chart, columns: int) -> tuple[list[Frame], bool]:
    """The frames to draw, and whether they are averages: a chart with more steps than
    MAX_EXACT_STEPS is drawn as `columns` time averages (the areas, so the instance-seconds,
    stay the same; the who-lent-to-whom table is always computed from the exact steps)."""
    if len(chart.steps) <= MAX_EXACT_STEPS:
        return [Frame(s.a, s.b, s.capacity, {n: x.limit for n, x in s.shares.items()},
                      {n: x.own for n, x in s.shares.items()}, _ordered(chart, attribute(s)))
                for s in chart.steps], False  # fmt: skip
    width = (chart.t1 - chart.t0) / columns
    sums = [Frame(chart.t0 + k * width, min(chart.t0 + (k + 1) * width, chart.t1), 0.0, {}, {},
                  {}) for k in range(columns)]  # fmt: skip
    for step in chart.steps:
        pieces = _ordered(chart, attribute(step))
        first = max(0, int((step.a - chart.t0) / width))
        last = min(columns - 1, int(math.ceil((step.b - chart.t0) / width)) - 1)
        for k in range(first, last + 1):
            frame = sums[k]
            d = min(step.b, frame.b) - max(step.a, frame.a)
            if d <= 0:
                continue
            frame.capacity += step.capacity * d
            for name, s in step.shares.items():
                frame.limit[name] = frame.limit.get(name, 0.0) + s.limit * d
                frame.own[name] = frame.own.get(name, 0.0) + s.own * d
            for key, amount in pieces.items():
                frame.pieces[key] = frame.pieces.get(key, 0.0) + amount * d
    for frame in sums:
        d = frame.b - frame.a
        frame.capacity /= d
        frame.limit = {n: v / d for n, v in frame.limit.items()}
        frame.own = {n: v / d for n, v in frame.own.items()}
        frame.pieces = _ordered(chart, [Piece(b, lender, v / d)
                                        for (b, lender), v in frame.pieces.items()])  # fmt: skip
    return sums, True


class _Scale:
    def __init__(self, chart: Chart, shown: list[Frame]):
        self.t0, self.t1 = chart.t0, chart.t1
        tops = [1.0]
        for frame in shown:
            unbacked = sum(v for (_, lender), v in frame.pieces.items() if lender is None)
            tops += [frame.capacity, sum(frame.limit.values()) + unbacked]
        self.y_step, self.y_max = _value_ticks(max(tops))
        self.plot_w = WIDTH - LEFT - RIGHT

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / (self.t1 - self.t0) * self.plot_w

    def y(self, v: float) -> float:
        return TOP + PLOT_H - v / self.y_max * PLOT_H


def _band_path(scale: _Scale, bands: list[tuple[float, float, float, float]]) -> str:
    """One path of step areas: bands (a, b, low, high) in time order; a run of touching steps
    becomes one polygon."""
    parts = []
    run: list[tuple[float, float, float, float]] = []

    def flush() -> None:
        if not run:
            return
        top = []
        bottom = []
        for a, b, low, high in run:
            top += [(scale.x(a), scale.y(high)), (scale.x(b), scale.y(high))]
            bottom += [(scale.x(a), scale.y(low)), (scale.x(b), scale.y(low))]
        points = top + bottom[::-1]
        parts.append("M" + " L".join(f"{_num(x)},{_num(y)}" for x, y in points) + " Z")
        run.clear()

    for band in bands:
        if band[3] - band[2] <= EPS:
            flush()
            continue
        if run and abs(run[-1][1] - band[0]) > EPS:
            flush()
        run.append(band)
    flush()
    return " ".join(parts)


def _step_line(scale: _Scale, points: list[tuple[float, float, float]]) -> str:
    """A step line through (a, b, value) segments."""
    path = []
    for index, (a, b, v) in enumerate(points):
        x_a, x_b, y = scale.x(a), scale.x(b), scale.y(v)
        if index and abs(points[index - 1][1] - a) <= EPS:
            path.append(f"L{_num(x_a)},{_num(y)} L{_num(x_b)},{_num(y)}")
        else:
            path.append(f"M{_num(x_a)},{_num(y)} L{_num(x_b)},{_num(y)}")
    return " ".join(path)


def _defs(report: Report) -> str:
    """Hatch patterns, one per share colour (userSpaceOnUse: they line up across rects)."""
    out = ['<svg class="defs" width="0" height="0" aria-hidden="true"><defs>']
    for index, (hue, dark) in enumerate(zip(PALETTE, DARK)):
        out.append(
            f'<pattern id="hatch-{index}" patternUnits="userSpaceOnUse" width="7" height="7" '
            f'patternTransform="rotate(45)"><rect width="7" height="7" fill="{hue}" '
            f'fill-opacity="0.35"/><rect width="3.2" height="7" fill="{dark}"/></pattern>'
        )  # fmt: skip
    out.append("</defs></svg>")
    return "".join(out)


def _marker_shape(shape: str, x: float, y: float, colour: str) -> str:
    """A marker whose top touches y (the time axis) and is centred on x."""
    r = MARKER / 2
    if shape == "triangle":
        pts = [(x, y), (x + r, y + MARKER), (x - r, y + MARKER)]
    elif shape == "diamond":
        pts = [(x, y), (x + r, y + r), (x, y + MARKER), (x - r, y + r)]
    else:
        return (f'<circle cx="{_num(x)}" cy="{_num(y + r)}" r="{_num(r - 0.5)}" '
                f'fill="{colour}" stroke="#fff" stroke-width="0.8"/>')  # fmt: skip
    points = " ".join(f"{_num(px)},{_num(py)}" for px, py in pts)
    return f'<polygon points="{points}" fill="{colour}" stroke="#fff" stroke-width="0.8"/>'


def _chart_svg(report: Report, chart: Chart, fmt: TimeFormat) -> tuple[str, bool]:
    """The chart's SVG, and whether it shows averages (dense mode)."""
    plot_w = WIDTH - LEFT - RIGHT
    shown, dense = frames(chart, int(plot_w))
    scale = _Scale(chart, shown)
    q, unit = chart.job_queue, chart.capacity_unit
    info = {name: report.shares[(q, name)] for name in chart.shares}
    plot_bottom = TOP + PLOT_H
    x0, x1 = scale.x(chart.t0), scale.x(chart.t1)

    # Preemption markers: stacked downwards where they would overlap (at most MAX_LANES).
    lanes: list[list[float]] = []
    placed = []
    for p in chart.preemptions:
        x = scale.x(p.at)
        lane = next((i for i, xs in enumerate(lanes) if all(abs(x - o) >= MARKER + 1 for o in xs)),
                    len(lanes))  # fmt: skip
        if lane == len(lanes):
            if len(lanes) < MAX_LANES:
                lanes.append([])
            else:
                lane = len(lanes) - 1
        lanes[lane].append(x)
        placed.append((p, x, lane))
    labels_y = plot_bottom + len(lanes) * (MARKER + MARKER_GAP) + 15
    height = labels_y + 30

    out = [f'<svg class="usage" width="{WIDTH}" height="{_num(height)}" '
           f'viewBox="0 0 {WIDTH} {_num(height)}" role="img" data-job-queue="{_e(q)}" '
           f'data-capacity-unit="{_e(unit)}" data-t0="{chart.t0!r}" data-t1="{chart.t1!r}" '
           f'data-mode="{"average" if dense else "exact"}">',
           f"<title>{_e(f'Job queue {q}, {unit}: usage per quota share')}</title>"]  # fmt: skip

    # Grid and value axis.
    out.append('<g class="grid">')
    v = 0
    while v <= scale.y_max + EPS:
        y = scale.y(v)
        out.append(f'<line x1="{_num(x0)}" y1="{_num(y)}" x2="{_num(x1)}" y2="{_num(y)}"/>'
                   f'<text class="tick" x="{_num(x0 - 6)}" y="{_num(y + 4)}" '
                   f'text-anchor="end">{_qty(v)}</text>')  # fmt: skip
        v += scale.y_step
    out.append("</g>")
    out.append(f'<text class="axis-title" transform="translate(16,{_num(TOP + PLOT_H / 2)}) '
               f'rotate(-90)" text-anchor="middle">instances of {_e(unit)}</text>')  # fmt: skip

    # Slots (tint) and own usage (solid), per share, from the bottom of the share's slot.
    bases = []  # per frame: (share -> bottom of its slot, top of the stacked slots)
    for frame in shown:
        base, acc = {}, 0.0
        for name in chart.shares:
            base[name] = acc
            acc += frame.limit.get(name, 0.0)
        bases.append((base, acc))
    for name in chart.shares:
        colour = info[name].colour
        slot = [(f.a, f.b, base[name], base[name] + f.limit.get(name, 0.0))
                for f, (base, _) in zip(shown, bases)]  # fmt: skip
        own = [(f.a, f.b, base[name], base[name] + f.own.get(name, 0.0))
               for f, (base, _) in zip(shown, bases)]  # fmt: skip
        title = (f"{name}: own quota in use (solid); its slot is its limit. "
                 f"{_qty(chart.used_s.get(name, 0.0))} instance-seconds used in the window, "
                 f"{_qty(chart.borrowed_s.get(name, 0.0))} of them borrowed")
        out.append(f'<g class="series" data-share="{_e(name)}">'
                   f'<path class="slot" d="{_band_path(scale, slot)}" fill="{PALETTE[colour]}" '
                   f'fill-opacity="0.13"/><path class="own" d="{_band_path(scale, own)}" '
                   f'fill="{PALETTE[colour]}"><title>{_e(title)}</title></path></g>')  # fmt: skip

    # Borrowed: inside the lenders' idle quota, or above the stacked slots when unbacked.
    out.append('<g class="borrowed-layer">')
    bands: dict[tuple[str, str | None], list[tuple[float, float, float, float]]] = {}
    for frame, (base, top_slot) in zip(shown, bases):
        fill = {name: base[name] + frame.own.get(name, 0.0) for name in chart.shares}
        above = top_slot
        for (borrower, lender), amount in frame.pieces.items():
            if lender is None:
                low, above = above, above + amount
            else:
                low = fill.get(lender, 0.0)
                fill[lender] = low + amount
            if dense:
                bands.setdefault((borrower, lender), []).append((frame.a, frame.b, low,
                                                                 low + amount))  # fmt: skip
            else:
                out.append(_borrowed_rect(scale, info, unit, fmt, frame, borrower, lender, low,
                                          amount))  # fmt: skip
    for (borrower, lender), parts in bands.items():
        colour = info[borrower].colour
        total = (chart.lent_s.get((borrower, lender), 0.0) if lender
                 else chart.unbacked_s.get(borrower, 0.0))  # fmt: skip
        title = (f"{borrower} borrowed from {_lender_text(lender)}: {_qty(total)} "
                 "instance-seconds in the window (time averages per pixel column)")
        out.append(f'<path class="borrowed" data-share="{_e(borrower)}" '
                   f'data-lender="{_e(lender or "")}" d="{_band_path(scale, parts)}" '
                   f'fill="url(#hatch-{colour})" stroke="{DARK[colour]}" stroke-width="0.4">'
                   f"<title>{_e(title)}</title></path>")  # fmt: skip
    out.append("</g>")

    # Stacked limits: the top of every slot, dashed.
    out.append('<g class="limits">')
    for name in chart.shares:
        if not any(f.limit.get(name, 0.0) for f in shown):
            continue
        points = [(f.a, f.b, base[name] + f.limit.get(name, 0.0))
                  for f, (base, _) in zip(shown, bases)]  # fmt: skip
        title = f"{name}'s limit: the top of its slot (the limits stacked up to {name})"
        out.append(f'<path class="limit" data-share="{_e(name)}" d="{_step_line(scale, points)}" '
                   f'stroke="{DARK[info[name].colour]}"><title>{_e(title)}</title></path>')
    out.append("</g>")

    # Capacity of the service environment.
    cap_points = [(f.a, f.b, f.capacity) for f in shown]
    out.append(f'<path class="capacity" d="{_step_line(scale, cap_points)}">'
               f"<title>service environment capacity (maxCapacity of {_e(unit)})</title></path>")

    # Axes.
    out.append(f'<line class="axis" x1="{_num(x0)}" y1="{_num(plot_bottom)}" x2="{_num(x1)}" '
               f'y2="{_num(plot_bottom)}"/><line class="axis" x1="{_num(x0)}" y1="{TOP}" '
               f'x2="{_num(x0)}" y2="{_num(plot_bottom)}"/>')  # fmt: skip
    step_t = _time_step(chart.t1 - chart.t0)
    k = math.ceil((chart.t0 - report.origin) / step_t - EPS)
    out.append('<g class="time-ticks">')
    while report.origin + k * step_t <= chart.t1 + EPS:
        x = scale.x(report.origin + k * step_t)
        out.append(f'<line class="tick-mark" x1="{_num(x)}" y1="{_num(plot_bottom)}" '
                   f'x2="{_num(x)}" y2="{_num(plot_bottom + 4)}"/>'
                   f'<text class="tick" x="{_num(x)}" y="{_num(labels_y)}" '
                   f'text-anchor="middle">{fmt(report.origin + k * step_t)}</text>')  # fmt: skip
        k += 1
    out.append("</g>")
    out.append(f'<text class="axis-title" x="{_num((x0 + x1) / 2)}" y="{_num(labels_y + 22)}" '
               f'text-anchor="middle">time since the first fact ({fmt.unit})</text>')  # fmt: skip

    out.append(_right_labels(chart, info, scale, x1))

    # Preemptions: a guide across the plot (unless there are too many) and a marker on the
    # time axis.
    out.append('<g class="preemptions">')
    guides = len(placed) <= MAX_GUIDES
    for p, x, lane in placed:
        colour, shape, _label = REASONS.get(p.reason, OTHER_REASON)
        y = plot_bottom + 1 + lane * (MARKER + MARKER_GAP)
        title = (f"{fmt(p.at, exact=True)} (at {p.at:g}): {p.preemptor_job_id} "
                 f"({p.preemptor_share or '?'}) preempted {p.job_id} attempt {p.attempt} "
                 f"({p.quota_share}) — {p.reason}, {p.outcome.lower()}")
        guide = (f'<line class="guide" x1="{_num(x)}" y1="{TOP}" x2="{_num(x)}" '
                 f'y2="{_num(plot_bottom)}" stroke="{colour}"/>' if guides else "")  # fmt: skip
        out.append(
            f'<g class="preemption" data-seq="{p.seq}" data-reason="{_e(p.reason)}" '
            f'data-victim="{_e(p.job_id)}" data-preemptor="{_e(p.preemptor_job_id)}" '
            f'data-at="{p.at!r}"><title>{_e(title)}</title>{guide}'
            f"{_marker_shape(shape, x, y, colour)}</g>"
        )  # fmt: skip
    out.append("</g></svg>")
    return "".join(out), dense


def _lender_text(lender: str | None) -> str:
    return f"{lender}'s idle quota" if lender else "no lender's idle quota (over the stacked limits)"


def _borrowed_rect(scale: _Scale, info: dict[str, ShareInfo], unit: str, fmt: TimeFormat,
                   frame: Frame, borrower: str, lender: str | None, low: float,
                   amount: float) -> str:  # fmt: skip
    """One borrowed piece of one step, with the exact interval and amount as data."""
    x_a, x_b = scale.x(frame.a), scale.x(frame.b)
    y_hi, y_lo = scale.y(low + amount), scale.y(low)
    colour = info[borrower].colour
    shown = _qty(amount) if amount >= 0.05 else f"{amount:.3f}"
    title = (f"{borrower} borrowed {shown} {unit} from {_lender_text(lender)}, "
             f"{fmt(frame.a, exact=True)}–{fmt(frame.b, exact=True)} "
             f"({_qty(amount * (frame.b - frame.a))} instance-seconds)")
    return (f'<rect class="borrowed" data-share="{_e(borrower)}" data-lender="{_e(lender or "")}" '
            f'data-from="{frame.a!r}" data-to="{frame.b!r}" data-amount="{amount!r}" '
            f'x="{_num(x_a)}" y="{_num(y_hi)}" width="{_num(max(x_b - x_a, MIN_WIDTH))}" '
            f'height="{_num(max(y_lo - y_hi, 0))}" fill="url(#hatch-{colour})" '
            f'stroke="{DARK[colour]}" stroke-width="0.6"><title>{_e(title)}</title></rect>')


def _right_labels(chart: Chart, info: dict[str, ShareInfo], scale: _Scale, x1: float) -> str:
    """Each slot's owner at the end of the window, and the capacity, pushed apart to read."""
    if not chart.steps:
        return ""
    last = chart.steps[-1]
    wanted = []
    acc = 0
    for name in chart.shares:
        s = last.shares.get(name, ShareAt())
        if s.limit > 0:
            wanted.append((scale.y(acc + s.limit / 2), f"{name} · limit {s.limit}",
                           DARK[info[name].colour], "slot-label"))  # fmt: skip
        acc += s.limit
    in_use = sum(s.in_use for s in last.shares.values())
    wanted.append((scale.y(last.capacity), f"capacity {last.capacity} · {in_use} in use",
                   "#111", "cap-label"))  # fmt: skip
    wanted.sort(key=lambda item: item[0])
    positions: list[float] = []
    for y, *_ in wanted:
        y = max(y, TOP + 4)
        if positions and y - positions[-1] < 14:
            y = positions[-1] + 14
        positions.append(y)
    overflow = positions[-1] - (TOP + PLOT_H - 2)
    if overflow > 0:
        positions = [p - overflow for p in positions]
    return "".join(f'<text class="{cls}" x="{_num(x1 + 8)}" y="{_num(y + 4)}" '
                   f'fill="{colour}">{_e(text)}</text>'
                   for (_, text, colour, cls), y in zip(wanted, positions))  # fmt: skip


def _swatch(kind: str, colour: int | str) -> str:
    if kind == "own":
        body = f'<rect x="1" y="1" width="20" height="12" fill="{PALETTE[colour]}"/>'
    elif kind == "borrowed":
        body = (f'<rect x="1" y="1" width="20" height="12" fill="url(#hatch-{colour})" '
                f'stroke="{DARK[colour]}" stroke-width="0.6"/>')  # fmt: skip
    elif kind == "slot":
        body = (f'<rect x="1" y="1" width="20" height="12" fill="{PALETTE[colour]}" '
                f'fill-opacity="0.13"/><line x1="1" y1="1.5" x2="21" y2="1.5" '
                f'stroke="{DARK[colour]}" stroke-width="1.5" stroke-dasharray="4 2"/>')  # fmt: skip
    elif kind == "capacity":
        body = '<line x1="1" y1="7" x2="21" y2="7" stroke="#111" stroke-width="2.2"/>'
    else:  # a preemption reason
        colour_, shape, _ = REASONS.get(kind, OTHER_REASON)
        body = _marker_shape(shape, 11, 1.5, colour_)
    return f'<svg class="swatch" width="22" height="14" aria-hidden="true">{body}</svg>'


def _lent_table(report: Report, chart: Chart) -> str:
    q, unit = chart.job_queue, chart.capacity_unit
    borrowers = [n for n in chart.shares if chart.borrowed_s.get(n, 0.0) > 0]
    if not borrowers:
        return (f'<p class="none">No quota share borrowed {_e(unit)} in this window: every share '
                f"stayed within its own limit.</p>")  # fmt: skip
    lenders = [n for n in chart.shares
               if sum(chart.lent_s.get((b, n), 0.0) for b in borrowers) > 0]  # fmt: skip
    unbacked = any(chart.unbacked_s.get(b, 0.0) > 0 for b in borrowers)
    hours = chart.t1 - chart.t0 >= 3600

    def cell(v: float, cls: str, extra: str = "") -> str:
        text = _qty(v) + (f' <span class="h">{_hours(v)}</span>' if hours and v >= 18 else "")
        return f'<td class="{cls}" data-value="{v!r}"{extra}>{text if v else "–"}</td>'

    def name_cell(name: str) -> str:
        colour = report.shares[(q, name)].colour
        return f'{_swatch("borrowed", colour)} {_e(name)}'

    out = [f'<table class="lent" data-job-queue="{_e(q)}" data-capacity-unit="{_e(unit)}">',
           f"<caption>Who lent to whom: {_e(unit)} instance-seconds"
           + (" (and instance-hours)" if hours else "") + " borrowed in the window</caption>",
           '<thead><tr><th class="corner">borrower ↓ · lender →</th>']  # fmt: skip
    for lender in lenders:
        colour = report.shares[(q, lender)].colour
        out.append(f'<th class="lender" data-lender="{_e(lender)}">'
                   f'{_swatch("slot", colour)} {_e(lender)}</th>')  # fmt: skip
    if unbacked:
        out.append('<th class="lender" data-lender="">not backed by idle quota</th>')
    out.append('<th class="total">total borrowed</th></tr></thead><tbody>')
    for b in borrowers:
        out.append(f'<tr data-borrower="{_e(b)}"><th>{name_cell(b)}</th>')
        for lender in lenders:
            out.append(cell(chart.lent_s.get((b, lender), 0.0), "lent",
                            f' data-lender="{_e(lender)}"'))  # fmt: skip
        if unbacked:
            out.append(cell(chart.unbacked_s.get(b, 0.0), "lent", ' data-lender=""'))
        out.append(cell(chart.borrowed_s[b], "total"))
        out.append("</tr>")
    out.append('</tbody><tfoot><tr class="lent-total"><th>total lent</th>')
    for lender in lenders:
        out.append(cell(sum(chart.lent_s.get((b, lender), 0.0) for b in borrowers), "lent",
                        f' data-lender="{_e(lender)}"'))  # fmt: skip
    if unbacked:
        out.append(cell(sum(chart.unbacked_s.get(b, 0.0) for b in borrowers), "lent",
                        ' data-lender=""'))  # fmt: skip
    out.append(cell(sum(chart.borrowed_s[b] for b in borrowers), "total"))
    out.append("</tr></tfoot></table>")
    return "".join(out)


def _summary(chart: Chart) -> str:
    """One sentence per borrower: the table, said."""
    sentences = []
    for b in chart.shares:
        total = chart.borrowed_s.get(b, 0.0)
        if total <= 0:
            continue
        sources = sorted(((v, lender) for (bb, lender), v in chart.lent_s.items()
                          if bb == b and v > 0), reverse=True)  # fmt: skip
        parts = [f"{_qty(v)} from {lender}" for v, lender in sources[:3]]
        if len(sources) > 3:
            rest = sum(v for v, _ in sources[3:])
            parts.append(f"{_qty(rest)} from {len(sources) - 3} other shares")
        if chart.unbacked_s.get(b, 0.0) > 0:
            parts.append(f"{_qty(chart.unbacked_s[b])} not backed by idle quota")
        sentences.append(f"<b>{_e(b)}</b> borrowed {_qty(total)} instance-seconds: "
                         + _e(", ".join(parts)) + ".")  # fmt: skip
    return f'<p class="summary">{" ".join(sentences)}</p>' if sentences else ""


def _share_legend(report: Report, chart: Chart) -> str:
    items = []
    for name in chart.shares:
        info = report.shares[(chart.job_queue, name)]
        limits: list[int] = []
        for step in chart.steps:
            if name in step.shares and (not limits or limits[-1] != step.shares[name].limit):
                limits.append(step.shares[name].limit)
        limit = " → ".join(str(v) for v in limits[:6]) + (" …" if len(limits) > 6 else "") \
            if limits else "0"
        what = (info.strategy or "?").replace("_", " ").lower()
        note = ", deleted" if info.deleted else ""
        items.append(
            f'<span class="share" data-share="{_e(name)}">{_swatch("own", info.colour)}'
            f'{_swatch("borrowed", info.colour)} <b>{_e(name)}</b> '
            f'<span class="meta">limit {_e(limit)}, {_e(what)}{note}</span></span>'
        )  # fmt: skip
    return f'<div class="shares">{"".join(items)}</div>' if items else ""


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
    preempted = sum(len(c.preemptions) for c in report.charts)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"/>',
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
    for note in report.notes:
        out.append(f'<p class="notes">{_e(note)}</p>')
    out.append(
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
        out.append(f'<section class="chart" data-job-queue="{_e(chart.job_queue)}" '
                   f'data-capacity-unit="{_e(chart.capacity_unit)}">'
                   f"<h3>{_e(chart.capacity_unit)}</h3>")  # fmt: skip
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
    out.append(
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
    return "".join(out) + "\n"


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
        height += 24 if len(chart.steps) > MAX_EXACT_STEPS else 0  # the averages note
        summary = re.sub(r"<[^>]+>", "", _summary(chart))
        height += 24 * math.ceil(len(summary) / 150) + 10
        borrowers = sum(1 for v in chart.borrowed_s.values() if v > 0)
        height += (borrowers + 2) * 30 + 80 if borrowers else 40
    return int(height * 1.04) + 200


# ---------------------------------------------------------------------------------- output


def chromium() -> str | None:
    """The headless browser that turns the HTML into a PNG, if one is installed
    ($QUOTASCHED_CHROMIUM overrides the search)."""
    for name in (os.environ.get("QUOTASCHED_CHROMIUM"), *CHROMIUM_NAMES):
        if name:
            found = shutil.which(name)
            if found:
                return found
    return None


def html_to_png(html_path: str, png_path: str, height: int, width: int = 1240) -> None:
    binary = chromium()
    if binary is None:
        raise ReportError(
            f"cannot write {png_path}: a PNG is rendered by headless Chromium and none is "
            f"installed (looked for {', '.join(CHROMIUM_NAMES)}; set QUOTASCHED_CHROMIUM to "
            "its path). Write the report as HTML instead: --out report.html")  # fmt: skip
    target = os.path.abspath(png_path)
    if os.path.exists(target):
        os.remove(target)
    with tempfile.TemporaryDirectory(prefix="quotasched-chromium-") as profile:
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   "--force-device-scale-factor=1", "--default-background-color=ffffffff",
                   f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={target}", Path(os.path.abspath(html_path)).as_uri()]  # fmt: skip
        try:
            result = subprocess.run(command, capture_output=True, timeout=180)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ReportError(f"{binary} failed to render {png_path}: {error}") from None
    if not os.path.exists(target) or not os.path.getsize(target):
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise ReportError(f"{binary} did not write {png_path} (exit {result.returncode}): "
                          + " | ".join(tail))  # fmt: skip


def build(db_path: str, job_queues: list[str] | None = None, t_from: float | None = None,
          t_to: float | None = None) -> Report:  # fmt: skip
    from projections import store

    with store.open(db_path, read_only=True) as projection:
        return load(projection.con, db_path, job_queues, t_from, t_to)


def write_report(db_path: str, out: str, job_queues: list[str] | None = None,
                 t_from: float | None = None, t_to: float | None = None) -> Report:  # fmt: skip
    """Write `out` (.html, or .png through headless Chromium); returns what was drawn."""
    suffix = Path(out).suffix.lower()
    if suffix not in (".html", ".htm", ".png"):
        raise ReportUsageError(f"--out {out}: the report is written as .html (or .png)")
    if suffix == ".png" and chromium() is None:
        html_to_png("", out, 0)  # raises the explanation before any work is done
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
