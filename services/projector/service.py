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

A large backlog at start (at least `bulk_catch_up` facts: a fresh file on an existing log, a
file rebuilt after a schema change, a projector that was down) is first read to the last
whole command, spooled beside the file and projected like a rebuild, a transaction per run
of consecutive sequences (`bulk.py`); requests are answered meanwhile, and then it follows
the log as below.

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

A file of another projection schema version (an upgrade changed a table, view or macro) is
deleted and rebuilt from the log's first fact, with a warning, unless
`rebuild_on_schema_change` is off; a file that is not a projection at all is never touched.

A fact the projection cannot apply stops the projector: the facts before it (in its batch) are
applied, so the position ends right before it, an error naming its sequence and the reason is
logged, and `run` raises `ProjectorHalted`.  Nothing is ever skipped.

The parts: `options.py` (ProjectorOptions), `errors.py` (ProjectorError, ProjectorHalted),
`bulk.py` (a large backlog at start, spooled), `reading.py` (the ordered consumer and the
batching loop), `applying.py` (one transaction per batch, the halt on a fact that cannot be
applied), `answering.py` (request/reply), and this module: the `Projector` that holds their
state and runs them (start, stop, the log check).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from quotasched import projections
from quotasched.events.subjects import FACTS_STREAM
from quotasched.projections import store as store_module
from quotasched.projections.rebuild import discard
from quotasched.services import logs
from quotasched.services.metrics import APPLY_BUCKETS, Histogram
from quotasched.services.projector import API_PREFIX, QUEUE_GROUP
from quotasched.services.projector.answering import AnsweringMixin
from quotasched.services.projector.applying import ApplyingMixin
from quotasched.services.projector.bulk import BulkMixin, allow_spool
from quotasched.services.projector.errors import ProjectorError, ProjectorHalted
from quotasched.services.projector.options import ProjectorOptions
from quotasched.services.projector.reading import ReadingMixin

log = logs.get("quotasched.projector")


class Projector(ReadingMixin, BulkMixin, ApplyingMixin, AnsweringMixin):
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
        self.store = self._open_store()  # ProjectionLocked, ProjectionError
        watcher = asyncio.create_task(self._watch(stop))
        try:
            # Reads run on cursors of this connection: no files, no ATTACH, no extensions
            # (but the spool of a bulk catch-up, which the projector itself reads).
            allow_spool(self.store.con, self.db_path)
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
            self.ready.set()
            await self._catch_up_in_bulk(stream_last)  # a large backlog: like a rebuild
            if not self._stopping:
                await self._subscribe(self.position + 1)
                await self._consume()
        finally:
            watcher.cancel()
            await self._close()

    def _open_store(self) -> store_module.ProjectionStore:
        """The projection file; one of another schema version is replaced by a fresh file that
        the log then fills from its first fact (projections are disposable: a new version is
        rebuilt, never migrated), unless `rebuild_on_schema_change` is off."""
        try:
            return projections.open(self.db_path)
        except projections.SchemaMismatch as mismatch:
            if not self.options.rebuild_on_schema_change:
                raise
            log.warning("projection schema changed: rebuilding the file from the log",
                        db=self.db_path, reason=str(mismatch))  # fmt: skip
        discard(self.db_path)
        return projections.open(self.db_path)

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


__all__ = ["Projector", "ProjectorError", "ProjectorHalted", "ProjectorOptions"]
