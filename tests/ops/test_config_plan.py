"""Configuration as code, pure: parsing with field-path errors, the plan (diff) between a
declared and a live configuration, and the plan's commands run through the real decision
core (no NATS here; tests/ops/test_config_live.py runs the same against a live scheduler)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from quotasched.events.codec import encode
from quotasched.services.config import as_code as cac
from quotasched.services.scheduler import api
from tests.builders import Cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shares.yaml"
G5 = "ml.g5.xlarge"


def document() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def problems(doc) -> list[str]:
    with pytest.raises(cac.ConfigError) as raised:
        cac.parse(doc, "f.yaml")
    return raised.value.problems


def live_of(cluster: Cluster) -> cac.Configuration:
    """What `config apply` reads over NATS: the scheduler's own read answers."""
    state = cluster.state
    queues = api.answer(state, "describe-job-queues", {})
    shares = [share for queue in queues["jobQueues"] for share in api.answer(
        state, "list-quota-shares", {"jobQueue": queue["jobQueueName"]})["quotaShares"]]
    return cac.from_live(api.answer(state, "describe-service-environments", {}),
                         api.answer(state, "describe-scheduling-policies", {}), queues, shares)


def run(cluster: Cluster, plan: cac.Plan) -> list[str]:
    """Sends the plan's commands through the core; returns the refusals."""
    refused = []
    for command in plan.commands:
        for fact in cluster.send(encode(command)):
            if fact.kind == "CommandRejected":
                refused.append(fact.status_reason)
    return refused


# -- parsing ---------------------------------------------------------------------------------


def test_the_example_parses_with_the_contract_defaults():
    config = cac.load(EXAMPLE)
    assert list(config.environments) == ["se"] and list(config.policies) == ["sp"]
    assert list(config.shares) == [("q", "qs1"), ("q", "qs2"), ("q", "qs3")]
    queue = config.queues["q"]
    assert (queue.priority, queue.state.value, queue.kind) == (1, "ENABLED", "CreateJobQueue")
    assert config.shares[("q", "qs2")].resource_sharing_configuration.strategy.value == "LEND"


def test_problems_name_the_field_path_and_every_problem_is_listed():
    doc = document()
    share = doc["quotaShares"][1]
    share["capacityLimits"][0]["maxCapacity"] = "3"  # strict, as on the wire: no coercion
    share["quotaShareName"] = "bad name"
    doc["quotaShares"][2]["resourceSharingConfiguration"] = {"strategy": "RESERVE",
                                                             "borrowLimit": 10}
    doc["jobQueues"][0]["colour"] = "blue"
    doc["serviceEnvironments"][0]["tags"] = {"team": "a"}
    doc["extra"] = []
    found = problems(doc)
    assert "quotaShares[1] (q/bad name).capacityLimits[0].maxCapacity: Input should be a valid " \
           "integer" in found
    assert any(p.startswith("quotaShares[1] (q/bad name).quotaShareName: must be 1-128 "
                            "characters") for p in found)
    assert "quotaShares[2] (q/qs3).resourceSharingConfiguration: borrowLimit can only be " \
           "applied to the LEND_AND_BORROW strategy, not RESERVE" in found
    assert "jobQueues[0] (q).colour: is not a field of CreateJobQueue" in found
    assert any(p.startswith("serviceEnvironments[0] (se).tags: are not recorded") for p in found)
    assert any(p.startswith("unknown section 'extra'") for p in found)
    assert len(found) == 6


def test_missing_fields_duplicates_and_shapes_are_refused():
    doc = document()
    doc["quotaShares"].append(copy.deepcopy(doc["quotaShares"][0]))
    del doc["schedulingPolicies"][0]["quotaSharePolicy"]
    assert problems(doc) == [
        "schedulingPolicies[0] (sp).quotaSharePolicy: is required",
        "quotaShares[3] (q/qs1): quota share q/qs1 is declared twice (first at "
        "quotaShares[0] (q/qs1))",
    ]
    assert problems(["a"]) == ["the file must be a mapping with the sections "
                               "serviceEnvironments, schedulingPolicies, jobQueues, quotaShares"]
    assert problems({"jobQueues": {"q": 1}}) == ["jobQueues: must be a list of entries"]
    assert cac.parse(None).shares == {}


