"""A restarted scheduler with an instance lock takes its own lease back at once after a crash
(services/scheduler/instance.py, Lease(reclaim=True)); a lease naming anyone else is never
touched.  Against a real nats-server: the lease is a KV key with compare-and-set."""

from __future__ import annotations

import asyncio
import signal

import pytest

from quotasched.events.subjects import LEASES_BUCKET
from quotasched.services.client import Bus
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.scheduler.lease import Lease
from quotasched.services.settings import Settings
from tests.integration.helpers import NO_TICKS, eventually, lease_holder, logged

pytestmark = pytest.mark.nats

TTL = 60.0  # far longer than any test here waits: only a take-back can lead in time
HOLDER = "instance-host-0123456789abcdef0123456789abcdef"


async def lease_value(js) -> str:
    entry = await (await js.key_value(LEASES_BUCKET)).get("scheduler.main")
    return entry.value.decode()


async def test_a_dead_predecessors_lease_is_taken_back_at_once(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        dead = Lease(bus.js, "main", TTL, HOLDER, reclaim=True)
        assert await dead.acquire() and not dead.reclaimed  # then it "dies": no release
        restarted = Lease(bus.js, "main", TTL, HOLDER, reclaim=True)
        assert await restarted.acquire()
        assert restarted.reclaimed and restarted.valid()
        assert await lease_value(bus.js) == HOLDER
        assert not await dead.renew()  # the old revision is gone: the old term cannot renew
        assert await restarted.renew()


async def test_without_reclaim_the_same_holder_waits_for_the_lease_to_run_out(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        assert await Lease(bus.js, "main", TTL, HOLDER).acquire()
        assert not await Lease(bus.js, "main", TTL, HOLDER).acquire()
        assert not await Lease(bus.js, "main", TTL, HOLDER, reclaim=False).acquire()
        assert not await Lease(bus.js, "main", TTL, reclaim=True).acquire()  # a random holder


async def test_a_lease_naming_another_holder_is_never_taken(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        other = Lease(bus.js, "main", TTL, HOLDER[:-1] + "0", reclaim=True)
        assert await other.acquire()
        mine = Lease(bus.js, "main", TTL, HOLDER, reclaim=True)
        assert not await mine.acquire() and not mine.reclaimed
        assert await lease_value(bus.js) == other.holder
        assert await other.renew()  # untouched: its revision still stands


async def test_a_lease_nobody_holds_is_taken_the_usual_way(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        released = Lease(bus.js, "main", TTL, HOLDER, reclaim=True)
        assert await released.acquire()
        await released.release()
        again = Lease(bus.js, "main", TTL, HOLDER, reclaim=True)
        assert await again.acquire() and not again.reclaimed


async def test_a_killed_scheduler_restarted_with_its_lock_leads_before_its_lease_runs_out(
        tmp_path, nats_server, spawn):  # fmt: skip
    """`quotasched scheduler --instance-lock FILE`, SIGKILLed while leading with a 60 s
    lease, started again with the same file: it leads again long before the lease could
    have run out, having taken its own lease back; the same file from a second live
    process is refused."""
    lock = str(tmp_path / "scheduler.lock")
    env = {**NO_TICKS, "QUOTASCHED_LEASE_TTL_S": str(TTL)}
    first = spawn("scheduler", "--instance-lock", lock, **env)
    [leading] = await eventually(lambda: _leading(first), 30, what="the first scheduler leading")
    assert leading.get("took_back_own_lease") is None
    first.signal(signal.SIGKILL)
    first.popen.wait()
    async with Bus(nats_server.url) as bus:
        assert await lease_holder(bus.js) == leading["holder"]  # the dead one's, still valid
        second = spawn("scheduler", "--instance-lock", lock, **env)
        [again] = await eventually(lambda: _leading(second), 30, what="the restarted scheduler leading")
        assert again["holder"] == leading["holder"] and again["took_back_own_lease"] is True
        assert await lease_holder(bus.js) == leading["holder"]
        third = spawn("scheduler", "--instance-lock", lock, **env)
        assert await asyncio.to_thread(third.popen.wait, 30) == 2
        assert "held by another running process" in third.output()
        assert not logged(third, "leading")


async def _leading(process) -> list[dict]:
    return logged(process, "leading")


async def test_up_takes_the_instance_lock_from_its_settings(tmp_path, nats_server):
    """`up` (the Stack) reads QUOTASCHED_INSTANCE_LOCK: its scheduler's lease names the file's
    token, and while it runs the same file is refused to anyone else."""
    from quotasched.services.runtime import Stack
    from quotasched.services.scheduler.instance import InstanceLock, InstanceLockError

    path = tmp_path / "up.instance"
    settings = Settings(nats_url=nats_server.url, lease_ttl_s=TTL, instance_lock=str(path))
    async with Stack(settings, executor="none") as stack:
        async with Bus(nats_server.url) as bus:
            holder = await lease_holder(bus.js)
        assert holder == stack.scheduler.lease.holder and stack.scheduler.lease.reclaim
        assert path.read_text().strip() in holder
        with pytest.raises(InstanceLockError):
            InstanceLock(path, wait_s=0.2).acquire()
        stack.stop.set()
    InstanceLock(path, wait_s=0.0).acquire().release()  # released when the stack stopped
