"""Loading: read the report from the projection through a Reader (readers.py): the window,
the shares, per job queue and capacity unit the usage step functions (`share_usage`, the
capacity from `capacity_changes`) with the exact who-lent-to-whom integrals, and per job queue
who waited and who was preempted (jobs.py).

Every statement is pinned to the position read first (`seq <= $pos`), so all of them see the
same facts, over NATS too.
"""

from __future__ import annotations

import math
from dataclasses import replace

from . import jobs
from .model import Chart, QueueReport, Report, ReportError, ReportUsageError, ShareAt, ShareInfo
from .model import Step, attribute, by_instant
from .readers import Reader
from .style import PALETTE
from .timeaxis import TimeAxis, time_step


def load(reader: Reader, job_queues: list[str] | None = None, t_from: float | None = None,
         t_to: float | None = None) -> Report:  # fmt: skip
    """Read everything the report shows."""
    (position, facts, last_at, origin), = reader.rows(
        'SELECT position, facts_applied, last_at, (SELECT min("at") FROM fact_log) '
        "FROM projection_state")  # fmt: skip
    if not facts:
        raise ReportError(f"{reader.source} holds no facts yet: nothing to chart")
    pos = {"pos": position}
    known = [row[0] for row in reader.rows(
        "SELECT job_queue FROM queue_config WHERE seq <= $pos GROUP BY job_queue "
        "ORDER BY min(seq)", pos)]  # fmt: skip
    if job_queues:
        unknown = [q for q in job_queues if q not in known]
        if unknown:
            raise ReportUsageError(f"no job queue {unknown[0]!r} in {reader.source}; it knows: "
                                   + (", ".join(known) or "none"))  # fmt: skip
        queues = [q for q in known if q in job_queues]
    else:
        queues = known
    axis = TimeAxis(origin, last_at)
    notes = []
    t1 = last_at if t_to is None else float(t_to)
    if t1 > last_at:
        notes.append(f"--to {axis.stamp(t1)} is after the last fact ({axis.stamp(last_at)}): "
                     "the charts end there")  # fmt: skip
        t1 = last_at
    if t_from is not None and not t1 > float(t_from):
        raise ReportUsageError(f"empty time window: from {axis.stamp(float(t_from))} to "
                               f"{axis.stamp(t1)} (the log runs from {axis.stamp(origin)} to "
                               f"{axis.stamp(last_at)})")  # fmt: skip
    if not t1 > origin:
        raise ReportError(f"every fact in {reader.source} is at the same instant "
                          f"({axis.stamp(origin)}) or --to is before the first fact: there is "
                          "no time to chart")  # fmt: skip
    shares = _shares(reader, queues, position)
    told = jobs.reasons(reader, {"t1": t1, **pos})
    if told is None:
        notes.append(f"over {jobs.FOLD_MAX:,} facts: why each job waits is not worked out here "
                     "(quotasched explain JOB tells one job's)")  # fmt: skip
    sections = []
    for queue in queues:
        t0 = _default_start(reader, queue, origin, t1, position) if t_from is None \
            else float(t_from)  # fmt: skip
        window = {"q": queue, "t0": t0, "t1": t1, **pos}
        units = [row[0] for row in reader.rows(
            "SELECT capacity_unit FROM share_changes WHERE job_queue = $q AND seq <= $pos "
            "UNION SELECT capacity_unit FROM capacity_changes WHERE job_queue = $q AND "
            "seq <= $pos ORDER BY 1", window)]  # fmt: skip
        preemptions = jobs.preemptions(reader, window)
        charts = [_chart(reader, window, unit, shares, preemptions) for unit in units]
        left = [replace(job, why_code=code, why=text) for job in jobs.waiting_at_end(reader, window)
                for code, text in [(told or {}).get(job.job_id, (None, None))]]  # fmt: skip
        sections.append(QueueReport(queue, t0, t1, charts, jobs.waiting(reader, window), left,
                                    preemptions))  # fmt: skip
    t0 = min((section.t0 for section in sections), default=origin)
    return Report(reader.source, facts, position, origin, last_at, t0, t1, sections, shares,
                  notes)  # fmt: skip


