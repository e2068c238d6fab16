"""`quotasched explain JOB_ID`: a job's story in plain sentences, each backed by the log.

The facts are folded with the core's own `evolve`, one command at a time, and the reasons are
read off the state at each moment with the core's own arithmetic (`accounting.contribution`,
`admission.blocked_reason`, the victim orderings of `ordering.py`):

- what happened to the job: submitted, priority changes, dispatched (attempt, what it borrowed
  and from whose idle capacity), preempted (by whom, which rule, every share's usage and limit
  right before, and why this job was the victim), requeued or failed, finished;
- why it waited: after its submission and after every command that touched its job queue,
  while it is RUNNABLE, the reason is derived again, and told whenever it changes: behind a
  higher-priority or earlier job of its share (naming the head, and why the head waits), a
  blocked head (the exact reason string), the share at its own limit and not allowed to borrow,
  the borrow ceiling reached, no idle lendable capacity in the other shares (naming them with
  their usage and limits), the service environment full or DISABLED.

Every sentence cites the `commandSeq` and `at` of the facts it comes from; a "Waiting" entry
cites the command after which the state it describes held.  No I/O here: the caller brings
the facts (a file, the bus, a replay).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from events import facts as F
from events.values import JobStatus, PreemptionOutcome, PreemptionReason, StatusCause
from events.values import State as OnOff
from services.cli.narrate import sentence as narrate
from services.scheduler.core import State, evolve
from services.scheduler.core.accounting import contribution, within_own_limit
from services.scheduler.core.admission import blocked_reason
from services.scheduler.core.ordering import cross_share_victim_order, in_share_victim_order
from services.scheduler.core.state import Environment, Job, Queue, Share

WAITING = "Waiting"  # the kind of an entry derived from the state, not a fact of its own


@dataclass(frozen=True)
class Entry:
    at: float
    command_seq: int
    kind: str  # the fact's kind, or "Waiting"
    sentence: str

    def document(self) -> dict[str, Any]:
        return {"at": self.at, "commandSeq": self.command_seq, "kind": self.kind,
                "sentence": self.sentence}  # fmt: skip


class InconsistentLog(ValueError):
    """The facts can't be folded (a fact refers to a job or share no earlier fact created)."""


def explain(facts: Iterable[F.Fact], job_id: str) -> list[Entry]:
    """The story of `job_id` as the facts tell it (empty when no fact names the job)."""
    state = State()
    story: list[Entry] = []
    last_wait: tuple | None = None
    for seq, grouped in groupby(facts, key=lambda fact: fact.command_seq):
        group = list(grouped)
        try:
            last_wait = _step(state, seq, group, job_id, story, last_wait)
        except (KeyError, AttributeError, TypeError, IndexError) as error:
            raise InconsistentLog(
                f"the facts of command {seq} can't be folded onto the ones before them "
                f"({type(error).__name__}: {error}); is the log complete? "
                "`quotasched audit verify` finds the first fact that differs"
            ) from None
    return story


def _step(state: State, seq: int, group: list[F.Fact], job_id: str, story: list[Entry],
          last_wait: tuple | None) -> tuple | None:  # fmt: skip
    """Fold one command's facts, tell what concerns the job, and why it waits now."""
    if not any(_names(fact, job_id) for fact in group):
        for fact in group:
            evolve(state, fact)
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.RUNNABLE:
            return last_wait
        if not any(_touches(state, fact, job) for fact in group):
            return last_wait
    else:
        _tell_group(state, group, job_id, story)
        job = state.jobs.get(job_id)
        if job is None:
            return last_wait
    if job.status is not JobStatus.RUNNABLE:
        return None
    key, wait = _waiting(state, job, last_wait)
    told_blocked = any(isinstance(fact, F.ShareBlocked) and fact.job_id == job_id
                       for fact in group)  # fmt: skip
    if wait is not None and key != last_wait and not told_blocked:
        story.append(Entry(group[-1].at, seq, WAITING, wait))
    return key


def _names(fact: F.Fact, job_id: str) -> bool:
    if getattr(fact, "job_id", None) == job_id:
        return True
    return isinstance(fact, F.JobPreempted) and fact.preemptor_job_id == job_id


_NO_CHANGE = (F.CommandRejected, F.JobReportIgnored, F.SubmissionDeduplicated)


