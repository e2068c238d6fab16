"""The SageMaker executor: each attempt is a SageMaker training job.

A job's `serviceRequestPayload` is the `CreateTrainingJob` request the SageMaker SDK built (a
JSON string or an object).  Each attempt creates it under its own name, the one
DescribeServiceJob shows as the attempt's `serviceResourceId`
(`AWSBatch-<job id>-<attempt>`, scheduler/api.py `training_job_name`), tagged
`quotasched:job-id` and `quotasched:attempt`.  The name is the idempotency key: a second
create of the same attempt (a redelivered dispatch, a restart) finds the job instead of
starting it twice.

The job is then followed with DescribeTrainingJob, with back-off (`poll_s` doubling up to
`poll_max_s`, back to `poll_s` whenever the status changes), and its status reported
(`report_for`): STARTING once it is created, RUNNING once it trains, then SUCCEEDED or FAILED,
or INSUFFICIENT_CAPACITY when SageMaker could not get the instances (the scheduler then puts
the job back in its queue).  A preemption or a scheduler-side end stops it (StopTrainingJob)
and waits until SageMaker says it has stopped, so a preemptor never starts on instances a
victim still holds.  A training job runs whatever happens to its caller, so stopping the executor
(SIGTERM or SIGKILL) leaves it running, and the next executor on the same ledger follows each
attempt the ledger lists by its name (`resumed`): a job still InProgress or Stopping is followed
to its end, one that ended meanwhile is reported as it ended, and one never created is created
now (the name makes that the first create).  `--stop-jobs` stops them on a shutdown instead.

boto3 finds the endpoint, region and credentials its usual way (AWS_ENDPOINT_URL_SAGEMAKER,
AWS_PROFILE, AWS_REGION, instance roles, ...).  Its calls block, so they run in threads.
Checkpointing is SageMaker's own: the payload's CheckpointConfig passes through unchanged, so
every attempt of a job syncs the same S3 prefix (docs/executors.md).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from typing import Any

from quotasched.services import logs
from quotasched.services.executors.base import Attempt, Executor, Publish, payload_object
from quotasched.services.executors.ledger import Entry, Ledger
from quotasched.services.scheduler.api import training_job_name

log = logs.get("quotasched.executor")

JOB_ID_TAG = "quotasched:job-id"
ATTEMPT_TAG = "quotasched:attempt"
STOPPED_OUTSIDE = "Training job stopped outside quotasched"

# SageMaker's SecondaryStatus values while TrainingJobStatus is InProgress (DescribeTrainingJob).
PREPARING = frozenset({"Starting", "Pending", "LaunchingMLInstances", "PreparingTrainingStack",
                       "Downloading", "DownloadingTrainingImage", "Restarting"})  # fmt: skip
TRAINING = frozenset({"Training", "Uploading"})
# Stopped by SageMaker itself for a limit of the job's own, not by somebody: said as such.
SELF_STOPPED = frozenset({"MaxRuntimeExceeded", "MaxWaitTimeExceeded", "Interrupted"})
# The statuses a stopped training job can end in: it no longer holds its instances.
ENDED = frozenset({"Stopped", "Completed", "Failed"})
# How SageMaker says it could not get the instances: CreateTrainingJob's ResourceLimitExceeded
# (an account quota), or a job that Failed with "CapacityError: Unable to provision requested
# ML compute capacity", "InsufficientInstanceCapacity", ...
CAPACITY = re.compile(r"insufficient[\s_-]*(instance[\s_-]*)?capacity|capacity\s*error|"
                      r"resource\s*limit\s*exceeded", re.IGNORECASE)  # fmt: skip
CAPACITY_CODES = frozenset({"ResourceLimitExceeded", "CapacityError",
                            "InsufficientInstanceCapacity"})  # fmt: skip
ORDER = {"STARTING": 1, "RUNNING": 2}  # progress only goes forward


# -- pure parts, each with its own unit tests ---------------------------------------------------


def is_capacity_failure(reason: str | None) -> bool:
    """Whether SageMaker's words say it lacked the instances (not that the job failed)."""
    return bool(reason) and CAPACITY.search(reason) is not None


