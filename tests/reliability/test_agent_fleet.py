"""GPU agents sharing one fleet, against a real nats-server and scheduler: `quotasched agent`
processes on this machine with disjoint (fake) GPU lists, real job processes that print the
CUDA_VISIBLE_DEVICES they were given into their log.

`check_fleet` is the invariant checker over what the agents recorded (their records files),
the attempts' logs and the fact log:
- no attempt is claimed by two hosts, and none started twice;
- no GPU of a host is held by two live attempts at once (start to end, per host and GPU);
- each attempt's process saw exactly the GPUs its start record names (its log);
- every preempted attempt that started had ended before its preemptor started.
The fleet's capacity (ServiceEnvironmentUpdated facts) follows the live hosts: up to their sum
when they join, down when one is SIGKILLed (its attempts reported FAILED, host lost), up again
when it restarts; an attempt that fits the fleet but no single host is reported
INSUFFICIENT_CAPACITY exactly once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.support import read_stream

pytestmark = [pytest.mark.nats, pytest.mark.slow]

QUEUE, ENVIRONMENT = "gq", "gq-se"
FAST = ["--heartbeat", "0.3", "--host-timeout", "1.5", "--place-timeout", "1.5", "--grace", "3",
        "--victim-timeout", "10"]  # fmt: skip

JOB = textwrap.dedent("""
    import os, signal, sys, time
    print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"], flush=True)

    def stop(signum, frame):
        time.sleep(0.3)  # a checkpoint: the GPUs are still in use
        print("stopped", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    time.sleep(float(sys.argv[1]))
    print("done", flush=True)
""")


# -- the invariant checker ---------------------------------------------------------------------


def read_records(state_dirs: list[Path]) -> list[dict]:
    records = []
    for folder in state_dirs:
        for path in folder.glob("agent-*.records.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def check_fleet(records: list[dict], logs: dict[str, Path], facts: list[dict]) -> None:
    """The invariants of the module docstring; `logs`: each host's logs directory."""
    claims: dict[tuple, set[str]] = {}
    starts: dict[tuple, dict] = {}
    ends: dict[tuple, int] = {}
    for record in records:
        key = (record["jobId"], record["attempt"])
        if record["event"] == "claim":
            claims.setdefault(key, set()).add(record["host"])
        elif record["event"] == "start":
            assert key not in starts, f"attempt {key} started twice: {starts[key]}, {record}"
            starts[key] = record
        elif record["event"] == "end":
            ends.setdefault(key, record["ns"])
    for key, hosts in claims.items():
        assert len(hosts) == 1, f"attempt {key} claimed by {hosts}"
    spans = {key: (start["host"], start["gpus"], start["ns"], ends.get(key, float("inf")))
             for key, start in starts.items()}  # fmt: skip
    for key, (host, gpus, begin, end) in spans.items():
        assert begin < end, f"attempt {key} ended before it started"
        for other, (host2, gpus2, begin2, end2) in spans.items():
            if other != key and host2 == host and set(gpus) & set(gpus2):
                assert end <= begin2 or end2 <= begin, (
                    f"{key} and {other} held GPU(s) {set(gpus) & set(gpus2)} of {host} at once")
        path = logs[host] / key[0] / f"{key[1]}.log"
        output = path.read_text()
        deadline = time.monotonic() + 15
        while not output and end == float("inf") and time.monotonic() < deadline:
            time.sleep(0.1)  # still running, just started: its first line is on its way
            output = path.read_text()
        if not output and end != float("inf"):
            continue  # stopped before its first line (a SIGTERM before Python had started)
        assert f"CUDA_VISIBLE_DEVICES={','.join(gpus)}" in output.splitlines(), (
            f"attempt {key}'s process did not see GPUs {gpus}: {output!r}")
    dispatches = [f for f in facts if f["kind"] == "JobDispatched"]
    for fact in facts:
        if fact["kind"] != "JobPreempted" or (fact["jobId"], fact["attempt"]) not in spans:
            continue
        victim = (fact["jobId"], fact["attempt"])
        preemptor = next(f for f in dispatches if f["jobId"] == fact["preemptorJobId"]
                         and fact["jobId"] in f["afterPreemptionOf"])  # fmt: skip
        started = spans.get((preemptor["jobId"], preemptor["attempt"]))
        if started is not None:
            assert spans[victim][3] < started[2], (
                f"{preemptor['jobId']} started before its victim {victim} had stopped")


def test_the_checker_catches_an_attempt_placed_before_an_orphan_was_stopped():
    """The race it once caught: a restarted agent placed an attempt on the GPUs of a process
    its previous run left, which `recover` was still stopping (its end recorded after)."""
    span = {"host": "h2", "gpus": ["2", "3"]}
    records = [{"event": "start", "jobId": "high", "attempt": 1, "ns": 1, **span},
               {"event": "start", "jobId": "wide", "attempt": 2, "ns": 3, **span},
               {"event": "end", "jobId": "high", "attempt": 1, "ns": 4, "how": "LOST", **span}]
    with pytest.raises(AssertionError, match="held GPU"):
        check_fleet(records, {}, [])


# -- running agents ----------------------------------------------------------------------------


def start_agent(spawn, tmp_path: Path, host: str, gpus: str, *more: str):
    return spawn("agent", "--host", host, "--gpus", gpus, "--capacity-unit", G5,
                 "--service-environment", ENVIRONMENT, "--state-dir", str(tmp_path / host),
                 *FAST, *more)  # fmt: skip


async def capacities(bus: Bus) -> list[int]:
    """The environment's G5 capacity after each ServiceEnvironmentUpdated, in order."""
    return [limit["maxCapacity"] for f in await read_facts(bus.js)
            if f["kind"] == "ServiceEnvironmentUpdated" and f["serviceEnvironment"] == ENVIRONMENT
            for limit in f["capacityLimits"] if limit["capacityUnit"] == G5]  # fmt: skip


async def capacity_is(bus: Bus, value: int) -> bool:
    found = await capacities(bus)
    return bool(found) and found[-1] == value


async def submit(bus: Bus, job_id: str, priority: int, gpus: int, command: str, attempts: int = 1):
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
        "quotaShareName": "team", "schedulingPriority": priority, "tags": {"command": command},
        "retryStrategy": {"attempts": attempts},
        "capacityUsage": [{"capacityUnit": G5, "quantity": gpus}],
    })  # fmt: skip


