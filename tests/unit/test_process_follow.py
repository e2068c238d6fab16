"""The process executor leaves its jobs running when it stops, and the next one follows them
(services/executors/process.py): real processes, the real ledger file, reports collected.

Each job writes its own pid to a file, so a test can tell the very process that ran before the
restart from one started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from quotasched.services.executors.base import VANISHED
from quotasched.services.executors.ledger import Ledger, process_alive
from quotasched.services.executors.process import ProcessExecutor
from tests.unit.test_executor_ledger import Reports, dispatched, listed, submitted


def job(pidfile: Path, then: str) -> str:
    """A job that writes its pid, then runs `then` (a shell snippet)."""
    return f"sh -c 'echo $$ > {pidfile}; {then}'"


async def pid_in(pidfile: Path, wait_s: float = 10.0) -> int:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        await asyncio.sleep(0.02)
    raise AssertionError(f"{pidfile} was never written")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def start(path: Path, reports: Reports, jobs: dict[str, str]) -> ProcessExecutor:
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    for job_id, command in jobs.items():
        await executor.on_fact(submitted(job_id, command=command))
        await executor.on_fact(dispatched(job_id))
    return executor


async def restart(path: Path, reports: Reports, jobs: dict[str, str]) -> ProcessExecutor:
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    for job_id, command in jobs.items():
        executor.learn(submitted(job_id, command=command))  # what app.catch_up feeds it
    await executor.recover()
    return executor


async def ended(executor: ProcessExecutor, job_id: str, wait_s: float = 15.0) -> None:
    attempt = executor.running.get(job_id)
    if attempt is not None:
        await asyncio.wait_for(attempt.stopped.wait(), wait_s)


async def test_a_shutdown_leaves_the_process_running_and_the_next_executor_reports_its_real_end(
        tmp_path):  # fmt: skip
    path, pidfile, go = tmp_path / "executor-process.json", tmp_path / "pid", tmp_path / "go"
    jobs = {"train": job(pidfile, f"while [ ! -e {go} ]; do sleep 0.05; done; exit 0")}
    reports = Reports()
    first = await start(path, reports, jobs)
    pid = await pid_in(pidfile)
    await first.close()
    assert alive(pid), "a graceful stop of the executor stopped the job"
    assert reports.of("train") == [(1, "STARTING", None), (1, "RUNNING", None)]
    assert listed(path) == [("train", 1)]

    second = await restart(path, reports, jobs)
    try:
        assert "train" in second.running and alive(pid)
        assert reports.of("train") == [(1, "STARTING", None), (1, "RUNNING", None)]  # nothing new
        go.touch()
        await ended(second, "train")
        assert reports.of("train")[-1] == (1, "SUCCEEDED", None)
        assert len(reports.of("train")) == 3 and listed(path) == []
        assert not list((tmp_path / "executor-process.exits").iterdir()), "exit file left"
    finally:
        await second.close()


async def test_a_job_that_ended_while_no_executor_ran_is_reported_with_its_exit_code(tmp_path):
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    jobs = {"quits": job(pidfile, "sleep 0.3; exit 3")}
    reports = Reports()
    first = await start(path, reports, jobs)
    pid = await pid_in(pidfile)
    await first.close()
    while alive(pid):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # the shell writes the status once its command has ended
    second = await restart(path, reports, jobs)
    try:
        await ended(second, "quits")
        assert reports.of("quits")[-1] == (1, "FAILED", "Process exited with code 3")
        assert listed(path) == []
    finally:
        await second.close()


async def test_a_followed_job_whose_supervisor_was_killed_is_reported_failed_saying_so(tmp_path):
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    jobs = {"lost": job(pidfile, "sleep 300")}
    reports = Reports()
    first = await start(path, reports, jobs)
    await pid_in(pidfile)
    [entry] = Ledger(str(path)).entries.values()
    await first.close()
    os.killpg(entry.pid, signal.SIGKILL)  # the whole attempt, its shell included: no status
    while process_alive(entry.pid, entry.pid_started):
        await asyncio.sleep(0.05)
    second = await restart(path, reports, jobs)
    try:
        await ended(second, "lost")
        assert reports.of("lost")[-1] == (1, "FAILED", VANISHED)
    finally:
        await second.close()


async def test_a_followed_job_is_preempted_like_one_this_executor_started(tmp_path):
    """SIGTERM reaches the job (its own handler runs), the attempt is stopped, nothing is
    reported (the scheduler decided it), and the preemptor starts only after."""
    path, pidfile, trapped = tmp_path / "executor-process.json", tmp_path / "pid", tmp_path / "t"
    jobs = {"victim": job(pidfile, f"trap \"touch {trapped}; exit 0\" TERM; sleep 300 & wait")}
    reports = Reports()
    first = await start(path, reports, jobs)
    pid = await pid_in(pidfile)
    await first.close()
    second = await restart(path, reports, jobs)
    try:
        await second.on_fact({"kind": "JobPreempted", "jobId": "victim", "attempt": 1})
        assert not alive(pid) and trapped.exists()
        assert [status for _, status, _ in reports.of("victim")] == ["STARTING", "RUNNING"]
        assert listed(path) == []
    finally:
        await second.close()


async def test_stop_jobs_makes_a_shutdown_stop_and_report_the_jobs(tmp_path):
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    reports = Reports()
    first = await start(path, reports, {"j": job(pidfile, "sleep 300")})
    first.stop_jobs = True
    pid = await pid_in(pidfile)
    await first.close()
    assert not alive(pid)
    assert reports.of("j")[-1][1] == "FAILED" and listed(path) == []


@pytest.mark.parametrize("delay", [0.0, 0.3])
async def test_a_restart_never_runs_an_attempt_twice(tmp_path, delay):
    """A dispatch the previous executor had not acked is delivered again after the restart:
    the attempt it follows is not started a second time."""
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    runs = tmp_path / "runs"
    jobs = {"once": job(pidfile, f"echo run >> {runs}; sleep 1")}
    reports = Reports()
    first = await start(path, reports, jobs)
    await pid_in(pidfile)
    await first.close()
    await asyncio.sleep(delay)
    second = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    second.learn(submitted("once", command=jobs["once"]))
    await second.on_fact(dispatched("once"))  # redelivered before `recover`
    await second.recover()
    try:
        await ended(second, "once")
        assert runs.read_text().splitlines() == ["run"]
        assert reports.of("once")[-1] == (1, "SUCCEEDED", None)
    finally:
        await second.close()