def _touches(state: State, fact: F.Fact, job: Job) -> bool:
    """Could this fact change why `job` waits?  (Anything in its job queue or its SE.)"""
    if getattr(fact, "job_queue", None) == job.queue:
        return True
    other = getattr(fact, "job_id", None)
    if other is not None and other in state.jobs and state.jobs[other].queue == job.queue:
        return not isinstance(fact, _NO_CHANGE)
    queue = state.queues.get(job.queue)
    return queue is not None and getattr(fact, "service_environment", None) == queue.environment


# -- one command's facts -----------------------------------------------------------------------


def _tell_group(state: State, group: list[F.Fact], job_id: str, story: list[Entry]) -> None:
    """Fold the facts of one command, telling those that concern the job; contexts (usage,
    candidates) are read from the state right before the fact they explain."""
    preempted_for: dict[str, list[F.JobPreempted]] = {}  # preemptor -> its victims' facts
    context: str | None = None
    for index, fact in enumerate(group):
        before = None
        if isinstance(fact, F.JobPreempted):
            run_start = index == 0 or not (
                isinstance(group[index - 1], F.JobPreempted)
                and group[index - 1].preemptor_job_id == fact.preemptor_job_id
            )
            if run_start:
                victims = _run_of(group, index)
                involved = fact.preemptor_job_id == job_id or any(
                    victim.job_id == job_id for victim in victims)
                context = _preemption_context(state, fact, victims, job_id) if involved else None
            preempted_for.setdefault(fact.preemptor_job_id, []).append(fact)
        elif isinstance(fact, F.JobDispatched) and fact.job_id == job_id:
            before = _dispatch_context(state, fact)
        elif isinstance(fact, F.JobPriorityUpdated) and fact.job_id == job_id:
            job = state.jobs.get(job_id)
            before = job.priority if job is not None else None
        evolve(state, fact)
        if not _names(fact, job_id):
            continue
        text = _sentence(state, fact, job_id, before, context, preempted_for)
        if text:
            story.append(Entry(fact.at, fact.command_seq, fact.kind, text))


def _run_of(group: list[F.Fact], start: int) -> list[F.JobPreempted]:
    first = group[start]
    run = []
    for fact in group[start:]:
        if not isinstance(fact, F.JobPreempted) or fact.preemptor_job_id != first.preemptor_job_id:
            break
        run.append(fact)
    return run


def _sentence(state: State, fact: F.Fact, job_id: str, before: Any, context: str | None,
              preempted_for: dict[str, list[F.JobPreempted]]) -> str | None:  # fmt: skip
    match fact:
        case F.JobSubmitted():
            return (f"{job_id} was submitted to quota share {fact.quota_share_name} of job queue "
                    f"{fact.job_queue} with priority {fact.scheduling_priority}, needing "
                    f"{_units(fact.capacity_usage)}.")  # fmt: skip
        case F.SubmissionDeduplicated():
            return f"A repeated submission of {job_id} was recognised; no second job was created."
        case F.CommandRejected():
            article = "An" if fact.command_kind[:1] in "AEIOU" else "A"
            return (f"{article} {fact.command_kind} command for {job_id} was refused: "
                    f"{fact.status_reason}")
        case F.JobPriorityUpdated():
            old = f" from {before}" if before is not None else ""
            return f"{job_id}'s priority was changed{old} to {fact.scheduling_priority}."
        case F.JobDispatched():
            return _dispatched_sentence(fact, before, preempted_for.get(job_id, []))
        case F.JobPreempted() if fact.job_id == job_id:
            outcome = (
                f"It went back to RUNNABLE, keeping its place in line (preempted "
                f"{fact.preempted_attempt_count} time(s) so far)."
                if fact.outcome is PreemptionOutcome.REQUEUED else
                f"Its preemptionRetriesBeforeTermination were used up: it FAILED (preempted "
                f"{fact.preempted_attempt_count} time(s))."
            )  # fmt: skip
            return (f"{job_id} (attempt {fact.attempt}) was preempted by {fact.preemptor_job_id} "
                    f"under {fact.reason.value}. {context or ''} {outcome}").replace("  ", " ")
        case F.JobPreempted():  # the job is the preemptor
            victims = preempted_for.get(job_id, [])
            first = victims and victims[0] is fact
            text = (f"{job_id} preempted {fact.job_id} of quota share {fact.quota_share_name} "
                    f"under {fact.reason.value} ({fact.job_id} {fact.outcome.value.lower()}).")
            return f"{text} {context}" if first and context else text
        case F.ShareBlocked():
            return (f"{job_id} heads quota share {fact.quota_share_name} but can never fit as "
                    f"configured, so the share is blocked behind it: \"{fact.status_reason}\"")
        case F.JobStatusChanged():
            return _status_sentence(fact, job_id)
        case F.JobReportIgnored():
            return f"A status report was ignored: {narrate(fact)}."
    return narrate(fact)


