"""NATS JetStream plumbing shared by every service: streams, buckets, atomic appends.

The two streams are declared with nats-py (FastStream's JStream cannot set `allow_atomic`).
`ensure_streams` creates them, or updates them to the configured options, and is safe to call
from every process at start-up.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from events.subjects import (
    COMMANDS_PREFIX,
    COMMANDS_STREAM,
    FACTS_PREFIX,
    FACTS_STREAM,
    LEASES_BUCKET,
    SNAPSHOTS_BUCKET,
)
from services.settings import Settings, StreamOptions

ATOMIC_BATCH_LIMIT = 1000  # nats-server refuses larger atomic batches (err_code 10199)


class Unreachable(ConnectionError):
    pass


async def connect(url: str, name: str, timeout: float = 10.0) -> Client:
    """Connect, failing with `Unreachable` after `timeout` if the server never answers.

    Once connected, the client reconnects forever (a cluster node may restart under load);
    only the first connection is bounded, so a wrong URL is reported instead of retried.
    """

    async def quiet(error: Exception) -> None:  # nats-py would print a traceback per retry
        pass

    try:
        return await asyncio.wait_for(nats.connect(
            url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=2, allow_reconnect=True, error_cb=quiet,
        ), timeout)  # fmt: skip
    except (asyncio.TimeoutError, TimeoutError, OSError, nats.errors.NoServersError) as error:
        raise Unreachable(f"cannot reach NATS at {url} ({type(error).__name__})") from None


def _stream_config(name: str, subjects: list[str], options: StreamOptions, atomic: bool) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=subjects,
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE if options.storage == "file" else StorageType.MEMORY,
        num_replicas=options.replicas,
        duplicate_window=options.duplicate_window_s,
        max_bytes=options.max_bytes,
        max_age=options.max_age_s,
        max_msg_size=options.max_msg_size,
        max_msgs=-1,
        max_msgs_per_subject=-1,
        discard=DiscardPolicy.OLD,
        allow_atomic=atomic or None,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, settings: Settings) -> None:
    options = settings.streams
    for config in (
        _stream_config(COMMANDS_STREAM, [f"{COMMANDS_PREFIX}.>"], options, atomic=False),
        _stream_config(FACTS_STREAM, [f"{FACTS_PREFIX}.>"], options, atomic=True),
    ):
        try:
            await js.stream_info(config.name)
        except NotFoundError:
            await js.add_stream(config)
        else:
            await js.update_stream(config)
    await js.create_key_value(KeyValueConfig(
        bucket=LEASES_BUCKET, history=1, ttl=settings.lease_ttl_s, replicas=options.replicas,
        storage=StorageType.FILE if options.storage == "file" else StorageType.MEMORY,
    ))  # fmt: skip
    await js.create_object_store(SNAPSHOTS_BUCKET, replicas=options.replicas)


class AppendRefused(Exception):
    """The fact log refused an append: another writer appended first (fencing) or an id was
    a duplicate.  The writer must not advance its state."""

    def __init__(self, code: int, description: str):
        super().__init__(f"{code}: {description}")
        self.code = code


@dataclass(frozen=True)
class Fenced:
    """Where the next append must land: the last sequence of the writer's fact subjects."""

    subject_filter: str
    last_seq: int


async def append_atomic(
    nc: Client, messages: list[tuple[str, bytes, dict[str, str]]], fence: Fenced, timeout: float
) -> int:
    """Append messages (subject, payload, headers) to the fact log as one atomic batch.

    All or nothing: the server stores the whole batch or none of it, and only if nothing else
    was appended to `fence.subject_filter` since `fence.last_seq`.  Returns the stream sequence
    of the last message stored.  Batches larger than the server limit are split, each fenced on
    the previous one's sequence.
    """
    last = fence.last_seq
    for start in range(0, len(messages), ATOMIC_BATCH_LIMIT):
        chunk = messages[start:start + ATOMIC_BATCH_LIMIT]
        batch_id = f"qm-{last}-{start}"
        for index, (subject, payload, extra) in enumerate(chunk, start=1):
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(index), **extra}
            if index == 1:
                headers["Nats-Expected-Last-Subject-Sequence"] = str(last)
                headers["Nats-Expected-Last-Subject-Sequence-Subject"] = fence.subject_filter
            if index == len(chunk):
                headers["Nats-Batch-Commit"] = "1"
                reply = await nc.request(subject, payload, headers=headers, timeout=timeout)
                answer = json.loads(reply.data)
                error = answer.get("error")
                if error:
                    raise AppendRefused(error.get("err_code", 0), error.get("description", ""))
                last = answer["seq"]
            else:
                await nc.publish(subject, payload, headers=headers)
    return last


async def last_sequence(js: JetStreamContext, subject_filter: str) -> int:
    """The stream sequence of the last fact under `subject_filter` (0 when none)."""
    info = await js.stream_info(FACTS_STREAM)
    if info.state.messages == 0:
        return 0
    try:
        message = await js.get_last_msg(FACTS_STREAM, subject_filter)
    except NotFoundError:
        return 0
    return message.seq


async def wait_for(condition, timeout: float, interval: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)
