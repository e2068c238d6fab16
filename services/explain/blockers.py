"""The rules of dispatch a job fails now, as sentences, read with the core's own accounting
(`accounting.contribution`, `within_own_limit`): the service environment's capacity, the
share's limit and borrow ceiling, idle lendable capacity in the other shares, a share group's
limit on what it holds (an option beyond AWS), and why preemption can't make room."""

from __future__ import annotations

from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.accounting import contribution, within_own_limit
from quotasched.services.explain.queue_options import group_cap_blocker
from quotasched.services.explain.sentences import when
from quotasched.services.scheduler.core.entities import Environment, Job, Queue, Share
from quotasched.services.scheduler.core.preemption import in_share_candidates
from quotasched.services.scheduler.core.victims import budget_left, protected


def _blockers(state: State, environment: Environment, queue: Queue, share: Share, job: Job,
              preemption: bool = True) -> list[str]:  # fmt: skip
    """Every rule of dispatch (accounting.Scratch.fits) that `job` fails now, as sentences;
    with `preemption`, also why preemption can't make room."""
    reasons: list[str] = []
    units = {unit for unit, _ in job.need}
    for unit, need in job.need:
        reasons.extend(_unit_blockers(environment, queue, share, job, unit, need))
    if not preemption or not reasons:
        return reasons
    reasons.extend(_preemption_blockers(queue, share, job, units))
    reasons.extend(_option_blockers(queue, share, job, units, state.time))
    return reasons


def _unit_blockers(environment: Environment, queue: Queue, share: Share, job: Job, unit: str,
                   need: int) -> list[str]:  # fmt: skip
    """The rules of dispatch `job` fails for one capacity unit, as sentences."""
    reasons: list[str] = []
    capacity = environment.capacity.get(unit)
    total = queue.usage.get(unit, 0)
    used, limit = share.usage.get(unit, 0), share.limits.get(unit, 0)
    if capacity is None:
        reasons.append(f"service environment {environment.name} has no {unit} capacity")
        return reasons
    if total + need > capacity:
        reasons.append(f"service environment {environment.name} is full: {total} of its "
                       f"{capacity} {unit} are in use and {job.job_id} needs {need}")  # fmt: skip
    borrowed_before, idle_before = contribution(share, unit, used)
    borrowed_after, idle_after = contribution(share, unit, used + need)
    borrowing = borrowed_after - borrowed_before
    if borrowing:
        if not share.strategy.borrows:
            where = "is at" if used >= limit else "would go past"
            reasons.append(f"{share.name} {where} its own limit ({used} of {limit} {unit} in "
                           f"use, {job.job_id} needs {need}) and a {share.strategy.value} "
                           "share may not borrow")  # fmt: skip
            return reasons
        ceiling = share.borrow_ceiling(unit)
        if ceiling is not None and used + need > limit + ceiling:
            reasons.append(f"{share.name} has reached its borrow ceiling: it may use at most "
                           f"{limit + ceiling} {unit} (limit {limit} plus borrowLimit "
                           f"{share.borrow_limit_percent}%), uses {used} and {job.job_id} needs "
                           f"{need}")  # fmt: skip
            return reasons
    slack = queue.idle.get(unit, 0) - queue.borrowed.get(unit, 0)
    slack_after = slack - borrowing - (idle_before - idle_after)
    if slack_after < 0 and slack_after < slack:
        if borrowing:
            reasons.append(f"it would borrow {borrowing} {unit} beyond {share.name}'s own "
                           f"limit ({used} of {limit} in use) but there is no idle lendable "
                           f"capacity in other shares: {_pool(queue, share, unit, idle_before)}")  # fmt: skip
        else:
            reasons.append(f"the idle capacity of {share.name} it would use within its own "
                           f"limit ({used} of {limit} {unit} in use, {job.job_id} needs {need}) "
                           f"is lent out: {_pool(queue, share, unit, idle_before)}")  # fmt: skip
    if borrowing:
        capped = group_cap_blocker(queue, share, job, unit, need)
        if capped is not None:
            reasons.append(capped)
    return reasons


