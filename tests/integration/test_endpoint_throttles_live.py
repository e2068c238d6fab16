"""A scheduler that does not answer, through the AWS Batch endpoint with the real boto3 on a
real nats-server (issue 29): none running, one that never answers (overloaded), and one
stopped after setup.  Each is AWS's throttle, HTTP 429 TooManyRequestsException, which boto3
retries with backoff in its standard and legacy retry modes, never a 500 ServerException.  A
write retried that way (boto3 keeps SubmitServiceJob's generated clientToken across its
retries) becomes one job once a scheduler is back.  The in-flight cap without a network:
tests/unit/test_endpoint_throttles.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from quotasched.services.client import Bus
from quotasched.services.endpoint import operations
from quotasched.services.endpoint.server import Endpoint
from tests.integration.helpers import NOTEBOOK, api_ready, eventually, read_facts, wait_decided

pytestmark = [pytest.mark.nats, pytest.mark.slow]

PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}})


def client(url: str, **retries):
    """boto3's Batch client; `retries` as botocore's Config takes them.  `sent` counts the
    HTTP requests it made and keeps their bodies."""
    import boto3
    from botocore.config import Config

    batch = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                         aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy",
                         config=Config(retries=retries))  # fmt: skip
    batch.sent = []
    batch.meta.events.register("before-send.batch.*",
                               lambda request, **_: batch.sent.append(request.body))  # fmt: skip
    return batch


async def refused(call):
    """The ClientError boto3 raises for `call` (run in a thread: the endpoint is on this loop)."""
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as error:
        await asyncio.to_thread(call)
    return error.value.response


def assert_throttled(response: dict, words: str) -> None:
    assert response["Error"]["Code"] == "TooManyRequestsException", response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert words in response["Error"]["Message"]


@pytest.fixture
def quick(monkeypatch):
    """The endpoint's waits for the scheduler, short: each attempt is answered within ~1 s."""
    monkeypatch.setattr(operations, "READ_WAIT_S", 1.0)
    monkeypatch.setattr(operations, "DECISION_WAIT_S", 1.5)


async def test_no_scheduler_is_a_throttle_that_boto3_retries(nats_server, quick):
    async with Bus(nats_server.url) as bus:
        endpoint = await Endpoint(bus).start()
        try:
            once = client(endpoint.url, mode="standard", total_max_attempts=1)
            answer = await refused(lambda: once.describe_service_job(jobId="j1"))
            assert_throttled(answer, "no scheduler answered within 1 s")
            assert len(once.sent) == 1

            standard = client(endpoint.url, mode="standard", total_max_attempts=3)
            answer = await refused(lambda: standard.list_service_jobs(jobQueue="q"))
            assert_throttled(answer, "no scheduler answered within 1 s")
            assert answer["ResponseMetadata"]["RetryAttempts"] == 2
            assert len(standard.sent) == 3

            legacy = client(endpoint.url, mode="legacy", max_attempts=2)  # retries, not attempts
            answer = await refused(lambda: legacy.describe_job_queues())
            assert_throttled(answer, "no scheduler answered within 1 s")
            assert answer["ResponseMetadata"]["RetryAttempts"] == 2
            assert len(legacy.sent) == 3
            assert list(endpoint.throttle.held().values()) == [6]  # 7 throttles, one line told
        finally:
            await endpoint.close()


async def test_a_scheduler_that_never_answers_is_a_throttle_after_the_read_wait(nats_server,
                                                                                quick):  # fmt: skip
    async with Bus(nats_server.url) as bus:
        silent = await bus.nc.subscribe("qm.api.>")  # takes every question, answers none
        endpoint = await Endpoint(bus).start()
        try:
            batch = client(endpoint.url, mode="standard", total_max_attempts=2)
            answer = await refused(lambda: batch.describe_service_job(jobId="j1"))
            assert_throttled(answer, "the scheduler did not answer within 1 s (overloaded)")
            assert answer["ResponseMetadata"]["RetryAttempts"] == 1
            assert len(batch.sent) == 2
            held = endpoint.throttle.held()
            assert list(held.values()) == [1]  # two throttles, one line told
        finally:
            await endpoint.close()
            await silent.unsubscribe()


async def setup(bus) -> None:
    """The notebook's environment, policy, queue q and shares qs1-qs3."""
    lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
    last = 0
    for line in lines:
        last = await bus.publish(line)
    await wait_decided(bus.js, last)


async def test_a_stopped_scheduler_is_a_throttle_and_the_retried_write_one_job(nats_server, spawn,
                                                                               quick):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        await setup(bus)
        assert scheduler.stop() == 0, scheduler.output()
        endpoint = await Endpoint(bus).start()
        try:
            batch = client(endpoint.url, mode="standard", total_max_attempts=3)
            answer = await refused(lambda: batch.describe_job_queues())
            assert_throttled(answer, "no scheduler answered within 1 s")

            batch.sent.clear()
            answer = await refused(lambda: batch.submit_service_job(
                jobName="while-stopped", jobQueue="q", quotaShareName="qs1",
                serviceJobType="SAGEMAKER_TRAINING", serviceRequestPayload=PAYLOAD))
            assert_throttled(answer, "the scheduler did not decide within 1.5 s")
            assert "the command may be stored" in answer["Error"]["Message"]
            assert answer["ResponseMetadata"]["RetryAttempts"] == 2
            tokens = {json.loads(body)["clientToken"] for body in batch.sent}
            assert len(batch.sent) == 3 and len(tokens) == 1  # one token across the retries

            spawn("scheduler")  # back: the three stored submissions are decided, in order
            await api_ready(bus)

            async def decided():
                facts = [fact for fact in await read_facts(bus.js)
                         if fact["kind"] in ("JobSubmitted", "SubmissionDeduplicated")]
                return facts if len(facts) == 3 else None

            facts = await eventually(decided, what="the three submissions decided")
            assert [fact["kind"] for fact in facts] == [
                "JobSubmitted", "SubmissionDeduplicated", "SubmissionDeduplicated"]
            assert len({fact["jobId"] for fact in facts}) == 1

            listed = await asyncio.to_thread(lambda: batch.list_service_jobs(
                jobQueue="q", filters=[{"name": "JOB_NAME", "values": ["while-*"]}]))
            assert [job["jobName"] for job in listed["jobSummaryList"]] == ["while-stopped"]
        finally:
            await endpoint.close()
