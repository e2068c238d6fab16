"""Commands: requests to the scheduler, named after the AWS Batch operations they mirror.

A command may be refused (the scheduler answers with a `CommandRejected` fact) but is never
lost.  Field names are AWS's camelCase on the wire.  `at` is required in replay files by
convention; on the bus the scheduler owns the clock: a command's time is the stream's timestamp
and an `at` sent by a client is ignored (ruling 15).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from quotasched.events.base import (
    INT32_MAX, MAX_INSTANCES, JobId, LogicalTime, Name, NameOrArn, NewJobId, Priority, Wire,
)  # fmt: skip
from quotasched.events.images import reference_problem
from quotasched.events.values import (
    EnvironmentLimits,
    JobPreemptionConfiguration,
    JobStateTimeLimitAction,
    JobQueueOptions,
    QuotaShareOptions,
    QuotaSharePolicy,
    ReportedStatus,
    ResourceSharingConfiguration,
    RetryStrategy,
    ServiceEnvironmentOrder,
    SharePreemptionConfiguration,
    ShareLimits,
    State,
    Tags,
    TimeoutConfig,
    Usage,
)

PAYLOAD_LIMIT_BYTES = 10 * 1024
# A message of at most this many bytes holds a payload whose compact JSON (`json.dumps` with
# ASCII escapes, what the 10 KiB limit measures) is within the limit: encoding JSON again
# makes no part of it more than 4.5x longer (a number: `1e15` becomes `1000000000000000.0`;
# a character of 2 UTF-8 bytes becomes `\u00e9`, 3x; whitespace and escapes only shrink),
# so at most 4.5 x 2,048 = 9,216 bytes.  tests/unit/test_payload_bound.py holds the bound.
BOUNDED_MESSAGE_BYTES = PAYLOAD_LIMIT_BYTES // 5
# The validation context `codec.decode_command` passes for such a message (compared by
# identity: nothing else can pass this very object).
SIZE_BOUNDED: dict[str, int] = {"messageBytesAtMost": BOUNDED_MESSAGE_BYTES}


class Command(Wire):
    kind: str
    at: LogicalTime | None = None


class CreateServiceEnvironment(Command):
    kind: Literal["CreateServiceEnvironment"] = "CreateServiceEnvironment"
    service_environment_name: Name
    capacity_limits: EnvironmentLimits
    service_environment_type: Literal["SAGEMAKER_TRAINING"] = "SAGEMAKER_TRAINING"
    state: State = State.ENABLED
    tags: Tags | None = None


class UpdateServiceEnvironment(Command):
    """The capacity event: a pool can grow or shrink at any time."""

    kind: Literal["UpdateServiceEnvironment"] = "UpdateServiceEnvironment"
    service_environment: NameOrArn
    capacity_limits: EnvironmentLimits | None = None
    state: State | None = None


class CreateSchedulingPolicy(Command):
    kind: Literal["CreateSchedulingPolicy"] = "CreateSchedulingPolicy"
    name: Name
    quota_share_policy: QuotaSharePolicy
    tags: Tags | None = None


class CreateJobQueue(Command):
    kind: Literal["CreateJobQueue"] = "CreateJobQueue"
    job_queue_name: Name
    service_environment_order: Annotated[
        list[ServiceEnvironmentOrder], Field(min_length=1, max_length=1)
    ]
    scheduling_policy: NameOrArn
    job_queue_type: Literal["SAGEMAKER_TRAINING"] = "SAGEMAKER_TRAINING"
    priority: Annotated[int, Field(ge=0, le=1000)] = 1
    state: State = State.ENABLED
    job_state_time_limit_actions: Annotated[
        list[JobStateTimeLimitAction], Field(max_length=5)
    ] = []
    tags: Tags | None = None


class UpdateJobQueue(Command):
    kind: Literal["UpdateJobQueue"] = "UpdateJobQueue"
    job_queue: NameOrArn
    state: State | None = None
    priority: Annotated[int, Field(ge=0, le=1000)] | None = None
    job_state_time_limit_actions: Annotated[
        list[JobStateTimeLimitAction], Field(max_length=5)
    ] | None = None


class CreateQuotaShare(Command):
    kind: Literal["CreateQuotaShare"] = "CreateQuotaShare"
    quota_share_name: Name
    job_queue: NameOrArn
    capacity_limits: ShareLimits
    resource_sharing_configuration: ResourceSharingConfiguration
    preemption_configuration: SharePreemptionConfiguration
    state: State = State.ENABLED
    tags: Tags | None = None


class UpdateQuotaShare(Command):
    kind: Literal["UpdateQuotaShare"] = "UpdateQuotaShare"
    job_queue: NameOrArn
    quota_share_name: Name
    capacity_limits: ShareLimits | None = None
    resource_sharing_configuration: ResourceSharingConfiguration | None = None
    preemption_configuration: SharePreemptionConfiguration | None = None
    state: State | None = None


class DeleteQuotaShare(Command):
    kind: Literal["DeleteQuotaShare"] = "DeleteQuotaShare"
    job_queue: NameOrArn
    quota_share_name: Name


class SetQuotaShareOptions(Command):
    """quotasched's extension, no AWS operation: set a share's options beyond AWS (see
    `QuotaShareOptions`).  The options given replace the share's options as a whole; an
    option left out is off, so `{"options": {}}` turns them all off.  `optionsVersion` is the
    version of the options' shape the sender wrote (1)."""

    kind: Literal["SetQuotaShareOptions"] = "SetQuotaShareOptions"
    job_queue: NameOrArn
    quota_share_name: Name
    options_version: Literal[1] = 1
    options: QuotaShareOptions


