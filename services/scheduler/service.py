"""The scheduler service: one partition's terms of office as the single writer of its fact log.

An instance follows the log as a standby (a warm state), takes the partition's lease, and
leads: it starts a term from the latest snapshot plus the log, consumes the commands from the
last one the log records, and writes (writer.py: decide a batch, append its facts fenced and
pipelined, ack).  If an append is refused (a newer leader exists) or its outcome is unknown,
this leader steps down and drops its state, and the next term rebuilds from the latest
snapshot plus the log.  A term starts its consumer right after the last command the log
records, re-decides a command whose facts a dead leader only partly appended and appends the
rest, so every command is decided exactly once and recorded whole.  Beside the writer a term
renews the lease, publishes ticks and answers read requests from its state.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, KeyWrongLastSequenceError, NotFoundError

from quotasched.events.subjects import API_PREFIX, COMMANDS_STREAM, FACTS_STREAM, parse_api_subject
from quotasched.services import logs
from quotasched.services.nats import natsfix
from quotasched.services.nats.bus import DISK_FULL, FactAppender, ensure_streams, refusal_cause
from quotasched.services.nats.log import LogReadStalled
from quotasched.services.nats.waits import sleep_or
from quotasched.services.scheduler import core
from quotasched.services.scheduler.api import JobPage, answer_in
from quotasched.services.scheduler.core.timers import earliest_due
from quotasched.services.scheduler.lease import Lease
from quotasched.services.scheduler.log import LogIncomplete, Recovered, recover
from quotasched.services.scheduler.members import Members
from quotasched.services.scheduler.mode import claim_mode
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.reads import INDEX_CHUNK, ReadIndex
from quotasched.services.scheduler.snapshots import SnapshotChain
from quotasched.services.scheduler.writer import SteppedDown, Uncounted, Writer, WriterHealth
from quotasched.services.settings import Settings

log = logs.get("quotasched.scheduler")

TICK = b'{"kind":"Tick"}'
READ_LIGHT_S = 0.002  # a read that took longer is heavy: the next waits (see `_on_request`)
READ_REST_MAX_S = 0.1  # the longest rest after a heavy read
HEAVY_VERBS = frozenset({"list-service-jobs"})  # answered in turn by one task; the rest at once
HEAVY_WAITING = 64  # list requests waiting at most; beyond, one is told to come back later
CONSUMER_CHECK_S = 3.0  # how often a term asks whether its command consumer still exists


class Scheduler(Writer):
    def __init__(self, nc: Client, settings: Settings, holder: str | None = None,
                 partition: Partition | None = None, members: Members | None = None,
                 reclaim: bool = False):  # fmt: skip
        """`holder`, `reclaim`: an instance lock's holder, whose own lease this instance takes
        back at once after a crash (instance.py); without them a random holder."""
        self.nc = nc
        self.js = nc.jetstream()
        self.settings = settings
        self.scope = partition or Partition.single(settings.partition)
        self.partition = self.scope.name
        self.lease = Lease(self.js, self.partition, settings.lease_ttl_s, holder, reclaim)
        self.members = members  # the processes sharing partitions per job queue (members.py)
        self._handing_over = False
        self.recovered: Recovered | None = None
        self.leading = asyncio.Event()
        self.commands_decided = 0
        self.facts_appended = 0
        self.term: int | None = None  # the lease revision this instance's last term began with
        # Per-batch counts: a metrics.WriterStats when the process serves metrics (its
        # composition root sets it before `run`: runtime.Stack.expose), else nothing counted.
        self.stats: Any = Uncounted()
        self.health = WriterHealth()  # a full store, commands the log refused: across terms
        self._warm: Recovered | None = None  # the log followed so far while not leading
        self._snapshotting: asyncio.Task | None = None  # a snapshot being stored
        self._snapshot_chain = SnapshotChain()  # the last one's frames, for the next to reuse
        self._since_snapshot = 0
        self._durable_through = 0  # decided_through of the last batch whose facts all landed
        self._term_ended = 0.0  # when this instance's last term ended (monotonic)
        self._reads: ReadIndex | None = None  # the read side's index of the term's jobs
        self._reads_lock = asyncio.Lock()  # one catch-up of it at a time
        self._heavy: asyncio.Queue = asyncio.Queue()  # list requests waiting for their turn

    # -- terms of office ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await ensure_streams(self.js, self.settings)
        await claim_mode(self.js, self.scope.mode)
        while not stop.is_set():
            # Follow the log before asking for the lease, and keep following it as a standby:
            # a fold of a long log must never run against the lease's expiry.
            try:
                rebuilding, started = self._warm is None, time.perf_counter()
                self._warm = await recover(self.js, self.scope, self._warm)
                if rebuilding:
                    warm = self._warm
                    log.info("state rebuilt", partition=self.partition, snapshot_seq=warm.snapshot_seq,
                             facts_folded=warm.folded, snapshot_load_s=round(warm.load_seconds, 3),
                             seconds=round(time.perf_counter() - started, 3))  # fmt: skip
            except LogIncomplete:  # facts are gone for good: retrying cannot help
                raise
            except Exception as error:  # the log unreadable for now: start over, later
                # the bus's own hiccups (a timeout, a closed connection while a server
                # restarts) in one line; anything else with its traceback
                transient = isinstance(error, (NatsError, asyncio.TimeoutError, OSError,
                                               LogReadStalled))  # fmt: skip
                log.error("could not follow the log", partition=self.partition,
                          error=repr(error), exc_info=not transient)  # fmt: skip
                self._warm = None
                await sleep_or(stop, self.settings.lease_ttl_s / 4)
                continue
            if self.members is not None and not self.members.may_take(self.partition):
                await sleep_or(stop, self.settings.lease_ttl_s / 4)  # just handed it over
            elif await self.lease.acquire():
                self.health.landed(self.partition)  # the lease was stored: the store writes
                self.term = self.lease.revision
                log.info("leading", partition=self.partition, holder=self.lease.holder,
                         core="compiled" if core.COMPILED else "interpreted",
                         took_back_own_lease=self.lease.reclaimed or None)  # fmt: skip
                if self.members is not None:
                    self.members.leading.add(self.partition)
                try:
                    await self._lead(stop)
                except SteppedDown as reason:
                    log.warning("stepped down", partition=self.partition, reason=str(reason))
                except Exception as error:  # never crash holding the lease: step down, retry
                    log.error("stepped down after an error", partition=self.partition,
                              error=repr(error), exc_info=True)  # fmt: skip
                finally:
                    self.leading.clear()
                    self._term_ended = time.monotonic()
                    self._warm = None  # a term's state may run ahead of the log: start over
                    if self.members is not None:
                        self.members.leading.discard(self.partition)
                await self.lease.release()
                if not stop.is_set():  # while the disk is full, try less often
                    full = self.health.storage_full is not None
                    await sleep_or(stop, self.settings.lease_ttl_s / (1 if full else 4))
            else:
                await self._lease_not_taken()
                await sleep_or(stop, self.settings.lease_ttl_s / 4)

    async def _lease_not_taken(self) -> None:
        """The lease could not be taken: usually another instance holds it, but on a full
        disk the lease bucket refuses the write (an error naming the store, or no answer at
        all while nobody holds the lease), and that must be said, not retried in silence."""
        error = self.lease.last_error
        if isinstance(error, KeyWrongLastSequenceError):
            await self._own_lease_stuck()
        if error is None or isinstance(error, KeyWrongLastSequenceError):
            return  # someone holds it
        # A KeyNotFoundError (an APIError without err_code): the create found the key, the
        # read after it did not: a lease bucket whose store failed, judged as no answer below.
        if isinstance(error, APIError) and getattr(error, "err_code", None) is not None:
            text = f"{error.err_code}: {error.description}"
            if refusal_cause(error.err_code or 0, error.description or "") == DISK_FULL:
                self.health.full(self.partition, f"the lease bucket refused a write ({text})")
            return
        try:  # no answer: full, if the server answers reads and nobody holds the lease
            holder = await asyncio.wait_for(self.lease.holder_now(), 2.0)
            await asyncio.wait_for(self.js.stream_info(FACTS_STREAM), 2.0)
        except Exception:
            return  # the server does not answer: unavailable, not full
        if holder is None:
            self.health.full(self.partition, "the lease bucket answers reads but stored nothing "
                             "and sent no answer to a write (nats-server's store write error)")

    async def _own_lease_stuck(self) -> None:
        """This instance's own lease, still in the bucket long after its term ended (its
        renewal and its release got no answer): a stream whose store hit a write error
        neither stores writes nor expires entries, so nobody can lead again.  Say so."""
        if time.monotonic() - self._term_ended < 2 * self.settings.lease_ttl_s:
            return  # it expires by itself in a moment
        try:
            holder = await asyncio.wait_for(self.lease.holder_now(), 2.0)
        except Exception:
            return
        if holder == self.lease.holder:
            self.health.full(self.partition, "this instance's lease outlived its TTL in the "
                             "lease bucket, which neither expires entries nor answers writes "
                             "(nats-server's store write error)")  # fmt: skip

    async def _lead(self, stop: asyncio.Event) -> None:
        recovered = await self._recover_term()
        inbox: asyncio.Queue = asyncio.Queue()
        sub = await self._subscribe_commands(recovered, inbox)
        appender = await FactAppender(self.nc, self.scope.fact_filter, recovered.log_end,
                                      shared=self.scope.token is not None).start()  # fmt: skip
        api = await self.nc.subscribe(api_subject(self.scope), queue="qm-api", cb=self._on_request)
        self.leading.set()
        tasks = [asyncio.create_task(self._renew(stop)), asyncio.create_task(self._tick(stop)),
                 asyncio.create_task(self._watch_consumer(stop)),
                 asyncio.create_task(self._heavy_reads())]  # fmt: skip
        self._handing_over = False
        try:
            await self._write(inbox, stop, tasks, appender)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await appender.close()
            for closing in (api.unsubscribe(), sub.unsubscribe()):
                try:
                    await closing
                except Exception:  # the connection may be gone; the consumer stays durable
                    pass

    async def _recover_term(self) -> Recovered:
        """The state this term starts from: the log followed so far, plus its tail."""
        followed = self._warm.folded if self._warm is not None else 0
        recovered = self.recovered = await recover(self.js, self.scope, self._warm)
        self._warm = None
        self._durable_through = recovered.decided_through
        log.info("recovered", partition=self.partition, fact_seq=recovered.fact_seq, log_end=recovered.log_end,
                 decided_through=recovered.decided_through, tail_folded=recovered.folded - followed,
                 partial_command=recovered.partial[0] if recovered.partial else None)  # fmt: skip
        return recovered

    async def _subscribe_commands(self, recovered: Recovered, inbox: asyncio.Queue):
        """This term's command consumer, delivering into `inbox`: a durable push consumer with
        flow control and heartbeats, read below nats-py's message path (`natsfix.raw_subscribe`:
        each command costs a plain `Msg` of subject, reply and payload, without its headers,
        which the scheduler never reads; about 5 µs less a command than nats-py's callback
        path).  Flow control is answered as soon as it is read: the commands before it are in
        `inbox` by then, and `max_ack_pending` bounds how many wait there."""
        nc = self.nc
        answers = natsfix.ControlAnswers(nc, lambda: log.warning(
            "a flow control answer to the command consumer could not be sent",
            partition=self.partition))  # fmt: skip

        def deliver(subject: bytes, reply: bytes, headers: bytes | None, data: bytes) -> None:
            if reply.startswith(b"$JS.ACK."):
                inbox.put_nowait(Msg(_client=nc, subject=subject.decode(), reply=reply.decode(),
                                     data=data))  # fmt: skip
            elif not answers.alive(reply, headers or b""):
                log.warning("the command consumer sent a status", partition=self.partition,
                            status=(headers or b"").split(b"\r\n", 1)[0].decode(errors="replace"))

        # A fresh consumer each term, starting at the last command the log records (only its
        # clock is taken again): commands a previous leader received but never recorded are
        # delivered again, in order, and nothing is acked on their behalf.
        durable = self.scope.durable
        try:
            await self.js.delete_consumer(COMMANDS_STREAM, durable)
        except NotFoundError:
            pass
        sub = await natsfix.raw_subscribe(nc, nc.new_inbox(), deliver)
        consumer = ConsumerConfig(
            durable_name=durable, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(recovered.decided_through, 1), ack_policy=AckPolicy.ALL,
            ack_wait=30.0, max_ack_pending=self.settings.max_ack_pending,
            filter_subjects=self.scope.command_filters, deliver_subject=sub.subject,
            flow_control=True, idle_heartbeat=5.0,
        )  # fmt: skip
        try:
            await self.js.add_consumer(COMMANDS_STREAM, consumer)
        except BaseException:
            await sub.unsubscribe()
            raise
        return sub

    def known_queues(self) -> set[str]:
        """The job queues this instance's state holds: the state it leads with, or the one it
        follows the log with as a standby."""
        followed = self.recovered if self.leading.is_set() else self._warm
        return set(followed.state.queues) if followed is not None else set()

    # -- helpers of a term -------------------------------------------------------------------

    async def _renew(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or(stop, self.settings.lease_ttl_s / 4)
            if stop.is_set():
                return
            try:
                renewed = await self.lease.renew()
            except Exception as error:  # the bucket did not answer (e.g. its store failed)
                raise SteppedDown(f"lease not renewed: the lease bucket did not answer "
                                  f"({type(error).__name__})") from None  # fmt: skip
            if not renewed:
                full = self.health.storage_full
                raise SteppedDown("lease not renewed" + (f" (disk full: {full})" if full else
                                  ": lost to another instance, or the bucket refused it"))
            if self.members is not None and self.members.should_hand_over(self.partition):
                self._handing_over = True
                return

    async def _watch_consumer(self, stop: asyncio.Event) -> None:
        """If the term's command consumer disappears (deleted by an admin), the server just
        stops delivering: say so and end the term, whose successor recreates it from the
        last command the log records (a command published meanwhile is then decided)."""
        durable = self.scope.durable
        while not stop.is_set():
            await sleep_or(stop, CONSUMER_CHECK_S)
            if stop.is_set():
                return
            try:
                await self.js.consumer_info(COMMANDS_STREAM, durable)
            except NotFoundError:
                log.error("the scheduler's command consumer is gone (deleted?); ending the term "
                          "to recreate it", consumer=durable, stream=COMMANDS_STREAM,
                          partition=self.partition)  # fmt: skip
                raise SteppedDown(f"command consumer {durable} is gone") from None
            except Exception:  # no answer now: the lease renewal judges the bus
                continue

    async def _tick(self, stop: asyncio.Event) -> None:
        """Time is data: ticks go through the command stream, so timers replay too.  Every
        interval, a Tick only if a timer is due by now (the state's `earliest_due`): timers
        fire before the next command of any kind, so a Tick is needed only when nothing else
        arrives, and a quiet service writes nothing."""
        interval = self.settings.tick_interval_s
        subject = self.scope.tick_subject
        if subject is None:  # the fleet partition: no timers
            await stop.wait()
            return
        while not stop.is_set():
            await sleep_or(stop, interval)
            if stop.is_set():
                return
            recovered = self.recovered
            due = None if recovered is None else earliest_due(recovered.state)
            if due is None or due > time.time():
                continue
            slot = int(time.time() / interval)
            try:
                await self._publish_tick(subject, slot)
            except Exception as error:  # a missed tick only delays timers to the next one
                log.warning("tick not published", error=str(error))

    async def _publish_tick(self, subject: str, slot: int) -> None:
        """One Tick per slot, under the id `tick:<partition>:<slot>`, so that two leaders of a
        hand-over store it once.  That id is predictable: a team may send its own command
        carrying it (NATS permissions cannot police headers), and the stream's dedup window
        would drop the real Tick, and every later one so forged, so timers would never fire.
        So a duplicate must be the scheduler's own Tick; if not, publish again under an id
        nobody can predict, and say which stored message took the id."""
        msg_id = f"tick:{self.partition}:{slot}"
        ack = await self.js.publish(subject, TICK, stream=COMMANDS_STREAM,
                                    headers={"Nats-Msg-Id": msg_id})  # fmt: skip
        if not ack.duplicate:
            return
        taken = await self.js.get_msg(COMMANDS_STREAM, ack.seq)
        if taken.subject == subject and taken.data == TICK:
            return  # a Tick of this slot is stored already (another leader's)
        log.warning("a Tick's message id was taken by another message; published it again "
                    "under an unpredictable id", partition=self.partition, msg_id=msg_id,
                    offending_seq=ack.seq, offending_subject=taken.subject)  # fmt: skip
        await self.js.publish(subject, TICK, stream=COMMANDS_STREAM,
                              headers={"Nats-Msg-Id": f"{msg_id}:{secrets.token_hex(8)}"})

    async def _on_request(self, msg) -> None:
        """A read request: a list waits for its turn (`_heavy_reads`), anything else is answered
        at once, so that a team's heaviest reads never hold up another's describe.  Beyond
        `HEAVY_WAITING` lists waiting, a list is told to come back later."""
        if parse_api_subject(msg.subject)[2] not in HEAVY_VERBS:
            await self._answer(msg)
        elif self._heavy.qsize() < HEAVY_WAITING:
            self._heavy.put_nowait(msg)
        elif msg.reply:
            busy = {"error": {"type": "TooManyRequestsException", "message": (
                f"the scheduler has {HEAVY_WAITING} list requests waiting; retry later")}}
            try:
                await msg.respond(json.dumps(busy).encode())
            except Exception as error:
                log.error("read answer not sent", subject=msg.subject, error=repr(error))

    async def _heavy_reads(self) -> None:
        """The lists, one at a time, for as long as the term lasts (what waits at its end is
        dropped: its askers time out and ask the next leader)."""
        try:
            while True:
                await self._answer(await self._heavy.get())
        finally:
            while not self._heavy.empty():
                self._heavy.get_nowait()

    async def _answer(self, msg) -> None:
        """Read answers from the decided state (it may be one batch ahead of the log).

        A request's work is bounded (see reads.py), and the jobs its index has not seen yet
        are indexed in chunks between which the decisions run, so no read holds the loop for
        long; an answer never exceeds the server's max_payload (lists are paged to fit it)."""
        queue, share, verb = parse_api_subject(msg.subject)  # a team's: with its share
        max_bytes = self.nc.max_payload
        clock = time.perf_counter
        started, work = clock(), 0.0  # `work`: the read's own time, its pauses left out
        try:
            request = json.loads(msg.data or b"{}")
            if self.recovered is None:
                raise RuntimeError("the scheduler is still recovering; try again")
            reads = await self._read_index() if verb == "list-service-jobs" else None
            response = answer_in(self.scope, self.recovered.state, verb, request, queue, share,
                                 reads, max_bytes, defer=True)  # fmt: skip
            page = response.get("jobSummaryList") if isinstance(response, dict) else None
            if isinstance(page, JobPage):  # a step at a time, the decisions between
                for _ in page.steps():
                    work += clock() - started
                    await asyncio.sleep(0)
                    started = clock()
                encoded = page.encode()
            else:
                encoded = json.dumps(response).encode()
        except Exception as error:  # a bad request gets an error, never a crash
            log.warning("read request failed", subject=msg.subject, error=repr(error))
            refusal = {"error": {"type": "ClientException", "message": str(error)}}
            encoded = json.dumps(refusal).encode()
        if not msg.reply:
            return
        if len(encoded) > max_bytes - 1024:  # headers and protocol framing need the rest
            log.error("read answer over the bus's max_payload; answered with an error instead",
                      subject=msg.subject, answer_bytes=len(encoded), max_payload=max_bytes)
            encoded = json.dumps({"error": {"type": "ServerException", "message": (
                f"the answer ({len(encoded)} bytes) exceeds the bus's max_payload "
                f"({max_bytes} bytes); ask for less")}}).encode()  # fmt: skip
        try:
            await msg.respond(encoded)
        except Exception as error:
            log.error("read answer not sent", subject=msg.subject, error=repr(error))
        # Reads are answered one at a time (one subscription); resting as long as a heavy
        # read worked before the next one leaves the decisions at least half of the loop (and
        # of the process's core), however hard a team reads.  Light reads do not rest.  Its
        # pauses are not counted: a read is not made to rest for the decisions run meanwhile.
        took = work + clock() - started
        if took > READ_LIGHT_S:
            await asyncio.sleep(min(took, READ_REST_MAX_S))

    async def _read_index(self) -> ReadIndex:
        """The read index of the term's state, caught up with it, INDEX_CHUNK jobs at a time."""
        async with self._reads_lock:
            state = self.recovered.state
            if self._reads is None or self._reads.state is not state:
                self._reads = ReadIndex(state)
            while self._reads.catch_up(INDEX_CHUNK) > 0:
                await asyncio.sleep(0)  # let the decisions run
                if self.recovered is None or self.recovered.state is not state:
                    raise RuntimeError("the scheduler's term ended; try again")
            return self._reads

def api_subject(scope: Partition) -> str:
    """`qm.api.<verb>` and `qm.api.<queue or ~>.<verb>` for one partition: all of them, the
    fleet's `~`, or one queue's."""
    return f"{API_PREFIX}.>" if scope.token is None else f"{API_PREFIX}.{scope.token}.>"
