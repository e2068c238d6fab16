"""The scheduler service: the single writer of the fact log.

Per batch of command messages, in this order (DESIGN principle 3):
  1. decide every command on the in-memory state, inside a trial (nothing is final yet);
  2. append all the facts as one atomic batch, fenced on the last fact sequence this writer
     saw (`Nats-Expected-Last-Subject-Sequence` on `qm.fact.>`), with message ids
     `<partition>:<command seq>:<index>` derived from the command's stream sequence;
  3. ack the commands (AckAll: the last one acks the batch);
  4. commit the trial: the state advances.
If the append is refused or its outcome is unknown, the trial is undone, the writer steps down
and, on its next term, rebuilds from the log, where it finds every fact that did land.  A
command whose sequence is at or below the last one recorded in the log is acked without being
decided again: every command is decided exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time

from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events.codec import encode
from events.facts import Fact
from events.subjects import API_PREFIX, COMMANDS_PREFIX, COMMANDS_STREAM, command_subject, fact_subject
from services import logs
from services.bus import AppendRefused, Fenced, append_atomic, ensure_streams
from services.scheduler.api import answer
from services.scheduler.lease import Lease
from services.scheduler.log import ALL_FACTS, Recovered, recover, save_snapshot, stream_seq
from services.scheduler.routing import decide_message
from services.settings import Settings

log = logs.get("quotasched.scheduler")


class SteppedDown(Exception):
    pass


class Scheduler:
    def __init__(self, nc: Client, settings: Settings, holder: str | None = None):
        self.nc = nc
        self.js = nc.jetstream()
        self.settings = settings
        self.partition = settings.partition
        self.lease = Lease(self.js, self.partition, settings.lease_ttl_s, holder)
        self.recovered: Recovered | None = None
        self.lock = asyncio.Lock()  # readers never see a state in the middle of a trial
        self.leading = asyncio.Event()
        self.commands_decided = 0
        self.facts_appended = 0
        self._since_snapshot = 0

    # -- terms of office ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await ensure_streams(self.js, self.settings)
        while not stop.is_set():
            if await self.lease.acquire():
                log.info("leading", partition=self.partition, holder=self.lease.holder)
                try:
                    await self._lead(stop)
                except SteppedDown as reason:
                    log.warning("stepped down", partition=self.partition, reason=str(reason))
                finally:
                    self.leading.clear()
                if stop.is_set():
                    await self.lease.release()
            else:
                await _sleep_or(stop, self.settings.lease_ttl_s / 4)

    async def _lead(self, stop: asyncio.Event) -> None:
        self.recovered = await recover(self.js, self.partition)
        log.info("recovered", fact_seq=self.recovered.fact_seq,
                 decided_through=self.recovered.decided_through)  # fmt: skip
        inbox: asyncio.Queue = asyncio.Queue()

        async def deliver(msg) -> None:
            inbox.put_nowait(msg)

        consumer = ConsumerConfig(
            durable_name=f"scheduler-{self.partition}", deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.ALL, ack_wait=30.0, max_ack_pending=self.settings.max_ack_pending,
            filter_subject=f"{COMMANDS_PREFIX}.>",
        )  # fmt: skip
        sub = await self.js.subscribe(
            f"{COMMANDS_PREFIX}.>", cb=deliver, durable=consumer.durable_name, config=consumer,
            stream=COMMANDS_STREAM, manual_ack=True, flow_control=True, idle_heartbeat=5.0,
            pending_msgs_limit=self.settings.max_ack_pending * 2,
        )  # fmt: skip
        api = await self.nc.subscribe(f"{API_PREFIX}.>", queue="qm-api", cb=self._on_request)
        self.leading.set()
        tasks = [asyncio.create_task(self._renew(stop)), asyncio.create_task(self._tick(stop))]
        try:
            while not stop.is_set():
                getter = asyncio.create_task(inbox.get())
                stopper = asyncio.create_task(stop.wait())
                done, _ = await asyncio.wait({getter, stopper, *tasks},
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                stopper.cancel()
                if getter not in done:
                    getter.cancel()
                    for task in tasks:
                        if task in done:
                            task.result()  # re-raises SteppedDown
                    continue
                batch = [getter.result()]
                while len(batch) < self.settings.batch_commands and not inbox.empty():
                    batch.append(inbox.get_nowait())
                await self._decide_batch(batch)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await api.unsubscribe()
            try:
                await sub.unsubscribe()
            except Exception:  # the connection may be gone; the consumer stays durable
                pass

    # -- the single writer -------------------------------------------------------------------

    async def _decide_batch(self, batch: list) -> None:
        recovered = self.recovered
        state = recovered.state
        out: list[tuple[str, bytes, dict[str, str]]] = []
        decided = recovered.decided_through
        async with self.lock:
            with state.trial() as trial:
                for msg in batch:
                    seq = stream_seq(msg)
                    if seq <= decided:
                        continue  # decided before a restart: its facts are in the log
                    stamp = msg.metadata.timestamp.timestamp()
                    facts = decide_message(state, msg.subject, msg.data, seq, stamp)
                    count = str(len(facts))  # lets a waiting client know it has them all
                    for index, fact in enumerate(facts):
                        headers = {"Nats-Msg-Id": f"{self.partition}:{seq}:{index}", "Qm-Facts": count}
                        out.append((self._subject(fact), encode(fact).encode(), headers))
                    if facts:
                        decided = seq
                    if facts and facts[0].kind == "CommandRejected":
                        log.info("command rejected", stream_seq=seq, subject=msg.subject,
                                 reason=facts[0].status_reason)  # fmt: skip
                if out:
                    if not self.lease.valid():
                        raise SteppedDown("lease expired before the append")
                    fence = Fenced(ALL_FACTS, recovered.fact_seq)
                    try:
                        last = await append_atomic(self.nc, out, fence, self.settings.publish_timeout_s)
                    except AppendRefused as refused:
                        raise SteppedDown(f"fact log refused the append ({refused})") from None
                    except (asyncio.TimeoutError, TimeoutError):
                        raise SteppedDown("append outcome unknown (timeout)") from None
                    recovered.fact_seq = last
                await batch[-1].ack()
                trial.commit()
        recovered.decided_through = decided
        self.commands_decided += len(batch)
        self.facts_appended += len(out)
        self._since_snapshot += len(out)
        if self._since_snapshot >= self.settings.snapshot_every:
            self._since_snapshot = 0
            async with self.lock:
                await save_snapshot(self.js, self.partition, recovered)
            log.info("snapshot written", fact_seq=recovered.fact_seq)

    def _subject(self, fact: Fact) -> str:
        queue = getattr(fact, "job_queue", None)
        share = getattr(fact, "quota_share_name", None)
        if queue is None and getattr(fact, "job_id", None):
            job = self.recovered.state.jobs.get(fact.job_id)
            if job is not None:
                queue, share = job.queue, job.share
        return fact_subject(fact.kind, queue, share)

    # -- helpers of a term -------------------------------------------------------------------

    async def _renew(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _sleep_or(stop, self.settings.lease_ttl_s / 4)
            if not await self.lease.renew():
                raise SteppedDown("lease lost to another instance")

    async def _tick(self, stop: asyncio.Event) -> None:
        """Time is data: ticks go through the command stream, so timers replay too."""
        interval = self.settings.tick_interval_s
        subject = command_subject("Tick")
        while not stop.is_set():
            await _sleep_or(stop, interval)
            slot = int(time.time() / interval)
            try:
                await self.js.publish(subject, b'{"kind":"Tick"}', stream=COMMANDS_STREAM,
                                      headers={"Nats-Msg-Id": f"tick:{self.partition}:{slot}"})  # fmt: skip
            except Exception as error:  # a missed tick only delays timers to the next one
                log.warning("tick not published", error=str(error))

    async def _on_request(self, msg) -> None:
        verb = msg.subject[len(API_PREFIX) + 1:]
        try:
            request = json.loads(msg.data or b"{}")
            async with self.lock:
                response = answer(self.recovered.state, verb, request)
        except Exception as error:  # a bad request gets an error, never a crash
            response = {"error": {"type": "ClientException", "message": str(error)}}
        if msg.reply:
            await msg.respond(json.dumps(response).encode())


async def _sleep_or(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except (asyncio.TimeoutError, TimeoutError):
        pass
