"""Reading the fact log back: recovery of the scheduler's state and `quotasched facts`.

An ordered consumer (ephemeral, flow-controlled, resumes by itself after a gap) is the fastest
way to read a stream in order with nats-py; the stream sequence is read from the reply subject
when it has the plain v1 form, from the metadata otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import pickle
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, ObjectMeta, ObjectMetaOptions
from nats.js.errors import ObjectNotFoundError

from events.codec import decode_fact
from events.subjects import FACTS_STREAM, SNAPSHOTS_BUCKET
from services.bus import last_sequence
from services.scheduler.core import State, evolve

SNAPSHOT_VERSION = 3  # 3: jobs pickled as slot tuples; 2: zlib-compressed; 1: plain pickle
CHUNK_BYTES = 512 * 1024  # object-store chunks: fewer round trips than nats-py's 128 KiB
ALL_FACTS = "qm.fact.>"


def stream_seq(msg) -> int:
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9 and tokens[0] == "$JS":
        return int(tokens[5])
    return msg.metadata.sequence.stream


async def read_messages(js: JetStreamContext, subject: str = ALL_FACTS, start_seq: int = 1,
                        until_seq: int | None = None, follow: bool = False) -> AsyncIterator:  # fmt: skip
    """Every fact message from `start_seq`, in log order; stops at the log's end as of the
    call (or `until_seq`) unless `follow`."""
    end = until_seq if until_seq is not None else await last_sequence(js, subject)
    if end < start_seq and not follow:
        return
    inbox: asyncio.Queue = asyncio.Queue(maxsize=100_000)

    async def deliver(msg) -> None:
        await inbox.put(msg)

    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
    sub = await js.subscribe(subject, cb=deliver, ordered_consumer=True, config=config,
                             stream=FACTS_STREAM, pending_msgs_limit=200_000)  # fmt: skip
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


@dataclass
class Recovered:
    state: State
    fact_seq: int  # the last fact folded into state (every command up to it is complete)
    decided_through: int  # the last command sequence whose facts are all in the log
    log_end: int = 0  # the log's last sequence, partial command included: the next fence
    partial: tuple[int, list[bytes]] | None = None  # (command seq, its facts already logged)
    snapshot_seq: int = 0  # the snapshot this state was rebuilt from (0: from the start)


async def recover(js: JetStreamContext, partition: str, warm: Recovered | None = None) -> Recovered:
    """Latest snapshot plus the tail of the fact log, folded with the one `evolve`.

    With `warm` (the result of an earlier call that nothing has changed since), only the
    facts logged after it are folded: a standby calls this over and over to follow the log,
    so that taking over costs a short tail, not a whole fold under a running lease.

    Facts are folded a whole command at a time: each message says how many facts its
    command produced (`Qm-Facts`) and which one it is (the index ending its message id).  A
    writer that died mid-append may have left only the first facts of its last command; those
    are not folded but returned as `partial`, so the next leader re-decides that command
    (deterministically: to the same facts) and appends only what is missing.
    """
    recovered = warm or await load_snapshot(js, partition) or Recovered(State(), 0, 0)
    recovered.log_end, recovered.partial = recovered.fact_seq, None
    group: list = []
    async for msg in read_messages(js, ALL_FACTS, recovered.fact_seq + 1):
        seq = stream_seq(msg)
        recovered.log_end = seq
        headers = msg.headers or {}
        group.append((seq, msg.data))
        count = int(headers.get("Qm-Facts", "1"))
        if len(group) < count:
            continue
        for fact_seq, data in group:
            if fact_seq % 16384 == 0:
                # The state is hundreds of thousands of long-lived objects: without this
                # the cyclic collector rescans them again and again during a long fold.
                gc.freeze()
            fact = decode_fact(data)
            evolve(recovered.state, fact)
            recovered.fact_seq = fact_seq
            recovered.decided_through = max(recovered.decided_through, fact.command_seq)
        group = []
    if group:
        recovered.partial = (decode_fact(group[0][1]).command_seq, [data for _, data in group])
    return recovered


def capture_snapshot(recovered: Recovered) -> Callable[[], bytes]:
    """Capture the state as of `fact_seq` now; the returned function gives its bytes (it may
    block: call it in a thread).

    Where the platform can fork, a child process pickles its copy-on-write image of the state
    while the writer goes on deciding (pickling a state of a million jobs holds the
    interpreter for seconds), and the bytes come back through a pipe.
    """
    image = (SNAPSHOT_VERSION, recovered.fact_seq, recovered.decided_through, recovered.state)
    if not hasattr(os, "fork"):
        payload = encode_snapshot(image)
        return lambda: payload
    pid, pipe = _pickle_in_child(image)
    return lambda: _collect(pid, pipe)


async def save_snapshot(js: JetStreamContext, partition: str,
                        snapshot: Recovered | Callable[[], bytes]) -> int:  # fmt: skip
    """Store a snapshot (a state, or what `capture_snapshot` returned) so a restart folds only
    the tail; returns its size in bytes.  Written by the scheduler alone (credentials keep
    everyone else out of the bucket, see the security docs)."""
    capture = capture_snapshot(snapshot) if isinstance(snapshot, Recovered) else snapshot
    payload = await asyncio.get_running_loop().run_in_executor(None, capture)
    store = await js.object_store(SNAPSHOTS_BUCKET)
    meta = ObjectMeta(name=partition, options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES))
    await store.put(partition, payload, meta=meta)
    return len(payload)


def encode_snapshot(image: tuple) -> bytes:
    """Pickle, compressed: a state pickles to many repeated names and small ints, so zlib's
    fastest level makes it ~6x smaller in a few percent of the pickling time, and the store
    moves (and a restart fetches) a sixth of the bytes."""
    return zlib.compress(pickle.dumps(image, protocol=pickle.HIGHEST_PROTOCOL), 1)


def _pickle_in_child(image: tuple) -> tuple[int, int]:
    """Fork; the child writes the pickled `image` to a pipe and exits at once."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no logging, no cleanup handlers
        code = 1
        try:
            os.close(read)
            with open(write, "wb") as out:
                out.write(encode_snapshot(image))
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def _collect(pid: int, pipe: int) -> bytes:
    """Everything the child wrote, once it has exited cleanly."""
    with open(pipe, "rb") as handle:
        payload = handle.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the snapshot process failed (status {status})")
    return payload


async def load_snapshot(js: JetStreamContext, partition: str) -> Recovered | None:
    store = await js.object_store(SNAPSHOTS_BUCKET)
    # Into a buffer: without `writeinto`, nats-py 2.16 joins the chunks with `bytes +=`,
    # which is quadratic (minutes for a snapshot of a few hundred MB).
    buffer = io.BytesIO()
    try:
        await store.get(partition, writeinto=buffer)
    except ObjectNotFoundError:
        return None
    try:
        version, fact_seq, decided_through, state = pickle.loads(zlib.decompress(buffer.getbuffer()))
    except Exception:  # an older layout (or a damaged object): fold the whole log instead
        return None
    if version != SNAPSHOT_VERSION:
        return None  # an older layout: fold the whole log instead
    return Recovered(state, fact_seq, decided_through, snapshot_seq=fact_seq)
