"""The report's data model: what loading reads from the projection and the page shows -- per
job queue its usage charts (one per capacity unit), who waited, and its preemptions -- the
errors the report raises, and `attribute`, the who-lent-to-whom rule (explained in the
services.report docstring).

A Step holds every share's usage and the capacity constant over [a, b); a WaitStep the number
of waiting and blocked jobs per share.  A Chart's `borrowed_s`, `lent_s`, `unbacked_s` and
`used_s` are integrals over its exact steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


class ReportError(RuntimeError):
    """The report cannot be made (no facts, no Chromium for a PNG ...)."""


class ReportUsageError(ReportError):
    """The request itself is wrong: unknown job queue, empty window, unknown output type."""


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

    @property
    def in_use(self) -> int:
        return sum(share.in_use for share in self.shares.values())

    @property
    def over_capacity(self) -> int:
        """Instances in use above the capacity: possible only after the capacity was lowered
        under running jobs (lowering preempts nothing, spec ruling 3)."""
        return max(0, self.in_use - self.capacity)


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
    job_name: str | None = None
    preemptor_name: str | None = None
    units: tuple[str, ...] = ()  # the capacity units the victim's attempt held


@dataclass(frozen=True)
class OverCapacity:
    """A stretch [a, b) in which a chart's usage stayed above its capacity."""

    a: float
    b: float
    most: int  # the largest excess, instances
    in_use: int  # usage and capacity when the excess was largest
    capacity: int
    instance_s: float  # the excess integrated over the stretch


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

    def over_capacity(self) -> list[OverCapacity]:
        """The stretches over capacity, touching steps merged."""
        found: list[OverCapacity] = []
        for step in self.steps:
            excess = step.over_capacity
            if not excess:
                continue
            last = found[-1] if found else None
            if last is not None and last.b == step.a:
                worst = excess > last.most
                found[-1] = OverCapacity(
                    last.a, step.b, max(excess, last.most),
                    step.in_use if worst else last.in_use,
                    step.capacity if worst else last.capacity,
                    last.instance_s + excess * (step.b - step.a))  # fmt: skip
            else:
                found.append(OverCapacity(step.a, step.b, excess, step.in_use, step.capacity,
                                          excess * (step.b - step.a)))  # fmt: skip
        return found


@dataclass
class WaitStep:
    """[a, b): per share, (jobs waiting to run, of them blocked by a ShareBlocked reason)."""

    a: float
    b: float
    shares: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class WaitingJob:
    """A job RUNNABLE at the end of the window, and why."""

    job_id: str
    job_name: str
    quota_share: str
    priority: int | None
    since: float  # since when it has been RUNNABLE without a break
    blocked_reason: str | None  # the ShareBlocked statusReason, while it stands
    status_reason: str | None  # the last status reason otherwise (a preemption, a retry)
    why: str | None = None  # why it waits at t1, as the scheduler's core says it (jobs.reasons)
    why_code: str | None = None


@dataclass
class QueueReport:
    job_queue: str
    t0: float
    t1: float
    charts: list[Chart]
    waiting: list[WaitStep]
    waiting_at_end: list[WaitingJob]
    preemptions: list[Preemption]


@dataclass
class ShareInfo:
    job_queue: str
    name: str
    colour: int  # index into PALETTE
    strategy: str | None
    deleted: bool


@dataclass
class Report:
    source: str  # the DuckDB file, or the projector read over NATS
    facts: int
    last_seq: int  # the projection's position: every query read up to this fact
    origin: float  # `at` of the first fact
    last_at: float
    t0: float  # the earliest queue's start (queues start each at their own unless --from)
    t1: float
    queues: list[QueueReport]
    shares: dict[tuple[str, str], ShareInfo]
    notes: list[str] = field(default_factory=list)

    @property
    def charts(self) -> list[Chart]:
        return [chart for queue in self.queues for chart in queue.charts]


def by_instant(changes: list[tuple], t0: float, t1: float
               ) -> Iterator[tuple[list[tuple], float, float]]:  # fmt: skip
    """Changes (rows whose second field is `at`, in log order) grouped by instant, each group
    with the stretch [a, b) it holds for until the next instant, clipped to [t0, t1): empty
    (b <= a) before the window, so a caller still applies the group but draws nothing."""
    index = 0
    while index < len(changes):
        at = changes[index][1]
        end = index
        while end < len(changes) and changes[end][1] <= at:
            end += 1
        b = changes[end][1] if end < len(changes) else t1
        yield changes[index:end], max(at, t0), min(b, t1)
        index = end


def attribute(step: Step) -> list[Piece]:
    """Who borrowed from whom during one step (the rule in the services.report docstring)."""
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
