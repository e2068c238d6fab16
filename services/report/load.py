"""Loading: read a report's step functions, shares and preemptions from an open projection
connection (the `share_usage`, `queue_usage`, `preemptions` and config tables) into the model,
with the exact who-lent-to-whom integrals per chart.
"""

from __future__ import annotations

import math

from .formatting import _time_step
from .model import Chart, Preemption, Report, ReportError, ReportUsageError, ShareAt, ShareInfo
from .model import Step, attribute
from .style import PALETTE


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
