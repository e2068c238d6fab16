"""Reading the command and fact logs in order: every service's way to read a stream back.

An ordered consumer (ephemeral, flow-controlled, resumes by itself after a gap) is the fastest
way to read a stream in order with nats-py; the stream sequence is read from the reply subject
when it has the plain v1 form, from the metadata otherwise.  Bulk readers (recovery, a
projection's catch-up) read a bounded range the same way but below nats-py's message path
(`read_log_chunks`, `BulkRead`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from quotasched.events.subjects import COMMANDS_PREFIX, COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.nats import natsfix
from quotasched.services.nats.natsfix import header_value
from quotasched.services.nats.bus import last_sequence
from quotasched.services.nats.waits import wait_set

ALL_FACTS = "qm.fact.>"
T = TypeVar("T")


def sequence_and_time(msg) -> tuple[int, float]:
    """Stream sequence and timestamp (seconds) of a command, from the v1 ack subject
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts ns>.<pending>` when it has
    that form (parsing it is 4x cheaper than `msg.metadata`, and keeps the nanoseconds)."""
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9 and tokens[0] == "$JS":
        return int(tokens[5]), int(tokens[7]) / 1e9
    metadata = msg.metadata
    return metadata.sequence.stream, metadata.timestamp.timestamp()


def stream_seq(msg) -> int:
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9 and tokens[0] == "$JS":
        return int(tokens[5])
    return msg.metadata.sequence.stream


async def read_messages(js: JetStreamContext, subject: str = ALL_FACTS, start_seq: int = 1,
                        until_seq: int | None = None, follow: bool = False,
                        stream: str = FACTS_STREAM) -> AsyncIterator:  # fmt: skip
    """Every fact message from `start_seq`, in log order; stops at the log's end as of the
    call (or `until_seq`) unless `follow`."""
    end = until_seq if until_seq is not None else await last_sequence(js, subject, stream)
    if end < start_seq and not follow:
        return
    inbox: asyncio.Queue = asyncio.Queue(maxsize=100_000)

    async def deliver(msg) -> None:
        await inbox.put(msg)

    sub = await _ordered(js, subject, start_seq, deliver, stream)
    try:
        while True:
            msg = await inbox.get()
            yield msg
            if not follow and stream_seq(msg) >= end:
                return
    finally:
        await sub.unsubscribe()


async def read_log(js: JetStreamContext, subject: str = ALL_FACTS, start_seq: int = 1,
                   until_seq: int | None = None, follow: bool = False) -> AsyncIterator[tuple[int, bytes, str]]:  # fmt: skip
    """(stream seq, payload, subject) of every fact from `start_seq`, in log order."""
    async for msg in read_messages(js, subject, start_seq, until_seq, follow):
        yield stream_seq(msg), msg.data, msg.subject


def seq_and_data(seq: int, headers: bytes | None, data: bytes) -> tuple[int, bytes]:
    return seq, data


async def read_log_chunks(js: JetStreamContext, subject: str = ALL_FACTS, start_seq: int = 1,
                          until_seq: int | None = None, chunk_size: int = 20_000,
                          keep: Callable[[int, bytes | None, bytes], T] = seq_and_data,
                          stream: str = FACTS_STREAM) -> AsyncIterator[list[T]]:  # fmt: skip
    """The log from `start_seq` to its end as of the call (or `until_seq`), in order, as
    lists of up to `chunk_size` items, `keep(stream seq, raw header block, payload)` each
    ((stream seq, payload) unless told): for bulk readers (a projection rebuild, recovery)
    that handle many facts at once.  Read through a consumer of its own, below nats-py's
    message path (`BulkRead`): 4.6 µs a fact against 9.7 µs through an ordered consumer's
    callback (200k facts with four headers each, 2026-12-05, this 2-core machine)."""
    end = until_seq if until_seq is not None else await last_sequence(js, subject, stream)
    if end < start_seq:
        return
    read = BulkRead(js, stream, subject, end, chunk_size, keep)
    try:
        await read.start(start_seq)
        while chunk := await read.next_chunk():
            yield chunk
    finally:
        await read.stop()


class LogReadStalled(RuntimeError):
    """A bulk read kept no message for STALLED_S, RESETS + 1 times in a row."""


class BulkRead:
    """One bounded read of a stream in order, as an ordered consumer reads it (ephemeral,
    server-named, memory-stored, flow-controlled push consumer with idle heartbeats, made again
    from the next sequence after a gap or a silence), but each message handed to `keep` where
    nats-py's parser finds it (`natsfix.raw_subscribe`).  Flow control is answered as soon as
    its request is read: every message before it has been kept by then."""

    HEARTBEAT_S = 5.0
    STALLED_S = 3 * HEARTBEAT_S  # no message kept for this long: make the consumer again
    RESETS = 5  # ... at most this many times in a row

    def __init__(self, js: JetStreamContext, stream: str, subject: str, end: int, chunk_size: int,
                 keep: Callable[[int, bytes | None, bytes], Any]):  # fmt: skip
        self.js, self.nc = js, js._nc
        self.stream, self.subject, self.end = stream, subject, end
        self.chunk_size, self.keep = chunk_size, keep
        self.pending: list = []
        self.ready = asyncio.Event()
        self.next_seq = 0  # the first stream sequence not yet kept
        self.delivered = 0  # the consumer's sequence of the last message kept
        self.finished = False
        self.reset = False  # a gap or a status that ends the consumer: make it again
        self.sub = None
        self.answers = natsfix.ControlAnswers(self.nc, self._unanswered)

    async def start(self, start_seq: int) -> None:
        self.next_seq, self.delivered, self.reset = start_seq, 0, False
        inbox = self.nc.new_inbox()
        self.sub = await natsfix.raw_subscribe(self.nc, inbox, self._on_frame)
        config = ConsumerConfig(deliver_subject=inbox, opt_start_seq=start_seq,
                                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                ack_policy=AckPolicy.NONE, max_deliver=1,
                                flow_control=True, idle_heartbeat=self.HEARTBEAT_S,
                                mem_storage=True, num_replicas=1,
                                filter_subject=None if self.subject == ">" else self.subject)  # fmt: skip
        await self.js.add_consumer(self.stream, config)

    async def stop(self) -> None:
        """Unsubscribe; the server removes the ephemeral consumer once it has no interest."""
        sub, self.sub = self.sub, None
        if sub is not None:
            with suppress(Exception):  # a closed connection: nothing to unsubscribe
                await sub.unsubscribe()
        self.answers.cancel()

    async def next_chunk(self) -> list:
        """Up to chunk_size kept items, in order; [] after the end.  A consumer that keeps
        nothing for STALLED_S (heartbeats alone are no progress: a flow control answer lost
        leaves the consumer stalled but beating) is made again, RESETS times in a row at most."""
        last_seq, since, stalls = self.next_seq, time.monotonic(), 0
        while len(self.pending) < self.chunk_size and not self.finished:
            if self.reset:
                await self.stop()
                await self.start(self.next_seq)
                continue  # what arrived meanwhile may be all that was wanted
            self.ready.clear()
            await wait_set(self.ready, self.STALLED_S)
            now = time.monotonic()
            if self.next_seq != last_seq:
                last_seq, since, stalls = self.next_seq, now, 0
            elif now - since >= self.STALLED_S and not (self.reset or self.finished):
                stalls += 1
                if stalls > self.RESETS:
                    raise LogReadStalled(f"reading {self.stream} ({self.subject}) from sequence "
                                         f"{self.next_seq}: no message arrived in "
                                         f"{self.STALLED_S * stalls:g} s")  # fmt: skip
                self.reset, since = True, now
        chunk, self.pending = self.pending[:self.chunk_size], self.pending[self.chunk_size:]
        return chunk

    def _on_frame(self, subject: bytes, reply: bytes, headers: bytes | None, data: bytes) -> None:
        if self.reset or self.finished:
            return  # what the old consumer still sends after a gap, or after the end
        if reply.startswith(b"$JS.ACK."):
            tokens = reply.split(b".")
            if len(tokens) == 9:
                seq, delivered = int(tokens[5]), int(tokens[6])
            else:  # v2: $JS.ACK.<domain>.<account>.<stream>.<consumer>.<n>.<sseq>.<dseq>...
                seq, delivered = int(tokens[7]), int(tokens[8])
            if delivered != self.delivered + 1:  # lost on the way: start over after the last kept
                self.reset = True
                self.ready.set()
                return
            self.delivered = delivered
            if seq <= self.end:
                self.pending.append(self.keep(seq, headers, data))
                self.next_seq = seq + 1
            if seq >= self.end:
                self.finished = True
                self.ready.set()
            elif len(self.pending) >= self.chunk_size:
                self.ready.set()
            return
        self._on_status(reply, headers or b"")

    def _on_status(self, reply: bytes, headers: bytes) -> None:
        """Flow control and heartbeats are answered (`ControlAnswers`); a heartbeat that
        says more was sent than arrived, or any other status (409 consumer deleted,
        leadership changed, ...), makes the consumer again."""
        if self.answers.alive(reply, headers):
            last = header_value(headers, b"Nats-Last-Consumer")  # a heartbeat says what it sent
            if last is not None and int(last) > self.delivered:  # lost at the end: start over
                self.reset = True
        else:
            self.reset = True
        self.ready.set()

    def _unanswered(self) -> None:
        """A flow control answer that could not be sent leaves the consumer waiting for it:
        make it again (a closed connection ends the read where it waits)."""
        self.reset = True
        self.ready.set()


async def _ordered(js: JetStreamContext, subject: str, start_seq: int, deliver, stream: str):
    """An ordered consumer on `subject` from `start_seq`, `deliver` called per message."""
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
    return await js.subscribe(subject, cb=deliver, ordered_consumer=True, config=config,
                              stream=stream, pending_msgs_limit=200_000)  # fmt: skip


async def read_commands(js: JetStreamContext, start_seq: int = 1) -> list[tuple[int, str, bytes, float]]:
    """Every command of QM_COMMANDS from `start_seq`, as the scheduler saw it: (stream seq,
    subject, data, stamp), the stamp from `sequence_and_time`."""
    out = []
    async for msg in read_messages(js, f"{COMMANDS_PREFIX}.>", start_seq, stream=COMMANDS_STREAM):
        seq, stamp = sequence_and_time(msg)
        out.append((seq, msg.subject, msg.data, stamp))
    return out
