"""Reading the log: the ordered consumer, its buffer, and the batching loop of the projector.

`ReadingMixin` (a part of `service.Projector`, on its state) subscribes from a start sequence,
buffers what nats-py delivers (pausing the server past `high_water`), cuts batches on whole
commands, lingers for fuller ones (longer when catching up), checkpoints when the log goes quiet,
and checks every batch for holes before handing it to `_apply` (`applying.py`).
"""

from __future__ import annotations

import asyncio
import time

from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services import logs
from quotasched.services.nats.log import ALL_FACTS, stream_seq
from quotasched.services.nats.waits import wait_set

log = logs.get("quotasched.projector")


class ReadingMixin:
    """The consume loop of `Projector`; its state is made in `Projector.__init__`."""

    # -- reading the log -----------------------------------------------------------------------

    async def _subscribe(self, start_seq: int) -> None:
        self._generation += 1
        generation = self._generation
        buffer = self._buffer = []
        high_water = self.options.high_water

        async def deliver(msg) -> None:
            if generation != self._generation:
                return  # a message of a replaced subscription
            if not buffer:
                self._first_at = time.monotonic()
                self._wake.set()
            buffer.append(msg)
            if len(buffer) >= self._want:
                self._full.set()
            if len(buffer) >= high_water and not self._stopping:
                # Stop taking: nats-py answers flow control only for delivered messages, so
                # the server pauses instead of nats-py dropping messages as a slow consumer.
                self._drained.clear()
                await self._drained.wait()

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=start_seq)  # fmt: skip
        self._sub = await self.js.subscribe(
            ALL_FACTS, cb=deliver, ordered_consumer=True, config=config, stream=FACTS_STREAM,
            pending_msgs_limit=1_000_000, pending_bytes_limit=1024 * 1024 * 1024,
            # nats-py recreates the consumer after two missed heartbeats: 1 s (not its 5 s
            # default) makes that ~2-4 s after a server restart or a lost consumer.
            idle_heartbeat=self.options.heartbeat_s,
        )  # fmt: skip
        _say_when_replaced(self._sub)

    async def _resubscribe(self, start_seq: int) -> None:
        old, self._sub = self._sub, None
        self._generation += 1
        self._drained.set()
        if old is not None:
            try:
                await old.unsubscribe()
            except Exception:
                pass
        await self._subscribe(start_seq)

    async def _consume(self) -> None:
        options = self.options
        max_wait = options.max_wait_ms / 1000
        next_progress = time.monotonic() + options.progress_every_s
        while not self._stopping:
            if not self._buffer:
                self._wake.clear()
                if self._buffer:
                    continue
                if self._dirty:
                    if not await wait_set(self._wake, options.checkpoint_idle_s):
                        self._checkpoint()
                else:
                    await self._wake.wait()
                continue
            # Linger for a fuller batch, counted from the first buffered fact's arrival.  When
            # the server says more facts are waiting for this consumer than are in hand
            # (catching up), wait for them instead, up to max_batch or `catch_up_wait_ms`:
            # they arrive at ~100k/s, and fewer, larger transactions apply a backlog faster.
            self._want = options.max_batch
            deadline = self._first_at + max_wait
            backlog = _pending(self._buffer[-1])
            if backlog > len(self._buffer):
                self._want = min(options.max_batch, len(self._buffer) + backlog)
                deadline = time.monotonic() + options.catch_up_wait_ms / 1000
            while len(self._buffer) < self._want and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._full.clear()
                if not await wait_set(self._full, remaining):
                    break
            if self._stopping:
                break
            batch = self._take()
            items = await self._sequence(batch)
            if items:
                await self._apply(items)
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + options.progress_every_s
                await self._log_progress()
            await asyncio.sleep(0)  # requests and deliveries get their turn between batches

    def _take(self) -> list:
        buffer = self._buffer
        batch = buffer[: self.options.max_batch]
        cut = _last_complete(batch)
        if 0 < cut < len(batch):
            batch = batch[:cut]  # the rest of the last command is on its way
        del buffer[: len(batch)]
        if buffer:
            self._first_at = 0.0  # arrived during the last apply: take them without waiting
        if len(buffer) < self.options.high_water:
            self._drained.set()
        return batch

    async def _sequence(self, batch: list) -> list[tuple[int, bytes]]:
        """(seq, payload) of the batch's new facts; on a hole that the stream can fill, the
        facts before it, and a re-subscription from the position."""
        items: list[tuple[int, bytes]] = []
        last = self._last_seen
        for index, msg in enumerate(batch):
            seq = stream_seq(msg)
            if seq <= last:
                continue  # delivered again after the consumer was recreated
            if seq != last + 1 and not await self._hole_is_real(last + 1, seq):
                log.warning("facts were lost in delivery; reading again from the position",
                            expected_seq=last + 1, got_seq=seq)  # fmt: skip
                self._last_seen = last
                if items:
                    await self._apply(items)
                await self._resubscribe(self.position + 1)
                self._last_seen = self.position
                return []
            items.append((seq, msg.data))
            last = seq
        self._last_seen = last
        return items

    async def _hole_is_real(self, first: int, seq: int) -> bool:
        """Are facts first..seq-1 absent from the stream (deleted or aged out)?"""
        try:
            found = await self.js.get_msg(FACTS_STREAM, first, subject=ALL_FACTS, next=True)
        except NotFoundError:
            found = None
        if found is not None and found.seq < seq:
            return False
        log.warning("facts missing from the stream are passed over", first_missing=first,
                    last_missing=seq - 1)  # fmt: skip
        return True

    async def _log_progress(self) -> None:
        try:
            stream_last = await self._stream_last_seq()
        except Exception:
            stream_last = None
        log.info("projector progress", position=self.position, stream_last_seq=stream_last,
                 lag=None if stream_last is None else max(stream_last - self.position, 0),
                 facts_applied=self.facts_applied, batches=self.batches,
                 apply_seconds=round(self.apply_seconds, 3))  # fmt: skip


