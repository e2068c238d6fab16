"""A process executor killed (SIGKILL) at the steps of a start and of a preemption's stop, and
started again: no attempt runs twice, nothing is left running, no exit status is lost, and
no preemptor starts before its victims have stopped (issue 30).

The kill is real and lands exactly at the step: the executor runs with QUOTASCHED_CRASH_AT
naming a crash point (services/executors/crash.py) and SIGKILLs itself there; the second
executor runs without it, on the same --state-dir, against the same nats-server and
scheduler.  Each job writes what it did to a file, so what ran is known from the jobs
themselves, not from the executor under test.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from quotasched.services.executors.ledger import process_alive
from quotasched.services.executors.process import NEVER_RAN
from tests.integration.helpers import eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.support import read_stream
from tests.reliability.test_executor_preemption_order import (
    CAPACITY,
    JOB,
    STOP_S,
    VICTIMS,
    _file_events,
    _preemption_happened,
    _setup,
    _submit,
    check_preemption_order,
)
from tests.reliability.test_executor_restart import (facts_where, ledger_emptied, ledger_entries,
                                                    pid_of)

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def killed_at(process, point: str) -> None:
    """The executor SIGKILLed itself at `point` (it says so on stderr first)."""

    async def dead():
        return process.popen.poll() is not None

    await eventually(dead, 60, what=f"the executor's crash at {point}")
    assert process.popen.returncode == -signal.SIGKILL, process.output()
    assert f"crash point {point}: SIGKILL" in process.output()


async def statuses(bus: Bus, job_id: str) -> list[tuple[int, str, str | None]]:
    return [(f["attempt"], f["status"], f.get("statusReason"))
            for f in await facts_where(bus, kind="JobStatusChanged", jobId=job_id)]


async def ended(bus: Bus, job_id: str) -> dict:
    async def done():
        job = await bus.request("describe-service-job", jobId=job_id)
        return job if job["status"] in ("SUCCEEDED", "FAILED") else None

    return await eventually(done, 60, what=f"the end of {job_id}")


def submit(job_id: str, command: str, attempts: int = 1) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "rq",
            "quotaShareName": "alpha", "retryStrategy": {"attempts": attempts},
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            "tags": {"command": command}}  # fmt: skip


async def started_scheduler(bus: Bus, spawn) -> None:
    await wait_leading(spawn("scheduler"))
    await publish_items(bus, setup_commands("rq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                            capacity=1))  # fmt: skip


async def test_a_kill_after_the_ledger_record_and_before_the_go_never_runs_the_command(
        tmp_path, nats_server, spawn):  # fmt: skip
    """Killed with the attempt's pid written down and its command not let run: the shell
    exits unrun (nothing of it is left), the next executor reports attempt 1 FAILED saying the
    command never ran, and the retry (attempt 2) is the only run."""
    runs = tmp_path / "runs"
    async with Bus(nats_server.url) as bus:
        await started_scheduler(bus, spawn)
        first = spawn("executor", "--kind", "process", QUOTASCHED_CRASH_AT="attempt-recorded")
        await bus.publish(submit("once", f"sh -c 'echo $QUOTASCHED_ATTEMPT >> {runs}'", attempts=2))
        await killed_at(first, "attempt-recorded")
        [entry] = ledger_entries(tmp_path)
        await asyncio.sleep(0.5)
        assert not process_alive(entry.pid, entry.pid_started), "the unrun shell was left"
        assert not runs.exists(), "the command ran before its go"

        spawn("executor", "--kind", "process")
        job = await ended(bus, "once")
        assert job["status"] == "SUCCEEDED" and len(job["attempts"]) == 2, job
        changes = await statuses(bus, "once")
        assert (1, "FAILED", NEVER_RAN) in changes or \
            (1, "RUNNABLE", NEVER_RAN) in changes, changes  # fmt: skip (a retry follows)
        assert runs.read_text().split() == ["2"], "the command ran other than once, as attempt 2"
        await ledger_emptied(tmp_path)


async def test_a_kill_after_the_go_and_before_running_keeps_the_exit_status(
        tmp_path, tmp_path_factory, nats_server, spawn):  # fmt: skip
    """Killed with the command running and RUNNING not reported; the job then ends (exit 3)
    while no executor runs.  The next executor reports RUNNING once and then the job's own end,
    FAILED with code 3, read from the attempt's exit record: one attempt, one run."""
    short = tmp_path_factory.mktemp("c")  # a command tag is at most 256 characters
    pidfile, go, runs = short / "job.pid", short / "go", short / "runs"
    command = (f"sh -c 'cd {short} && echo $$ > job.pid; echo run >> runs; "
               "while [ ! -e go ]; do sleep 0.05; done; exit 3'")  # fmt: skip
    async with Bus(nats_server.url) as bus:
        await started_scheduler(bus, spawn)
        first = spawn("executor", "--kind", "process", QUOTASCHED_CRASH_AT="command-started")
        await bus.publish(submit("coded", command))
        await killed_at(first, "command-started")
        pid = await pid_of(pidfile)
        [entry] = ledger_entries(tmp_path)
        assert not entry.running
        assert await statuses(bus, "coded") == [(1, "STARTING", None)]
        go.touch()  # the job ends while no executor runs
        await eventually(lambda: asyncio.sleep(0, not process_alive(entry.pid, entry.pid_started)),
                         30, what="the job's end")  # fmt: skip

        spawn("executor", "--kind", "process")
        job = await ended(bus, "coded")
        assert job["status"] == "FAILED" and len(job["attempts"]) == 1, job
        assert await statuses(bus, "coded") == [
            (1, "STARTING", None), (1, "RUNNING", None), (1, "FAILED", "Process exited with code 3")]
        assert runs.read_text().split() == ["run"] and pidfile.read_text().strip() == str(pid)
        await ledger_emptied(tmp_path)


