"""Leadership of one scheduling partition: a NATS KV key with compare-and-set and expiry.

`acquire` creates the key (only possible when it is absent: nobody leads, or the last leader
stopped renewing and the bucket's TTL removed it).  The leader renews it with `update` on the
revision it last wrote; a renewal that fails means someone else took over.  With `reclaim`
(the holder is an instance lock's, instance.py), a lease that names this very holder is a dead
predecessor's and is taken back at once, on the revision read.  `valid()` is the
leader's own, conservative view: it stops writing a margin before the TTL could run out.  Even
a leader that was frozen past its lease and does not know it yet cannot write: the fact log's
expected-last-sequence check refuses its append (fencing).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import nats.errors

from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError, APIError

from quotasched.events.subjects import LEASES_BUCKET

# The bucket did not answer: a request timed out, or the connection is closed or reconnecting.
UNANSWERED = (nats.errors.TimeoutError, nats.errors.ConnectionClosedError,
              nats.errors.NoRespondersError, asyncio.TimeoutError, TimeoutError, ConnectionError)


class Lease:
    def __init__(self, js: JetStreamContext, partition: str, ttl_s: float, holder: str | None = None,
                 reclaim: bool = False):  # fmt: skip
        self.js = js
        self.key = f"scheduler.{partition}"
        self.ttl_s = ttl_s
        self.holder = holder or f"scheduler-{uuid.uuid4().hex[:12]}"
        # Only for a holder no live process but this one can have (instance.py): a lease that
        # names it was left by a dead process.
        self.reclaim = reclaim and holder is not None
        self.reclaimed = False  # the last acquire took a dead predecessor's lease back
        self.revision: int | None = None
        self.valid_until = 0.0
        self.last_error: Exception | None = None  # of the last acquire that failed

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it; False also when the bucket does not answer (a
        cluster electing a new leader for it, a reconnect): the caller tries again later."""
        started = time.monotonic()
        self.last_error = None
        self.reclaimed = False
        try:
            kv = await self.js.key_value(LEASES_BUCKET)
            try:
                self.revision = await kv.create(self.key, self.holder.encode())
            except KeyWrongLastSequenceError:
                if not self.reclaim:
                    raise
                self.revision, self.reclaimed = await self._take_back(kv)
        except (KeyWrongLastSequenceError, APIError, *UNANSWERED) as error:
            self.last_error = error  # why, for the scheduler to tell a full disk apart
            return False
        self.valid_until = started + self.ttl_s * 0.75
        return True

    async def _take_back(self, kv) -> tuple[int, bool]:
        """(revision, taken back?): the lease, if it names this holder (a dead predecessor's:
        see `reclaim`), written again on the revision read; raises KeyWrongLastSequenceError
        if it names another holder or changed since it was read."""
        try:
            entry = await kv.get(self.key)
        except NotFoundError:  # it ran out meanwhile: taken the usual way
            return await kv.create(self.key, self.holder.encode()), False
        if entry.value is None or entry.value.decode(errors="replace") != self.holder:
            raise KeyWrongLastSequenceError(description="another holder leads")
        return await kv.update(self.key, self.holder.encode(), last=entry.revision), True

    async def renew(self) -> bool:
        if self.revision is None:
            return False
        kv = await self.js.key_value(LEASES_BUCKET)
        started = time.monotonic()
        try:
            self.revision = await kv.update(self.key, self.holder.encode(), last=self.revision)
        except (KeyWrongLastSequenceError, NotFoundError, APIError):
            self.revision = None
            self.valid_until = 0.0
            return False
        self.valid_until = started + self.ttl_s * 0.75
        return True

    def valid(self) -> bool:
        return self.revision is not None and time.monotonic() < self.valid_until

    async def release(self) -> None:
        """Give the lease up at once, if the bucket answers; if not, it expires by itself."""
        if self.revision is None:
            return
        try:
            kv = await self.js.key_value(LEASES_BUCKET)
            await kv.delete(self.key, last=self.revision)
        except (KeyWrongLastSequenceError, NotFoundError, APIError, *UNANSWERED):
            pass
        self.revision = None
        self.valid_until = 0.0

    async def holder_now(self) -> str | None:
        kv = await self.js.key_value(LEASES_BUCKET)
        try:
            entry = await kv.get(self.key)
        except (NotFoundError, APIError):
            return None
        return entry.value.decode() if entry.value else None
