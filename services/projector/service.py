"""The projector service: QM_FACTS applied to a DuckDB file in batches, exactly once.

Resuming exactly.  The position (the last applied fact's stream sequence) lives in the DuckDB
file, committed in the same transaction as the rows of its batch (`projections.store.apply`).
So the reader needs no state of its own on the server: on start the projector reads
`position()` and opens an *ordered consumer* from `position() + 1`.  An ordered consumer is
ephemeral, unacknowledged and flow-controlled, nats-py recreates it by itself after a gap or
two missed heartbeats (a server restart: ~2-4 s with the 1 s heartbeat used here), and it is the fastest way nats-py reads a
stream in order (~115-150k msgs/s here, against ~25-45k for pull `fetch`).  A durable consumer
would add a second position (its ack floor) that can disagree with the file's after a crash
(acked but not committed, or committed but not acked) and would have to be reset to the file's
position on every start anyway, plus an ack per batch.  "Durable" here is the file: a crash
at any instant leaves whole batches only, and the next start re-reads from the fact after the
last committed one; a fact at or below the position is skipped by the store.

Per batch: take up to `max_batch` buffered facts, waiting at most `max_wait_ms` after the
first one arrived for more (under load the facts that arrived during the previous apply are
taken at once, so a batch's size follows the rate: lag ~ two apply times).  When catching up
(the server reports more facts pending for the consumer than are in hand) it waits up to
`catch_up_wait_ms` for them, so a backlog is applied in few large transactions.  A batch is cut
after the last fact of its last complete command (`Qm-Facts` and the message id's index) when
there is one, so reads see whole decisions.  The apply is synchronous: nothing else runs on the
event loop during it, and read requests are answered between batches (the cheap ones on the
loop, the DuckDB ones on a cursor in a worker thread, inside a read transaction: they see the
last committed batch and never a half-applied one).

Gaps.  nats-py tracks an ordered consumer's sequence when a message arrives, not when it is
handed over, so a message dropped as a slow consumer would leave a silent hole.  The projector
never blocks nats-py's reader (the callback only appends to a buffer; past `high_water`
facts it stops taking more, which holds back the flow-control reply so the server pauses), and
it checks every batch for holes: a sequence the stream still holds but that never arrived makes
it re-subscribe from the position; one the stream no longer holds (deleted or aged out) is
logged and passed over, as a rebuild from the stream would.

A fact the projection cannot apply stops the projector: the facts before it (in its batch) are
applied, so the position ends right before it, an error naming its sequence and the reason is
logged, and `run` raises `ProjectorHalted`.  Nothing is ever skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import duckdb
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

import projections
from events.subjects import FACTS_STREAM
from projections import store as store_module
from services import logs
from services.metrics import APPLY_BUCKETS, Histogram
from services.projector import API_PREFIX, APPLIED_SUBJECT, QUEUE_GROUP, api
from services.scheduler.log import ALL_FACTS, stream_seq

log = logs.get("quotasched.projector")


class ProjectorOptions(BaseSettings):
    """Tuning, from `QUOTASCHED_PROJECTOR_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_PROJECTOR_", extra="ignore")

    max_batch: int = Field(20_000, ge=1)  # facts per transaction at most
    max_wait_ms: float = Field(25.0, ge=0)  # linger after the first fact of a batch
    catch_up_wait_ms: float = Field(250.0, ge=0)  # linger for facts the server says are waiting
    high_water: int = Field(50_000, ge=1000)  # buffered facts before the reader pauses
    query_timeout_s: float = Field(30.0, gt=0)  # a read is interrupted after this long
    query_threads: int = Field(2, ge=1, le=16)  # reads running at once
    progress_every_s: float = Field(10.0, gt=0)  # a progress log line at most this often
    heartbeat_s: float = Field(1.0, ge=0.1, le=30)  # the ordered consumer's idle heartbeat
    # Checkpoints block every writer (also one run from another thread).  DuckDB's own, at its
    # default 16 MB of write-ahead log (~26k facts at ~620 B each), cost 0.1-0.8 s each and
    # came every ~2.6 s at 10k facts/s: most of the lag's tail.  So the projector checkpoints
    # when the log goes quiet (`checkpoint_idle_s` without a new fact) and leaves DuckDB's
    # automatic one as a backstop at `checkpoint_threshold` (128 MB ~ 200k facts: one
    # checkpoint per ~20 s of sustained 10k facts/s; replaying that much log after a kill
    # takes under 0.5 s).  None: DuckDB's default.  benchmarks/projector_bench.py measures it.
    checkpoint_threshold: str | None = Field("128MB", pattern=r"^[0-9]+(\.[0-9]+)? ?[KMGT]?i?B$")
    checkpoint_idle_s: float = Field(1.0, gt=0)
    duckdb_threads: int | None = Field(None, ge=1, le=64)  # None: DuckDB's default (all cores)


class ProjectorError(RuntimeError):
    """The projector cannot start or go on (locked file, log and file disagree, ...)."""


class ProjectorHalted(ProjectorError):
    """A fact could not be applied; the projector stopped right before it."""

    def __init__(self, seq: int | None, kind: str | None, reason: str, position: int):
        self.seq, self.kind, self.reason, self.position = seq, kind, reason, position
        where = f"fact seq {seq} ({kind})" if seq is not None else "a fact of the batch"
        super().__init__(f"cannot project {where}: {reason}; the projection stopped at "
                         f"position {position}")  # fmt: skip


class Projector:
    def __init__(self, nc: Client, db_path: str, options: ProjectorOptions | None = None):
        self.nc = nc
        self.js = nc.jetstream()
        self.db_path = db_path
        self.options = options or ProjectorOptions()
        self.store: store_module.ProjectionStore | None = None
        self.position = 0  # last committed fact seq
        self.ready = asyncio.Event()  # subscribed: reading the log and answering requests
        self.facts_applied = 0
        self.batches = 0
        self.apply_seconds = 0.0
        self.apply_latency = Histogram(APPLY_BUCKETS)  # per batch, for the metrics endpoint
        self.applied_at: float | None = None  # wall clock of the last commit
        self._buffer: list = []
        self._last_seen = 0  # last fact seq taken from the buffer (gap detection)
        self._first_at = 0.0  # when the buffer last went from empty to non-empty
        self._wake = asyncio.Event()  # a fact arrived, or stop
        self._full = asyncio.Event()  # `_want` facts are buffered, or stop
        self._want = self.options.max_batch
        self._drained = asyncio.Event()  # the buffer is below high water
        self._drained.set()
        self._generation = 0
        self._dirty = False  # committed since the last checkpoint
        self._sub = None
        self._api_sub = None
        self._stopping = False
        self._requests: set[asyncio.Task] = set()
        self._cursors: set = set()
        self._slots = asyncio.Semaphore(self.options.query_threads)
        self._threads = ThreadPoolExecutor(self.options.query_threads,
                                           thread_name_prefix="projector-query")  # fmt: skip

    # -- life cycle ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Apply the log until `stop` is set; raises ProjectorHalted / ProjectorError."""
        directory = os.path.dirname(os.path.abspath(self.db_path))
        os.makedirs(directory, exist_ok=True)
        self.store = projections.open(self.db_path)  # ProjectionLocked, SchemaMismatch
        watcher = asyncio.create_task(self._watch(stop))
        try:
            # Reads run on cursors of this connection: no files, no ATTACH, no extensions.
            self.store.con.execute("SET enable_external_access = false")
            if self.options.duckdb_threads is not None:
                self.store.con.execute(f"SET threads = {int(self.options.duckdb_threads)}")
            if self.options.checkpoint_threshold is not None:  # validated by its pattern
                self.store.con.execute(
                    f"SET checkpoint_threshold = '{self.options.checkpoint_threshold}'")
            self.position = self._last_seen = self.store.position()
            stream_last = await self._stream_last_seq()
            await self._check_log_matches(stream_last)
            log.info("projector started", db=self.db_path, position=self.position,
                     stream_last_seq=stream_last, lag=max(stream_last - self.position, 0),
                     max_batch=self.options.max_batch, max_wait_ms=self.options.max_wait_ms)  # fmt: skip
            self._api_sub = await self.nc.subscribe(f"{API_PREFIX}.*", queue=QUEUE_GROUP,
                                                    cb=self._on_request)  # fmt: skip
            await self._subscribe(self.position + 1)
            self.ready.set()
            await self._consume()
        finally:
            watcher.cancel()
            await self._close()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping = True
        for event in (self._wake, self._full, self._drained):
            event.set()

    async def _close(self) -> None:
        self._stopping = True
        self._drained.set()
        for sub in (self._sub, self._api_sub):
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except Exception:  # the connection may already be gone
                    pass
        self._sub = self._api_sub = None
        for cursor in list(self._cursors):
            try:
                cursor.interrupt()
            except Exception:
                pass
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)
        self._threads.shutdown(wait=True)
        if self.store is not None:
            self.store.close()  # DuckDB checkpoints the write-ahead log into the file
            self.store = None
        log.info("projector stopped", db=self.db_path, position=self.position,
                 facts_applied=self.facts_applied, batches=self.batches)  # fmt: skip

    async def _stream_last_seq(self) -> int:
        return (await self.js.stream_info(FACTS_STREAM)).state.last_seq

    async def _check_log_matches(self, stream_last: int) -> None:
        """The file must be a projection of *this* log: refuse one that is ahead of the
        stream, or whose last applied fact is not the stream's fact at that sequence (the
        stream was deleted and recreated).  Either way the answer is a rebuild."""
        if self.position == 0:
            return
        if self.position > stream_last:
            raise ProjectorError(
                f"{self.db_path} has applied facts up to seq {self.position} but {FACTS_STREAM} "
                f"ends at seq {stream_last}: the stream was recreated; rebuild the projection "
                f"(quotasched projections rebuild --db {self.db_path} --nats-url URL)")
        try:
            message = await self.js.get_msg(FACTS_STREAM, self.position)
        except NotFoundError:
            log.warning("cannot compare the log with the projection: the fact at the "
                        "position is no longer in the stream", position=self.position)  # fmt: skip
            return
        row = self.store.con.execute("SELECT body FROM fact_log WHERE seq = $seq",
                                     {"seq": self.position}).fetchone()  # fmt: skip
        if row is not None and row[0].encode() != bytes(message.data or b""):
            raise ProjectorError(
                f"the fact at seq {self.position} in {FACTS_STREAM} is not the one {self.db_path} "
                f"applied: the stream was recreated; rebuild the projection "
                f"(quotasched projections rebuild --db {self.db_path} --nats-url URL)")

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
                    try:
                        await asyncio.wait_for(self._wake.wait(), options.checkpoint_idle_s)
                    except (asyncio.TimeoutError, TimeoutError):
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
                try:
                    await asyncio.wait_for(self._full.wait(), remaining)
                except (asyncio.TimeoutError, TimeoutError):
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

    # -- applying ------------------------------------------------------------------------------

    async def _apply(self, items: list[tuple[int, bytes]]) -> None:
        started = time.perf_counter()
        try:
            applied = self.store.apply(items)  # one transaction; nothing awaits inside
        except projections.FactNotApplicable as failure:
            self._apply_up_to_failure(items, failure)  # raises ProjectorHalted
            applied = 0  # (every fact applied one part at a time after all: go on)
        except duckdb.Error as failure:
            log.error("the projection database failed", db=self.db_path, position=self.position,
                      first_seq=items[0][0], last_seq=items[-1][0], error=str(failure))  # fmt: skip
            raise
        else:
            self._committed(applied, time.perf_counter() - started)
        await self._announce(applied)

    def _checkpoint(self) -> None:
        """Write the write-ahead log into the file while nothing arrives (blocking: requests
        wait, as for a batch)."""
        started = time.perf_counter()
        try:
            self.store.con.execute("CHECKPOINT")
        except duckdb.Error as failure:  # e.g. a conflicting transaction: the next idle spell
            log.debug("checkpoint skipped", error=str(failure))
            return
        self._dirty = False
        log.debug("checkpoint", position=self.position,
                  seconds=round(time.perf_counter() - started, 3))  # fmt: skip

    def _committed(self, applied: int, seconds: float) -> None:
        self._dirty = True
        self.position = self.store.position()
        self.facts_applied += applied
        self.batches += 1
        self.apply_seconds += seconds
        self.apply_latency.observe(seconds)
        self.applied_at = time.time()

    async def _announce(self, applied: int) -> None:
        try:
            await self.nc.publish(APPLIED_SUBJECT, json.dumps({
                "position": self.position, "facts": applied, "at": self.applied_at}).encode())
        except Exception:  # a notification only; readers can always ask for `position`
            pass

    def _try_apply(self, items: list[tuple[int, bytes]]) -> projections.FactNotApplicable | None:
        started = time.perf_counter()
        try:
            applied = self.store.apply(items)
        except projections.FactNotApplicable as failure:
            return failure
        self._committed(applied, time.perf_counter() - started)
        return None

    def _apply_up_to_failure(self, items: list[tuple[int, bytes]],
                             failure: projections.FactNotApplicable) -> None:  # fmt: skip
        """Commit every fact before the first one that cannot be applied, then log it and
        raise ProjectorHalted.  The store names the fact (then one apply of the facts before
        it, one of the fact alone); when it does not, the batch is bisected (each part that
        applies is committed, so the position ends right before the bad fact)."""
        named = failure.problems[0][0] if failure.problems else None
        candidates = items
        if named is not None and any(seq == named for seq, _ in items):
            before = [item for item in items if item[0] < named]
            if not before or self._try_apply(before) is None:
                candidates = [item for item in items if item[0] >= named]
        while len(candidates) > 1:
            half = candidates[: len(candidates) // 2]
            refused = self._try_apply(half)
            if refused is None:
                candidates = candidates[len(half):]
            else:
                candidates, failure = half, refused
        refused = self._try_apply(candidates)
        if refused is None:  # the batch failed as a whole, yet every part applied
            log.warning("a batch was refused as a whole but applied in parts",
                        first_seq=items[0][0], last_seq=items[-1][0], error=str(failure))  # fmt: skip
            return
        failure = refused
        seq, kind, reason = (failure.problems[0] if failure.problems
                             else (candidates[0][0], None, str(failure)))  # fmt: skip
        if kind is None:
            try:
                kind = json.loads(candidates[0][1]).get("kind")
            except (ValueError, AttributeError):
                kind = "?"
        self.position = self.store.position()
        log.error("cannot apply fact: the projector stops", seq=seq, kind=kind, reason=reason,
                  position=self.position, problems=[list(p) for p in failure.problems],
                  db=self.db_path)  # fmt: skip
        raise ProjectorHalted(seq, kind, reason, self.position) from failure

    async def _log_progress(self) -> None:
        try:
            stream_last = await self._stream_last_seq()
        except Exception:
            stream_last = None
        log.info("projector progress", position=self.position, stream_last_seq=stream_last,
                 lag=None if stream_last is None else max(stream_last - self.position, 0),
                 facts_applied=self.facts_applied, batches=self.batches,
                 apply_seconds=round(self.apply_seconds, 3))  # fmt: skip

    # -- answering -----------------------------------------------------------------------------

    async def _on_request(self, msg) -> None:
        # One task per request: a long query must not hold up the next request.
        task = asyncio.create_task(self._answer(msg))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _answer(self, msg) -> None:
        verb = msg.subject[len(API_PREFIX) + 1:]
        try:
            request = json.loads(msg.data) if msg.data else {}
            if not isinstance(request, dict):
                raise api.Refused("the request must be a JSON object")
            api.check_request(verb, request)
            if verb == "position":
                response = await self.describe_position()
            else:
                response = await self._query(verb, request)
        except (api.Refused, ValueError) as refused:
            response = api.error("ClientException", str(refused))
        except duckdb.InterruptException:
            response = api.error("QueryTimeout", f"the query ran longer than "
                                 f"{self.options.query_timeout_s:g} s and was interrupted")  # fmt: skip
        except duckdb.Error as failed:
            response = api.error("QueryFailed", str(failed))
        except Exception as failed:  # a request never takes the projector down
            log.warning("request failed", verb=verb, error=repr(failed))
            response = api.error("ServerException", f"{type(failed).__name__}: {failed}")
        if msg.reply:
            try:
                await msg.respond(api.encode(response, self.nc.max_payload - 512))
            except Exception as failed:  # the requester went away, the connection closed
                log.debug("reply not sent", verb=verb, error=repr(failed))

    async def describe_position(self) -> dict[str, Any]:
        stream_last = await self._stream_last_seq()
        return {"position": self.position, "streamLastSeq": stream_last,
                "lag": max(stream_last - self.position, 0), "factsApplied": self.facts_applied,
                "batches": self.batches, "applySeconds": round(self.apply_seconds, 6),
                "appliedAt": self.applied_at, "db": self.db_path}  # fmt: skip

    async def _query(self, verb: str, request: dict) -> dict[str, Any]:
        async with self._slots:
            if self.store is None or self._stopping:
                raise ProjectorError("the projector is stopping")
            # The cursor is made on the loop thread (never while a batch is applied: the
            # apply does not await), then used only by the worker thread.
            cursor = self.store.con.cursor()
            self._cursors.add(cursor)
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.options.query_timeout_s, cursor.interrupt)
            try:
                return await loop.run_in_executor(self._threads, api.run, cursor, verb, request)
            finally:
                timer.cancel()
                self._cursors.discard(cursor)
                cursor.close()


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
    """How many leading messages of `batch` end on the last fact of a command (0: none do).
    A message without the scheduler's headers counts as a whole command."""
    for index in range(len(batch) - 1, -1, -1):
        headers = batch[index].headers
        if not headers:
            return index + 1
        count = headers.get("Qm-Facts")
        msg_id = headers.get("Nats-Msg-Id")
        if count is None or msg_id is None:
            return index + 1
        try:
            if int(msg_id.rsplit(":", 1)[1]) + 1 >= int(count):
                return index + 1
        except (IndexError, ValueError):
            return index + 1
    return 0


__all__ = ["Projector", "ProjectorError", "ProjectorHalted", "ProjectorOptions"]