def _dispatched_sentence(fact: F.JobDispatched, before: dict | None,
                         preemptions: list[F.JobPreempted]) -> str:  # fmt: skip
    text = (f"{fact.job_id} was dispatched in quota share {fact.quota_share_name} "
            f"(attempt {fact.attempt})")
    if fact.after_preemption_of:
        reasons = sorted({p.reason.value for p in preemptions}) or ["preemption"]
        text += (f" once {', '.join(fact.after_preemption_of)} stopped (preempted by it under "
                 f"{' and '.join(reasons)})")
    if before is None:
        return text + "."
    share = before["share"]
    if fact.borrowed:
        text += (f", borrowing {_units(fact.borrowed)} beyond {share}'s own limit from the "
                 f"pool of idle lendable capacity ({before['usage_after']}); "
                 f"idle lendable capacity right before: {before['idle'] or 'none'}")
    else:
        text += f", within {share}'s own limit ({before['usage_after']})"
    return text + "."


def _status_sentence(fact: F.JobStatusChanged, job_id: str) -> str:
    reason = f": {fact.status_reason}" if fact.status_reason else ""
    status = fact.status
    if status is JobStatus.SUCCEEDED:
        return f"{job_id} finished: SUCCEEDED (attempt {fact.attempt}){reason}."
    if status is JobStatus.FAILED:
        how = {
            StatusCause.TERMINATED: "it was terminated",
            StatusCause.TIME_LIMIT: "a jobStateTimeLimitActions entry terminated it",
            StatusCause.SHARE_DELETED: "its quota share was deleted",
            StatusCause.ATTEMPT_TIMEOUT: "its attempt timed out",
        }.get(fact.cause, "its attempt failed")
        return f"{job_id} finished: FAILED, {how}{reason}."
    if status is JobStatus.RUNNABLE:
        how = {
            StatusCause.RETRY: "its attempt failed and its retryStrategy allows another",
            StatusCause.CAPACITY_BOUNCE: "SageMaker had no capacity for it",
            StatusCause.UNBLOCKED: "the configuration changed, so it can fit again some day",
            StatusCause.ATTEMPT_TIMEOUT: "its attempt timed out and it will be retried",
        }.get(fact.cause, fact.cause.value.lower())
        return f"{job_id} is RUNNABLE again: {how}{reason}."
    cause = fact.cause.value.lower()
    return f"{job_id} is {status.value} (attempt {fact.attempt}, {cause}){reason}."


# -- why a job waits ---------------------------------------------------------------------------


def why_waiting(state: State, job: Job) -> str:
    """Why a RUNNABLE job is not dispatched, as the state stands (after a scheduling pass)."""
    return _waiting(state, job)[1]


