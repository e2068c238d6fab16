"""The scheduler's single writer: decide a batch of commands, append its facts, ack.

Per batch of command messages:
  1. decide every new command with the pure core, folding its facts into the state;
  2. append the facts, pipelined, each fenced on the sequence the one before it must have got
     (`Nats-Expected-Last-Subject-Sequence` on `qm.fact.>`, which only this writer appends
     to), with message ids `<partition>:<command seq>:<index>` derived from the command's
     stream sequence;
  3. once every fact of the batch is stored, ack the commands (AckAll on the last one).
The next batch is decided while the previous one is being stored, so the state may run up to
two batches ahead of the log; if an append is refused (a newer leader exists) or its outcome
is unknown, the writer raises SteppedDown and the service drops its state (service.py).

A batch that fails to land is diagnosed before stepping down (`_diagnose`): only the last
message of a pipelined append asks for an answer, so "wrong last sequence" there often means
an earlier message of ours was refused or, on a full disk, silently dropped.  The first
message not stored is tried alone, and its answer says which: a fence (another writer), a
full store ("disk full": logged, counted, /healthz unhealthy until an append lands again),
the server unavailable, or the message itself refused.  A command whose facts the bus cannot
carry is recorded as refused (refusals.py) instead of being retried forever.

Every refused command is a CommandRejected fact, but its log line is bounded (`RefusalLog`,
refusals.py): per job queue and quota share, the first 5 refusals of each 10 s window are
logged in full ("command rejected"), the rest summed up in one "commands rejected" line.

`Writer` is a part of `Scheduler` (service.py), which holds the attributes it uses.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from dataclasses import dataclass

import nats.errors
from nats.js.errors import NotFoundError

from quotasched.events.codec import encode_bytes
from quotasched.events.subjects import FACTS_STREAM, parse_command_subject
from quotasched.services import logs
from quotasched.services.nats.bus import (
    COMMAND,
    DISK_FULL,
    FENCE,
    UNAVAILABLE,
    AppendRefused,
    FactAppender,
    message_size,
)
from quotasched.services.scheduler.core import catch_up_clock
from quotasched.services.nats.log import sequence_and_time
from quotasched.services.scheduler.log import save_snapshot
from quotasched.services.scheduler.snapshots import SnapshotMismatch, capture_snapshot
from quotasched.services.scheduler.refusals import RefusalLog, StoryLog, refuse_message
from quotasched.services.scheduler.routing import decide_message, fact_subject_of

FREEZE_EVERY = 4096  # decided commands between two gc.freeze() calls


def freeze_now(before: int, after: int) -> bool:
    """Freeze what the process holds whenever the decided commands pass a multiple of
    FREEZE_EVERY.  The state is many long-lived objects (jobs, their tags, the read index):
    left in the collector's oldest generation, every full collection rescans them all, a pause
    of tens of ms that whichever decision is waiting pays (read_pressure_bench: p99 under
    reads 76-83 ms without, 16-19 ms with).  Frozen objects are still freed when their last
    reference goes (a job retention forgets); the core's objects hold no cycles (jobs name
    their queue and share, they do not point at them), so nothing of it is kept for good."""
    if after // FREEZE_EVERY == before // FREEZE_EVERY:
        return False
    gc.freeze()
    return True

log = logs.get("quotasched.scheduler")

# Tries of a command whose facts the server refuses before it is recorded as refused.
REFUSALS_BEFORE_REJECT = 3
DISK_FULL_LOG_EVERY_S = 60.0  # while the disk stays full, the error is repeated this often
DISK_FULL_REMEDY = ("free space on the nats-server's JetStream store (or raise its "
                    "max_file_store); a stream that hit a write error stays failed until "
                    "nats-server restarts; see docs/operations.md, 'Disk full'")  # fmt: skip


PROBE_TIMEOUT_S = 2.0  # reading the log's end while diagnosing a failed append
# Digits enough for any command sequence and fact index: the writer's headers of a fact take
# at most this (`_fits_below`); only a payload near the bus's limit is measured exactly.
_WIDEST = "9" * 20


class SteppedDown(Exception):
    pass


@dataclass
class InFlight:
    """A decided batch whose facts are on their way to the log."""

    futures: list[asyncio.Future]
    last_message: object  # the batch's last command message: acking it acks the batch
    decided_through: int
    facts: int
    out: list  # the appended (subject, payload, headers), counted once stored


class WriterHealth:
    """What the writer knows about the fact log's store, for /healthz and the metrics; kept
    by the `Scheduler` across terms (a term ends on every failed append)."""

    def __init__(self) -> None:
        self.storage_full: str | None = None  # why, while appends fail for a full store
        self.full_since = 0.0
        self._logged_at = 0.0
        self.refusal_tries: Counter = Counter()  # command seq -> tries the server refused
        self.log_refusals: dict[int, str] = {}  # command seq -> cause: record it as refused

    def full(self, partition: str, detail: str) -> None:
        """Say plainly, and again every minute while it lasts, that the disk is full."""
        now = time.monotonic()
        if self.storage_full is None:
            self.full_since = now
        if self.storage_full is None or now - self._logged_at >= DISK_FULL_LOG_EVERY_S:
            log.error("disk full: the fact log cannot store the scheduler's facts; commands "
                      "wait, nothing acknowledged is lost", partition=partition, cause=detail,
                      remedy=DISK_FULL_REMEDY)  # fmt: skip
            self._logged_at = now
        self.storage_full = detail

    def landed(self, partition: str) -> None:
        if self.storage_full is not None:
            log.info("disk space back: facts are stored again", partition=partition,
                     seconds_full=round(time.monotonic() - self.full_since, 1))  # fmt: skip
            self.storage_full = None


class Uncounted:
    """The writer's per-batch counts when nobody reads them (no metrics endpoint): the
    composition root hands the scheduler a `metrics.WriterStats` instead when it serves
    metrics, so the scheduler never imports the metrics package."""

    class _Seconds:
        def observe(self, seconds: float) -> None:
            pass

    decide_seconds = _Seconds()

    def landed(self, out) -> None:
        pass

    def append_failed(self, cause: str) -> None:
        pass


class Writer:
    """The term's write loop and everything it does per batch (a part of `Scheduler`)."""

    _refusals: RefusalLog | None = None  # the term's (`_write`)
    _story: StoryLog | None = None

    async def _write(self, inbox: asyncio.Queue, stop: asyncio.Event, tasks,
                     appender: FactAppender) -> None:  # fmt: skip
        """The term's batches, pipelined: decide one while the one before is being stored."""
        self._appender = appender
        self._log_end = self.recovered.log_end  # where the next batch's facts must follow
        self._refusals = RefusalLog(log)  # "command rejected" lines, bounded per share
        self._story = StoryLog(log)  # "dispatched" / "preempted" lines, bounded per share
        try:
            await self._write_batches(inbox, stop, tasks, appender)
        finally:
            self._refusals.close()  # the summaries of refusals not logged in full
            self._story.close()

    async def _write_batches(self, inbox: asyncio.Queue, stop: asyncio.Event, tasks,
                             appender: FactAppender) -> None:  # fmt: skip
        inflight: InFlight | None = None
        while not stop.is_set():
            if self._handing_over:  # to another process: land what is in flight, then go
                if inflight is not None:
                    await self._land(inflight)
                log.info("handing over", partition=self.partition,
                         decided_through=self.recovered.decided_through)  # fmt: skip
                return
            batch = await self._next_batch(inbox, stop, tasks, idle=inflight is None)
            if batch is None:  # nothing new: make what is in flight durable first
                if inflight is not None:
                    await self._land(inflight)
                    inflight = None
                continue
            if inflight is not None and self._snapshot_due():
                # Under a steady backlog the state always runs a batch ahead of the log;
                # drain the pipeline once so the snapshot is exactly the log.
                await self._land(inflight)
                inflight = None
            started = time.perf_counter()
            out, decided = self._decide_batch(batch)
            self.stats.decide_seconds.observe(time.perf_counter() - started)
            if not self.lease.valid():
                raise SteppedDown("lease expired before the append")
            futures = await appender.append(out) if out else []
            if inflight is not None:
                await self._land(inflight)
            inflight = InFlight(futures, batch[-1], decided, len(out), out)
            if inbox.empty():
                await self._land(inflight)
                inflight = None

    async def _next_batch(self, inbox: asyncio.Queue, stop: asyncio.Event, tasks, idle: bool):
        """Up to `batch_commands` messages; None when nothing came and a batch is in flight."""
        if inbox.empty() and not idle:
            return None
        getter = asyncio.create_task(inbox.get())
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({getter, stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if getter not in done:
            getter.cancel()
            for task in tasks:
                if task in done:
                    task.result()  # re-raises SteppedDown
            return None
        batch = [getter.result()]
        while len(batch) < self.settings.batch_commands and not inbox.empty():
            batch.append(inbox.get_nowait())
        return batch

    def _decide_batch(self, batch: list) -> tuple[list[tuple[str, bytes, dict[str, str]]], int]:
        """Decide every new command of the batch, folding its facts into the state at once.

        The state runs ahead of the log by at most two batches; if an append fails, this
        leader steps down and its state is dropped (the next term rebuilds from the log).

        Per command this is the core's decision, its facts' subjects and bytes, and their
        headers: a refusal (one small CommandRejected, the flooding tenant's lot) pays for
        nothing else (issue 29): its subject is parsed once, its size is measured only if it
        could be near the bus's limit, and its log line is bounded per share (`RefusalLog`).
        """
        recovered = self.recovered
        state = recovered.state
        out: list[tuple[str, bytes, dict[str, str]]] = []
        decided = recovered.decided_through
        partitioned = self.scope.token is not None
        log_refusals = self.health.log_refusals
        refusals = self._refusals
        if refusals is None:  # deciding outside a term's `_write` (a benchmark, a test)
            refusals = self._refusals = RefusalLog(log)
        story = self._story
        if story is None:
            story = self._story = StoryLog(log)
        partition = self.partition
        fits_below = self._fits_below()
        for msg in batch:
            seq, stamp = sequence_and_time(msg)
            if seq <= recovered.commands_through:
                if seq == recovered.decided_through:
                    # the clock it left, not just its facts (a refusal left it as it was)
                    catch_up_clock(state, msg.data, stamp, refused=recovered.last_refused, bus=True)
                continue  # in the state already (recorded, or decided without a fact of ours)
            subject = msg.subject
            parsed = parse_command_subject(subject)
            refusal = log_refusals.get(seq) if log_refusals else None
            if refusal is not None:  # the log refused its facts before: record the refusal
                facts = refuse_message(state, subject, msg.data, seq, refusal)
            else:
                facts = decide_message(state, subject, msg.data, seq, stamp, parsed)
            recovered.commands_through = seq
            queue, share, _ = parsed
            route = (queue, share)
            subjects, skip = None, 0
            if partitioned or recovered.partial is not None:
                facts, subjects, skip = self._own_part(seq, facts, route)
            count = str(len(facts))  # lets readers know when they have all of a command
            for index, fact in enumerate(facts):  # encoded, headed and routed in one pass
                if index < skip:
                    continue
                payload = encode_bytes(fact)
                headers = {"Nats-Msg-Id": f"{partition}:{seq}:{index}", "Qm-Facts": count}
                if len(payload) > fits_below:
                    self._check_fits(seq, subject, fact.kind, payload, headers)
                subject_out = fact_subject_of(state, fact, route) if subjects is None \
                    else subjects[index]
                out.append((subject_out, payload, headers))
            if facts:
                decided = seq
                recovered.decided_through = seq
                first = facts[0]
                recovered.last_refused = rejected = first.kind == "CommandRejected"
                if rejected:
                    refusals.rejected(seq, subject, queue, share, first)
                else:  # a term that fails to store them decides (and tells) them again
                    story.decided(seq, facts, state.jobs)
        before = self.commands_decided
        self.commands_decided += len(batch)
        freeze_now(before, self.commands_decided)
        return out, decided

    def _own_part(self, seq: int, facts: list, route: tuple) -> tuple[list, list[str], int]:
        """What this writer records of command `seq`'s facts: only its own part when it is one
        partition among several, with their subjects; and how many of them a dead leader
        appended already (the first command of a term after a crash)."""
        state = self.recovered.state
        subjects = [fact_subject_of(state, fact, route) for fact in facts]
        if self.scope.token is not None:  # one partition among several: only our own part
            mine = [(f, s) for f, s in zip(facts, subjects) if self.scope.owns(s)]
            facts, subjects = [f for f, _ in mine], [s for _, s in mine]
        skip = 0
        if self.recovered.partial is not None:
            skip = self._already_logged(seq, [encode_bytes(fact) for fact in facts])
        return facts, subjects, skip

    def _fits_below(self) -> int:
        """The largest fact payload that fits the bus whatever its headers (`_check_fits`
        measures only those above it)."""
        limit = min(self.nc.max_payload, self.settings.streams.max_msg_size)
        widest = {"Nats-Msg-Id": f"{self.partition}:{_WIDEST}:{_WIDEST}", "Qm-Facts": _WIDEST}
        return limit - message_size(b"", widest)

    def _check_fits(self, seq: int, subject: str, kind: str, payload: bytes,
                    headers: dict[str, str]) -> None:  # fmt: skip
        """Refuse, at once, a command one of whose facts the bus cannot carry.

        Sending it would fail the same way every time (nats-py refuses a payload over the
        server's max_payload; with its headers over it, the server drops the connection): so
        the command is marked to be recorded as refused, and this term ends, because the state
        already holds its decision; the next term rebuilds from the log and refuses it."""
        limit = min(self.nc.max_payload, self.settings.streams.max_msg_size)
        size = message_size(payload, headers)
        if size <= limit:
            return
        cause = (f"its {kind} fact needs {size} bytes on the bus with its headers, over the "
                 f"limit of {limit} bytes: the server's max_payload {self.nc.max_payload}, the "
                 f"fact stream's max_msg_size {self.settings.streams.max_msg_size}")  # fmt: skip
        self._refuse_later(seq, subject, cause)
        raise SteppedDown(f"command {seq} cannot be recorded ({cause}); it will be refused")

    def _refuse_later(self, seq: int, subject: str, cause: str) -> None:
        """Mark command `seq` to be recorded as refused by the next term, loudly."""
        self.health.log_refusals[seq] = cause
        log.error("command refused by the fact log: it will be recorded as CommandRejected "
                  "and the scheduler moves on", partition=self.partition, stream_seq=seq,
                  subject=subject, cause=cause)  # fmt: skip

    def _already_logged(self, seq: int, encoded: list[bytes]) -> int:
        """How many leading facts of command `seq` a dead leader already appended."""
        partial = self.recovered.partial
        if partial is None or partial[0] != seq:
            return 0
        self.recovered.partial = None
        logged = partial[1]
        if encoded[: len(logged)] != logged:
            raise SteppedDown(f"re-deciding command {seq} gave other facts than the log holds")
        return len(logged)

    async def _land(self, inflight: InFlight) -> None:
        """Wait for a batch's facts to be stored, then ack its commands."""
        if inflight.futures:
            try:
                await asyncio.wait_for(asyncio.gather(*inflight.futures),
                                       self.settings.publish_timeout_s)  # fmt: skip
            except AppendRefused as refused:
                await self._failed(inflight, f"fact log refused the append ({refused})")
            except (asyncio.TimeoutError, TimeoutError):
                await self._failed(inflight, "append outcome unknown (timeout)")
            self.recovered.fact_seq = self._log_end = inflight.futures[-1].result()
            self.health.landed(self.partition)
        await inflight.last_message.ack()
        self._durable_through = inflight.decided_through
        self.facts_appended += inflight.facts
        self.stats.landed(inflight.out)
        self._since_snapshot += inflight.facts
        if self._snapshot_due() and self._caught_up():
            self._since_snapshot = 0
            started = time.perf_counter()
            # now: the state equals the log
            capture = capture_snapshot(self.recovered, self._snapshot_chain)
            self._snapshotting = asyncio.create_task(
                self._snapshot(self.recovered.fact_seq, capture, started))

    async def _failed(self, inflight: InFlight, failure: str) -> None:
        """A batch did not land: find out why, act on it, and end the term (SteppedDown)."""
        cause, detail, seq = await self._diagnose(inflight)
        self.stats.append_failed(cause)
        if cause == DISK_FULL:
            self.health.full(self.partition, detail)
            raise SteppedDown(f"disk full: {detail}")
        if cause == COMMAND and seq is not None:
            tries = self.health.refusal_tries[seq] = self.health.refusal_tries[seq] + 1
            log.error("the fact log refuses a command's facts", partition=self.partition,
                      stream_seq=seq, tries=tries, cause=detail)  # fmt: skip
            if tries >= REFUSALS_BEFORE_REJECT:
                self._refuse_later(seq, "", detail)
        raise SteppedDown(f"{failure}; diagnosed: {cause}: {detail}")

    async def _diagnose(self, inflight: InFlight) -> tuple[str, str, int | None]:
        """(cause, detail, command seq or None) of a batch that did not land.

        Reads where the log ends: if another writer appended there, it is a fence.  Else the
        first of our messages not stored is appended alone, fenced where the log ends, and
        the server's answer to it is the cause.  No answer while the server answers reads is
        nats-server's way of failing a write to its store: a full disk, nearly always."""
        if not self.lease.valid():
            return FENCE, "the lease ran out before the diagnosis", None
        try:
            last = await asyncio.wait_for(
                self.js.get_last_msg(FACTS_STREAM, self.scope.fact_filter), PROBE_TIMEOUT_S)
            end, last_id = last.seq, (last.headers or {}).get("Nats-Msg-Id")
        except NotFoundError:
            end, last_id = 0, None
        except Exception as error:  # no leader for the stream, a lost connection
            return UNAVAILABLE, f"the log's end could not be read ({error!r})", None
        ids = [headers["Nats-Msg-Id"] for _, _, headers in inflight.out]
        if last_id in ids:
            first = ids.index(last_id) + 1
        elif end == self._log_end:
            first = 0
        else:
            return FENCE, f"the log ends at {end}, which this writer did not append", None
        if first >= len(ids):
            return UNAVAILABLE, "every fact was stored after all; the answer was lost", None
        seq = int(ids[first].split(":")[1])
        try:
            await self._appender.probe(inflight.out[first], end, self.settings.publish_timeout_s)
        except AppendRefused as refused:
            return refused.cause, f"the server answered {refused}", seq
        except (asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError):
            if await self._answers_reads():
                return DISK_FULL, ("the server answers reads but stored nothing and sent no "
                                   "answer to a write, which nats-server does after a write "
                                   "error on its store (no space left on device)"), seq  # fmt: skip
            return UNAVAILABLE, "the server does not answer", seq
        except nats.errors.Error as error:
            return UNAVAILABLE, f"the probe failed ({error!r})", seq
        return UNAVAILABLE, "the fact was stored when sent alone (a passing failure)", seq

    async def _answers_reads(self) -> bool:
        try:
            await asyncio.wait_for(self.js.stream_info(FACTS_STREAM), PROBE_TIMEOUT_S)
        except Exception:
            return False
        return True

    async def _snapshot(self, fact_seq: int, capture, started: float) -> None:
        """Store a captured snapshot while the writer goes on."""
        try:
            timings: dict[str, float] = {}
            size = await save_snapshot(self.nc, self.partition, capture, timings)
        except SnapshotMismatch as error:  # a bug in the core's marks: say so loudly
            log.error("snapshot not written", fact_seq=fact_seq, error=str(error))
            return
        except Exception as error:  # a missed snapshot only lengthens the next restart
            log.warning("snapshot not written", fact_seq=fact_seq, error=repr(error))
            return
        chain = self._snapshot_chain
        log.info("snapshot written", fact_seq=fact_seq, bytes=size, blocks=len(chain.frames),
                 copied=chain.copied,
                 seconds=round(time.perf_counter() - started, 3),
                 encoded_s=round(timings["encoded"] - started, 3),
                 stored_s=round(timings["stored"] - timings["encoded"], 3))  # fmt: skip

    def _snapshot_due(self) -> bool:
        """Enough facts since the last snapshot, and that one is stored (one at a time)."""
        storing = self._snapshotting is not None and not self._snapshotting.done()
        return self._since_snapshot >= self.settings.snapshot_every and not storing

    def _caught_up(self) -> bool:
        """Is the in-memory state exactly the log (nothing decided but not yet landed)?"""
        return self._durable_through == self.recovered.decided_through
