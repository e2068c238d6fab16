"""A job queue's options beyond AWS (SetJobQueueOptions) in sentences: the order borrowers
are served in (a share group lends inside first, then fair share, then first come, first
served).  A share group's `maxCapacity` a borrower would exceed is a rule of dispatch: the
core reports it (`accounting.Misfit`), blockers.py words it.

The order is the core's own (`ordering.borrower_key`), and the values it tells are the core's
(`fairshare.fair_value`, `decayed`, `lent_inside`) at the moment told, so what is said is what
the scheduler decided.  With neither option set nothing here says a word: a queue without
options reads exactly as AWS's FIFO did before.
"""

from __future__ import annotations

from quotasched.events import facts as F
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.accounting import within_own_limit
from quotasched.services.scheduler.core.admission import blocked_reason
from quotasched.services.scheduler.core.entities import Job, Queue, Share
from quotasched.services.scheduler.core.fairshare import decayed, fair_value, lent_inside
from quotasched.services.scheduler.core.ordering import borrower_key
from quotasched.services.scheduler.core.passes import placeable

Pair = tuple[Share, Job]


def has_order_options(queue: Queue) -> bool:
    """Does the queue order its borrowers other than first come, first served?"""
    return bool(queue.groups) or queue.half_life is not None


def borrower_heads(state: State, queue: Queue, now: float) -> list[Pair]:
    """The heads a scheduling pass would now treat as borrowers (passes._place_one step (b):
    beyond their share's own limit, neither blocked for good nor refused by their own share's
    configuration, `passes.placeable`), in the order the core serves them."""
    environment = state.environments[queue.environment]
    pairs = []
    for share in queue.shares.values():
        head = state.head(share)
        if head is None or within_own_limit(share, head.need):
            continue
        if blocked_reason(environment, queue, share, head.need) is not None:
            continue
        if not placeable(share, head):
            continue
        pairs.append((share, head))
    return sorted(pairs, key=borrower_key(queue, now))


def order_clauses(queue: Queue, pairs: list[Pair], now: float) -> list[str]:
    """The borrowers' order and what makes it, one clause per rule the queue has."""
    clauses = ["borrowers are served in the order of the queue's options beyond AWS: "
               + ", then ".join(f"{head.job_id} of {share.name}" for share, head in pairs)]
    if queue.groups:
        clauses.extend(_group_clauses(queue, pairs))
    if queue.half_life is not None:
        clauses.append(_fair_share_clause(queue, pairs, now))
    return clauses


def _group_clauses(queue: Queue, pairs: list[Pair]) -> list[str]:
    """`group dept lends inside first: ...` for every group that lends all its borrower needs;
    a sentence saying none does when no borrower is lent inside."""
    inside: dict[str, list[str]] = {}
    for share, head in pairs:
        if lent_inside(queue, share, head):
            inside.setdefault(queue.group_of[share.name], []).append(head.job_id)
    if not inside:
        return ["no share group's other members have idle capacity for all its borrower "
                "needs, so no group lends inside first"]  # fmt: skip
    return [f"group {group} lends inside first: its other members' idle lendable capacity "
            f"covers all {' and '.join(ids)} would borrow"
            for group, ids in inside.items()]  # fmt: skip


def _fair_share_clause(queue: Queue, pairs: list[Pair], now: float) -> str:
    values = []
    for share, _ in pairs:
        weight = queue.weights.get(share.name, 1)
        values.append(f"share {share.name}'s decayed borrowing "
                      f"{amount(decayed(queue, share, now))} instance-s / weight {weight} = "
                      f"{amount(fair_value(queue, share, now))}")  # fmt: skip
    ranked = [fair_value(queue, share, now) for share, _ in pairs]
    ties = len(set(ranked)) < len(ranked)
    return (f"idle capacity goes by fair share (half-life {queue.half_life} s), the least "
            f"decayed borrowing per weight first: {', '.join(values)}"
            + ("; equal values go first come, first served" if ties else ""))  # fmt: skip


def amount(value: float) -> str:
    """Instance-seconds without float noise: 40, 12.5, 0.013 (a tiny value keeps a digit)."""
    if value == 0 or value >= 0.001:
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"


def waiting_order(state: State, queue: Queue, job: Job) -> tuple[tuple[str, ...], str] | None:
    """For a head waiting to borrow alongside other borrowers under the queue's options: (the
    order as job ids, which changes the story only when it changes; the clauses telling it)."""
    if not has_order_options(queue):
        return None
    pairs = borrower_heads(state, queue, state.time)
    order = tuple(head.job_id for _, head in pairs)
    if len(order) < 2 or job.job_id not in order:
        return None
    return order, "; ".join(order_clauses(queue, pairs, state.time))


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
    return (f"{fact.job_id} of {fact.quota_share_name}, also waiting to borrow, was dispatched "
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
    earlier = [head.job_id for head in after if head.seq < chosen.seq]
    fifo = (f" (first come, first served would have served {' and '.join(earlier)} first)"
            if earlier else "")  # fmt: skip
    return (f"it went before {', '.join(head.job_id for head in after)}, which also waited to "
            f"borrow{fifo}; " + "; ".join(order_clauses(queue, pairs, fact.at)))
