"""Facts: what the scheduler decided, in the past tense.  The fact log is the record.

Every fact carries `at` (the logical time of the decision) and `commandSeq`, the position of
the command that caused it in the scheduler's input (the line number in a replay file, the
stream sequence on the bus), so an audit can re-run the core over exactly what it saw.

Facts carry everything the fold and the projections need (share, unit, quantity, how much was
borrowed, why), so nothing downstream ever recomputes a scheduling decision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from quotasched.events.base import Wire
from quotasched.events.values import (
    BlockedReason,
    CapacityUsage,
    EnvironmentCapacityLimit,
    CapacityLimit,
    JobPreemptionConfiguration,
    JobStateTimeLimitAction,
    JobQueueOptions,
    JobStatus,
    PreemptionOutcome,
    PreemptionReason,
    QuotaShareOptions,
    QuotaSharePolicy,
    ReportedStatus,
    ResourceSharingConfiguration,
    RetryStrategy,
    SharePreemptionConfiguration,
    State,
    StatusCause,
    TimeoutConfig,
)

if TYPE_CHECKING:
    from quotasched.events.commands import SubmitServiceJob


class Fact(Wire):
    kind: str
    at: float
    command_seq: int


class CommandRejected(Fact):
    kind: Literal["CommandRejected"] = "CommandRejected"
    command_kind: str
    status_reason: str
    job_id: str | None = None
    job_queue: str | None = None
    quota_share_name: str | None = None
    # An undecodable input: whole up to 256 bytes, else its first 256 bytes (for people) with
    # its size and digest; the command stream keeps it whole, and the audit re-derives this.
    raw: str | None = None
    raw_encoding: Literal["base64"] | None = None  # set when the input was not UTF-8
    raw_size: int | None = None  # set when `raw` was cut: the input's full size in bytes
    # set when `raw` was cut: sha256 of the whole input (hex); left out of the JSON otherwise,
    # so a refusal is encoded as it was before the field existed
    raw_sha256: str | None = Field(None, exclude_if=lambda value: value is None)


class ServiceEnvironmentCreated(Fact):
    kind: Literal["ServiceEnvironmentCreated"] = "ServiceEnvironmentCreated"
    service_environment: str
    capacity_limits: list[EnvironmentCapacityLimit]
    state: State


class ServiceEnvironmentUpdated(Fact):
    kind: Literal["ServiceEnvironmentUpdated"] = "ServiceEnvironmentUpdated"
    service_environment: str
    capacity_limits: list[EnvironmentCapacityLimit]
    state: State


class SchedulingPolicyCreated(Fact):
    kind: Literal["SchedulingPolicyCreated"] = "SchedulingPolicyCreated"
    name: str
    quota_share_policy: QuotaSharePolicy


class _QueueConfig(Fact):
    job_queue: str
    service_environment: str
    scheduling_policy: str
    priority: int
    state: State
    job_state_time_limit_actions: list[JobStateTimeLimitAction]


class JobQueueCreated(_QueueConfig):
    kind: Literal["JobQueueCreated"] = "JobQueueCreated"


class JobQueueUpdated(_QueueConfig):
    kind: Literal["JobQueueUpdated"] = "JobQueueUpdated"


class _ShareConfig(Fact):
    job_queue: str
    quota_share_name: str
    capacity_limits: list[CapacityLimit]
    resource_sharing_configuration: ResourceSharingConfiguration
    preemption_configuration: SharePreemptionConfiguration
    state: State


class QuotaShareCreated(_ShareConfig):
    kind: Literal["QuotaShareCreated"] = "QuotaShareCreated"


class QuotaShareUpdated(_ShareConfig):
    kind: Literal["QuotaShareUpdated"] = "QuotaShareUpdated"


class QuotaShareDeleted(Fact):
    kind: Literal["QuotaShareDeleted"] = "QuotaShareDeleted"
    job_queue: str
    quota_share_name: str


class QuotaShareOptionsSet(Fact):
    """The share's options beyond AWS are now exactly `options` (quotasched's extension)."""

    kind: Literal["QuotaShareOptionsSet"] = "QuotaShareOptionsSet"
    job_queue: str
    quota_share_name: str
    options_version: int
    options: QuotaShareOptions


class JobQueueOptionsSet(Fact):
    """The job queue's options beyond AWS are now exactly `options` (quotasched's extension)."""

    kind: Literal["JobQueueOptionsSet"] = "JobQueueOptionsSet"
    job_queue: str
    options_version: int
    options: JobQueueOptions


class JobSubmitted(Fact):
    """A job was accepted; it is RUNNABLE from here on (SUBMITTED lasts no logical time)."""

    kind: Literal["JobSubmitted"] = "JobSubmitted"
    job_id: str
    job_name: str
    job_queue: str
    quota_share_name: str
    scheduling_priority: int
    capacity_usage: list[CapacityUsage]
    preemption_configuration: JobPreemptionConfiguration | None = None
    retry_strategy: RetryStrategy | None = None
    timeout_config: TimeoutConfig | None = None
    client_token: str | None = None
    tags: dict[str, str] | None = None
    service_request_payload: dict[str, Any] | str | None = None
    # The submission's size when it counts against its share's byte limit (core/limits.py:
    # over 16 KiB); written only then, so other submissions' facts read as before.
    command_bytes: int | None = Field(None, exclude_if=lambda value: value is None)


def job_submitted(command: SubmitServiceJob, *, at: float, command_seq: int, job_id: str,
                  job_queue: str, quota_share_name: str,
                  capacity_usage: list[CapacityUsage],
                  command_bytes: int | None = None) -> JobSubmitted:  # fmt: skip
    """The JobSubmitted recording an accepted submission, assembled without validating again.

    Validating it costs ~3 us, most of what deciding a submission that only queues costs, and
    would check nothing new: every field is either a value of the validated command or one
    the core takes from validated state (the job's id, the queue's and the share's names, the
    need as CapacityUsage models).  tests/unit/test_fact_assembly.py holds the result equal,
    field for field and byte for byte, to `JobSubmitted(...)` with the same arguments, which
    stays the way to build one from anything else.
    """
    fields = {
        "kind": "JobSubmitted", "at": float(at), "command_seq": command_seq, "job_id": job_id,
        "job_name": command.job_name, "job_queue": job_queue,
        "quota_share_name": quota_share_name,
        "scheduling_priority": command.scheduling_priority, "capacity_usage": capacity_usage,
        "preemption_configuration": command.preemption_configuration,
        "retry_strategy": command.retry_strategy, "timeout_config": command.timeout_config,
        "client_token": command.client_token, "tags": command.tags,
        "service_request_payload": command.service_request_payload,
        "command_bytes": command_bytes,
    }  # fmt: skip
    named = _SUBMITTED_SET if command_bytes is not None else _SUBMITTED_SET_SMALL
    return _assembled(JobSubmitted, fields, named)


def _assembled(cls: type, fields: dict[str, Any], named: frozenset[str]) -> Any:
    """An instance of `cls` holding `fields` (every field, in declaration order), `named`
    being the fields given by name: what pydantic's validation sets on a new model (pydantic
    2.14's BaseModel layout), without validating."""
    fact: Any = object.__new__(cls)
    _set(fact, "__dict__", fields)
    _set(fact, "__pydantic_fields_set__", set(named))
    _set(fact, "__pydantic_extra__", None)
    _set(fact, "__pydantic_private__", None)
    return fact