def job(tmp_path: Path, seconds: float) -> str:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return f"{sys.executable} {script} {seconds}"


async def statuses(bus: Bus, job_id: str) -> list[tuple[int, str]]:
    return [(f["attempt"], f["status"]) for f in await read_facts(bus.js)
            if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id]  # fmt: skip


async def running_on(tmp_path: Path, hosts: list[str], job_id: str) -> str | None:
    """The host whose records say `job_id` started (its latest attempt), if any."""
    found = [r for r in read_records([tmp_path / h for h in hosts])
             if r["event"] == "start" and r["jobId"] == job_id]  # fmt: skip
    return found[-1]["host"] if found else None


async def logs_written(tmp_path: Path, hosts: list[str]) -> bool:
    """Every running attempt's process has printed its first line (a start that happened just
    now may not have yet)."""
    records = read_records([tmp_path / h for h in hosts])
    ended = {(r["jobId"], r["attempt"]) for r in records if r["event"] == "end"}
    return all((tmp_path / r["host"] / "logs" / r["jobId"] / f"{r['attempt']}.log").read_text()
               for r in records
               if r["event"] == "start" and (r["jobId"], r["attempt"]) not in ended)


# -- the tests ---------------------------------------------------------------------------------


async def test_agents_place_whole_attempts_preempt_in_order_and_follow_the_live_hosts(
        tmp_path, nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler")
    hosts = ["h1", "h2"]
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 4, "RESERVE", "ENABLED")], capacity=1))  # fmt: skip
        start_agent(spawn, tmp_path, "h1", "0,1")
        second = start_agent(spawn, tmp_path, "h2", "2,3")
        await eventually(lambda: capacity_is(bus, 4), 30, what="capacity 4 (two hosts)")

        long = job(tmp_path, 120)
        await submit(bus, "wide", 1, 2, long)  # two GPUs: one host's both
        await eventually(lambda: running_on(tmp_path, hosts, "wide"), 20, what="wide runs")
        for name in ("n1", "n2"):
            await submit(bus, name, 1, 1, long, attempts=2)
        for name in ("n1", "n2"):
            await eventually(lambda: running_on(tmp_path, hosts, name), 20, what=f"{name} runs")
        # Every GPU is busy: a two-GPU job of higher priority preempts inside the share and
        # starts only once its victims' processes have exited.
        await submit(bus, "high", 9, 2, long)
        await eventually(lambda: running_on(tmp_path, hosts, "high"), 30, what="high runs")

        # h2 is SIGKILLed: its attempts are reported FAILED as lost, the capacity drops to 2;
        # restarted, it stops what it left running and the capacity is 4 again.
        lost_host = "h2"
        on_h2 = {r["jobId"]: r["attempt"] for r in read_records([tmp_path / lost_host])
                 if r["event"] == "start"}  # fmt: skip
        ended = {(r["jobId"], r["attempt"]) for r in read_records([tmp_path / lost_host])
                 if r["event"] == "end"}  # fmt: skip
        live_on_h2 = {j: a for j, a in on_h2.items() if (j, a) not in ended}
        assert live_on_h2, "h2 runs nothing: the scenario did not happen"
        second.kill()
        await eventually(lambda: capacity_is(bus, 2), 20, what="capacity 2 after h2's loss")
        facts = await read_facts(bus.js)
        lost = f"Host {lost_host} lost (no heartbeat for "
        failed = [f for f in facts if f["kind"] == "JobStatusChanged"
                  and (f.get("statusReason") or "").startswith(lost)]  # fmt: skip
        assert {(f["jobId"], f["attempt"]) for f in failed} == set(live_on_h2.items())
        start_agent(spawn, tmp_path, lost_host, "2,3")
        await eventually(lambda: capacity_is(bus, 4), 20, what="capacity 4 after h2's return")
        assert (await capacities(bus))[-3:] == [4, 2, 4]

        await eventually(lambda: logs_written(tmp_path, hosts), 10, what="every log's first line")
        facts = await read_facts(bus.js)
        commands = [c for _, c in await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>") if c]
    preempted = [f for f in facts if f["kind"] == "JobPreempted"]
    assert preempted and all(f["preemptorJobId"] == "high" for f in preempted)
    updates = [c for c in commands if c.get("kind") == "UpdateServiceEnvironment"]
    assert len(updates) == len([f for f in facts if f["kind"] == "ServiceEnvironmentUpdated"])
    check_fleet(read_records([tmp_path / h for h in hosts]),
                {h: tmp_path / h / "logs" for h in hosts}, facts)  # fmt: skip


async def test_an_attempt_no_single_host_can_place_is_reported_insufficient_once(
        tmp_path, nats_server, spawn):  # fmt: skip
    """Two hosts of one GPU each: the fleet has two, no host has two for one attempt."""
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
        for host, gpu in (("h1", "0"), ("h2", "1")):
            start_agent(spawn, tmp_path, host, gpu)
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2 (two hosts)")
        await submit(bus, "pair", 1, 2, job(tmp_path, 1))

        async def bounced_twice():
            reports = [c for _, c in await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>")
                       if c and c.get("kind") == "ReportJobStatus" and c["jobId"] == "pair"]
            return reports if len({c["attempt"] for c in reports}) >= 2 else None

        reports = await eventually(bounced_twice, 20, what="two attempts bounced")
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "pair", "reason": "test"},
                          route=(QUEUE, "team"))  # fmt: skip
    assert {c["status"] for c in reports} == {"INSUFFICIENT_CAPACITY"}
    per_attempt = [c["attempt"] for c in reports]
    assert len(per_attempt) == len(set(per_attempt)), f"an attempt reported twice: {reports}"
    assert not [r for r in read_records([tmp_path / "h1", tmp_path / "h2"]) if r["event"] == "start"]


