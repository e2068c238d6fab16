"""The entry points of the decision core: `step`, `decide` and `decide_raw`.

    step(state, command, seq)   -> facts   decides and folds the facts into `state`
    decide(state, command, seq) -> facts   the same, then undoes every change: pure
    decide_raw(state, data, seq)           from undecoded bytes: a bad message becomes a
                                           CommandRejected that keeps the raw text

Each command is handled in the same order: the logical time is fixed (the larger of its `at`
and the time so far, ruling 9); timers that came due fire; the command is validated against
the state (a refusal is a `CommandRejected` fact naming the problem, AWS ClientException style)
and applied; and a scheduling pass runs (ruling 4).

No I/O, no clock, no randomness, no logging: the same commands give the same facts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from events import commands as C
from events import facts as F
from events.codec import DecodeError, decode_command
from events.values import (
    CapacityUsage,
    JobStatus,
    ReportedStatus,
    ResourceSharingConfiguration,
    SharingStrategy,
    State as OnOff,
    StatusCause,
)
from services.scheduler.core.admission import CAPACITY_BOUNCED
from services.scheduler.core.evolve import evolve
from services.scheduler.core.passes import schedule
from services.scheduler.core.round import Round
from services.scheduler.core.state import State
from services.scheduler.core.timers import attempt_ended, fire_due

MAX_ENVIRONMENTS = 50
MAX_QUEUES = 50
MAX_SHARES_PER_QUEUE = 20
JOB_ID_NAMESPACE = uuid.UUID("6f1c2a4e-5b7d-4c1e-9a8f-3d2b1e0c9f7a")

_HANDLERS: dict[type, Callable[[Round, C.Command], None]] = {}


class Rejected(Exception):
    """Raised by a handler before it emits anything; becomes a CommandRejected fact."""

    def __init__(self, reason: str, **names: str | None):
        super().__init__(reason)
        self.reason = reason
        self.names = names


def step(state: State, command: C.Command, seq: int, stamp: float | None = None) -> list[F.Fact]:
    """Decide `command` (the `seq`-th input) and fold its facts into `state`.

    `stamp` is the time to use when the command carries no `at` (the service passes the
    stream's timestamp); without either, the command happens at the current time.
    """
    at = command.at if command.at is not None else stamp
    at = state.time if at is None else max(at, state.time)
    round_ = Round(state, seq, at)
    if state.timeouts or state.blocked:
        fire_due(round_, at)
        round_.at = at
    try:
        _HANDLERS[type(command)](round_, command)
    except Rejected as rejected:
        round_.emit(F.CommandRejected(
            at=at, command_seq=seq, command_kind=command.kind, status_reason=rejected.reason,
            **{key: value for key, value in rejected.names.items() if value is not None},
        ))  # fmt: skip
    schedule(round_)
    if at > state.time:
        # Ruling 9 counts time from the previous *command*, silent ones (an idle Tick)
        # included.  Such a command leaves no fact, so until the next fact records a time
        # the fold of the log may lag the live clock; every later fact carries the clamped
        # time, and the command stream (kept for audits) has the silent command itself.
        state.set_time(at)
    return round_.facts


def catch_up_clock(state: State, data: bytes | str, stamp: float | None = None) -> None:
    """Set the clock as deciding this (already recorded) command set it, without deciding it.

    Recovery folds the fact log and then decides again every command after the last one the
    log records.  The last recorded command itself may have moved the clock past its own facts
    (a Tick whose only fact is a timer stamped at its earlier deadline); this restores that.
    """
    try:
        command = decode_command(data)
    except DecodeError:
        return
    at = command.at if command.at is not None else stamp
    if at is not None and at > state.time:
        state.set_time(at)


def decide(state: State, command: C.Command, seq: int) -> list[F.Fact]:
    """The facts `command` would produce, leaving `state` exactly as it was."""
    with state.trial():
        return step(state, command, seq)


def step_raw(state: State, data: bytes | str, seq: int) -> list[F.Fact]:
    """Like `step`, from a message that may not even be JSON: nothing is ever lost."""
    try:
        command = decode_command(data)
    except DecodeError as error:
        return reject_undecodable(state, error, seq, state.time)
    return step(state, command, seq)


RAW_KEPT_CHARS = 64 * 1024


def reject_undecodable(state: State, error: DecodeError, seq: int, stamp: float) -> list[F.Fact]:
    """A message that is not a valid command: recorded with everything it claimed to be.

    Its text is kept up to 64 KiB (escaped into JSON, a hostile 1 MB message could grow six
    times); the command log keeps the message itself, whole.
    """
    raw, size = error.raw, None
    if len(raw) > RAW_KEPT_CHARS:
        raw, size = raw[:RAW_KEPT_CHARS], len(error.raw.encode())
    return reject(
        state, error.kind or "Unknown", error.reason, seq,
        error.at if error.at is not None else stamp, raw=raw, raw_size=size,
        raw_encoding=error.raw_encoding, job_id=error.job_id, job_queue=error.job_queue,
        quota_share_name=error.quota_share_name,
    )  # fmt: skip


def reject(state: State, kind: str, reason: str, seq: int, at: float, **names: str | None) -> list[F.Fact]:
    """Refuse a command before the core could read it (undecodable, or misrouted on the bus)."""
    fact = F.CommandRejected(
        at=max(at, state.time), command_seq=seq, command_kind=kind, status_reason=reason,
        **{key: value for key, value in names.items() if value is not None},
    )  # fmt: skip
    evolve(state, fact)
    return [fact]


def _handles(kind: type):
    def register(function):
        _HANDLERS[kind] = function
        return function

    return register


def _base(round_: Round) -> dict:
    return {"at": round_.at, "command_seq": round_.seq}


# -- configuration ---------------------------------------------------------------------------


@_handles(C.CreateServiceEnvironment)
def _create_environment(round_: Round, command: C.CreateServiceEnvironment) -> None:
    name = command.service_environment_name
    environments = round_.state.environments
    if name in environments:
        raise Rejected(f"Service environment {name} already exists")
    if len(environments) >= MAX_ENVIRONMENTS:
        raise Rejected(f"Limit of {MAX_ENVIRONMENTS} service environments reached")
    round_.emit(F.ServiceEnvironmentCreated(
        **_base(round_), service_environment=name, capacity_limits=command.capacity_limits,
        state=command.state,
    ))  # fmt: skip


@_handles(C.UpdateServiceEnvironment)
def _update_environment(round_: Round, command: C.UpdateServiceEnvironment) -> None:
    environment = round_.state.environments.get(command.service_environment)
    if environment is None:
        raise Rejected(f"Service environment {command.service_environment} does not exist")
    current = environment.config
    round_.emit(F.ServiceEnvironmentUpdated(
        **_base(round_), service_environment=environment.name,
        capacity_limits=command.capacity_limits or current.capacity_limits,
        state=command.state or current.state,
    ))  # fmt: skip


@_handles(C.CreateSchedulingPolicy)
def _create_policy(round_: Round, command: C.CreateSchedulingPolicy) -> None:
    if command.name in round_.state.policies:
        raise Rejected(f"Scheduling policy {command.name} already exists")
    round_.emit(F.SchedulingPolicyCreated(
        **_base(round_), name=command.name, quota_share_policy=command.quota_share_policy
    ))


@_handles(C.CreateJobQueue)
def _create_queue(round_: Round, command: C.CreateJobQueue) -> None:
    state, name = round_.state, command.job_queue_name
    environment_name = command.service_environment_order[0].service_environment
    environment = state.environments.get(environment_name)
    if name in state.queues:
        raise Rejected(f"Job queue {name} already exists")
    if len(state.queues) >= MAX_QUEUES:
        raise Rejected(f"Limit of {MAX_QUEUES} job queues reached")
    if command.scheduling_policy not in state.policies:
        raise Rejected(f"Scheduling policy {command.scheduling_policy} does not exist")
    if environment is None:
        raise Rejected(f"Service environment {environment_name} does not exist")
    if environment.queue is not None:
        raise Rejected(
            f"Service environment {environment_name} is already attached to job queue "
            f"{environment.queue}; a quota-management environment serves one job queue"
        )
    round_.emit(F.JobQueueCreated(
        **_base(round_), job_queue=name, service_environment=environment_name,
        scheduling_policy=command.scheduling_policy, priority=command.priority,
        state=command.state, job_state_time_limit_actions=command.job_state_time_limit_actions,
    ))  # fmt: skip


@_handles(C.UpdateJobQueue)
def _update_queue(round_: Round, command: C.UpdateJobQueue) -> None:
    queue = round_.state.queues.get(command.job_queue)
    if queue is None:
        raise Rejected(f"Job queue {command.job_queue} does not exist", job_queue=command.job_queue)
    current = queue.config
    actions = command.job_state_time_limit_actions
    round_.emit(F.JobQueueUpdated(
        **_base(round_), job_queue=queue.name, service_environment=queue.environment,
        scheduling_policy=queue.policy,
        priority=current.priority if command.priority is None else command.priority,
        state=command.state or current.state,
        job_state_time_limit_actions=current.job_state_time_limit_actions if actions is None else actions,
    ))  # fmt: skip


def _sharing(config: ResourceSharingConfiguration) -> ResourceSharingConfiguration:
    """Spell out AWS's default borrowLimit (-1, unlimited) so the record is explicit."""
    if config.strategy is SharingStrategy.LEND_AND_BORROW and config.borrow_limit is None:
        return ResourceSharingConfiguration(strategy=config.strategy, borrow_limit=-1)
    return config


@_handles(C.CreateQuotaShare)
def _create_share(round_: Round, command: C.CreateQuotaShare) -> None:
    names = {"job_queue": command.job_queue, "quota_share_name": command.quota_share_name}
    queue = round_.state.queues.get(command.job_queue)
    if queue is None:
        raise Rejected(f"Job queue {command.job_queue} does not exist", **names)
    if command.quota_share_name in queue.shares:
        raise Rejected(
            f"Quota share {command.quota_share_name} already exists in job queue {queue.name}",
            **names,
        )
    if len(queue.shares) >= MAX_SHARES_PER_QUEUE:
        raise Rejected(
            f"Job queue {queue.name} already has {MAX_SHARES_PER_QUEUE} quota shares, "
            "the most a job queue can have", **names,
        )  # fmt: skip
    round_.emit(F.QuotaShareCreated(
        **_base(round_), **names, capacity_limits=command.capacity_limits,
        resource_sharing_configuration=_sharing(command.resource_sharing_configuration),
        preemption_configuration=command.preemption_configuration, state=command.state,
    ))  # fmt: skip


def _existing_share(round_: Round, job_queue: str, share_name: str, job_id: str | None = None):
    names = {"job_queue": job_queue, "quota_share_name": share_name}
    queue = round_.state.queues.get(job_queue)
    if queue is None:
        raise Rejected(f"Job queue {job_queue} does not exist", job_id=job_id, **names)
    share = queue.shares.get(share_name)
    if share is None:
        raise Rejected(f"Quota share {share_name} does not exist in job queue {job_queue}",
                       job_id=job_id, **names)  # fmt: skip
    return queue, share, names


@_handles(C.UpdateQuotaShare)
def _update_share(round_: Round, command: C.UpdateQuotaShare) -> None:
    _, share, names = _existing_share(round_, command.job_queue, command.quota_share_name)
    current = share.config
    sharing = command.resource_sharing_configuration
    round_.emit(F.QuotaShareUpdated(
        **_base(round_), **names,
        capacity_limits=command.capacity_limits or current.capacity_limits,
        resource_sharing_configuration=(
            _sharing(sharing) if sharing else current.resource_sharing_configuration
        ),
        preemption_configuration=command.preemption_configuration or current.preemption_configuration,
        state=command.state or current.state,
    ))  # fmt: skip


@_handles(C.DeleteQuotaShare)
def _delete_share(round_: Round, command: C.DeleteQuotaShare) -> None:
    queue, share, names = _existing_share(round_, command.job_queue, command.quota_share_name)
    if share.state is not OnOff.DISABLED:
        raise Rejected(
            f"Quota share {share.name} must be DISABLED before it can be deleted", **names
        )
    doomed = [job for job in round_.state.jobs.values()
              if job.queue == queue.name and job.share == share.name and not job.status.terminal]
    for job in doomed:  # jobs dict order is acceptance order
        round_.emit(F.JobStatusChanged(
            **_base(round_), job_id=job.job_id, attempt=job.attempt, status=JobStatus.FAILED,
            status_reason=f"Quota share {share.name} was deleted",
            cause=StatusCause.SHARE_DELETED, is_terminated=True,
        ))  # fmt: skip
    round_.emit(F.QuotaShareDeleted(**_base(round_), **names))


# -- jobs ------------------------------------------------------------------------------------


@_handles(C.SubmitServiceJob)
def _submit(round_: Round, command: C.SubmitServiceJob) -> None:
    state = round_.state
    queue, share, names = _existing_share(
        round_, command.job_queue, command.quota_share_name, command.job_id
    )
    existing = _same_submission(state, command)
    if existing is not None:
        round_.emit(F.SubmissionDeduplicated(
            **_base(round_), job_id=existing, client_token=command.client_token
        ))
        return
    names["job_id"] = command.job_id
    if queue.state is OnOff.DISABLED:
        raise Rejected(f"Job queue {queue.name} is DISABLED and accepts no new jobs", **names)
    if share.state is OnOff.DISABLED:
        raise Rejected(f"Quota share {share.name} is DISABLED and accepts no new jobs", **names)
    job_id = command.job_id or _derived_job_id(state, command)
    if job_id in state.jobs:
        raise Rejected(f"Job id {job_id} is already used by another job", **names)
    usage = command.capacity_usage
    if usage is None:
        usage = [CapacityUsage(capacity_unit=u, quantity=n) for u, n in command.need()]
    round_.emit(F.JobSubmitted(
        at=round_.at, command_seq=round_.seq, job_id=job_id, job_name=command.job_name,
        job_queue=queue.name, quota_share_name=share.name,
        scheduling_priority=command.scheduling_priority, capacity_usage=usage,
        preemption_configuration=command.preemption_configuration,
        retry_strategy=command.retry_strategy, timeout_config=command.timeout_config,
        client_token=command.client_token, tags=command.tags,
        service_request_payload=command.service_request_payload,
    ))  # fmt: skip


def _same_submission(state: State, command: C.SubmitServiceJob) -> str | None:
    """The id of the job this submission repeats (same clientToken, or same jobId), if any."""
    job_id = None
    if command.client_token is not None:
        job_id = state.client_tokens.get((command.job_queue, command.client_token))
    if job_id is None and command.job_id is not None:
        job_id = command.job_id if command.job_id in state.jobs else None
    if job_id is None:
        return None
    job = state.jobs[job_id]
    if (job.queue, job.share, job.job_name) != (
        command.job_queue, command.quota_share_name, command.job_name
    ):
        raise Rejected(
            f"Job id {job_id} already exists with a different job name, queue or quota share",
            job_id=job_id, job_queue=command.job_queue, quota_share_name=command.quota_share_name,
        )  # fmt: skip
    return job_id


def _derived_job_id(state: State, command: C.SubmitServiceJob) -> str:
    """Deterministic: from the client token if there is one, else from acceptance order."""
    basis = f"token/{command.client_token}" if command.client_token else f"seq/{state.next_seq}"
    return str(uuid.uuid5(JOB_ID_NAMESPACE, f"{command.job_queue}/{basis}"))


def _live_job(round_: Round, job_id: str, action: str):
    job = round_.state.jobs.get(job_id)
    if job is None:
        raise Rejected(f"Job {job_id} does not exist", job_id=job_id)
    if job.status.terminal:
        raise Rejected(f"Job {job_id} is already {job.status.value}; {action}", job_id=job_id)
    return job


@_handles(C.UpdateServiceJob)
def _update_job(round_: Round, command: C.UpdateServiceJob) -> None:
    job = _live_job(round_, command.job_id, "its priority can no longer change")
    round_.emit(F.JobPriorityUpdated(
        **_base(round_), job_id=job.job_id, scheduling_priority=command.scheduling_priority
    ))


@_handles(C.TerminateServiceJob)
def _terminate(round_: Round, command: C.TerminateServiceJob) -> None:
    job = _live_job(round_, command.job_id, "there is nothing to terminate")
    round_.emit(F.JobStatusChanged(
        **_base(round_), job_id=job.job_id, attempt=job.attempt, status=JobStatus.FAILED,
        status_reason=command.reason, cause=StatusCause.TERMINATED, is_terminated=True,
    ))  # fmt: skip


# Which job statuses each report may move a live attempt from.
_REPORT_FROM = {
    ReportedStatus.STARTING: {JobStatus.SCHEDULED},
    ReportedStatus.RUNNING: {JobStatus.SCHEDULED, JobStatus.STARTING},
    ReportedStatus.SUCCEEDED: {JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING},
    ReportedStatus.FAILED: {JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING},
    ReportedStatus.INSUFFICIENT_CAPACITY: {JobStatus.SCHEDULED, JobStatus.STARTING},
}


@_handles(C.ReportJobStatus)
def _report(round_: Round, command: C.ReportJobStatus) -> None:
    job = round_.state.jobs.get(command.job_id)
    if job is None:
        raise Rejected(f"Job {command.job_id} does not exist", job_id=command.job_id)
    attempt = command.attempt if command.attempt is not None else job.attempt
    ignored = None
    if not job.status.dispatched or attempt != job.attempt:
        ignored = (
            f"attempt {attempt} is not running: job {job.job_id} is {job.status.value}"
            + (f" and its latest attempt is {job.attempt}" if job.attempt else "")
        )
    elif job.status not in _REPORT_FROM[command.status]:
        ignored = f"job {job.job_id} is {job.status.value}; a {command.status.value} report can't apply"
    if ignored is not None:
        round_.emit(F.JobReportIgnored(
            **_base(round_), job_id=job.job_id, attempt=command.attempt, status=command.status,
            status_reason=ignored,
        ))  # fmt: skip
        return
    base = {**_base(round_), "job_id": job.job_id, "attempt": job.attempt}
    status = command.status
    if status is ReportedStatus.FAILED:
        attempt_ended(round_, job, command.status_reason or "Attempt failed", StatusCause.REPORTED)
    elif status is ReportedStatus.INSUFFICIENT_CAPACITY:
        round_.emit(F.JobStatusChanged(
            **base, status=JobStatus.RUNNABLE, status_reason=CAPACITY_BOUNCED,
            cause=StatusCause.CAPACITY_BOUNCE,
        ))  # fmt: skip
    else:
        round_.emit(F.JobStatusChanged(
            **base, status=JobStatus(status.value), status_reason=command.status_reason,
            cause=StatusCause.REPORTED,
        ))  # fmt: skip


@_handles(C.Tick)
def _tick(round_: Round, command: C.Tick) -> None:
    """Timers already fired; the pass that follows runs as after any command."""
