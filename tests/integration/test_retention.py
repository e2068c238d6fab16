"""Issue 29: the store is never compacted by eviction.

The streams refuse new messages when a size cap is reached (the scheduler's "disk full"),
an age limit is refused at start, and a scheduler refuses in one line to start on a fact log
whose first facts are gone, instead of folding the rest and failing on every try.
"""

from __future__ import annotations

import pytest
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.nats.bus import DISK_FULL, connect, ensure_streams, refusal_cause
from quotasched.services.client import Bus
from quotasched.services.settings import Settings, StreamOptions
from tests.integration.helpers import NOTEBOOK, api_ready, wait_decided

pytestmark = pytest.mark.nats


async def test_a_size_capped_fact_log_refuses_new_facts_and_keeps_its_first_ones(nats_server):
    nc = await connect(nats_server.url, "test")
    js = nc.jetstream()
    # declared as an older release did: evicting the oldest messages
    await js.add_stream(StreamConfig(name=FACTS_STREAM, subjects=["qm.fact.>"],
                                     discard=DiscardPolicy.OLD, max_bytes=64 * 1024))  # fmt: skip
    await ensure_streams(js, Settings(streams=StreamOptions(max_bytes=64 * 1024)))
    for stream in (COMMANDS_STREAM, FACTS_STREAM):
        assert (await js.stream_info(stream)).config.discard == DiscardPolicy.NEW, stream
    refusal = None
    for index in range(64):  # 256 KiB offered to a 64 KiB stream
        try:
            await js.publish("qm.fact.~.~", b"x" * 4096, stream=FACTS_STREAM)
        except APIError as error:
            refusal = error
            break
    assert refusal is not None, "a full stream took every message"
    assert refusal_cause(refusal.err_code or 0, refusal.description or "", refusal.code or 0) == DISK_FULL
    assert (await js.stream_info(FACTS_STREAM)).state.first_seq == 1
    await nc.close()


def test_an_age_limit_on_the_streams_is_refused_at_start_in_one_line(nats_server, spawn):
    scheduler = spawn("scheduler", QUOTASCHED_STREAM_MAX_AGE_S="86400")
    assert scheduler.popen.wait(60) == 2
    lines = scheduler.output().strip().splitlines()
    assert len(lines) == 1 and "QUOTASCHED_STREAM_MAX_AGE_S=86400 would evict" in lines[0], lines


async def test_a_scheduler_refuses_to_start_on_a_fact_log_whose_first_facts_were_purged(
    nats_server, spawn
):
    first = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        last = 0
        for line in [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]:
            last = await bus.publish(line)
        await wait_decided(bus.js, last, processes=[first])
        assert first.stop() == 0
        end = (await bus.js.stream_info(FACTS_STREAM)).state.last_seq
        await bus.js.purge_stream(FACTS_STREAM, keep=2)  # the configuration's first facts go

        again = spawn("scheduler")
        status = again.popen.wait(60)
    lines = again.output().strip().splitlines()
    assert status != 0, again.output()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"quotasched scheduler: the fact log {FACTS_STREAM} begins at "
                               f"sequence {end - 1}: "), lines  # fmt: skip
    assert "restore" in lines[0]
