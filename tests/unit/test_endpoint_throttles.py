"""The AWS Batch endpoint under load, without a scheduler (issue 29): a scheduler that does not
answer in time is AWS's throttle (HTTP 429 TooManyRequestsException, retried by the SDKs), not
a 500; an error the scheduler answers stays a ClientException; and at most
`max_in_flight` requests wait on the bus at once, the surplus answered 429 at once without
touching it.  A fake bus stands in for NATS; the live version with boto3 and a real
nats-server is tests/integration/test_endpoint_throttles_live.py."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from nats.errors import NoRespondersError

from quotasched.services.client import ClientError
from quotasched.services.endpoint.operations import Refused, perform
from quotasched.services.endpoint.server import Endpoint
from quotasched.services.settings import HttpOptions

JOB = {"jobId": "j1", "jobName": "n1", "jobArn": "arn:aws:batch:local:000000000000:job/j1",
       "jobQueue": "q", "quotaShareName": "qs1", "status": "RUNNABLE",
       "serviceJobType": "SAGEMAKER_TRAINING"}  # fmt: skip


class HeldBus:
    """A bus whose reads wait until `release` is set, counting the requests that reached it."""

    def __init__(self):
        self.asked = 0
        self.release = asyncio.Event()

    async def request(self, verb: str, timeout: float = 10.0, **params):
        self.asked += 1
        await self.release.wait()
        return JOB


class FailingBus:
    def __init__(self, error: Exception):
        self.error = error

    async def request(self, verb: str, timeout: float = 10.0, **params):
        raise self.error


async def describe(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with session.post(f"{url}/v1/describeservicejob", json={"jobId": "j1"}) as answer:
        return answer.status, await answer.json()


async def until(condition, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_requests_over_the_in_flight_cap_are_throttled_at_once_without_the_bus():
    bus = HeldBus()
    endpoint = await Endpoint(bus, http=HttpOptions(max_in_flight=2)).start()
    try:
        async with aiohttp.ClientSession() as session:
            held = [asyncio.create_task(describe(session, endpoint.url)) for _ in range(2)]
            await until(lambda: bus.asked == 2)
            async with session.post(f"{endpoint.url}/v1/describeservicejob",
                                    json={"jobId": "j1"}) as over:  # fmt: skip
                assert over.status == 429
                assert over.headers["x-amzn-ErrorType"] == "TooManyRequestsException"
                body = await over.json()
            assert body["__type"] == "TooManyRequestsException"
            assert "2 requests are already waiting on the scheduler" in body["message"]
            assert bus.asked == 2  # refused without touching the bus
            assert endpoint.in_flight.count == 2

            bus.release.set()
            assert [status for status, _ in await asyncio.gather(*held)] == [200, 200]
            assert endpoint.in_flight.count == 0  # released: the next one is admitted
            status, answer = await describe(session, endpoint.url)
            assert (status, answer["jobId"]) == (200, "j1")
            assert bus.asked == 3
    finally:
        await endpoint.close()


async def test_a_throttle_is_one_log_line_per_interval():
    bus = HeldBus()
    endpoint = await Endpoint(bus, http=HttpOptions(max_in_flight=1)).start()
    try:
        async with aiohttp.ClientSession() as session:
            held = asyncio.create_task(describe(session, endpoint.url))
            await until(lambda: bus.asked == 1)
            statuses = [(await describe(session, endpoint.url))[0] for _ in range(20)]
            assert statuses == [429] * 20
            bus.release.set()
            await held
        assert list(endpoint.throttle.held().values()) == [19]  # one line told, 19 held back
    finally:
        await endpoint.close()


@pytest.mark.parametrize("error, words", [
    (NoRespondersError(), "no scheduler answered within"),
    (TimeoutError(), "the scheduler did not answer within 10 s"),
])  # fmt: skip
async def test_a_scheduler_that_does_not_answer_is_a_throttle_not_a_server_error(error, words):
    with pytest.raises(Refused) as refused:
        await perform(FailingBus(error), "DescribeServiceJob", {"jobId": "j1"})
    assert (refused.value.status, refused.value.kind) == (429, "TooManyRequestsException")
    assert words in refused.value.message and refused.value.message.endswith("retry later")


async def test_an_error_the_scheduler_answers_stays_a_client_exception():
    with pytest.raises(Refused) as refused:
        await perform(FailingBus(ClientError("Job j1 does not exist")), "DescribeServiceJob",
                      {"jobId": "j1"})  # fmt: skip
    assert (refused.value.status, refused.value.kind) == (400, "ClientException")
    assert refused.value.message == "Job j1 does not exist"


async def test_a_scheduler_whose_lists_queue_is_full_is_a_throttle():
    from quotasched.services.client.commands import SchedulerBusy

    message = "the scheduler has 64 list requests waiting; retry later"
    with pytest.raises(Refused) as refused:
        await perform(FailingBus(SchedulerBusy(message)), "ListServiceJobs", {"jobQueue": "q"})
    assert (refused.value.status, refused.value.kind) == (429, "TooManyRequestsException")
    assert refused.value.message == message


async def test_a_throttled_job_of_a_bulk_termination_is_never_counted_as_not_found():
    """TerminateServiceJobs counts a job it cannot find as successful (AWS's rule): a
    scheduler that did not answer must throttle the request, not claim success."""
    with pytest.raises(Refused) as refused:
        await perform(FailingBus(NoRespondersError()), "TerminateServiceJobs",
                      {"jobs": ["j1", "j2"], "reason": "r"})  # fmt: skip
    assert refused.value.status == 429
