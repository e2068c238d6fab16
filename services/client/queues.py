"""The Python client for pipelines, shaped like the SageMaker SDK's training queues.

    from quotasched.services.client import TrainingQueue
    queue = TrainingQueue("q", nats_url="nats://127.0.0.1:4222")
    job = queue.submit("train-1", quota_share_name="qs1", priority=3,
                       instance_type="ml.g5.xlarge", instance_count=1)
    job.update(scheduling_priority=5)
    job.describe()["status"]

`Bus` is the async core: publish a command (returns once JetStream stored it), optionally wait
for the facts the scheduler decided for it, and ask the scheduler read questions over NATS
request/reply.  `AsyncTrainingQueue` / `AsyncTrainingQueuedJob` are the async API; the
`TrainingQueue` / `TrainingQueuedJob` classes run the same code on a private event loop.

With a pipeline's credentials (`QUOTASCHED_NATS_USER=pipeline-<queue>-<share>` etc., see
`services.config.auth`) a wait follows the facts under the team's own share through one of its
eight consumer slots, deleted when the decision is in (`commands.Decisions`).

This module is the SDK's public face (re-exported by the package, so users import
`quotasched.services.client`); its helpers live beside it: `reads` (routing read requests,
retries while no leader answers, merging a fan-out), `commands` (commands in, decisions out,
`ClientError`) and `loop` (the sync API's event loop).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Mapping
from typing import Any

from quotasched.events.facts import Fact
from quotasched.events.subjects import (
    ANY,
    COMMANDS_STREAM,
    GATED_COMMANDS,
    gate_subject,
    subject_for_command,
)
from quotasched.services.nats.bus import connect
from quotasched.services.client.commands import (
    ClientError,
    Decisions,
    GateRefused,
    SchedulerBusy,
    as_command,
    raise_if_rejected,
)
from quotasched.services.client.loop import _Loop
from quotasched.services.client.reads import HANDOVER_WAIT_S, RESPONDER_WAIT_S, ask, merge, queue_of  # noqa: F401

FORGOTTEN_WAIT_S = 2.0  # how long a describe of an unknown job waits for the projection

DEFAULT_URL = "nats://127.0.0.1:4222"


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("QUOTASCHED_NATS_URL") or DEFAULT_URL


class Bus:
    """`credentials`: the variables of a role's credentials file (`services.config.auth`) to connect
    with instead of the environment's, for a process acting as several roles."""

    def __init__(self, url: str | None = None, name: str = "quotasched-client",
                 credentials: Mapping[str, str] | None = None):  # fmt: skip
        self.url = resolve_url(url)
        self.name = name
        self.credentials = credentials
        self.nc = None
        self.js = None

    async def __aenter__(self) -> Bus:
        self.nc = await connect(self.url, self.name, credentials=self.credentials)
        self.js = self.nc.jetstream()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.drain()
            self.nc = None

    async def request(self, verb: str, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        """Ask the scheduler: a request naming a job queue goes to `qm.api.<queue>.<verb>`,
        any other to `qm.api.~.<verb>`.  A scheduler partitioned per job queue answers the
        latter from its fleet partition, or names the queues that hold the answer
        (`redirect`); then each is asked and the answers are merged."""
        queue = queue_of(params.get("jobQueue"))
        answer = await self._ask(queue or ANY, verb, params, timeout)
        if isinstance(answer, dict) and "redirect" in answer:
            asked = [self._ask(name, verb, params, timeout, missing_ok=True)
                     for name in answer["redirect"]]  # fmt: skip
            answer = merge(verb, [a for a in await asyncio.gather(*asked) if a is not None])
        if isinstance(answer, dict) and "error" in answer:
            message = answer["error"]["message"]
            if answer["error"].get("type") == "TooManyRequestsException":
                raise SchedulerBusy(message)
            if verb == "describe-service-job" and message.endswith("does not exist"):
                kept = await self._forgotten_job(params)
                if kept is not None:
                    return kept
            raise ClientError(message)
        return answer

    async def _forgotten_job(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """A job the scheduler no longer holds (its queue's retention forgot it, JobExpired)
        as the projection describes it; None when no projector answers or it does not know
        the job either (or this connection may not ask it)."""
        from quotasched.services.projector.client import ProjectorError
        from quotasched.services.projector.client import request as ask_projector

        try:
            return await ask_projector(self.nc, "describe-service-job", timeout=FORGOTTEN_WAIT_S,
                                       jobId=params.get("jobId"))  # fmt: skip
        except (ProjectorError, OSError, ValueError):
            return None

    async def _ask(self, queue: str, verb: str, params: dict, timeout: float,
                   missing_ok: bool = False) -> dict[str, Any] | None:  # fmt: skip
        """One request, asked again while no leader answers (see `client_reads.ask`)."""
        return await ask(self, queue, verb, params, timeout, missing_ok)

    async def route(self, job_id: str) -> tuple[str, str]:
        job = await self.request("describe-service-job", jobId=job_id)
        return job["jobQueue"], job["quotaShareName"]

    async def publish(self, command: Any, route: tuple[str, str] | None = None,
                      decisions: Decisions | None = None) -> int:  # fmt: skip
        """Store one command (a model, a dict or JSON text); returns its stream sequence.
        With `decisions`, its facts are followed from before it is published."""
        command, data = as_command(command)
        if route is None and command.kind in ("UpdateServiceJob", "TerminateServiceJob",
                                              "ReportJobStatus"):  # fmt: skip
            route = await self.route(command.job_id)
        subject = subject_for_command(command, route)
        if decisions is not None:
            await decisions.follow(subject)
        if command.kind in GATED_COMMANDS:
            return await self._through_gate(subject, data)
        ack = await self.js.publish(subject, data, stream=COMMANDS_STREAM)
        return ack.seq

    async def _through_gate(self, subject: str, data: bytes) -> int:
        """A team's job command goes through the admission gate (`qm.in.<queue>.<share>.<Kind>`),
        which forwards it to `subject` within the share's limits; the acknowledgement is the
        stream's own.  Where no gate runs (a scheduler started alone), straight to `subject`,
        as far as this connection's credentials allow (a team's do not)."""
        from nats.js.errors import APIError, NoStreamResponseError

        from quotasched.services.client.commands import team_role
        from quotasched.services.gate.limits import GATE_ERROR_CODES, THROTTLED

        try:
            ack = await self.js.publish(gate_subject(subject), data, stream=COMMANDS_STREAM)
        except NoStreamResponseError:  # no gate: nothing was stored
            if team_role(self.nc) is not None:
                raise ClientError(f"no admission gate answered on {gate_subject(subject)}: a "
                                  "team's commands pass through one (`quotasched gate`, or "
                                  "`quotasched up`, which runs one); nothing was stored") from None
            ack = await self.js.publish(subject, data, stream=COMMANDS_STREAM)
        except APIError as error:
            if error.err_code in GATE_ERROR_CODES:
                raise GateRefused(error.description or "refused at the gate",
                                  error.err_code == THROTTLED) from None  # fmt: skip
            raise
        return ack.seq

    async def submit_and_wait(self, command: Any, route: tuple[str, str] | None = None,
                              timeout: float = 30.0) -> list[Fact]:  # fmt: skip
        """Publish, then return the facts the scheduler recorded for this very command (with
        a pipeline's credentials: those under its share, see `Decisions`)."""
        decisions = Decisions()
        await decisions.start(self, slot_wait=timeout)
        try:
            seq = await self.publish(command, route, decisions)
            if await decisions.wait([seq], timeout):
                raise TimeoutError(f"command {seq} was stored but no decision arrived within "
                                   f"{timeout}s; is a scheduler running?")  # fmt: skip
            return decisions.facts[seq]
        finally:
            await decisions.close()


# -- SageMaker-SDK-shaped API ----------------------------------------------------------------


class AsyncTrainingQueuedJob:
    def __init__(self, bus: Bus, job_id: str, job_name: str, job_queue: str, quota_share_name: str):
        self.bus = bus
        self.job_id = job_id
        self.job_name = job_name
        self.job_queue = job_queue
        self.quota_share_name = quota_share_name

    @property
    def job_arn(self) -> str:
        return f"arn:aws:batch:local:000000000000:job/{self.job_id}"

    async def describe(self) -> dict[str, Any]:
        return await self.bus.request("describe-service-job", jobId=self.job_id,
                                      jobQueue=self.job_queue)  # fmt: skip

    async def update(self, scheduling_priority: int) -> None:
        raise_if_rejected(await self.bus.submit_and_wait(
            {"kind": "UpdateServiceJob", "jobId": self.job_id,
             "schedulingPriority": scheduling_priority},
            route=(self.job_queue, self.quota_share_name),
        ))  # fmt: skip

    async def terminate(self, reason: str = "Default terminate reason") -> None:
        raise_if_rejected(await self.bus.submit_and_wait(
            {"kind": "TerminateServiceJob", "jobId": self.job_id, "reason": reason},
            route=(self.job_queue, self.quota_share_name),
        ))  # fmt: skip

    async def wait(self, timeout: float | None = None, poll_s: float = 0.2) -> dict[str, Any]:
        """Until SUCCEEDED or FAILED; returns the last description."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            described = await self.describe()
            if described["status"] in ("SUCCEEDED", "FAILED"):
                return described
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"job {self.job_id} still {described['status']}")
            await asyncio.sleep(poll_s)

    async def result(self, timeout: float | None = None) -> dict[str, Any]:
        described = await self.wait(timeout)
        if described["status"] == "FAILED":
            raise RuntimeError(described.get("statusReason") or "job failed")
        return described


class AsyncTrainingQueue:
    def __init__(self, queue_name: str, bus: Bus):
        self.queue_name = queue_name
        self.bus = bus

    async def submit(self, job_name: str, *, quota_share_name: str, priority: int | None = None,
                     instance_type: str | None = None, instance_count: int = 1,
                     capacity_usage: list[dict] | None = None,
                     service_request_payload: dict | str | None = None,
                     preemption_config: dict | None = None, retry_config: dict | None = None,
                     timeout: dict | None = None, tags: dict | None = None,
                     job_id: str | None = None, client_token: str | None = None,
                     share_identifier: str | None = None) -> AsyncTrainingQueuedJob:  # fmt: skip
        if share_identifier is not None:
            raise ValueError("share_identifier and quota_share_name can't be used together; "
                             "quota-management queues take quota_share_name")  # fmt: skip
        command: dict[str, Any] = {"kind": "SubmitServiceJob", "jobName": job_name,
                                   "jobQueue": self.queue_name, "quotaShareName": quota_share_name}
        if service_request_payload is not None:
            command["serviceRequestPayload"] = service_request_payload
        elif capacity_usage is not None:
            command["capacityUsage"] = capacity_usage
        elif instance_type is not None:
            command["capacityUsage"] = [{"capacityUnit": instance_type, "quantity": instance_count}]
        else:
            raise ValueError("give instance_type, capacity_usage or service_request_payload")
        if job_id is None and client_token is None:
            # An id nobody can know before this call (issue 29): the scheduler's derived ids
            # are only the fallback of a client that sends none.
            job_id = str(uuid.uuid4())
        optional = {"schedulingPriority": priority, "preemptionConfiguration": preemption_config,
                    "retryStrategy": retry_config, "timeoutConfig": timeout, "tags": tags,
                    "jobId": job_id, "clientToken": client_token}  # fmt: skip
        command.update({key: value for key, value in optional.items() if value is not None})
        facts = raise_if_rejected(await self.bus.submit_and_wait(command))
        # the decision may begin with timers it fired (other jobs' facts): take the job's own
        submitted = next(fact for fact in facts
                         if fact.kind in ("JobSubmitted", "SubmissionDeduplicated"))  # fmt: skip
        return AsyncTrainingQueuedJob(self.bus, submitted.job_id, job_name, self.queue_name,
                                      quota_share_name)  # fmt: skip

    async def list_jobs(self, job_name: str | None = None, status: str = "RUNNING") -> list[dict]:
        params: dict[str, Any] = {"jobQueue": self.queue_name, "jobStatus": status}
        if job_name is not None:
            params["filters"] = [{"name": "JOB_NAME", "values": [job_name]}]
        return (await self.bus.request("list-service-jobs", **params))["jobSummaryList"]

    async def list_jobs_by_share(self, quota_share_name: str, status: str = "RUNNING") -> list[dict]:
        return (await self.bus.request(
            "list-service-jobs", jobQueue=self.queue_name, jobStatus=status,
            filters=[{"name": "QUOTA_SHARE_NAME", "values": [quota_share_name]}],
        ))["jobSummaryList"]  # fmt: skip

    async def get_job(self, job_name: str) -> AsyncTrainingQueuedJob:
        jobs = await self.list_jobs(job_name=job_name)
        if not jobs:
            raise ValueError(f"no job named {job_name} in {self.queue_name}")
        job = jobs[0]
        return AsyncTrainingQueuedJob(self.bus, job["jobId"], job["jobName"], self.queue_name,
                                      job["quotaShareName"])  # fmt: skip

    async def snapshot(self) -> dict[str, Any]:
        return await self.bus.request("get-job-queue-snapshot", jobQueue=self.queue_name)


class TrainingQueuedJob:
    def __init__(self, inner: AsyncTrainingQueuedJob, loop: _Loop):
        self._inner, self._loop = inner, loop
        self.job_id, self.job_name = inner.job_id, inner.job_name
        self.job_arn, self.quota_share_name = inner.job_arn, inner.quota_share_name

    def describe(self) -> dict[str, Any]:
        return self._loop.run(self._inner.describe())

    def update(self, scheduling_priority: int) -> None:
        self._loop.run(self._inner.update(scheduling_priority))

    def terminate(self, reason: str = "Default terminate reason") -> None:
        self._loop.run(self._inner.terminate(reason))

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        return self._loop.run(self._inner.wait(timeout))

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        return self._loop.run(self._inner.result(timeout))


class TrainingQueue:
    def __init__(self, queue_name: str, nats_url: str | None = None):
        self._loop = _Loop()
        self.bus = Bus(nats_url)
        self._loop.run(self.bus.__aenter__())
        self._inner = AsyncTrainingQueue(queue_name, self.bus)
        self.queue_name = queue_name

    def submit(self, job_name: str, **options: Any) -> TrainingQueuedJob:
        return TrainingQueuedJob(self._loop.run(self._inner.submit(job_name, **options)), self._loop)

    def list_jobs(self, job_name: str | None = None, status: str = "RUNNING") -> list[dict]:
        return self._loop.run(self._inner.list_jobs(job_name, status))

    def list_jobs_by_share(self, quota_share_name: str, status: str = "RUNNING") -> list[dict]:
        return self._loop.run(self._inner.list_jobs_by_share(quota_share_name, status))

    def get_job(self, job_name: str) -> TrainingQueuedJob:
        return TrainingQueuedJob(self._loop.run(self._inner.get_job(job_name)), self._loop)

    def snapshot(self) -> dict[str, Any]:
        return self._loop.run(self._inner.snapshot())

    def close(self) -> None:
        self._loop.run(self.bus.close())
        self._loop.loop.call_soon_threadsafe(self._loop.loop.stop)

    def __enter__(self) -> TrainingQueue:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
