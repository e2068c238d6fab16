"""The quota share verbs: create, update, delete (published as commands), list and describe
(answered by the scheduler), and naming a share by ARN or by queue and name."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from quotasched.services.cli.aws_options import (
    ARN,
    EXIT_USAGE,
    PANEL_READ,
    CapacityLimits,
    Failure,
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
from quotasched.services.cli.aws_output import SHARE_COLUMNS, emit, render_items
from quotasched.services.cli.aws_session import ask, run, session, write


ShareArn = Annotated[Optional[str], typer.Option(
    "--quota-share-arn", show_default=False,
    help="arn:aws:batch:<region>:<account>:job-queue/<queue>/quota-share/<share>; or give "
         "--job-queue and --quota-share-name.")]  # fmt: skip
ShareQueue = Annotated[Optional[str], typer.Option(
    "--job-queue", help="Name or ARN (with --quota-share-name).", show_default=False)]  # fmt: skip
ShareName = Annotated[Optional[str], typer.Option(
    "--quota-share-name", help="With --job-queue.", show_default=False)]  # fmt: skip
Sharing = Annotated[Optional[str], typer.Option(
    "--resource-sharing-configuration", show_default=False,
    help="strategy=RESERVE|LEND|LEND_AND_BORROW[,borrowLimit=<percent, -1 unlimited>]")]
SharePreemption = Annotated[Optional[str], typer.Option(
    "--preemption-configuration", show_default=False,
    help="inSharePreemption=ENABLED|DISABLED")]  # fmt: skip


@register_verb("create-quota-share")
def create_quota_share(
    quota_share_name: Annotated[str, typer.Option("--quota-share-name")],
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    capacity_limits: CapacityLimits,
    resource_sharing_configuration: Sharing = None,
    preemption_configuration: SharePreemption = None,
    state: StateOpt = None,
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a quota share: capacity a team may use without borrowing, and how it shares."""
    queue = name_from_arn(job_queue)

    def build():
        return ({"kind": "CreateQuotaShare", "quotaShareName": quota_share_name,
                 "jobQueue": job_queue,
                 "capacityLimits": many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "resourceSharingConfiguration": one(
                     "--resource-sharing-configuration", resource_sharing_configuration,
                     "resourceSharingConfiguration"),
                 "preemptionConfiguration": one("--preemption-configuration",
                                                preemption_configuration,
                                                "sharePreemptionConfiguration"),
                 "state": state, "tags": one("--tags", tags, "tags")},
                {"quotaShareName": quota_share_name,
                 "quotaShareArn": _share_arn(queue, quota_share_name)})  # fmt: skip

    run(lambda: write(nats_url, "CreateQuotaShare", build, wait, wait_timeout, output))


@register_verb("update-quota-share")
def update_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    capacity_limits: OptionalCapacityLimits = None,
    resource_sharing_configuration: Sharing = None,
    preemption_configuration: SharePreemption = None,
    state: StateOpt = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a quota share's limits, sharing strategy, in-share preemption or state."""

    def build():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        return ({"kind": "UpdateQuotaShare", "jobQueue": queue, "quotaShareName": share,
                 "capacityLimits": many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "resourceSharingConfiguration": one(
                     "--resource-sharing-configuration", resource_sharing_configuration,
                     "resourceSharingConfiguration"),
                 "preemptionConfiguration": one("--preemption-configuration",
                                                preemption_configuration,
                                                "sharePreemptionConfiguration"),
                 "state": state},
                {"quotaShareName": share, "quotaShareArn": _share_arn(queue, share)})  # fmt: skip

    run(lambda: write(nats_url, "UpdateQuotaShare", build, wait, wait_timeout, output))


@register_verb("delete-quota-share")
def delete_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Delete a quota share (set it DISABLED first); its unfinished jobs are terminated."""

    def build():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        return {"kind": "DeleteQuotaShare", "jobQueue": queue, "quotaShareName": share}, {}

    run(lambda: write(nats_url, "DeleteQuotaShare", build, wait, wait_timeout, output))


@register_verb("list-quota-shares", PANEL_READ)
def list_quota_shares(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    max_results: Annotated[Optional[int], typer.Option("--max-results", min=1, max=100,
                                                       show_default=False)] = None,  # fmt: skip
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """List a job queue's quota shares with their configuration and current usage."""

    async def work():
        async with session(nats_url) as bus:
            answer = await ask(bus, "ListQuotaShares", "list-quota-shares", jobQueue=job_queue)
        if max_results is not None:
            answer["quotaShares"] = answer["quotaShares"][:max_results]
        emit(answer, output, lambda console, doc: render_items(
            console, doc["quotaShares"], f"Quota shares of {name_from_arn(job_queue)}",
            SHARE_COLUMNS))

    run(work)


@register_verb("describe-quota-share", PANEL_READ)
def describe_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe one quota share: configuration, state, status and usage."""

    async def work():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        async with session(nats_url) as bus:
            answer = await ask(bus, "DescribeQuotaShare", "describe-quota-share",
                               jobQueue=queue, quotaShareName=share)  # fmt: skip
        emit(answer, output)

    run(work)


def _share_target(arn: str | None, job_queue: str | None, share: str | None) -> tuple[str, str]:
    if arn:
        _, _, rest = arn.partition(":job-queue/")
        queue, marker, name = rest.partition("/quota-share/")
        if not (queue and marker and name):
            raise Failure(f"--quota-share-arn {arn!r} is not a quota share ARN "
                          f"(arn:aws:batch:<region>:<account>:job-queue/<queue>/quota-share/"
                          f"<share>)", EXIT_USAGE)  # fmt: skip
        return queue, name
    if job_queue and share:
        return name_from_arn(job_queue), share
    raise Failure("give --quota-share-arn, or --job-queue with --quota-share-name", EXIT_USAGE)


def _share_arn(queue: str, share: str) -> str:
    return f"{ARN}:job-queue/{queue}/quota-share/{share}"
