"""Every ordering the scheduler uses, each one comparator with numbered criteria.

Each key ends in a unique value (acceptance seq or job id), so every sort is total and a replay
sorts exactly as the original run did.

- Inside a share (the heap key of `Job.key`): 1. higher schedulingPriority; 2. earlier
  acceptance (FIFO, ruling 8; kept across preemption); 3. job id.
- Between shares for owners (spec 3.3): `share_order`.
- Between borrowers: FIFO by the head's acceptance order (idleResourceAssignmentStrategy FIFO);
  under the queue options beyond AWS, group lending and fair share first (`borrower_key`).
- Victims: `cross_share_victim_order` and `in_share_victim_order` (spec 3.5).
"""

from __future__ import annotations

from quotasched.services.scheduler.core.entities import Job, Queue, Share
from quotasched.services.scheduler.core.fairshare import fair_value, lent_inside


def share_order(share: Share, head: Job) -> tuple:
    """Which share's head is served first among heads that fit their own limits.

    1. lower usage relative to the share's own limits (max over units of U/L);
    2. higher priority of the head job;
    3. earlier acceptance of the head job;
    4. share name.
    """
    ratio = max((share.usage.get(unit, 0) / limit for unit, limit in share.limits.items()),
                default=0.0)  # fmt: skip
    return (ratio, -head.priority, head.seq, share.name)


def borrower_order(share: Share, head: Job) -> tuple:
    """Borrowers compete for idle lendable capacity first come, first served."""
    return (head.seq, share.name)


def borrower_key(queue: Queue, now: float):
    """Rank borrowers under the queue's options (fairshare.py); AWS's FIFO without them:

    1. (share groups) a borrower its own group would lend all it borrows, before the others;
    2. (FAIR_SHARE) lower decayed past borrowing per unit of weight;
    3. earlier acceptance of the head job (FIFO);
    4. share name.
    """
    grouped = bool(queue.groups)
    fair = queue.half_life is not None
    if not grouped and not fair:
        return _fifo

    def key(pair: tuple[Share, Job]) -> tuple:
        share, head = pair
        rank = 0 if grouped and lent_inside(queue, share, head) else 1
        value = fair_value(queue, share, now) if fair else 0.0
        return (rank, value, head.seq, share.name)

    return key


def _fifo(pair: tuple[Share, Job]) -> tuple:
    return borrower_order(pair[0], pair[1])


def _instances(job: Job, units: set[str]) -> int:
    return sum(quantity for unit, quantity in job.need if unit in units)


def cross_share_victim_order(units: set[str]):
    """Rank reclaim candidates (spec 3.5):

    1. jobs recorded as borrowing one of the contested units when they were dispatched;
    2. lower schedulingPriority;
    3. more recently dispatched (least work lost);
    4. fewer instances of the contested units;
    5. job id.
    """

    def key(job: Job) -> tuple:
        borrowing = any(unit in units for unit, _ in job.borrowed)
        return (not borrowing, job.priority, -job.dispatch_order, _instances(job, units),
                job.job_id)  # fmt: skip

    return key


def in_share_victim_order(units: set[str]):
    """Rank in-share candidates: 1. lower priority; 2. more recently dispatched;
    3. fewer instances of the contested units; 4. job id."""

    def key(job: Job) -> tuple:
        return (job.priority, -job.dispatch_order, _instances(job, units), job.job_id)

    return key
