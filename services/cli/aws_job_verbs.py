"""The service job verbs: submit, update and terminate a job (published as commands), describe
and list jobs and a queue's snapshot (answered by the scheduler).

`submit-service-job` waits for the scheduler's decision by default, since the scheduler derives
the job id; its options are named types below so that the verb itself stays short.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from quotasched.services.cli.aws_options import (
    ARN,
    EXIT_USAGE,
    PANEL_READ,
    Failure,
    NatsUrl,
    Output,
    OutputOpt,
    Tags,
    Wait,
    WaitTimeout,
    many,
    name_from_arn,
    one,
    register_verb,
)
from quotasched.services.cli.aws_output import JOB_COLUMNS, emit, render_items, render_snapshot
from quotasched.services.cli.aws_session import (
    ask,
    checked,
    decide,
    fact_documents,
    publish,
    run,
    send,
    session,
)
from quotasched.services.cli.shorthand import load_file


# The options of submit-service-job, as named types (like the other verbs' shared options).
ServiceRequestPayload = Annotated[Optional[str], typer.Option(
    "--service-request-payload", show_default=False,
    help="The SageMaker CreateTrainingJob request (JSON text or file://path); its "
         "ResourceConfig gives the instances needed.")]  # fmt: skip
InstanceType = Annotated[Optional[str], typer.Option(
    "--instance-type", show_default=False,
    help="Shortcut instead of a payload: the instance type needed...")]  # fmt: skip
InstanceCount = Annotated[Optional[int], typer.Option(
    "--instance-count", min=1, show_default=False,
    help="...and how many of them (default 1).")]  # fmt: skip
CapacityUsage = Annotated[Optional[list[str]], typer.Option(
    "--capacity-usage", show_default=False,
    help="Or the need itself: capacityUnit=ml.g5.xlarge,quantity=2 (several "
         "space-separated).")]  # fmt: skip
SchedulingPriority = Annotated[Optional[int], typer.Option(
    "--scheduling-priority", help="0-9999, higher first (default 0).",
    show_default=False)]  # fmt: skip
JobPreemption = Annotated[Optional[str], typer.Option(
    "--preemption-configuration", help="preemptionRetriesBeforeTermination=N",
    show_default=False)]  # fmt: skip
RetryStrategy = Annotated[Optional[str], typer.Option(
    "--retry-strategy", help="attempts=N (1-10)", show_default=False)]  # fmt: skip
TimeoutConfig = Annotated[Optional[str], typer.Option(
    "--timeout-config", help="attemptDurationSeconds=N", show_default=False)]
ClientToken = Annotated[Optional[str], typer.Option(
    "--client-token", help="Idempotency token: a repeat returns the same job.",
    show_default=False)]  # fmt: skip
ChosenJobId = Annotated[Optional[str], typer.Option(
    "--job-id", help="Choose the job id (else the scheduler derives one).",
    show_default=False)]  # fmt: skip
ServiceJobType = Annotated[Optional[str], typer.Option(
    "--service-job-type", help="SAGEMAKER_TRAINING (the only type).",
    show_default=False)]  # fmt: skip
ShareIdentifier = Annotated[Optional[str], typer.Option(
    "--share-identifier", help="Fair-share queues only: refused here.", hidden=True)]
SubmitWait = Annotated[Optional[bool], typer.Option(
    "--wait/--no-wait", show_default=False,
    help="--wait: also print the decision's facts.  --no-wait: return once the command "
         "is stored (needs --job-id).  Neither: wait for the decision, print the id.")]


@register_verb("submit-service-job")
def submit_service_job(
    job_name: Annotated[str, typer.Option("--job-name")],
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    quota_share_name: Annotated[str, typer.Option("--quota-share-name")],
    service_request_payload: ServiceRequestPayload = None,
    instance_type: InstanceType = None,
    instance_count: InstanceCount = None,
    capacity_usage: CapacityUsage = None,
    scheduling_priority: SchedulingPriority = None,
    preemption_configuration: JobPreemption = None,
    retry_strategy: RetryStrategy = None,
    timeout_config: TimeoutConfig = None,
    tags: Tags = None,
    client_token: ClientToken = None,
    job_id: ChosenJobId = None,
    service_job_type: ServiceJobType = None,
    share_identifier: ShareIdentifier = None,
    wait: SubmitWait = None,
    wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Submit a training job to a quota share; prints jobArn, jobName and jobId like AWS.

    Like `aws batch submit-service-job`, this answers with the job's id and fails at once
    (exit 1, reason on stderr) when the submission is refused.  The id is the scheduler's to
    derive unless you choose it, so by default the command waits for the scheduler's
    decision (normally milliseconds).  --wait also prints the decision's facts (dispatched?
    borrowing? preempting whom?).  --no-wait returns as soon as JetStream stored the command,
    like the other write verbs; it needs --job-id, and a refusal then shows only in
    `quotasched facts`.
    """

    def build() -> dict[str, Any]:
        if wait is False and not job_id:
            raise Failure("submit-service-job: --no-wait needs --job-id (without it the job id "
                          "is known only once the scheduler decided)", EXIT_USAGE)  # fmt: skip
        need = _need(service_request_payload, instance_type, instance_count, capacity_usage)
        return checked("SubmitServiceJob", {
            "kind": "SubmitServiceJob", "jobName": job_name, "jobQueue": job_queue,
            "quotaShareName": quota_share_name, **need, "jobId": job_id,
            "schedulingPriority": scheduling_priority, "shareIdentifier": share_identifier,
            "preemptionConfiguration": one("--preemption-configuration",
                                           preemption_configuration,
                                           "jobPreemptionConfiguration"),
            "retryStrategy": one("--retry-strategy", retry_strategy, "retryStrategy"),
            "timeoutConfig": one("--timeout-config", timeout_config, "timeoutConfig"),
            "tags": one("--tags", tags, "tags"), "clientToken": client_token,
            "serviceJobType": service_job_type,
        })  # fmt: skip

    run(lambda: _submit(nats_url, build, job_name, job_id, wait, wait_timeout, output))