def _preemption_blockers(queue: Queue, share: Share, job: Job, units: set[str]) -> list[str]:
    """Why neither cross-share reclaim nor in-share preemption makes room for `job`."""
    reasons: list[str] = []
    if within_own_limit(share, job.need):
        over = [other.name for other in queue.shares.values() if other is not share
                and any(other.usage.get(u, 0) > other.limits.get(u, 0) for u in units)]  # fmt: skip
        if not over:
            reasons.append(f"cross-share reclaim finds nothing to take back: no other share is "
                           f"over its own limit in {', '.join(sorted(units))}")  # fmt: skip
        else:
            reasons.append(f"reclaiming from the shares over their limits ({', '.join(over)}) "
                           "would not make enough room")  # fmt: skip
    running = [other for other in share.dispatched.values()
               if any(unit in units for unit, _ in other.need)]  # fmt: skip
    lower = [other for other in running if other.priority < job.priority]
    listed = ", ".join(f"{other.job_id} (priority {other.priority})" for other in running)
    if share.in_share_preemption:
        if running and not lower:
            reasons.append(f"in-share preemption (ENABLED in {share.name}) finds no running job "
                           f"with a priority below {job.priority}: {listed}")  # fmt: skip
        elif lower:
            reasons.append(f"preempting {share.name}'s lower-priority jobs "
                           f"({', '.join(other.job_id for other in lower)}) would not make "
                           "enough room")  # fmt: skip
    elif lower:
        reasons.append(f"in-share preemption is DISABLED in {share.name}, so it does not preempt "
                       f"the lower-priority {', '.join(other.job_id for other in lower)}")  # fmt: skip
    return reasons


def _pool(queue: Queue, share: Share, unit: str, own_idle: int) -> str:
    """Who lends and who borrows `unit` in the queue, from `share`'s point of view (its own
    idle capacity, `own_idle`, is not part of what others can lend it)."""
    lenders, reserve, borrowers = [], [], []
    for other in queue.shares.values():
        used, limit = other.usage.get(unit, 0), other.limits.get(unit, 0)
        if used > limit:
            borrowers.append(f"{other.name} borrows {used - limit}")
        if other is share or used > limit:
            continue
        if other.strategy.lends:
            idle = limit - used
            lends = contribution(other, unit, used)[1]
            capped = f" (lends at most {other.lendable(unit)}: its lending limit)" if lends < idle else ""
            lenders.append(f"{other.name} ({other.strategy.value}) uses {used} of its limit "
                           f"{limit}" + (f", {idle} idle" if idle else "") + capped)  # fmt: skip
        elif limit:
            reserve.append(other.name)
    slack = queue.idle.get(unit, 0) - queue.borrowed.get(unit, 0)
    parts = ["lenders " + ", ".join(lenders) if lenders else "no other share has capacity to lend"]
    if borrowers:
        parts.append("already lent out: " + ", ".join(borrowers))
    if reserve:
        parts.append(", ".join(reserve) + (" is" if len(reserve) == 1 else " are")
                     + " RESERVE and never lend" + ("s" if len(reserve) == 1 else ""))  # fmt: skip
    free = max(0, slack - own_idle)
    parts.append(f"idle capacity of other shares not lent out yet: {free} {unit}")
    return "; ".join(parts)


def _option_blockers(queue: Queue, share: Share, job: Job, units: set[str], now: float) -> list[str]:
    """The victims the options beyond AWS keep from preemption now, and until when: jobs of
    other shares over their limits (reclaim) and the share's own lower-priority jobs
    (in-share preemption), per victims.py."""
    candidates = [other for name, over in queue.shares.items() if over is not share
                  and any(over.usage.get(u, 0) > over.limits.get(u, 0) for u in units)
                  for other in over.dispatched.values()]  # fmt: skip
    if share.in_share_preemption:
        candidates += in_share_candidates(share, job)
    reasons: list[str] = []
    spent: set[str] = set()
    for other in candidates:
        owner = queue.shares[other.share]
        if protected(owner, other, now):
            assert other.dispatched_at is not None and owner.min_runtime_s is not None
            reasons.append(f"{other.job_id} of {owner.name} may not be preempted before "
                           f"{when(other.dispatched_at + owner.min_runtime_s)} ({owner.name}'s "
                           f"minimum runtime before preemption is {owner.min_runtime_s} s, an "
                           "option beyond AWS)")  # fmt: skip
        left = budget_left(owner, now)
        if left is not None and left <= 0 and owner.name not in spent and owner.budget is not None:
            spent.add(owner.name)
            most, window = owner.budget
            counted = sorted(at for at in owner.preempted_at if at > now - window)
            reasons.append(f"{owner.name} has spent its preemption budget ({most} preemptions "
                           f"in any {window} s, an option beyond AWS) until "
                           f"{when(counted[-most] + window)}")  # fmt: skip
    return reasons
