"""`quotasched logs` as a user met it (issue 32, point 6): after `up --executor agent` the logs
are in <data-dir>/logs, and a job submitted without an id (the AWS CLI, the SDK: a UUID) is
found by its name, not told "no agent of the fleet placed it"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import G5, eventually, publish_items, setup_commands, wait_decided
from tests.integration.test_failover import wait_leading
from tests.reliability.test_agent_fleet import ENVIRONMENT, QUEUE, start_agent

pytestmark = [pytest.mark.nats, pytest.mark.slow]
QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


def logs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([QUOTASCHED, "logs", *args], capture_output=True, text=True, timeout=60)


def test_logs_reads_an_up_data_dirs_logs(tmp_path):
    """By hand: an agent run by `up --data-dir D` writes D/logs/<job id>/<attempt>.log."""
    folder = tmp_path / "data" / "logs" / "j-1"
    folder.mkdir(parents=True)
    (folder / "1.log").write_text("first attempt\n")
    (folder / "2.log").write_text("second attempt\n")
    done = logs("j-1", "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "second attempt\n"  # the latest attempt with a log here
    assert logs("j-1", "--data-dir", str(tmp_path / "data"), "--attempt", "1").stdout == "first attempt\n"
    missing = logs("j-1", "--data-dir", str(tmp_path / "elsewhere"))
    assert missing.returncode == 1
    assert f"no log of job j-1 in {tmp_path / 'elsewhere' / 'logs'}" in missing.stderr
    both = logs("j-1", "--data-dir", str(tmp_path / "data"), "--logs-dir", str(folder))
    assert both.returncode == 2 and "not both" in both.stderr


async def test_logs_finds_a_job_by_its_name(tmp_path, nats_server, spawn):
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        seqs = await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "DISABLED")], capacity=1))  # fmt: skip
        # decided before anything asks about the queue (a stored command may not be decided
        # yet, and a list of a queue not created yet is refused, not retried)
        await wait_decided(bus.js, seqs[-1], processes=[scheduler])
        start_agent(spawn, tmp_path, "h1", "0,1")
        script = tmp_path / "hello.py"
        script.write_text("print('hello from the named job', flush=True)\n")
        for _ in range(2):  # two jobs share the name "twin"
            await bus.publish({"kind": "SubmitServiceJob", "jobName": "twin", "jobQueue": QUEUE,
                               "quotaShareName": "team", "tags": {"command": f"{sys.executable} {script}"},
                               "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]})  # fmt: skip
        await bus.publish({"kind": "SubmitServiceJob", "jobName": "named", "jobQueue": QUEUE,
                           "quotaShareName": "team", "tags": {"command": f"{sys.executable} {script}"},
                           "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]})  # fmt: skip

        async def ids_of(name: str) -> list[str]:
            answer = await bus.request("list-service-jobs", jobQueue=QUEUE, filters=[
                {"name": "JOB_NAME", "values": [name]}])  # fmt: skip
            return [job["jobId"] for job in answer["jobSummaryList"] if job["status"] == "SUCCEEDED"]

        [named] = await eventually(lambda: ids_of("named"), 60, what="the named job SUCCEEDED")
        twins = await eventually(lambda: _both(ids_of("twin")), 60, what="both twins SUCCEEDED")
    logs_dir = tmp_path / "h1" / "logs"
    assert named != "named" and (logs_dir / named).is_dir()  # its id is not its name
    by_name = logs("named", "--logs-dir", str(logs_dir), "--nats-url", nats_server.url)
    assert by_name.returncode == 0, by_name.stderr
    assert "hello from the named job" in by_name.stdout
    assert logs(named, "--logs-dir", str(logs_dir)).stdout == by_name.stdout  # by its id
    several = logs("twin", "--logs-dir", str(logs_dir), "--nats-url", nats_server.url)
    assert several.returncode == 2
    assert "2 jobs are named twin" in several.stderr and all(t in several.stderr for t in twins)
    nobody = logs("nobody", "--logs-dir", str(logs_dir), "--nats-url", nats_server.url)
    assert nobody.returncode == 1 and "no log of job nobody" in nobody.stderr


async def _both(found):
    ids = await found
    return ids if len(ids) == 2 else None
