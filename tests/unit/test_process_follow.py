"""The process executor leaves its jobs running when it stops, and the next one follows them
(services/executors/process.py): real processes, the real ledger file, reports collected.

Each job writes its own pid to a file, so a test can tell the very process that ran before the
restart from one started again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from quotasched.services.executors.base import LOST, VANISHED
from quotasched.services.executors.ledger import Entry, Ledger, process_alive, process_started
from quotasched.services.executors.process import GATE, NEVER_RAN, ProcessExecutor
from tests.executor_facts import dispatched, preempted, status_changed, submitted
from tests.unit.test_executor_ledger import Reports, listed


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
        await executor.on_fact(submitted(job_id, {"command": command}))
        await executor.on_fact(dispatched(job_id))
    return executor


async def left_running(path: Path, pidfile: Path, jobs: dict[str, str]) -> tuple[Reports, int]:
    """An executor started `jobs` and was shut down (they run on): its reports, and the pid
    the (first) job wrote."""
    reports = Reports()
    first = await start(path, reports, jobs)
    pid = await pid_in(pidfile)
    await first.close()
    return reports, pid


async def restart(path: Path, reports: Reports, jobs: dict[str, str]) -> ProcessExecutor:
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    for job_id, command in jobs.items():
        executor.learn(submitted(job_id, {"command": command}))  # what app.catch_up feeds it
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
    reports, pid = await left_running(path, pidfile, jobs)
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
    reports, pid = await left_running(path, pidfile, jobs)
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
    reports, _ = await left_running(path, pidfile, jobs)
    [entry] = Ledger(str(path)).entries.values()
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
    reports, pid = await left_running(path, pidfile, jobs)
    second = await restart(path, reports, jobs)
    try:
        await second.on_fact(preempted("victim"))
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
    reports, _ = await left_running(path, pidfile, jobs)
    await asyncio.sleep(delay)
    second = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    second.learn(submitted("once", {"command": jobs["once"]}))
    await second.on_fact(dispatched("once"))  # redelivered before `recover`
    await second.recover()
    try:
        await ended(second, "once")
        assert runs.read_text().splitlines() == ["run"]
        assert reports.of("once")[-1] == (1, "SUCCEEDED", None)
    finally:
        await second.close()


# -- a restart at each step of a start and of a stop -------------------------------------------


async def test_a_restart_between_the_ledger_and_the_spawn_runs_nothing_and_reports_it_lost(
        tmp_path):  # fmt: skip
    """The executor noted the attempt, then died before spawning it (the entry has no pid):
    the next one never runs it, also when its dispatch is delivered again, and reports it
    FAILED as lost (its retryStrategy decides)."""
    path, marker = tmp_path / "executor-process.json", tmp_path / "ran"
    Ledger(str(path)).record(Entry("early", 1, "q", "qs1"))
    reports = Reports()
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    command = f"touch {marker}"
    executor.learn(submitted("early", {"command": command}))
    await executor.on_fact(dispatched("early"))  # redelivered: not started
    try:
        await executor.recover()
        assert reports.of("early") == [(1, "FAILED", LOST)]
        await asyncio.sleep(0.3)
        assert not marker.exists() and listed(path) == []
    finally:
        await executor.close()


async def test_a_restart_before_the_go_leaves_the_command_unrun(tmp_path):
    """The executor spawned the attempt's shell and wrote its pid, then died before the go:
    the shell reads EOF and exits unrun (125), its exit file saying "unrun"; the next executor
    reports the attempt FAILED saying that the command never ran, and it did not."""
    path, marker = tmp_path / "executor-process.json", tmp_path / "ran"
    exit_file = tmp_path / "exit"
    wait, go = os.pipe()
    shell = subprocess.Popen(["/bin/sh", "-c", GATE, "sh", str(exit_file), "touch", str(marker)],
                             stdin=wait, start_new_session=True)  # fmt: skip
    os.close(wait)
    Ledger(str(path)).record(Entry("gate", 1, "q", "qs1", shell.pid, process_started(shell.pid),
                                   exit_file=str(exit_file)))  # fmt: skip
    os.close(go)  # the executor dies: its end of the pipe closes
    assert shell.wait(5) == 125
    reports = Reports()
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    try:
        await executor.recover()
        await ended(executor, "gate")
        assert reports.of("gate") == [(1, "FAILED", NEVER_RAN)]
        assert not marker.exists() and not exit_file.exists()  # reported: the file is gone
    finally:
        await executor.close()


async def test_a_restart_before_running_was_reported_reports_it_once(tmp_path):
    """The process runs but the executor died before it reported RUNNING (the ledger says
    so): the next one reports RUNNING once, then the end."""
    path, pidfile, go = tmp_path / "executor-process.json", tmp_path / "pid", tmp_path / "go"
    jobs = {"slow": job(pidfile, f"while [ ! -e {go} ]; do sleep 0.05; done")}
    await left_running(path, pidfile, jobs)
    ledger = Ledger(str(path))
    [entry] = ledger.entries.values()
    ledger.record(replace(entry, running=False))  # as if it died before the report
    reports = Reports()
    second = await restart(path, reports, jobs)
    try:
        await asyncio.sleep(0.2)
        assert reports.of("slow") == [(1, "RUNNING", None)]
        go.touch()
        await ended(second, "slow")
        assert reports.of("slow") == [(1, "RUNNING", None), (1, "SUCCEEDED", None)]
    finally:
        await second.close()


async def test_a_restart_in_the_middle_of_a_preemption_stops_the_victim_before_the_preemptor(
        tmp_path):  # fmt: skip
    """The executor was stopped while the victim ran; its JobPreempted and the preemptor's
    JobDispatched (afterPreemptionOf: victim) are delivered to the next executor before it
    has taken the victim over.  The victim is stopped (its SIGTERM handler runs), nothing is
    reported about it, and the preemptor's command starts only after the victim's ended."""
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    victim_end, preemptor_start = tmp_path / "victim.end", tmp_path / "preemptor.start"
    jobs = {"victim": job(pidfile, f"trap \"sleep 0.5; date +%s.%N > {victim_end}; exit 0\" "
                                   "TERM; sleep 300 & wait"),
            "preemptor": f"sh -c 'date +%s.%N > {preemptor_start}'"}
    _, pid = await left_running(path, pidfile, {"victim": jobs["victim"]})
    reports = Reports()
    second = ProcessExecutor(reports, grace_s=5.0, ledger=Ledger(str(path)))
    for job_id, command in jobs.items():
        second.learn(submitted(job_id, {"command": command}))
    # delivered once the broker starts, before `recover`: neither may act on its own
    preemption = asyncio.create_task(
        second.on_fact(preempted("victim", preemptor="preemptor")))
    dispatch = asyncio.create_task(
        second.on_fact(dispatched("preemptor", after=["victim"])))
    await asyncio.sleep(0.1)
    assert not preemptor_start.exists()
    try:
        await second.recover()
        await asyncio.wait_for(asyncio.gather(preemption, dispatch), 15.0)
        await ended(second, "preemptor")
        assert not alive(pid)
        assert float(victim_end.read_text()) <= float(preemptor_start.read_text())
        assert reports.of("victim") == []
        assert reports.of("preemptor")[-1] == (1, "SUCCEEDED", None)
    finally:
        await second.close()


@pytest.mark.parametrize("ending", [
    preempted("victim", 1, outcome="REQUEUED"),
    status_changed("victim", 1, status="FAILED", cause="TERMINATED"),
    status_changed("victim", 1, status="SUCCEEDED", cause="REPORTED"),
], ids=["preempted", "terminated", "ended"])  # fmt: skip
async def test_an_attempt_whose_end_the_caught_up_log_holds_is_stopped_not_followed(
        tmp_path, ending):  # fmt: skip
    """The previous executor was killed after the log said the attempt ended (a preemption
    it was stopping, a termination, or an end it had reported) and before it acked that fact
    (it comes again only after the ack wait).  Catching up (`learn`) finds it: the next
    executor stops what is left of the attempt, reports nothing, and follows nothing."""
    path, pidfile = tmp_path / "executor-process.json", tmp_path / "pid"
    jobs = {"victim": job(pidfile, "sleep 300")}
    reports, pid = await left_running(path, pidfile, jobs)
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    try:
        executor.learn(submitted("victim", {"command": jobs["victim"]}))
        executor.learn(ending)
        before = len(reports.sent)
        await executor.recover()
        assert "victim" not in executor.running
        assert not alive(pid), "an ended attempt was left running"
        assert len(reports.sent) == before and listed(path) == []
    finally:
        await executor.close()


async def test_an_earlier_attempts_end_in_the_log_does_not_stop_the_running_one(tmp_path):
    """Only the attempt the fact names: attempt 1's preemption does not stop attempt 2."""
    path, pidfile, go = tmp_path / "executor-process.json", tmp_path / "pid", tmp_path / "go"
    jobs = {"again": job(pidfile, f"while [ ! -e {go} ]; do sleep 0.05; done")}
    reports, pid = await left_running(path, pidfile, jobs)
    executor = ProcessExecutor(reports, grace_s=2.0, ledger=Ledger(str(path)))
    try:
        executor.learn(submitted("again", {"command": jobs["again"]}))
        executor.learn(preempted("again", 0))
        await executor.recover()
        assert "again" in executor.running and alive(pid)
        go.touch()
        await ended(executor, "again")
        assert reports.of("again")[-1] == (1, "SUCCEEDED", None)
    finally:
        await executor.close()
