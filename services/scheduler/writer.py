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

`Writer` is a part of `Scheduler` (service.py), which holds the attributes it uses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from events.codec import encode_bytes
from events.subjects import parse_command_subject
from services import logs
from services.bus import AppendRefused, FactAppender
from services.scheduler.core import catch_up_clock
from services.scheduler.log import capture_snapshot, save_snapshot, sequence_and_time
from services.scheduler.routing import decide_message, fact_subject_of

log = logs.get("quotasched.scheduler")


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


class Writer:
    """The term's write loop and everything it does per batch (a part of `Scheduler`)."""

    async def _write(self, inbox: asyncio.Queue, stop: asyncio.Event, tasks,
                     appender: FactAppender) -> None:  # fmt: skip
        """The term's batches, pipelined: decide one while the one before is being stored."""
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
        """
        recovered = self.recovered
        state = recovered.state
        out: list[tuple[str, bytes, dict[str, str]]] = []
        decided = recovered.decided_through
        scope = self.scope
        for msg in batch:
            seq, stamp = sequence_and_time(msg)
            if seq <= recovered.commands_through:
                if seq == recovered.decided_through:
                    catch_up_clock(state, msg.data, stamp)  # the clock it left, not just its facts
                continue  # in the state already (recorded, or decided without a fact of ours)
            facts = decide_message(state, msg.subject, msg.data, seq, stamp)
            recovered.commands_through = seq
            route = parse_command_subject(msg.subject)[:2]
            subjects = [fact_subject_of(state, fact, route) for fact in facts]
            if scope.token is not None:  # one partition among several: only our own part
                mine = [(f, s) for f, s in zip(facts, subjects) if scope.owns(s)]
                facts, subjects = [f for f, _ in mine], [s for _, s in mine]
            encoded = [encode_bytes(fact) for fact in facts]
            skip = self._already_logged(seq, encoded)
            count = str(len(facts))  # lets readers know when they have all of a command
            for index, (subject, payload) in enumerate(zip(subjects, encoded)):
                if index < skip:
                    continue
                headers = {"Nats-Msg-Id": f"{self.partition}:{seq}:{index}", "Qm-Facts": count}
                out.append((subject, payload, headers))
            if facts:
                decided = seq
                recovered.decided_through = seq
                if facts[0].kind == "CommandRejected":
                    queue, share, _ = parse_command_subject(msg.subject)
                    log.info("command rejected", stream_seq=seq, job_queue=queue,
                             quota_share=share, job_id=getattr(facts[0], "job_id", None),
                             subject=msg.subject, reason=facts[0].status_reason)  # fmt: skip
        self.commands_decided += len(batch)
        return out, decided

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
                raise SteppedDown(f"fact log refused the append ({refused})") from None
            except (asyncio.TimeoutError, TimeoutError):
                raise SteppedDown("append outcome unknown (timeout)") from None
            self.recovered.fact_seq = inflight.futures[-1].result()
        await inflight.last_message.ack()
        self._durable_through = inflight.decided_through
        self.facts_appended += inflight.facts
        self.stats.landed(inflight.out)
        self._since_snapshot += inflight.facts
        if self._snapshot_due() and self._caught_up():
            self._since_snapshot = 0
            started = time.perf_counter()
            capture = capture_snapshot(self.recovered)  # now: the state equals the log
            self._snapshotting = asyncio.create_task(
                self._snapshot(self.recovered.fact_seq, capture, started))

    async def _snapshot(self, fact_seq: int, capture, started: float) -> None:
        """Store a captured snapshot while the writer goes on."""
        try:
            size = await save_snapshot(self.js, self.partition, capture)
        except Exception as error:  # a missed snapshot only lengthens the next restart
            log.warning("snapshot not written", fact_seq=fact_seq, error=repr(error))
            return
        log.info("snapshot written", fact_seq=fact_seq, bytes=size,
                 seconds=round(time.perf_counter() - started, 3))  # fmt: skip

    def _snapshot_due(self) -> bool:
        """Enough facts since the last snapshot, and that one is stored (one at a time)."""
        storing = self._snapshotting is not None and not self._snapshotting.done()
        return self._since_snapshot >= self.settings.snapshot_every and not storing

    def _caught_up(self) -> bool:
        """Is the in-memory state exactly the log (nothing decided but not yet landed)?"""
        return self._durable_through == self.recovered.decided_through
