"""Configuration as code declares a share's admission limits (docs/options.md, "Admission
limits"): `options: {maxQueuedJobs: 10, maxSubmissionsPerSecond: 5}` on a quotaShares entry.

The pure part: validation with the file's key path, the plan and its commands through the
decision core (the limits then refuse what they should).  The live part runs `quotasched
config` as a user does against a real nats-server and a real `quotasched scheduler`: dry run,
apply, the share's options on `list-quota-shares`, export as declared, idempotence, and
dropping them (back to the defaults)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import yaml

from quotasched.events.values import QuotaShareOptions
from quotasched.services.config import as_code as cac
from quotasched.services.client import Bus
from tests.builders import Cluster
from tests.ops.test_config_live import EXAMPLE, configuration_facts, live, run, write  # noqa: F401
from tests.ops.test_config_plan import live_of, problems
from tests.ops.test_config_plan import run as run_in_core

G5 = "ml.g5.xlarge"
LIMITS = {"maxQueuedJobs": 10, "maxSubmissionsPerSecond": 5}
SHOWN = "at most 10 queued jobs, at most 5 submissions per second"


def with_limits(limits: dict | None = None, share: int = 1) -> dict:
    """examples/shares.yaml with `options` on its quota share `share` (qs2; none: as it is)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    if limits is not None:
        document["quotaShares"][share]["options"] = copy.deepcopy(limits)
    return document


