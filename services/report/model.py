"""The report's data model: the step functions, borrowed pieces, preemptions and charts that
loading produces and drawing reads, the errors the report raises, and `attribute`, the
who-lent-to-whom rule (explained in the services.report docstring).

A Step holds every share's usage and the capacity constant over [a, b); a Chart's
`borrowed_s`, `lent_s`, `unbacked_s` and `used_s` are integrals over its exact steps.
"""

from __future__ import annotations

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