_set = object.__setattr__


# The fields the core names when it builds a JobSubmitted (all but `kind`).
_SUBMITTED_SET = frozenset(JobSubmitted.model_fields) - {"kind"}
_SUBMITTED_SET_SMALL = _SUBMITTED_SET - {"command_bytes"}  # a submission whose bytes don't count


class SubmissionDeduplicated(Fact):
    """A repeated `jobId` or `clientToken`: the job already exists, nothing new was created."""

    kind: Literal["SubmissionDeduplicated"] = "SubmissionDeduplicated"
    job_id: str
    client_token: str | None = None


class JobPriorityUpdated(Fact):
    kind: Literal["JobPriorityUpdated"] = "JobPriorityUpdated"
    job_id: str
    scheduling_priority: int


def job_priority_updated(*, at: float, command_seq: int, job_id: str,
                         scheduling_priority: int) -> JobPriorityUpdated:  # fmt: skip
    """`JobPriorityUpdated(...)` assembled without validating again (see `job_status_changed`)."""
    fields = {"kind": "JobPriorityUpdated", "at": float(at), "command_seq": command_seq,
              "job_id": job_id, "scheduling_priority": scheduling_priority}  # fmt: skip
    return _assembled(JobPriorityUpdated, fields, _PRIORITY_SET)


_PRIORITY_SET = frozenset(JobPriorityUpdated.model_fields) - {"kind"}


class JobDispatched(Fact):
    kind: Literal["JobDispatched"] = "JobDispatched"
    job_id: str
    attempt: int
    job_queue: str
    quota_share_name: str
    capacity_usage: list[CapacityUsage]
    borrowed: list[CapacityUsage]
    after_preemption_of: list[str]


