"""A flood of refused commands from one share writes every CommandRejected fact but a bounded
log (issue 29): a real nats-server and a real `quotasched scheduler`.

qs2 may have one queued job; it gets it, then 300 more submissions are each refused naming
maxQueuedJobs.  The fact log holds all 300 refusals; the scheduler's log holds at most 5
"command rejected" lines for the share in its 10 s window, and once the window has closed (on
the writer's timer: no other refusal comes), one "commands rejected" line whose counts add up
to the 300.  qs1's refusal, in the same window, has a line of its own."""

from __future__ import annotations

import asyncio

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import (
    NO_TICKS,
    eventually,
    logged,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
)
from tests.integration.test_admission_limits_live import limits, submit
from tests.integration.test_failover import wait_leading

pytestmark = pytest.mark.nats

QUEUE = "lq"  # the queue `submit` and `limits` name
FLOOD = 300
SHARES = [("qs1", 1, "RESERVE", "DISABLED"), ("qs2", 1, "RESERVE", "DISABLED")]


async def test_300_refusals_are_300_facts_and_a_bounded_log_whose_summary_counts_them_all(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler", **NO_TICKS)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=2))
        await bus.publish(limits("qs2", maxQueuedJobs=1))
        first = await bus.publish(submit("kept", "qs2"))  # qs2 is full from here on
        await wait_decided(bus.js, first, processes=[scheduler])
        seqs = await asyncio.gather(*(bus.publish(submit(f"flood-{i}", "qs2"))
                                      for i in range(FLOOD)))  # fmt: skip
        other = await bus.publish(submit("missing-share", "qs9"))  # no such share
        await wait_decided(bus.js, max(*seqs, other), processes=[scheduler])
        facts = await read_facts(bus.js)

        def summaries():
            return [line for line in logged(scheduler, "commands rejected")
                    if line.get("quota_share") == "qs2"]  # fmt: skip

        async def summed_up():
            return summaries() or None

        # the window closes 10 s after its first refusal; the writer's timer tells it
        await eventually(summed_up, 30, what='a "commands rejected" line for qs2')

    refused = [fact for fact in facts if fact["kind"] == "CommandRejected"
               and fact.get("quotaShareName") == "qs2"]  # fmt: skip
    assert sorted(fact["commandSeq"] for fact in refused) == sorted(seqs)  # every one, once
    assert all("maxQueuedJobs of 1" in fact["statusReason"] for fact in refused)

    full = [line for line in logged(scheduler, "command rejected")
            if line.get("quota_share") == "qs2"]  # fmt: skip
    [summary] = summaries()
    assert len(full) == 5  # one window (the flood takes well under its 10 s): five lines
    assert {line["stream_seq"] for line in full} <= set(seqs)
    assert summary["job_queue"] == QUEUE
    assert summary["refused"] == FLOOD
    assert summary["logged"] == len(full)
    assert summary["held_back"] == FLOOD - len(full)
    assert summary["reasons"] == {"maxQueuedJobs": FLOOD}
    assert (summary["first_stream_seq"], summary["last_stream_seq"]) == (min(seqs), max(seqs))
    assert summary["window_s"] == 10.0
    # another share's refusal in the same window is logged in full: each share has its budget
    [missing] = [line for line in logged(scheduler, "command rejected")
                 if line["stream_seq"] == other]  # fmt: skip
    assert missing["quota_share"] == "qs9" and missing["job_id"] == "missing-share"
    assert scheduler.stop() == 0
    assert len(summaries()) == 1  # told once: the end of the term had nothing left to tell
