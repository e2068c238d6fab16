"""Job commands: submit, priority update, terminate, executor status reports, and Tick.

Submissions are idempotent (`jobId` / `clientToken`).  A derived job id (the client chose
none) is a UUID5 of the queue and the client token, or of the acceptance order and the whole
submission, so replays derive the same ids and a rival team cannot predict another's; one
already taken by another job is passed over, never refused (issue 29, point 6).  An
executor's report moves a live attempt along its lifecycle; a report about another attempt,
or one that cannot apply to the job's status, is recorded as JobReportIgnored and changes
nothing.  Registered with `round.handles`; decision.py runs them.
"""

from __future__ import annotations

import uuid

from quotasched.events import commands as C
from quotasched.events import facts as F
from quotasched.events.values import CapacityUsage, JobStatus, ReportedStatus, StatusCause
from quotasched.events.values import State as OnOff
from quotasched.services.scheduler.core import limits
from quotasched.services.scheduler.core.admission import CAPACITY_BOUNCED
from quotasched.services.scheduler.core.configure import existing_share
from quotasched.services.scheduler.core.round import Rejected, Round, fact_base, handles
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.core.timers import attempt_ended

JOB_ID_NAMESPACE = uuid.UUID("6f1c2a4e-5b7d-4c1e-9a8f-3d2b1e0c9f7a")


@handles(C.SubmitServiceJob)
def _submit(round_: Round, command: C.SubmitServiceJob) -> None:
    state = round_.state
    queue, share, names = existing_share(
        round_, command.job_queue, command.quota_share_name, command.job_id
    )
    existing = _same_submission(state, command)
    if existing is not None:
        round_.emit(F.SubmissionDeduplicated(
            **fact_base(round_), job_id=existing, client_token=command.client_token
        ))
        return
    names["job_id"] = command.job_id
    over = limits.refusal(share, round_.at, round_.size)  # first: a refusal over a limit is cheap
    if over is not None:
        raise Rejected(over, **names)
    if queue.state is OnOff.DISABLED:
        raise Rejected(f"Job queue {queue.name} is DISABLED and accepts no new jobs", **names)
    if share.state is OnOff.DISABLED:
        raise Rejected(f"Quota share {share.name} is DISABLED and accepts no new jobs", **names)
    # An explicit jobId that exists was handled by _same_submission; a derived one is free.
    if command.job_id is not None and state.was_forgotten(command.job_id):
        raise Rejected(f"Job id {command.job_id} named a job that ended and was forgotten after "
                       "its queue's retention (endedJobRetentionSeconds); a job id is never "
                       "used twice", **names)  # fmt: skip
    job_id = command.job_id or _derived_job_id(state, command)
    usage = command.capacity_usage
    if usage is None:
        usage = [CapacityUsage(capacity_unit=u, quantity=n) for u, n in command.need()]
    # Every field comes from the validated command or validated state: assembled, not
    # validated again (events.facts.job_submitted).
    round_.emit(F.job_submitted(
        command, at=round_.at, command_seq=round_.seq, job_id=job_id, job_queue=queue.name,
        quota_share_name=share.name, capacity_usage=usage,
        command_bytes=limits.counted_bytes(round_.size),
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
    """Deterministic, from what only the submitter knows: its client token if there is one,
    else the acceptance order and the submission itself (share, name, payload, every field but
    the clock, which the bus stamps): knowing the next sequence numbers is not enough to
    claim the ids another team's submissions will get.  An id a job already holds (someone
    guessed it, and chose it as a jobId), or a forgotten job held, is passed over for the next
    candidate: a submission is never refused for an id it did not choose.  Each step passes a
    distinct job, so the steps are bounded by the jobs ever accepted."""
    if command.client_token:
        basis = f"token/{command.client_token}"
    else:
        basis = f"seq/{state.next_seq}/" + command.model_dump_json(by_alias=True, exclude={"at"})
    name = f"{command.job_queue}/{basis}"
    job_id = str(uuid.uuid5(JOB_ID_NAMESPACE, name))
    passed = 0
    while job_id in state.jobs or state.was_forgotten(job_id):
        passed += 1
        job_id = str(uuid.uuid5(JOB_ID_NAMESPACE, f"{name}/taken/{passed}"))
    return job_id


def _live_job(round_: Round, job_id: str, action: str):
    job = round_.state.jobs.get(job_id)
    if job is None:
        raise Rejected(f"Job {job_id} does not exist", job_id=job_id)
    if job.status.terminal:
        raise Rejected(f"Job {job_id} is already {job.status.value}; {action}", job_id=job_id)
    return job


@handles(C.UpdateServiceJob)
def _update_job(round_: Round, command: C.UpdateServiceJob) -> None:
    job = _live_job(round_, command.job_id, "its priority can no longer change")
    round_.emit(F.job_priority_updated(
        **fact_base(round_), job_id=job.job_id, scheduling_priority=command.scheduling_priority
    ))


@handles(C.TerminateServiceJob)
def _terminate(round_: Round, command: C.TerminateServiceJob) -> None:
    job = _live_job(round_, command.job_id, "there is nothing to terminate")
    round_.emit(F.job_status_changed(
        **fact_base(round_), job_id=job.job_id, attempt=job.attempt, status=JobStatus.FAILED,
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


@handles(C.ReportJobStatus)
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
            **fact_base(round_), job_id=job.job_id, attempt=command.attempt, status=command.status,
            status_reason=ignored,
        ))  # fmt: skip
        return
    base = {**fact_base(round_), "job_id": job.job_id, "attempt": job.attempt}
    status = command.status
    if status is ReportedStatus.FAILED:
        attempt_ended(round_, job, command.status_reason or "Attempt failed", StatusCause.REPORTED)
    elif status is ReportedStatus.INSUFFICIENT_CAPACITY:
        round_.emit(F.job_status_changed(
            **base, status=JobStatus.RUNNABLE, status_reason=CAPACITY_BOUNCED,
            cause=StatusCause.CAPACITY_BOUNCE,
        ))  # fmt: skip
    else:
        round_.emit(F.job_status_changed(
            **base, status=JobStatus(status.value), status_reason=command.status_reason,
            cause=StatusCause.REPORTED,
        ))  # fmt: skip


@handles(C.Tick)
def _tick(round_: Round, command: C.Tick) -> None:
    """Timers already fired; the pass that follows runs as after any command."""
