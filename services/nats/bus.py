"""NATS JetStream plumbing shared by every service: streams, buckets, fenced appends.

The two streams are declared with nats-py, every option explicit.  `ensure_streams` creates
them, or updates them to the configured options, and is safe to call from every process at
start-up.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping

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

from quotasched.events.subjects import (
    COMMANDS_PREFIX,
    COMMANDS_STREAM,
    FACTS_PREFIX,
    FACTS_STREAM,
    LEASES_BUCKET,
    SNAPSHOTS_BUCKET,
)
from quotasched.services import logs
from quotasched.services.nats import natsfix
from quotasched.services.nats.credentials import connect_options
from quotasched.services.settings import Settings, StreamOptions

natsfix.install()  # nats-py's header parser costs ~10 µs a fact; see services/nats/natsfix.py


class Unreachable(ConnectionError):
    pass


def error_reason(error: BaseException) -> str:
    """A failed connection's cause in words ("Connection refused"), for messages to people."""
    if isinstance(error, OSError) and isinstance(error.errno, int) and error.errno > 0:
        return os.strerror(error.errno)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


log = logs.get("quotasched.bus")

# How long closing a connection waits for its subscriptions to hand on what they hold (nats-py's
# `drain`; its default, 30 s, is how long a stop of `up` could hang on one stuck subscription).
DRAIN_TIMEOUT_S = 5


async def connect(url: str, name: str, timeout: float = 10.0, *,
                  credentials: Mapping[str, str] | None = None, client: Client | None = None,
                  on_error: Callable[[Exception], Awaitable[None]] | None = None) -> Client:  # fmt: skip
    """Connect, failing with `Unreachable` after `timeout` if the server never answers.

    Once connected, the client reconnects forever (a cluster node may restart under load);
    only the first connection is bounded, so a wrong URL is reported instead of retried.
    Credentials, inbox prefix and TLS come from the environment, or from `credentials` (the
    same variables, for a process acting as several roles: the AWS Batch endpoint).  `client`:
    an unconnected nats-py client to connect (a subclass that watches its own traffic);
    `on_error`: told the server's asynchronous errors (a permissions violation, say).
    """

    async def quiet(error: Exception) -> None:  # nats-py would print a traceback per retry
        if isinstance(error, nats.errors.DrainTimeoutError):  # a stop that waited on it
            log.warning("a subscription did not drain in time; the connection is closed anyway",
                        connection=name, drain_timeout_s=DRAIN_TIMEOUT_S)  # fmt: skip

    # "nats://a:4222,nats://b:4222": every seed of a cluster, so a start-up or a reconnect
    # succeeds while any one of them is up
    servers = [part.strip() for part in url.split(",") if part.strip()] or [url]
    nc = client if client is not None else Client()
    try:
        await asyncio.wait_for(nc.connect(
            servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=2, allow_reconnect=True, error_cb=on_error or quiet,
            drain_timeout=DRAIN_TIMEOUT_S,
            **connect_options(credentials),
        ), timeout)  # fmt: skip
    except (asyncio.TimeoutError, TimeoutError, OSError, nats.errors.NoServersError) as error:
        raise Unreachable(f"cannot reach NATS at {url} ({type(error).__name__})") from None
    return nc


def _stream_config(name: str, subjects: list[str], options: StreamOptions,
                   atomic: bool = False) -> StreamConfig:  # fmt: skip
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
        # never OLD: evicting the first facts loses the configuration every later fact
        # needs; a full stream refuses new messages, which the writer reports as disk full
        discard=DiscardPolicy.NEW,
        allow_direct=True,
        allow_atomic=atomic or None,  # the fact log: partitions per job queue append batches
    )


async def ensure_streams(js: JetStreamContext, settings: Settings) -> None:
    options = settings.streams
    for config in (
        _stream_config(COMMANDS_STREAM, [f"{COMMANDS_PREFIX}.>"], options),
        _stream_config(FACTS_STREAM, [f"{FACTS_PREFIX}.>"], options, atomic=True),
    ):
        try:
            info = await js.stream_info(config.name)
        except NotFoundError:
            await js.add_stream(config)
        else:
            # only what differs is updated: a process whose credentials may not manage streams
            # (an executor) starts against streams already declared as it would declare them
            have = info.config.as_dict()
            if any(have.get(key) != value for key, value in config.as_dict().items()):
                await js.update_stream(config)
    # the buckets are created when missing and otherwise left as the first process made them
    # (a process with another lease TTL does not fail on the existing bucket)
    if not await _exists(js, f"KV_{LEASES_BUCKET}"):
        await js.create_key_value(KeyValueConfig(
            bucket=LEASES_BUCKET, history=1, ttl=settings.lease_ttl_s, replicas=options.replicas,
            storage=StorageType.FILE if options.storage == "file" else StorageType.MEMORY,
        ))  # fmt: skip
    if not await _exists(js, f"OBJ_{SNAPSHOTS_BUCKET}"):
        await js.create_object_store(SNAPSHOTS_BUCKET, replicas=options.replicas)


