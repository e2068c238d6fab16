"""One chart as SVG: per job queue and capacity unit, the share slots and own usage, the
borrowed pieces drawn in their lenders' idle quota, the stacked limits, the capacity line, the
axes, the right-hand labels and the preemption markers.

The layers are drawn in that order (later ones on top); each helper returns one layer.
"""

from __future__ import annotations

import math

from .formatting import TimeFormat, _e, _num, _qty, _time_step
from .frames import Frame, _band_path, _Scale, _step_line, frames
from .model import Chart, Preemption, Report, ShareAt, ShareInfo
from .style import DARK, EPS, LEFT, MARKER, MARKER_GAP, MAX_GUIDES, MAX_LANES, MIN_WIDTH
from .style import OTHER_REASON, PALETTE, PLOT_H, REASONS, RIGHT, TOP, WIDTH
from .symbols import _marker_shape

# Per frame: (share -> bottom of its slot, top of the stacked slots).
Bases = list[tuple[dict[str, float], float]]


def _chart_svg(report: Report, chart: Chart, fmt: TimeFormat) -> tuple[str, bool]:
    """The chart's SVG, and whether it shows averages (dense mode)."""
    plot_w = WIDTH - LEFT - RIGHT
    shown, dense = frames(chart, int(plot_w))
    scale = _Scale(chart, shown)
    q, unit = chart.job_queue, chart.capacity_unit
    info = {name: report.shares[(q, name)] for name in chart.shares}
    plot_bottom = TOP + PLOT_H
    x0, x1 = scale.x(chart.t0), scale.x(chart.t1)

    placed, lane_count = _place_preemptions(chart, scale)
    labels_y = plot_bottom + lane_count * (MARKER + MARKER_GAP) + 15
    height = labels_y + 30

    out = [f'<svg class="usage" width="{WIDTH}" height="{_num(height)}" '
           f'viewBox="0 0 {WIDTH} {_num(height)}" role="img" data-job-queue="{_e(q)}" '
           f'data-capacity-unit="{_e(unit)}" data-t0="{chart.t0!r}" data-t1="{chart.t1!r}" '
           f'data-mode="{"average" if dense else "exact"}">',
           f"<title>{_e(f'Job queue {q}, {unit}: usage per quota share')}</title>"]  # fmt: skip
    out.append(_value_grid(scale, unit, x0, x1))
    bases = _slot_bases(chart, shown)
    out.append(_share_series(chart, info, scale, shown, bases))
    out.append(_borrowed_layer(chart, info, scale, fmt, shown, bases, dense))
    out.append(_limit_lines(chart, info, scale, shown, bases))

    # Capacity of the service environment.
    cap_points = [(f.a, f.b, f.capacity) for f in shown]
    out.append(f'<path class="capacity" d="{_step_line(scale, cap_points)}">'
               f"<title>service environment capacity (maxCapacity of {_e(unit)})</title></path>")

    out.append(_time_axis(report, chart, scale, fmt, labels_y))
    out.append(_right_labels(chart, info, scale, x1))
    out.append(_preemption_marks(placed, fmt))
    out.append("</svg>")
    return "".join(out), dense


def _place_preemptions(chart: Chart, scale: _Scale) -> tuple[list[tuple[Preemption, float, int]],
                                                             int]:  # fmt: skip
    """Preemption markers: stacked downwards where they would overlap (at most MAX_LANES).
    Returns (preemption, x, lane) per marker, and the number of lanes used."""
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
    return placed, len(lanes)


def _value_grid(scale: _Scale, unit: str, x0: float, x1: float) -> str:
    """Grid and value axis."""
    out = ['<g class="grid">']
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
    return "".join(out)


def _slot_bases(chart: Chart, shown: list[Frame]) -> Bases:
    """Per frame: (share -> bottom of its slot, top of the stacked slots)."""
    bases = []
    for frame in shown:
        base, acc = {}, 0.0
        for name in chart.shares:
            base[name] = acc
            acc += frame.limit.get(name, 0.0)
        bases.append((base, acc))
    return bases


def _share_series(chart: Chart, info: dict[str, ShareInfo], scale: _Scale, shown: list[Frame],
                  bases: Bases) -> str:  # fmt: skip
    """Slots (tint) and own usage (solid), per share, from the bottom of the share's slot."""
    out = []
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
    return "".join(out)


def _borrowed_layer(chart: Chart, info: dict[str, ShareInfo], scale: _Scale, fmt: TimeFormat,
                    shown: list[Frame], bases: Bases, dense: bool) -> str:  # fmt: skip
    """Borrowed: inside the lenders' idle quota, or above the stacked slots when unbacked.
    Exact frames draw one rect per piece; dense frames one band per (borrower, lender)."""
    unit = chart.capacity_unit
    out = ['<g class="borrowed-layer">']
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
    return "".join(out)


def _limit_lines(chart: Chart, info: dict[str, ShareInfo], scale: _Scale, shown: list[Frame],
                 bases: Bases) -> str:  # fmt: skip
    """Stacked limits: the top of every slot, dashed."""
    out = ['<g class="limits">']
    for name in chart.shares:
        if not any(f.limit.get(name, 0.0) for f in shown):
            continue
        points = [(f.a, f.b, base[name] + f.limit.get(name, 0.0))
                  for f, (base, _) in zip(shown, bases)]  # fmt: skip
        title = f"{name}'s limit: the top of its slot (the limits stacked up to {name})"
        out.append(f'<path class="limit" data-share="{_e(name)}" d="{_step_line(scale, points)}" '
                   f'stroke="{DARK[info[name].colour]}"><title>{_e(title)}</title></path>')
    out.append("</g>")
    return "".join(out)


def _time_axis(report: Report, chart: Chart, scale: _Scale, fmt: TimeFormat,
               labels_y: float) -> str:  # fmt: skip
    """Axes, and the time ticks counted from the first fact."""
    plot_bottom = TOP + PLOT_H
    x0, x1 = scale.x(chart.t0), scale.x(chart.t1)
    out = [f'<line class="axis" x1="{_num(x0)}" y1="{_num(plot_bottom)}" x2="{_num(x1)}" '
           f'y2="{_num(plot_bottom)}"/><line class="axis" x1="{_num(x0)}" y1="{TOP}" '
           f'x2="{_num(x0)}" y2="{_num(plot_bottom)}"/>']  # fmt: skip
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
    return "".join(out)


def _preemption_marks(placed: list[tuple[Preemption, float, int]], fmt: TimeFormat) -> str:
    """Preemptions: a guide across the plot (unless there are too many) and a marker on the
    time axis."""
    plot_bottom = TOP + PLOT_H
    out = ['<g class="preemptions">']
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
    out.append("</g>")
    return "".join(out)


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

