"""The admission gate on the bus: a team's job commands, within its share's limits, into the
command stream; the rest answered at once, never stored (issue 29).

A team publishes `SubmitServiceJob`, `UpdateServiceJob` and `TerminateServiceJob` on
`qm.in.<queue>.<share>.<Kind>` as it would to JetStream (`js.publish`: a request whose answer
is the stream's acknowledgement).  Its credentials allow nothing else (services/config/auth.py),
so every team command passes here.  The gate (any number of them, in one queue group):

- lets a command within its share's limits (services/gate/limits.py) through: the very message,
  headers and reply subject included, goes on to `qm.cmd.<queue>.<share>.<Kind>`, so the
  stream's acknowledgement goes straight to the sender and the command is stored as if the
  team had published it there;
- answers any other with an error in JetStream's shape (`{"error": {"code": 429, ...}}`, which
  nats-py's `js.publish` raises as an `APIError`) that names the limit.  Nothing of it is stored.
  Refusals are logged bounded per share (5 lines in full per 10 s, then one summary line).

Each message costs the gate a few microseconds in nats-py's read loop (`natsfix.raw_subscribe`):
no Msg, no task, frames written in one batch per read.  The limits come from the fact log
(`QuotaShareOptionsSet`, followed from the start), so the gate needs no configuration of its
own and every gate applies the same limits.  Several gates each count alone: with N of them a
share may get up to N times its limit past the gates, and the core refuses the excess.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable

import structlog
from nats.aio.client import Client

from quotasched.events.codec import DecodeError, decode_fact
from quotasched.events.facts import QuotaShareDeleted, QuotaShareOptionsSet
from quotasched.events.subjects import (
    ANY,
    COMMANDS_PREFIX,
    FACTS_PREFIX,
    FACTS_STREAM,
    GATE_PING,
    GATE_PREFIX,
    GATED_COMMANDS,
)
from quotasched.services.gate.limits import REFUSED, THROTTLED, Gate
from quotasched.services.nats import natsfix
from quotasched.services.scheduler.refusals import BudgetedLines, reason_class

log = structlog.get_logger("quotasched.gate")

GATE_GROUP = "quotasched-gate"  # the queue group every gate joins
# The facts that set a share's limits: its options, and its deletion (a share created again
# under the same name starts from the defaults, as the core's does).
LIMIT_FILTERS = tuple(f"{FACTS_PREFIX}.*.*.{kind.model_fields['kind'].default}"
                      for kind in (QuotaShareOptionsSet, QuotaShareDeleted))  # fmt: skip
OPTIONS_WAIT_S = 30.0  # reading the limits at start
ERRORS_LOGGED = 10  # lines about commands the gate failed on (a bug); the rest are counted
FAILED = "the gate could not read this command"  # the answer when the gate fails (a bug)
MAX_UNSENT_BYTES = 32 * 1024 * 1024  # frames not yet written, at most (then shed)
SHED_LOGGED_EVERY = 10_000  # one line per this many shed frames (and the first)
LABELLED_SHARES = 1000  # (queue, share) pairs counted apart in the metrics; beyond, as ("*", "*")
_FORWARD = COMMANDS_PREFIX.encode()
_GATE = GATE_PREFIX.encode()
_PING = GATE_PING.encode()


class GateRefusalLog(BudgetedLines):
    """The gate's lines about refused commands, bounded per (job queue, quota share)."""

    SUMMARY, COUNTED, KINDS = "commands refused at the gate", "refused", "reasons"

    def refused(self, queue: str, share: str, kind: str, reason: str) -> None:
        if self.admit(queue, share, reason_class(reason), None):
            log.info("command refused at the gate", job_queue=queue, quota_share=share,
                     command_kind=kind, reason=reason)  # fmt: skip


