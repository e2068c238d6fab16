"""Nothing of an ended attempt survives it (services/executors/contain.py), against a real
nats-server and scheduler, real executors and real jobs that leave daemons behind: a child
started with `setsid`, or a double-forked grandchild that ignores SIGTERM.  Each daemon writes
its pid to a file; the tests look the pid up in /proc (a zombie, dead but not yet reaped by
init, counts as dead).

Whatever a test leaves alive (the bug it guards against) is killed by the test itself at the
end, so a failure leaves no `sleep 300` behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from quotasched.services.executors.base import VANISHED
from quotasched.services.executors.contain import Containment, Support, check
from quotasched.services.executors.ledger import Ledger
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats, pytest.mark.slow]

QUEUE = "cq"

# Double fork: the job's child leaves the job's session (setsid), forks the daemon and exits,
# so the daemon is an orphan of init's; with `deaf` it ignores SIGTERM: only SIGKILL ends it.
# The job itself then runs `seconds` more and exits `code` (SIGTERM ends it at once).
DOUBLE_FORK = textwrap.dedent("""
    import os, signal, sys, time
    pidfile, seconds, code, deaf = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            if deaf == "deaf":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pidfile + ".tmp", "w") as out:
                out.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            time.sleep(300)
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.02)
    time.sleep(seconds)
    sys.exit(code)
""")

# A job that, as it starts, says (in witness.out beside it) whether the daemon whose pid is in
# the file named by its argument is alive.
WITNESS = textwrap.dedent("""
    import os, sys
    out = os.path.join(os.path.dirname(sys.argv[0]), "witness.out")
    pid = open(sys.argv[1]).read().strip()
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    open(out, "w").write("dead" if state in ("gone", "Z") else "alive")
""")


# `setsid sh -c 'sleep 300' &`, its pid written to the file $1; then the job exits 0, or with
# $2 "stay" runs on.
SETSID = """
setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 300' sh "$1" &
while [ ! -e "$1" ]; do sleep 0.02; done
[ "$2" = stay ] && exec sleep 300
exit 0
"""


def setsid_job(pidfile: Path, then: str = "exit") -> str:
    job = pidfile.parent / "setsid.sh"
    job.write_text(SETSID)
    return f"sh {job} {pidfile} {then}"


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return f"{sys.executable} {path}"


def pid_in(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def dead(pid: int) -> bool:
    return not alive(pid)


@pytest.fixture
def daemons():
    """Pid files of the tests' daemons: whatever still runs at the end is killed."""
    files: list[Path] = []
    yield files
    for pidfile in files:
        pid = pid_in(pidfile)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


async def submit(bus: Bus, job_id: str, share: str, command: str, priority: int = 1,
                 gpus: int = 1, attempts: int = 1) -> None:  # fmt: skip
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
        "quotaShareName": share, "schedulingPriority": priority, "tags": {"command": command},
        "retryStrategy": {"attempts": attempts},
        "capacityUsage": [{"capacityUnit": G5, "quantity": gpus}],
    })  # fmt: skip


async def status_of(bus: Bus, job_id: str, attempt: int, *statuses: str) -> dict | None:
    found = [f for f in await read_facts(bus.js) if f["kind"] == "JobStatusChanged"
             and f["jobId"] == job_id and f["attempt"] == attempt and f["status"] in statuses]
    return found[0] if found else None


async def watch_reports(bus: Bus, pidfile: Path) -> list[tuple[str, str, bool | None]]:
    """(job, status, whether the daemon of `pidfile` was alive when the report arrived) for
    each ReportJobStatus, as it arrives (the report is sent after whatever came before it)."""
    seen: list[tuple[str, str, bool | None]] = []

    async def on_report(msg) -> None:
        report = json.loads(msg.data)
        pid = pid_in(pidfile)
        seen.append((report["jobId"], report["status"], None if pid is None else alive(pid)))

    await bus.nc.subscribe("qm.cmd.*.*.ReportJobStatus", cb=on_report)
    return seen


