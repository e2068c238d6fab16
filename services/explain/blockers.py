"""The rules of dispatch a job fails now, as sentences: the core finds them with the check its
passes make (`accounting.Scratch.misfits`: the service environment's capacity, the share's
limit and borrow ceiling, idle lendable capacity in the other shares, a share group's limit on
what it holds, an option beyond AWS); this module only words them, and says why preemption
can't make room."""

from __future__ import annotations

from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.accounting import (
    BORROW_CEILING,
    ENVIRONMENT_FULL,
    GROUP_LIMIT,
    LACKS_UNIT,
    MAY_NOT_BORROW,
    NO_IDLE_LENDABLE,
    OWN_IDLE_LENT,
    Misfit,
    Scratch,
    contribution,
    within_own_limit,
)
from quotasched.services.explain.sentences import when
from quotasched.services.scheduler.core.entities import Environment, Job, Queue, Share
from quotasched.services.scheduler.core.preemption import in_share_candidates
from quotasched.services.scheduler.core.victims import budget_left, protected


def _blockers(state: State, environment: Environment, queue: Queue, share: Share, job: Job,
              preemption: bool = True) -> list[str]:  # fmt: skip
    """Every rule of dispatch `job` fails now, as the core's own check finds them
    (`Scratch.misfits`, the check its passes make), in sentences; with `preemption`, also why
    preemption can't make room."""
    units = {unit for unit, _ in job.need}
    misfits = Scratch(environment, queue).misfits(share, job.need)
    reasons = [_sentence(misfit, environment, queue, share, job) for misfit in misfits]
    if not preemption or not reasons:
        return reasons
    reasons.extend(_preemption_blockers(queue, share, job, units))
    reasons.extend(_option_blockers(queue, share, job, units, state.time))
    return reasons


def _sentence(misfit: Misfit, environment: Environment, queue: Queue, share: Share, job: Job) -> str:
    """One rule of dispatch `job` fails (a `Misfit`), as a sentence."""
    rule, unit, need, used, limit = misfit.rule, misfit.unit, misfit.need, misfit.used, misfit.limit
    if rule == LACKS_UNIT:
        return f"service environment {environment.name} has no {unit} capacity"
    if rule == ENVIRONMENT_FULL:
        return (f"service environment {environment.name} is full: {misfit.in_use} of its "
                f"{misfit.bound} {unit} are in use and {job.job_id} needs {need}")  # fmt: skip
    if rule == MAY_NOT_BORROW:
        where = "is at" if used >= limit else "would go past"
        return (f"{share.name} {where} its own limit ({used} of {limit} {unit} in use, "
                f"{job.job_id} needs {need}) and a {share.strategy.value} share may not borrow")
    if rule == BORROW_CEILING:
        return (f"{share.name} has reached its borrow ceiling: it may use at most "
                f"{misfit.bound} {unit} (limit {limit} plus borrowLimit "
                f"{share.borrow_limit_percent}%), uses {used} and {job.job_id} needs {need}")
    if rule == NO_IDLE_LENDABLE:
        return (f"it would borrow {misfit.borrowing} {unit} beyond {share.name}'s own limit "
                f"({used} of {limit} in use) but there is no idle lendable capacity in other "
                f"shares: {_pool(queue, share, unit, misfit)}")  # fmt: skip
    if rule == OWN_IDLE_LENT:
        return (f"the idle capacity of {share.name} it would use within its own limit ({used} "
                f"of {limit} {unit} in use, {job.job_id} needs {need}) is lent out: "
                f"{_pool(queue, share, unit, misfit)}")  # fmt: skip
    assert rule == GROUP_LIMIT, rule
    members = [queue.shares[name] for name in queue.groups[misfit.group] if name in queue.shares]
    each = ", ".join(f"{member.name} {member.usage.get(unit, 0)}" for member in members)
    return (f"{share.name} is in share group {misfit.group}, which may hold at most "
            f"{misfit.bound} {unit} when one of its members borrows (an option beyond AWS): its "
            f"members hold {misfit.in_use} ({each}) and {job.job_id} needs {need}")  # fmt: skip


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


def _pool(queue: Queue, share: Share, unit: str, misfit: Misfit) -> str:
    """Who lends and who borrows `unit` in the queue, from `share`'s point of view (its own
    idle capacity, `misfit.own_idle`, is not part of what others can lend it)."""
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
    parts = ["lenders " + ", ".join(lenders) if lenders else "no other share has capacity to lend"]
    if borrowers:
        parts.append("already lent out: " + ", ".join(borrowers))
    if reserve:
        parts.append(", ".join(reserve) + (" is" if len(reserve) == 1 else " are")
                     + " RESERVE and never lend" + ("s" if len(reserve) == 1 else ""))  # fmt: skip
    free = max(0, misfit.pool - misfit.own_idle)
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