class AdmissionGate:
    """One gate on connection `nc`: `start` reads the limits and joins the queue group, `stop`
    leaves it.  `clock`: the wall clock its seconds are counted on (injectable for tests)."""

    def __init__(self, nc: Client, clock: Callable[[], float] = time.time) -> None:
        self.nc = nc
        self.clock = clock
        self.gate = Gate()
        self.admitted = 0
        self.refused = 0
        self.errors = 0
        self.open = False
        self.admitted_by_share: Counter[tuple[str, str]] = Counter()  # the metrics' counts
        self.refused_by: Counter[tuple[str, str, str]] = Counter()  # (queue, share, reason)
        self._labels: set[tuple[str, str]] = set()
        self.lines = GateRefusalLog(log, 5, 10.0)
        self._out: list[bytes] = []
        self._out_bytes = 0  # their payloads' bytes (nats-py's count)
        self._unsent = 0  # frames' bytes queued here or being written
        self.shed = 0
        self._flushing: asyncio.Task | None = None
        self._subs: list = []
        self._last_forget = 0.0

    async def start(self, wait: float = OPTIONS_WAIT_S) -> AdmissionGate:
        await self._follow_limits(wait)
        self._subs.append(await natsfix.raw_subscribe(self.nc, f"{GATE_PREFIX}.>", self._on_command,
                                                      queue=GATE_GROUP))  # fmt: skip
        self.open = True
        log.info("gate open", subject=f"{GATE_PREFIX}.>", shares_with_limits=len(self.gate.limits))
        return self

    async def stop(self) -> None:
        self.open = False
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - a closed connection has no subscription left
                pass
        self._subs.clear()
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        self.lines.close()
        log.info("gate closed", admitted=self.admitted, refused=self.refused, failed=self.errors,
                 shed=self.shed)  # fmt: skip

    # -- the limits, from the fact log --------------------------------------------------------

    async def _follow_limits(self, wait: float) -> None:
        """Follow every `QuotaShareOptionsSet` and `QuotaShareDeleted` from the log's start (one
        ordered consumer each; per share, a fact older than the last applied is ignored, so the
        two keep the log's order); return once those stored before now are applied (at most
        `wait` seconds: then the defaults stand in)."""
        js = self.nc.jetstream()
        stored = 0
        for subject_filter in LIMIT_FILTERS:
            info = await js.stream_info(FACTS_STREAM, subjects_filter=subject_filter)
            stored += sum((info.state.subjects or {}).values())
        applied = asyncio.Event()
        seen = 0
        latest: dict[tuple[str, str], int] = {}  # share -> stream seq of the fact applied

        async def on_fact(msg) -> None:
            nonlocal seen
            seen += 1
            try:
                fact = decode_fact(msg.data)
            except DecodeError as error:
                log.warning("a share's limits fact the gate cannot read", error=str(error))
            else:
                share, seq = (fact.job_queue, fact.quota_share_name), msg.metadata.sequence.stream
                if seq > latest.get(share, 0):
                    latest[share] = seq
                    self.gate.set_limits(share, getattr(fact, "options", None))
            if seen >= stored:
                applied.set()

        for subject_filter in LIMIT_FILTERS:
            self._subs.append(await js.subscribe(subject_filter, stream=FACTS_STREAM,
                                                    ordered_consumer=True, cb=on_fact))  # fmt: skip
        if stored == 0:
            applied.set()
        try:
            await asyncio.wait_for(applied.wait(), wait)
        except TimeoutError:
            log.warning("the gate read only part of the share limits in time; the defaults "
                        "stand in for the rest until their facts arrive", read=seen,
                        stored=stored)  # fmt: skip

    # -- commands ------------------------------------------------------------------------------

    def _on_command(self, subject: bytes, reply: bytes, headers: bytes | None, data: bytes) -> None:
        """One command, on nats-py's read loop: forward it or answer why not.  Nothing may
        escape into that loop (it would end the connection's reading): an error here is
        logged and the command refused."""
        try:
            self._admit(subject, reply, headers, data)
        except Exception as error:  # noqa: BLE001 - a bug must cost one command, not the gate
            self.errors += 1
            if self.errors <= ERRORS_LOGGED:
                log.error("the gate failed on a command; refused", error=repr(error),
                          subject=subject.decode(errors="replace"), errors=self.errors)  # fmt: skip
            if reply:
                self._refuse(reply, REFUSED, None, None, "?", FAILED)

    def _admit(self, subject: bytes, reply: bytes, headers: bytes | None, data: bytes) -> None:
        tokens = subject.split(b".")
        if subject == _PING:
            if reply:
                self._send(b"PUB %s 2\r\n{}\r\n" % reply, 2)
            return
        if len(tokens) != 5 or tokens[2] == b"~" or tokens[3] == b"~":
            named = subject.decode(errors="replace")
            self._refuse(reply, REFUSED, None, None, "?", f"{named} is not {GATE_PREFIX}."
                         "<jobQueue>.<quotaShare>.<Kind> of one quota share")  # fmt: skip
            return
        queue, share, kind = (token.decode(errors="replace") for token in tokens[2:])
        now = self.clock()
        reason = self.gate.admit((queue, share), kind, len(data), now)
        if reason is not None:
            code = THROTTLED if kind in GATED_COMMANDS else REFUSED
            self._refuse(reply, code, queue, share, kind, reason)
            return
        if now - self._last_forget >= 10.0:  # before the frame is queued: nothing may fail after
            self._last_forget = now
            self.gate.forget(now)
        self.admitted += 1
        self.admitted_by_share[self._labelled(queue, share)] += 1
        forward = _FORWARD + subject[len(_GATE):]
        space = b" " + reply + b" " if reply else b" "
        if headers:
            size = len(headers)
            head = b"HPUB " + forward + space + b"%d %d\r\n" % (size, size + len(data))
            self._send(b"".join((head, headers, data, b"\r\n")), len(data))
        else:
            self._send(b"".join((b"PUB ", forward, space, b"%d\r\n" % len(data), data, b"\r\n")),
                       len(data))  # fmt: skip

    def _refuse(self, reply: bytes, code: int, queue: str | None, share: str | None, kind: str,
                reason: str) -> None:  # fmt: skip
        self.refused += 1
        queue, share = queue or ANY, share or ANY
        self.lines.refused(queue, share, kind, reason)
        limit = (reason_class(reason) if code == THROTTLED else
                 "failed" if reason == FAILED else "not a job command of one share")  # fmt: skip
        self.refused_by[(*self._labelled(queue, share), limit)] += 1
        if not reply:
            return  # published without a reply subject: nobody to tell
        answer = json.dumps({"error": {"code": code, "err_code": code,
                                       "description": reason}}).encode()  # fmt: skip
        self._send(b"PUB %s %d\r\n%s\r\n" % (reply, len(answer), answer), len(answer))

    def _labelled(self, queue: str, share: str) -> tuple[str, str]:
        """The metrics' labels of a share: its own, for the first `LABELLED_SHARES` seen."""
        key = (queue, share)
        if key not in self._labels:
            if len(self._labels) >= LABELLED_SHARES:
                return ("*", "*")
            self._labels.add(key)
        return key

    def _send(self, frame: bytes, payload_bytes: int) -> None:
        """Queue a frame for the next write; beyond `MAX_UNSENT_BYTES` not yet written (the
        server reads from the gate slower than it delivers to it), shed it instead: the sender
        gets no answer (its publish times out: nothing was stored), and memory stays bounded."""
        if self._unsent + len(frame) > MAX_UNSENT_BYTES:
            self.shed += 1
            if self.shed == 1 or self.shed % SHED_LOGGED_EVERY == 0:
                log.warning("the gate is sending slower than commands arrive; shedding",
                            shed=self.shed, unsent_bytes=self._unsent)  # fmt: skip
            return
        self._out.append(frame)
        self._out_bytes += payload_bytes
        self._unsent += len(frame)
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Hand the frames gathered so far to nats-py in one write (after the read that brought
        them), again while more arrive."""
        try:
            while self._out:
                frames, sent = self._out, self._out_bytes
                self._out, self._out_bytes = [], 0
                await natsfix.send_frames(self.nc, frames, sent)
                self._unsent -= sum(map(len, frames))
        except Exception as error:  # noqa: BLE001 - a closed connection: the senders time out
            log.warning("the gate could not send", error=repr(error), frames=len(self._out))
            self._out, self._out_bytes, self._unsent = [], 0, 0
        finally:
            self._flushing = None


STREAMS_WAIT_S = 1.0  # between looks for the fact log, when the gate starts before it exists


async def serve(url: str, stop: asyncio.Event, metrics: tuple[str, int] | None = None) -> None:
    """`quotasched gate`: one gate on its own connection until `stop` is set; `metrics`: serve
    GET /metrics and /healthz on that (host, port) too.  A gate started before the scheduler
    created the streams waits for them (said once)."""
    from nats.js.errors import NotFoundError

    from quotasched.services.nats.bus import connect

    nc = await connect(url, "quotasched-gate")
    endpoint = None
    try:
        gate = AdmissionGate(nc)
        if metrics is not None:
            from quotasched.services.metrics.endpoint import MetricsEndpoint
            from quotasched.services.metrics.gate_part import GatePart

            endpoint = await MetricsEndpoint(*metrics).start()
            endpoint.add(GatePart(gate))  # unhealthy until the gate is open
        told = False
        while not stop.is_set():
            try:
                await gate.start()
                break
            except NotFoundError:
                if not told:
                    log.info("waiting for the fact log (a scheduler creates it)", url=url)
                    told = True
                try:
                    await asyncio.wait_for(stop.wait(), STREAMS_WAIT_S)
                except TimeoutError:
                    pass
        else:
            return
        await stop.wait()
        await gate.stop()
    finally:
        if endpoint is not None:
            await endpoint.close()
        await nc.close()
