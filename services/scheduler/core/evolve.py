"""`evolve(state, fact) -> state`: the only way state changes, one case per fact kind.

Recovery, replay, the decision core itself (it folds each fact as it emits it) and the tests
all use this one fold, so `state == fold(facts)` holds by construction.  Evolve never decides
anything: every choice (who, how much was borrowed, requeue or fail) is in the fact.

Besides the record, evolve keeps the derived helpers current: usage totals, share heaps, the
attempt-timeout heap, the blocked-head registry and each queue's dirty set (shares whose head
may have become placeable, see `passes.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from quotasched.events import facts as F
from quotasched.events.values import ENDED_JOB_RETENTION_DEFAULT, JobStatus, PreemptionOutcome, StatusCause
from quotasched.services.scheduler.core import limits
from quotasched.services.scheduler.core.accounting import add_usage, recompute_totals
from quotasched.services.scheduler.core.fairshare import accrue, fresh
from quotasched.services.scheduler.core.victims import MAX_BUDGET
from quotasched.services.scheduler.core.entities import (
    HISTORY_KEPT,
    Environment,
    Job,
    Queue,
    Share,
)
from quotasched.services.scheduler.core.state import State

_CASES: dict[type, Callable[[State, F.Fact], None]] = {}


def evolve(state: State, fact: F.Fact) -> State:
    """Apply one fact to `state` in place and return it."""
    case = _CASES.get(type(fact))
    if case is not None:  # CommandRejected, SubmissionDeduplicated, ... change nothing
        case(state, fact)
    if fact.at > state.time:
        state.set_time(fact.at)
    return state


def fold(facts, state: State | None = None) -> State:
    state = state if state is not None else State()
    for fact in facts:
        evolve(state, fact)
    return state


def _case(kind: type):
    def register(function):
        _CASES[kind] = function
        return function

    return register


# -- configuration ---------------------------------------------------------------------------


@_case(F.ServiceEnvironmentCreated)
@_case(F.ServiceEnvironmentUpdated)
def _environment(state: State, fact) -> None:
    environment = state.environments.get(fact.service_environment)
    if environment is None:
        environment = Environment(fact.service_environment)
        state.put(state.environments, environment.name, environment)
    state.save(environment)
    environment.capacity = {item.capacity_unit: item.max_capacity for item in fact.capacity_limits}
    environment.state = fact.state
    environment.config = fact
    if environment.queue is not None:
        state.new_epoch(state.queues[environment.queue])
        state.mark_dirty(state.queues[environment.queue])


@_case(F.SchedulingPolicyCreated)
def _policy(state: State, fact: F.SchedulingPolicyCreated) -> None:
    state.put(state.policies, fact.name, fact)


@_case(F.JobQueueCreated)
@_case(F.JobQueueUpdated)
def _queue(state: State, fact) -> None:
    queue = state.queues.get(fact.job_queue)
    if queue is None:
        queue = Queue(fact.job_queue)
        state.put(state.queues, queue.name, queue)
        environment = state.environments[fact.service_environment]
        state.save(environment)
        environment.queue = queue.name
    state.save(queue)
    queue.environment = fact.service_environment
    queue.policy = fact.scheduling_policy
    queue.priority = fact.priority
    queue.state = fact.state
    queue.time_limits = {
        action.reason.value: action.max_time_seconds for action in fact.job_state_time_limit_actions
    }
    queue.config = fact
    state.new_epoch(queue)
    state.save(state)
    state.blocked_due = 0.0  # its time limits may have changed: the timers look again


@_case(F.QuotaShareCreated)
@_case(F.QuotaShareUpdated)
def _share(state: State, fact) -> None:
    queue = state.queues[fact.job_queue]
    share = queue.shares.get(fact.quota_share_name)
    created = share is None
    if share is None:
        share = Share(fact.quota_share_name, queue.name)
        state.put(queue.shares, share.name, share)
    state.save(share)
    if queue.half_life is not None:  # its borrowing may change with its limits (fairshare.py)
        if created:
            share.charge = fresh(fact.at, queue.half_life)
        else:
            accrue(state, queue, share, fact.at)
    sharing = fact.resource_sharing_configuration
    share.limits = {item.capacity_unit: item.max_capacity for item in fact.capacity_limits}
    share.strategy = sharing.strategy
    share.borrow_limit_percent = sharing.borrow_limit_percent
    share.in_share_preemption = fact.preemption_configuration.in_share_preemption.value == "ENABLED"
    share.state = fact.state
    share.config = fact
    recompute_totals(state, queue)
    state.new_epoch(queue)
    state.mark_dirty(queue)


@_case(F.QuotaShareOptionsSet)
def _share_options(state: State, fact: F.QuotaShareOptionsSet) -> None:
    queue = state.queues[fact.job_queue]
    share = queue.shares[fact.quota_share_name]
    state.save(share)
    options = fact.options
    share.min_runtime_s = options.min_runtime_before_preemption_seconds
    budget = options.preemption_budget
    share.budget = None if budget is None else (budget.max_preemptions, budget.window_seconds)
    if budget is None:
        share.preempted_at = ()  # kept only while budgeted (victims.py)
    lending = options.lending_limits
    share.lending = None if lending is None else {item.capacity_unit: item.max_capacity for item in lending}
    share.options = fact
    recompute_totals(state, queue)  # what it lends changed the queue's lendable idle
    state.new_epoch(queue)  # and what can ever be borrowed (admission)
    if share.min_runtime_s is not None:  # its running jobs' protections run out in time
        for job in share.dispatched.values():
            if job.dispatched_at is not None and job.dispatched_at + share.min_runtime_s > fact.at:
                state.push(state.wakes, (job.dispatched_at + share.min_runtime_s, queue.name))
    state.mark_dirty(queue)  # an option turned off may let a waiting head take victims now


@_case(F.JobQueueOptionsSet)
def _queue_options(state: State, fact: F.JobQueueOptionsSet) -> None:
    queue = state.queues[fact.job_queue]
    state.save(queue)
    options = fact.options
    fair = options.fair_share
    half_life = None if fair is None else fair.half_life_seconds
    if half_life != queue.half_life:  # charges start at 0 (or stop) with a new half-life
        for share in queue.shares.values():
            state.save(share)
            share.charge = () if half_life is None else fresh(fact.at, half_life)
    queue.half_life = half_life
    _derive_queue_options(queue, options)
    queue.options = fact
    reset_expiry_due(state)  # a retention changed applies to the jobs already ended too
    state.new_epoch(queue)  # a group's limit decides whether a job can ever fit (admission)
    state.mark_dirty(queue)  # a group limit lifted may let a waiting borrower through


@_case(F.QuotaShareDeleted)
def _share_deleted(state: State, fact: F.QuotaShareDeleted) -> None:
    queue = state.queues[fact.job_queue]
    state.drop(queue.shares, fact.quota_share_name)
    if queue.options is not None and fact.quota_share_name in queue.options.options.share_names():
        _forget_share(state, queue, fact.quota_share_name)
    recompute_totals(state, queue)
    state.new_epoch(queue)
    state.mark_clean(queue, fact.quota_share_name)
    state.mark_dirty(queue)


def _forget_share(state: State, queue: Queue, name: str) -> None:
    """A deleted share leaves the queue's options: its group (a group left empty goes) and its
    weight.  The queue's options read as they now are (a share created again under the name
    is in no group and weighs 1)."""
    state.save(queue)
    options = queue.options.options
    fair = options.fair_share
    if fair is not None and fair.weights:
        weights = [item for item in fair.weights if item.quota_share_name != name]
        fair = fair.model_copy(update={"weights": weights or None})
    groups = []
    for group in options.share_groups or ():
        members = [member for member in group.quota_share_names if member != name]
        if members:
            groups.append(group.model_copy(update={"quota_share_names": members}))
    options = options.model_copy(update={"fair_share": fair, "share_groups": groups or None})
    queue.options = queue.options.model_copy(update={"options": options})
    _derive_queue_options(queue, options)


def _derive_queue_options(queue: Queue, options) -> None:
    """The queue's slots the decisions read, from its options (JobQueueOptions)."""
    fair = options.fair_share
    queue.weights = {} if fair is None else {w.quota_share_name: w.weight for w in fair.weights or ()}
    groups = options.share_groups or ()
    queue.groups = {group.name: tuple(group.quota_share_names) for group in groups}
    queue.group_of = {name: group.name for group in groups for name in group.quota_share_names}
    queue.group_limits = {group.name: {item.capacity_unit: item.max_capacity for item in group.max_capacity}
                          for group in groups if group.max_capacity}  # fmt: skip