def test_load_reports_yaml_errors(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("quotaShares: [\n")
    with pytest.raises(cac.ConfigError, match="is not valid YAML"):
        cac.load(path)


# -- the plan --------------------------------------------------------------------------------


def test_from_nothing_everything_is_created_parents_first():
    plan = cac.plan(cac.load(EXAMPLE), cac.Configuration())
    assert [c.kind for c in plan.commands] == [
        "CreateServiceEnvironment", "CreateSchedulingPolicy", "CreateJobQueue",
        "CreateQuotaShare", "CreateQuotaShare", "CreateQuotaShare"]
    assert (plan.count("create"), plan.errors, plan.kept) == (6, [], [])
    assert "+ create quota share q/qs1" in cac.render(plan)


def test_an_identical_configuration_plans_nothing_and_export_round_trips():
    config = cac.load(EXAMPLE)
    assert cac.plan(config, config).commands == []
    exported = cac.parse(yaml.safe_load(cac.dump_yaml(config, "header")))
    assert cac.to_document(exported) == cac.to_document(config)
    assert cac.plan(exported, config).changes == []


def test_equivalent_spellings_are_no_change():
    doc = document()
    doc["quotaShares"][0]["resourceSharingConfiguration"] = {"strategy": "LEND_AND_BORROW",
                                                             "borrowLimit": -1}
    doc["serviceEnvironments"][0]["capacityLimits"] = [
        {"capacityUnit": "ml.p4d.24xlarge", "maxCapacity": 2}, {"capacityUnit": G5,
                                                                "maxCapacity": 3}]
    live = cac.parse(copy.deepcopy(doc))
    del doc["quotaShares"][0]["resourceSharingConfiguration"]["borrowLimit"]  # AWS's -1
    doc["serviceEnvironments"][0]["capacityLimits"].reverse()  # the order of limits
    assert cac.plan(cac.parse(doc), live).changes == []
    doc["quotaShares"][0]["resourceSharingConfiguration"]["borrowLimit"] = 100
    assert [c.kind for c in cac.plan(cac.parse(doc), live).commands] == ["UpdateQuotaShare"]


def test_updates_carry_only_the_changed_fields():
    live = cac.load(EXAMPLE)
    doc = document()
    doc["quotaShares"][0]["capacityLimits"][0]["maxCapacity"] = 2
    doc["quotaShares"][1]["state"] = "DISABLED"
    doc["jobQueues"][0]["priority"] = 7
    doc["serviceEnvironments"][0]["capacityLimits"][0]["maxCapacity"] = 4
    plan = cac.plan(cac.parse(doc), live)
    documents = [c.model_dump(mode="json", by_alias=True, exclude_none=True)
                 for c in plan.commands]
    assert documents == [
        {"kind": "UpdateServiceEnvironment", "serviceEnvironment": "se",
         "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 4}]},
        {"kind": "UpdateJobQueue", "jobQueue": "q", "priority": 7},
        {"kind": "UpdateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
         "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 2}]},
        {"kind": "UpdateQuotaShare", "jobQueue": "q", "quotaShareName": "qs2",
         "state": "DISABLED"},
    ]
    lines = cac.render(plan)
    assert "      capacityLimits: 1 ml.g5.xlarge -> 2 ml.g5.xlarge" in lines
    assert "      state: ENABLED -> DISABLED" in lines


def test_undeclared_shares_of_declared_queues_are_deleted_disabled_first():
    live_doc = document()
    live_doc["quotaShares"][2]["state"] = "DISABLED"
    live = cac.parse(live_doc)
    doc = document()
    doc["quotaShares"] = [doc["quotaShares"][0]]
    plan = cac.plan(cac.parse(doc), live, {("q", "qs2"): 0, ("q", "qs3"): 0})
    assert [(c.kind, c.quota_share_name, getattr(c, "state", None)) for c in plan.commands] == [
        ("UpdateQuotaShare", "qs2", cac.State.DISABLED), ("DeleteQuotaShare", "qs2", None),
        ("DeleteQuotaShare", "qs3", None)]
    assert cac.doomed_shares(cac.parse(doc), live) == [("q", "qs2"), ("q", "qs3")]


def test_deleting_a_share_with_unfinished_jobs_needs_permission():
    doc = document()
    doc["quotaShares"].pop()
    desired, live = cac.parse(doc), cac.load(EXAMPLE)
    refused = cac.plan(desired, live, {("q", "qs3"): 2})
    assert refused.errors == ["quota share q/qs3 is live but not declared: deleting it would "
                              "terminate its 2 unfinished jobs; declare it, or allow that with "
                              "--terminate-jobs"]
    allowed = cac.plan(desired, live, {("q", "qs3"): 2}, allow_termination=True)
    assert allowed.errors == []
    assert "- delete quota share q/qs3  (DISABLED first; terminates its 2 unfinished jobs)" \
           in cac.render(allowed)


def test_what_the_file_does_not_declare_and_cannot_delete_is_kept():
    live = cac.load(EXAMPLE)
    doc = document()
    doc["jobQueues"] = []  # the queue is no longer declared: its shares are left alone
    doc["quotaShares"] = []
    del doc["serviceEnvironments"][0]
    plan = cac.plan(cac.parse(doc), live)
    assert plan.commands == [] and plan.errors == []
    assert [kept.split(":")[0] for kept in plan.kept] == ["job queue q", "service environment se"]


def test_changes_the_contract_cannot_make_are_errors():
    live = cac.load(EXAMPLE)
    doc = document()
    doc["schedulingPolicies"].append({"name": "sp2", "quotaSharePolicy": {
        "idleResourceAssignmentStrategy": "FIFO"}})
    doc["jobQueues"][0]["schedulingPolicy"] = "sp2"
    doc["jobQueues"].append({"jobQueueName": "q2", "schedulingPolicy": "nope",
                             "serviceEnvironmentOrder": [{"order": 1,
                                                          "serviceEnvironment": "ghost"}]})
    doc["quotaShares"][0]["jobQueue"] = "q9"
    plan = cac.plan(cac.parse(doc), live)
    assert plan.errors == [
        "job queue q2: serviceEnvironmentOrder names service environment ghost, which is "
        "neither declared nor live",
        "job queue q2: schedulingPolicy names scheduling policy nope, which is neither "
        "declared nor live",
        "quota share q9/qs1: jobQueue names job queue q9, which is neither declared nor live",
        "job queue q: schedulingPolicy sp cannot be changed to sp2 (the contract's "
        "UpdateJobQueue changes only state, priority and jobStateTimeLimitActions; declare a "
        "new job queue instead)",
    ]


# -- the plan through the real decision core -------------------------------------------------


def test_plans_run_through_the_core_reach_the_declared_state_and_then_plan_nothing():
    cluster = Cluster()
    desired = cac.load(EXAMPLE)
    assert run(cluster, cac.plan(desired, live_of(cluster))) == []
    assert cac.to_document(live_of(cluster)) == cac.to_document(desired)
    assert cac.plan(desired, live_of(cluster)).changes == []

    cluster.command("SubmitServiceJob", jobName="j", jobQueue="q", quotaShareName="qs3",
                    capacityUsage=[{"capacityUnit": G5, "quantity": 1}], jobId="j")
    doc = document()
    doc["quotaShares"][0]["capacityLimits"][0]["maxCapacity"] = 2
    doc["quotaShares"][0]["resourceSharingConfiguration"] = {"strategy": "LEND"}
    doc["quotaShares"].pop()
    doc["jobQueues"][0]["jobStateTimeLimitActions"] = []
    doc["serviceEnvironments"][0]["state"] = "DISABLED"
    changed = cac.parse(doc)
    plan = cac.plan(changed, live_of(cluster), {("q", "qs3"): 1}, allow_termination=True)
    assert run(cluster, plan) == []
    assert cac.to_document(live_of(cluster)) == cac.to_document(changed)
    assert cluster.state.jobs["j"].status.value == "FAILED"  # terminated with its share
    assert cac.plan(changed, live_of(cluster)).changes == []
