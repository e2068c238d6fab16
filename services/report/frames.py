"""What a chart draws, before it is SVG: the frames (exact steps, or per-pixel-column time
averages for a dense chart), the value/time scale, and the step-area and step-line paths.

Dense mode keeps areas, so the instance-seconds a frame shows equal the exact steps'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import style
from .formatting import _num, _value_ticks
from .model import Chart, Piece, attribute
from .style import EPS, LEFT, PLOT_H, RIGHT, TOP, WIDTH

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
    if len(chart.steps) <= style.MAX_EXACT_STEPS:  # read at call time: tests lower it
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
