"""Admission limits (docs/options.md, "Admission limits") in the live service: a real
nats-server and a real `quotasched scheduler`, the limits set with SetQuotaShareOptions.

qs2 may have at most 10 queued jobs and 5 accepted submissions per second.  No executor runs,
so no job ever ends: a job once accepted counts against maxQueuedJobs for the whole test.
The expected outcome of each submission is worked out here from the rule alone, in stream
order, with the second of each command taken from the command stream's own timestamp (the
`at` of its JobSubmitted when accepted): a submission is refused while the share already has
10 accepted jobs, or 5 accepted in the same whole second; otherwise it is accepted.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import (
    G5,
    NO_TICKS,
    eventually,
    publish_items,
    read_facts,
    setup_commands,
    stream_times,
    wait_decided,
)
from tests.integration.test_aws_endpoint_auth import first_line
from tests.integration.test_failover import wait_leading

pytestmark = pytest.mark.nats

QUEUE = "lq"
MOST_QUEUED, MOST_PER_SECOND = 10, 5
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}})
SHARES = [("qs1", 1, "RESERVE", "DISABLED"), ("qs2", 1, "RESERVE", "DISABLED")]


def submit(job_id: str, share: str) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


def limits(share: str, **options: int) -> dict:
    return {"kind": "SetQuotaShareOptions", "jobQueue": QUEUE, "quotaShareName": share,
            "options": options}


def decisions(facts: list[dict], share: str) -> list[dict]:
    """The share's submissions as decided, in stream order: JobSubmitted or CommandRejected."""
    return sorted((fact for fact in facts
                   if fact.get("quotaShareName") == share
                   and (fact["kind"] == "JobSubmitted"
                        or (fact["kind"] == "CommandRejected"
                            and fact.get("commandKind") == "SubmitServiceJob"))),
                  key=lambda fact: fact["commandSeq"])  # fmt: skip


def expected(stamps: list[float]) -> list[set[str]]:
    """Per submission (in stream order, at these stream timestamps), what the rule allows:
    {"accepted"}, or the names of the limits it is over (a refusal must name one of them)."""
    accepted_in_second: Counter[int] = Counter()
    accepted = 0
    allowed = []
    for stamp in stamps:
        second = math.floor(stamp)
        over = set()
        if accepted >= MOST_QUEUED:
            over.add("maxQueuedJobs")
        if accepted_in_second[second] >= MOST_PER_SECOND:
            over.add("maxSubmissionsPerSecond")
        if not over:
            accepted += 1
            accepted_in_second[second] += 1
        allowed.append(over or {"accepted"})
    return allowed


def said(fact: dict) -> str:
    """"accepted", or the limit a refusal names (its `... <limit> of <n>`)."""
    if fact["kind"] == "JobSubmitted":
        return "accepted"
    reason = fact["statusReason"]
    for name, most in (("maxQueuedJobs", MOST_QUEUED), ("maxSubmissionsPerSecond", MOST_PER_SECOND)):
        if f"{name} of {most}" in reason:
            return name
    return reason  # anything else is wrong


