"""Snapshots are stored with pipelined chunks (objects.store_object), not with nats-py's
`ObjectStore.put`: what lands must be what nats-py would have stored.  nats-py's own reader
(`ObjectStore.get`, `get_info`) checks every object here, as the independent reference, on a
real nats-server."""

from __future__ import annotations

import random

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NotFoundError
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE

from quotasched.events.subjects import SNAPSHOTS_BUCKET
from quotasched.services.client import Bus
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.nats.objects import fetch_object, store_object
from quotasched.services.settings import Settings
from tests.integration.test_snapshot_fetch import nats_py_get

pytestmark = pytest.mark.nats

STREAM = f"OBJ_{SNAPSHOTS_BUCKET}"


async def chunks_on(js, nuid: str) -> int:
    subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=SNAPSHOTS_BUCKET, obj=nuid)
    info = await js.stream_info(STREAM, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


@pytest.mark.parametrize("size, chunk", [(0, 1024), (1, 1024), (1023, 1024), (1024, 1024),
                                         (1025, 1024), (3 * 1024 + 5, 1024),
                                         (3_000_001, 512 * 1024)])  # fmt: skip
async def test_an_object_stored_reads_back_byte_for_byte_through_nats_py(nats_server, size, chunk):
    payload = random.Random(size).randbytes(size)
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        stored = await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", payload, chunk_size=chunk)
        info = await store.get_info("main")
        assert (info.size, info.chunks, info.digest, info.nuid) == \
            (size, -(-size // chunk), stored.digest, stored.nuid)
        assert info.options.max_chunk_size == chunk
        assert await chunks_on(bus.js, info.nuid) == info.chunks
        assert await nats_py_get(store, "main") == payload
        assert (await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")).getvalue() == payload


async def test_a_new_revision_replaces_the_old_one_and_purges_its_chunks(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        await store.put("other", b"another object, stored by nats-py")
        first = await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", b"a" * 5000, chunk_size=1024)
        assert await chunks_on(bus.js, first.nuid) == 5
        second = await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", b"b" * 2100, chunk_size=1024)
        assert second.nuid != first.nuid
        assert await chunks_on(bus.js, first.nuid) == 0
        assert await chunks_on(bus.js, second.nuid) == 3
        assert await nats_py_get(store, "main") == b"b" * 2100
        assert await nats_py_get(store, "other") == b"another object, stored by nats-py"
        # an object nats-py stored is replaced the same way
        await store.put("third", b"c" * 3000)
        older = await store.get_info("third")
        await store_object(bus.nc, SNAPSHOTS_BUCKET, "third", b"d" * 10, chunk_size=1024)
        assert await chunks_on(bus.js, older.nuid) == 0
        assert await nats_py_get(store, "third") == b"d" * 10


async def test_a_store_the_server_refuses_leaves_the_old_revision_and_no_new_chunk(nats_server):
    """The bucket's stream is given a byte limit (discarding new messages) that the new
    revision's chunks cross: the store raises the server's refusal, the object still reads as
    its old revision, and no chunk of the refused one is left behind."""
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        old = await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", b"o" * 3000, chunk_size=1024)
        config: StreamConfig = (await bus.js.stream_info(STREAM)).config
        used = (await bus.js.stream_info(STREAM)).state.bytes
        config.max_bytes = used + 4 * 1100  # room for about four more chunks
        await bus.js.update_stream(config)
        messages = (await bus.js.stream_info(STREAM)).state.messages
        with pytest.raises(APIError):
            await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", b"n" * 20_000, chunk_size=1024)
        assert (await store.get_info("main")).nuid == old.nuid
        assert await nats_py_get(store, "main") == b"o" * 3000
        assert (await bus.js.stream_info(STREAM)).state.messages == messages


async def test_an_object_named_nowhere_is_not_found_before_it_is_stored(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        with pytest.raises(NotFoundError):
            await store.get_info("main")
        await store_object(bus.nc, SNAPSHOTS_BUCKET, "main", b"first", chunk_size=1024)
        assert await nats_py_get(store, "main") == b"first"
