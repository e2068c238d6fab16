"""The charts' data, as the page's script hands it to Chart.js: per chart its time window, axis
ticks and datasets, each a list of [t, value] points of a step function (the value holds from
its t to the next point's; the last point closes the window at t1).  `t` is always the facts'
`at`; only the tick labels depend on the page's time rule (timeaxis.py).

A usage chart (job queue x capacity unit) stacks, bottom up, every share's own-quota usage
(min(in use, limit), solid) then every share's borrowed usage (beyond its limit, hatched in its
colour); on a second stack the capacity line and, on top of it, what is in use above it
(hatched red on an opaque wash, drawn over the shares' areas): the stacked usage never
silently crosses the line.  Preemptions are markers at the bottom, one dataset per reason.  A waiting chart (per job queue) stacks per share the jobs
waiting and, hatched, those blocked.

A chart whose step function has more than MAX_EXACT_STEPS changes is resampled to
AVERAGE_COLUMNS equal columns holding time averages: the areas, so the instance-seconds
(job-seconds for waiting), stay the same, and the page stays a few MB.
"""

from __future__ import annotations

from typing import Any

from quotasched.events.labels import job_label

from . import style
from .model import Chart, QueueReport, ShareInfo
from .timeaxis import TimeAxis

Interval = tuple[float, float, dict[Any, float]]  # [a, b) and the value of every key


def points(intervals: list[Interval], keys: list, t0: float, t1: float
           ) -> tuple[dict[Any, list[list[float]]], bool]:  # fmt: skip
    """Each key's step points over [t0, t1] (0 where no interval covers), and whether they
    are column averages."""
    averaged = len(intervals) > style.MAX_EXACT_STEPS  # read at call time: tests lower it
    if averaged:
        intervals = _averages(intervals, keys, t0, t1, style.AVERAGE_COLUMNS)
    elif not intervals or intervals[0][0] > t0:
        intervals = [(t0, intervals[0][0] if intervals else t1, {}), *intervals]
    found: dict[Any, list[list[float]]] = {key: [] for key in keys}
    for a, _b, values in intervals:
        for key in keys:
            found[key].append([a, values.get(key, 0)])
    for key in keys:
        found[key].append([t1, found[key][-1][1]])
    return found, averaged


def _averages(intervals: list[Interval], keys: list, t0: float, t1: float,
              columns: int) -> list[Interval]:  # fmt: skip
    width = (t1 - t0) / columns
    sums = [{key: 0.0 for key in keys} for _ in range(columns)]
    for a, b, values in intervals:
        first = max(0, int((a - t0) / width))
        last = min(columns - 1, int((b - t0) / width))
        for k in range(first, last + 1):
            overlap = min(b, t0 + (k + 1) * width) - max(a, t0 + k * width)
            if overlap > 0:
                for key in keys:
                    sums[k][key] += values.get(key, 0) * overlap
    return [(t0 + k * width, t0 + (k + 1) * width, {key: v / width for key, v in sums[k].items()})
            for k in range(columns)]  # fmt: skip


def _area(label: str, key: str, stack: str, fill: str, colour: str, hatch: bool,
          data: list) -> dict:  # fmt: skip
    return {"label": label, "key": key, "kind": "area", "stack": stack, "fill": fill,
            "colour": colour, "hatch": hatch, "points": data}  # fmt: skip


