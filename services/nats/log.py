"""Reading the command and fact logs in order: every service's way to read a stream back.

An ordered consumer (ephemeral, flow-controlled, resumes by itself after a gap) is the fastest
way to read a stream in order with nats-py; the stream sequence is read from the reply subject
when it has the plain v1 form, from the metadata otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from quotasched.events.subjects import COMMANDS_PREFIX, COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.nats.bus import last_sequence

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


def seq_and_data(seq: int, msg) -> tuple[int, bytes]:
    return seq, msg.data


async def read_log_chunks(js: JetStreamContext, subject: str = ALL_FACTS, start_seq: int = 1,
                          until_seq: int | None = None, chunk_size: int = 20_000,
                          keep: Callable[[int, Any], T] = seq_and_data,
                          stream: str = FACTS_STREAM) -> AsyncIterator[list[T]]:  # fmt: skip
    """The log from `start_seq` to its end as of the call (or `until_seq`), in order, as
    lists of up to `chunk_size` items, `keep(stream seq, message)` each ((stream seq, payload)
    unless told): for bulk readers (a projection rebuild, recovery) that handle many facts at
    once.  The subscription's callback appends to a list, so no queue put/get or generator
    step is paid per message (read_log's cost)."""
    end = until_seq if until_seq is not None else await last_sequence(js, subject, stream)
    if end < start_seq:
        return
    pending: list[T] = []
    ready = asyncio.Event()
    finished = False

    async def deliver(msg) -> None:
        nonlocal finished
        seq = stream_seq(msg)
        if finished or seq > end:
            return
        pending.append(keep(seq, msg))
        if seq >= end:
            finished = True
            ready.set()
        elif len(pending) >= chunk_size:
            ready.set()

    sub = await _ordered(js, subject, start_seq, deliver, stream)
    try:
        while True:
            await ready.wait()
            ready.clear()
            arrived = pending.copy()
            pending.clear()
            for start in range(0, len(arrived), chunk_size):  # more may arrive than asked
                yield arrived[start:start + chunk_size]
            if finished:  # nothing is appended after the end
                return
    finally:
        await sub.unsubscribe()


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
