"""The verbs for service environments, scheduling policies and job queues: create and update
(published as commands) and describe (answered by the scheduler)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from quotasched.services.cli.aws_options import (
    ARN,
    PANEL_READ,
    CapacityLimits,
    NatsUrl,
    OptionalCapacityLimits,
    Output,
    OutputOpt,
    StateOpt,
    Tags,
    Wait,
    WaitTimeout,
    many,
    name_from_arn,
    one,
    register_verb,
)
from quotasched.services.cli.aws_output import emit, render_items
from quotasched.services.cli.aws_session import ask, run, session, write


@register_verb("create-service-environment")
def create_service_environment(
    service_environment_name: Annotated[str, typer.Option("--service-environment-name")],
    capacity_limits: CapacityLimits,
    state: StateOpt = None,
    service_environment_type: Annotated[Optional[str], typer.Option(
        "--service-environment-type", help="SAGEMAKER_TRAINING (the only type).",
        show_default=False)] = None,  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a service environment: per instance type, how many instances may run at once."""

    def build():
        return ({"kind": "CreateServiceEnvironment",
                 "serviceEnvironmentName": service_environment_name,
                 "capacityLimits": many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "state": state, "serviceEnvironmentType": service_environment_type,
                 "tags": one("--tags", tags, "tags")},
                {"serviceEnvironmentName": service_environment_name,
                 "serviceEnvironmentArn": f"{ARN}:service-environment/{service_environment_name}"})

    run(lambda: write(nats_url, "CreateServiceEnvironment", build, wait, wait_timeout, output))