def usage_chart(chart: Chart, shares: dict[tuple[str, str], ShareInfo], axis: TimeAxis) -> dict:
    intervals: list[Interval] = []
    for step in chart.steps:
        values: dict[Any, float] = {"capacity": step.capacity, "over": step.over_capacity}
        for name, share in step.shares.items():
            values[("own", name)] = share.own
            values[("borrowed", name)] = share.borrowed
        intervals.append((step.a, step.b, values))
    borrowers = [name for name in chart.shares if chart.borrowed_s.get(name, 0) > 0]
    keys = [*(("own", n) for n in chart.shares), *(("borrowed", n) for n in borrowers),
            "capacity", "over"]  # fmt: skip
    found, averaged = points(intervals, keys, chart.t0, chart.t1)
    colour = {n: style.PALETTE[shares[(chart.job_queue, n)].colour] for n in chart.shares}
    datasets = []
    for index, name in enumerate(chart.shares):
        datasets.append(_area(f"{name}: own quota in use", f"own:{name}", "usage",
                              "origin" if index == 0 else "-1", colour[name], False,
                              found[("own", name)]))  # fmt: skip
    for name in borrowers:
        datasets.append(_area(f"{name}: borrowed beyond its limit", f"borrowed:{name}", "usage",
                              "-1", colour[name], True, found[("borrowed", name)]))  # fmt: skip
    datasets.append({"label": "capacity (service environment)", "key": "capacity",
                     "kind": "line", "stack": "capacity", "colour": style.CAPACITY,
                     "points": found["capacity"]})  # fmt: skip
    if chart.over_capacity():
        over = _area("in use above capacity", "over", "capacity", "-1", style.OVER, True,
                     found["over"])  # fmt: skip
        datasets.append({**over, "background": style.OVER_BACKGROUND})  # hides what is under
    datasets += _markers(chart)
    return {"kind": "usage", "jobQueue": chart.job_queue, "capacityUnit": chart.capacity_unit,
            "t0": chart.t0, "t1": chart.t1, "averaged": averaged,
            "ticks": axis.ticks(chart.t0, chart.t1),
            "yTitle": f"instances of {chart.capacity_unit}", "datasets": datasets}  # fmt: skip


def _markers(chart: Chart) -> list[dict]:
    by_reason: dict[str, list[dict]] = {}
    for p in chart.preemptions:
        victim = job_label(p.job_id, p.job_name or "")
        by = job_label(p.preemptor_job_id, p.preemptor_name or "")
        text = (f"{victim} of {p.quota_share} preempted by {by} of {p.preemptor_share}: "
                f"{p.reason}, {p.outcome}")  # fmt: skip
        by_reason.setdefault(p.reason, []).append({"x": p.at, "y": 0, "text": text})
    return [{"label": f"preemption: {style.REASONS.get(reason, (None, reason))[1]}",
             "key": f"preemption:{reason}", "kind": "marker", "stack": "markers",
             "colour": style.REASONS.get(reason, style.OTHER_REASON)[0], "points": marks}
            for reason, marks in by_reason.items()]  # fmt: skip


def waiting_chart(queue: QueueReport, shares: dict[tuple[str, str], ShareInfo],
                  axis: TimeAxis) -> dict | None:  # fmt: skip
    """Jobs waiting per share over the window; None when no job waited in it."""
    names = [n for (q, n) in shares if q == queue.job_queue
             and any(step.shares.get(n, (0, 0))[0] for step in queue.waiting)]  # fmt: skip
    if not names:
        return None
    intervals: list[Interval] = []
    for step in queue.waiting:
        values: dict[Any, float] = {}
        for name, (waiting, blocked) in step.shares.items():
            values[("waiting", name)] = waiting - blocked  # not blocked
            values[("blocked", name)] = blocked
        intervals.append((step.a, step.b, values))
    blockers = [n for n in names if any(step.shares.get(n, (0, 0))[1] for step in queue.waiting)]
    keys = [*(("waiting", n) for n in names), *(("blocked", n) for n in blockers)]
    found, averaged = points(intervals, keys, queue.t0, queue.t1)
    colour = {n: style.PALETTE[shares[(queue.job_queue, n)].colour] for n in names}
    datasets = [_area(f"{n}: waiting for capacity or its turn", f"waiting:{n}", "waiting",
                      "origin" if i == 0 else "-1", colour[n], False, found[("waiting", n)])
                for i, n in enumerate(names)]  # fmt: skip
    datasets += [_area(f"{n}: blocked (can never fit as configured)", f"blocked:{n}", "waiting",
                       "-1", colour[n], True, found[("blocked", n)]) for n in blockers]
    return {"kind": "waiting", "jobQueue": queue.job_queue, "capacityUnit": None,
            "t0": queue.t0, "t1": queue.t1, "averaged": averaged,
            "ticks": axis.ticks(queue.t0, queue.t1), "yTitle": "jobs waiting",
            "datasets": datasets}  # fmt: skip
