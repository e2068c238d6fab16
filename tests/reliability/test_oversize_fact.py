"""A command whose facts the bus cannot carry must not wedge the scheduler's writer.

The server runs with a small `max_payload`: a submission just under it is accepted into the
command stream, but its JobSubmitted fact (the command's fields and a little more, plus the
fact's headers) is over it.  Before the fix the writer's append failed, it stepped down and
decided the same command again, forever, and every later command waited.  Now the command is
recorded as a CommandRejected naming the limit, the next command (a canary) is decided, and
`audit verify` still agrees with the log (it re-runs such a command as the same refusal).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from quotasched.services.audit.live import verify_bus
from quotasched.services.client import Bus
from quotasched.services.nats.embedded import EmbeddedServer
from quotasched.services.scheduler.refusals import LOG_REFUSAL
from tests.integration.helpers import (
    G5,
    NO_TICKS,
    assert_decided_once,
    logged,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
)
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats]


def submission(job_id: str, tags: int = 0) -> dict:
    """A SubmitServiceJob within every documented field limit (at most 50 tags, keys of 128
    characters, values of 256), `tags` of them at their longest."""
    command = {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "fq",
               "quotaShareName": "alpha", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}
    if tags:
        command["tags"] = {f"k{i:03d}".ljust(128, "x"): "v" * 256 for i in range(tags)}
    return command


async def test_oversize_fact_is_refused_and_a_canary_after_it_is_decided(tmp_path, spawn):
    big = submission("too-big", tags=40)
    size = len(json.dumps(big).encode())
    # room for the command itself, not for its fact (the fact repeats it and adds fields)
    conf = tmp_path / "small-payload.conf"
    conf.write_text(f"max_payload: {size + 200}\n")
    server = EmbeddedServer(tmp_path / "small", extra_args=["-c", str(conf)]).start()
    try:
        scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=server.url, **NO_TICKS)
        async with Bus(server.url) as bus:
            assert bus.nc.max_payload == size + 200
            await wait_leading(scheduler)
            items = [*setup_commands("fq"), (big, None), (submission("canary"), None)]
            seqs = await publish_items(bus, items)
            await wait_decided(bus.js, seqs[-1], timeout=60, processes=[scheduler])
            facts = await read_facts(bus.js)
        results = await asyncio.to_thread(verify_bus, server.url)
        scheduler.stop()
    finally:
        server.stop()
    refused = [fact for fact in facts if fact["commandSeq"] == seqs[-2]]
    assert [fact["kind"] for fact in refused] == ["CommandRejected"], refused
    reason = refused[0]["statusReason"]
    assert reason.startswith(LOG_REFUSAL) and f"max_payload {size + 200}" in reason, reason
    canary = [fact["kind"] for fact in facts if fact["commandSeq"] == seqs[-1]]
    assert canary[0] == "JobSubmitted", canary
    assert_decided_once(facts)
    errors = logged(scheduler, "command refused by the fact log: it will be recorded as "
                               "CommandRejected and the scheduler moves on")  # fmt: skip
    assert errors and errors[0]["level"] == "error" and errors[0]["stream_seq"] == seqs[-2]
    assert [result.ok for result in results] == [True], [r.divergence for r in results]
    assert sum(result.log_refused for result in results) == 1
