"""A job queue's options beyond AWS (SetJobQueueOptions) in the live service: a real
nats-server and `quotasched scheduler`, and the permissions `quotasched auth generate` gives.

Fair share, decided live.  Expected by hand: se holds 3; a and b (LEND_AND_BORROW 1) and c
(LEND 1).  The admin turns on FAIR_SHARE (half-life 30 days: no halving within the test, short
of crossing a 30-day boundary of the epoch) before any job, so every share's charge starts at
0 then.  a1 and b1 run on their own quota, a2 borrows c's idle instance: 3 of 3 in use, and a
accrues 1 instance-s per second while a2 runs.  a3 (a's head) and then b2 (b's head) wait to
borrow.  When a2 ends, its instance is idle again and both heads would borrow it: a has
borrowed (a2's end - a2's dispatch) instance-s > 0, b nothing, so b2 is dispatched, borrowing
1, in the very command that ended a2, though a3 came first (AWS's FIFO would take a3).  a3
waits on.  `quotasched explain`'s reading of the live log says so with the same numbers.

SetJobQueueOptions travels on qm.cmd.<queue>.~.SetJobQueueOptions, which only the admin may
publish: a team's credentials are refused by the server, on that subject and on its own share's
token alike.
"""

from __future__ import annotations

import json

import pytest

from quotasched.events.subjects import command_subject
from quotasched.services.client import Bus
from quotasched.services.explain import story_of
from quotasched.services.explain.queue_options import amount
from quotasched.services.nats.log import ALL_FACTS, read_log
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.test_permissions import Client, generated, secured  # noqa: F401 (fixtures)

pytestmark = pytest.mark.nats

QUEUE = "fsq"
HALF_LIFE = 2592000
OPTIONS = {"idleResourceAssignmentStrategy": "FAIR_SHARE", "fairShare": {"halfLifeSeconds": HALF_LIFE}}


def submit(job_id: str, share: str) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


def one(facts: list[dict], kind: str, job_id: str) -> dict:
    found = [fact for fact in facts if fact["kind"] == kind and fact.get("jobId") == job_id]
    assert len(found) == 1, (kind, job_id, found)
    return found[0]


async def test_fair_share_gives_the_freed_instance_to_the_share_that_borrowed_less(nats_server, spawn):
    scheduler = spawn("scheduler", QUOTASCHED_TICK_INTERVAL_S="100000")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=[
            ("a", 1, "LEND_AND_BORROW", "DISABLED"), ("b", 1, "LEND_AND_BORROW", "DISABLED"),
            ("c", 1, "LEND", "DISABLED")], capacity=3))  # fmt: skip
        await bus.publish({"kind": "SetJobQueueOptions", "jobQueue": QUEUE, "optionsVersion": 1,
                           "options": OPTIONS})  # fmt: skip
        for job_id, share in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a"), ("b2", "b")):
            await bus.publish(submit(job_id, share))

        async def submitted():
            facts = await read_facts(bus.js)
            return facts if any(f["kind"] == "JobSubmitted" and f["jobId"] == "b2" for f in facts) else None

        waiting = await eventually(submitted, 20, what="b2 decided")
        await bus.publish({"kind": "ReportJobStatus", "jobId": "a2", "attempt": 1, "status": "SUCCEEDED"},
                          route=(QUEUE, "a"))  # fmt: skip

        async def freed():
            facts = await read_facts(bus.js)
            return facts if any(f["kind"] == "JobDispatched" and f["jobId"] == "b2" for f in facts) else None

        facts = await eventually(freed, 20, what="the freed instance dispatched")
        texts = [data async for _, data, _ in read_log(bus.js, ALL_FACTS)]

    dispatched = {f["jobId"] for f in waiting if f["kind"] == "JobDispatched"}
    assert dispatched == {"a1", "b1", "a2"}  # a3 and b2 wait: 3 of 3 in use
    stored = next(f for f in facts if f["kind"] == "JobQueueOptionsSet")
    assert stored["_subject"] == f"qm.fact.{QUEUE}.~.JobQueueOptionsSet"
    assert stored["options"]["fairShare"] == {"halfLifeSeconds": HALF_LIFE, "weights": None}
    a2, ended = one(facts, "JobDispatched", "a2"), one(facts, "JobStatusChanged", "a2")
    b2 = one(facts, "JobDispatched", "b2")
    assert a2["borrowed"] == [{"capacityUnit": G5, "quantity": 1}]
    assert one(facts, "JobSubmitted", "a3")["_seq"] < one(facts, "JobSubmitted", "b2")["_seq"]
    assert b2["commandSeq"] == ended["commandSeq"] and b2["at"] == ended["at"]
    assert b2["borrowed"] == [{"capacityUnit": G5, "quantity": 1}]
    assert not any(f["kind"] == "JobDispatched" and f["jobId"] == "a3" for f in facts)

    # explain, over the live log: a3 was passed over, with a's charge as the facts give it.
    charge = ended["at"] - a2["at"]
    assert charge > 0
    told = [entry.sentence for entry in story_of("a3", texts) if entry.command_seq == ended["commandSeq"]]
    assert told[0] == (
        "a3 waits (RUNNABLE): b2 of b, also waiting to borrow, was dispatched ahead of it (first "
        "come, first served would have served it first); borrowers are served in the order of "
        "the queue's options beyond AWS: b2 of b, then a3 of a; idle capacity goes by fair share "
        f"(half-life {HALF_LIFE} s), the least decayed borrowing per weight first: share b's "
        "decayed borrowing 0 instance-s / weight 1 = 0, share a's decayed borrowing "
        f"{amount(charge)} instance-s / weight 1 = {amount(charge)}.")


async def test_only_the_admin_may_publish_queue_options(secured):
    """The admin's publish passes; a team's, on the queue's subject or its own share's token,
    is refused by the server (a "Permissions Violation" naming the subject)."""
    server, creds = secured
    body = json.dumps({"kind": "SetJobQueueOptions", "jobQueue": "q", "options": OPTIONS}).encode()
    subject = command_subject("SetJobQueueOptions", "q")
    assert subject == "qm.cmd.q.~.SetJobQueueOptions"
    async with Client(creds["admin"]) as admin:
        await admin.nc.publish(subject, body)
        await admin.nc.flush()
        assert not admin.errors
    async with Client(creds["pipeline-q-qs1"]) as team:
        await team.refused_publish(subject, body)
        await team.refused_publish(command_subject("SetJobQueueOptions", "q", "qs1"), body)
