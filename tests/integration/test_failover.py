"""Crashes and failover of the single writer, against a real nats-server.

Ticks are switched off in every scheduler process of this file (a Tick is a command published
by the scheduler itself; it would shift the command sequences between runs), so the command
stream holds exactly what the test published, in the same order and with the same sequences
on every fresh server.  The workload's commands carry `at`, so the facts do not depend on when
they were published either: an interrupted run must give the very facts of an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal

import pytest

from quotasched.events.subjects import FACTS_STREAM, fact_subject
from quotasched.services.nats.bus import AppendRefused, FactAppender
from quotasched.services.client import Bus
from quotasched.services.nats.embedded import EmbeddedServer
from quotasched.services.nats.log import ALL_FACTS
from tests.integration.helpers import (
    NO_TICKS,
    api_ready,
    assert_alive,
    assert_decided_once,
    assert_same_facts,
    comparable,
    eventually,
    generate_workload,
    holder_of,
    lease_holder,
    log_events,
    logged,
    publish_items,
    read_facts,
    replayed_as_live,
    wait_decided,
)

pytestmark = pytest.mark.nats

LEASE_TTL_S = 3.0  # the spawn fixture's QUOTASCHED_LEASE_TTL_S
KILLS = 6
COMMANDS = 6000


async def wait_leading(process, timeout: float = 25.0) -> str:
    async def leading():
        return holder_of(process)

    return await eventually(leading, timeout, what=f"{process.args} leading")


async def two_schedulers(spawn):
    """(leader, standby, the leader's lease holder name) of two schedulers started together."""
    first, second = spawn("scheduler", **NO_TICKS), spawn("scheduler", **NO_TICKS)

    async def someone_leads():
        return holder_of(first) or holder_of(second)

    holder = await eventually(someone_leads, 25, what="a leader")
    return (first, second, holder) if holder_of(first) else (second, first, holder)


async def uninterrupted_run(tmp_path, spawn, items) -> tuple[list[dict], list[dict]]:
    """The fact log of the same commands on a fresh server, with one scheduler never stopped,
    and the offline replay of the commands at the times that server stamped them."""
    server = EmbeddedServer(tmp_path / "nats-baseline").start()
    try:
        scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=server.url, **NO_TICKS)
        async with Bus(server.url) as bus:
            await wait_leading(scheduler)
            seqs = await publish_items(bus, items)
            assert seqs == list(range(1, len(items) + 1))
            await wait_decided(bus.js, seqs[-1], timeout=45)
            facts = await read_facts(bus.js)
            expected = await replayed_as_live(bus.js, items, seqs)
        scheduler.stop()
    finally:
        server.stop()
    return facts, expected


@pytest.mark.slow
async def test_sigkill_at_random_points_loses_and_duplicates_nothing(tmp_path, nats_server, spawn):
    """Six SIGKILLs of the writer at seeded random moments after it took the lead: during its
    recovery, while it works through the backlog that piled up while no one led, or while it
    keeps up with the stream.  The log must come out exactly as in a run without crashes."""
    items = generate_workload(seed=20240917, count=COMMANDS)
    baseline, replayed = await uninterrupted_run(tmp_path, spawn, items)
    # the uninterrupted live run is itself the offline decision of the same commands
    assert_same_facts(baseline, replayed, drop=(), context="uninterrupted run:")
    assert_decided_once(baseline)

    rng = random.Random(20240917)
    scheduler = spawn("scheduler", **NO_TICKS)
    kills: list[tuple[int, float]] = []  # (commands published when killed, delay after leading)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)  # it has declared the streams
        published: list[int] = []
        killing = asyncio.Event()
        killing.set()

        async def pace(index: int) -> None:
            # a steady stream (~250 commands/s) while the kills go on, then full speed
            if killing.is_set() and index % 25 == 0:
                await asyncio.sleep(0.1)

        publisher = asyncio.create_task(publish_items(bus, items, pace, published))
        for _ in range(KILLS):
            await wait_leading(scheduler)
            delay = rng.uniform(0.0, 0.8)
            await asyncio.sleep(delay)
            scheduler.kill()
            kills.append((len(published), round(delay, 3)))
            scheduler = spawn("scheduler", **NO_TICKS)
        killing.clear()
        await publisher
        assert published == list(range(1, len(items) + 1))
        await wait_leading(scheduler)
        await wait_decided(bus.js, published[-1], timeout=45, processes=[scheduler])
        facts = await read_facts(bus.js)
        replayed = await replayed_as_live(bus.js, items, published)

    assert len(kills) >= 5
    context = f"kills (commands published, seconds after leading) {kills}:"
    assert_same_facts(facts, baseline, context=context)
    # every command decided at its stream timestamp, so even the logical times agree
    assert_same_facts(facts, replayed, drop=(), context=context)
    assert_decided_once(facts)


