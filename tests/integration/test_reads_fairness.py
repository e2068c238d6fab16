"""Reads against reads, live (issue 29 point 1): a real nats-server and `quotasched scheduler`
with 20,000 queued jobs.  A team's heaviest lists wait for their turn, one at a time; a
describe is answered at once, not behind them; and beyond 64 lists waiting, one is told to
come back later instead of queueing without end."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import G5, NO_TICKS, publish_items, setup_commands, wait_decided
from tests.integration.test_failover import wait_leading

pytestmark = pytest.mark.nats

QUEUE = "rq"
JOBS = 20_000
HEAVY = {"jobQueue": QUEUE, "maxResults": 1000, "jobStatus": "ALL"}


async def ask(bus: Bus, verb: str, request: dict) -> tuple[float, dict]:
    reply = await bus.nc.request(f"qm.api.{QUEUE}.{verb}", json.dumps(request).encode(),
                                 timeout=60)  # fmt: skip
    return time.perf_counter(), json.loads(reply.data)


@pytest.fixture
async def crowded(nats_server, spawn):
    scheduler = spawn("scheduler", **NO_TICKS)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        items = setup_commands(QUEUE, shares=[("qs1", 1, "RESERVE", "DISABLED")], capacity=1)
        items += [({"kind": "SubmitServiceJob", "jobId": f"r-{i:05d}", "jobName": f"r-{i}",
                    "jobQueue": QUEUE, "quotaShareName": "qs1",
                    "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}, None)
                  for i in range(JOBS)]  # fmt: skip
        seqs = await publish_items(bus, items)
        await wait_decided(bus.js, seqs[-1], timeout=120, processes=[scheduler])
        yield bus


async def test_a_describe_is_answered_at_once_while_heavy_lists_wait_their_turn(crowded):
    bus = crowded
    lists = [asyncio.create_task(ask(bus, "list-service-jobs", HEAVY)) for _ in range(30)]
    await asyncio.sleep(0.05)  # the lists are in before the describe
    described_at, described = await ask(bus, "describe-service-job", {"jobId": "r-00007"})
    answered = [await task for task in lists]
    assert described["jobId"] == "r-00007"
    assert all(len(answer["jobSummaryList"]) == 1000 for _, answer in answered)
    # 30 lists of 1,000 jobs take their turns one after another (and rest as long as each
    # worked); the describe did not wait for them
    assert described_at < max(at for at, _ in answered)
    assert sum(at > described_at for at, _ in answered) >= 20


async def test_beyond_64_waiting_lists_one_is_told_to_come_back_later(crowded):
    bus = crowded
    answers = await asyncio.gather(*(ask(bus, "list-service-jobs", HEAVY) for _ in range(120)))
    busy = [answer for _, answer in answers if "error" in answer]
    listed = [answer for _, answer in answers if "jobSummaryList" in answer]
    assert len(busy) + len(listed) == 120
    assert 120 - 64 - 1 - 5 <= len(busy) <= 120 - 64  # one being answered; a few done meanwhile
    assert {answer["error"]["type"] for answer in busy} == {"TooManyRequestsException"}
    assert busy[0]["error"]["message"] == ("the scheduler has 64 list requests waiting; "
                                           "retry later")  # fmt: skip
    # the Python client tells it apart from a refusal (the endpoint answers it with a 429)
    from quotasched.services.client.commands import SchedulerBusy

    asked = [bus.request("list-service-jobs", **HEAVY) for _ in range(120)]
    outcomes = await asyncio.gather(*asked, return_exceptions=True)
    assert any(isinstance(outcome, SchedulerBusy) for outcome in outcomes), outcomes[:3]
    assert all(isinstance(outcome, (dict, SchedulerBusy)) for outcome in outcomes)