def _say_when_replaced(sub) -> None:
    """nats-py recreates an ordered consumer by itself, silently, when its heartbeats stop
    (deleted by someone, or lost with its server) or a delivery comes out of order: make both
    loud, naming the consumer.  Its `_active` flag says which: cleared when two heartbeat
    intervals passed without a heartbeat or a message, set by an out-of-order delivery."""
    jsi = sub._sub._jsi  # the nats-py internals of a push subscription's ordered consumer
    reset, recreate = jsi.reset_ordered_consumer, jsi.recreate_consumer

    async def loud_reset(sseq):
        lost = sub._consumer
        if not jsi._active:
            log.error("the projector's consumer is gone (no heartbeats: deleted, or lost with "
                      "its server); recreating it", consumer=lost, stream=FACTS_STREAM,
                      resume_seq=sseq)  # fmt: skip
        else:
            log.warning("the projector's consumer delivered out of order; recreating it",
                        consumer=lost, stream=FACTS_STREAM, resume_seq=sseq)  # fmt: skip
        return await reset(sseq)

    async def loud_recreate() -> None:
        await recreate()  # its errors go to the connection's error callback
        log.warning("the projector's consumer was recreated", consumer=sub._consumer)

    jsi.reset_ordered_consumer, jsi.recreate_consumer = loud_reset, loud_recreate


def _pending(msg) -> int:
    """How many more facts the server holds for this consumer after `msg` (the last token of
    the v1 ack subject `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`;
    the metadata otherwise)."""
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9 and tokens[0] == "$JS":
        return int(tokens[8])
    try:
        return msg.metadata.num_pending or 0
    except Exception:
        return 0


def _last_complete(batch: list) -> int:
    """How many leading messages of `batch` end on the last fact of a command (0: none do)."""
    for index in range(len(batch) - 1, -1, -1):
        if ends_command(batch[index].headers):
            return index + 1
    return 0


def ends_command(headers: dict | None) -> bool:
    """Is this message the last fact of its command?  A message without the scheduler's
    headers counts as a whole command."""
    place = place_in_command(headers)
    return place is None or place[0] + 1 >= place[1]


def place_in_command(headers: dict | None) -> tuple[int, int] | None:
    """(index of the fact within its command, facts the command produced), from the
    scheduler's headers: the message id `<partition>:<command seq>:<index>` and `Qm-Facts`;
    None when they are missing or malformed."""
    try:
        return int(headers["Nats-Msg-Id"].rsplit(":", 1)[1]), int(headers["Qm-Facts"])
    except (KeyError, IndexError, ValueError, TypeError):
        return None