async def test_two_schedulers_one_leads_and_the_standby_takes_over(nats_server, spawn):
    items = generate_workload(seed=7, count=240)
    leader, standby, holder = await two_schedulers(spawn)
    async with Bus(nats_server.url) as bus:
        assert await lease_holder(bus.js) == holder
        await api_ready(bus)

        half = len(items) // 2
        seqs = await publish_items(bus, items[:half])
        await wait_decided(bus.js, seqs[-1])
        await asyncio.sleep(LEASE_TTL_S / 2)  # a few renewals: the standby still only waits
        assert holder_of(standby) is None, "two schedulers led at the same time"
        assert await lease_holder(bus.js) == holder
        written_by_leader = await read_facts(bus.js)
        expected = await replayed_as_live(bus.js, items[:half], seqs)
        assert comparable(written_by_leader, drop=()) == expected[:len(written_by_leader)]

        leader.kill()
        publisher = asyncio.create_task(publish_items(bus, items[half:]))
        # the lease's expiry bounds the hand-over; the ceiling is generous (a shared machine)
        successor = await wait_leading(standby, timeout=10 * LEASE_TTL_S + 30)
        assert successor != holder
        seqs += await publisher
        await wait_decided(bus.js, seqs[-1], timeout=30, processes=[standby])
        assert_alive(standby)
        assert await lease_holder(bus.js) == successor
        facts = await read_facts(bus.js)
        expected = await replayed_as_live(bus.js, items, seqs)

    # the standby wrote everything after what the leader had written, from where it stopped
    recovered = logged(standby, "recovered")[-1]
    assert recovered["fact_seq"] == len(written_by_leader)
    # ... and it was hot: it had followed the log while waiting, so taking over folded nothing
    # more under the lease (a long fold against the lease's expiry would lose it again)
    assert logged(standby, "state rebuilt"), "the standby never rebuilt its state while waiting"
    assert recovered["tail_folded"] == 0, recovered
    for process in (leader, standby):  # every instance rebuilt its state before it led
        events = [event.get("event") for event in log_events(process)]
        assert events.index("state rebuilt") < events.index("leading"), events[:5]
    assert_decided_once(facts)
    assert_same_facts(facts, expected, drop=())