# -- jobs ------------------------------------------------------------------------------------


@_case(F.JobSubmitted)
def _submitted(state: State, fact: F.JobSubmitted) -> None:
    job = Job(fact.job_id, fact.job_name, fact.job_queue, fact.quota_share_name,
              fact.scheduling_priority, state.take_seq(),
              tuple((item.capacity_unit, item.quantity) for item in fact.capacity_usage),
              fact.at)  # fmt: skip
    if fact.preemption_configuration is not None:
        job.preemption_retries = fact.preemption_configuration.preemption_retries_before_termination
    if fact.retry_strategy is not None:
        job.attempts_max = fact.retry_strategy.attempts
        job.retry_rules = tuple(fact.retry_strategy.evaluate_on_exit)
    if fact.timeout_config is not None:
        job.attempt_timeout_s = fact.timeout_config.attempt_duration_seconds
    if fact.client_token is not None:
        job.client_token = fact.client_token
        state.put(state.client_tokens, (job.queue, fact.client_token), job.job_id)
    if fact.tags:
        job.tags = tuple(fact.tags.items())
    payload = fact.service_request_payload
    if payload is not None:
        job.payload = payload if isinstance(payload, str) else json.dumps(payload)
    state.put(state.jobs, job.job_id, job)
    share = state.queues[job.queue].shares.get(job.share)
    if share is not None:  # its admission counts (limits.py)
        state.save(share)
        share.live += 1
        share.submissions = limits.counted(share, fact.at, fact.command_bytes)
    _enqueue(state, job, fact.at)