async def test_a_daemon_left_by_a_succeeded_job_is_dead_before_the_success_is_reported(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    pidfile = tmp_path / "daemon.pid"
    daemons.append(pidfile)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=[("a", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        executor = spawn("executor", "--kind", "process")
        reports = await watch_reports(bus, pidfile)
        await submit(bus, "quits", "a", setsid_job(pidfile))
        await eventually(lambda: status_of(bus, "quits", 1, "SUCCEEDED", "FAILED"), 30,
                         what="the job's end")  # fmt: skip
        await eventually(lambda: _async([r for r in reports if r[1] == "SUCCEEDED"]), 5,
                         what="the report seen")  # fmt: skip
        assert await status_of(bus, "quits", 1, "SUCCEEDED"), "the job itself exited 0"
    assert ("quits", "SUCCEEDED", False) in reports, (
        f"the setsid child {pid_in(pidfile)} was alive when SUCCEEDED was reported: {reports}")
    assert "containment: cgroup v2 per attempt at " in executor.output()


async def test_a_preempted_or_terminated_jobs_daemons_are_killed_before_it_counts_as_stopped(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    """`victim` (share a, in-share preemption) and `ended` (share b) each leave a daemon
    (double fork; ended's ignores SIGTERM) and run on; `high` preempts `victim` and, as it
    starts, says whether victim's daemon is alive; `ended` is terminated: its daemon is
    SIGKILLed once the grace period (10 s) is over."""
    victim_pid, ended_pid = tmp_path / "victim.pid", tmp_path / "ended.pid"
    daemons += [victim_pid, ended_pid]
    witness = tmp_path / "witness.out"
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=[("a", 1, "RESERVE", "ENABLED"),
                                                               ("b", 1, "RESERVE", "DISABLED")],
                                                capacity=2))  # fmt: skip
        spawn("executor", "--kind", "process")
        double_fork = script(tmp_path, "double_fork.py", DOUBLE_FORK)
        await submit(bus, "victim", "a", f"{double_fork} {victim_pid} 300 0 -")
        await submit(bus, "ended", "b", f"{double_fork} {ended_pid} 300 0 deaf")
        for pidfile in (victim_pid, ended_pid):
            await eventually(lambda: _async(pid_in(pidfile)), 30, what=f"{pidfile.name} written")
        await submit(bus, "high", "a", f"{script(tmp_path, 'witness.py', WITNESS)} {victim_pid}",
                     priority=9)  # fmt: skip
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "ended", "reason": "test"},
                          route=(QUEUE, "b"))  # fmt: skip
        await eventually(lambda: status_of(bus, "high", 1, "SUCCEEDED", "FAILED"), 60,
                         what="high ran")  # fmt: skip
        ended_daemon = pid_in(ended_pid)
        await eventually(lambda: dead(ended_daemon), 30, what="the terminated job's daemon dead")
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "victim", "reason": "test"},
                          route=(QUEUE, "a"))  # its attempt 2 (requeued) need not run on
    assert witness.read_text() == "dead", "high started while its victim's daemon was alive"