def report_for(description: dict[str, Any]) -> tuple[str, str | None] | None:
    """The report a DescribeTrainingJob answer calls for: (status, reason), or None when it
    says nothing new (Stopping, Updating, a status SageMaker adds later)."""
    status = description.get("TrainingJobStatus")
    secondary = description.get("SecondaryStatus")
    reason = description.get("FailureReason")
    if status == "InProgress":
        if secondary in TRAINING:
            return "RUNNING", None
        return ("STARTING", None) if secondary in PREPARING else None
    if status == "Completed":
        return "SUCCEEDED", None
    if status == "Failed":
        if is_capacity_failure(reason):
            return "INSUFFICIENT_CAPACITY", reason
        return "FAILED", reason or "Training job failed (SageMaker gave no reason)"
    if status == "Stopped":
        if secondary in SELF_STOPPED:
            return "FAILED", f"Training job stopped by SageMaker: {secondary}"
        return "FAILED", STOPPED_OUTSIDE
    if status == "Deleting":
        return "FAILED", "Training job deleted outside quotasched"
    return None


def backoff(start_s: float, cap_s: float, factor: float = 2.0) -> Iterator[float]:
    """The waits between two DescribeTrainingJob calls: `start_s`, doubling, at most `cap_s`.
    A job takes minutes to start and hours to train: polling soon catches the first
    transitions, and the cap keeps a long job from costing a call a second."""
    delay = start_s
    while True:
        yield min(delay, cap_s)
        delay = min(delay * factor, cap_s)


def stop_confirmed(description: dict[str, Any] | None) -> bool:
    """Whether a training job no longer holds its instances (None: there is no such job)."""
    return description is None or description.get("TrainingJobStatus") in ENDED


def create_outcome(code: str, message: str) -> str | tuple[str, str]:
    """What a CreateTrainingJob error means: "exists" (the attempt was already created: follow
    that job), "unknown" (the create may have happened: look before failing), or the
    (status, reason) to report."""
    if code == "ResourceInUse" or (code == "ValidationException"
                                   and "already exists" in message.lower()):  # fmt: skip
        return "exists"
    if code in CAPACITY_CODES or is_capacity_failure(message):
        return "INSUFFICIENT_CAPACITY", f"CreateTrainingJob: {code}: {message}"
    if code in ("ValidationException", "AccessDeniedException", "ResourceNotFound",
                "UnrecognizedClientException", "InvalidClientTokenId"):  # fmt: skip
        return "FAILED", f"CreateTrainingJob: {code}: {message}"
    return "unknown"


def resumed(description: dict[str, Any] | None,
            running_reported: bool) -> str | tuple[str, str | None]:  # fmt: skip
    """What an executor started again does with an attempt its predecessor created: "create"
    (no such training job: the predecessor stopped before creating it), "follow" (still
    InProgress, Stopping, ...: follow it), or the (status, reason) it ended with meanwhile
    (INSUFFICIENT_CAPACITY is FAILED once RUNNING was reported: the scheduler takes a
    capacity bounce before RUNNING only)."""
    if description is None:
        return "create"
    news = report_for(description)
    if news is None or news[0] in ORDER:
        return "follow"
    if news[0] == "INSUFFICIENT_CAPACITY" and running_reported:
        return "FAILED", news[1]
    return news


def training_request(spec: dict[str, Any], job_id: str, attempt: int) -> dict[str, Any]:
    """The attempt's CreateTrainingJob request: the job's payload under the attempt's name,
    with the payload's tags plus (replacing any of the same keys) quotasched's two."""
    payload = payload_object(spec)
    if payload is None:
        raise ValueError("the job's serviceRequestPayload is not a CreateTrainingJob request "
                         "(a JSON object)")  # fmt: skip
    ours = {JOB_ID_TAG: job_id, ATTEMPT_TAG: str(attempt)}
    tags = [tag for tag in payload.get("Tags") or [] if tag.get("Key") not in ours]
    tags += [{"Key": key, "Value": value} for key, value in ours.items()]
    return {**payload, "TrainingJobName": training_job_name(job_id, attempt), "Tags": tags}


def not_found(error: Exception) -> bool:
    """A DescribeTrainingJob or StopTrainingJob error saying there is no such job."""
    code, message = _error(error)
    return code == "ResourceNotFound" or (code == "ValidationException"
                                          and "could not find" in message.lower())  # fmt: skip


