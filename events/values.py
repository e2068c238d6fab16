"""Value types shared by commands and facts: capacity, sharing strategy, preemption, retries.

Enumerations carry AWS's own spellings.  Structural limits of the spec (1-5 capacity limits,
`maxCapacity >= 1`, `borrowLimit >= -1` and only with LEND_AND_BORROW, ...) are checked here, so
a message that passes validation is well formed and only *semantic* checks (does the queue
exist?) are left to the decision core.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from quotasched.events.base import INT32_MAX, MAX_INSTANCES, Name, NameOrArn, Wire


class State(str, Enum):
    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


class SharingStrategy(str, Enum):
    RESERVE = "RESERVE"
    LEND = "LEND"
    LEND_AND_BORROW = "LEND_AND_BORROW"

    # Plain attributes of each member, not properties: the decision core reads them on every
    # pass, and a property is a Python call each time (events/ is not compiled).
    lends: bool
    borrows: bool

    def __init__(self, value: str) -> None:
        self.lends = value != "RESERVE"
        self.borrows = value == "LEND_AND_BORROW"


class InSharePreemption(str, Enum):
    ENABLED = "ENABLED"
    DISABLED = "DISABLED"


class JobStatus(str, Enum):
    SUBMITTED = "SUBMITTED"
    RUNNABLE = "RUNNABLE"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    # Attributes of each member, not properties (see SharingStrategy).
    dispatched: bool
    """SCHEDULED, STARTING and RUNNING hold capacity; nothing else does."""
    terminal: bool
    """SUCCEEDED and FAILED: the job is over."""

    def __init__(self, value: str) -> None:
        self.dispatched = value in ("SCHEDULED", "STARTING", "RUNNING")
        self.terminal = value in ("SUCCEEDED", "FAILED")


class ReportedStatus(str, Enum):
    """What an executor may report about an attempt."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    INSUFFICIENT_CAPACITY = "INSUFFICIENT_CAPACITY"


class PreemptionReason(str, Enum):
    CROSS_SHARE_RECLAIM = "CROSS_SHARE_RECLAIM"
    IN_SHARE_PRIORITY = "IN_SHARE_PRIORITY"


class PreemptionOutcome(str, Enum):
    REQUEUED = "REQUEUED"
    FAILED = "FAILED"


class BlockedReason(str, Enum):
    """The reason codes of a blocked head job, as `jobStateTimeLimitActions` name them."""

    CAPACITY_INSUFFICIENT = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"
    SERVICE_ENVIRONMENT_MAX_RESOURCE = "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE"
    QUOTA_MANAGEMENT_LIMIT_EXCEEDED = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"


class StatusCause(str, Enum):
    """Why a `JobStatusChanged` happened: the fold needs it, readers like it."""

    REPORTED = "REPORTED"  # an executor reported STARTING / RUNNING / SUCCEEDED / FAILED
    RETRY = "RETRY"  # a failed attempt went back to RUNNABLE under retryStrategy
    CAPACITY_BOUNCE = "CAPACITY_BOUNCE"  # SageMaker lacked capacity: back to RUNNABLE
    ATTEMPT_TIMEOUT = "ATTEMPT_TIMEOUT"  # timeoutConfig.attemptDurationSeconds ran out
    TERMINATED = "TERMINATED"  # TerminateServiceJob
    TIME_LIMIT = "TIME_LIMIT"  # a jobStateTimeLimitActions entry fired
    SHARE_DELETED = "SHARE_DELETED"  # the job's quota share was deleted
    UNBLOCKED = "UNBLOCKED"  # the head's blocked reason no longer holds


Count = Annotated[int, Field(ge=1, le=MAX_INSTANCES)]
"""A number of instances of one unit: 1 to MAX_INSTANCES."""


class CapacityLimit(Wire):
    capacity_unit: Annotated[str, Field(min_length=1, max_length=128)]
    max_capacity: Count


class EnvironmentCapacityLimit(Wire):
    """A service environment's ceiling for one unit; 0 is allowed (a drained pool)."""

    capacity_unit: Annotated[str, Field(min_length=1, max_length=128)]
    max_capacity: Annotated[int, Field(ge=0, le=MAX_INSTANCES)]


class CapacityUsage(Wire):
    capacity_unit: Annotated[str, Field(min_length=1, max_length=128)]
    quantity: Count


def _unique_units(items: list, what: str) -> list:
    if len(items) < 2:
        return items
    units = [item.capacity_unit for item in items]
    duplicates = sorted({unit for unit in units if units.count(unit) > 1})
    if duplicates:
        raise ValueError(f"{what} lists capacity unit {duplicates[0]} more than once")
    return items


