"""How the report writes numbers, times and text: time-axis steps and labels (TimeFormat),
SVG coordinates, instance-second quantities, value-axis ticks and HTML escaping.
"""

from __future__ import annotations

import html
import math
from typing import Any


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
