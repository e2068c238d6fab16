"""Spreading the partitions per job queue over the scheduler processes that can run them.

Leases alone would leave every partition with the first process that started: it takes every
free lease at once.  So each process running partitions per job queue announces itself in the
lease bucket (`scheduler.member.<process>`, refreshed every quarter of the lease TTL, gone
when the process stops refreshing it), with the partitions it runs and those it leads.  A
process that leads two or more partitions more than another live process that could lead one
of them hands that one over: it stops deciding, lands what it has in flight, releases the
lease, and leaves it alone for two lease TTLs, so the other process (a hot standby that has
followed the log) takes it.  One hand-over per process per two TTLs, so the spread settles
without flapping: every process ends within one partition of every other that could share its
load.  Liveness comes first: a free lease is always taken, whatever the counts.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from quotasched.events.subjects import LEASES_BUCKET
from quotasched.services.scheduler.lease import UNANSWERED
from quotasched.services.nats.waits import sleep_or

PREFIX = "scheduler.member."


@dataclass
class Member:
    partitions: list[str]
    leading: list[str]


@dataclass
class Members:
    """This process's view of the scheduler processes that run partitions per job queue."""

    partitions: list[str]  # the partitions this process runs
    ttl_s: float
    process: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    leading: set[str] = field(default_factory=set)
    others: dict[str, Member] = field(default_factory=dict)
    _handed_over_at: float = float("-inf")
    _released: dict[str, float] = field(default_factory=dict)  # partition -> until when
    _revisions: dict[str, tuple[int, float]] = field(default_factory=dict)  # process -> (revision, since)

    async def run(self, js: JetStreamContext, stop) -> None:
        """Refresh every quarter of the lease TTL until `stop` (an asyncio.Event) is set."""
        while not stop.is_set():
            await self.refresh(js)
            await sleep_or(stop, self.ttl_s / 4)

    async def refresh(self, js: JetStreamContext) -> None:
        """Announce this process, and read who else is there (quietly keeps the last view
        when the bucket does not answer)."""
        try:
            kv = await js.key_value(LEASES_BUCKET)
            document = {"partitions": self.partitions, "leading": sorted(self.leading)}
            await kv.put(PREFIX + self.process, json.dumps(document).encode())
            others, now = {}, time.monotonic()
            for key in await kv.keys():
                if not key.startswith(PREFIX) or key == PREFIX + self.process:
                    continue
                try:
                    entry = await kv.get(key)
                except NotFoundError:  # expired meanwhile
                    continue
                process = key[len(PREFIX):]
                # A process that stopped refreshing its entry is dead, or cut off: its entry
                # lingers until the bucket's TTL removes it; never hand a partition to it.
                revision, since = self._revisions.get(process, (None, now))
                if entry.revision != revision:
                    revision, since = entry.revision, now
                self._revisions[process] = (revision, since)
                if entry.value and now - since < 0.6 * self.ttl_s:
                    value = json.loads(entry.value)
                    others[process] = Member(value["partitions"], value["leading"])
            self.others = others
        except (APIError, NotFoundError, ValueError, KeyError, nats.errors.Error, *UNANSWERED):
            pass

    def should_hand_over(self, partition: str, now: float | None = None) -> bool:
        """Should this process give up leading `partition` to even out the load?"""
        now = time.monotonic() if now is None else now
        if partition not in self.leading or now - self._handed_over_at < 2 * self.ttl_s:
            return False
        takers = [len(m.leading) for m in self.others.values()
                  if partition in m.partitions and partition not in m.leading]  # fmt: skip
        if not takers or len(self.leading) - min(takers) < 2:
            return False
        self._handed_over_at = now
        self._released[partition] = now + 2 * self.ttl_s
        return True

    def may_take(self, partition: str, now: float | None = None) -> bool:
        """False for a while after this process handed `partition` over."""
        now = time.monotonic() if now is None else now
        return now >= self._released.get(partition, float("-inf"))