def _error(error: Exception) -> tuple[str, str]:
    details = getattr(error, "response", {}).get("Error", {})
    return str(details.get("Code", type(error).__name__)), str(details.get("Message", error))


def _setting(given: float | None, variable: str, default: float) -> float:
    """An option as given, else from the environment (how `quotasched executor` sets it)."""
    if given is not None:
        return given
    value = os.environ.get(variable)
    return float(value) if value else default


# -- the executor ---------------------------------------------------------------------------------


class SageMakerExecutor(Executor):
    name = "sagemaker"
    reports_progress = True  # STARTING once created, RUNNING once SageMaker says it trains
    follows_across_restarts = True  # a training job runs on: followed again by its name

    def __init__(self, publish: Publish, ledger: Ledger | None = None, client: Any = None,
                 poll_s: float | None = None, poll_max_s: float | None = None,
                 stop_timeout_s: float | None = None):  # fmt: skip
        """Defaults from QUOTASCHED_SAGEMAKER_POLL_S (1), QUOTASCHED_SAGEMAKER_POLL_MAX_S (30)
        and QUOTASCHED_SAGEMAKER_STOP_TIMEOUT_S (900: how long a stop may take before the
        executor gives up waiting and lets the next job start)."""
        super().__init__(publish, ledger)
        self.client = client if client is not None else _client()
        self.poll_s = _setting(poll_s, "QUOTASCHED_SAGEMAKER_POLL_S", 1.0)
        self.poll_max_s = _setting(poll_max_s, "QUOTASCHED_SAGEMAKER_POLL_MAX_S", 30.0)
        self.stop_timeout_s = _setting(stop_timeout_s, "QUOTASCHED_SAGEMAKER_STOP_TIMEOUT_S", 900.0)
        # CreateTrainingJob calls under way: a thread cannot be cancelled, so a stop waits for
        # the create to return before it stops the job (else the job would start after it).
        self.creating: dict[str, asyncio.Future] = {}

    async def adopt(self, attempt: Attempt) -> bool:
        return True  # looked up by its name (`execute`)

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        name = training_job_name(attempt.job_id, attempt.attempt)
        if attempt.adopted is not None:  # left by the previous executor
            running = attempt.adopted.running
            step = resumed(await self._describe(name), running)
            if step == "follow":
                log.info("following a training job a previous executor created", training_job=name)
                return await self._follow(attempt, name, "RUNNING" if running else "STARTING")
            if step != "create":
                return step
        request = training_request(attempt.spec, attempt.job_id, attempt.attempt)
        created = await self._create(name, request)
        if created is not None:
            return created
        await self.report(attempt, "STARTING")
        return await self._follow(attempt, name)

    async def _create(self, name: str, request: dict[str, Any]) -> tuple[str, str] | None:
        """Create the training job; None once it exists (created now or before), else the
        report that ends the attempt."""
        from botocore.exceptions import ClientError, ParamValidationError

        create = asyncio.to_thread(self.client.create_training_job, **request)
        future = asyncio.ensure_future(create)
        self.creating[name] = future
        try:
            await asyncio.shield(future)
        except ParamValidationError as error:
            return "FAILED", f"CreateTrainingJob: invalid request: {error}"
        except ClientError as error:
            outcome = create_outcome(*_error(error))
            if outcome == "exists":
                log.info("training job already created, following it", training_job=name)
                return None
            if outcome == "unknown" and await self._describe(name) is not None:
                return None  # the create went through despite the error
            if isinstance(outcome, tuple):
                return outcome
            return "FAILED", "CreateTrainingJob: {}: {}".format(*_error(error))
        finally:
            if future.done():
                self.creating.pop(name, None)
        log.info("training job created", training_job=name)
        return None

    async def _follow(self, attempt: Attempt, name: str,
                      reported: str = "STARTING") -> tuple[str, str | None]:  # fmt: skip
        """DescribeTrainingJob until the job ends, reporting its progress as it goes (first
        after `poll_s`: a job just created is still starting); `reported`: the progress
        already reported."""
        delays = backoff(self.poll_s, self.poll_max_s)
        while True:
            await asyncio.sleep(next(delays))
            description = await self._describe(name)
            if description is None:
                return "FAILED", f"Training job {name} not found"
            news = report_for(description)
            if news is not None and news[0] in ORDER:
                if ORDER[news[0]] > ORDER[reported]:
                    await self.report(attempt, news[0])
                    reported = news[0]
                    if reported == "RUNNING":
                        self.noted_running(attempt)
                    delays = backoff(self.poll_s, self.poll_max_s)  # follow the next one soon
            elif news is not None:
                status, reason = news
                if status == "INSUFFICIENT_CAPACITY" and reported == "RUNNING":
                    status = "FAILED"  # the scheduler takes a capacity bounce before RUNNING only
                return status, reason

    async def _describe(self, name: str) -> dict[str, Any] | None:
        """DescribeTrainingJob, None if there is no such job.  Other errors (the network, a
        throttle boto3 gave up on) are logged and asked again after a while: the job runs on
        whether or not we can see it."""
        delays = backoff(self.poll_s, self.poll_max_s)
        while True:
            try:
                return await asyncio.to_thread(self.client.describe_training_job,
                                               TrainingJobName=name)  # fmt: skip
            except Exception as error:
                if not_found(error):
                    return None
                log.warning("DescribeTrainingJob failed", training_job=name, error=str(error))
            await asyncio.sleep(next(delays))

    async def interrupt(self, attempt: Attempt) -> None:
        """StopTrainingJob, then wait until SageMaker says the job stopped: a preemptor waits
        for this (afterPreemptionOf), since the victim holds its instances until then."""
        await self.stop_job(training_job_name(attempt.job_id, attempt.attempt))

    async def end_lost(self, entry: Entry) -> tuple[str, str | None] | None:
        """Stop the training job of an attempt the previous executor left, by its name, and say
        how it ended: as SageMaker says if it ended by itself (a job that completed while no
        executor watched is SUCCEEDED), lost if it was still running (the retryStrategy
        decides), nothing to report if it was never created (lost as well)."""
        ended = await self.stop_job(training_job_name(entry.job_id, entry.attempt))
        outcome = None if ended is None else report_for(ended)
        if outcome is None or outcome == ("FAILED", STOPPED_OUTSIDE) or outcome[0] not in (
                "SUCCEEDED", "FAILED", "INSUFFICIENT_CAPACITY"):  # fmt: skip
            return None  # never created, stopped here, or not stopped in time: lost
        if outcome[0] == "INSUFFICIENT_CAPACITY":  # the job may be RUNNING by now, where only
            return "FAILED", outcome[1]  # FAILED is taken (retryStrategy decides)
        return outcome

    async def stop_job(self, name: str) -> dict[str, Any] | None:
        """Stop a training job and wait (at most `stop_timeout_s`) until it no longer holds its
        instances; returns its last description (None: no such job)."""
        future = self.creating.pop(name, None)
        if future is not None:
            await asyncio.gather(future, return_exceptions=True)  # created or not: now we know
        try:
            await asyncio.to_thread(self.client.stop_training_job, TrainingJobName=name)
            log.info("training job stop asked", training_job=name)
        except Exception as error:  # already ended (ValidationException), none, or refused
            if not_found(error):
                return None
            log.info("StopTrainingJob refused", training_job=name, error=str(error))
        return await self._until_stopped(name)

    async def _until_stopped(self, name: str) -> dict[str, Any] | None:
        """DescribeTrainingJob until `stop_confirmed`; past `stop_timeout_s`, the last answer
        (logged: the next job may then start while this one still holds its instances)."""
        try:
            return await asyncio.wait_for(self._stopped(name), self.stop_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            log.error("training job not stopped in time, no longer waiting", training_job=name,
                      timeout_s=self.stop_timeout_s)  # fmt: skip
            return {"TrainingJobName": name, "TrainingJobStatus": "Stopping"}

    async def _stopped(self, name: str) -> dict[str, Any] | None:
        delays = backoff(self.poll_s, self.poll_max_s)
        while True:
            description = await self._describe(name)
            if stop_confirmed(description):
                return description
            await asyncio.sleep(next(delays))


def _client() -> Any:
    """A boto3 SageMaker client, configured the usual way (environment, profile, region)."""
    try:
        import boto3
    except ImportError:
        raise RuntimeError("the sagemaker executor needs boto3: pip install 'quotasched[sagemaker]'"
                           ) from None  # fmt: skip
    return boto3.client("sagemaker")
