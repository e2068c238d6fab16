"""Configuration as code declares a job queue's options beyond AWS (`options:` on a jobQueues
entry: SetJobQueueOptions' idleResourceAssignmentStrategy, fairShare, shareGroups).

The pure part: problems named by their path in the file, the plan (a change shown like a
share's options, set after the queue's shares, turned off when dropped, reordering no change)
and its commands run through the decision core.  The live part runs `quotasched config` as a
user does, against a real nats-server and a real `quotasched scheduler`."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from quotasched.events.commands import SetJobQueueOptions
from quotasched.events.values import JobQueueOptions
from quotasched.services.config import as_code as cac
from tests.builders import Cluster
from tests.ops.test_config_live import EXAMPLE, configuration_facts, live, run, write  # noqa: F401
from tests.ops.test_config_plan import live_of, problems
from tests.ops.test_config_plan import run as run_in_core

G5 = "ml.g5.xlarge"
# qs1 and qs2 of examples/shares.yaml in one group capped at 2 instances, qs1 weighing 3
OPTIONS = {
    "idleResourceAssignmentStrategy": "FAIR_SHARE",
    "fairShare": {"halfLifeSeconds": 3600, "weights": [{"quotaShareName": "qs1", "weight": 3}]},
    "shareGroups": [{"name": "dept", "quotaShareNames": ["qs1", "qs2"],
                     "maxCapacity": [{"capacityUnit": G5, "maxCapacity": 2}]}],
}  # fmt: skip
SHOWN = "fair share (half-life 3600 s), group dept (qs1, qs2, at most 2 ml.g5.xlarge); weights qs1=3"


def with_options(options: dict | None = None) -> dict:
    """examples/shares.yaml with `options` on its job queue q (none: as it is)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    if options is not None:
        document["jobQueues"][0]["options"] = copy.deepcopy(options)
    return document


