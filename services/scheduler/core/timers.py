"""Timers that fire on logical time: attempt timeouts, job-state time limits, and the moments
an option beyond AWS lapses (a victim's protection, a preemption budget's window: wakes).

Time enters only through a command's `at`; before a command is handled, every timer that came
due up to its time fires, in deadline order (then job id), each at its own deadline, followed
by a scheduling pass at that moment.  So a `Tick` at t=1000 that finds a blocked head whose
600 s limit ran out at t=700 records the termination at t=700, and the job behind it is
dispatched at t=700, exactly as a continuously running scheduler would have done.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from quotasched.events import facts as F
from quotasched.events.values import (
    BlockedReason,
    JobStatus,
    RetryAction,
    StatusCause,
)
from quotasched.services.scheduler.core.admission import blocked_reason
from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.evolve import reset_expiry_due, retention
from quotasched.services.scheduler.core.passes import schedule
from quotasched.services.scheduler.core.round import Round
from quotasched.services.scheduler.core.state import State

ATTEMPT_TIMED_OUT = "Job attempt duration exceeded timeout"
EXPIRED_PER_COMMAND = 1_000


def earliest_due(state: State, expiries: bool = True) -> float | None:
    """A lower bound of when the next timer comes due (None: no timer is pending): the first
    attempt timeout on the heap (an entry of an ended attempt may stand before it) and the
    blocked heads' bound.  Read-only.  The service publishes a Tick only once this has
    passed, so a quiet service writes nothing (timers fire before any next command anyway,
    ruling 13); a Tick that finds the bound early fires nothing and moves it.  `expiries`:
    count retention too (the simulator leaves it out: forgetting a job decides nothing)."""
    due: float | None = None
    if state.timeouts:
        due = state.timeouts[0][0]
    if state.blocked and (due is None or state.blocked_due < due):
        due = state.blocked_due
    if state.wakes and (due is None or state.wakes[0][0] < due):
        due = state.wakes[0][0]
    if expiries and state.expiry_due != float("inf") and (due is None or state.expiry_due < due):
        due = state.expiry_due
    return due


def expire(round_: Round, until: float) -> None:
    """Forget the ended jobs whose queue's retention has passed by `until`: a JobExpired each
    (at `until`, the moment the scheduler noticed; retention is a minimum), queue by queue in
    creation order, each queue's in the order they ended, at most `EXPIRED_PER_COMMAND` per
    command so that no command's facts grow with the backlog (the rest go with the next
    command or Tick, which `earliest_due` asks for at once)."""
    state = round_.state
    if state.expiry_due > until:
        return
    left = EXPIRED_PER_COMMAND
    for name, queue in state.queues.items():
        ended = state.ended.get(name)
        keep = retention(queue)
        while ended and left > 0 and ended[0][0] + keep <= until:
            ended_at, job_id = ended[0]
            job = state.jobs[job_id]  # ended and not forgotten: still in the state
            round_.at = max(until, state.time)
            round_.emit(F.JobExpired(
                at=round_.at, command_seq=round_.seq, job_id=job_id, job_queue=name,
                quota_share_name=job.share, status=job.status, status_reason=job.status_reason,
                attempt=job.attempt, preempted_attempt_count=job.preempted_count,
                scheduling_priority=job.priority, ended_at=ended_at,
            ))  # fmt: skip
            left -= 1
    reset_expiry_due(state)  # the bound was a lower one; now exact (still due: the cap)


def fire_due(round_: Round, until: float) -> None:
    state = round_.state
    while True:
        due = _next_due(state, until)
        wake = state.wakes[0][0] if state.wakes and state.wakes[0][0] <= until else None
        if wake is not None and (due is None or wake < due[0]):
            _wake(round_, wake)
            continue
        if due is None:
            expire(round_, until)
            return
        deadline, job, reason = due
        round_.at = max(deadline, state.time)
        if reason is None:
            state.pop(state.timeouts)
            attempt_ended(round_, job, ATTEMPT_TIMED_OUT, StatusCause.ATTEMPT_TIMEOUT)
        else:
            round_.emit(F.job_status_changed(
                at=round_.at, command_seq=round_.seq, job_id=job.job_id, attempt=job.attempt,
                status=JobStatus.FAILED, cause=StatusCause.TIME_LIMIT, is_terminated=True,
                status_reason=f"Terminated by JobStateTimeLimit action due to reason: {reason}",
            ))  # fmt: skip
        schedule(round_)


def _wake(round_: Round, time: float) -> None:
    """An option beyond AWS lapses at `time` (a protection, a budget's window; victims.py):
    every head of those job queues is looked at again, at that moment.  A wake that changes
    nothing emits nothing (what could not be placed before still cannot)."""
    state = round_.state
    while state.wakes and state.wakes[0][0] <= time:
        _, queue_name = state.pop(state.wakes)
        queue = state.queues.get(queue_name)
        if queue is not None:
            state.mark_dirty(queue)
    round_.at = max(time, state.time)
    schedule(round_)


def attempt_ended(round_: Round, job: Job, reason: str, cause: StatusCause) -> None:
    """A dispatched attempt failed or timed out: retry under retryStrategy, or fail the job.

    The first `evaluateOnExit` rule whose glob matches the reason decides; EXIT fails the job
    at once, RETRY (or no matching rule) retries while attempts remain.
    """
    action = next((rule.action for rule in job.retry_rules
                   if fnmatchcase(reason, rule.on_status_reason)), RetryAction.RETRY)  # fmt: skip
    retry = action is RetryAction.RETRY and job.attempts_used < job.attempts_max
    round_.emit(F.job_status_changed(
        at=round_.at, command_seq=round_.seq, job_id=job.job_id, attempt=job.attempt,
        status=JobStatus.RUNNABLE if retry else JobStatus.FAILED, status_reason=reason,
        cause=StatusCause.RETRY if retry else cause,
    ))  # fmt: skip


def _next_due(state: State, until: float) -> tuple[float, Job, str | None] | None:
    """(deadline, job, reason or None for a timeout) of the earliest due timer, if any."""
    best: tuple[float, str, Job, str | None] | None = None
    timeouts = state.timeouts
    while timeouts:
        deadline, job_id, attempt = timeouts[0]
        job = state.jobs.get(job_id)
        # An entry counts only for the attempt that set it: an undone trial may have left one
        # for the same attempt number with another dispatch time.
        if (job is not None and job.status.dispatched and job.attempt == attempt
                and job.dispatched_at is not None and job.attempt_timeout_s is not None
                and deadline == job.dispatched_at + job.attempt_timeout_s):  # fmt: skip
            if deadline <= until:
                best = (deadline, job_id, job, None)
            break
        state.pop(timeouts)  # the attempt already ended
    if not state.blocked or state.blocked_due > until:
        return None if best is None else (best[0], best[2], best[3])
    earliest = float("inf")  # the new lower bound of the blocked heads' limits
    for job_id, (queue_name, share_name) in sorted(state.blocked.items()):
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.RUNNABLE or job.reason_code is None:
            state.drop(state.blocked, job_id)  # it left the queue, or its reason went away
            continue
        queue = state.queues.get(queue_name)
        seconds = None if queue is None else queue.time_limits.get(job.reason_code)
        since = job.reason_since
        if seconds is None or since is None:
            continue  # no limit for its reason (a queue update resets the bound)
        earliest = min(earliest, since + seconds)
        if since + seconds > until:
            continue  # not due yet: no need to look further
        limit = _time_limit(state, queue_name, share_name, job)
        if limit is None:
            continue  # not at the head right now, or its reason no longer holds
        deadline = since + limit[0]
        if best is None or (deadline, job_id) < best[:2]:
            best = (deadline, job_id, job, limit[1])
    if earliest != state.blocked_due:
        state.save(state)
        state.blocked_due = earliest
    return None if best is None else (best[0], best[2], best[3])


def _time_limit(state: State, queue_name: str, share_name: str, job: Job) -> tuple[int, str] | None:
    """(seconds, reason) if `job` heads its share now with a reason a time limit applies to.

    The clock (`reason_since`) runs only while the job is its share's head with that reason
    (ruling 14): it stops when another job goes ahead and starts again from zero when the job
    heads its share again (evolve.py keeps it).
    """
    queue = state.queues.get(queue_name)
    code = job.reason_code
    if queue is None or code is None:
        return None
    seconds = queue.time_limits.get(code)
    share = queue.shares.get(share_name)
    if seconds is None or share is None or state.head(share) is not job:
        return None
    if job.reason_code != BlockedReason.CAPACITY_INSUFFICIENT.value:
        blocked = blocked_reason(state.environments[queue.environment], queue, share, job.need)
        if blocked is None or blocked[0].value != job.reason_code:
            return None
    return seconds, code