class SetJobQueueOptions(Command):
    """quotasched's extension, no AWS operation: set a job queue's options beyond AWS (see
    `JobQueueOptions`: fair-share idle assignment and share groups).  The options given
    replace the queue's options as a whole; `{"options": {}}` turns them all off.
    `optionsVersion` is the version of the options' shape the sender wrote (1)."""

    kind: Literal["SetJobQueueOptions"] = "SetJobQueueOptions"
    job_queue: NameOrArn
    options_version: Literal[1] = 1
    options: JobQueueOptions


class SubmitServiceJob(Command):
    kind: Literal["SubmitServiceJob"] = "SubmitServiceJob"
    job_name: Name
    job_queue: NameOrArn
    quota_share_name: Name
    capacity_usage: Usage | None = None
    service_request_payload: dict[str, Any] | str | None = None
    service_job_type: Literal["SAGEMAKER_TRAINING"] = "SAGEMAKER_TRAINING"
    job_id: NewJobId | None = None
    scheduling_priority: Priority = 0
    share_identifier: Annotated[str, Field(max_length=255)] | None = None
    preemption_configuration: JobPreemptionConfiguration | None = None
    retry_strategy: RetryStrategy | None = None
    timeout_config: TimeoutConfig | None = None
    client_token: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    tags: Tags | None = None

    @model_validator(mode="after")
    def _need_is_known(self, info: ValidationInfo) -> SubmitServiceJob:
        if self.share_identifier is not None:
            raise ValueError(
                "shareIdentifier can't be used on a quota-management job queue; "
                "name the quota share with quotaShareName"
            )
        if (self.capacity_usage is None) == (self.service_request_payload is None):
            raise ValueError("give exactly one of capacityUsage or serviceRequestPayload")
        if self.service_request_payload is not None:
            # raises precisely; a payload within a message of at most BOUNDED_MESSAGE_BYTES
            # cannot be over the limit, and is not encoded again to be measured
            need_from_payload(self.service_request_payload,
                              size_checked=info.context is SIZE_BOUNDED)  # fmt: skip
        if self.tags is not None or self.service_request_payload is not None:
            _check_images(self.tags, self.service_request_payload)
        return self

    def need(self) -> tuple[tuple[str, int], ...]:
        """The instances this job needs, per capacity unit, in the order given.

        A payload's need is parsed again here rather than kept from validation: a private
        attribute would cost every submission ~1.6 us to decode (a fifth of it), to save
        the few that carry a payload one more parse."""
        if self.capacity_usage is not None:
            return tuple((item.capacity_unit, item.quantity) for item in self.capacity_usage)
        return need_from_payload(self.service_request_payload, size_checked=True)


def _check_images(tags: dict[str, str] | None, payload: dict[str, Any] | str | None) -> None:
    """The image a container runtime would be handed (tag `image`, or the payload's
    `AlgorithmSpecification.TrainingImage`) must be an image reference (events/images.py):
    anything else could be read by `docker run` as an option."""
    if tags is not None and "image" in tags:
        problem = reference_problem(tags["image"])
        if problem is not None:
            raise ValueError(f"tags.image {problem}")
    if isinstance(payload, str):
        if "TrainingImage" not in payload:
            return  # the common case: no second parse
        payload = json.loads(payload)  # valid JSON: need_from_payload parsed it
    algorithm = payload.get("AlgorithmSpecification") if isinstance(payload, dict) else None
    if isinstance(algorithm, dict) and "TrainingImage" in algorithm:
        problem = reference_problem(algorithm["TrainingImage"])
        if problem is not None:
            raise ValueError("serviceRequestPayload AlgorithmSpecification.TrainingImage "
                             + problem)


