"""Snapshots are fetched with direct gets (objects.fetch_object), not with nats-py's object-store
reader: the bytes, the checks and the errors must be nats-py's own.  nats-py's
`ObjectStore.get` reads every object here too, as the independent reference."""

from __future__ import annotations

import base64
import io
import json
import random

import pytest
from nats.js.api import ObjectMeta, ObjectMetaOptions
from nats.js.errors import DigestMismatchError, ObjectNotFoundError
from nats.js.object_store import OBJ_META_PRE_TEMPLATE

from quotasched.events.subjects import SNAPSHOTS_BUCKET
from quotasched.services.client import Bus
from quotasched.services.nats import objects
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.nats.objects import fetch_object
from quotasched.services.scheduler.log import load_snapshot
from quotasched.services.settings import Settings

pytestmark = pytest.mark.nats


async def put(store, name: str, payload: bytes, chunk: int) -> None:
    meta = ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=chunk))
    await store.put(name, payload, meta=meta)


async def nats_py_get(store, name: str) -> bytes:
    buffer = io.BytesIO()
    await store.get(name, writeinto=buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("size, chunk", [(0, 1024), (1, 1024), (1024, 1024), (1025, 1024),
                                         (3_000_001, 512 * 1024)])  # fmt: skip
async def test_an_object_is_fetched_byte_for_byte_as_nats_py_reads_it(nats_server, size, chunk):
    payload = random.Random(size).randbytes(size)
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        await put(store, "main", b"an older revision", chunk)
        await put(store, "main", payload, chunk)
        await put(store, "other", b"another object", chunk)
        fetched = (await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")).getvalue()
        assert fetched == payload == await nats_py_get(store, "main")


async def test_a_missing_or_deleted_object_is_not_found(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        with pytest.raises(ObjectNotFoundError):
            await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")
        await put(store, "main", b"x" * 5000, 1024)
        await store.delete("main")
        with pytest.raises(ObjectNotFoundError):
            await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")
        assert await load_snapshot(bus.js, "main") is None


async def test_an_object_whose_chunks_do_not_match_its_digest_is_refused(nats_server):
    """The description's digest rewritten: nats-py refuses the object, and so does the fetch;
    a scheduler then folds the whole log instead (load_snapshot gives None)."""
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        await put(store, "main", b"y" * 5000, 1024)
        subject = OBJ_META_PRE_TEMPLATE.format(
            bucket=SNAPSHOTS_BUCKET, obj=base64.urlsafe_b64encode(b"main").decode())
        meta = json.loads((await bus.js.get_last_msg(f"OBJ_{SNAPSHOTS_BUCKET}", subject)).data)
        wrong = base64.urlsafe_b64encode(bytes(32)).decode()
        meta["digest"] = f"SHA-256={wrong}"
        await bus.js.publish(subject, json.dumps(meta).encode(), headers={"Nats-Rollup": "sub"})
        with pytest.raises(DigestMismatchError):
            await nats_py_get(store, "main")
        with pytest.raises(DigestMismatchError):
            await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")
        assert await load_snapshot(bus.js, "main") is None


async def test_an_object_replaced_while_it_is_read_is_read_again_whole(nats_server, monkeypatch):
    """The writer stores a new snapshot while a standby reads the last one: nats-py's put
    purges the old chunks, so the read fails half way and starts again on the new revision."""
    old, new = b"o" * 10_000, b"n" * 7_000
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        await put(store, "main", old, 1024)
        get_msg, reads, replaced = bus.js.get_msg, [], []

        async def replaced_after_the_first_chunk(*args, **kwargs):
            if ".C." in (kwargs.get("subject") or ""):  # a chunk (nats-py's put reads too)
                reads.append(kwargs["subject"])
            if len(reads) == 2 and not replaced:
                replaced.append(True)
                await put(store, "main", new, 1024)
            return await get_msg(*args, **kwargs)

        monkeypatch.setattr(bus.js, "get_msg", replaced_after_the_first_chunk)
        assert (await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")).getvalue() == new
        assert len(set(reads)) == 2  # the old revision's chunks, then the new one's
        assert objects.FETCH_TRIES >= 2


async def test_an_object_whose_chunk_was_replaced_is_refused(nats_server):
    """A chunk purged and stored again with other bytes (same subject, same count): the
    digest no longer matches, for nats-py and for the fetch alike."""
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        store = await bus.js.object_store(SNAPSHOTS_BUCKET)
        await put(store, "main", b"z" * 3000, 1024)
        info = await store.get_info("main")
        stream, subject = f"OBJ_{SNAPSHOTS_BUCKET}", f"$O.{SNAPSHOTS_BUCKET}.C.{info.nuid}"
        first = await bus.js.get_msg(stream, seq=1, subject=subject, next=True, direct=True)
        await bus.js.delete_msg(stream, first.seq)
        await bus.js.publish(subject, b"Z" * 1024, stream=stream)
        with pytest.raises(DigestMismatchError):
            await nats_py_get(store, "main")
        with pytest.raises(DigestMismatchError):
            await fetch_object(bus.js, SNAPSHOTS_BUCKET, "main")
        assert await load_snapshot(bus.js, "main") is None