def waiting_job(pidfile: Path, go: Path) -> str:
    """Writes its pid, runs until `go` exists (90 s at most), exits 0."""
    return (f"sh -c 'echo $$ > {pidfile}; i=0; while [ ! -e {go} ] && [ $i -lt 900 ]; "
            f"do sleep 0.1; i=$((i+1)); done; exit 0'")


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def written_pid(pidfile: Path) -> int:
    async def read():
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        return int(text) if text else None

    return await eventually(read, 30, what=f"{pidfile} written")


async def one_host_running_a_job(bus: Bus, spawn, tmp_path: Path, gpus: str, pidfile: Path,
                                  go: Path):  # fmt: skip
    """Host h1 with `gpus` (its host timeout 30 s) running `train`, a job that waits for `go`:
    (the agent, the job's pid)."""
    count = len(gpus.split(","))
    await publish_items(bus, setup_commands(
        QUEUE, shares=[("team", count, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
    agent = start_agent(spawn, tmp_path, "h1", gpus, *SLOW)
    await eventually(lambda: capacity_is(bus, count), 30, what=f"capacity {count}")
    await submit(bus, "train", 1, 1, waiting_job(pidfile, go))
    await eventually(lambda: running_on(tmp_path, ["h1"], "train"), 30, what="train runs")
    return agent, await written_pid(pidfile)


SLOW = ["--host-timeout", "30"]


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_restarted_agent_follows_its_running_job_and_the_capacity_never_drops(
        tmp_path, nats_server, spawn, how):  # fmt: skip
    """One host, GPUs 0 and 1, a host timeout of 30 s.  The agent is stopped (SIGTERM) or
    killed while a job runs; the job runs on, the host stays in the fleet (the capacity is
    never lowered), and the agent started again follows that very process: one attempt,
    STARTING and RUNNING reported once, SUCCEEDED at its end, its GPU given back."""
    scheduler = spawn("scheduler")
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        first, pid = await one_host_running_a_job(bus, spawn, tmp_path, "0,1", pidfile, go)
        if how == "sigterm":
            assert first.stop() == 0
            assert "1 attempts keep running; start again to follow them" in first.output()
        else:
            first.kill()
        assert pid_alive(pid), f"the job stopped with its agent ({how})"

        second = start_agent(spawn, tmp_path, "h1", "0,1", *SLOW)
        await eventually(lambda: asyncio.sleep(0, "following 1 attempts" in second.output()), 30,
                         what="the agent following the job")  # fmt: skip
        job = await bus.request("describe-service-job", jobId="train")
        assert job["status"] == "RUNNING" and len(job["attempts"]) == 1, job
        go.touch()
        await eventually(lambda: asyncio.sleep(0, ("train", 1) in {
            (r["jobId"], r["attempt"]) for r in read_records([tmp_path / "h1"])
            if r["event"] == "end"}), 30, what="the end recorded")  # fmt: skip
        changes = await eventually(lambda: _ended(bus, "train"), 30, what="train's end")
        assert changes == [(1, "STARTING"), (1, "RUNNING"), (1, "SUCCEEDED")], changes
        assert await capacities(bus) == [2], "the capacity changed across the restart"
        assert pidfile.read_text().strip() == str(pid), "the job was started again"
        # its GPU is free again: a two-GPU job runs
        await submit(bus, "both", 1, 2, "true")
        await eventually(lambda: _ended(bus, "both"), 30, what="a two-GPU job after it")
    starts = [r for r in read_records([tmp_path / "h1"]) if r["event"] == "start"]
    assert [r["jobId"] for r in starts] == ["train", "both"]


async def _ended(bus: Bus, job_id: str):
    found = await statuses(bus, job_id)
    return found if found and found[-1][1] in ("SUCCEEDED", "FAILED") else None


async def test_an_agent_back_after_its_host_timeout_is_lost_as_before_and_stops_its_job(
        tmp_path, nats_server, spawn):  # fmt: skip
    """Two hosts, a host timeout of 1.5 s.  The host running the job is stopped gracefully
    (its job runs on) and stays away longer than the timeout: the keeper declares it lost and
    reports the job FAILED (the job's retryStrategy runs it again elsewhere).  Started again,
    that agent stops the process it left, reports nothing about it, and runs nothing twice."""
    scheduler = spawn("scheduler")
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
        agents = {"h1": start_agent(spawn, tmp_path, "h1", "0"),
                  "h2": start_agent(spawn, tmp_path, "h2", "1")}
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2 (two hosts)")
        await submit(bus, "train", 1, 1, waiting_job(pidfile, go))
        host = await eventually(lambda: running_on(tmp_path, ["h1", "h2"], "train"), 30,
                                what="train runs")  # fmt: skip
        pid = await written_pid(pidfile)
        assert agents[host].stop() == 0
        await eventually(lambda: capacity_is(bus, 1), 30, what=f"{host} lost")
        lost = [f for f in await read_facts(bus.js) if f["kind"] == "JobStatusChanged"
                and (f.get("statusReason") or "").startswith(f"Host {host} lost")]  # fmt: skip
        assert [(f["jobId"], f["attempt"], f["status"]) for f in lost] == [("train", 1, "FAILED")]
        assert pid_alive(pid), "the job runs on, on a host the fleet gave up"

        gpus = "0" if host == "h1" else "1"
        start_agent(spawn, tmp_path, host, gpus)
        await eventually(lambda: asyncio.sleep(0, not pid_alive(pid)), 30,
                         what="the job the lost host left stopped")  # fmt: skip
        await eventually(lambda: capacity_is(bus, 2), 30, what=f"{host} back")
        reports = [c for _, c in await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>")
                   if c and c.get("kind") == "ReportJobStatus" and c["jobId"] == "train"]
        assert [(c["attempt"], c["status"]) for c in reports] == [
            (1, "STARTING"), (1, "RUNNING"), (1, "FAILED")], "reported again by the lost host"
        assert reports[-1]["statusReason"].startswith(f"Host {host} lost")
    starts = [r for r in read_records([tmp_path / "h1", tmp_path / "h2"]) if r["event"] == "start"]
    assert [(r["jobId"], r["attempt"]) for r in starts] == [("train", 1)]


async def test_an_agent_started_again_without_its_state_directory_follows_the_fleets_copy(
        tmp_path, nats_server, spawn):  # fmt: skip
    """A reinstalled host: the agent is killed while a job runs, and its whole state directory
    (ledger, exit statuses, logs) is gone.  Started again with an empty one, it takes the
    attempts from its ledger's copy in the fleet's KV (`ledger.<host>`) and follows the very
    process to its end: one attempt, SUCCEEDED."""
    import shutil

    scheduler = spawn("scheduler")
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        first, pid = await one_host_running_a_job(bus, spawn, tmp_path, "0", pidfile, go)

        async def copied():
            kv = await bus.js.key_value("QM_FLEET")
            entries = json.loads((await kv.get("ledger.h1")).value)
            return [e for e in entries if e["job_id"] == "train" and e["running"]] or None

        await eventually(copied, 10, what="the ledger's copy in the fleet")
        first.kill()
        shutil.rmtree(tmp_path / "h1")
        assert pid_alive(pid)

        second = start_agent(spawn, tmp_path, "h1", "0", *SLOW)
        await eventually(lambda: asyncio.sleep(0, "following 1 attempts" in second.output()), 30,
                         what="the agent following the job from the fleet's copy")  # fmt: skip
        assert "this host's copy in the fleet" in second.output()
        go.touch()
        changes = await eventually(lambda: _ended(bus, "train"), 30, what="train's end")
        assert changes == [(1, "STARTING"), (1, "RUNNING"), (1, "SUCCEEDED")], changes
        assert await capacities(bus) == [1]