async def _submit(url: str | None, build: Callable[[], dict[str, Any]], job_name: str,
                  job_id: str | None, wait: bool | None, timeout: float,
                  output: Output) -> None:  # fmt: skip
    """Builds (inside `run`, so a bad option exits 2) and publishes the submission; unless
    --no-wait, waits for the decision, which names the job id; prints the AWS answer."""
    command = build()
    async with session(url) as bus:
        if wait is False:
            decided_id, seq, facts = job_id, await publish(bus, command), None
        else:
            facts = await decide(bus, "SubmitServiceJob", command, timeout)
            submitted = next(f for f in facts if f.kind in ("JobSubmitted",
                                                            "SubmissionDeduplicated"))
            decided_id, seq = submitted.job_id, submitted.command_seq
    response = {"jobArn": _job_arn(decided_id), "jobName": job_name, "jobId": decided_id,
                "commandSeq": seq}  # fmt: skip
    if wait:
        response["facts"] = fact_documents(facts)
    emit(response, output)


def _need(payload: str | None, instance_type: str | None, instance_count: int | None,
          capacity_usage: list[str] | None) -> dict[str, Any]:  # fmt: skip
    given = [name for name, value in (("--service-request-payload", payload),
                                      ("--instance-type", instance_type),
                                      ("--capacity-usage", capacity_usage)) if value]  # fmt: skip
    if instance_count is not None and not instance_type:
        raise Failure("submit-service-job: --instance-count goes with --instance-type", EXIT_USAGE)
    if len(given) != 1:
        raise Failure("submit-service-job: give the capacity the job needs with exactly one of "
                      "--service-request-payload, --instance-type [--instance-count] or "
                      f"--capacity-usage (got {', '.join(given) or 'none'})", EXIT_USAGE)
    if payload:
        return {"serviceRequestPayload": load_file("--service-request-payload", payload)}
    if instance_type:
        return {"capacityUsage": [{"capacityUnit": instance_type,
                                   "quantity": instance_count or 1}]}  # fmt: skip
    return {"capacityUsage": many("--capacity-usage", capacity_usage, "capacityUsage")}


async def _job_write(url: str | None, operation: str, command: dict[str, Any],
                     respond: Callable[[dict], dict], wait: bool, timeout: float,
                     output: Output) -> None:  # fmt: skip
    """A command about one job: its route is the job's (queue, share), asked of the
    scheduler, and an unknown job fails like AWS's ClientException (exit 1)."""
    command = checked(operation, command)
    async with session(url) as bus:
        job = await ask(bus, operation, "describe-service-job", jobId=command["jobId"])
        route = (job["jobQueue"], job["quotaShareName"])
        command = {**command, "jobId": job["jobId"]}
        response = await send(bus, operation, command, respond(job), wait, timeout, route)
    emit(response, output)


