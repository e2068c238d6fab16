"""The bulk log reader (`read_log_chunks`, `BulkRead`) against a real nats-server: it reads
below nats-py's message path, so it answers flow control, notices lost messages and silent
consumers itself.  Losses are made where the transport hands frames over (the reader's
frame handler), since a loopback server loses nothing on its own; each test checks the
read gives every message once, in order, with its headers, as nats-py's own reader does."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from quotasched.services.nats import log as log_module
from quotasched.services.nats.log import (
    BulkRead,
    LogReadStalled,
    header_value,
    read_log_chunks,
    read_messages,
)

pytestmark = [pytest.mark.nats]

STREAM = "BULK"
PAD = b"x" * 200


def keep_all(seq: int, headers: bytes | None, data: bytes) -> tuple[int, bytes | None, bytes]:
    return seq, headers, data


@pytest.fixture
async def js(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def fill(js, count: int, size: int = 200) -> list[int]:
    """`count` messages on bulk.<i % 3>, each with a Qm-Facts header; their sequences."""
    await js.add_stream(StreamConfig(name=STREAM, subjects=["bulk.>"]))
    acks = [js.publish(f"bulk.{i % 3}", b"%d:" % i + b"x" * size, stream=STREAM,
                       headers={"Nats-Msg-Id": f"m:{i}", "Qm-Facts": str(1 + i % 4)})
            for i in range(count)]  # fmt: skip
    return [ack.seq for ack in await asyncio.gather(*acks)]


async def read_all(js, subject: str = "bulk.>", start: int = 1, until: int | None = None,
                   chunk_size: int = 500) -> list[tuple[int, bytes | None, bytes]]:  # fmt: skip
    return [item async for chunk in read_log_chunks(js, subject, start, until, chunk_size,
                                                    keep=keep_all, stream=STREAM)
            for item in chunk]  # fmt: skip


async def nats_py_read(js, subject: str = "bulk.>") -> list[tuple[int, dict, bytes]]:
    return [(msg.metadata.sequence.stream, msg.headers, msg.data)
            async for msg in read_messages(js, subject, 1, stream=STREAM)]  # fmt: skip


def dropping(monkeypatch, should_drop) -> list[bytes]:
    """Frames for which `should_drop(reply, headers, data)` holds never reach the reader, as
    if lost on the way; returns the replies of those dropped."""
    dropped: list[bytes] = []
    original = BulkRead._on_frame

    def on_frame(self, subject, reply, headers, data):
        if should_drop(reply, headers, data):
            dropped.append(reply)
            return
        original(self, subject, reply, headers, data)

    monkeypatch.setattr(BulkRead, "_on_frame", on_frame)
    return dropped


def first_delivery_of(seq: int):
    """For `dropping`: the first delivery of stream sequence `seq` (a v1 ack subject), only."""
    pending = {seq}

    def should_drop(reply: bytes, _headers, _data) -> bool:
        if reply.startswith(b"$JS.ACK.") and int(reply.split(b".")[5]) in pending:
            pending.clear()
            return True
        return False

    return should_drop


def quick_heartbeats(monkeypatch, heartbeat_s: float = 0.5) -> None:
    monkeypatch.setattr(BulkRead, "HEARTBEAT_S", heartbeat_s)
    monkeypatch.setattr(BulkRead, "STALLED_S", 3 * heartbeat_s)


async def test_the_same_messages_and_headers_as_nats_py_reads(js):
    seqs = await fill(js, 2_000)
    read = await read_all(js)
    expected = await nats_py_read(js)
    assert [(seq, data) for seq, _, data in read] == [(seq, data) for seq, _, data in expected]
    assert [int(header_value(headers, b"Qm-Facts")) for _, headers, _ in read] == [
        int(headers["Qm-Facts"]) for _, headers, _ in expected]  # fmt: skip
    assert [seq for seq, _, _ in read] == seqs
    one = await read_all(js, "bulk.1")
    assert [seq for seq, _, _ in one] == seqs[1::3]
    assert [seq for seq, _, _ in await read_all(js, start=seqs[10], until=seqs[20])] == seqs[10:21]
    assert await read_all(js, start=seqs[-1] + 1) == []


async def test_a_slow_reader_answers_flow_control_and_gets_everything(js, monkeypatch):
    """16 MiB read in chunks with a pause after each: the server waits for flow control
    answers meanwhile; one unanswered would stall the read, and with no reset allowed that
    ends it (LogReadStalled)."""
    monkeypatch.setattr(BulkRead, "RESETS", 0)
    seqs = await fill(js, 4_000, size=4_000)
    got = []
    async for chunk in read_log_chunks(js, "bulk.>", 1, chunk_size=250, keep=keep_all,
                                       stream=STREAM):  # fmt: skip
        got += [seq for seq, _, _ in chunk]
        await asyncio.sleep(0.05)
    assert got == seqs


async def test_a_lost_message_makes_the_consumer_again_after_the_last_kept(js, monkeypatch):
    seqs = await fill(js, 1_500)
    dropped = dropping(monkeypatch, first_delivery_of(seqs[700]))
    read = await read_all(js)
    assert len(dropped) == 1
    assert [seq for seq, _, _ in read] == seqs


async def test_a_lost_last_message_is_noticed_from_the_heartbeat(js, monkeypatch):
    """Nothing follows the last message to show the gap: the heartbeat's Nats-Last-Consumer
    does, long before a stall would."""
    quick_heartbeats(monkeypatch)
    monkeypatch.setattr(BulkRead, "RESETS", 0)  # a stall would raise: the heartbeat must do
    seqs = await fill(js, 300)
    dropped = dropping(monkeypatch, first_delivery_of(seqs[-1]))
    assert [seq for seq, _, _ in await read_all(js)] == seqs
    assert len(dropped) == 1


async def test_a_consumer_deleted_under_the_reader_is_made_again(js, monkeypatch):
    quick_heartbeats(monkeypatch)
    seqs = await fill(js, 3_000)
    got = []
    reads = log_module.read_log_chunks(js, "bulk.>", 1, chunk_size=500, keep=keep_all,
                                       stream=STREAM)  # fmt: skip
    async for chunk in reads:
        got += [seq for seq, _, _ in chunk]
        if len(got) == 500:
            for name in await js.consumers_info(STREAM):
                await js.delete_consumer(STREAM, name.name)
    assert got == seqs


async def test_a_read_where_nothing_arrives_ends_with_a_clear_error(js, monkeypatch):
    quick_heartbeats(monkeypatch, 0.2)
    monkeypatch.setattr(BulkRead, "RESETS", 2)
    await fill(js, 50)
    dropping(monkeypatch, lambda *_: True)
    with pytest.raises(LogReadStalled, match=r"reading BULK \(bulk\.>\) from sequence 1"):
        await read_all(js)


def test_header_values_are_read_from_whole_lines_only():
    block = b"NATS/1.0\r\nX-Qm-Facts: 9\r\nQm-Facts:  3 \r\nNats-Msg-Id: a:1:0\r\n\r\n"
    assert header_value(block, b"Qm-Facts") == b"3"
    assert header_value(block, b"Nats-Msg-Id") == b"a:1:0"
    assert header_value(block, b"Facts") is None
    assert header_value(None, b"Qm-Facts") is None