async def test_the_agent_frees_the_gpus_of_a_daemonizing_job_only_once_its_daemon_is_dead(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    """One host with GPUs 0 and 1.  Team a's job takes both, leaves a setsid child and exits
    0; team b's job, waiting for those GPUs, says as it starts whether that child is alive."""
    pidfile, witness = tmp_path / "daemon.pid", tmp_path / "witness.out"
    daemons.append(pidfile)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        teams = [("team-a", 2, "RESERVE", "DISABLED"), ("team-b", 2, "RESERVE", "DISABLED")]
        await publish_items(bus, setup_commands(QUEUE, shares=teams, capacity=0))
        agent = spawn("agent", "--host", "h1", "--gpus", "0,1", "--capacity-unit", G5,
                      "--service-environment", f"{QUEUE}-se", "--state-dir", str(tmp_path / "h1"),
                      "--heartbeat", "0.3", "--host-timeout", "1.5", "--place-timeout", "5",
                      "--require-containment")  # fmt: skip
        await submit(bus, "a-job", "team-a", setsid_job(pidfile), gpus=2)
        await submit(bus, "b-job", "team-b", f"{script(tmp_path, 'witness.py', WITNESS)} {pidfile}",
                     gpus=2)  # fmt: skip
        await eventually(lambda: status_of(bus, "b-job", 1, "SUCCEEDED", "FAILED"), 60,
                         what="team b's job ran")  # fmt: skip
        assert await status_of(bus, "a-job", 1, "SUCCEEDED")
    records = [json.loads(line) for line in
               (tmp_path / "h1" / "agent-h1.records.jsonl").read_text().splitlines()]
    at = {(r["event"], r["jobId"]): r for r in records}
    assert at[("start", "a-job")]["gpus"] == at[("start", "b-job")]["gpus"] == ["0", "1"]
    assert at[("end", "a-job")]["ns"] < at[("start", "b-job")]["ns"]
    assert witness.read_text() == "dead", (
        "team b's job got the GPUs while team a's daemonized child was alive")
    assert "containment: cgroup v2 per attempt at " in agent.output()


async def running_with_a_daemon(bus: Bus, spawn, tmp_path: Path, daemons: list[Path],
                                job_id: str, *flags: str):  # fmt: skip
    """A process executor running `job_id`, a job that left a setsid child and runs on:
    (the executor, the child's pid)."""
    pidfile = tmp_path / "daemon.pid"
    daemons.append(pidfile)
    await publish_items(bus, setup_commands(QUEUE, shares=[("a", 1, "RESERVE", "DISABLED")],
                                            capacity=1))  # fmt: skip
    executor = spawn("executor", "--kind", "process", *flags)
    await submit(bus, job_id, "a", setsid_job(pidfile, then="stay"))
    await eventually(lambda: status_of(bus, job_id, 1, "RUNNING"), 30, what="RUNNING")
    pid = await eventually(lambda: _async(pid_in(pidfile)), 10, what="the daemon's pid")
    return executor, pid


async def test_a_restarted_executor_kills_the_daemon_a_lost_attempt_left(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    """The executor is killed; while none runs, the attempt's own process group is killed
    too (its shell: no exit status), but its setsid daemon lives on.  The next executor
    reports the attempt FAILED, saying it vanished, and kills the daemon."""
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        first, pid = await running_with_a_daemon(bus, spawn, tmp_path, daemons, "lost")
        ledger = tmp_path / "executor-state" / "executor-process.json"
        [entry] = Ledger(str(ledger)).entries.values()
        first.kill()  # SIGKILL: the job and its daemon live on, without anybody to end them
        await asyncio.sleep(0.3)
        assert alive(pid), "the daemon should outlive the killed executor"
        os.killpg(entry.pid, signal.SIGKILL)  # the attempt's group, not its setsid daemon
        await eventually(lambda: dead(entry.pid), 5, what="the attempt's shell dead")
        assert alive(pid), "the daemon is in a session of its own"
        spawn("executor", "--kind", "process")
        ended = await eventually(lambda: status_of(bus, "lost", 1, "FAILED"), 30,
                                 what="the lost attempt reported")  # fmt: skip
        assert ended["statusReason"] == VANISHED
        await eventually(lambda: dead(pid), 5, what="the lost attempt's daemon dead")
    assert entry.cgroup and entry.token, f"the ledger names no cgroup or marker: {entry}"
    assert not os.path.exists(entry.cgroup), "the lost attempt's cgroup was not removed"


async def test_an_executor_shut_down_with_stop_jobs_kills_what_its_attempts_left(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        executor, pid = await running_with_a_daemon(bus, spawn, tmp_path, daemons, "runs",
                                                     "--stop-jobs")  # fmt: skip
        assert executor.stop() == 0  # SIGTERM: a shutdown stops and reports what it runs
        assert not alive(pid), "the attempt's setsid child outlived the executor's shutdown"
        await eventually(lambda: status_of(bus, "runs", 1, "FAILED"), 10, what="reported")


async def test_the_marker_fallback_kills_a_setsid_child_that_kept_its_environment(
        tmp_path, nats_server, spawn, daemons):  # fmt: skip
    pidfile = tmp_path / "daemon.pid"
    daemons.append(pidfile)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=[("a", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        executor = spawn("executor", "--kind", "process", QUOTASCHED_CONTAINMENT="marker")
        reports = await watch_reports(bus, pidfile)
        await submit(bus, "quits", "a", setsid_job(pidfile))
        await eventually(lambda: status_of(bus, "quits", 1, "SUCCEEDED", "FAILED"), 30,
                         what="the job's end")  # fmt: skip
        await eventually(lambda: _async([r for r in reports if r[1] == "SUCCEEDED"]), 5,
                         what="the report seen")  # fmt: skip
    assert ("quits", "SUCCEEDED", False) in reports, (
        f"the setsid child {pid_in(pidfile)} was alive when SUCCEEDED was reported: {reports}")
    start = [line for line in executor.output().splitlines() if line.startswith("containment:")]
    assert start and "no cgroup v2 here (QUOTASCHED_CONTAINMENT=marker); falling back" in start[0]
    assert "a job that clears its environment and leaves its session can escape" in start[0]


def test_an_agent_that_requires_containment_refuses_to_start_without_a_cgroup(tmp_path):
    result = subprocess.run(
        [QUOTASCHED, "agent", "--nats-url", "nats://127.0.0.1:1", "--gpus", "0",
         "--capacity-unit", G5, "--service-environment", "se", "--host", "h1",
         "--state-dir", str(tmp_path), "--require-containment"],
        env={**os.environ, "QUOTASCHED_CONTAINMENT": "marker"}, capture_output=True,
        timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "quotasched agent: --require-containment: no cgroup v2 for the attempts here "
        "(QUOTASCHED_CONTAINMENT=marker)"]


async def test_the_containment_check_proves_cgroup_kill_or_says_why_not():
    """Here (root, cgroup2 mounted, Linux >= 5.14) an attempt gets a cgroup that `kill_all`
    empties; a Support without a parent is the marker, whatever the host."""
    support = check("executor-containment-test")
    if support.parent is None:
        pytest.skip(f"no cgroup v2 containment on this host: {support.reason}")
    contained = Containment.new(support, "job/1", 1)
    process = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "read -r go; setsid sleep 300 & wait", stdin=asyncio.subprocess.PIPE)
    contained.enter(process.pid)
    process.stdin.write(b"go\n")
    await eventually(lambda: _async(len(contained.members()) >= 2), 5, what="the setsid child")
    assert await contained.kill_all()
    assert await process.wait() == -signal.SIGKILL
    contained.cleanup()
    assert not os.path.exists(contained.path)
    os.rmdir(support.parent)  # only this test's executor used it
    assert Containment.new(Support(None, "test"), "j", 1).path is None


async def _async(value):
    return value
