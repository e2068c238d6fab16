"""Crash tests: SIGKILL of the scheduler, the projector and the executor at random points
under a steady stream of commands, against a real nats-server.

The promise checked: nothing lost, nothing duplicated, every command decided once.  The
scheduler's fact log after 22 kills equals the core's offline decision of the same commands,
fact for fact (ticks are off, and the commands carry `at`, so even the logical times agree);
the projector's DuckDB file after several kills equals a clean rebuild of that log; an
executor killed mid-work never starts the same attempt of a job twice.

Each kill-restart cycle is short: the lease lives 2 s (the smallest allowed), and the next
scheduler process is started the moment the previous one is killed, so its start-up overlaps
the wait for the dead leader's lease to expire.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections import Counter

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from quotasched.services.projector.client import request, wait_for_position
from tests.integration.helpers import (
    NO_TICKS,
    assert_decided_once,
    assert_same_facts,
    generate_workload,
    publish_items,
    read_facts,
    replayed_as_live,
    setup_commands,
    wait_decided,
    wait_quiet,
)
from tests.integration.test_failover import wait_leading
from tests.integration.test_projector_live import (
    assert_same_tables,
    file_checksums,
    nats_checksums,
    rebuilt_checksums,
    wait_projector,
    write_fact_file,
)
from tests.reliability.support import read_stream

pytestmark = [pytest.mark.nats, pytest.mark.slow]

SCHEDULER_KILLS = 22
PROJECTOR_KILLS = 6
COMMANDS = 5000
FAST_LEASE = {**NO_TICKS, "QUOTASCHED_LEASE_TTL_S": "2"}
SMALL_BATCHES = {"QUOTASCHED_PROJECTOR_MAX_BATCH": "20", "QUOTASCHED_PROJECTOR_MAX_WAIT_MS": "0"}


async def test_scheduler_and_projector_killed_at_random_points(tmp_path, nats_server, spawn):
    """22 SIGKILLs of the single writer (during recovery, while it catches up the backlog,
    or while it keeps pace) and 6 of the projector (most likely mid-transaction), at seeded
    random moments, while commands arrive steadily."""
    seed = 20261130
    items = generate_workload(seed=seed, count=COMMANDS)
    rng = random.Random(seed)
    db = tmp_path / "killed.duckdb"
    scheduler = spawn("scheduler", **FAST_LEASE)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)  # it has declared the streams
        projector = spawn("projector", "--db", str(db), **SMALL_BATCHES)
        await wait_projector(bus, projector)
        killing = asyncio.Event()
        killing.set()
        published: list[int] = []

        async def pace(index: int) -> None:
            # a steady ~100 commands/s while the kills go on, then full speed
            if killing.is_set() and index % 10 == 0:
                await asyncio.sleep(0.1)

        async def kill_projector() -> list[int]:
            nonlocal projector
            positions = []
            for _ in range(PROJECTOR_KILLS):
                await wait_projector(bus, projector, timeout=60, ask_s=15.0)  # a restart, far behind
                await asyncio.sleep(rng.uniform(0.5, 4.0))
                position = (await request(bus.nc, "position", timeout=5.0))["position"]
                projector.kill()
                assert projector.popen.returncode == -signal.SIGKILL
                positions.append(position)
                projector = spawn("projector", "--db", str(db), **SMALL_BATCHES)
            return positions

        publisher = asyncio.create_task(publish_items(bus, items, pace, published))
        projector_kills = asyncio.create_task(kill_projector())
        kills: list[tuple[int, float]] = []  # (commands published when killed, delay)
        for _ in range(SCHEDULER_KILLS):
            await wait_leading(scheduler, timeout=30)
            delay = rng.uniform(0.0, 0.8)
            await asyncio.sleep(delay)
            scheduler.kill()
            assert scheduler.popen.returncode == -signal.SIGKILL
            kills.append((len(published), round(delay, 3)))
            scheduler = spawn("scheduler", **FAST_LEASE)
        projector_positions = await projector_kills
        killing.clear()
        await publisher
        assert published == list(range(1, len(items) + 1))
        await wait_leading(scheduler, timeout=30)
        await wait_decided(bus.js, published[-1], timeout=60, processes=[scheduler])
        facts = await read_facts(bus.js)

        context = f"scheduler kills (commands published, seconds after leading) {kills}:"
        expected = await replayed_as_live(bus.js, items, published)
        assert_same_facts(facts, expected, drop=(), context=context)
        assert_decided_once(facts)
        assert len(kills) == SCHEDULER_KILLS
        # the kills were spread over the stream, not all before or after it
        assert len({published for published, _ in kills}) >= SCHEDULER_KILLS // 2

        # the projector, killed 6 times, ends equal to a clean rebuild of the same log
        last = len(facts)
        await wait_projector(bus, projector, timeout=60, ask_s=15.0)
        assert await wait_for_position(bus.nc, last, timeout=90) == last
        facts_file = tmp_path / "facts.jsonl"
        assert await write_fact_file(bus.js, facts_file) == last
        rebuilt = rebuilt_checksums(facts_file, tmp_path / "rebuilt.duckdb")
        live = await nats_checksums(bus.nc)
        assert live[0] == rebuilt[0] == last
        context = f"projector killed at positions {projector_positions}"
        assert_same_tables(live[1], rebuilt[1], context)
        assert len(set(projector_positions)) > 1, "the projector kills were not mid-stream"
    assert projector.stop() == 0
    assert_same_tables(file_checksums(db)[1], rebuilt[1], context + ", stopped")


EXECUTOR_KILLS = 5
JOBS = 400


async def test_executor_killed_at_random_points_never_starts_an_attempt_twice(nats_server, spawn):
    """The simulated executor, killed with SIGKILL 5 times while jobs are dispatched and
    finish around it, and restarted each time on its durable consumer: no (job, attempt) is
    ever started twice (one STARTING report at most, in the command stream and in the log),
    and the last executor keeps starting and finishing jobs."""
    rng = random.Random(77)
    shares = [("alpha", 100, "LEND_AND_BORROW", "ENABLED"), ("beta", 100, "LEND", "DISABLED")]
    setup = setup_commands("eq", shares=shares, capacity=200)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup)
        executor = spawn("executor", "--kind", "simulated", "--speed", "10")
        submitted = asyncio.Event()

        async def submit() -> None:
            for number in range(JOBS):
                await bus.publish({
                    "kind": "SubmitServiceJob", "jobId": f"ej-{number:04d}",
                    "jobName": f"ej-{number:04d}", "jobQueue": "eq",
                    "quotaShareName": rng.choice(("alpha", "beta")),
                    "schedulingPriority": rng.randrange(10),
                    "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
                    "tags": {"duration": str(rng.uniform(1.0, 8.0))},
                })  # fmt: skip
                await asyncio.sleep(0.03)
            submitted.set()

        submitter = asyncio.create_task(submit())
        kills = 0
        while kills < EXECUTOR_KILLS:
            await asyncio.sleep(rng.uniform(0.8, 2.5))
            executor.kill()
            assert executor.popen.returncode == -signal.SIGKILL
            kills += 1
            executor = spawn("executor", "--kind", "simulated", "--speed", "10")
        await submitter
        last_kill_facts = (await bus.js.stream_info("QM_FACTS")).state.last_seq
        # a dispatch a killed executor had not acked is delivered again to the next one (after
        # the consumer's ack wait); the executor acks before its STARTING report leaves on the
        # same connection, so such a dispatch was never started, and starting it is its first
        await wait_quiet(bus.js, seconds=2.0, timeout=60)
        reports = await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.eq.*.ReportJobStatus")
        facts = await read_facts(bus.js)
    starting = Counter((report["jobId"], report["attempt"]) for _, report in reports
                       if report and report.get("status") == "STARTING")  # fmt: skip
    twice = {key: n for key, n in starting.items() if n > 1}
    assert not twice, f"attempts started more than once: {twice}"
    started_facts = Counter((f["jobId"], f["attempt"]) for f in facts
                            if f["kind"] == "JobStatusChanged" and f["status"] == "STARTING")
    assert max(started_facts.values()) == 1
    assert len(starting) >= JOBS // 4, f"only {len(starting)} attempts started"
    # the executor running at the end recovered by itself: it finished jobs after the last kill
    finished_after = [f for f in facts if f["_seq"] > last_kill_facts
                      and f["kind"] == "JobStatusChanged" and f["status"] == "SUCCEEDED"]
    assert finished_after, "no job finished after the last executor restart"
    assert_decided_once(facts)