async def test_a_flood_from_one_share_is_refused_at_its_limits_while_another_shares_job_runs(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler", **NO_TICKS)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=2))
        await bus.publish(limits("qs2", maxQueuedJobs=MOST_QUEUED,
                                 maxSubmissionsPerSecond=MOST_PER_SECOND))  # fmt: skip
        # Wave 1: 50 of qs2 and, in the middle, one of qs1, all published at once.
        wave = [submit(f"flood-{i}", "qs2") for i in range(50)]
        wave.insert(25, submit("steady", "qs1"))
        seqs = list(await asyncio.gather(*(bus.publish(command) for command in wave)))
        # Wave 2, in a later second than all of wave 1 (each ack comes after its message is
        # stored): the per-second count starts again but the queued jobs stay.
        await asyncio.sleep(1.1)
        seqs += await asyncio.gather(*(bus.publish(submit(f"again-{i}", "qs2"))
                                       for i in range(20)))  # fmt: skip
        # Wave 3, in a later second again: under the per-second limit, refused as full only.
        await asyncio.sleep(1.1)
        seqs += await asyncio.gather(*(bus.publish(submit(f"full-{i}", "qs2"))
                                       for i in range(3)))  # fmt: skip
        await wait_decided(bus.js, max(seqs), processes=[scheduler])

        async def steady_dispatched():
            facts = await read_facts(bus.js)
            return facts if any(f["kind"] == "JobDispatched" and f["jobId"] == "steady"
                                for f in facts) else None  # fmt: skip

        facts = await eventually(steady_dispatched, 20, what="qs1's job dispatched")
        decided = decisions(facts, "qs2")
        stamps = await stream_times(bus.js, [fact["commandSeq"] for fact in decided])

    assert len(decided) == 73  # each submission decided once
    # An accepted submission's `at` is its command's stream timestamp; a refused one moved no
    # clock, so its CommandRejected is stamped with the clock as it stood (ruling 15), never
    # later than the command: the second a command counts in is its stream timestamp's.
    for fact, stamp in zip(decided, stamps):
        assert fact["at"] == stamp if fact["kind"] == "JobSubmitted" else fact["at"] <= stamp
    allowed = expected(stamps)
    outcomes = [said(fact) for fact in decided]
    wrong = [(fact["jobId"], fact["at"], outcome, allow)
             for fact, outcome, allow in zip(decided, outcomes, allowed)
             if outcome not in allow]  # fmt: skip
    assert wrong == []
    assert outcomes.count("accepted") == sum(allow == {"accepted"} for allow in allowed)
    assert outcomes.count("accepted") == MOST_QUEUED  # two seconds at least: 5 + 5, then full
    # wave 1 (50 in at most a few seconds) passes the per-second limit; wave 3 finds the
    # share full and names that limit alone
    assert "maxSubmissionsPerSecond" in outcomes[:50]
    assert outcomes[-3:] == ["maxQueuedJobs"] * 3
    refused = [fact for fact in decided if fact["kind"] == "CommandRejected"]
    assert all(fact["raw"] is None for fact in refused)  # no copy of a refused message kept
    steady = [fact for fact in facts if fact.get("jobId") == "steady"]
    assert [fact["kind"] for fact in steady][:2] == ["JobSubmitted", "JobDispatched"]
    assert not any(fact["kind"] == "CommandRejected" for fact in steady)
    options = next(f for f in facts if f["kind"] == "QuotaShareOptionsSet")
    assert options["options"]["maxQueuedJobs"] == MOST_QUEUED
    assert options["options"]["maxSubmissionsPerSecond"] == MOST_PER_SECOND


async def test_a_submission_over_a_limit_through_the_aws_endpoint_is_a_client_exception(
        nats_server, spawn):  # fmt: skip
    import boto3
    from botocore.exceptions import ClientError

    scheduler = spawn("scheduler", **NO_TICKS)
    endpoint = spawn("endpoint", "--nats-url", nats_server.url)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=2))
        seq = await bus.publish(limits("qs2", maxQueuedJobs=2))
        await wait_decided(bus.js, seq, processes=[scheduler])
    url = first_line(endpoint, "AWS_ENDPOINT_URL_BATCH=")
    batch = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                         aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy")  # fmt: skip

    def submit_to(share: str, name: str) -> dict:
        return batch.submit_service_job(jobName=name, jobQueue=QUEUE, quotaShareName=share,
                                        serviceJobType="SAGEMAKER_TRAINING",
                                        serviceRequestPayload=PAYLOAD)

    first, second = submit_to("qs2", "a"), submit_to("qs2", "b")
    with pytest.raises(ClientError) as refused:
        submit_to("qs2", "c")
    error = refused.value.response["Error"]
    assert error["Code"] == "ClientException"
    assert error["Message"] == ("Quota share qs2 has 2 queued jobs, its limit maxQueuedJobs of 2; "
                                "submit again when some have ended")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert submit_to("qs1", "other")["jobName"] == "other"  # another share is not affected
    listed = batch.list_service_jobs(jobQueue=QUEUE, filters=[{"name": "JOB_NAME", "values": ["*"]}])
    assert sorted(job["jobName"] for job in listed["jobSummaryList"]) == ["a", "b", "other"]
    assert {first["jobName"], second["jobName"]} == {"a", "b"}
