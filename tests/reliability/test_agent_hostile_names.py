"""The GPU agent and what a job controls (issue 28, points 2 and 5), on a real nats-server.

The container runtime here is a recording fake: a `docker` script first on PATH that appends
its argv to a file and exits 0 (the container "ran"), so the test reads exactly what the
agent asked of the runtime, with no daemon.  (tests/reliability/test_agent_containers.py runs
real podman.)

- Under `quotasched agent --container-runtime docker` with a real scheduler: a job whose id
  has the rule's edge characters (`-_Az09_-`) and whose command is all runtime flags runs to
  SUCCEEDED, and in the runtime's argv every job-controlled string comes after `--`.
- Jobs a log older than the rules may hold (ids `..`, `.`, `bad.`, `a:b`; an image
  `--privileged`), fed to a real agent object with the fleet's real KV bucket: none leaves
  its job SCHEDULED; each attempt is either run or failed with a reason saying why, and the
  hostile image never reaches the runtime.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import nats

from quotasched.services.client import Bus
from quotasched.services.executors.agent import AgentOptions, GpuAgent
from quotasched.services.executors.fleet import Fleet, fleet_bucket
from tests.executor_facts import dispatched, queue_created, submitted
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.test_agent_fleet import FAST, capacity_is, statuses

pytestmark = [pytest.mark.nats, pytest.mark.slow]

QUEUE, ENVIRONMENT = "gq", "gq-se"  # capacity_is reads this environment
AGENT_OPTIONS = ("--rm", "--name=", "--env=", "--gpus=", "--device=")
HOSTILE_COMMAND = ["--privileged", "-v", "/:/host", "--pid=host", "--volume=/:/host"]


def fake_runtime(tmp_path: Path) -> tuple[Path, Path]:
    """A `docker` that records each call's argv (one JSON list a line) and succeeds."""
    folder, record = tmp_path / "fakebin", tmp_path / "runtime-calls.jsonl"
    folder.mkdir()
    script = folder / "docker"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"with open({str(record)!r}, 'a') as out:\n"
                      "    out.write(json.dumps(sys.argv[1:]) + '\\n')\n")  # fmt: skip
    script.chmod(0o755)
    return folder, record


def runs(record: Path) -> list[list[str]]:
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return [call for call in calls if call[:1] == ["run"]]


async def test_a_job_with_edge_characters_runs_and_nothing_it_controls_is_a_runtime_option(
        tmp_path, nats_server, spawn):  # fmt: skip
    folder, record = fake_runtime(tmp_path)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")],
                                                capacity=1))  # fmt: skip
        spawn("agent", "--host", "h1", "--gpus", "0,1", "--capacity-unit", G5,
              "--service-environment", ENVIRONMENT, "--state-dir", str(tmp_path / "h1"),
              "--container-runtime", "docker", *FAST,
              PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2 (one host)")
        image = "registry.example.com/team/img:v1.2"
        for job_id, tags in (("-_Az09_-", {"image": image, "command": " ".join(HOSTILE_COMMAND)}),
                             ("_0-Z_", {"command": "true"})):  # a plain process beside it
            await bus.publish({
                "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
                "quotaShareName": "team", "tags": tags,
                "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]})  # fmt: skip

        async def both_succeeded() -> bool:
            return all([(1, "SUCCEEDED") in await statuses(bus, job_id)
                        for job_id in ("-_Az09_-", "_0-Z_")])  # fmt: skip

        await eventually(both_succeeded, 60, what="both jobs SUCCEEDED")
        facts = await read_facts(bus.js)
    assert not [f for f in facts if f["kind"] == "CommandRejected"], "a report was refused"
    [argv] = runs(record)
    options = argv[1:argv.index("--")]
    assert all(part.startswith(AGENT_OPTIONS) for part in options), argv
    assert argv[argv.index("--") + 1:] == [image, *HOSTILE_COMMAND]
    assert "--name=quotasched--_Az09_--1" in options
    assert "--env=QUOTASCHED_JOB_ID=-_Az09_-" in options
    assert (tmp_path / "h1" / "logs" / "-_Az09_-" / "1.log").exists()


# -- a log older than the rules -----------------------------------------------------------------

# (scenario, job id, tags, the attempt's report: status and words of its reason)
OLD_LOG = [
    ("an id of two dots fails with the reason", "..", {"command": "true"},
     "FAILED", ["job id '..' cannot name a log directory"]),
    ("an id of one dot fails with the reason", ".", {"command": "true"},
     "FAILED", ["job id '.' cannot name a log directory"]),
    ("an id with a trailing dot runs", "bad.", {"command": "true"}, "SUCCEEDED", []),
    ("an id with a colon runs", "a:b", {"command": "true"}, "SUCCEEDED", []),
    ("a privileged flag as the image fails before the runtime runs", "old-image",
     {"image": "--privileged", "command": "true"}, "FAILED", ["image '--privileged' begins with '-'"]),
    ("a valid image runs in the runtime", "boxed", {"image": "busybox", "command": "true"},
     "SUCCEEDED", []),
]


async def test_jobs_an_older_log_holds_never_stay_scheduled_under_the_agent(
        tmp_path, nats_server, monkeypatch):  # fmt: skip
    folder, record = fake_runtime(tmp_path)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    nc = await nats.connect(nats_server.url)
    reports: dict[str, list[tuple[str, str | None]]] = {}

    async def heard(message) -> None:
        command = json.loads(message.data)
        reports.setdefault(command["jobId"], []).append((command["status"], command.get("statusReason")))

    await nc.subscribe("qm.cmd.q.s.ReportJobStatus", cb=heard)

    async def publish(subject: str, data: bytes) -> None:
        await nc.publish(subject, data)

    options = AgentOptions(gpus=[str(n) for n in range(8)], capacity_unit="u", service_environment="se",
                           host="h1", logs_dir=str(tmp_path / "logs"), place_timeout_s=5,
                           heartbeat_s=1, host_timeout_s=5, container_runtime="docker")  # fmt: skip
    fleet = Fleet(await fleet_bucket(nc.jetstream(), storage="memory"), nc, publish, "h1", "se",
                  heartbeat_s=1, host_timeout_s=5)  # fmt: skip
    agent = GpuAgent(publish, options, fleet, state_dir=str(tmp_path / "state"))
    await agent.join()
    try:
        await agent.on_fact(queue_created("q", "se"))
        for _, job_id, tags, _, _ in OLD_LOG:
            await agent.on_fact(submitted(job_id, tags, share="s", unit="u"))
            await agent.on_fact(dispatched(job_id, share="s", unit="u"))

        async def all_ended() -> bool:
            return all(any(status in ("SUCCEEDED", "FAILED") for status, _ in reports.get(job_id, []))
                       for _, job_id, _, _, _ in OLD_LOG)  # fmt: skip

        try:
            await eventually(all_ended, 30, what="every attempt reported ended")
        except AssertionError:
            raise AssertionError(f"reports: {reports}") from None
    finally:
        await agent.close()
        await nc.close()
    problems = []
    for scenario, job_id, _, status, words in OLD_LOG:
        ended = [(s, reason) for s, reason in reports[job_id] if s in ("SUCCEEDED", "FAILED")]
        if ended[0][0] != status or not all(word in (ended[0][1] or "") for word in words):
            problems.append(f"{scenario}: reported {ended}")
    assert not problems, "\n".join(problems)
    called = runs(record)
    assert [argv[argv.index("--") + 1] for argv in called] == ["busybox"], called  # only `boxed`
