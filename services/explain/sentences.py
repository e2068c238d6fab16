"""The wording of the facts that concern a job: one plain sentence per fact (submitted,
dispatched and what it borrowed, preempted or preempting, blocked, its status changes), and
the small formatters of times and capacity the sentences share."""

from __future__ import annotations


from typing import Any

from quotasched.events import facts as F
from quotasched.events.labels import job_label
from quotasched.events.values import JobStatus, PreemptionOutcome, StatusCause
from quotasched.services.explain.narrate import sentence as narrate
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.waiting import who


def _sentence(state: State, fact: F.Fact, job_id: str, before: Any, context: str | None,
              preempted_for: dict[str, list[F.JobPreempted]]) -> str | None:  # fmt: skip
    """The fact's sentence, naming jobs by their labels (`events.labels`): `job_id` is the
    job whose story is told."""
    me = who(state, job_id)
    match fact:
        case F.JobSubmitted():
            return (f"{job_label(job_id, fact.job_name)} was submitted to quota share "
                    f"{fact.quota_share_name} of job queue {fact.job_queue} with priority {fact.scheduling_priority}, needing "
                    f"{_units(fact.capacity_usage)}.")  # fmt: skip
        case F.SubmissionDeduplicated():
            return f"A repeated submission of {me} was recognised; no second job was created."
        case F.CommandRejected():
            article = "An" if fact.command_kind[:1] in "AEIOU" else "A"
            return (f"{article} {fact.command_kind} command for {me} was refused: "
                    f"{fact.status_reason}")
        case F.JobPriorityUpdated():
            old = f" from {before}" if before is not None else ""
            return f"{me}'s priority was changed{old} to {fact.scheduling_priority}."
        case F.JobDispatched():
            return _dispatched_sentence(state, fact, before, preempted_for.get(job_id, []))
        case F.JobPreempted() if fact.job_id == job_id:
            outcome = (
                f"It went back to RUNNABLE, keeping its place in line (preempted "
                f"{fact.preempted_attempt_count} time(s) so far)."
                if fact.outcome is PreemptionOutcome.REQUEUED else
                f"Its preemptionRetriesBeforeTermination were used up: it FAILED (preempted "
                f"{fact.preempted_attempt_count} time(s))."
            )  # fmt: skip
            return (f"{me} (attempt {fact.attempt}) was preempted by "
                    f"{who(state, fact.preemptor_job_id)} under {fact.reason.value}. {context or ''} {outcome}").replace("  ", " ")
        case F.JobPreempted():  # the job is the preemptor
            victims = preempted_for.get(job_id, [])
            first = victims and victims[0] is fact
            victim = who(state, fact.job_id)
            text = (f"{me} preempted {victim} of quota share {fact.quota_share_name} "
                    f"under {fact.reason.value} ({victim} {fact.outcome.value.lower()}).")
            return f"{text} {context}" if first and context else text
        case F.ShareBlocked():
            return (f"{me} heads quota share {fact.quota_share_name} but can never fit as "
                    f"configured, so the share is blocked behind it: \"{fact.status_reason}\"")
        case F.JobStatusChanged():
            return _status_sentence(fact, me)
        case F.JobReportIgnored():
            return f"A status report was ignored: {narrate(fact, _labels(state, fact))}."
    return narrate(fact, _labels(state, fact))


def _labels(state: State, fact: F.Fact) -> dict[str, str]:
    """The labels of the jobs a fact names, for its one-line narration."""
    ids = [getattr(fact, "job_id", None), getattr(fact, "preemptor_job_id", None)]
    return {job_id: who(state, job_id) for job_id in ids if job_id}


def _dispatched_sentence(state: State, fact: F.JobDispatched, before: dict | None,
                         preemptions: list[F.JobPreempted]) -> str:  # fmt: skip
    text = (f"{who(state, fact.job_id)} was dispatched in quota share {fact.quota_share_name} "
            f"(attempt {fact.attempt})")
    if fact.after_preemption_of:
        reasons = sorted({p.reason.value for p in preemptions}) or ["preemption"]
        stopped = ", ".join(who(state, victim) for victim in fact.after_preemption_of)
        text += (f" once {stopped} stopped (preempted by it under "
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
    """`job_id`: how the sentence names the job (its label)."""
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