async def _exists(js: JetStreamContext, stream: str) -> bool:
    try:
        await js.stream_info(stream)
    except NotFoundError:
        return False
    return True


ATOMIC_BATCH_LIMIT = 1000  # nats-server refuses larger atomic batches (err_code 10199)
# Appends of at most this many messages on a shared or replicated stream go one by one (a
# round trip each, ~0.2-0.3 ms) rather than as an atomic batch (an fsync, ~2-9 ms, on a file
# stream): at low rates a decided batch is one command's one or two facts.
ONE_BY_ONE = 16


# Why an append did not land, as the writer acts on it (and the metrics count it).
FENCE = "fence"  # another writer appended first, or a stale leader woke up: step down
DISK_FULL = "disk_full"  # the server's store is full (or cannot write): wait, retry, say so
COMMAND = "command"  # the server refuses these very messages (size, headers): refuse the command
UNAVAILABLE = "unavailable"  # no answer, no leader for the stream: step down and retry

FENCE_CODES = frozenset({10071, 10164})  # wrong last sequence (with and without the number)
# 10023 insufficient resources (the server's max_file_store reached), 10047 insufficient
# storage resources, 10028 insufficient memory resources, 10002 the account's limits
STORAGE_CODES = frozenset({10023, 10047, 10028, 10002})
_STORAGE_WORDS = ("no space left", "insufficient", "resources exceeded", "resource limits",
                  "maximum bytes exceeded", "disk full", "quota exceeded")  # fmt: skip
_MESSAGE_WORDS = ("too large", "exceeds maximum", "maximum payload", "header")


def refusal_cause(code: int, description: str, status: int = 0) -> str:
    """The writer's reading of a JetStream error: FENCE, DISK_FULL, COMMAND or UNAVAILABLE.

    nats-server answers a store refusal with an API error whose `code` is HTTP-like: a 400 is
    about the message itself (size, headers) unless it is the fence; a 5xx or 404 is about
    the server (no stream leader, store failure), where a later try may land.  A full store
    is recognised by its codes and, as a fallback, by its words ("no space left on device"
    inside a 10077 "store failed")."""
    words = description.lower()
    if code in FENCE_CODES or "wrong last sequence" in words:
        return FENCE
    if code in STORAGE_CODES or any(word in words for word in _STORAGE_WORDS):
        return DISK_FULL
    if any(word in words for word in _MESSAGE_WORDS):
        return COMMAND
    if status >= 500 or status == 404 or "unavailable" in words or "not found" in words:
        return UNAVAILABLE
    return COMMAND


class AppendRefused(Exception):
    """The fact log refused an append: another writer appended first (fencing), the store is
    full, or the server refuses the message itself.  `cause` says which (`refusal_cause`).
    The writer must not go on from its in-memory state."""

    def __init__(self, code: int, description: str, status: int = 0):
        super().__init__(f"{code}: {description}")
        self.code = code
        self.description = description
        self.status = status
        self.cause = refusal_cause(code, description, status)


# Headers the appender adds to a fact message (fence, atomic batch) on top of the writer's
# own: a fact must fit the bus with this much room to spare.
APPENDER_HEADER_ROOM = 256


def message_size(payload: bytes, headers: dict[str, str]) -> int:
    """Bytes a message takes against the server's max_payload: payload plus its encoded
    headers (`NATS/1.0` line, one `key: value` line each, blank line).  nats-py checks only
    the payload; a message over the limit with its headers makes the server close the
    connection ("Maximum Payload Violation"), so the writer checks the whole."""
    head = 12 + sum(len(key) + len(value) + 4 for key, value in headers.items())
    return len(payload) + head + APPENDER_HEADER_ROOM