def _waiting(state: State, job: Job, told: tuple | None = None) -> tuple[tuple, str | None]:
    """(what would make the story worth telling again, the sentence; None when that is `told`).

    At the head of its share every detail counts (usage, lenders, who runs): the sentence
    itself is the key.  Behind other jobs, the story changes only when the kind of wait does
    (behind a higher-priority job, behind earlier ones, behind a blocked head and its reason,
    the service environment disabled), not with every new head or usage change ahead of it.
    """
    queue = state.queues.get(job.queue)
    share = queue.shares.get(job.share) if queue is not None else None
    if queue is None or share is None:
        text = f"{job.job_id} waits: its quota share {job.share} no longer exists."
        return (text,), text
    environment = state.environments[queue.environment]
    parts: list[str] = []
    if environment.state is OnOff.DISABLED:
        parts.append(f"service environment {environment.name} is DISABLED, so nothing is "
                     f"dispatched in job queue {queue.name}")  # fmt: skip
    head = state.head(share)
    if head is not None and head is not job:
        blocked = blocked_reason(environment, queue, share, head.need)
        if blocked is not None:
            key: tuple = ("blocked head", blocked[1], environment.state)
        elif head.priority > job.priority:
            key = ("behind higher priority", environment.state)
        else:
            key = ("behind earlier", environment.state)
        if key == told:
            return key, None  # the same kind of wait: nothing new to tell (and no work)
        if blocked is not None:
            text = (f"it is behind the blocked head of {share.name}, {head.job_id}, which can "
                    f"never fit as configured: \"{blocked[1]}\"")
        elif head.priority > job.priority:
            text = (f"it is behind higher-priority job {head.job_id} (priority "
                    f"{head.priority}, its own is {job.priority}) at the head of {share.name}")
        else:
            text = (f"it is behind {head.job_id}, submitted earlier with the same priority "
                    f"{job.priority}, at the head of {share.name}")
        ahead = _ahead(state, share, job)
        if len(ahead) > 1:
            text += f" ({len(ahead)} jobs are ahead of it in {share.name})"
        parts.append(text)
        if blocked is None:
            reasons = _blockers(state, environment, queue, share, head)
            if reasons:
                parts.append(f"{head.job_id} itself waits because " + "; ".join(reasons))
        return key, f"{job.job_id} waits (RUNNABLE): " + "; ".join(parts) + "."
    blocked = blocked_reason(environment, queue, share, job.need)
    if blocked is not None:
        parts.append(f"it heads {share.name}, which is blocked because it can never fit as "
                     f"configured: \"{blocked[1]}\"")  # fmt: skip
    else:
        parts.extend(_blockers(state, environment, queue, share, job))
    if not parts:
        parts.append("nothing keeps it waiting as things stand; the next scheduling pass "
                     "dispatches it")  # fmt: skip
    text = f"{job.job_id} waits (RUNNABLE): " + "; ".join(parts) + "."
    return (text,), text


def _ahead(state: State, share: Share, job: Job) -> list[str]:
    """RUNNABLE jobs of the share that come before `job` (the share's heap, live entries)."""
    key = job.key()
    seen = set()
    for priority, seq, other_id in share.heap:
        other = state.jobs.get(other_id)
        if (other is not None and other.status is JobStatus.RUNNABLE and other.priority == -priority
                and other.seq == seq and (priority, seq, other_id) < key):
            seen.add(other_id)
    return sorted(seen)


