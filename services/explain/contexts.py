"""Contexts read from the state right before a fact, for its sentence: every share's usage
and limit, what a dispatch borrowed and from whose idle capacity, and why a preemption
happened and why these victims (the victim orderings of `ordering.py`)."""

from __future__ import annotations

from quotasched.events import facts as F
from quotasched.events.values import PreemptionReason
from quotasched.services.explain.queue_options import went_before
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.accounting import contribution
from quotasched.services.scheduler.core.entities import Environment, Job, Queue
from quotasched.services.scheduler.core.ordering import cross_share_victim_order, in_share_victim_order
from quotasched.services.scheduler.core.waiting import blockers, label, who
from quotasched.services.scheduler.core.waiting import moment as _time

# -- contexts, read right before a fact --------------------------------------------------------


def _usage(queue: Queue, environment: Environment, units: set[str]) -> str:
    """Every share's usage and limit for `units`, and the service environment's."""
    shares = []
    for share in queue.shares.values():
        cells = []
        for unit in sorted(units):
            used, limit = share.usage.get(unit, 0), share.limits.get(unit, 0)
            cell = f"{used} of its limit {limit}" + (f" {unit}" if len(units) > 1 else "")
            if used > limit:
                cell += f" (borrowing {used - limit})"
            cells.append(cell)
        shares.append(f"{share.name} ({share.strategy.value}) uses {', '.join(cells)}")
    se = ", ".join(f"{queue.usage.get(unit, 0)} of {environment.capacity.get(unit, 0)} {unit}"
                   for unit in sorted(units))  # fmt: skip
    return f"{'; '.join(shares)}; service environment {environment.name}: {se} in use"


def _dispatch_context(state: State, fact: F.JobDispatched) -> dict | None:
    job = state.jobs.get(fact.job_id)
    queue = state.queues.get(fact.job_queue)
    share = queue.shares.get(fact.quota_share_name) if queue is not None else None
    if job is None or share is None:
        return None
    after = []
    idle = []
    for unit, need in job.need:
        used, limit = share.usage.get(unit, 0) + need, share.limits.get(unit, 0)
        after.append(f"{share.name} then uses {used} of its limit {limit} {unit}")
        for other in queue.shares.values():
            if other is not share and other.strategy.lends:
                spare = contribution(other, unit, other.usage.get(unit, 0))[1]
                if spare:
                    idle.append(f"{other.name} {spare} {unit}")
    return {"share": share.name, "usage_after": ", ".join(after), "idle": ", ".join(idle),
            "order": went_before(state, fact)}


_CROSS_CRITERIA = ("borrowing", "priority", "recency", "size", "id")
_IN_SHARE_CRITERIA = ("priority", "recency", "size", "id")


def _preemption_context(state: State, fact: F.JobPreempted, victims: list[F.JobPreempted],
                        job_id: str) -> str | None:  # fmt: skip
    """Why the preemptor preempted, everyone's usage right before, and why these victims."""
    preemptor = state.jobs.get(fact.preemptor_job_id)
    queue = state.queues.get(fact.job_queue)
    if preemptor is None or queue is None or preemptor.share not in queue.shares:
        return None
    share = queue.shares[preemptor.share]
    environment = state.environments[queue.environment]
    units = {unit for unit, _ in preemptor.need}
    found = blockers(state, environment, queue, share, preemptor, preemption=False)
    chosen = {victim.job_id for victim in victims}
    if fact.reason is PreemptionReason.CROSS_SHARE_RECLAIM:
        over = [other for other in queue.shares.values() if other is not share
                and any(other.usage.get(u, 0) > other.limits.get(u, 0) for u in units)]  # fmt: skip
        candidates = [job for other in over for job in other.dispatched.values()
                      if any(unit in units for unit, _ in job.need)]  # fmt: skip
        key, criteria = cross_share_victim_order(units), _CROSS_CRITERIA
        why = (f"{label(preemptor)} (priority {preemptor.priority}) heads {share.name} and fits "
               f"within its own limit, but {'; '.join(found) or 'there was no room'}; so the "
               f"capacity lent to shares over their limits "
               f"({', '.join(other.name for other in over)}) was reclaimed.")
        order = "borrowing jobs first, then lowest priority, then most recently dispatched"
    else:
        candidates = [job for job in share.dispatched.values()
                      if job.priority < preemptor.priority and any(u in units for u, _ in job.need)]
        key, criteria = in_share_victim_order(units), _IN_SHARE_CRITERIA
        why = (f"{label(preemptor)} (priority {preemptor.priority}) heads {share.name}, where "
               f"in-share preemption is ENABLED, and could not be dispatched otherwise: "
               f"{'; '.join(found) or 'there was no room'}; so {share.name}'s jobs of lower "
               f"priority could be preempted.")
        order = "lowest priority first, then most recently dispatched"
    ranked = sorted(candidates, key=key)
    listed = ", ".join(_candidate(job, units, fact.reason) for job in ranked)
    text = (f"Why: {why} Right before: {_usage(queue, environment, units)}. Candidates in the "
            f"rule's order ({order}): {listed or 'none'}.")
    victim_ids = [who(state, victim.job_id) for victim in victims]
    for job in ranked:
        if job.job_id in chosen and (job.job_id == job_id or preemptor.job_id == job_id):
            because = _chosen_because(job, ranked, chosen, key, criteria)
            text += f" {label(job)} was chosen because {because}."
    if len(victim_ids) > 1:
        text += f" Victims, the fewest that make room: {', '.join(victim_ids)}."
    return text


def _candidate(job: Job, units: set[str], reason: PreemptionReason) -> str:
    parts = []
    if reason is PreemptionReason.CROSS_SHARE_RECLAIM:
        borrowed = [(u, n) for u, n in job.borrowed if u in units]
        parts.append(f"{job.share}, " + ("borrowing " + ", ".join(f"{n} x {u}" for u, n in borrowed)
                                         if borrowed else "not borrowing"))  # fmt: skip
    parts.append(f"priority {job.priority}")
    if job.dispatched_at is not None:
        parts.append(f"dispatched at {_time(job.dispatched_at)}")
    return f"{label(job)} ({', '.join(parts)})"


def _chosen_because(job: Job, ranked: list[Job], chosen: set[str], key, criteria) -> str:
    others = [other for other in ranked if other.job_id not in chosen]
    if not others:
        return "it was the only candidate" if len(ranked) == 1 else "every candidate was needed"
    other = others[0]  # the best-ranked candidate that was spared
    mine, theirs = key(job), key(other)
    if theirs < mine:
        return (f"it alone frees enough room, although {label(other)} ranks before it (the rule "
                "prefers the fewest victims)")  # fmt: skip
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(criteria) - 1)
    criterion = criteria[index]
    if criterion == "borrowing":
        borrowed = ", ".join(f"{n} x {u}" for u, n in job.borrowed)
        return (f"it was borrowing ({borrowed} beyond {job.share}'s limit when it was dispatched) "
                f"and {label(other)} was not")  # fmt: skip
    if criterion == "priority":
        return f"it had the lowest priority ({job.priority}; {label(other)} has {other.priority})"
    if criterion == "recency":
        return (f"it was the most recently dispatched (at {_time(job.dispatched_at)}; "
                f"{label(other)} at {_time(other.dispatched_at)}), so the least work is lost")
    if criterion == "size":
        return f"it holds fewer instances than {label(other)}"
    return f"the final tie-break (job id) puts it before {label(other)}"