class FactAppender:
    """Pipelined, fenced appends to the fact log by its single writer.

    Every message carries `Nats-Expected-Last-Subject-Sequence` (on `subject_filter`, which
    only this writer appends to), computed ahead: message k of the pipeline expects k-1.  So
    many appends can be in flight at once, and the chain fences itself: if one is refused
    (another writer got in, or a stale leader woke up), every later one is refused too, and
    nothing lands out of order.  Acks come back on a private inbox; a refusal resolves its
    future with `AppendRefused` (nats-py's own `publish_async` leaves such futures hanging).

    Where that chain cannot be computed ahead (other partitions append to the same stream) or
    is refused by the server (a replicated stream), each append is one JetStream atomic batch
    instead: all of it is stored or none, its first message fenced on where the previous
    batch ended.  One round trip (and, on a file stream, one fsync) per decided batch; a
    batch of a few messages goes one message at a time instead, each fenced on the sequence
    the previous one got, which is faster than an fsync.
    """

    def __init__(self, nc: Client, subject_filter: str, last_seq: int, stream: str = FACTS_STREAM,
                 shared: bool = False):  # fmt: skip
        self.nc = nc
        # Others append to the stream too (partitions of other job queues): the sequence a
        # message will get is not known ahead, so each append is one atomic batch, fenced on
        # its first message with the sequence the previous batch's commit reported.
        self.shared = shared
        self._previous: asyncio.Future | None = None  # the last atomic batch's commit
        self.stream = stream
        self.subject_filter = subject_filter
        self.next_expected = last_seq  # the sequence the next message must follow
        self._inbox = nc.new_inbox()
        self._pending: dict[int, asyncio.Future] = {}
        self._token = 0
        self._sub = None
        self.serial = False
        self.wait_previous_s = 5.0  # for the previous append's ack, before this one is sent

    async def start(self) -> FactAppender:
        self._sub = await self.nc.subscribe(f"{self._inbox}.*", cb=self._on_ack)
        # A replicated stream refuses a fenced message while an earlier one on the same subject
        # is still being proposed (10164 "wrong last sequence"): there, one atomic batch at a
        # time, each fenced on the sequence the previous one's commit reported.
        info = await self.nc.jetstream().stream_info(self.stream)
        self.serial = (info.config.num_replicas or 1) > 1
        return self

    async def close(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may already be gone
                pass
        for future in self._pending.values():
            if not future.done():
                future.cancel()
        self._pending.clear()

    async def append(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> list[asyncio.Future]:
        """Send messages (subject, payload, headers); returns a future for the last one,
        resolving to its stream sequence or failing with AppendRefused.

        Only the last message asks for an ack: the chain makes it speak for all of them.  If
        any earlier message was not stored (refused, or lost), the next one expects a sequence
        the stream never reached and is refused, and so is every one after it, the last
        included.  So the last one stored means every one was stored, in order.
        """
        if not messages:
            return []
        if self.shared or self.serial:
            if len(messages) <= ONE_BY_ONE:
                return await self._one_by_one(messages)
            return await self._atomic(messages)
        return await self._pipelined(messages)

    async def _one_by_one(self, messages: list[tuple[str, bytes, dict[str, str]]]
                          ) -> list[asyncio.Future]:  # fmt: skip
        """A few messages, each fenced on the sequence the one before it got (its ack): a
        round trip each, cheaper than the fsync of an atomic commit for a batch this small."""
        future = self._previous
        for message in messages:
            failed = await self._landed(future)
            if failed is not None:
                return [failed]
            [future] = await self._pipelined([message])
        self._previous = future
        return [future]

    async def _landed(self, future: asyncio.Future | None) -> asyncio.Future | None:
        """Wait for the previous append; its sequence is where the next one is fenced.  None
        once it landed; else a failed future that speaks for this append and every later one
        (nothing more is sent: the term ends on it).

        That future is never the previous one while it is still unanswered: an ack that comes
        after `wait_previous_s` would resolve it, and this append, never sent, would pass for
        stored (its commands acked, their facts lost; the next append, fenced where the late
        one ended, would be stored after the gap)."""
        if future is None:
            return None
        if not future.done():
            try:
                await asyncio.wait_for(asyncio.shield(future), self.wait_previous_s)
            except (asyncio.TimeoutError, TimeoutError):
                return self._broken(f"the previous append was unanswered after "
                                    f"{self.wait_previous_s:g} s")  # fmt: skip
            except AppendRefused:
                pass
            except asyncio.CancelledError:
                if not future.cancelled():
                    raise  # this task is cancelled, not the append
        if future.cancelled():
            return self._broken("the previous append was cancelled")
        if future.exception() is not None:
            self._previous = future
            return future
        self.next_expected = future.result()
        return None

    def _broken(self, why: str) -> asyncio.Future:
        """A failed future standing for this append and every later one."""
        future = self._previous = asyncio.get_running_loop().create_future()
        future.set_exception(TimeoutError(f"{why}; nothing after it was sent"))
        return future

    async def _atomic(self, messages: list[tuple[str, bytes, dict[str, str]]]
                      ) -> list[asyncio.Future]:  # fmt: skip
        """The messages as atomic batches (all or nothing, at most ATOMIC_BATCH_LIMIT each),
        the first message of each fenced on where the previous batch ended.  A batch is sent
        once the previous one's commit answered; if that one failed, its future speaks for
        this append too (nothing more is sent)."""
        loop = asyncio.get_running_loop()
        future = self._previous
        for start in range(0, len(messages), ATOMIC_BATCH_LIMIT):
            failed = await self._landed(future)
            if failed is not None:
                return [failed]
            chunk = messages[start:start + ATOMIC_BATCH_LIMIT]
            self._token += 1
            batch_id = f"{self._inbox.rsplit('.', 1)[-1]}-{self._token}"
            future = loop.create_future()
            self._pending[self._token] = future
            last = len(chunk)
            for index, (subject, payload, headers) in enumerate(chunk, start=1):
                headers["Nats-Batch-Id"] = batch_id
                headers["Nats-Batch-Sequence"] = str(index)
                if index == 1:
                    headers["Nats-Expected-Last-Subject-Sequence"] = str(self.next_expected)
                    headers["Nats-Expected-Last-Subject-Sequence-Subject"] = self.subject_filter
                if index == last:
                    headers["Nats-Batch-Commit"] = "1"
                    await self.nc.publish(subject, payload, reply=f"{self._inbox}.{self._token}",
                                          headers=headers)  # fmt: skip
                else:
                    await self.nc.publish(subject, payload, headers=headers)
        self._previous = future
        return [future]

    async def _pipelined(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> list[asyncio.Future]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        expected, fence = self.next_expected, self.subject_filter
        sends = []
        for subject, payload, headers in messages:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expected)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = fence
            sends.append((subject, "", headers, payload))
            expected += 1
        self._token += 1
        self._pending[self._token] = future
        subject, _, headers, payload = sends[-1]
        sends[-1] = (subject, f"{self._inbox}.{self._token}", headers, payload)
        self.next_expected = expected
        await natsfix.publish_all(self.nc, sends)  # nats-py's publish, without its header cost
        return [future]

    async def _on_ack(self, msg) -> None:
        future = self._pending.pop(int(msg.subject.rsplit(".", 1)[1]), None)
        if future is None or future.done():
            return
        try:
            answer = json.loads(msg.data)
        except ValueError:
            future.set_exception(AppendRefused(0, f"unreadable ack {msg.data[:200]!r}"))
            return
        error = answer.get("error")
        if error:
            future.set_exception(refused(error))
        else:
            future.set_result(answer["seq"])

    async def probe(self, message: tuple[str, bytes, dict[str, str]], after: int,
                    timeout: float) -> int:  # fmt: skip
        """Append one message alone, fenced on `after`, and wait for its answer: its stream
        sequence, or AppendRefused with the server's own reason, or TimeoutError when the
        server answers nothing (nats-server drops a message it failed to write without a
        reply).  The pipeline asks for an ack only on its last message, so when an earlier one
        was refused the last one reports just "wrong last sequence"; this finds out why."""
        subject, payload, headers = message
        headers = {key: value for key, value in headers.items()
                   if not key.startswith("Nats-Batch-")}  # fmt: skip
        headers["Nats-Expected-Last-Subject-Sequence"] = str(after)
        headers["Nats-Expected-Last-Subject-Sequence-Subject"] = self.subject_filter
        reply = await self.nc.request(subject, payload, timeout=timeout, headers=headers)
        try:
            answer = json.loads(reply.data)
        except ValueError:
            raise AppendRefused(0, f"unreadable ack {reply.data[:200]!r}") from None
        if answer.get("error"):
            raise refused(answer["error"])
        return answer["seq"]


def refused(error: dict) -> AppendRefused:
    """AppendRefused from a JetStream API error object (`code`, `err_code`, `description`)."""
    return AppendRefused(error.get("err_code", 0), error.get("description", ""),
                         error.get("code", 0))  # fmt: skip


async def last_sequence(js: JetStreamContext, subject_filter: str, stream: str = FACTS_STREAM) -> int:
    """The stream sequence of the last message under `subject_filter` (0 when none)."""
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return 0
    try:
        message = await js.get_last_msg(stream, subject_filter)
    except NotFoundError:
        return 0
    return message.seq