ShareLimits = Annotated[
    list[CapacityLimit],
    Field(min_length=1, max_length=5),
    AfterValidator(lambda items: _unique_units(items, "capacityLimits")),
]
EnvironmentLimits = Annotated[
    list[EnvironmentCapacityLimit],
    Field(min_length=1, max_length=5),
    AfterValidator(lambda items: _unique_units(items, "capacityLimits")),
]
Usage = Annotated[
    list[CapacityUsage],
    Field(min_length=1, max_length=5),
    AfterValidator(lambda items: _unique_units(items, "capacityUsage")),
]


class ResourceSharingConfiguration(Wire):
    strategy: SharingStrategy
    borrow_limit: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None

    @model_validator(mode="after")
    def _borrow_limit_only_when_borrowing(self) -> ResourceSharingConfiguration:
        if self.borrow_limit is not None and self.strategy is not SharingStrategy.LEND_AND_BORROW:
            raise ValueError(
                f"borrowLimit can only be applied to the LEND_AND_BORROW strategy, "
                f"not {self.strategy.value}"
            )
        return self

    def as_recorded(self) -> ResourceSharingConfiguration:
        """AWS's default borrowLimit spelled out (-1, unlimited), as the scheduler records it
        (and `quotasched config` compares it)."""
        if self.strategy is SharingStrategy.LEND_AND_BORROW and self.borrow_limit is None:
            return ResourceSharingConfiguration(strategy=self.strategy, borrow_limit=-1)
        return self

    @property
    def borrow_limit_percent(self) -> int | None:
        """The borrow ceiling in percent of the own limit; None means unlimited (AWS's -1)."""
        if self.strategy is not SharingStrategy.LEND_AND_BORROW:
            return 0
        if self.borrow_limit is None or self.borrow_limit == -1:
            return None
        return self.borrow_limit


class SharePreemptionConfiguration(Wire):
    in_share_preemption: InSharePreemption


class JobPreemptionConfiguration(Wire):
    preemption_retries_before_termination: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None


class RetryAction(str, Enum):
    RETRY = "RETRY"
    EXIT = "EXIT"


