"""`quotasched config apply|export` as a user runs them, against a real nats-server and a real
`quotasched scheduler`: idempotence, the export round trip, updates and deletions, and a change
the scheduler refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quotasched.services.config import as_code as cac
from quotasched.services.config.auth import read_credentials
from quotasched.services.nats.embedded import EmbeddedServer
from tests.integration.conftest import wait_until
from tests.integration.test_cli_live import wait_for_scheduler

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shares.yaml"
QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


def run(url: str, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUOTASCHED_NATS_URL": url, **extra_env}
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)  # fmt: skip


def configuration_facts(url: str) -> list[str]:
    """The fact log without ticks' effects: every configuration fact recorded so far."""
    result = run(url, "facts")
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines()
            if json.loads(line)["kind"].startswith(("ServiceEnvironment", "SchedulingPolicy",
                                                    "JobQueue", "QuotaShare", "CommandRejected"))]


def write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture
def live(nats_server, spawn) -> str:
    spawn("scheduler")
    wait_for_scheduler(nats_server.url)
    return nats_server.url


def test_apply_is_idempotent_and_export_round_trips(live, tmp_path):
    dry = run(live, "config", "apply", str(EXAMPLE), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "+ create quota share q/qs1" in dry.stdout and "dry run: nothing was published" \
        in dry.stdout
    assert configuration_facts(live) == []

    first = run(live, "config", "apply", str(EXAMPLE))
    assert first.returncode == 0, first.stderr
    assert "applied: 6 to create, 0 to update, 0 to delete (6 commands)" in first.stdout
    recorded = configuration_facts(live)
    assert [json.loads(line)["kind"] for line in recorded] == [
        "ServiceEnvironmentCreated", "SchedulingPolicyCreated", "JobQueueCreated",
        "QuotaShareCreated", "QuotaShareCreated", "QuotaShareCreated"]

    second = run(live, "config", "apply", str(EXAMPLE))
    assert second.returncode == 0, second.stderr
    assert "no changes: the live configuration matches the file" in second.stdout
    assert configuration_facts(live) == recorded  # nothing was published

    exported = tmp_path / "exported.yaml"
    result = run(live, "config", "export", "--out", str(exported))
    assert result.returncode == 0, result.stderr
    assert cac.to_document(cac.load(exported)) == cac.to_document(cac.load(EXAMPLE))
    again = run(live, "config", "apply", str(exported))
    assert again.returncode == 0 and "no changes" in again.stdout, again.stderr
    assert configuration_facts(live) == recorded
    printed = run(live, "config", "export")  # to standard output: the same file
    assert printed.returncode == 0 and printed.stdout == exported.read_text()


def test_updates_deletions_and_a_refused_change(live, tmp_path):
    assert run(live, "config", "apply", str(EXAMPLE)).returncode == 0
    submission = tmp_path / "job.jsonl"
    submission.write_text(json.dumps({
        "kind": "SubmitServiceJob", "jobId": "j", "jobName": "j", "jobQueue": "q",
        "quotaShareName": "qs3",
        "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}) + "\n")  # fmt: skip
    submitted = run(live, "apply", str(submission), "--wait")
    assert submitted.returncode == 0, submitted.stderr

    document = yaml.safe_load(EXAMPLE.read_text())
    document["quotaShares"][0]["capacityLimits"][0]["maxCapacity"] = 2
    document["quotaShares"].pop()  # qs3, which has an unfinished job
    changed = write(tmp_path / "changed.yaml", document)
    guarded = run(live, "config", "apply", str(changed))
    assert guarded.returncode == 2
    assert "would terminate its 1 unfinished job" in guarded.stdout
    assert "nothing was published" in guarded.stderr

    before = configuration_facts(live)
    applied = run(live, "config", "apply", str(changed), "--terminate-jobs")
    assert applied.returncode == 0, applied.stderr
    assert "~ update quota share q/qs1" in applied.stdout
    assert "      capacityLimits: 1 ml.g5.xlarge -> 2 ml.g5.xlarge" in applied.stdout
    assert "- delete quota share q/qs3  (DISABLED first; terminates its 1 unfinished job)" \
        in applied.stdout
    kinds = [json.loads(line)["kind"] for line in configuration_facts(live)[len(before):]]
    assert kinds == ["QuotaShareUpdated", "QuotaShareDeleted", "QuotaShareUpdated"]
    ended = [json.loads(line) for line in run(live, "facts").stdout.splitlines()]
    assert [fact["status"] for fact in ended
            if fact["kind"] == "JobStatusChanged" and fact["jobId"] == "j"] == ["FAILED"]  # fmt: skip
    assert "no changes" in run(live, "config", "apply", str(changed)).stdout

    # A second job queue on the same service environment: only the scheduler knows it refuses.
    document["jobQueues"].append({"jobQueueName": "q2", "schedulingPolicy": "sp",
                                  "serviceEnvironmentOrder": [{"order": 1,
                                                               "serviceEnvironment": "se"}]})
    document["quotaShares"].append({**document["quotaShares"][0], "jobQueue": "q2"})
    before = configuration_facts(live)
    refused = run(live, "config", "apply", str(write(tmp_path / "refused.yaml", document)))
    assert refused.returncode == 1
    assert ("CreateJobQueue for job queue q2 refused: Service environment se is already "
            "attached to job queue q") in refused.stderr
    assert "0 earlier command(s) were applied, the rest were not published" in refused.stderr
    after = configuration_facts(live)[len(before):]
    assert [json.loads(line)["kind"] for line in after] == ["CommandRejected"]


def test_options_beyond_aws_are_declared_applied_exported_and_turned_off(live, tmp_path):
    """A share's `options` (docs/options.md) in the file: applied as SetQuotaShareOptions after
    the share, exported as declared, idempotent, and turned off when the file drops them."""
    document = yaml.safe_load(EXAMPLE.read_text())
    options = {"minRuntimeBeforePreemptionSeconds": 600,
               "preemptionBudget": {"maxPreemptions": 2, "windowSeconds": 3600}}  # fmt: skip
    document["quotaShares"][0]["options"] = options
    declared = write(tmp_path / "options.yaml", document)
    applied = run(live, "config", "apply", str(declared))
    assert applied.returncode == 0, applied.stderr
    assert ("~ update quota share options q/qs1\n      options: all off -> no preemption in a "
            "job's first 600 s, at most 2 preemptions in any 3600 s") in applied.stdout
    facts = [json.loads(line) for line in configuration_facts(live)]
    assert [fact["kind"] for fact in facts][3:5] == ["QuotaShareCreated", "QuotaShareOptionsSet"]
    assert facts[4]["quotaShareName"] == "qs1"
    assert {key: value for key, value in facts[4]["options"].items() if value is not None} == options
    assert "no changes" in run(live, "config", "apply", str(declared)).stdout
    exported = yaml.safe_load(run(live, "config", "export").stdout)
    assert exported["quotaShares"][0]["options"] == options
    assert "options" not in exported["quotaShares"][1]

    del document["quotaShares"][0]["options"]
    off = run(live, "config", "apply", str(write(tmp_path / "off.yaml", document)))
    assert off.returncode == 0 and "options: no preemption in a job's first 600 s, at most 2 " \
        "preemptions in any 3600 s -> all off" in off.stdout, off.stdout
    last = json.loads(configuration_facts(live)[-1])
    assert last["kind"] == "QuotaShareOptionsSet"
    assert not any(last["options"].values())  # every option off
    bad = document | {"quotaShares": [{**document["quotaShares"][0], "options": {"lendingLimit": 2}}]}
    refused = run(live, "config", "apply", str(write(tmp_path / "bad.yaml", bad)))
    assert refused.returncode == 2
    assert "quotaShares[0] (q/qs1).options.lendingLimit: is not an option" in refused.stderr


def test_an_invalid_file_or_no_server_publishes_nothing(tmp_path):
    document = yaml.safe_load(EXAMPLE.read_text())
    document["quotaShares"][1]["capacityLimits"][0]["maxCapacity"] = 0
    result = run("nats://127.0.0.1:1", "config", "apply",
                 str(write(tmp_path / "bad.yaml", document)))  # fmt: skip
    assert result.returncode == 2
    assert "quotaShares[1] (q/qs2).capacityLimits[0].maxCapacity: Input should be greater " \
           "than or equal to 1" in result.stderr
    unreachable = run("nats://127.0.0.1:1", "config", "export")
    assert unreachable.returncode == 2
    assert "cannot reach the NATS server at nats://127.0.0.1:1" in unreachable.stderr


def test_apply_as_the_admin_role_under_nats_permissions(tmp_path, spawn):
    """With the users of `quotasched auth generate` (compose.auth.yaml runs them): the
    scheduler runs as `scheduler`, the configuration is applied as `admin`."""
    out = tmp_path / "nats-auth"
    generated = run("nats://unused", "auth", "generate", "--config", str(EXAMPLE),
                    "--out", str(out))  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    server = EmbeddedServer(tmp_path / "secured",
                            extra_args=["-c", str(out / "nats-server.conf")]).start()
    scheduler = None
    try:
        admin = read_credentials(out / "creds" / "admin.env")
        scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=server.url,
                          **read_credentials(out / "creds" / "scheduler.env"))
        wait_until(lambda: run(server.url, "config", "export", **admin).returncode == 0)
        assert run(server.url, "config", "export").returncode == 2  # no credentials
        applied = run(server.url, "config", "apply", str(EXAMPLE), **admin)
        assert applied.returncode == 0, applied.stderr
        assert "applied: 6 to create" in applied.stdout
        again = run(server.url, "config", "apply", str(EXAMPLE), **admin)
        assert again.returncode == 0 and "no changes" in again.stdout, again.stderr
    finally:
        if scheduler is not None:
            scheduler.stop()  # before its server
        server.stop()