JobIdOpt = Annotated[str, typer.Option("--job-id", help="Job id or job ARN.")]


@register_verb("update-service-job")
def update_service_job(
    job_id: JobIdOpt,
    scheduling_priority: Annotated[int, typer.Option("--scheduling-priority", help="0-9999.")],
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a job's scheduling priority (may preempt within its share, or make it a victim)."""
    command = {"kind": "UpdateServiceJob", "jobId": job_id,
               "schedulingPriority": scheduling_priority}  # fmt: skip
    run(lambda: _job_write(nats_url, "UpdateServiceJob", command, lambda job: {
        "jobArn": job["jobArn"], "jobName": job["jobName"], "jobId": job["jobId"],
    }, wait, wait_timeout, output))  # fmt: skip


@register_verb("terminate-service-job")
def terminate_service_job(
    job_id: JobIdOpt,
    reason: Annotated[str, typer.Option("--reason", help="Recorded as the statusReason.")],
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Terminate a job; it ends FAILED with isTerminated."""
    command = {"kind": "TerminateServiceJob", "jobId": job_id, "reason": reason}
    run(lambda: _job_write(nats_url, "TerminateServiceJob", command, lambda job: {},
                           wait, wait_timeout, output))  # fmt: skip


@register_verb("describe-service-job", PANEL_READ)
def describe_service_job(
    job_id: JobIdOpt, output: OutputOpt = Output.json, nats_url: NatsUrl = None,
) -> None:
    """Describe one job: status, share, priority, capacity, preemptions, attempts."""

    async def work():
        async with session(nats_url) as bus:
            answer = await ask(bus, "DescribeServiceJob", "describe-service-job", jobId=job_id)
        emit(answer, output)

    run(work)


FILTER_NAMES = ("JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT", "SHARE_IDENTIFIER",
                "QUOTA_SHARE_NAME")  # fmt: skip


@register_verb("list-service-jobs", PANEL_READ)
def list_service_jobs(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    job_status: Annotated[Optional[str], typer.Option(
        "--job-status", show_default=False,
        help="RUNNABLE, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED (or ALL) "
             "(default RUNNING, as AWS).")] = None,  # fmt: skip
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filters", show_default=False,
        help="name=QUOTA_SHARE_NAME,values=qs1 (kept with --job-status) or "
             "name=JOB_NAME,values=train-* (ignores --job-status); several "
             "space-separated.")] = None,
    max_results: Annotated[Optional[int], typer.Option("--max-results", min=1, max=100,
                                                       show_default=False)] = None,  # fmt: skip
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """List a queue's jobs, newest first, like AWS (default status filter: RUNNING)."""

    async def work():
        parsed = many("--filters", filters, "filters")
        for item in parsed or []:
            if not isinstance(item, dict) or item.get("name") not in FILTER_NAMES:
                raise Failure(f"Error parsing parameter '--filters': each filter needs a name, "
                              f"one of {', '.join(FILTER_NAMES)}; got {item!r}", EXIT_USAGE)
        async with session(nats_url) as bus:
            answer = await ask(bus, "ListServiceJobs", "list-service-jobs", jobQueue=job_queue,
                               jobStatus=job_status, filters=parsed, maxResults=max_results)
        emit(answer, output, lambda console, doc: render_items(
            console, doc["jobSummaryList"], f"Jobs in {name_from_arn(job_queue)}", JOB_COLUMNS))

    run(work)


@register_verb("get-job-queue-snapshot", PANEL_READ)
def get_job_queue_snapshot(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """The queue's front (next RUNNABLE jobs, per share and overall) and capacity usage."""

    async def work():
        async with session(nats_url) as bus:
            answer = await ask(bus, "GetJobQueueSnapshot", "get-job-queue-snapshot",
                               jobQueue=job_queue)  # fmt: skip
        emit(answer, output, render_snapshot)

    run(work)


def _job_arn(job_id: str) -> str:
    return f"{ARN}:job/{job_id}"