class EvaluateOnExit(Wire):
    action: RetryAction
    on_status_reason: Annotated[str, Field(min_length=1, max_length=512)]

    @field_validator("action", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        """AWS accepts `retry` and `exit` in any case."""
        if isinstance(value, str) and value.upper() in RetryAction.__members__:
            return RetryAction(value.upper())
        return value


class RetryStrategy(Wire):
    attempts: Annotated[int, Field(ge=1, le=10)] = 1
    evaluate_on_exit: Annotated[list[EvaluateOnExit], Field(max_length=5)] = []


class TimeoutConfig(Wire):
    attempt_duration_seconds: Annotated[int, Field(ge=1, le=INT32_MAX)]


class ServiceEnvironmentOrder(Wire):
    order: Annotated[int, Field(ge=0, le=INT32_MAX)]
    service_environment: NameOrArn


class TimeLimitAction(str, Enum):
    TERMINATE = "TERMINATE"


class TimeLimitState(str, Enum):
    RUNNABLE = "RUNNABLE"


class JobStateTimeLimitAction(Wire):
    reason: BlockedReason
    state: TimeLimitState
    max_time_seconds: Annotated[int, Field(ge=600, le=86400)]
    action: TimeLimitAction


class IdleResourceAssignmentStrategy(str, Enum):
    FIFO = "FIFO"


class QuotaSharePolicy(Wire):
    idle_resource_assignment_strategy: IdleResourceAssignmentStrategy


TagKey = Annotated[str, Field(min_length=1, max_length=128)]
TagValue = Annotated[str, Field(max_length=256)]
Tags = Annotated[dict[TagKey, TagValue], Field(max_length=50)]
"""AWS's tag limits: at most 50 tags, keys 1-128 characters, values up to 256."""
ShareName = Name


# -- quotasched's options beyond AWS (the SetQuotaShareOptions extension) --------------------

OPTIONS_VERSION = 1
"""The version of the options' shape; a command names the version it was written for."""

MAX_OPTION_SECONDS = 30 * 86400
"""The longest protection or budget window an option may set: 30 days."""


class PreemptionBudget(Wire):
    """At most `max_preemptions` of the share's jobs are preempted in any `window_seconds`."""

    max_preemptions: Annotated[int, Field(ge=1, le=1000)]
    window_seconds: Annotated[int, Field(ge=1, le=MAX_OPTION_SECONDS)]


LendingLimits = Annotated[
    list[EnvironmentCapacityLimit],
    Field(min_length=1, max_length=5),
    AfterValidator(lambda items: _unique_units(items, "lendingLimits")),
]
"""Per unit, the most of a share's idle quota others may borrow (0 to 1,000,000)."""


def _unset(value: object) -> bool:
    return value is None


ADMISSION_DEFAULTS = {"max_queued_jobs": 100_000, "max_submissions_per_second": 10_000,
                      "max_submission_bytes_per_window": 64 * 1024 * 1024,
                      "submission_bytes_window_seconds": 60}  # fmt: skip
"""The admission limits of a share that sets none (docs/options.md, "Admission limits")."""

ENDED_JOB_RETENTION_DEFAULT = 7 * 86400
"""Seconds an ended job stays in the scheduler's state when its queue sets no retention (AWS
Batch keeps finished jobs listable for about seven days; docs/options.md, "Retention")."""
MAX_RETENTION_SECONDS = 366 * 86400


class QuotaShareOptions(Wire):
    """A share's options beyond AWS Batch quota management, each off when absent (version 1).

    - `minRuntimeBeforePreemptionSeconds`: a dispatched attempt of the share cannot be chosen
      as a victim (cross-share reclaim or in-share preemption) until that long after its
      dispatch;
    - `preemptionBudget`: at most `maxPreemptions` of the share's jobs are preempted within any
      sliding window of `windowSeconds`;
    - `lendingLimits`: per capacity unit, the most of the share's idle quota that other shares
      may borrow (Kueue's lendingLimit); a unit not listed lends all its idle quota.
    """

    min_runtime_before_preemption_seconds: Annotated[int, Field(ge=1, le=MAX_OPTION_SECONDS)] | None = None
    preemption_budget: PreemptionBudget | None = None
    lending_limits: LendingLimits | None = None
    # Admission limits (issue 29): unlike the options above, a limit left out is not off but
    # its default (ADMISSION_DEFAULTS), so one team cannot flood the service.  Written only
    # when set, so the facts of shares that set none read as before.
    max_queued_jobs: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(default=None, exclude_if=_unset)
    max_submissions_per_second: Annotated[int, Field(ge=1, le=100_000)] | None = Field(default=None, exclude_if=_unset)
    max_submission_bytes_per_window: Annotated[int, Field(ge=1, le=1024**3)] | None = Field(default=None, exclude_if=_unset)
    submission_bytes_window_seconds: Annotated[int, Field(ge=1, le=86_400)] | None = Field(default=None, exclude_if=_unset)

    def summary(self) -> str:
        """The options in a few words ("all off" when none is set)."""
        said = []
        if self.min_runtime_before_preemption_seconds is not None:
            said.append(f"no preemption in a job's first {self.min_runtime_before_preemption_seconds} s")
        budget = self.preemption_budget
        if budget is not None:
            said.append(f"at most {budget.max_preemptions} preemptions in any {budget.window_seconds} s")
        for limit in self.lending_limits or ():
            said.append(f"lends at most {limit.max_capacity} {limit.capacity_unit}")
        if self.max_queued_jobs is not None:
            said.append(f"at most {self.max_queued_jobs} queued jobs")
        if self.max_submissions_per_second is not None:
            said.append(f"at most {self.max_submissions_per_second} submissions per second")
        if self.max_submission_bytes_per_window is not None or self.submission_bytes_window_seconds is not None:
            said.append(f"at most {self.admission('max_submission_bytes_per_window')} submission bytes "
                        f"per {self.admission('submission_bytes_window_seconds')} s")
        return ", ".join(said) or "all off"

    def admission(self, name: str) -> int:
        """An admission limit as it applies: its value, or its default when not set."""
        value = getattr(self, name)
        return ADMISSION_DEFAULTS[name] if value is None else value


# -- quotasched's queue options beyond AWS (the SetJobQueueOptions extension) ----------------

QUEUE_OPTIONS_VERSION = 1
"""The version of the queue options' shape; a command names the version it was written for."""

MAX_WEIGHT = 1000
MAX_SHARES = 20  # a job queue has at most 20 quota shares (AWS's limit)


class IdleAssignment(str, Enum):
    """How idle lendable capacity goes to borrowers: AWS's FIFO, or quotasched's FAIR_SHARE
    (an extension: AWS's own IdleResourceAssignmentStrategy has FIFO only)."""

    FIFO = "FIFO"
    FAIR_SHARE = "FAIR_SHARE"


class FairShareWeight(Wire):
    quota_share_name: Name
    weight: Annotated[int, Field(ge=1, le=MAX_WEIGHT)]


class FairShare(Wire):
    """FAIR_SHARE's parameters: the half-life of past borrowing, and the shares' weights (a
    share not listed weighs 1)."""

    half_life_seconds: Annotated[int, Field(ge=1, le=MAX_OPTION_SECONDS)]
    weights: Annotated[list[FairShareWeight], Field(max_length=MAX_SHARES)] | None = None

    @field_validator("weights")
    @classmethod
    def _unique_weights(cls, weights):
        names = [item.quota_share_name for item in weights or ()]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"fairShare.weights names quota share {twice[0]} more than once")
        return weights