def without_nulls(value):
    """A fact's options as a file declares them: the fields left off are null in the fact."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


# -- the file --------------------------------------------------------------------------------


def test_options_are_validated_as_set_job_queue_options_validates_them():
    assert problems(with_options({"colour": "blue"})) == [
        "jobQueues[0] (q).options.colour: is not an option (docs/options.md)"]
    assert problems(with_options({"idleResourceAssignmentStrategy": "FAIR_SHARE"})) == [
        "jobQueues[0] (q).options: idleResourceAssignmentStrategy FAIR_SHARE needs fairShare "
        "(halfLifeSeconds)"]
    assert problems(with_options({"fairShare": {"halfLifeSeconds": 60}})) == [
        "jobQueues[0] (q).options: fairShare is given but idleResourceAssignmentStrategy is not "
        "FAIR_SHARE"]
    assert problems(with_options({"idleResourceAssignmentStrategy": "LIFO"}))[0].startswith(
        "jobQueues[0] (q).options.idleResourceAssignmentStrategy: Input should be 'FIFO' or "
        "'FAIR_SHARE'")
    weights = {"idleResourceAssignmentStrategy": "FAIR_SHARE",
               "fairShare": {"halfLifeSeconds": 0, "weights": [{"quotaShareName": "qs1", "weight": 1001}]}}
    assert problems(with_options(weights)) == [
        "jobQueues[0] (q).options.fairShare.halfLifeSeconds: Input should be greater than or "
        "equal to 1",
        "jobQueues[0] (q).options.fairShare.weights[0].weight: Input should be less than or "
        "equal to 1000"]
    twice = {"shareGroups": [{"name": "a", "quotaShareNames": ["qs1"]},
                             {"name": "b", "quotaShareNames": ["qs2", "qs1"]}]}  # fmt: skip
    assert problems(with_options(twice)) == [
        "jobQueues[0] (q).options: quota share qs1 is in group a and group b; a share belongs "
        "to at most one group"]
    capped = {"shareGroups": [{"name": "a", "quotaShareNames": ["qs1"],
                               "maxCapacity": [{"capacityUnit": G5, "maxCapacity": "2"}]}]}
    assert problems(with_options(capped)) == [
        "jobQueues[0] (q).options.shareGroups[0].maxCapacity[0].maxCapacity: Input should be a "
        "valid integer"]  # strict, as on the wire


def test_options_may_name_only_shares_the_file_declares_in_that_queue():
    """Any other share would not exist when the options are set (or be deleted by the plan,
    being a share of a declared queue left out of the file): the scheduler would refuse."""
    options = copy.deepcopy(OPTIONS)
    options["shareGroups"][0]["quotaShareNames"] = ["qs1", "qs9"]
    options["fairShare"]["weights"].append({"quotaShareName": "other", "weight": 2})
    assert problems(with_options(options)) == [
        "jobQueues[0] (q).options.fairShare.weights[1].quotaShareName: names quota share other, "
        "which the file does not declare in job queue q",
        "jobQueues[0] (q).options.shareGroups[0].quotaShareNames[1]: names quota share qs9, "
        "which the file does not declare in job queue q"]
    document = with_options(OPTIONS)
    document["quotaShares"] = [share for share in document["quotaShares"] if share["quotaShareName"] != "qs2"]
    assert problems(document) == [
        "jobQueues[0] (q).options.shareGroups[0].quotaShareNames[1]: names quota share qs2, "
        "which the file does not declare in job queue q"]


def test_export_writes_them_as_declared_and_all_off_is_no_options():
    declared = cac.parse(with_options(OPTIONS))
    assert declared.queue_options["q"] == JobQueueOptions.model_validate_json(json.dumps(OPTIONS))
    assert cac.to_document(declared)["jobQueues"][0]["options"] == OPTIONS
    off = cac.parse(with_options({"idleResourceAssignmentStrategy": "FIFO"}))
    assert off.queue_options == {} and "options" not in cac.to_document(off)["jobQueues"][0]


# -- the plan, through the decision core ------------------------------------------------------


def test_the_options_are_set_after_the_queues_shares_and_then_match():
    cluster = Cluster()
    first = cac.plan(cac.parse(with_options(OPTIONS)), live_of(cluster))
    assert cac.render(first)[-2:] == ["~ update job queue options q",
                                      f"      options: all off -> {SHOWN}"]  # fmt: skip
    assert [command.kind for command in first.commands] == [
        "CreateServiceEnvironment", "CreateSchedulingPolicy", "CreateJobQueue",
        "CreateQuotaShare", "CreateQuotaShare", "CreateQuotaShare", "SetJobQueueOptions"]
    assert cac.summary(first) == "6 to create, 1 to update, 0 to delete (7 commands)"
    assert run_in_core(cluster, first) == []
    assert live_of(cluster).queue_options["q"] == JobQueueOptions.model_validate_json(json.dumps(OPTIONS))
    assert cac.plan(cac.parse(with_options(OPTIONS)), live_of(cluster)).changes == []

    # A share the options now name is created first, in the same plan.
    document = with_options(OPTIONS)
    document["quotaShares"].append({**document["quotaShares"][1], "quotaShareName": "qs4"})
    document["jobQueues"][0]["options"]["shareGroups"][0]["quotaShareNames"].append("qs4")
    second = cac.plan(cac.parse(document), live_of(cluster))
    assert [(c.action, c.resource, c.name) for c in second.changes] == [
        ("create", "quota share", "q/qs4"), ("update", "job queue options", "q")]
    assert run_in_core(cluster, second) == []
    assert cac.plan(cac.parse(document), live_of(cluster)).changes == []


def test_reordering_is_no_change_and_a_weight_alone_is_one():
    cluster = Cluster()
    options = copy.deepcopy(OPTIONS)
    options["fairShare"]["weights"].append({"quotaShareName": "qs2", "weight": 2})
    options["shareGroups"].append({"name": "solo", "quotaShareNames": ["qs3"]})
    assert run_in_core(cluster, cac.plan(cac.parse(with_options(options)), live_of(cluster))) == []

    reordered = copy.deepcopy(options)
    reordered["fairShare"]["weights"].reverse()
    reordered["shareGroups"].reverse()
    reordered["shareGroups"][1]["quotaShareNames"].reverse()
    assert cac.plan(cac.parse(with_options(reordered)), live_of(cluster)).changes == []

    reweighted = copy.deepcopy(options)
    reweighted["fairShare"]["weights"][1]["weight"] = 5
    change, = cac.plan(cac.parse(with_options(reweighted)), live_of(cluster)).changes
    groups = "group dept (qs1, qs2, at most 2 ml.g5.xlarge), group solo (qs3)"
    assert change.fields == (("options", f"fair share (half-life 3600 s), {groups}; weights qs1=3, qs2=2",
                              f"fair share (half-life 3600 s), {groups}; weights qs1=3, qs2=5"),)


def test_options_left_out_of_the_file_are_turned_off():
    cluster = Cluster()
    assert run_in_core(cluster, cac.plan(cac.parse(with_options(OPTIONS)), live_of(cluster))) == []
    off = cac.plan(cac.parse(with_options()), live_of(cluster))
    assert cac.render(off) == ["~ update job queue options q", f"      options: {SHOWN} -> all off"]
    assert off.commands == [SetJobQueueOptions(job_queue="q", options=JobQueueOptions())]
    assert run_in_core(cluster, off) == []
    assert live_of(cluster).queue_options == {}
    # Options of a job queue the file does not declare are left alone, like its shares.
    assert run_in_core(cluster, cac.plan(cac.parse(with_options(OPTIONS)), live_of(cluster))) == []
    only_environment = {"serviceEnvironments": with_options()["serviceEnvironments"]}
    assert cac.plan(cac.parse(only_environment), live_of(cluster)).changes == []


def test_live_options_lose_a_share_deleted_since_and_are_replaced():
    """A deleted share leaves its queue's options (its group, its weight): the live
    configuration reads without it, and the file's options replace them."""
    cluster = Cluster()
    assert run_in_core(cluster, cac.plan(cac.parse(with_options(OPTIONS)), live_of(cluster))) == []
    cluster.update_share("qs2", state="DISABLED")
    cluster.command("DeleteQuotaShare", jobQueue="q", quotaShareName="qs2")
    live = live_of(cluster)
    assert ("q", "qs2") not in live.shares
    assert live.queue_options["q"].share_groups[0].quota_share_names == ["qs1"]
    options = copy.deepcopy(OPTIONS)
    options["shareGroups"][0]["quotaShareNames"] = ["qs1", "qs3"]
    document = with_options(options)
    del document["quotaShares"][1]  # qs2
    plan = cac.plan(cac.parse(document), live)
    assert [(c.resource, c.name) for c in plan.changes] == [("job queue options", "q")]
    assert run_in_core(cluster, plan) == []
    assert cac.plan(cac.parse(document), live_of(cluster)).changes == []