def submit(job_id: str, at: float, share: str = "qs2") -> str:
    return json.dumps({"kind": "SubmitServiceJob", "jobQueue": "q", "quotaShareName": share,
                        "jobName": job_id, "jobId": job_id, "at": at,
                        "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]})  # fmt: skip


def list_quota_shares(url: str) -> dict[str, dict]:
    """The scheduler's `list-quota-shares` answer for job queue q, by share name."""

    async def ask() -> dict:
        async with Bus(url) as bus:
            return await bus.request("list-quota-shares", jobQueue="q")

    return {share["quotaShareName"]: share for share in asyncio.run(ask())["quotaShares"]}


# -- the file --------------------------------------------------------------------------------


def test_the_limits_are_validated_and_a_bad_one_is_named_by_its_key_path():
    declared = cac.parse(with_limits(LIMITS))
    assert declared.options[("q", "qs2")] == QuotaShareOptions(max_queued_jobs=10,
                                                               max_submissions_per_second=5)
    assert cac.to_document(declared)["quotaShares"][1]["options"] == LIMITS
    assert problems(with_limits({"maxQueuedJobs": 0})) == [
        "quotaShares[1] (q/qs2).options.maxQueuedJobs: Input should be greater than or equal "
        "to 1"]
    assert problems(with_limits({"maxSubmissionsPerSecond": 100_001,
                                 "submissionBytesWindowSeconds": "60"})) == [
        "quotaShares[1] (q/qs2).options.maxSubmissionsPerSecond: Input should be less than or "
        "equal to 100000",
        "quotaShares[1] (q/qs2).options.submissionBytesWindowSeconds: Input should be a valid "
        "integer"]  # fmt: skip  (strict, as on the wire)
    assert problems(with_limits({"maxQueuedJob": 10})) == [
        "quotaShares[1] (q/qs2).options.maxQueuedJob: is not an option (docs/options.md)"]


# -- the plan, through the decision core ------------------------------------------------------


def test_the_plan_sets_the_limits_they_refuse_a_flood_and_dropping_them_restores_the_defaults():
    cluster = Cluster()
    assert run_in_core(cluster, cac.plan(cac.parse(with_limits()), live_of(cluster))) == []
    declared = cac.parse(with_limits(LIMITS))
    first = cac.plan(declared, live_of(cluster))
    assert cac.render(first) == ["~ update quota share options q/qs2",
                                 f"      options: all off -> {SHOWN}"]  # fmt: skip
    assert [command.kind for command in first.commands] == ["SetQuotaShareOptions"]
    assert run_in_core(cluster, first) == []
    assert live_of(cluster).options[("q", "qs2")] == declared.options[("q", "qs2")]
    assert cac.plan(declared, live_of(cluster)).changes == []

    # 6 submissions to qs2 in one second: the 6th is refused, naming the limit; qs1 is not
    refusals = [fact.status_reason for i in range(6)
                for fact in cluster.send(submit(f"j{i}", 5.0 + i / 10))
                if fact.kind == "CommandRejected"]  # fmt: skip
    assert refusals == ["Quota share qs2 already had 5 submissions in this second, its limit "
                        "maxSubmissionsPerSecond of 5"]
    assert not any(f.kind == "CommandRejected" for f in cluster.send(submit("k", 5.9, "qs1")))

    off = cac.plan(cac.parse(with_limits()), live_of(cluster))
    assert cac.render(off) == ["~ update quota share options q/qs2",
                               f"      options: {SHOWN} -> all off"]  # fmt: skip
    assert run_in_core(cluster, off) == []
    assert ("q", "qs2") not in live_of(cluster).options
    # the default (10,000 a second) applies again: a 7th submission in that second is accepted
    assert not any(f.kind == "CommandRejected" for f in cluster.send(submit("j6", 5.95)))


# -- live: `quotasched config` against a real scheduler ---------------------------------------


@pytest.mark.nats
def test_dry_run_apply_list_export_and_drop_against_a_live_scheduler(live, tmp_path):  # noqa: F811
    assert run(live, "config", "apply", str(EXAMPLE)).returncode == 0
    before = configuration_facts(live)
    declared = write(tmp_path / "limits.yaml", with_limits(LIMITS))
    dry = run(live, "config", "apply", str(declared), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"~ update quota share options q/qs2\n      options: all off -> {SHOWN}\n" in dry.stdout
    assert "dry run: nothing was published" in dry.stdout
    assert configuration_facts(live) == before

    applied = run(live, "config", "apply", str(declared))
    assert applied.returncode == 0, applied.stderr
    assert "applied: 0 to create, 1 to update, 0 to delete (1 command)" in applied.stdout
    facts = [json.loads(line) for line in configuration_facts(live)[len(before):]]
    assert [(f["kind"], f["quotaShareName"]) for f in facts] == [("QuotaShareOptionsSet", "qs2")]
    assert {k: v for k, v in facts[0]["options"].items() if v is not None} == LIMITS
    shares = list_quota_shares(live)
    assert shares["qs2"]["options"] == LIMITS
    assert "options" not in shares["qs1"] and "options" not in shares["qs3"]

    again = run(live, "config", "apply", str(declared))
    assert again.returncode == 0 and "no changes" in again.stdout, again.stderr
    exported = tmp_path / "exported.yaml"
    assert run(live, "config", "export", "--out", str(exported)).returncode == 0
    document = yaml.safe_load(exported.read_text())
    assert document["quotaShares"][1]["options"] == LIMITS
    assert all("options" not in document["quotaShares"][i] for i in (0, 2))
    round_trip = run(live, "config", "apply", str(exported))
    assert round_trip.returncode == 0 and "no changes" in round_trip.stdout, round_trip.stderr

    off = run(live, "config", "apply", str(write(tmp_path / "off.yaml", with_limits())))
    assert off.returncode == 0, off.stderr
    assert f"      options: {SHOWN} -> all off" in off.stdout
    last = json.loads(configuration_facts(live)[-1])
    assert last["kind"] == "QuotaShareOptionsSet" and last["quotaShareName"] == "qs2"
    assert not any(last["options"].get(name) for name in LIMITS)
    assert "options" not in list_quota_shares(live)["qs2"]
    assert "options" not in yaml.safe_load(run(live, "config", "export").stdout)["quotaShares"][1]
    assert "no changes" in run(live, "config", "apply", str(EXAMPLE)).stdout


@pytest.mark.nats
def test_a_bad_limit_publishes_nothing(live, tmp_path):  # noqa: F811
    assert run(live, "config", "apply", str(EXAMPLE)).returncode == 0
    before = configuration_facts(live)
    bad = write(tmp_path / "bad.yaml", with_limits({**LIMITS, "maxQueuedJobs": 0}))
    refused = run(live, "config", "apply", str(bad))
    assert refused.returncode == 2
    assert "quotaShares[1] (q/qs2).options.maxQueuedJobs: Input should be greater than or " \
           "equal to 1" in refused.stderr
    assert "nothing was published" in refused.stderr
    assert configuration_facts(live) == before
