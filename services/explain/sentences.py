"""The wording of the facts that concern a job: one plain sentence per fact (submitted,
dispatched and what it borrowed, preempted or preempting, blocked, its status changes), and
the small formatters of times and capacity the sentences share."""

from __future__ import annotations


from typing import Any

from quotasched.events import facts as F
from quotasched.events.values import JobStatus, PreemptionOutcome, StatusCause
from quotasched.services.explain.narrate import sentence as narrate
from quotasched.services.scheduler.core import State


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
    if before.get("order"):
        text += f"; {before['order']}"
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


def _units(items) -> str:
    return ", ".join(f"{item.quantity} x {item.capacity_unit}" for item in items)
