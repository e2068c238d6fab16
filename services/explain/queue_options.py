"""A job queue's options beyond AWS (SetJobQueueOptions) in a job's story: the borrowers a
dispatch went before, or was passed over for, and why (a share group lends inside first, then
fair share, then first come, first served).  The order and its clauses are the core's
(`scheduler.core.waiting`: `borrower_heads`, `order_clauses`), which also tells a waiting
borrower its place; a share group's `maxCapacity` a borrower would exceed is a rule of
dispatch (`accounting.Misfit`).

The order is the core's own (`ordering.borrower_key`), and the values it tells are the core's
(`fairshare.fair_value`, `decayed`, `lent_inside`) at the moment told, so what is said is what
the scheduler decided.  With neither option set nothing here says a word: a queue without
options reads exactly as AWS's FIFO did before.
"""

from __future__ import annotations

from quotasched.events import facts as F
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.waiting import (
    amount,
    borrower_heads,
    has_order_options,
    label,
    order_clauses,
    who,
)

__all__ = ["amount", "passed_over", "went_before"]


def passed_over(state: State, fact: F.Fact, job_id: str) -> str | None:
    """Read right before `fact`: when it dispatches another borrower of the job's queue ahead
    of the job, itself a head waiting to borrow, why the options put that one first."""
    if not isinstance(fact, F.JobDispatched) or not fact.borrowed:
        return None
    job = state.jobs.get(job_id)
    queue = state.queues.get(fact.job_queue)
    if job is None or queue is None or job.queue != queue.name or not has_order_options(queue):
        return None
    pairs = borrower_heads(state, queue, fact.at)
    ids = [head.job_id for _, head in pairs]
    if job_id not in ids or fact.job_id not in ids or ids.index(fact.job_id) > ids.index(job_id):
        return None
    chosen = pairs[ids.index(fact.job_id)][1]
    fifo = " (first come, first served would have served it first)" if job.seq < chosen.seq else ""
    return (f"{who(state, fact.job_id)} of {fact.quota_share_name}, also waiting to borrow, was dispatched "
            f"ahead of it{fifo}; " + "; ".join(order_clauses(queue, pairs, fact.at)) + ".")


def went_before(state: State, fact: F.JobDispatched) -> str | None:
    """Read right before a borrower's dispatch: the borrowers it went before, and why."""
    queue = state.queues.get(fact.job_queue)
    if not fact.borrowed or queue is None or not has_order_options(queue):
        return None
    pairs = borrower_heads(state, queue, fact.at)
    ids = [head.job_id for _, head in pairs]
    if fact.job_id not in ids or ids[-1] == fact.job_id:
        return None
    chosen = pairs[ids.index(fact.job_id)][1]
    after = [head for _, head in pairs[ids.index(fact.job_id) + 1:]]
    earlier = [label(head) for head in after if head.seq < chosen.seq]
    fifo = (f" (first come, first served would have served {' and '.join(earlier)} first)"
            if earlier else "")  # fmt: skip
    return (f"it went before {', '.join(label(head) for head in after)}, which also waited to "
            f"borrow{fifo}; " + "; ".join(order_clauses(queue, pairs, fact.at)))
