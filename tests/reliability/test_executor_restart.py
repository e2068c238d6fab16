"""Executors against a real nats-server and scheduler: restarting a process executor costs
no running job its work.

A process executor stopped gracefully (SIGTERM) or killed (SIGKILL) while it runs a job
leaves the job's process running; the next executor started with the same --state-dir
follows that very process (the job records its own pid) to its end: the job has one attempt,
reported STARTING and RUNNING once, and ends SUCCEEDED.  With --stop-jobs a shutdown stops
the job and reports it FAILED, and the job's retryStrategy gives it a second attempt.

An executor started with --job-queue runs that queue's jobs only, so one executor per queue
can share the work."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from quotasched.services.executors.base import SHUT_DOWN
from quotasched.services.executors.ledger import Entry, Ledger, process_alive
from tests.integration.helpers import eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def ledger_entries(tmp_path) -> list[Entry]:
    path = tmp_path / "executor-state" / "executor-process.json"
    return list(Ledger(str(path)).entries.values()) if path.exists() else []


async def ledger_emptied(tmp_path) -> None:
    """The executor forgets an attempt once its end is acknowledged, a moment after the fact
    is in the log: wait for it (20 s at most)."""
    await eventually(lambda: asyncio.sleep(0, ledger_entries(tmp_path) == []),
                     what="an empty ledger")  # fmt: skip


def recording_job(pidfile: Path, go: Path) -> str:
    """A job that writes its pid, then runs until `go` exists (90 s at most), and exits 0."""
    return f"sh -c 'echo $$ > {pidfile}; i=0; while [ ! -e {go} ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; exit 0'"


async def facts_where(bus: Bus, **match):
    facts = await read_facts(bus.js)
    return [f for f in facts if all(f.get(k) == v for k, v in match.items())]


async def pid_of(pidfile: Path) -> int:
    async def written():
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        return int(text) if text else None

    return await eventually(written, 30, what=f"{pidfile} written by the job")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_restarted_process_executor_follows_the_job_it_left_running(
        tmp_path, nats_server, spawn, how):  # fmt: skip
    scheduler = spawn("scheduler")
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("rq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        first = spawn("executor", "--kind", "process")
        await bus.publish({
            "kind": "SubmitServiceJob", "jobId": "long", "jobName": "long", "jobQueue": "rq",
            "quotaShareName": "alpha", "retryStrategy": {"attempts": 2},
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            "tags": {"command": recording_job(pidfile, go)},
        })  # fmt: skip
        await eventually(lambda: facts_where(bus, kind="JobStatusChanged", status="RUNNING"),
                         30, what="attempt 1 RUNNING")  # fmt: skip
        pid = await pid_of(pidfile)
        [entry] = ledger_entries(tmp_path)
        if how == "sigterm":
            assert first.stop() == 0
            assert "1 attempts keep running; start again to follow them" in first.output()
        else:
            first.kill()  # SIGKILL to the executor's process group; the job has its own session
            assert first.popen.returncode == -signal.SIGKILL
        await asyncio.sleep(0.5)
        assert process_alive(entry.pid, entry.pid_started), "the job stopped with its executor"
        assert pidfile.read_text().strip() == str(pid)

        second = spawn("executor", "--kind", "process")
        await eventually(lambda: _says(second, "following 1 attempts"), 30,
                         what="the second executor following the attempt")  # fmt: skip
        assert process_alive(entry.pid, entry.pid_started)
        job = await bus.request("describe-service-job", jobId="long")
        assert job["status"] == "RUNNING" and len(job["attempts"]) == 1, job
        go.touch()
        [ended] = await eventually(
            lambda: facts_where(bus, kind="JobStatusChanged", status="SUCCEEDED"), 30,
            what="the job's end reported by the second executor")  # fmt: skip
        assert ended["attempt"] == 1 and ended["cause"] == "REPORTED"
        assert pidfile.read_text().strip() == str(pid), "the job was started again"
        changes = [(f["attempt"], f["status"])
                   for f in await facts_where(bus, kind="JobStatusChanged", jobId="long")]
        assert changes == [(1, "STARTING"), (1, "RUNNING"), (1, "SUCCEEDED")], changes
        job = await bus.request("describe-service-job", jobId="long")
        assert job["status"] == "SUCCEEDED" and len(job["attempts"]) == 1, job
        await ledger_emptied(tmp_path)


async def _says(process, text: str) -> bool:
    return text in process.output()


async def test_stop_jobs_makes_a_shutdown_stop_the_job_and_report_it_for_a_retry(
        tmp_path, nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("rq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        first = spawn("executor", "--kind", "process", "--stop-jobs")
        await bus.publish({
            "kind": "SubmitServiceJob", "jobId": "long", "jobName": "long", "jobQueue": "rq",
            "quotaShareName": "alpha", "retryStrategy": {"attempts": 2},
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            "tags": {"command": "sleep 300"},
        })  # fmt: skip
        await eventually(lambda: facts_where(bus, kind="JobStatusChanged", status="RUNNING"),
                         30, what="attempt 1 RUNNING")  # fmt: skip
        [entry] = await eventually(lambda: _with_pid(tmp_path), 10, what="the ledger's pid")
        assert first.stop() == 0  # SIGTERM: --stop-jobs stops and reports what it runs
        assert not process_alive(entry.pid, entry.pid_started)
        [retried] = await eventually(
            lambda: facts_where(bus, kind="JobStatusChanged", attempt=1, status="RUNNABLE"), 30,
            what="attempt 1 ended")  # fmt: skip
        assert retried["cause"] == "RETRY" and retried["statusReason"] == SHUT_DOWN
        await ledger_emptied(tmp_path)
        second = spawn("executor", "--kind", "process", "--stop-jobs")
        await eventually(lambda: facts_where(bus, kind="JobStatusChanged", attempt=2,
                                             status="RUNNING"), 30, what="attempt 2 RUNNING")
        assert second.stop() == 0
        starts = await facts_where(bus, kind="JobStatusChanged", status="STARTING")
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
