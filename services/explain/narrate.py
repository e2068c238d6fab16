"""Facts as plain sentences, for people reading a demo, a replay or an explanation."""

from __future__ import annotations

from collections.abc import Mapping

from quotasched.events import facts as F
from quotasched.events.labels import job_label


def _units(items) -> str:
    return ", ".join(f"{item.quantity} x {item.capacity_unit}" for item in items)


class Names(dict):
    """Job id -> label (`events.labels`), learnt from the JobSubmitted facts seen so far: a
    reader that follows a log from its start (the demo, `replay --pretty`) passes it to
    `sentence` so that jobs read by name, not by UUID."""

    def see(self, fact: F.Fact) -> None:
        if isinstance(fact, F.JobSubmitted) and fact.job_name and fact.job_name != fact.job_id:
            self[fact.job_id] = job_label(fact.job_id, fact.job_name)


def sentence(fact: F.Fact, names: Mapping[str, str] | None = None) -> str:
    """One line saying what happened; every fact kind has one.  `names` labels the jobs it
    knows (`Names`); others read by id."""
    known = names or {}

    def who(job_id: str) -> str:
        return known.get(job_id, job_id)

    match fact:
        case F.JobSubmitted():
            return (f"{job_label(fact.job_id, fact.job_name)} submitted to {fact.quota_share_name} "
                    f"(priority {fact.scheduling_priority}, needs {_units(fact.capacity_usage)})")
        case F.JobDispatched():
            text = f"{who(fact.job_id)} dispatched in {fact.quota_share_name} (attempt {fact.attempt})"
            if fact.borrowed:
                text += f", borrowing {_units(fact.borrowed)}"
            if fact.after_preemption_of:
                text += f", once {', '.join(map(who, fact.after_preemption_of))} stopped"
            return text
        case F.JobPreempted():
            return (f"{who(fact.job_id)} preempted by {who(fact.preemptor_job_id)} "
                    f"({fact.reason.value}), {fact.outcome.value.lower()}; "
                    f"preempted {fact.preempted_attempt_count} time(s)")
        case F.JobPriorityUpdated():
            return f"{who(fact.job_id)} priority set to {fact.scheduling_priority}"
        case F.JobStatusChanged():
            reason = f": {fact.status_reason}" if fact.status_reason else ""
            return f"{who(fact.job_id)} is {fact.status.value} ({fact.cause.value.lower()}){reason}"
        case F.ShareBlocked():
            return (f"{fact.quota_share_name} blocked by its head job {who(fact.job_id)}: "
                    f"{fact.status_reason}")
        case F.CommandRejected():
            return f"{fact.command_kind} rejected: {fact.status_reason}"
        case F.SubmissionDeduplicated():
            return f"submission repeated: {who(fact.job_id)} already exists"
        case F.JobReportIgnored():
            return f"report {fact.status.value} for {who(fact.job_id)} ignored: {fact.status_reason}"
        case F.JobExpired():
            return (f"{who(fact.job_id)} forgotten by the scheduler ({fact.status.value} since "
                    f"{fact.ended_at:g} s, its queue's retention passed); the log and the "
                    "projection keep its record")  # fmt: skip
        case F.QuotaShareCreated() | F.QuotaShareUpdated():
            sharing = fact.resource_sharing_configuration
            verb = "created" if isinstance(fact, F.QuotaShareCreated) else "updated"
            borrow = f", borrowLimit {sharing.borrow_limit}" if sharing.borrow_limit is not None else ""
            return (f"quota share {fact.quota_share_name} {verb}: {sharing.strategy.value}{borrow}, "
                    f"limits {_limits(fact.capacity_limits)}, in-share preemption "
                    f"{fact.preemption_configuration.in_share_preemption.value}, state {fact.state.value}")
        case F.QuotaShareDeleted():
            return f"quota share {fact.quota_share_name} deleted"
        case F.QuotaShareOptionsSet():
            return f"quota share {fact.quota_share_name} options: {fact.options.summary()}"
        case F.JobQueueOptionsSet():
            return f"job queue {fact.job_queue} options: {fact.options.summary()}"
        case F.ServiceEnvironmentCreated() | F.ServiceEnvironmentUpdated():
            verb = "created" if isinstance(fact, F.ServiceEnvironmentCreated) else "updated"
            return (f"service environment {fact.service_environment} {verb}: "
                    f"{_limits(fact.capacity_limits)}, {fact.state.value}")
        case F.JobQueueCreated() | F.JobQueueUpdated():
            verb = "created" if isinstance(fact, F.JobQueueCreated) else "updated"
            return (f"job queue {fact.job_queue} {verb} on {fact.service_environment} "
                    f"with policy {fact.scheduling_policy}, {fact.state.value}")
        case F.SchedulingPolicyCreated():
            return f"scheduling policy {fact.name} created (idle capacity assigned FIFO)"
    return fact.kind  # pragma: no cover - every kind is matched above


def _limits(items) -> str:
    return ", ".join(f"{item.max_capacity} x {item.capacity_unit}" for item in items)