def job_dispatched(*, at: float, command_seq: int, job_id: str, attempt: int, job_queue: str,
                   quota_share_name: str, capacity_usage: Iterable[tuple[str, int]],
                   borrowed: Iterable[tuple[str, int]],
                   after_preemption_of: list[str]) -> JobDispatched:  # fmt: skip
    """`JobDispatched(...)` with these values, the (unit, quantity) pairs as CapacityUsage,
    assembled without validating again (see `job_status_changed`): 3.6 us validated, most of
    it the usage items."""
    fields = {"kind": "JobDispatched", "at": float(at), "command_seq": command_seq,
              "job_id": job_id, "attempt": attempt, "job_queue": job_queue,
              "quota_share_name": quota_share_name, "capacity_usage": usages(capacity_usage),
              "borrowed": usages(borrowed), "after_preemption_of": after_preemption_of}  # fmt: skip
    return _assembled(JobDispatched, fields, _DISPATCHED_SET)


_DISPATCHED_SET = frozenset(JobDispatched.model_fields) - {"kind"}


def usages(pairs: Iterable[tuple[str, int]]) -> list[CapacityUsage]:
    """CapacityUsage items of (unit, quantity) pairs taken from validated state, unvalidated."""
    return [_assembled(CapacityUsage, {"capacity_unit": unit, "quantity": quantity}, _USAGE_SET)
            for unit, quantity in pairs]  # fmt: skip


_USAGE_SET = frozenset(CapacityUsage.model_fields)


class JobPreempted(Fact):
    kind: Literal["JobPreempted"] = "JobPreempted"
    job_id: str
    attempt: int
    job_queue: str
    quota_share_name: str
    preemptor_job_id: str
    reason: PreemptionReason
    outcome: PreemptionOutcome
    preempted_attempt_count: int


class JobStatusChanged(Fact):
    kind: Literal["JobStatusChanged"] = "JobStatusChanged"
    job_id: str
    attempt: int
    status: JobStatus
    status_reason: str | None
    cause: StatusCause
    is_terminated: bool = False


def job_status_changed(*, at: float, command_seq: int, job_id: str, attempt: int,
                       status: JobStatus, status_reason: str | None, cause: StatusCause,
                       is_terminated: bool | None = None) -> JobStatusChanged:  # fmt: skip
    """`JobStatusChanged(...)` with these values, assembled without validating again, as
    `job_submitted` is: every value is the core's, of the type declared here (the compiled
    core is type-checked against it), so validating them would check nothing new and cost
    about 1 us of a report's decision (2.2 us against 1.1 us; 2026-12-05, this machine).
    tests/unit/test_fact_assembly.py holds the two equal, field for field and byte for byte."""
    fields = {"kind": "JobStatusChanged", "at": float(at), "command_seq": command_seq,
              "job_id": job_id, "attempt": attempt, "status": status,
              "status_reason": status_reason, "cause": cause,
              "is_terminated": False if is_terminated is None else is_terminated}  # fmt: skip
    return _assembled(JobStatusChanged, fields,
                      _STATUS_SET if is_terminated is not None else _STATUS_SET_SMALL)


_STATUS_SET = frozenset(JobStatusChanged.model_fields) - {"kind"}
_STATUS_SET_SMALL = _STATUS_SET - {"is_terminated"}


class ShareBlocked(Fact):
    """The head job of a share can never fit as configured; the share waits behind it."""

    kind: Literal["ShareBlocked"] = "ShareBlocked"
    job_queue: str
    quota_share_name: str
    job_id: str
    reason: BlockedReason
    status_reason: str


class JobReportIgnored(Fact):
    """A status report about an attempt that is not the job's live one: recorded, no effect."""

    kind: Literal["JobReportIgnored"] = "JobReportIgnored"
    job_id: str
    attempt: int | None
    status: ReportedStatus
    status_reason: str


class JobExpired(Fact):
    """An ended job left the scheduler's state: its queue's retention
    (`endedJobRetentionSeconds`, seven days by default) passed since it ended.  Its record
    stays in the log and the projection; the fact repeats the job's final status, so a reader
    of the log alone (an audit, `quotasched replay --state-out`) still knows how it ended.
    Its id and client token may be used again afterwards."""

    kind: Literal["JobExpired"] = "JobExpired"
    job_id: str
    job_queue: str
    quota_share_name: str
    status: JobStatus
    status_reason: str | None
    attempt: int
    preempted_attempt_count: int
    scheduling_priority: int
    ended_at: float


AnyFact = Annotated[
    CommandRejected
    | ServiceEnvironmentCreated
    | ServiceEnvironmentUpdated
    | SchedulingPolicyCreated
    | JobQueueCreated
    | JobQueueUpdated
    | QuotaShareCreated
    | QuotaShareUpdated
    | QuotaShareDeleted
    | QuotaShareOptionsSet
    | JobQueueOptionsSet
    | JobSubmitted
    | SubmissionDeduplicated
    | JobPriorityUpdated
    | JobDispatched
    | JobPreempted
    | JobStatusChanged
    | ShareBlocked
    | JobReportIgnored
    | JobExpired,
    Field(discriminator="kind"),
]