def _ended(state: State, job, at: float) -> None:
    """A job of the share reached a final status: one fewer queued job (limits.py), and one
    more ended job for its queue's retention to forget in time (timers.py)."""
    share = state.queues[job.queue].shares.get(job.share)
    if share is not None and share.live > 0:
        state.save(share)
        share.live -= 1
    state.append_ended(job.queue, at, job.job_id)
    when = at + retention(state.queues[job.queue])
    if when < state.expiry_due:
        state.save(state)
        state.expiry_due = when


def retention(queue: Queue | None) -> int:
    """Seconds an ended job of `queue` stays in the state (its option, or the default)."""
    if queue is None or queue.options is None:
        return ENDED_JOB_RETENTION_DEFAULT
    return queue.options.options.retention()


def reset_expiry_due(state: State) -> None:
    """`expiry_due` exactly: the first ended job of any queue plus its queue's retention."""
    first = float("inf")
    for name, ended in state.ended.items():
        if ended:
            first = min(first, ended[0][0] + retention(state.queues.get(name)))
    if first != state.expiry_due:
        state.save(state)
        state.expiry_due = first


@_case(F.JobExpired)
def _expired(state: State, fact: F.JobExpired) -> None:
    """The job leaves the state (its record stays in the log and the projection)."""
    ended = state.ended.get(fact.job_queue)
    if ended and ended[0][1] == fact.job_id:  # always the front: retention forgets in end order
        state.pop_ended(fact.job_queue)
    job = state.jobs.get(fact.job_id)
    if job is None:
        return
    state.drop(state.jobs, fact.job_id)
    state.forget_id(fact.job_id)
    token = job.client_token
    if token is not None and state.client_tokens.get((job.queue, token)) == job.job_id:
        state.drop(state.client_tokens, (job.queue, token))


@_case(F.JobPriorityUpdated)
def _priority(state: State, fact: F.JobPriorityUpdated) -> None:
    job = state.jobs[fact.job_id]
    queue = state.queues[job.queue]
    share = queue.shares.get(job.share)
    runnable = job.status is JobStatus.RUNNABLE
    was_head = runnable and share is not None and state.head(share) is job
    state.save(job)
    job.priority = fact.scheduling_priority
    if runnable:
        _enqueue(state, job, fact.at)  # marks the share if the job goes ahead of its head
        if was_head and share is not None and state.head(share) is not job:
            _stop_head_clock(state, job)  # it fell behind: the new head's clock starts
            _start_head_clock(state, queue, share, fact.at)
    # A head whose priority drops may no longer be the head; a dispatched job's new priority
    # changes who may preempt it inside its share.
    if share is not None and (was_head or (job.status.dispatched and share.in_share_preemption)):
        state.mark_dirty(queue, share.name)


