"""How the report writes times: one rule for the whole page, chosen from the first fact.

- A log on a real clock (the first fact's `at` is 1e9 or more, i.e. after 2001-09-09: every
  live service's log) is shown in UTC: axis ticks "08:00" (with the date, "2026-12-01 08:00",
  on the first tick and on every new day), tables and header in ISO ("2026-12-01T08:00:00Z",
  to the millisecond when the whole log is shorter than PRECISE_BELOW_S).
- A log on a logical clock (a replayed example whose `at` starts at 0) is shown as time
  elapsed since the first fact: "+1 h 30 min", never as a clock time it does not mean.

The threshold is `explain`'s (services/explain/story.py `when`), so both commands read a log
the same way.  Tick positions are multiples of a round step: on the UTC clock they fall on
whole minutes, hours and days; elapsed, on whole steps after the first fact.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from quotasched.services.explain.story import duration, when

EPOCH_FROM = 1e9  # an `at` at least this large is seconds since 1970 (UTC)
PRECISE_BELOW_S = 600  # a log shorter than this is stamped to the millisecond
STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120,
         300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 43200, 86400, 172800,
         604800)  # fmt: skip
MAX_TICKS = 10


def time_step(span: float) -> float:
    """The round tick step that cuts `span` seconds into at most MAX_TICKS parts."""
    for step in STEPS:
        if span / step <= MAX_TICKS:
            return step
    return 604800 * math.ceil(span / 604800 / MAX_TICKS)


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, timezone.utc)


def elapsed(seconds: float) -> str:
    """+1 h 30 min, +45 s, +2 d 3 h; -5 min before the first fact."""
    sign = "-" if seconds < 0 else "+"
    seconds = abs(seconds)
    if 0 < seconds < 1:
        return f"{sign}{round(seconds, 3):g} s"
    if seconds >= 86400:
        days, rest = divmod(int(round(seconds)), 86400)
        hours = rest // 3600
        return f"{sign}{days} d {hours} h" if hours else f"{sign}{days} d"
    return sign + duration(seconds)


class TimeAxis:
    """The page's time rule (module docstring): ticks, axis title and stamps."""

    def __init__(self, origin: float, last_at: float | None = None):
        self.origin = origin
        self.clock = origin >= EPOCH_FROM
        self.precise = last_at is not None and last_at - origin < PRECISE_BELOW_S

    @property
    def mode(self) -> str:
        return "utc" if self.clock else "elapsed"

    @property
    def title(self) -> str:
        if self.clock:
            return "time (UTC)"
        return "time since the first fact (the log's times are logical seconds, not a clock)"

    def stamp(self, at: float) -> str:
        """A time in the header and the tables: ISO (UTC), or elapsed with the logical time."""
        if self.clock:
            spec = "milliseconds" if self.precise else "seconds"
            return _utc(at).isoformat(timespec=spec).replace("+00:00", "Z")
        return f"{elapsed(at - self.origin)} ({when(at)})"

    def ticks(self, t0: float, t1: float) -> list[dict]:
        """[{value, label}, ...]: the axis ticks of [t0, t1], at multiples of a round step."""
        step = time_step(t1 - t0)
        base = 0.0 if self.clock else self.origin
        first = math.ceil((t0 - base) / step - 1e-9)
        last = math.floor((t1 - base) / step + 1e-9)
        values = [base + k * step for k in range(first, last + 1)]
        digits = max(0, -math.floor(math.log10(step) + 1e-9))  # 0.1 s: 1, 0.05 s: 2
        labels, day = [], None
        for value in values:
            if self.clock:
                moment = _utc(round(value, digits))
                text = moment.strftime("%H:%M:%S" if step < 60 else "%H:%M")
                if digits:  # tenths, hundredths or thousandths of a second
                    text += f"{moment.microsecond / 1e6:.{digits}f}"[1:]
                if moment.date() != day:
                    text = f"{moment:%Y-%m-%d} {text}"
                    day = moment.date()
            else:
                text = elapsed(value - self.origin)
            labels.append(text)
        return [{"value": v, "label": text} for v, text in zip(values, labels)]
