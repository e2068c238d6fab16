"""The client's commands: turning what the caller gave into a command, waiting for the facts
the scheduler decided for it (`Decisions`), and refusals as `ClientError`.

A command is given as a model, a dict or JSON text; it is decoded (so a bad one fails before
it is published) and published as the bytes given.  Its decision is the facts whose
`command_seq` is the command's stream sequence; each carries a `Qm-Facts` header saying how
many the scheduler recorded, and its message id `<writer>:<command seq>:<index>`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError

from quotasched.events.codec import decode_command, decode_fact
from quotasched.events.facts import CommandRejected, Fact
from quotasched.events.subjects import FACTS_PREFIX, FACTS_STREAM, fact_subject, parse_command_subject
from quotasched.services.config.auth import CONSUMER_SLOTS, team_consumers
from quotasched.services.nats.waits import wait_set

ALL_FACTS = f"{FACTS_PREFIX}.>"


class ClientError(Exception):
    """The scheduler refused a command or a request (AWS's ClientException)."""


class SchedulerBusy(ClientError):
    """The scheduler has as many list requests waiting as it takes: ask again later (AWS's
    TooManyRequestsException)."""


class GateRefused(ClientError):
    """The admission gate (services/gate) refused a command before the command stream: over its
    share's limits (`throttled`: AWS's TooManyRequestsException, to be sent again later), or
    not a job command of one share.  Nothing of it was stored."""

    def __init__(self, reason: str, throttled: bool):
        super().__init__(reason)
        self.throttled = throttled


def as_command(command: Any):
    if isinstance(command, (str, bytes)):
        data = command.encode() if isinstance(command, str) else command
    elif isinstance(command, dict):
        data = json.dumps(command).encode()
    else:
        data = command.model_dump_json(by_alias=True, exclude_none=True).encode()
    return decode_command(data), data


def raise_if_rejected(facts: list[Fact]) -> list[Fact]:
    for fact in facts:
        if isinstance(fact, CommandRejected):
            raise ClientError(fact.status_reason)
    return facts


TEAM_ROLE_PREFIX = "pipeline-"  # services.config.auth.roles: pipeline-<queue>-<share>
CONSUMER_IDLE_S = 10.0  # the server removes a team's consumer this long after its client left
SLOT_RETRY_S = 0.2  # every slot taken: look again after this long
POLL_S = 0.05  # how often a team looks whether a partly seen decision is complete
SHARED_LOG_SETTLE_S = 0.3  # per-queue partitions interleave their appends: a grace (see _settle)
ALREADY_TAKEN = frozenset({10148, 10013})  # consumer already exists / name already in use


def facts_of_command(subject: str) -> str:
    """Where the facts a team may see of a command published on `subject` are recorded: its
    refusal goes under the command's own subject tokens, its facts about the team's jobs under
    their (the same) queue and share (`services.scheduler.routing.fact_subject_of`)."""
    queue, share, _ = parse_command_subject(subject)
    return fact_subject("*", queue, share)


def team_role(nc) -> str | None:
    """The pipeline role this connection logged in as (`services.config.auth`), or None (admin, or
    a server without authorization)."""
    user = (getattr(nc, "options", None) or {}).get("user") or ""
    return user if user.startswith(TEAM_ROLE_PREFIX) else None


class _Mark:
    """Where the last fact seen of a command sits: its stream seq, its index among the
    command's facts, how many the writer recorded (`Qm-Facts`) and which writer."""

    __slots__ = ("stream_seq", "index", "count", "writer")

    def __init__(self, stream_seq: int, index: int, count: int, writer: str):
        self.stream_seq, self.index, self.count, self.writer = stream_seq, index, count, writer

    @property
    def last(self) -> int:
        """The stream seq of the command's last fact, when its writer's appends are
        contiguous (one writer: the default); a lower bound otherwise."""
        return self.stream_seq + self.count - 1 - self.index

    @property
    def shared(self) -> bool:
        return self.writer.startswith("queue-")  # partition.Partition.for_queue


class _Feed:
    def __init__(self, name: str | None, sub) -> None:
        self.name, self.sub, self.received = name, sub, 0


class Decisions:
    """The facts the scheduler records for the commands published through one connection, by
    command seq, read from the fact log from the moment it is followed.

    Without a pipeline's credentials (admin, or a server without authorization): one ordered
    consumer over the whole log, `start`.  A pipeline (`pipeline-<queue>-<share>`) may create
    consumers only in its slots `<role>-0` .. `-7`, filtered on its share's facts
    (`services.config.auth.fact_reader`): `follow(subject)`, called before publishing on `subject`,
    takes the first free slot (one another client holds is refused "already exists": the
    next), as an ephemeral push consumer the server removes CONSUMER_IDLE_S after its client
    went away; `close` deletes it.

    A command's facts carry how many the scheduler recorded (`Qm-Facts`).  A team sees those
    under its share only: its refusals and every fact about its own jobs, not what the same
    decision recorded about other teams' jobs (a victim preempted in another share, a job
    there dispatched in the capacity a termination freed).  So for a team a command is decided
    when all its facts arrived, or a later command's facts from the same writer (it writes in
    command order), or the log holds the command's last fact and the consumer has delivered
    everything under the share stored so far.
    """

    def __init__(self) -> None:
        self.facts: dict[int, list[Fact]] = {}
        self.routes: dict[str, tuple[str, str]] = {}  # jobId -> (queue, share), as decided
        self.changed = asyncio.Event()
        self.nc = None
        self.team: str | None = None
        self.slot_wait = 10.0
        self._feeds: dict[str, _Feed] = {}  # by subject filter
        self._marks: dict[int, _Mark] = {}
        self._complete: set[int] = set()
        self._latest: dict[str, int] = {}  # writer -> the latest command seq it decided

    async def start(self, bus, slot_wait: float = 10.0) -> None:
        """Follow the whole log from now on (admin); for a team, wait for `follow`, which
        waits up to `slot_wait` seconds for a free slot."""
        self.nc, self.team, self.slot_wait = bus.nc, team_role(bus.nc), slot_wait
        if self.team is None:
            await self.follow(ALL_FACTS)

    async def follow(self, subject: str) -> None:
        """Be sure the facts of a command about to be published on `subject` will be seen."""
        subject_filter = ALL_FACTS if self.team is None else facts_of_command(subject)
        if subject_filter in self._feeds or ALL_FACTS in self._feeds:
            return
        if self.team is None:
            feed = _Feed(None, None)
            feed.sub = await self.nc.jetstream().subscribe(
                ALL_FACTS, ordered_consumer=True, stream=FACTS_STREAM,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
                cb=functools.partial(self._on_fact, feed))  # fmt: skip
        else:
            feed = await self._take_slot(subject_filter, self.slot_wait)
        self._feeds[subject_filter] = feed

    async def _take_slot(self, subject_filter: str, timeout: float) -> _Feed:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        feed = _Feed(None, None)
        deliver = self.nc.new_inbox()
        feed.sub = await self.nc.subscribe(deliver, cb=functools.partial(self._on_fact, feed))
        try:
            while True:
                for name in team_consumers(self.team):
                    if await self._create(name, subject_filter, deliver):
                        feed.name = name
                        return feed
                if loop.time() + SLOT_RETRY_S > deadline:
                    raise ClientError(
                        f"all {CONSUMER_SLOTS} consumers {self.team} may hold on {FACTS_STREAM} "
                        f"are in use ({CONSUMER_SLOTS} waits at once?) for {timeout:g}s; "
                        "nothing was published")  # fmt: skip
                await asyncio.sleep(SLOT_RETRY_S)
        except BaseException:
            await feed.sub.unsubscribe()
            raise

    async def _create(self, name: str, subject_filter: str, deliver: str) -> bool:
        """Create consumer `name` (`action: create`: never take over one that exists); False
        when the slot is taken."""
        config = ConsumerConfig(
            name=name, filter_subject=subject_filter, deliver_subject=deliver,
            deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE,
            inactive_threshold=CONSUMER_IDLE_S, mem_storage=True, num_replicas=1,
        )  # fmt: skip
        request = {"stream_name": FACTS_STREAM, "config": config.as_dict(), "action": "create"}
        try:
            reply = await self.nc.request(
                f"$JS.API.CONSUMER.CREATE.{FACTS_STREAM}.{name}.{subject_filter}",
                json.dumps(request).encode(), timeout=5.0)  # fmt: skip
        except (asyncio.TimeoutError, TimeoutError):  # nats.errors.TimeoutError is one
            raise ClientError(
                f"the server did not let {self.team} read {subject_filter} through consumer "
                f"{name} (a pipeline follows only its own share's facts); nothing was "
                "published") from None  # fmt: skip
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error is None:
            return True
        if error.get("err_code") in ALREADY_TAKEN:
            return False
        raise APIError.from_error(error)  # e.g. NotFoundError: no fact stream yet

    async def close(self) -> None:
        """Delete the team's consumers (unsubscribing ends an ordered consumer)."""
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            try:
                await feed.sub.unsubscribe()
                if feed.name is not None:
                    await self.nc.jetstream().delete_consumer(FACTS_STREAM, feed.name)
            except Exception:  # the connection went away: the server removes it when idle
                pass

    async def _on_fact(self, feed: _Feed, msg) -> None:
        feed.received += 1
        fact = decode_fact(msg.data)
        seq = fact.command_seq
        headers = msg.headers or {}
        writer, _, index = headers.get("Nats-Msg-Id", "").rpartition(":")
        writer = writer.split(":", 1)[0]
        seen = self.facts.setdefault(seq, [])
        seen.append(fact)
        self._marks[seq] = _Mark(msg.metadata.sequence.stream,
                                 int(index) if index.isdigit() else len(seen) - 1,
                                 int(headers.get("Qm-Facts", "1")), writer)  # fmt: skip
        if seq > self._latest.get(writer, 0):
            self._latest[writer] = seq
        if fact.kind == "JobSubmitted":
            self.routes[fact.job_id] = (fact.job_queue, fact.quota_share_name)
        self.changed.set()

    def decided(self, seq: int) -> bool:
        mark = self._marks.get(seq)
        if mark is None:
            return False
        return (seq in self._complete or len(self.facts[seq]) >= mark.count
                or self._latest.get(mark.writer, 0) > seq)  # fmt: skip

    async def wait(self, seqs: list[int], timeout: float) -> list[int]:
        """Waits until every one of `seqs` is decided; returns those still undecided."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            self.changed.clear()
            pending = [seq for seq in seqs if not self.decided(seq)]
            partly = [seq for seq in pending if seq in self._marks and self.team is not None]
            if partly:
                await self._settle(partly)
                pending = [seq for seq in pending if not self.decided(seq)]
            remaining = deadline - loop.time()
            if not pending or remaining <= 0:
                return pending
            await wait_set(self.changed, min(remaining, POLL_S) if partly else remaining)

    async def _settle(self, seqs: list[int]) -> None:
        """Marks complete those of `seqs` (some of whose facts a team saw, fewer than were
        recorded) whose last fact the log holds, once every fact under the share stored so
        far was delivered: the rest were recorded under other shares.  Per-queue partitions
        share the log, so there a command's facts may not be contiguous and the bound is a
        lower one: a short grace then (SHARED_LOG_SETTLE_S), and the consumer looked at again."""
        js = self.nc.jetstream()
        last = (await js.stream_info(FACTS_STREAM)).state.last_seq
        stored = [seq for seq in seqs if last >= self._marks[seq].last]
        if not stored or not await self._caught_up():
            return
        if any(self._marks[seq].shared for seq in stored):
            await asyncio.sleep(SHARED_LOG_SETTLE_S)
            if not await self._caught_up():
                return
        self._complete.update(stored)

    async def _caught_up(self) -> bool:
        js = self.nc.jetstream()
        for feed in list(self._feeds.values()):
            info = await js.consumer_info(FACTS_STREAM, feed.name)
            if info.num_pending or info.delivered.consumer_seq != feed.received:
                return False
        return True