# -- live: `quotasched config` against a real scheduler ---------------------------------------


@pytest.mark.nats
def test_plan_apply_again_and_off_against_a_live_scheduler(live, tmp_path):  # noqa: F811
    declared = write(tmp_path / "options.yaml", with_options(OPTIONS))
    dry = run(live, "config", "apply", str(declared), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"~ update job queue options q\n      options: all off -> {SHOWN}\n" in dry.stdout
    assert configuration_facts(live) == []

    applied = run(live, "config", "apply", str(declared))
    assert applied.returncode == 0, applied.stderr
    assert "applied: 6 to create, 1 to update, 0 to delete (7 commands)" in applied.stdout
    facts = [json.loads(line) for line in configuration_facts(live)]
    assert [fact["kind"] for fact in facts][3:] == [
        "QuotaShareCreated", "QuotaShareCreated", "QuotaShareCreated", "JobQueueOptionsSet"]
    assert facts[-1]["jobQueue"] == "q" and facts[-1]["optionsVersion"] == 1
    assert without_nulls(facts[-1]["options"]) == OPTIONS

    again = run(live, "config", "apply", str(declared))
    assert again.returncode == 0 and "no changes" in again.stdout, again.stderr
    assert len(configuration_facts(live)) == len(facts)  # nothing was published
    exported = yaml.safe_load(run(live, "config", "export").stdout)
    assert exported["jobQueues"][0]["options"] == OPTIONS

    off = run(live, "config", "apply", str(write(tmp_path / "off.yaml", with_options())))
    assert off.returncode == 0, off.stderr
    assert f"      options: {SHOWN} -> all off" in off.stdout
    last = json.loads(configuration_facts(live)[-1])
    assert last["kind"] == "JobQueueOptionsSet"
    assert without_nulls(last["options"]) == {"idleResourceAssignmentStrategy": "FIFO"}
    assert "options" not in yaml.safe_load(run(live, "config", "export").stdout)["jobQueues"][0]


@pytest.mark.nats
def test_invalid_options_publish_nothing(live, tmp_path):  # noqa: F811
    assert run(live, "config", "apply", str(EXAMPLE)).returncode == 0
    before = configuration_facts(live)
    unfair = write(tmp_path / "unfair.yaml", with_options({"idleResourceAssignmentStrategy": "FAIR_SHARE"}))
    refused = run(live, "config", "apply", str(unfair))
    assert refused.returncode == 2
    assert "jobQueues[0] (q).options: idleResourceAssignmentStrategy FAIR_SHARE needs fairShare " \
           "(halfLifeSeconds)" in refused.stderr
    assert "nothing was published" in refused.stderr
    stranger = copy.deepcopy(OPTIONS)
    stranger["shareGroups"][0]["quotaShareNames"].append("qs9")
    missing = run(live, "config", "apply", str(write(tmp_path / "missing.yaml", with_options(stranger))))
    assert missing.returncode == 2
    assert "jobQueues[0] (q).options.shareGroups[0].quotaShareNames[2]: names quota share qs9, " \
           "which the file does not declare in job queue q" in missing.stderr
    assert configuration_facts(live) == before
