"""The executor's ledger (services/executors/ledger.py): the attempts it runs, kept in a file so
that a shutdown or the next start after a crash reports them FAILED instead of leaving them
RUNNING, and stops a process the crashed executor left behind."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import pytest

from quotasched.services.executors.base import LOST, SHUT_DOWN, UNRECORDED
from quotasched.services.executors.ledger import Entry, Ledger, LedgerError, process_alive, process_started
from quotasched.services.executors.process import ProcessExecutor
from quotasched.services.executors.simulated import SimulatedExecutor
from tests.executor_facts import dispatched, preempted, status_changed, submitted


class Reports:
    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.down = False

    async def __call__(self, subject: str, data: bytes) -> None:
        if self.down:
            raise ConnectionError("the bus is gone")
        self.sent.append({"subject": subject, **json.loads(data)})

    def sent_all(self) -> list[tuple[int, str, str | None]]:
        return [(r["attempt"], r["status"], r.get("statusReason")) for r in self.sent]

    def of(self, job_id: str) -> list[tuple[int, str, str | None]]:
        return [(r["attempt"], r["status"], r.get("statusReason")) for r in self.sent
                if r["jobId"] == job_id]  # fmt: skip


def listed(path) -> list[tuple[str, int]]:
    return list(Ledger(str(path)).entries)


def test_the_ledger_survives_a_new_instance_and_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "state" / "executor-x.json"
    ledger = Ledger(str(path))
    ledger.record(Entry("j1", 1, "q", "qs1"))
    ledger.record(Entry("j2", 3, "q", "qs2", pid=42, pid_started="7"))
    ledger.forget("j1", 1)
    assert list(Ledger(str(path)).entries.values()) == [Entry("j2", 3, "q", "qs2", 42, "7")]
    assert len(path.read_text().splitlines()) == 1  # compacted when opened
    path.write_text('{"something": "else"}\n')
    with pytest.raises(LedgerError, match="line 1 is not a change"):
        Ledger(str(path))
    path.write_text("{not json\n")
    with pytest.raises(LedgerError, match="cannot read"):
        Ledger(str(path))


def test_a_line_torn_by_a_crash_is_ignored_and_changes_cost_one_line_each(tmp_path):
    path = tmp_path / "executor-x.json"
    ledger = Ledger(str(path))
    for number in range(50):
        ledger.record(Entry(f"j{number}", 1, "q", "qs1"))
    ledger.forget("j0", 1)
    assert len(path.read_text().splitlines()) == 51  # appended, not rewritten
    with open(path, "a") as handle:
        handle.write('{"add": {"job_id": "torn", "att')  # the crash came mid-write
    assert len(Ledger(str(path)).entries) == 49
    for number in range(1, 50):  # many ends: the file is compacted on the way
        ledger.forget(f"j{number}", 1)
    assert Ledger(str(path)).entries == {}
    assert len(path.read_text().splitlines()) < 70


async def test_a_running_attempt_is_listed_until_its_end_is_reported(tmp_path):
    path = tmp_path / "executor-sim.json"
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=20.0, ledger=Ledger(str(path)))
    try:
        await executor.on_fact(submitted("j1", {"duration": "1"}))
        await executor.on_fact(dispatched("j1"))
        assert listed(path) == [("j1", 1)]
        await asyncio.wait_for(executor.running["j1"].stopped.wait(), 10.0)
        assert listed(path) == []
        assert reports.of("j1") == [(1, "STARTING", None), (1, "RUNNING", None),
                                    (1, "SUCCEEDED", None)]  # fmt: skip
    finally:
        await executor.close()


async def test_an_attempt_the_scheduler_stops_leaves_the_ledger_without_a_report(tmp_path):
    path = tmp_path / "executor-sim.json"
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    try:
        await executor.on_fact(submitted("j1", {"duration": "60"}))
        await executor.on_fact(dispatched("j1"))
        await asyncio.sleep(0.05)
        await executor.on_fact(preempted("j1"))
        assert listed(path) == []
        assert [status for _, status, _ in reports.of("j1")] == ["STARTING", "RUNNING"]
    finally:
        await executor.close()


async def test_a_shutdown_with_stop_jobs_reports_the_attempts_it_interrupts_or_leaves_them_listed(tmp_path):
    path = tmp_path / "executor-sim.json"
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    executor.stop_jobs = True
    for job_id in ("j1", "j2"):
        await executor.on_fact(submitted(job_id, {"duration": "60"}))
        await executor.on_fact(dispatched(job_id))
    await asyncio.sleep(0.05)
    await executor.close()
    assert reports.of("j1")[-1] == (1, "FAILED", SHUT_DOWN)
    assert reports.of("j2")[-1] == (1, "FAILED", SHUT_DOWN)
    assert listed(path) == []

    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    executor.stop_jobs = True
    await executor.on_fact(submitted("j3", {"duration": "60"}))
    await executor.on_fact(dispatched("j3"))
    await asyncio.sleep(0.05)
    reports.down = True  # the shutdown cannot tell the scheduler: the next start will
    await executor.close()
    assert listed(path) == [("j3", 1)]


async def test_a_shutdown_leaves_simulated_attempts_running_and_the_next_start_ends_them_on_time(
        tmp_path):  # fmt: skip
    """Without --stop-jobs nothing is reported at the shutdown; the next executor reports
    each attempt's end at its dispatch time plus its duration (from the log), not later, not
    again from the start, and never reports STARTING or RUNNING a second time."""
    path = tmp_path / "executor-sim.json"
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    now = time.time()
    await executor.on_fact(submitted("done", {"duration": "2"}))  # ends while nobody runs
    await executor.on_fact(dispatched("done", at=now - 1.0))
    await executor.on_fact(submitted("later", {"duration": "3"}))
    await executor.on_fact(dispatched("later", at=now))
    await asyncio.sleep(0.05)
    await executor.close()
    assert [status for _, status, _ in reports.sent_all()] == ["STARTING", "RUNNING"] * 2
    assert sorted(listed(path)) == [("done", 1), ("later", 1)]

    await asyncio.sleep(1.2)  # "done" is over by now: reported at once by the next start
    reports.sent.clear()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    for job_id, duration in (("done", "2"), ("later", "3")):
        executor.learn(submitted(job_id, {"duration": duration}))  # what app.catch_up feeds it
    try:
        assert await executor.recover() == 2
        await asyncio.sleep(0.2)
        assert reports.of("done") == [(1, "SUCCEEDED", None)]
        assert reports.of("later") == []
        await asyncio.wait_for(executor.running["later"].stopped.wait(), 5.0)
        assert now + 3.0 <= time.time() < now + 4.0
        assert reports.of("later") == [(1, "SUCCEEDED", None)]
        assert listed(path) == []
    finally:
        await executor.close()


async def test_an_attempt_preempted_while_no_executor_ran_is_stopped_not_followed(tmp_path):
    path = tmp_path / "executor-sim.json"
    Ledger(str(path)).record(Entry("gone", 1, "q", "qs1", dispatched_at=time.time()))
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    executor.learn(submitted("gone", {"duration": "60"}))
    # delivered before `recover` (the broker starts first): kept for it, and handled (then
    # acked) only once `recover` has stopped it
    handling = asyncio.create_task(
        executor.on_fact(preempted("gone")))
    await asyncio.sleep(0.05)
    assert not handling.done()
    assert await executor.recover() == 1
    await asyncio.wait_for(handling, 5.0)
    assert "gone" not in executor.running
    assert reports.sent == [] and listed(path) == []


async def test_the_next_start_reports_lost_attempts_and_never_starts_them_again(tmp_path):
    path = tmp_path / "executor-sim.json"
    Ledger(str(path)).record(Entry("lost", 2, "q", "qs1"))  # what a killed executor left
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=20.0, ledger=Ledger(str(path)))
    try:
        # Nothing says when it was dispatched (a dispatch delivered again before `recover`
        # would: the attempt is then followed, see ..._older_releases_simulated_attempt_...).
        await executor.on_fact(submitted("lost", {"duration": "1"}))
        assert await executor.recover() == 1
        assert reports.of("lost") == [(2, "FAILED", LOST)]
        assert reports.sent[0]["subject"] == "qm.cmd.q.qs1.ReportJobStatus"
        assert listed(path) == []
        assert await executor.recover() == 0  # once
        # the dispatch it had not acked is delivered again: it must not start
        await executor.on_fact(dispatched("lost", 2))
        assert "lost" not in executor.running and len(reports.of("lost")) == 1
        # a later attempt of the same job is a new dispatch: it runs
        await executor.on_fact(dispatched("lost", 3))
        await asyncio.wait_for(executor.running["lost"].stopped.wait(), 10.0)
        assert reports.of("lost")[-1] == (3, "SUCCEEDED", None)
    finally:
        await executor.close()


async def test_an_older_releases_simulated_attempt_ends_when_the_logs_dispatch_says(tmp_path):
    """An entry of a release before dispatch times were kept (an upgrade): the dispatch the
    executor catches up on (app.catch_up feeds `learn`) gives the attempt's start, so it ends
    at that time plus its duration, with nothing reported again before its end."""
    path = tmp_path / "executor-sim.json"
    Ledger(str(path)).record(Entry("old", 1, "q", "qs1"))
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=1.0, ledger=Ledger(str(path)))
    try:
        executor.learn(submitted("old", {"duration": "2"}))
        executor.learn(dispatched("old", at=time.time() - 1.5))
        began = time.monotonic()
        assert await executor.recover() == 1 and "old" in executor.running
        await asyncio.wait_for(executor.running["old"].stopped.wait(), 10.0)
        assert time.monotonic() - began < 1.5, "it ran its whole duration again"
        assert reports.of("old") == [(1, "SUCCEEDED", None)]
    finally:
        await executor.close()


async def test_a_process_an_older_release_left_is_followed_to_its_end_then_failed_as_unrecorded(
        tmp_path):  # fmt: skip
    """An entry without an exit file (an older release's: an upgrade) whose process still
    runs: the executor follows it, reports nothing while it runs (that release reported
    RUNNING), and FAILED with UNRECORDED once it ends, since no exit status was kept."""
    path = tmp_path / "executor-process.json"
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    executor = None
    try:
        started = process_started(orphan.pid)
        assert started is not None and process_alive(orphan.pid, started)
        Ledger(str(path)).record(Entry("j1", 1, "q", "qs1", orphan.pid, started))
        reports = Reports()
        executor = ProcessExecutor(reports, grace_s=5.0, ledger=Ledger(str(path)))
        assert await executor.recover() == 1
        await asyncio.sleep(0.5)
        assert orphan.poll() is None, "the older release's process was stopped"
        assert reports.of("j1") == []
        assert listed(path) == [("j1", 1)]
        orphan.terminate()  # it ends by itself, as far as the executor can tell
        orphan.wait(5)
        deadline = time.monotonic() + 10
        while not reports.of("j1") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert reports.of("j1") == [(1, "FAILED", UNRECORDED)]
        assert listed(path) == []
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        if executor is not None:
            await executor.close()


async def test_a_recorded_pid_now_naming_another_process_is_left_alone(tmp_path):
    path = tmp_path / "executor-process.json"
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # the same pid, but not the process the previous executor started (another start time)
        Ledger(str(path)).record(Entry("j1", 1, "q", "qs1", other.pid, "1"))
        reports = Reports()
        executor = ProcessExecutor(reports, grace_s=1.0, ledger=Ledger(str(path)))
        assert await executor.recover() == 1
        assert other.poll() is None
        assert reports.of("j1") == [(1, "FAILED", LOST)]
    finally:
        other.kill()
        other.wait()


async def test_how_to_run_a_job_is_kept_until_the_job_is_over():
    executor = SimulatedExecutor(Reports())
    for job_id in ("done", "failed", "dropped", "retried"):
        executor.learn(submitted(job_id, {"duration": "1"}))
    executor.learn(status_changed("done", status="SUCCEEDED", cause="REPORTED"))
    executor.learn(status_changed("failed", status="FAILED", cause="REPORTED"))
    executor.learn(preempted("dropped", outcome="FAILED"))
    executor.learn(status_changed("retried", status="RUNNABLE", cause="RETRY"))
    assert list(executor.specs) == ["retried"]


async def test_an_unwritable_attempt_file_does_not_stop_the_attempts(tmp_path):
    state = tmp_path / "state"
    ledger = Ledger(str(state / "executor.json"))  # nothing there yet: starts empty
    state.write_text("a file where the state directory should be")  # every write now fails
    reports = Reports()
    executor = SimulatedExecutor(reports, speed=20.0, ledger=ledger)
    try:
        await executor.on_fact(submitted("j1", {"duration": "1"}))
        await executor.on_fact(dispatched("j1"))
        await asyncio.wait_for(executor.running["j1"].stopped.wait(), 10.0)
        assert reports.of("j1")[-1] == (1, "SUCCEEDED", None)
    finally:
        await executor.close()