async def test_frozen_leader_is_fenced_and_steps_down(nats_server, spawn):
    items = generate_workload(seed=99, count=240)
    old, standby, holder = await two_schedulers(spawn)
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        third = len(items) // 3
        seqs = await publish_items(bus, items[:third])
        await wait_decided(bus.js, seqs[-1])
        before_freeze = await read_facts(bus.js)
        stale_fence = before_freeze[-1]["_seq"]  # the old leader's view of the log's end

        # freeze the leader with commands still arriving, past its lease
        old.signal(signal.SIGSTOP)
        try:
            seqs += await publish_items(bus, items[third:2 * third])
            successor = await wait_leading(standby, timeout=4 * LEASE_TTL_S + 5)
            assert successor != holder
            assert await lease_holder(bus.js) == successor
            await wait_decided(bus.js, seqs[-1], timeout=15, processes=[standby])
            assert_alive(standby)
            decided_by_successor = await read_facts(bus.js)
            assert len(decided_by_successor) > len(before_freeze)

            # what the old leader would append now is refused: the log moved past its fence
            zombie = [(fact_subject("JobSubmitted", "fq", "alpha"), b"{}",
                       {"Nats-Msg-Id": "zombie:1:0"})]  # fmt: skip
            appender = await FactAppender(bus.nc, ALL_FACTS, stale_fence).start()
            try:
                (future,) = await appender.append(zombie)
                with pytest.raises(AppendRefused) as refused:
                    await asyncio.wait_for(future, 5.0)
            finally:
                await appender.close()
            assert refused.value.code == 10071, refused.value  # wrong last sequence
            assert (await read_facts(bus.js)) == decided_by_successor
        finally:
            old.signal(signal.SIGCONT)

        # the old leader wakes up, finds it lost the lease or its append refused, steps down
        async def stepped_down():
            return logged(old, "stepped down")

        events = await eventually(stepped_down, 15, what="the old leader stepping down")
        assert events[-1]["reason"]
        seqs += await publish_items(bus, items[2 * third:])
        await wait_decided(bus.js, seqs[-1], timeout=30, processes=[standby, old])
        assert_alive(standby, old)
        assert await lease_holder(bus.js) == successor
        assert len(logged(old, "leading")) == 1, "the old leader led again"
        facts = await read_facts(bus.js)
        info = await bus.js.stream_info(FACTS_STREAM)
        expected = await replayed_as_live(bus.js, items, seqs)

    assert info.state.last_seq == len(facts)
    assert_decided_once(facts)
    assert_same_facts(facts, expected, drop=())


async def test_a_leader_whose_log_moved_under_it_has_its_own_append_refused_and_steps_down(
        nats_server, spawn):  # fmt: skip
    """The fence, on the scheduler's own append: a newer writer appends to the fact log (as a
    successor that took over during a pause would), so the leader's view of the log's end is
    stale.  Its next append is refused by the server (10071, wrong last sequence), it steps
    down naming the refusal, and its next term decides the command from the log as it is:
    once, after the newer writer's fact, nothing lost or doubled."""
    scheduler = spawn("scheduler", **NO_TICKS)
    items = generate_workload(seed=11, count=20)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await api_ready(bus)
        seqs = await publish_items(bus, items[:-1])
        await wait_decided(bus.js, seqs[-1], processes=[scheduler])
        # the newer writer's fact: a refusal of a command it decided (a valid fact to fold)
        foreign = {"kind": "CommandRejected", "at": 1.0, "commandSeq": seqs[-1],
                   "commandKind": "Tick", "statusReason": "decided by a newer leader"}  # fmt: skip
        await bus.js.publish(fact_subject("CommandRejected"), json.dumps(foreign).encode(),
                             stream=FACTS_STREAM, headers={"Nats-Msg-Id": "newer:1:0"})
        seqs += await publish_items(bus, items[-1:])
        await wait_decided(bus.js, seqs[-1], timeout=30, processes=[scheduler])
        facts = await read_facts(bus.js)
    refused = [event for event in logged(scheduler, "stepped down")
               if "refused" in str(event.get("reason"))]
    assert refused, [event.get("reason") for event in logged(scheduler, "stepped down")]
    assert "10071" in str(refused[0]) or "wrong last sequence" in str(refused[0]), refused[0]
    assert_alive(scheduler)
    last = [fact for fact in facts if fact["commandSeq"] == seqs[-1]]
    assert last and facts.index(last[0]) > next(
        index for index, fact in enumerate(facts) if fact.get("statusReason") == foreign[
            "statusReason"])  # after the newer writer's fact  # fmt: skip
    assert_decided_once([fact for fact in facts if fact is not None])