@_case(F.JobDispatched)
def _dispatched(state: State, fact: F.JobDispatched) -> None:
    job = state.jobs[fact.job_id]
    queue = state.queues[job.queue]
    share = queue.shares[job.share]
    state.save(job)
    job.status = JobStatus.SCHEDULED
    job.attempt = fact.attempt
    job.borrowed = tuple((item.capacity_unit, item.quantity) for item in fact.borrowed)
    job.dispatched_at = fact.at
    job.dispatch_order = state.take_dispatch()
    job.status_reason = None
    job.reason_code = None
    job.reason_since = None
    job.history = (*job.history, (fact.attempt, fact.at, None, None, None, False))[-HISTORY_KEPT:]
    state.put(share.dispatched, job.job_id, job)
    accrue(state, queue, share, fact.at)
    add_usage(state, queue, share, job.need, +1)
    state.drop(state.blocked, job.job_id)
    _start_head_clock(state, queue, share, fact.at)  # the job it leaves behind heads now
    for item in fact.borrowed:
        # The share is now over its limit in this unit: its jobs have become reclaim
        # candidates for waiting owners that need the unit, so look at those heads again.
        _wake_heads_needing(state, queue, item.capacity_unit)
    if job.attempt_timeout_s is not None:
        entry = (fact.at + job.attempt_timeout_s, job.job_id, job.attempt)
        state.push(state.timeouts, entry)  # validated when it comes due, like heap entries
    if share.min_runtime_s is not None:  # it may be a victim from then on (victims.py)
        state.push(state.wakes, (fact.at + share.min_runtime_s, queue.name))
    state.mark_dirty(queue, share.name)


@_case(F.JobPreempted)
def _preempted(state: State, fact: F.JobPreempted) -> None:
    job = state.jobs[fact.job_id]
    share = state.queues[job.queue].shares.get(job.share)
    if share is not None and share.budget is not None:  # counts against its budget (victims.py)
        window = share.budget[1]
        state.save(share)
        share.preempted_at = (*share.preempted_at, fact.at)[-MAX_BUDGET:]  # any budget's count
        state.push(state.wakes, (fact.at + window, job.queue))
    _release(state, job, fact.at)
    state.save(job)
    job.preempted_count = fact.preempted_attempt_count
    reason = f"Preempted by job {fact.preemptor_job_id} ({fact.reason.value})"
    _stop_attempt(job, fact.attempt, fact.at, reason, preempted=True)
    if fact.outcome is PreemptionOutcome.REQUEUED:
        job.status = JobStatus.RUNNABLE
        job.status_reason = reason
        _enqueue(state, job, fact.at)
    else:
        _ended(state, job, fact.at)
        job.status = JobStatus.FAILED
        job.status_reason = f"{reason}; preemptionRetriesBeforeTermination exhausted"
        job.stopped_at = fact.at


@_case(F.JobStatusChanged)
def _status(state: State, fact: F.JobStatusChanged) -> None:
    job = state.jobs[fact.job_id]
    if job.status.dispatched and not fact.status.dispatched:
        _release(state, job, fact.at)
    was_runnable = job.status is JobStatus.RUNNABLE
    state.save(job)
    if job.status.dispatched:
        if fact.status is JobStatus.STARTING or fact.status is JobStatus.RUNNING:
            _start_attempt(job, fact.attempt, fact.at)
        elif not fact.status.dispatched:
            _stop_attempt(job, fact.attempt, fact.at, fact.status_reason, preempted=False)
    if fact.status.terminal:
        job.stopped_at = fact.at
        if not job.status.terminal:
            _ended(state, job, fact.at)
    job.status = fact.status
    job.status_reason = fact.status_reason
    job.is_terminated = job.is_terminated or fact.is_terminated
    state.drop(state.blocked, job.job_id)
    if fact.status is JobStatus.RUNNABLE:
        job.reason_code = None
        job.reason_since = None
        if fact.cause is StatusCause.RETRY:
            job.attempts_used += 1
        elif fact.cause is StatusCause.CAPACITY_BOUNCE:
            job.reason_code = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
            state.block(job, state.queues[job.queue])  # for time limits (clock: at the head)
        if not was_runnable:
            _enqueue(state, job, fact.at)
    elif was_runnable:  # a queued job left its queue (terminated, time limit, share deleted)
        queue = state.queues[job.queue]
        share = queue.shares.get(job.share)
        if share is not None:
            state.mark_dirty(queue, job.share)
            _start_head_clock(state, queue, share, fact.at)