async def test_a_kill_in_the_middle_of_a_preemptions_stop_never_starts_the_preemptor_early(
        tmp_path, tmp_path_factory, nats_server, spawn):  # fmt: skip
    """Two victims hold both instances; a preemptor needs both.  The executor is killed right
    after its SIGTERM reached the first victim (which takes STOP_S to checkpoint).  The next
    executor finds the preemption in the log it had been delivered: it stops both victims
    without reporting them (they were preempted), and starts the preemptor only after both
    processes exited; each attempt ran once, and nothing is left running."""
    short = tmp_path_factory.mktemp("c")  # a command tag is at most 256 characters
    script, log = short / "job.py", short / "events.log"
    script.write_text(JOB)
    tags = {"command": f"{sys.executable} {script} {log} {STOP_S}"}
    async with Bus(nats_server.url) as bus:
        await wait_leading(spawn("scheduler"))
        await _setup(bus)
        first = spawn("executor", "--kind", "process", QUOTASCHED_CRASH_AT="victim-signalled")
        for job_id in VICTIMS:
            await _submit(bus, job_id, priority=1, quantity=1, tags=tags)

        async def started(*jobs: str) -> bool:
            return set(jobs) <= {job for what, job, _ in _file_events(log) if what == "start"}

        await eventually(lambda: started(*VICTIMS), 60, what="both victims' processes started")
        victims = {e.job_id: e for e in ledger_entries(tmp_path)}
        await _submit(bus, "high", priority=9, quantity=CAPACITY, tags=tags)
        await _preemption_happened(bus)
        await killed_at(first, "victim-signalled")

        second = spawn("executor", "--kind", "process")
        # The preemption's facts reached the killed executor unacked: they come again after
        # the consumer's ack wait (30 s); the preemptor's start must wait for the victims.
        await eventually(lambda: started("high"), 90, what="the preemptor's process started")
        events = _file_events(log)
        facts = await read_facts(bus.js)
        commands = await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>")
        for job_id, entry in victims.items():
            assert not process_alive(entry.pid, entry.pid_started), f"{job_id} left running"
        assert "following" not in second.output(), "a preempted victim was followed"
    starts = [e for e in events if e[0] == "start"]
    assert sorted(starts) == sorted([("start", "high", 1), *(("start", v, 1) for v in VICTIMS)])
    check_preemption_order(events, facts, commands)
    assert not [c for c in reports_in(commands) if c["jobId"] in VICTIMS
                and c["status"] not in ("STARTING", "RUNNING")], "a preempted victim's end was reported"


def reports_in(commands: list[tuple]) -> list[dict]:
    return [c for _seq, c in commands if c and c.get("kind") == "ReportJobStatus"]
