"""A full store stalls the scheduler loudly, loses nothing, and resumes by itself.

The nats-server runs with a small JetStream store (`max_file_store`): a filler stream takes
it all, so every write, the lease's included, is refused with 10023 "insufficient resources",
as on a disk that filled up.  Commands acknowledged before the store filled wait; the
scheduler logs "disk full", /healthz answers 503 and `quotasched_scheduler_storage_full` is 1.
Once the filler is deleted (space is back) the scheduler takes the lease again by itself,
decides every stored command, and /healthz answers 200.  Before the fix it retried in
silence (or logged "wrong last sequence", which reads like a second writer) and /healthz
stayed 200.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from services.client import Bus
from services.embedded import EmbeddedServer, free_port
from tests.integration.helpers import (
    NO_TICKS,
    assert_decided_once,
    eventually,
    logged,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
)
from tests.integration.test_failover import wait_leading
from tests.integration.test_metrics import get  # raises OSError until the endpoint listens
from tests.reliability.test_oversize_fact import submission

pytestmark = [pytest.mark.nats, pytest.mark.slow]

STORE_LIMIT = 8 * 1024 * 1024
FILLER = "FILLER"


async def fill_store(js) -> int:
    """Publish to a filler stream until the server refuses for lack of storage; its code."""
    await js.add_stream(StreamConfig(name=FILLER, subjects=["filler.>"]))
    chunk = b"\0" * (512 * 1024)
    for _ in range(4 * STORE_LIMIT // len(chunk)):
        try:
            await js.publish("filler.x", chunk, stream=FILLER, timeout=5)
        except APIError as error:
            return error.err_code
    raise AssertionError("the store never filled")


async def test_full_store_is_reported_and_every_acknowledged_command_decided(tmp_path, spawn):
    conf = tmp_path / "small-store.conf"
    conf.write_text(f"jetstream {{ max_file_store: {STORE_LIMIT} }}\n")
    server = EmbeddedServer(tmp_path / "store", extra_args=["-c", str(conf)]).start()
    port = free_port()
    env = {"QUOTASCHED_NATS_URL": server.url, "QUOTASCHED_METRICS_PORT": str(port), **NO_TICKS}
    health = f"http://127.0.0.1:{port}/healthz"
    try:
        first = spawn("scheduler", **env)
        async with Bus(server.url) as bus:
            await wait_leading(first)
            setup = await publish_items(bus, setup_commands("fq"))
            await wait_decided(bus.js, setup[-1], processes=[first])
            first.stop()
            # acknowledged while no scheduler runs, then the store fills up
            waiting = await publish_items(bus, [(submission(f"job-{i}"), None) for i in range(5)])
            assert await fill_store(bus.js) == 10023
            scheduler = spawn("scheduler", **env)

            async def unhealthy():
                status, body = await asyncio.to_thread(get, health)
                return (status, json.loads(body)) if status == 503 else None

            status, document = await eventually(unhealthy, 60, what="/healthz 503")
            assert document["scheduler"]["storage"] == "full", document
            assert "disk full" in document["scheduler"]["storageError"]
            _, metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
            assert "quotasched_scheduler_storage_full 1.0" in metrics
            errors = logged(scheduler, "disk full: the fact log cannot store the scheduler's "
                                       "facts; commands wait, nothing acknowledged is lost")
            assert errors and errors[0]["level"] == "error", scheduler.output()[-2000:]
            assert "10023" in errors[0]["cause"]

            await bus.js.delete_stream(FILLER)  # space is back
            await wait_decided(bus.js, waiting[-1], timeout=60, processes=[scheduler])

            async def healthy():
                status, _ = await asyncio.to_thread(get, health)
                return status == 200

            await eventually(healthy, 30, what="/healthz 200")
            facts = await read_facts(bus.js)
        scheduler.stop()
    finally:
        server.stop()
    decided = {fact["commandSeq"] for fact in facts if fact["kind"] == "JobSubmitted"}
    assert set(waiting) <= decided, f"acknowledged commands not decided: {set(waiting) - decided}"
    assert_decided_once(facts)
    assert logged(scheduler, "disk space back: facts are stored again")