@_case(F.ShareBlocked)
def _blocked(state: State, fact: F.ShareBlocked) -> None:
    job = state.jobs[fact.job_id]
    state.save(job)
    job.status_reason = fact.status_reason
    if job.reason_code != fact.reason.value or job.reason_since is None:
        job.reason_since = fact.at  # a new reason (or a head whose clock had stopped)
    job.reason_code = fact.reason.value
    state.block(job, state.queues[fact.job_queue])


# -- helpers ---------------------------------------------------------------------------------


def _start_attempt(job: Job, attempt: int, at: float) -> None:
    """The attempt began to run (STARTING or RUNNING reported): its `startedAt`, once."""
    if job.history:
        last = job.history[-1]
        if last[0] == attempt and last[2] is None:
            job.history = (*job.history[:-1], (attempt, last[1], at, None, None, False))


def _stop_attempt(job: Job, attempt: int, at: float, reason, preempted: bool) -> None:
    """The attempt ended (finished, failed, bounced or preempted): its `stoppedAt`."""
    if job.history:
        last = job.history[-1]
        if last[0] == attempt and last[3] is None:
            job.history = (*job.history[:-1], (attempt, last[1], last[2], at, reason, preempted))


def _enqueue(state: State, job: Job, at: float) -> None:
    queue = state.queues[job.queue]
    share = queue.shares.get(job.share)
    if share is None:
        return
    entry = (-job.priority, job.seq, job.job_id)
    head = _head_besides(state, share, job)
    state.push(share.heap, entry)
    if head is None or entry < (-head.priority, head.seq, head.job_id):
        state.mark_dirty(queue, share.name)  # it goes ahead: its share must look again
        if head is not None:
            _stop_head_clock(state, head)  # the head it displaces stops its clock
        _start_head_clock(state, queue, share, at)


def _head_besides(state: State, share: Share, job: Job) -> Job | None:
    """The share's head among its other jobs, before `job` (re)joins it.  Entries of `job`
    found on top are dropped (an undone trial can leave one with the very key it is about to
    get; the push that follows puts its entry back)."""
    while True:
        head = state.head(share)
        if head is not job:
            return head
        state.pop(share.heap)


# Ruling 14: a job-state time limit counts time at the head only.  A RUNNABLE job with a
# blocked reason (`reason_code`) has `reason_since` set exactly while it heads its share: the
# clock stops when another job goes ahead of it and starts again from zero, at the fact that
# makes it the head again.  No fact of its own is needed: the fold sees every change of head.


def _stop_head_clock(state: State, job: Job) -> None:
    if job.reason_since is not None:
        state.save(job)
        job.reason_since = None


def _start_head_clock(state: State, queue: Queue, share: Share, at: float) -> None:
    head = state.head(share)
    if head is not None and head.reason_code is not None and head.reason_since is None:
        state.save(head)
        head.reason_since = at
        state.block(head, queue)  # lowers the timers' bound if this limit comes first


def _release(state: State, job: Job, at: float) -> None:
    """A dispatched job stops holding capacity.

    Its own share is marked (its head may be waiting for exactly this), and so is every clean
    share whose waiting head needs a released unit: for every other unit usage, borrowing and
    lending are unchanged.  A head its share may not borrow for waits on no unit (only its
    own share's releases help it), and a blocked head waits for a configuration change
    (which marks every share anyway).
    """
    queue: Queue = state.queues[job.queue]
    share: Share | None = queue.shares.get(job.share)
    if share is None:
        return
    state.drop(share.dispatched, job.job_id)
    accrue(state, queue, share, at)
    add_usage(state, queue, share, job.need, -1)
    state.mark_dirty(queue, share.name)  # its own head may wait for its own capacity
    for unit, _ in job.need:
        _wake_heads_needing(state, queue, unit)


def _wake_heads_needing(state: State, queue: Queue, unit: str) -> None:
    """Mark dirty the clean shares whose head needs `unit`: only they can gain from a change
    to it.  A clean share's head stays its head until the share is marked (any enqueue ahead
    of it, or the head leaving, marks it), and every check of a placement (fits, reclaim and
    in-share victims) reads only the units the head needs (`Share.waits_on`)."""
    names = queue.listing.get(unit)
    if not names:
        return
    dirty, shares = queue.dirty, queue.shares
    woken = []
    for name in names:
        if name not in dirty:
            for needed, _ in shares[name].waits_on:
                if needed == unit:
                    woken.append(name)
                    break
    if woken:
        state.mark_dirty(queue, *woken)
