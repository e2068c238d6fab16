"""`quotasched up` restarts its own nats-server when a full disk left the store failed
(issue 17, point 6).

When the disk under JetStream's store fills up for real (ENOSPC: another process wrote to
it), nats-server 2.15 hits a write error on a stream, marks the stream failed and answers no
write to it until it restarts, even once there is space again.  The scheduler sees that and
reports the store full (`WriterHealth.storage_full`: "disk full" in the log, /healthz 503); it
keeps every unrecorded command in the command stream and keeps trying, in vain.

`up` owns its embedded nats-server, so it can apply the remedy itself.  `StorageWatch` looks
at the free space of the data directory's filesystem (`os.statvfs`) every second.  When the
scheduler reports the store full, or the disk itself was short of space, and then more than a
margin is free, it gives the scheduler time to try again (`grace_s`: a couple of its
retries); if the scheduler still cannot write (the store reported full, or no term of office:
a failed lease bucket keeps even its stale lease), it restarts the server (SIGTERM, wait,
start on the same port and store), logging loudly what it does and why.  Every client
reconnects by itself (nats-py), the scheduler takes its lease again and decides every stored
command from where the fact log ends.  A restart that does not help is tried again later,
each time waiting twice as long (at most `MAX_GRACE_S`).

With an external server (`--nats-url`) nothing restarts it: docs/operations.md, "Disk full".
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from quotasched.services import logs
from quotasched.services.nats.waits import sleep_or

log = logs.get("quotasched.storage")

MARGIN_BYTES = 64 * 1024 * 1024  # space counts as back above this (or 10% of a small disk)
POLL_S = 1.0
MAX_GRACE_S = 600.0


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def default_margin(path: str | Path) -> int:
    """MARGIN_BYTES, or a tenth of the filesystem if that is smaller (a small volume)."""
    stats = os.statvfs(path)
    return min(MARGIN_BYTES, stats.f_blocks * stats.f_frsize // 10)


class StorageWatch:
    """Restart the embedded server when space is back but the store still refuses writes.

    `storage_full()`: why the scheduler reports the store full, or None (its
    `health.storage_full`); `leading()`: whether it leads (writes) now.  `restart()`:
    restarts the server; raising means it did not start (logged; tried again later).
    `grace_s`: how long, after space is back, the scheduler may go on failing to write before
    the server is restarted.

    An episode begins when the scheduler reports the store full or the watch itself sees the
    disk short of space; it ends when the scheduler leads, reports nothing and the disk has
    room, for `grace_s` (its report clears for a moment at each try while the store is full:
    taking the lease works, then the append fails again)."""

    def __init__(self, path: str | Path, storage_full: Callable[[], str | None],
                 leading: Callable[[], bool], restart: Callable[[], Awaitable[None]],
                 grace_s: float, margin: int | None = None, poll_s: float = POLL_S):  # fmt: skip
        self.path = Path(path)
        self.storage_full = storage_full
        self.leading = leading
        self.restart = restart
        self.base_grace_s = self.grace_s = grace_s
        self.margin = margin
        self.poll_s = poll_s
        self.restarts = 0
        self._signal_at: float | None = None  # store reported full, or disk short, last seen
        self._space_back_since: float | None = None  # more than the margin free, since
        self._said_waiting = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await sleep_or(stop, self.poll_s)
            if stop.is_set():
                return
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the watch must never take `up` down
                log.error("the storage watch failed; it goes on", error=repr(error),
                          exc_info=True)  # fmt: skip

    async def check(self) -> None:
        """One look: restart the server if space is back and the scheduler still cannot
        write (the store reported full, or no term of office)."""
        now = time.monotonic()
        cause = self.storage_full()
        failing = cause or (None if self.leading() else "the scheduler does not lead")
        margin = self.margin if self.margin is not None else default_margin(self.path)
        free = free_bytes(self.path)
        if free <= margin:
            self._signal_at, self._space_back_since = now, None
            if not self._said_waiting:
                log.warning("disk full: up restarts its nats-server once the data directory's "
                            "disk has space again", data_dir=str(self.path), free_bytes=free,
                            margin_bytes=margin, cause=cause)  # fmt: skip
                self._said_waiting = True
            return
        if cause is not None:
            self._signal_at = now
        if self._signal_at is None:
            return  # no episode
        if failing is None:
            if now - self._signal_at >= self.grace_s:  # writes land again: the episode is over
                self._signal_at = self._space_back_since = None
                self._said_waiting = False
                self.grace_s = self.base_grace_s
            return
        if self._space_back_since is None:
            self._space_back_since = now
            log.warning("disk space back on the data directory's disk; if the store still "
                        "refuses writes, up restarts its nats-server",
                        data_dir=str(self.path), free_bytes=free, margin_bytes=margin,
                        restart_after_s=round(self.grace_s, 1))  # fmt: skip
            return
        if now - self._space_back_since < self.grace_s:
            return
        log.error("restarting the embedded nats-server: the data directory's disk has space "
                  "again but the store still refuses writes (nats-server keeps a stream that "
                  "hit a write error failed until it restarts); clients reconnect by "
                  "themselves", data_dir=str(self.path), free_bytes=free,
                  seconds_with_space=round(now - self._space_back_since, 1),
                  cause=failing)  # fmt: skip
        started = time.monotonic()
        self.restarts += 1
        try:
            await self.restart()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.error("the embedded nats-server did not start again; up tries later",
                      error=str(error), retry_after_s=round(self.grace_s * 2, 1))  # fmt: skip
        else:
            log.warning("embedded nats-server restarted on the same port and store",
                        seconds=round(time.monotonic() - started, 2),
                        restarts=self.restarts)  # fmt: skip
        # give it time to help; if it does not, the next restart waits twice as long
        self._space_back_since = time.monotonic()
        self.grace_s = min(self.grace_s * 2, MAX_GRACE_S)
