"""The window utilization is measured over: the same seconds for every run compared on a trace.

By default the trace's submit span, from its first submission to its last.  It depends on
the trace alone, so every configuration and every `--pool` size compared on one trace is
measured over the same seconds.  (Dividing by each run's own makespan measured how soon a run
finished rather than how busy its pool was: one starved share stretching the makespan made a
busier pool read emptier; issue 22.)  `--window START:END` chooses another window, in seconds
after the first submission, or with a unit: `7d:50d`, `:30d`, `12h:`.

Work is clipped to the window:

    utilization = instance-seconds held inside the window / capacity instance-seconds inside it

both integrals of step functions (`step_area`), so a pool whose capacity changes during a run
is measured the same way as a fixed one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quotasched.services.simulate.trace import Trace

UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BOUND = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*")


class WindowError(ValueError):
    """A `--window` that cannot be measured over; the message says why."""


@dataclass(frozen=True)
class Window:
    start: float  # on the trace's clock (submit_time_s)
    end: float
    origin: float  # the first submission: printed bounds count from it
    chosen: bool = False  # True: given with --window; False: the trace's submit span

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def describe(self) -> str:
        """'the trace's submit span, 0 s – 60 d 1 h after the first submission'."""
        what = "--window" if self.chosen else "the trace's submit span"
        bounds = f"{span_words(self.start - self.origin)} – {span_words(self.end - self.origin)}"
        empty = "" if self.seconds > 0 else " (empty: every job is submitted at once; choose " \
                                            "a window with --window START:END)"
        return f"{what}, {bounds} after the first submission{empty}"


def submit_span(trace: Trace) -> Window:
    """From the trace's first submission to its last (the rows are in submission order)."""
    first = trace.submit[0] if len(trace) else 0.0
    last = trace.submit[-1] if len(trace) else 0.0
    return Window(first, last, first)


def parse_window(text: str, trace: Trace) -> Window:
    """`START:END` in seconds after the first submission (units s, m, h, d allowed); an empty
    START is the first submission, an empty END the last one."""
    span = submit_span(trace)
    head, colon, tail = text.partition(":")
    if not colon:
        raise WindowError(f"--window {text}: expected START:END, e.g. 0:86400 or 7d:50d")
    start = _bound(head, text) if head.strip() else 0.0
    end = _bound(tail, text) if tail.strip() else span.end - span.origin
    if end <= start:
        raise WindowError(f"--window {text}: END must come after START "
                          f"({span_words(end)} is not after {span_words(start)})")  # fmt: skip
    return Window(span.origin + start, span.origin + end, span.origin, chosen=True)


def _bound(part: str, text: str) -> float:
    match = _BOUND.fullmatch(part)
    if match is None:
        raise WindowError(f"--window {text}: {part.strip()!r} is not a time: seconds, or a "
                          "number with s, m, h or d")  # fmt: skip
    return float(match.group(1)) * UNIT_S[match.group(2)]


def step_area(times: list[float], levels: list[int], start: float, end: float) -> float:
    """The integral over [start, end) of the step function that is levels[i] from times[i]
    until times[i + 1] (the last level holds for ever)."""
    area = 0.0
    until = times[1:] + [max(end, times[-1])] if times else []
    for lo, hi, level in zip(times, until, levels):
        if level and hi > start and lo < end:
            area += level * (min(hi, end) - max(lo, start))
    return area


def span_words(seconds: float) -> str:
    """0 s, 45 s, 12 min, 3 h 20 min, 60 d 1 h: at most two units, the smaller rounded."""
    if seconds < 60:
        return f"{seconds:g} s" if seconds == int(seconds) else f"{seconds:.1f} s"
    for big, small, big_s, small_s in (("d", "h", 86400, 3600), ("h", "min", 3600, 60)):
        if seconds >= big_s:
            whole, rest = divmod(round(seconds / small_s), big_s // small_s)
            return f"{whole} {big} {rest} {small}" if rest else f"{whole} {big}"
    return f"{round(seconds / 60)} min"