def need_from_payload(payload: dict[str, Any] | str | None,
                      size_checked: bool = False) -> tuple[tuple[str, int], ...]:  # fmt: skip
    """Capacity need of a SageMaker CreateTrainingJob request (`ResourceConfig`).

    A plain job names `InstanceType` and `InstanceCount`; a heterogeneous job lists
    `InstanceGroups`, each of which is needed at the same time.  The 10 KiB limit is checked
    unless `size_checked` (a validated command's payload).
    """
    if isinstance(payload, str):
        if not size_checked and len(payload.encode()) > PAYLOAD_LIMIT_BYTES:
            raise ValueError("serviceRequestPayload is larger than 10 KiB")
        try:
            payload = json.loads(payload)
        except ValueError as error:
            raise ValueError(f"serviceRequestPayload is not valid JSON: {error}") from None
    elif not size_checked and \
            len(json.dumps(payload, separators=(",", ":")).encode()) > PAYLOAD_LIMIT_BYTES:
        raise ValueError("serviceRequestPayload is larger than 10 KiB")
    config = payload.get("ResourceConfig") if isinstance(payload, dict) else None
    if not isinstance(config, dict):
        raise ValueError("serviceRequestPayload has no ResourceConfig object")
    groups = config.get("InstanceGroups") or [config]
    need: dict[str, int] = {}
    for group in groups:
        unit, count = group.get("InstanceType"), group.get("InstanceCount")
        if not isinstance(unit, str) or not unit:
            raise ValueError("serviceRequestPayload ResourceConfig has no InstanceType")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_INSTANCES:
            raise ValueError("serviceRequestPayload ResourceConfig.InstanceCount must be "
                             f"1-{MAX_INSTANCES}")
        if len(unit) > 128:
            raise ValueError("serviceRequestPayload ResourceConfig.InstanceType is longer "
                             "than 128 characters")
        need[unit] = need.get(unit, 0) + count
        if need[unit] > MAX_INSTANCES:
            raise ValueError(f"serviceRequestPayload needs more than {MAX_INSTANCES} "
                             f"instances of {unit}")
    if len(need) > 5:
        raise ValueError("serviceRequestPayload uses more than 5 instance types")
    return tuple(need.items())


class UpdateServiceJob(Command):
    """The priority-update event."""

    kind: Literal["UpdateServiceJob"] = "UpdateServiceJob"
    job_id: JobId
    scheduling_priority: Priority


class TerminateServiceJob(Command):
    kind: Literal["TerminateServiceJob"] = "TerminateServiceJob"
    job_id: JobId
    reason: Annotated[str, Field(min_length=1, max_length=1024)]


class ReportJobStatus(Command):
    """Sent by executors about one attempt of a dispatched job."""

    kind: Literal["ReportJobStatus"] = "ReportJobStatus"
    job_id: JobId
    status: ReportedStatus
    attempt: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    status_reason: Annotated[str, Field(max_length=1024)] | None = None


class Tick(Command):
    """Advances logical time so that timers fire; carries nothing else."""

    kind: Literal["Tick"] = "Tick"


AnyCommand = Annotated[
    CreateServiceEnvironment
    | UpdateServiceEnvironment
    | CreateSchedulingPolicy
    | CreateJobQueue
    | UpdateJobQueue
    | CreateQuotaShare
    | UpdateQuotaShare
    | DeleteQuotaShare
    | SetQuotaShareOptions
    | SetJobQueueOptions
    | SubmitServiceJob
    | UpdateServiceJob
    | TerminateServiceJob
    | ReportJobStatus
    | Tick,
    Field(discriminator="kind"),
]

COMMAND_KINDS = (
    "CreateServiceEnvironment",
    "UpdateServiceEnvironment",
    "CreateSchedulingPolicy",
    "CreateJobQueue",
    "UpdateJobQueue",
    "CreateQuotaShare",
    "UpdateQuotaShare",
    "DeleteQuotaShare",
    "SetQuotaShareOptions",
    "SetJobQueueOptions",
    "SubmitServiceJob",
    "UpdateServiceJob",
    "TerminateServiceJob",
    "ReportJobStatus",
    "Tick",
)
