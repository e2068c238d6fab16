"""The `aws batch`-shaped CLI against a real nats-server and a real `quotasched scheduler`.

Every CLI call is a subprocess of the installed console script, as a user would run it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError

from quotasched.events.codec import decode_fact, encode
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
QUOTASCHED = str(Path(sys.executable).parent / "quotasched")
G5 = "ml.g5.xlarge"


def run(url: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUOTASCHED_NATS_URL": url, "COLUMNS": "200"}
    env.pop("QUOTASCHED_OUTPUT", None)
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)  # fmt: skip


def ok(url: str, *args: str, cwd: Path = ROOT) -> dict:
    """Runs a verb that must succeed; returns its JSON answer."""
    result = run(url, *args, cwd=cwd)
    assert result.returncode == 0, (args, result.returncode, result.stderr)
    return json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}


def fact_lines(url: str, *args: str) -> list[str]:
    result = run(url, "facts", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def wait_for_scheduler(url: str, timeout: float = 20.0) -> None:
    """Until the scheduler leads: it answers reads, so its streams exist too."""

    async def answered() -> None:
        nc = await nats.connect(url)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                try:
                    await nc.request("qm.api.describe-job-queues", b"{}", timeout=0.5)
                    return
                except (NoRespondersError, TimeoutError):
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(answered())


@pytest.fixture
def live(nats_server, spawn) -> str:
    spawn("scheduler")
    wait_for_scheduler(nats_server.url)
    return nats_server.url


def _share(url: str, name: str, *args: str) -> dict:
    return ok(url, "create-quota-share", "--quota-share-name", name, "--job-queue", "q", *args)


def test_the_notebook_story_through_the_aws_verbs(live, tmp_path):
    url = live
    # -- setup, exactly as `aws batch` would take it (shorthand, ARNs, space-separated lists)
    created = ok(url, "create-service-environment", "--service-environment-name", "se",
                 "--service-environment-type", "SAGEMAKER_TRAINING",
                 "--capacity-limits", f"capacityUnit={G5},maxCapacity=3")  # fmt: skip
    assert created["serviceEnvironmentName"] == "se" and created["commandSeq"] >= 1
    ok(url, "create-scheduling-policy", "--name", "sp",
       "--quota-share-policy", "idleResourceAssignmentStrategy=FIFO")  # fmt: skip
    queue = ok(url, "create-job-queue", "--job-queue-name", "q", "--priority", "1",
               "--service-environment-order", "order=1,serviceEnvironment=se",
               "--scheduling-policy-arn",
               "arn:aws:batch:us-east-1:123456789012:scheduling-policy/sp",
               "--state", "ENABLED")  # fmt: skip
    assert queue["jobQueueArn"].endswith(":job-queue/q")
    _share(url, "qs1", "--capacity-limits", f"maxCapacity=1,capacityUnit={G5}",
           "--resource-sharing-configuration", "strategy=LEND_AND_BORROW,borrowLimit=200",
           "--preemption-configuration", "inSharePreemption=ENABLED")  # fmt: skip
    _share(url, "qs2", "--capacity-limits", json.dumps([{"capacityUnit": G5, "maxCapacity": 1}]),
           "--resource-sharing-configuration", "strategy=LEND",
           "--preemption-configuration", "inSharePreemption=DISABLED")  # fmt: skip
    qs3 = _share(url, "qs3", "--capacity-limits", f"capacityUnit={G5},maxCapacity=1",
                 "capacityUnit=ml.p4d.24xlarge,maxCapacity=1",
                 "--resource-sharing-configuration", "strategy=RESERVE",
                 "--preemption-configuration", "inSharePreemption=DISABLED", "--wait")  # fmt: skip
    assert [fact["kind"] for fact in qs3["facts"]] == ["QuotaShareCreated"]
    assert qs3["quotaShareArn"].endswith(":job-queue/q/quota-share/qs3")

    shares = ok(url, "list-quota-shares", "--job-queue", "q")["quotaShares"]
    assert [share["quotaShareName"] for share in shares] == ["qs1", "qs2", "qs3"]
    assert shares[0]["resourceSharingConfiguration"] == {"strategy": "LEND_AND_BORROW",
                                                         "borrowLimit": 200}  # fmt: skip
    assert len(shares[2]["capacityLimits"]) == 2  # the space-separated list arrived whole
    described = ok(url, "describe-quota-share", "--quota-share-arn", qs3["quotaShareArn"])
    assert described["resourceSharingConfiguration"]["strategy"] == "RESERVE"
    table = run(url, "list-quota-shares", "--job-queue", "q", "--output", "table")
    assert table.returncode == 0 and "LEND_AND_BORROW" in table.stdout and "qs3" in table.stdout

    # -- submissions: the id comes back like AWS's; --wait adds the decision
    high = ok(url, "submit-service-job", "--job-name", "high", "--job-queue", "q",
              "--quota-share-name", "qs1", "--scheduling-priority", "3",
              "--instance-type", G5)  # fmt: skip
    assert set(high) == {"jobArn", "jobName", "jobId", "commandSeq"} and high["jobName"] == "high"
    payload = tmp_path / "training.json"
    payload.write_text(json.dumps({"TrainingJobName": "med",
                                   "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}}))
    med = ok(url, "submit-service-job", "--job-name", "med", "--job-queue", "q",
             "--quota-share-name", "qs1", "--scheduling-priority", "2",
             "--service-request-payload", f"file://{payload}", "--wait")  # fmt: skip
    dispatched = [f for f in med["facts"] if f["kind"] == "JobDispatched"]
    assert dispatched and dispatched[0]["borrowed"] == [{"capacityUnit": G5, "quantity": 1}]
    low = ok(url, "submit-service-job", "--job-name", "low", "--job-id", "low", "--no-wait",
             "--job-queue", "q", "--quota-share-name", "qs1", "--scheduling-priority", "1",
             "--capacity-usage", f"capacityUnit={G5},quantity=1", "--tags", "team=a,env=dev",
             "--preemption-configuration", "preemptionRetriesBeforeTermination=5",
             "--retry-strategy", "attempts=2", "--timeout-config", "attemptDurationSeconds=3600")
    assert low["jobId"] == "low" and "facts" not in low
    b1 = ok(url, "submit-service-job", "--job-name", "b1", "--job-id", "b1", "--job-queue", "q",
            "--quota-share-name", "qs2", "--scheduling-priority", "1", "--instance-type", G5,
            "--wait")  # fmt: skip
    reclaim = [f for f in b1["facts"] if f["kind"] == "JobPreempted"]
    assert [(f["jobId"], f["reason"]) for f in reclaim] == [(med["jobId"], "CROSS_SHARE_RECLAIM")]

    # -- reads
    med_now = ok(url, "describe-service-job", "--job-id", med["jobArn"])
    assert med_now["status"] == "RUNNABLE"
    assert med_now["preemptionSummary"]["preemptedAttemptCount"] == 1
    low_now = ok(url, "describe-service-job", "--job-id", "low")
    assert (low_now["status"], low_now["retryStrategy"]["attempts"]) == ("RUNNABLE", 2)
    in_qs1 = ok(url, "list-service-jobs", "--job-queue", "q", "--job-status", "SCHEDULED",
                "--filters", "name=QUOTA_SHARE_NAME,values=qs1")["jobSummaryList"]  # fmt: skip
    assert [job["jobId"] for job in in_qs1] == [high["jobId"]]
    by_name = ok(url, "list-service-jobs", "--job-queue", "q",
                 "--filters", "name=JOB_NAME,values=low,b1")["jobSummaryList"]  # fmt: skip
    assert [job["jobName"] for job in by_name] == ["b1", "low"]  # newest first
    snapshot = ok(url, "get-job-queue-snapshot", "--job-queue", "q")
    usage = snapshot["queueUtilization"]
    assert usage["totalCapacityUsage"] == [{"capacityUnit": G5, "quantity": 2.0}]
    assert {item["quotaShareName"]: item["capacityUsage"][0]["quantity"]
            for item in usage["quotaShareUtilization"]["topCapacityUtilization"]} == {
        "qs1": 1.0, "qs2": 1.0}  # fmt: skip
    assert snapshot["frontOfQuotaShares"]["quotaShares"]["qs1"][0]["jobArn"] == med["jobArn"]
    table = run(url, "get-job-queue-snapshot", "--job-queue", "q", "--output", "table")
    assert table.returncode == 0, table.stderr
    assert "Queue utilization" in table.stdout and f"2 {G5}" in table.stdout
    assert med["jobId"] in table.stdout

    # -- a priority update (returns on the ack) makes `low` preempt `high` inside qs1
    updated = ok(url, "update-service-job", "--job-id", "low", "--scheduling-priority", "4")
    assert updated["jobName"] == "low" and "facts" not in updated

    def in_share_preemption():
        facts = [json.loads(line) for line in fact_lines(url, "--job-queue", "q")]
        return [f for f in facts
                if f["kind"] == "JobPreempted" and f["reason"] == "IN_SHARE_PRIORITY"]

    preempted = wait_until(in_share_preemption, timeout=10)
    assert [(f["jobId"], f["preemptorJobId"]) for f in preempted] == [(high["jobId"], "low")]
    assert preempted[0]["commandSeq"] == updated["commandSeq"]

    # -- terminate, waiting for the decision
    ended = ok(url, "terminate-service-job", "--job-id", "low", "--reason", "done with it",
               "--wait")
    assert any(f["kind"] == "JobStatusChanged" and f["status"] == "FAILED" and f["isTerminated"]
               for f in ended["facts"])  # fmt: skip
    low_now = ok(url, "describe-service-job", "--job-id", "low")
    assert (low_now["status"], low_now["statusReason"], low_now["isTerminated"]) == (
        "FAILED", "done with it", True)  # fmt: skip

    # -- the fact log prints canonically, one valid fact per line, in order
    lines = fact_lines(url)
    assert lines and all(encode(decode_fact(line)) == line for line in lines)
    seqs = [json.loads(line)["commandSeq"] for line in lines]
    assert seqs == sorted(seqs)


def test_refused_commands_exit_1_and_bad_parameters_exit_2(live):
    url = live
    refused = run(url, "submit-service-job", "--job-name", "x", "--job-queue", "nowhere",
                  "--quota-share-name", "qs1", "--instance-type", G5)  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == ""
    assert ("An error occurred (ClientException) when calling the SubmitServiceJob operation: "
            "Job queue nowhere does not exist") in refused.stderr  # fmt: skip
    ok(url, "create-scheduling-policy", "--name", "sp",
       "--quota-share-policy", "idleResourceAssignmentStrategy=FIFO", "--wait")  # fmt: skip
    again = run(url, "create-scheduling-policy", "--name", "sp",
                "--quota-share-policy", "idleResourceAssignmentStrategy=FIFO", "--wait")
    assert again.returncode == 1 and "already exists" in again.stderr
    unknown = run(url, "terminate-service-job", "--job-id", "ghost", "--reason", "x")
    assert unknown.returncode == 1 and "Job ghost does not exist" in unknown.stderr
    read = run(url, "describe-service-job", "--job-id", "ghost")
    assert read.returncode == 1
    assert "DescribeServiceJob operation: Job ghost does not exist" in read.stderr

    before = fact_lines(url)
    syntax = run(url, "create-quota-share", "--quota-share-name", "qs1", "--job-queue", "q",
                 "--capacity-limits", "capacityUnit,maxCapacity=1",
                 "--resource-sharing-configuration", "strategy=LEND",
                 "--preemption-configuration", "inSharePreemption=DISABLED")  # fmt: skip
    assert syntax.returncode == 2
    assert "Error parsing parameter '--capacity-limits'" in syntax.stderr
    invalid = run(url, "submit-service-job", "--job-name", "x", "--job-queue", "q",
                  "--quota-share-name", "qs1", "--instance-type", G5,
                  "--scheduling-priority", "10000")  # fmt: skip
    assert invalid.returncode == 2 and "schedulingPriority" in invalid.stderr
    no_wait = run(url, "submit-service-job", "--job-name", "x", "--job-queue", "q",
                  "--quota-share-name", "qs1", "--instance-type", G5, "--no-wait")  # fmt: skip
    assert no_wait.returncode == 2 and "--job-id" in no_wait.stderr
    assert fact_lines(url) == before  # nothing invalid was published
    assert "Traceback" not in syntax.stderr + invalid.stderr + refused.stderr


def test_apply_then_facts_equals_replay_without_at_and_command_seq(live):
    url = live
    applied = run(url, "apply", "examples/notebook.jsonl", "--wait")
    assert applied.returncode == 0, applied.stderr
    assert "applied 11 commands" in applied.stdout
    assert "11 decided: 11 accepted, 0 refused" in applied.stdout
    replayed = subprocess.run([QUOTASCHED, "replay", "examples/notebook.jsonl"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr

    def comparable(lines: list[str]) -> list[list[tuple]]:
        items = []
        for line in lines:
            fact = json.loads(line)
            del fact["at"], fact["commandSeq"]
            items.append(list(fact.items()))  # field order counts, as in the bytes
        return items

    live_facts = fact_lines(url)
    assert comparable(live_facts) == comparable(replayed.stdout.splitlines())
    kinds = [json.loads(line)["kind"] for line in live_facts]
    assert kinds.count("JobPreempted") == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("args", [
    ["list-service-jobs", "--job-queue", "q"],
    ["submit-service-job", "--job-name", "x", "--job-queue", "q", "--quota-share-name", "qs1",
     "--instance-type", G5],
    ["facts"],
], ids=["a read", "a write", "the fact log"])  # fmt: skip
def test_an_unreachable_server_is_named_and_exits_2_without_a_traceback(args):
    url = f"nats://127.0.0.1:{_closed_port()}"
    result = run("nats://unused:1", *args, "--nats-url", url)
    assert result.returncode == 2
    assert f"cannot reach the NATS server at {url}" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