def _default_start(reader: Reader, queue: str, origin: float, t1: float, position: int) -> float:
    """Where a job queue's charts start: when the queue was created, unless it dispatched
    nothing in the first quarter of its life: then a round time (a tick of the axis) just
    before its first dispatch."""
    (created, first), = reader.rows(
        'SELECT (SELECT min("at") FROM queue_config WHERE job_queue = $q AND seq <= $pos), '
        '(SELECT min("at") FROM allocation_starts WHERE job_queue = $q AND seq <= $pos)',
        {"q": queue, "pos": position})  # fmt: skip
    created = origin if created is None or created >= t1 else created
    if first is None or first >= t1 or first - created <= 0.25 * (t1 - created):
        return created
    step = time_step(t1 - first)
    base = 0.0 if TimeAxis(origin).clock else origin  # a tick of the axis (timeaxis.py)
    return max(created, base + math.floor((first - base) / step) * step)


def _shares(reader: Reader, queues: list[str], position: int) -> dict[tuple[str, str], ShareInfo]:
    rows = reader.rows(
        "SELECT job_queue, quota_share, min(seq) AS created, "
        "arg_max(strategy, seq) FILTER (WHERE NOT deleted) AS strategy, "
        "arg_max(deleted, seq) AS deleted FROM share_config "
        "WHERE list_contains($queues, job_queue) AND seq <= $pos "
        "GROUP BY ALL ORDER BY created", {"queues": queues, "pos": position})  # fmt: skip
    found: dict[tuple[str, str], ShareInfo] = {}
    count: dict[str, int] = {}
    for queue, share, _created, strategy, deleted in rows:
        index = count.get(queue, 0)
        count[queue] = index + 1
        found[(queue, share)] = ShareInfo(queue, share, index % len(PALETTE), strategy,
                                          bool(deleted))  # fmt: skip
    return found


def _chart(reader: Reader, window: dict, unit: str, shares: dict[tuple[str, str], ShareInfo],
           preemptions: list) -> Chart:  # fmt: skip
    queue, t0, t1 = window["q"], window["t0"], window["t1"]
    changes = reader.rows(
        'SELECT seq, "at", quota_share, in_use, "limit", borrowed, lendable_idle, NULL '
        'FROM share_usage WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1 '
        "AND seq <= $pos UNION ALL "
        'SELECT seq, "at", NULL, NULL, NULL, NULL, NULL, capacity FROM capacity_changes '
        'WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1 AND seq <= $pos '
        "ORDER BY seq, quota_share NULLS LAST", {**window, "u": unit})  # fmt: skip
    order = list(shares)
    names = sorted({row[2] for row in changes if row[2] is not None},
                   key=lambda s: (order.index((queue, s)) if (queue, s) in shares
                                  else len(order), s))  # fmt: skip
    for name in names:  # a share the config tables do not know (should not happen): still drawn
        if (queue, name) not in shares:
            index = sum(1 for q, _ in shares if q == queue)
            shares[(queue, name)] = ShareInfo(queue, name, index % len(PALETTE), None, False)
    steps = _steps(changes, t0, t1)
    marked = [p for p in preemptions if unit in p.units or not p.units]
    chart = Chart(queue, unit, names, steps, marked, t0, t1)
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
    for group, a, b in by_instant(changes, t0, t1):
        for _seq, _at, share, in_use, limit, borrowed, idle, cap in group:
            if share is None:
                capacity = cap
            else:
                state[share] = ShareAt(in_use, limit, borrowed, idle)
        if b > a:
            last = steps[-1] if steps else None
            if last is not None and (last.capacity, last.shares, last.b) == (capacity, state, a):
                last.b = b
            else:
                steps.append(Step(a, b, capacity, dict(state)))
    return steps