class ShareGroup(Wire):
    """A group of the queue's shares (a department): idle capacity of its members goes to its
    own borrowers before anyone else's, and `maxCapacity`, when given, caps what its members
    hold together whenever one of them borrows."""

    name: Name
    quota_share_names: Annotated[list[Name], Field(min_length=1, max_length=MAX_SHARES)]
    max_capacity: (
        Annotated[
            list[EnvironmentCapacityLimit],
            Field(min_length=1, max_length=5),
            AfterValidator(lambda items: _unique_units(items, "maxCapacity")),
        ]
        | None
    ) = None


class JobQueueOptions(Wire):
    """A job queue's options beyond AWS Batch quota management, each off when absent
    (version 1).

    - `idleResourceAssignmentStrategy`: FIFO (AWS's, the default) or FAIR_SHARE, which hands
      idle capacity to the borrower whose share has the least decayed past borrowing per unit
      of weight (`fairShare` gives the half-life and the weights; required with FAIR_SHARE);
    - `shareGroups`: groups of shares that lend inside the group first, with an optional
      limit on what the group holds when one of its members borrows.
    """

    idle_resource_assignment_strategy: IdleAssignment = IdleAssignment.FIFO
    fair_share: FairShare | None = None
    share_groups: Annotated[list[ShareGroup], Field(min_length=1, max_length=MAX_SHARES)] | None = None
    # Retention (issue 29): how long an ended job stays in the scheduler's state, after which
    # it is forgotten (JobExpired) and answered from the projection.  Left out, it is not off
    # but its default (ENDED_JOB_RETENTION_DEFAULT), so memory stays bounded; written only when
    # set, so the facts of queues that set none read as before.
    ended_job_retention_seconds: Annotated[int, Field(ge=0, le=MAX_RETENTION_SECONDS)] | None = Field(
        default=None, exclude_if=_unset)

    @model_validator(mode="after")
    def _consistent(self) -> JobQueueOptions:
        fair = self.idle_resource_assignment_strategy is IdleAssignment.FAIR_SHARE
        if fair and self.fair_share is None:
            raise ValueError("idleResourceAssignmentStrategy FAIR_SHARE needs fairShare (halfLifeSeconds)")
        if not fair and self.fair_share is not None:
            raise ValueError("fairShare is given but idleResourceAssignmentStrategy is not FAIR_SHARE")
        seen: dict[str, str] = {}
        groups: set[str] = set()
        for group in self.share_groups or ():
            if group.name in groups:
                raise ValueError(f"shareGroups names group {group.name} more than once")
            groups.add(group.name)
            for name in group.quota_share_names:
                if seen.get(name) == group.name:
                    raise ValueError(f"group {group.name} names quota share {name} more than once")
                if name in seen:
                    raise ValueError(
                        f"quota share {name} is in group {seen[name]} and group {group.name}; "
                        "a share belongs to at most one group"
                    )
                seen[name] = group.name
        return self

    def share_names(self) -> list[str]:
        """Every share the options name (weights and groups), in order, once each."""
        names = [item.quota_share_name for item in self.fair_share.weights or ()] if self.fair_share else []
        for group in self.share_groups or ():
            names.extend(group.quota_share_names)
        return list(dict.fromkeys(names))

    def summary(self) -> str:
        """The options in a few words ("all off" when none is set)."""
        said = []
        if self.fair_share is not None:
            said.append(f"fair share (half-life {self.fair_share.half_life_seconds} s)")
        for group in self.share_groups or ():
            cap = "".join(f", at most {item.max_capacity} {item.capacity_unit}"
                          for item in group.max_capacity or ())  # fmt: skip
            said.append(f"group {group.name} ({', '.join(group.quota_share_names)}{cap})")
        if self.ended_job_retention_seconds is not None:
            said.append(f"ended jobs kept {self.ended_job_retention_seconds} s")
        return ", ".join(said) or "all off"

    def retention(self) -> int:
        """Seconds an ended job stays in the scheduler's state: as set, or the default."""
        value = self.ended_job_retention_seconds
        return ENDED_JOB_RETENTION_DEFAULT if value is None else value
