"""Executors against a real nats-server and scheduler.

A process executor killed with SIGKILL while it runs a job, against a real nats-server and
scheduler: its job's process outlives it, and without the executor's ledger the attempt would
stay RUNNING (holding its capacity) until an attempt timeout.  The next executor started with
the same --state-dir stops that process, reports the attempt FAILED, and the job's
retryStrategy gives it a second attempt, which this executor runs; a plain shutdown (SIGTERM)
then reports that attempt FAILED too, and the job ends.

An executor started with --job-queue runs that queue's jobs only, so one executor per queue
can share the work."""

from __future__ import annotations

import asyncio
import signal

import pytest

from quotasched.services.client import Bus
from quotasched.services.executors.base import LOST, SHUT_DOWN
from quotasched.services.executors.ledger import Entry, Ledger, process_alive
from tests.integration.helpers import eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def ledger_entries(tmp_path) -> list[Entry]:
    path = tmp_path / "executor-state" / "executor-process.json"
    return list(Ledger(str(path)).entries.values()) if path.exists() else []


async def test_a_killed_executors_attempt_is_ended_and_retried_by_the_next_one(tmp_path, nats_server, spawn):
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("rq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        first = spawn("executor", "--kind", "process")
        await bus.publish({
            "kind": "SubmitServiceJob", "jobId": "long", "jobName": "long", "jobQueue": "rq",
            "quotaShareName": "alpha", "retryStrategy": {"attempts": 2},
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            "tags": {"command": "sleep 300"},
        })  # fmt: skip

        async def facts_where(**match):
            facts = await read_facts(bus.js)
            return [f for f in facts if all(f.get(k) == v for k, v in match.items())]

        await eventually(lambda: facts_where(kind="JobStatusChanged", attempt=1, status="RUNNING"),
                         30, what="attempt 1 RUNNING")  # fmt: skip
        [entry] = await eventually(lambda: _with_pid(tmp_path), 10, what="the ledger's pid")
        pid, started = entry.pid, entry.pid_started
        first.kill()  # SIGKILL to the executor's process group; the job has its own session
        assert first.popen.returncode == -signal.SIGKILL
        await asyncio.sleep(0.5)
        assert process_alive(pid, started), "the job's process should outlive the executor"
        assert not await facts_where(kind="JobStatusChanged", attempt=1, status="RUNNABLE")

        second = spawn("executor", "--kind", "process")
        [retried] = await eventually(
            lambda: facts_where(kind="JobStatusChanged", attempt=1, status="RUNNABLE"), 30,
            what="attempt 1 ended")  # fmt: skip
        assert retried["cause"] == "RETRY" and retried["statusReason"] == LOST
        assert not process_alive(pid, started), "the orphaned process was not stopped"
        await eventually(lambda: facts_where(kind="JobStatusChanged", attempt=2, status="RUNNING"),
                         30, what="attempt 2 RUNNING")  # fmt: skip

        assert second.stop() == 0  # SIGTERM: a shutdown reports what it interrupts
        [ended] = await eventually(
            lambda: facts_where(kind="JobStatusChanged", attempt=2, status="FAILED"), 30,
            what="attempt 2 ended")  # fmt: skip
        assert ended["statusReason"] == SHUT_DOWN and ended["cause"] == "REPORTED"
        assert ledger_entries(tmp_path) == []
        starts = await facts_where(kind="JobStatusChanged", status="STARTING")
        assert [f["attempt"] for f in starts] == [1, 2]


async def _with_pid(tmp_path):
    entries = [e for e in ledger_entries(tmp_path) if e.pid]
    return entries or None


async def test_an_executor_per_job_queue_runs_only_its_queues_jobs(nats_server, spawn):
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        for queue in ("qa", "qb"):
            await publish_items(bus, setup_commands(queue, shares=[("s", 2, "RESERVE", "DISABLED")],
                                                    capacity=2))  # fmt: skip
        spawn("executor", "--kind", "simulated", "--speed", "10", "--job-queue", "qa")
        for queue in ("qa", "qb"):
            await bus.publish({
                "kind": "SubmitServiceJob", "jobId": f"{queue}-job", "jobName": "j",
                "jobQueue": queue, "quotaShareName": "s", "tags": {"duration": "1"},
                "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            })  # fmt: skip

        async def statuses(job_id: str) -> list[str]:
            return [f["status"] for f in await read_facts(bus.js)
                    if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id]  # fmt: skip

        await eventually(lambda: _has(statuses("qa-job"), "SUCCEEDED"), 30, what="qa-job done")
        dispatched = [f for f in await read_facts(bus.js) if f["kind"] == "JobDispatched"]
        assert {f["jobId"] for f in dispatched} == {"qa-job", "qb-job"}
        assert await statuses("qb-job") == [], "an executor ran another queue's job"
        consumers = [c.name for c in await bus.js.consumers_info("QM_FACTS")]
        assert "executor-simulated-qa" in consumers


async def _has(values, wanted):
    return wanted in await values
