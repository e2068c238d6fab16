"""Options beyond AWS in the live service: a real nats-server and `quotasched scheduler`.

The admin publishes SetQuotaShareOptions on the bus like any command; a protection then runs
out with no other command arriving, so only the scheduler's own Tick (published once a timer is
due, ruling 13) can make the waiting reclaim happen.  Expected by hand: a has a 2 s minimum
runtime; a1 runs on its own instance, a2 borrows b's (dispatched a moment later on the bus's
clock); b1 waits.  At a1's dispatch + 2 s a1 is the first job of a, a share over its limit,
that may be taken (a2 is still protected for that moment), so b1 preempts a1, stamped exactly
then: protected jobs are not candidates, and the reclaim takes what is eligible.
"""

from __future__ import annotations

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading

pytestmark = pytest.mark.nats


def submit(job_id: str, share: str) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "oq",
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


async def test_a_protection_ends_by_the_schedulers_own_tick_and_the_reclaim_happens_then(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler", QUOTASCHED_TICK_INTERVAL_S="0.1")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("oq", shares=[
            ("a", 1, "LEND_AND_BORROW", "DISABLED"), ("b", 1, "LEND", "DISABLED")], capacity=2))
        await bus.publish({"kind": "SetQuotaShareOptions", "jobQueue": "oq", "quotaShareName": "a",
                           "options": {"minRuntimeBeforePreemptionSeconds": 2}})  # fmt: skip
        for job_id in ("a1", "a2"):
            await bus.publish(submit(job_id, "a"))
        await bus.publish(submit("b1", "b"))

        async def reclaimed():  # the decision's facts may be read while they are appended
            facts = await read_facts(bus.js)
            done = any(f["kind"] == "JobPreempted" for f in facts) and any(
                f["kind"] == "JobDispatched" and f["jobId"] == "b1" for f in facts)  # fmt: skip
            return facts if done else None

        early = await read_facts(bus.js)
        facts = await eventually(reclaimed, 20, what="a2 reclaimed once its protection ended")
    assert not any(f["kind"] == "JobPreempted" for f in early)  # b1 waited
    options = next(f for f in facts if f["kind"] == "QuotaShareOptionsSet")
    assert options["options"] == {"minRuntimeBeforePreemptionSeconds": 2, "preemptionBudget": None,
                                  "lendingLimits": None}
    a1 = next(f for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == "a1")
    a2 = next(f for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == "a2")
    preempted = next(f for f in facts if f["kind"] == "JobPreempted")
    b1 = next(f for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == "b1")
    assert a1["at"] < a2["at"] and a2["borrowed"]
    assert preempted["jobId"] == "a1" and b1["afterPreemptionOf"] == ["a1"]
    assert preempted["at"] == b1["at"] == a1["at"] + 2  # the timer's moment, exactly
    b1_submitted = next(f for f in facts if f["kind"] == "JobSubmitted" and f["jobId"] == "b1")
    assert b1_submitted["at"] < preempted["at"]