def _blockers(state: State, environment: Environment, queue: Queue, share: Share, job: Job,
              preemption: bool = True) -> list[str]:  # fmt: skip
    """Every rule of dispatch (accounting.Scratch.fits) that `job` fails now, as sentences;
    with `preemption`, also why preemption can't make room."""
    reasons: list[str] = []
    units = {unit for unit, _ in job.need}
    for unit, need in job.need:
        capacity = environment.capacity.get(unit)
        total = queue.usage.get(unit, 0)
        used, limit = share.usage.get(unit, 0), share.limits.get(unit, 0)
        if capacity is None:
            reasons.append(f"service environment {environment.name} has no {unit} capacity")
            continue
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
                continue
            ceiling = share.borrow_ceiling(unit)
            if ceiling is not None and used + need > limit + ceiling:
                reasons.append(f"{share.name} has reached its borrow ceiling: it may use at most "
                               f"{limit + ceiling} {unit} (limit {limit} plus borrowLimit "
                               f"{share.borrow_limit_percent}%), uses {used} and {job.job_id} needs "
                               f"{need}")  # fmt: skip
                continue
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
    if not preemption or not reasons:
        return reasons
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
            lenders.append(f"{other.name} ({other.strategy.value}) uses {used} of its limit "
                           f"{limit}" + (f", {idle} idle" if idle else ""))  # fmt: skip
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
                spare = max(0, other.limits.get(unit, 0) - other.usage.get(unit, 0))
                if spare:
                    idle.append(f"{other.name} {spare} {unit}")
    return {"share": share.name, "usage_after": ", ".join(after), "idle": ", ".join(idle)}


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
    blockers = _blockers(state, environment, queue, share, preemptor, preemption=False)
    chosen = {victim.job_id for victim in victims}
    if fact.reason is PreemptionReason.CROSS_SHARE_RECLAIM:
        over = [other for other in queue.shares.values() if other is not share
                and any(other.usage.get(u, 0) > other.limits.get(u, 0) for u in units)]  # fmt: skip
        candidates = [job for other in over for job in other.dispatched.values()
                      if any(unit in units for unit, _ in job.need)]  # fmt: skip
        key, criteria = cross_share_victim_order(units), _CROSS_CRITERIA
        why = (f"{preemptor.job_id} (priority {preemptor.priority}) heads {share.name} and fits "
               f"within its own limit, but {'; '.join(blockers) or 'there was no room'}; so the "
               f"capacity lent to shares over their limits "
               f"({', '.join(other.name for other in over)}) was reclaimed.")
        order = "borrowing jobs first, then lowest priority, then most recently dispatched"
    else:
        candidates = [job for job in share.dispatched.values()
                      if job.priority < preemptor.priority and any(u in units for u, _ in job.need)]
        key, criteria = in_share_victim_order(units), _IN_SHARE_CRITERIA
        why = (f"{preemptor.job_id} (priority {preemptor.priority}) heads {share.name}, where "
               f"in-share preemption is ENABLED, and could not be dispatched otherwise: "
               f"{'; '.join(blockers) or 'there was no room'}; so {share.name}'s jobs of lower "
               f"priority could be preempted.")
        order = "lowest priority first, then most recently dispatched"
    ranked = sorted(candidates, key=key)
    listed = ", ".join(_candidate(job, units, fact.reason) for job in ranked)
    text = (f"Why: {why} Right before: {_usage(queue, environment, units)}. Candidates in the "
            f"rule's order ({order}): {listed or 'none'}.")
    victim_ids = [victim.job_id for victim in victims]
    for job in ranked:
        if job.job_id in chosen and (job.job_id == job_id or preemptor.job_id == job_id):
            because = _chosen_because(job, ranked, chosen, key, criteria)
            text += f" {job.job_id} was chosen because {because}."
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
    return f"{job.job_id} ({', '.join(parts)})"


def _chosen_because(job: Job, ranked: list[Job], chosen: set[str], key, criteria) -> str:
    others = [other for other in ranked if other.job_id not in chosen]
    if not others:
        return "it was the only candidate" if len(ranked) == 1 else "every candidate was needed"
    other = others[0]  # the best-ranked candidate that was spared
    mine, theirs = key(job), key(other)
    if theirs < mine:
        return (f"it alone frees enough room, although {other.job_id} ranks before it (the rule "
                "prefers the fewest victims)")  # fmt: skip
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), len(criteria) - 1)
    criterion = criteria[index]
    if criterion == "borrowing":
        borrowed = ", ".join(f"{n} x {u}" for u, n in job.borrowed)
        return (f"it was borrowing ({borrowed} beyond {job.share}'s limit when it was dispatched) "
                f"and {other.job_id} was not")  # fmt: skip
    if criterion == "priority":
        return f"it had the lowest priority ({job.priority}; {other.job_id} has {other.priority})"
    if criterion == "recency":
        return (f"it was the most recently dispatched (at {_time(job.dispatched_at)}; "
                f"{other.job_id} at {_time(other.dispatched_at)}), so the least work is lost")
    if criterion == "size":
        return f"it holds fewer instances than {other.job_id}"
    return f"the final tie-break (job id) puts it before {other.job_id}"


def _time(at: float | None) -> str:
    """Logical time in seconds, without float noise: 3, 2.5, 1796007127.337."""
    if at is None:
        return "?"
    return f"{at:.3f}".rstrip("0").rstrip(".")


def _units(items) -> str:
    return ", ".join(f"{item.quantity} x {item.capacity_unit}" for item in items)


# -- rendering ---------------------------------------------------------------------------------


def render(entries: list[Entry], job_id: str) -> str:
    lines = [f"The story of job {job_id}, from the fact log:"]
    for entry in entries:
        lines.append(f"  [at {_time(entry.at)}, command {entry.command_seq}, {entry.kind}] "
                     f"{entry.sentence}")  # fmt: skip
    return "\n".join(lines)