@register_verb("update-service-environment")
def update_service_environment(
    service_environment: Annotated[str, typer.Option(
        "--service-environment", help="Name or ARN.")],  # fmt: skip
    capacity_limits: OptionalCapacityLimits = None,
    state: StateOpt = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a service environment's capacity or state (the capacity event)."""
    name = name_from_arn(service_environment)

    def build():
        return ({"kind": "UpdateServiceEnvironment", "serviceEnvironment": service_environment,
                 "capacityLimits": many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "state": state},
                {"serviceEnvironmentName": name,
                 "serviceEnvironmentArn": f"{ARN}:service-environment/{name}"})  # fmt: skip

    run(lambda: write(nats_url, "UpdateServiceEnvironment", build, wait, wait_timeout, output))


@register_verb("create-scheduling-policy")
def create_scheduling_policy(
    name: Annotated[str, typer.Option("--name")],
    quota_share_policy: Annotated[str, typer.Option(
        "--quota-share-policy", help="idleResourceAssignmentStrategy=FIFO")],  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a scheduling policy with a quota-share policy (what quota-share queues need)."""

    def build():
        return ({"kind": "CreateSchedulingPolicy", "name": name,
                 "quotaSharePolicy": one("--quota-share-policy", quota_share_policy,
                                         "quotaSharePolicy"),
                 "tags": one("--tags", tags, "tags")},
                {"name": name, "arn": f"{ARN}:scheduling-policy/{name}"})  # fmt: skip

    run(lambda: write(nats_url, "CreateSchedulingPolicy", build, wait, wait_timeout, output))


TimeLimitActions = Annotated[Optional[list[str]], typer.Option(
    "--job-state-time-limit-actions", show_default=False,
    help="reason=CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY,state=RUNNABLE,maxTimeSeconds=600,"
         "action=TERMINATE (several space-separated, or JSON).")]  # fmt: skip
PriorityOpt = Annotated[Optional[int], typer.Option(
    "--priority", help="0-1000 (no effect on quota-share queues).", show_default=False)]


@register_verb("create-job-queue")
def create_job_queue(
    job_queue_name: Annotated[str, typer.Option("--job-queue-name")],
    service_environment_order: Annotated[list[str], typer.Option(
        "--service-environment-order", help="order=1,serviceEnvironment=<name>")],  # fmt: skip
    scheduling_policy_arn: Annotated[str, typer.Option(
        "--scheduling-policy-arn", help="The scheduling policy's name or ARN.")],  # fmt: skip
    priority: PriorityOpt = None,
    state: StateOpt = None,
    job_state_time_limit_actions: TimeLimitActions = None,
    job_queue_type: Annotated[Optional[str], typer.Option(
        "--job-queue-type", help="SAGEMAKER_TRAINING (the only type).",
        show_default=False)] = None,  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a job queue on one service environment, under a quota-share scheduling policy."""

    def build():
        return ({"kind": "CreateJobQueue", "jobQueueName": job_queue_name,
                 "serviceEnvironmentOrder": many("--service-environment-order",
                                                 service_environment_order,
                                                 "serviceEnvironmentOrder"),
                 "schedulingPolicy": scheduling_policy_arn, "priority": priority, "state": state,
                 "jobStateTimeLimitActions": many("--job-state-time-limit-actions",
                                                  job_state_time_limit_actions,
                                                  "jobStateTimeLimitActions"),
                 "jobQueueType": job_queue_type, "tags": one("--tags", tags, "tags")},
                {"jobQueueName": job_queue_name,
                 "jobQueueArn": f"{ARN}:job-queue/{job_queue_name}"})  # fmt: skip

    run(lambda: write(nats_url, "CreateJobQueue", build, wait, wait_timeout, output))


@register_verb("update-job-queue")
def update_job_queue(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    state: StateOpt = None,
    priority: PriorityOpt = None,
    job_state_time_limit_actions: TimeLimitActions = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a job queue's state, priority or job-state time limits."""
    name = name_from_arn(job_queue)

    def build():
        return ({"kind": "UpdateJobQueue", "jobQueue": job_queue, "state": state,
                 "priority": priority,
                 "jobStateTimeLimitActions": many("--job-state-time-limit-actions",
                                                  job_state_time_limit_actions,
                                                  "jobStateTimeLimitActions")},
                {"jobQueueName": name, "jobQueueArn": f"{ARN}:job-queue/{name}"})  # fmt: skip

    run(lambda: write(nats_url, "UpdateJobQueue", build, wait, wait_timeout, output))


@register_verb("describe-service-environments", PANEL_READ)
def describe_service_environments(
    service_environments: Annotated[Optional[list[str]], typer.Option(
        "--service-environments", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the service environments."""
    _describe_filtered(nats_url, output, "DescribeServiceEnvironments",
                       "describe-service-environments", "serviceEnvironments",
                       "serviceEnvironmentName", service_environments, "Service environments")  # fmt: skip


@register_verb("describe-job-queues", PANEL_READ)
def describe_job_queues(
    job_queues: Annotated[Optional[list[str]], typer.Option(
        "--job-queues", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the job queues."""
    _describe_filtered(nats_url, output, "DescribeJobQueues", "describe-job-queues",
                       "jobQueues", "jobQueueName", job_queues, "Job queues")  # fmt: skip


@register_verb("describe-scheduling-policies", PANEL_READ)
def describe_scheduling_policies(
    arns: Annotated[Optional[list[str]], typer.Option(
        "--arns", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the scheduling policies."""
    _describe_filtered(nats_url, output, "DescribeSchedulingPolicies",
                       "describe-scheduling-policies", "schedulingPolicies", "name", arns,
                       "Scheduling policies")  # fmt: skip


def _describe_filtered(nats_url, output, operation: str, verb: str, key: str, name_field: str,
                       names: list[str] | None, title: str) -> None:  # fmt: skip
    """A describe-* read, kept to the items named (by name or ARN) when any are."""
    wanted = {name_from_arn(item) for item in names or []}

    async def work():
        async with session(nats_url) as bus:
            answer = await ask(bus, operation, verb)
        answer[key] = [item for item in answer[key] if not wanted or item[name_field] in wanted]
        emit(answer, output, lambda console, doc: render_items(console, doc[key], title))

    run(work)
