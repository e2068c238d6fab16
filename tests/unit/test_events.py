"""The message contract (contract.md sections 1-3): strict validation, decoding and round trips.

Every limit of the spec's resource model (aws-quota-management.md section 1 and scenario A16)
is checked at the edge, in `events`, so a command that decodes is well formed.  Each rejection
is a `DecodeError` whose message names the problem, AWS ClientException style.
"""

from __future__ import annotations

import base64
import copy
import json
import typing
from typing import Any

import pytest

from quotasched.events import commands as C
from quotasched.events import facts as F
from quotasched.events import values as V
from quotasched.events.codec import DecodeError, command_schema, decode_command, decode_fact, encode, fact_schema

G5 = "ml.g5.xlarge"
P4 = "ml.p4d.24xlarge"
QUEUE_ARN = "arn:aws:batch:us-east-1:123456789012:job-queue/q"
POLICY_ARN = "arn:aws:batch:us-east-1:123456789012:scheduling-policy/sp"
JOB_ARN = "arn:aws:batch:us-east-1:123456789012:job/j1"

# -- minimal valid commands, one per kind -----------------------------------------------------

LIMIT = {"capacityUnit": G5, "maxCapacity": 3}
USAGE = {"capacityUnit": G5, "quantity": 1}
TIME_LIMIT = {
    "state": "RUNNABLE",
    "action": "TERMINATE",
    "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
    "maxTimeSeconds": 600,
}

VALID: dict[str, dict[str, Any]] = {
    "CreateServiceEnvironment": {
        "at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
        "capacityLimits": [LIMIT],
    },
    "UpdateServiceEnvironment": {
        "at": 0, "kind": "UpdateServiceEnvironment", "serviceEnvironment": "se",
        "capacityLimits": [LIMIT],
    },
    "CreateSchedulingPolicy": {
        "at": 0, "kind": "CreateSchedulingPolicy", "name": "sp",
        "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"},
    },
    "CreateJobQueue": {
        "at": 0, "kind": "CreateJobQueue", "jobQueueName": "q",
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}],
        "schedulingPolicy": "sp", "jobStateTimeLimitActions": [TIME_LIMIT],
    },
    "UpdateJobQueue": {
        "at": 0, "kind": "UpdateJobQueue", "jobQueue": "q", "jobStateTimeLimitActions": [TIME_LIMIT],
    },
    "CreateQuotaShare": {
        "at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
        "capacityLimits": [LIMIT],
        "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
        "preemptionConfiguration": {"inSharePreemption": "ENABLED"},
    },
    "UpdateQuotaShare": {
        "at": 0, "kind": "UpdateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
        "capacityLimits": [LIMIT],
        "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
    },
    "DeleteQuotaShare": {
        "at": 0, "kind": "DeleteQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
    },
    "SetQuotaShareOptions": {
        "at": 0, "kind": "SetQuotaShareOptions", "jobQueue": "q", "quotaShareName": "qs1",
        "options": {},
    },
    "SetJobQueueOptions": {"at": 0, "kind": "SetJobQueueOptions", "jobQueue": "q", "options": {}},
    "SubmitServiceJob": {
        "at": 1, "kind": "SubmitServiceJob", "jobName": "train", "jobQueue": "q",
        "quotaShareName": "qs1", "capacityUsage": [USAGE],
    },
    "UpdateServiceJob": {
        "at": 1, "kind": "UpdateServiceJob", "jobId": "j1", "schedulingPriority": 5,
    },
    "TerminateServiceJob": {
        "at": 1, "kind": "TerminateServiceJob", "jobId": "j1", "reason": "no longer needed",
    },
    "ReportJobStatus": {
        "at": 1, "kind": "ReportJobStatus", "jobId": "j1", "status": "RUNNING",
    },
    "Tick": {"at": 5, "kind": "Tick"},
}  # fmt: skip

REQUIRED: dict[str, list[str]] = {
    "CreateServiceEnvironment": ["serviceEnvironmentName", "capacityLimits"],
    "UpdateServiceEnvironment": ["serviceEnvironment"],
    "CreateSchedulingPolicy": ["name", "quotaSharePolicy"],
    "CreateJobQueue": ["jobQueueName", "serviceEnvironmentOrder", "schedulingPolicy"],
    "UpdateJobQueue": ["jobQueue"],
    "CreateQuotaShare": [
        "quotaShareName", "jobQueue", "capacityLimits", "resourceSharingConfiguration",
        "preemptionConfiguration",
    ],
    "UpdateQuotaShare": ["jobQueue", "quotaShareName"],
    "DeleteQuotaShare": ["jobQueue", "quotaShareName"],
    "SetQuotaShareOptions": ["jobQueue", "quotaShareName", "options"],
    "SetJobQueueOptions": ["jobQueue", "options"],
    "SubmitServiceJob": ["jobName", "jobQueue", "quotaShareName"],
    "UpdateServiceJob": ["jobId", "schedulingPriority"],
    "TerminateServiceJob": ["jobId", "reason"],
    "ReportJobStatus": ["jobId", "status"],
    "Tick": [],
}  # fmt: skip


def command(kind: str, *changes: tuple[tuple, Any], drop: tuple = ()) -> dict[str, Any]:
    """A copy of the valid `kind` command with nested fields set (path, value) or dropped."""
    message = copy.deepcopy(VALID[kind])
    for path, value in changes:
        target = message
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    for key in drop:
        message.pop(key, None)
    return message


def accept(message: dict[str, Any] | str) -> C.Command:
    text = message if isinstance(message, str) else json.dumps(message)
    return decode_command(text)


def reject(message: dict[str, Any] | str | bytes) -> DecodeError:
    text = message if isinstance(message, (str, bytes)) else json.dumps(message)
    with pytest.raises(DecodeError) as caught:
        decode_command(text)
    return caught.value


def cases(*items: tuple) -> list[tuple]:
    """pytest.param for each (sentence, *values): ids are sentences."""
    return [pytest.param(*values, id=ident) for ident, *values in items]


def across(places: list[tuple], *items: tuple) -> list:
    """Every (sentence, *values) at every (place, *place_values); ids read 'sentence (place)'."""
    return [pytest.param(*place_values, *values, id=f"{sentence} ({place})")
            for place, *place_values in places for sentence, *values in items]  # fmt: skip


def kinds(*names: str) -> list[tuple]:
    return [(f"{name}", name) for name in names]


# -- every valid command decodes ---------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(VALID), ids=lambda kind: f"a minimal valid {kind} decodes")
def test_minimal_command_decodes(kind):
    decoded = accept(VALID[kind])
    assert decoded.kind == kind
    assert type(decoded).__name__ == kind


def test_the_examples_cover_every_command_kind():
    assert set(VALID) == set(C.COMMAND_KINDS) == set(REQUIRED)


@pytest.mark.parametrize(
    "kind,field",
    [pytest.param(kind, field, id=f"{kind} without {field} is rejected naming {field}")
     for kind, fields in REQUIRED.items() for field in fields],
)  # fmt: skip
def test_missing_required_field_is_rejected(kind, field):
    error = reject(command(kind, drop=(field,)))
    assert field in error.reason
    assert error.kind == kind


# -- names: 1-128 characters of [A-Za-z0-9_-] ------------------------------------------------

NAME_FIELDS = [
    (f"{kind}.{'.'.join(str(part) for part in path)}", kind, path)
    for kind, path in [
        ("CreateServiceEnvironment", ("serviceEnvironmentName",)),
        ("UpdateServiceEnvironment", ("serviceEnvironment",)),
        ("CreateSchedulingPolicy", ("name",)),
        ("CreateJobQueue", ("jobQueueName",)),
        ("CreateJobQueue", ("schedulingPolicy",)),
        ("CreateJobQueue", ("serviceEnvironmentOrder", 0, "serviceEnvironment")),
        ("UpdateJobQueue", ("jobQueue",)),
        ("CreateQuotaShare", ("quotaShareName",)),
        ("CreateQuotaShare", ("jobQueue",)),
        ("UpdateQuotaShare", ("quotaShareName",)),
        ("UpdateQuotaShare", ("jobQueue",)),
        ("DeleteQuotaShare", ("quotaShareName",)),
        ("DeleteQuotaShare", ("jobQueue",)),
        ("SetJobQueueOptions", ("jobQueue",)),
        ("SubmitServiceJob", ("jobName",)),
        ("SubmitServiceJob", ("jobQueue",)),
        ("SubmitServiceJob", ("quotaShareName",)),
    ]
]


@pytest.mark.parametrize(
    "kind,path,name",
    across(NAME_FIELDS,
           ("a one-character name is accepted", "a"),
           ("a 128-character name is accepted", "n" * 128),
           ("a name of letters digits hyphens and underscores is accepted", "Team-A_share-01")),
)  # fmt: skip
def test_valid_names_are_accepted(kind, path, name):
    decoded = accept(command(kind, (path, name)))
    value = decoded
    for part in path:
        value = value[part] if isinstance(part, int) else getattr(value, _snake(part))
    assert value == name


@pytest.mark.parametrize(
    "kind,path,name",
    across(NAME_FIELDS,
           ("an empty name is rejected", ""),
           ("a 129-character name is rejected", "n" * 129),
           ("a name containing a dot is rejected", "team.a"),
           ("a name containing a space is rejected", "team a"),
           ("a name containing a slash is rejected", "team/a"),
           ("a name containing a non-ASCII letter is rejected", "équipe")),
)  # fmt: skip
def test_invalid_names_are_rejected_naming_the_field(kind, path, name):
    error = reject(command(kind, (path, name)))
    assert path[-1] in error.reason
    assert error.kind == kind


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


# -- ARNs where AWS accepts them ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,field,arn,name",
    cases(
        ("a job queue ARN is accepted by CreateQuotaShare", "CreateQuotaShare", "jobQueue", QUEUE_ARN, "q"),
        ("a job queue ARN is accepted by UpdateQuotaShare", "UpdateQuotaShare", "jobQueue", QUEUE_ARN, "q"),
        ("a job queue ARN is accepted by DeleteQuotaShare", "DeleteQuotaShare", "jobQueue", QUEUE_ARN, "q"),
        ("a job queue ARN is accepted by SubmitServiceJob", "SubmitServiceJob", "jobQueue", QUEUE_ARN, "q"),
        ("a job queue ARN is accepted by UpdateJobQueue", "UpdateJobQueue", "jobQueue", QUEUE_ARN, "q"),
        ("a GovCloud job queue ARN is accepted", "SubmitServiceJob", "jobQueue",
         "arn:aws-us-gov:batch:us-gov-west-1:123456789012:job-queue/q", "q"),
        ("a scheduling policy ARN is accepted by CreateJobQueue", "CreateJobQueue",
         "schedulingPolicy", POLICY_ARN, "sp"),
        ("a job ARN is accepted by UpdateServiceJob", "UpdateServiceJob", "jobId", JOB_ARN, "j1"),
        ("a job ARN is accepted by TerminateServiceJob", "TerminateServiceJob", "jobId", JOB_ARN, "j1"),
        ("a job ARN is accepted by ReportJobStatus", "ReportJobStatus", "jobId", JOB_ARN, "j1"),
    ),
)  # fmt: skip
def test_arn_is_accepted_and_reduced_to_the_name(kind, field, arn, name):
    decoded = accept(command(kind, ((field,), arn)))
    assert getattr(decoded, _snake(field)) == name


def test_an_arn_whose_resource_name_is_invalid_is_rejected():
    error = reject(command("SubmitServiceJob", (("jobQueue",), QUEUE_ARN[:-1] + "bad.queue")))
    assert "jobQueue" in error.reason


# -- capacity limits and usage -----------------------------------------------------------------

LIMIT_LISTS = [
    (f"{kind}.{field}", kind, field, amount)
    for kind, field, amount in [
        ("CreateServiceEnvironment", "capacityLimits", "maxCapacity"),
        ("UpdateServiceEnvironment", "capacityLimits", "maxCapacity"),
        ("CreateQuotaShare", "capacityLimits", "maxCapacity"),
        ("UpdateQuotaShare", "capacityLimits", "maxCapacity"),
        ("SubmitServiceJob", "capacityUsage", "quantity"),
    ]
]


def _entries(count: int, amount_field: str) -> list[dict[str, Any]]:
    return [{"capacityUnit": f"ml.m5.{i}xlarge", amount_field: 1} for i in range(1, count + 1)]


@pytest.mark.parametrize(
    "kind,field,amount,count",
    across(LIMIT_LISTS, ("one entry is accepted", 1), ("five entries are accepted", 5)),
)
def test_one_to_five_capacity_entries_are_accepted(kind, field, amount, count):
    decoded = accept(command(kind, ((field,), _entries(count, amount))))
    assert len(getattr(decoded, _snake(field))) == count


@pytest.mark.parametrize(
    "kind,field,amount,count",
    across(LIMIT_LISTS, ("zero entries are rejected", 0), ("six entries are rejected", 6)),
)
def test_zero_or_six_capacity_entries_are_rejected(kind, field, amount, count):
    error = reject(command(kind, ((field,), _entries(count, amount))))
    assert field in error.reason


@pytest.mark.parametrize(
    "kind,field,amount",
    [pytest.param(*values, id=f"a capacity unit listed twice is rejected ({place})")
     for place, *values in LIMIT_LISTS],
)  # fmt: skip
def test_a_capacity_unit_listed_twice_is_rejected(kind, field, amount):
    entries = [{"capacityUnit": G5, amount: 1}, {"capacityUnit": G5, amount: 2}]
    error = reject(command(kind, ((field,), entries)))
    assert field in error.reason
    assert G5 in error.reason


@pytest.mark.parametrize(
    "kind,value",
    across(kinds("CreateQuotaShare", "UpdateQuotaShare"),
           ("a share maxCapacity of 0 is rejected", 0),
           ("a negative share maxCapacity is rejected", -1)),
)  # fmt: skip
def test_share_max_capacity_below_one_is_rejected(kind, value):
    error = reject(command(kind, (("capacityLimits", 0, "maxCapacity"), value)))
    assert "maxCapacity" in error.reason


@pytest.mark.parametrize(
    "kind", across(kinds("CreateQuotaShare", "UpdateQuotaShare"), ("a share maxCapacity of 1 is accepted",))
)
def test_share_max_capacity_of_one_is_accepted(kind):
    decoded = accept(command(kind, (("capacityLimits", 0, "maxCapacity"), 1)))
    assert decoded.capacity_limits[0].max_capacity == 1


@pytest.mark.parametrize(
    "kind",
    across(kinds("CreateServiceEnvironment", "UpdateServiceEnvironment"),
           ("a negative service environment maxCapacity is rejected",)),
)  # fmt: skip
def test_a_negative_service_environment_max_capacity_is_rejected(kind):
    error = reject(command(kind, (("capacityLimits", 0, "maxCapacity"), -1)))
    assert "maxCapacity" in error.reason


@pytest.mark.parametrize(
    "value", cases(("a job quantity of 0 is rejected", 0), ("a negative job quantity is rejected", -2))
)
def test_job_quantity_below_one_is_rejected(value):
    error = reject(command("SubmitServiceJob", (("capacityUsage", 0, "quantity"), value)))
    assert "quantity" in error.reason


@pytest.mark.parametrize(
    "value", cases(("an empty capacity unit is rejected", ""),
                   ("a 129-character capacity unit is rejected", "u" * 129)),
)  # fmt: skip
def test_capacity_unit_length_is_checked(value):
    error = reject(command("CreateQuotaShare", (("capacityLimits", 0, "capacityUnit"), value)))
    assert "capacityUnit" in error.reason


# -- priorities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,value",
    across(kinds("SubmitServiceJob", "UpdateServiceJob"),
           ("priority 0 is accepted", 0), ("priority 9999 is accepted", 9999)),
)  # fmt: skip
def test_scheduling_priority_bounds_are_accepted(kind, value):
    decoded = accept(command(kind, (("schedulingPriority",), value)))
    assert decoded.scheduling_priority == value


@pytest.mark.parametrize(
    "kind,value",
    across(kinds("SubmitServiceJob", "UpdateServiceJob"),
           ("priority -1 is rejected", -1), ("priority 10000 is rejected", 10000)),
)  # fmt: skip
def test_scheduling_priority_out_of_range_is_rejected(kind, value):
    error = reject(command(kind, (("schedulingPriority",), value)))
    assert "schedulingPriority" in error.reason


def test_scheduling_priority_defaults_to_zero():
    assert accept(VALID["SubmitServiceJob"]).scheduling_priority == 0


@pytest.mark.parametrize(
    "value", cases(("queue priority -1 is rejected", -1), ("queue priority 1001 is rejected", 1001))
)
def test_job_queue_priority_out_of_console_range_is_rejected(value):
    error = reject(command("CreateJobQueue", (("priority",), value)))
    assert "priority" in error.reason


# -- resource sharing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,value",
    across(kinds("CreateQuotaShare", "UpdateQuotaShare"),
           ("borrowLimit -1 (unlimited) is accepted", -1), ("borrowLimit 0 is accepted", 0),
           ("borrowLimit 200 is accepted", 200), ("borrowLimit 5000 is accepted", 5000)),
)  # fmt: skip
def test_borrow_limit_of_minus_one_or_more_is_accepted_with_lend_and_borrow(kind, value):
    decoded = accept(command(kind, (("resourceSharingConfiguration", "borrowLimit"), value)))
    assert decoded.resource_sharing_configuration.borrow_limit == value


@pytest.mark.parametrize(
    "kind", across(kinds("CreateQuotaShare", "UpdateQuotaShare"), ("borrowLimit -2 is rejected",))
)
def test_borrow_limit_below_minus_one_is_rejected(kind):
    error = reject(command(kind, (("resourceSharingConfiguration", "borrowLimit"), -2)))
    assert "borrowLimit" in error.reason


@pytest.mark.parametrize(
    "kind,strategy,value",
    across(kinds("CreateQuotaShare", "UpdateQuotaShare"),
           ("borrowLimit 100 with LEND is rejected", "LEND", 100),
           ("borrowLimit -1 with LEND is rejected", "LEND", -1),
           ("borrowLimit 100 with RESERVE is rejected", "RESERVE", 100)),
)  # fmt: skip
def test_borrow_limit_only_with_lend_and_borrow(kind, strategy, value):
    error = reject(command(kind, (("resourceSharingConfiguration",),
                                  {"strategy": strategy, "borrowLimit": value})))  # fmt: skip
    assert "borrowLimit" in error.reason
    assert "LEND_AND_BORROW" in error.reason


@pytest.mark.parametrize(
    "strategy", cases(*[(f"{name} without borrowLimit is accepted", name)
                        for name in ("RESERVE", "LEND", "LEND_AND_BORROW")])
)  # fmt: skip
def test_every_sharing_strategy_is_accepted_without_borrow_limit(strategy):
    decoded = accept(command("CreateQuotaShare", (("resourceSharingConfiguration",),
                                                  {"strategy": strategy})))  # fmt: skip
    assert decoded.resource_sharing_configuration.strategy.value == strategy


def test_an_unknown_sharing_strategy_is_rejected():
    error = reject(command("CreateQuotaShare",
                           (("resourceSharingConfiguration", "strategy"), "BORROW")))  # fmt: skip
    assert "strategy" in error.reason


def test_an_unknown_in_share_preemption_value_is_rejected():
    error = reject(command("CreateQuotaShare",
                           (("preemptionConfiguration", "inSharePreemption"), "ON")))  # fmt: skip
    assert "inSharePreemption" in error.reason


def test_only_fifo_idle_resource_assignment_is_accepted():
    error = reject(command("CreateSchedulingPolicy",
                           (("quotaSharePolicy", "idleResourceAssignmentStrategy"), "FAIR")))  # fmt: skip
    assert "idleResourceAssignmentStrategy" in error.reason


def test_fair_share_is_not_an_aws_scheduling_policy_value():
    """FAIR_SHARE is quotasched's extension, set by SetJobQueueOptions only: the AWS-shaped
    CreateSchedulingPolicy keeps AWS's FIFO-only value set."""
    error = reject(command("CreateSchedulingPolicy",
                           (("quotaSharePolicy", "idleResourceAssignmentStrategy"), "FAIR_SHARE")))  # fmt: skip
    assert "idleResourceAssignmentStrategy" in error.reason


# -- queue options beyond AWS (SetJobQueueOptions) ---------------------------------------------


def _fair(half_life: int = 100, weights: list | None = None) -> dict[str, Any]:
    """FAIR_SHARE options with `fairShare` as given."""
    fair: dict[str, Any] = {"halfLifeSeconds": half_life}
    if weights is not None:
        fair["weights"] = weights
    return {"idleResourceAssignmentStrategy": "FAIR_SHARE", "fairShare": fair}


def _groups(*groups: tuple[str, list[str]]) -> dict[str, Any]:
    return {"shareGroups": [{"name": name, "quotaShareNames": shares} for name, shares in groups]}


def _weights(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"quotaShareName": name, "weight": weight} for name, weight in pairs]


@pytest.mark.parametrize(
    "options",
    cases(("no option at all is AWS's FIFO without groups", {}),
          ("FIFO said explicitly is accepted", {"idleResourceAssignmentStrategy": "FIFO"}),
          ("the smallest half-life and weight are accepted", _fair(1, _weights(("a", 1)))),
          ("the largest half-life (30 days) and weight are accepted", _fair(2592000, _weights(("a", 1000)))),
          ("groups without a limit are accepted", _groups(("g", ["a", "b"]), ("h", ["c"]))),
          ("a group with a per-unit limit is accepted",
           {"shareGroups": [{"name": "g", "quotaShareNames": ["a"], "maxCapacity": [LIMIT]}]}),
          ("fair share and groups together are accepted", {**_fair(86400, _weights(("a", 2))),
                                                           **_groups(("g", ["a", "b"]))})),
)  # fmt: skip
def test_valid_queue_options_decode(options):
    decoded = accept(command("SetJobQueueOptions", (("options",), options)))
    assert decoded.options_version == V.QUEUE_OPTIONS_VERSION == 1
    assert decoded.options.model_dump(by_alias=True, exclude_none=True, mode="json") == {
        "idleResourceAssignmentStrategy": "FIFO", **options}


@pytest.mark.parametrize(
    "options,reason",
    cases(("FAIR_SHARE without fairShare is rejected", {"idleResourceAssignmentStrategy": "FAIR_SHARE"},
           "options: idleResourceAssignmentStrategy FAIR_SHARE needs fairShare (halfLifeSeconds)"),
          ("fairShare without FAIR_SHARE is rejected", {"fairShare": {"halfLifeSeconds": 100}},
           "options: fairShare is given but idleResourceAssignmentStrategy is not FAIR_SHARE"),
          ("fairShare with an explicit FIFO is rejected",
           {"idleResourceAssignmentStrategy": "FIFO", "fairShare": {"halfLifeSeconds": 100}},
           "options: fairShare is given but idleResourceAssignmentStrategy is not FAIR_SHARE"),
          ("a share in two groups is rejected", _groups(("g", ["a", "b"]), ("h", ["b"])),
           "options: quota share b is in group g and group h; a share belongs to at most one group"),
          ("a share twice in one group is rejected", _groups(("g", ["a", "b", "a"])),
           "options: group g names quota share a more than once"),
          ("a group name used twice is rejected", _groups(("g", ["a"]), ("g", ["b"])),
           "options: shareGroups names group g more than once"),
          ("a share weighted twice is rejected", _fair(100, _weights(("a", 1), ("b", 3), ("a", 2))),
           "options.fairShare.weights: fairShare.weights names quota share a more than once"),
          ("a weight of 0 is rejected", _fair(100, _weights(("a", 0))),
           "options.fairShare.weights.0.weight: Input should be greater than or equal to 1"),
          ("a weight of 1001 is rejected", _fair(100, _weights(("a", 2), ("b", 1001))),
           "options.fairShare.weights.1.weight: Input should be less than or equal to 1000"),
          ("a half-life of 0 is rejected", _fair(0),
           "options.fairShare.halfLifeSeconds: Input should be greater than or equal to 1"),
          ("a half-life over 30 days is rejected", _fair(2592001),
           "options.fairShare.halfLifeSeconds: Input should be less than or equal to 2592000"),
          ("an empty list of groups is rejected", {"shareGroups": []},
           "options.shareGroups: List should have at least 1 item after validation, not 0"),
          ("a group without shares is rejected", _groups(("g", [])),
           "options.shareGroups.0.quotaShareNames: List should have at least 1 item after validation, not 0"),
          ("an unknown strategy is rejected", {"idleResourceAssignmentStrategy": "ROUND_ROBIN"},
           "options.idleResourceAssignmentStrategy: Input should be 'FIFO' or 'FAIR_SHARE'")),
)  # fmt: skip
def test_invalid_queue_options_are_rejected_with_the_reason(options, reason):
    error = reject(command("SetJobQueueOptions", (("options",), options)))
    assert error.kind == "SetJobQueueOptions"
    assert error.reason == f"Invalid SetJobQueueOptions: {reason}"


def test_a_group_limit_names_each_unit_once():
    twice = {"shareGroups": [{"name": "g", "quotaShareNames": ["a"], "maxCapacity": [LIMIT, LIMIT]}]}
    error = reject(command("SetJobQueueOptions", (("options",), twice)))
    assert "maxCapacity" in error.reason and G5 in error.reason


def test_only_options_version_1_is_accepted():
    error = reject(command("SetJobQueueOptions", (("optionsVersion",), 2)))
    assert "optionsVersion" in error.reason


# -- retries, preemption retries, timeouts ------------------------------------------------------


@pytest.mark.parametrize(
    "attempts", cases(("1 attempt is accepted", 1), ("10 attempts are accepted", 10))
)
def test_retry_attempts_in_range_are_accepted(attempts):
    decoded = accept(command("SubmitServiceJob", (("retryStrategy",), {"attempts": attempts})))
    assert decoded.retry_strategy.attempts == attempts


@pytest.mark.parametrize(
    "attempts", cases(("0 attempts are rejected", 0), ("11 attempts are rejected", 11))
)
def test_retry_attempts_out_of_range_are_rejected(attempts):
    error = reject(command("SubmitServiceJob", (("retryStrategy",), {"attempts": attempts})))
    assert "attempts" in error.reason


def test_more_than_five_evaluate_on_exit_rules_are_rejected():
    rules = [{"action": "RETRY", "onStatusReason": f"reason-{i}*"} for i in range(6)]
    error = reject(command("SubmitServiceJob",
                           (("retryStrategy",), {"attempts": 2, "evaluateOnExit": rules})))  # fmt: skip
    assert "evaluateOnExit" in error.reason


def test_an_on_status_reason_longer_than_512_characters_is_rejected():
    rules = [{"action": "EXIT", "onStatusReason": "x" * 513}]
    error = reject(command("SubmitServiceJob",
                           (("retryStrategy",), {"attempts": 2, "evaluateOnExit": rules})))  # fmt: skip
    assert "onStatusReason" in error.reason


@pytest.mark.parametrize(
    "retries",
    cases(("0 preemption retries (fail on first preemption) are accepted", 0),
          ("5 preemption retries are accepted", 5)),
)  # fmt: skip
def test_preemption_retries_of_zero_or_more_are_accepted(retries):
    decoded = accept(command("SubmitServiceJob", (("preemptionConfiguration",),
                                                  {"preemptionRetriesBeforeTermination": retries})))  # fmt: skip
    assert decoded.preemption_configuration.preemption_retries_before_termination == retries


def test_negative_preemption_retries_are_rejected():
    error = reject(command("SubmitServiceJob", (("preemptionConfiguration",),
                                                {"preemptionRetriesBeforeTermination": -1})))  # fmt: skip
    assert "preemptionRetriesBeforeTermination" in error.reason


def test_unset_preemption_retries_mean_unlimited_requeueing():
    assert accept(VALID["SubmitServiceJob"]).preemption_configuration is None


@pytest.mark.parametrize(
    "seconds", cases(("an attempt duration of 0 seconds is rejected", 0),
                     ("a negative attempt duration is rejected", -60)),
)  # fmt: skip
def test_attempt_duration_must_be_positive(seconds):
    error = reject(command("SubmitServiceJob",
                           (("timeoutConfig",), {"attemptDurationSeconds": seconds})))  # fmt: skip
    assert "attemptDurationSeconds" in error.reason


# -- job state time limits ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,seconds",
    across(kinds("CreateJobQueue", "UpdateJobQueue"),
           ("maxTimeSeconds 600 is accepted", 600), ("maxTimeSeconds 86400 is accepted", 86400)),
)  # fmt: skip
def test_time_limit_bounds_are_accepted(kind, seconds):
    decoded = accept(command(kind, (("jobStateTimeLimitActions", 0, "maxTimeSeconds"), seconds)))
    assert decoded.job_state_time_limit_actions[0].max_time_seconds == seconds


@pytest.mark.parametrize(
    "kind,seconds",
    across(kinds("CreateJobQueue", "UpdateJobQueue"),
           ("maxTimeSeconds 599 is rejected", 599), ("maxTimeSeconds 86401 is rejected", 86401)),
)  # fmt: skip
def test_time_limit_out_of_range_is_rejected(kind, seconds):
    error = reject(command(kind, (("jobStateTimeLimitActions", 0, "maxTimeSeconds"), seconds)))
    assert "maxTimeSeconds" in error.reason


@pytest.mark.parametrize(
    "kind,reason",
    across(kinds("CreateJobQueue", "UpdateJobQueue"),
          ("the insufficient-capacity reason is accepted", "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"),
          ("the service-environment-max-resource reason is accepted",
           "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE"),
          ("the quota-management-limit-exceeded reason is accepted",
           "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED")),
)  # fmt: skip
def test_every_documented_time_limit_reason_is_accepted(kind, reason):
    decoded = accept(command(kind, (("jobStateTimeLimitActions", 0, "reason"), reason)))
    assert decoded.job_state_time_limit_actions[0].reason.value == reason


@pytest.mark.parametrize(
    "kind,field,value",
    across(kinds("CreateJobQueue", "UpdateJobQueue"),
          ("a RUNNING state is rejected (only RUNNABLE exists)", "state", "RUNNING"),
          ("a STARTING state is rejected", "state", "STARTING"),
          ("a CANCEL action is rejected (only TERMINATE exists)", "action", "CANCEL"),
          ("a RETRY action is rejected", "action", "RETRY"),
          ("an undocumented reason is rejected", "reason", "CAPACITY:SOMETHING_ELSE"),
          ("a reason without its category is rejected", "reason", "INSUFFICIENT_INSTANCE_CAPACITY")),
)  # fmt: skip
def test_time_limit_enums_are_strict(kind, field, value):
    error = reject(command(kind, (("jobStateTimeLimitActions", 0, field), value)))
    assert field in error.reason


# -- client token ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token", cases(("a 1-character clientToken is accepted", "t"),
                   ("a 64-character clientToken is accepted", "t" * 64)),
)  # fmt: skip
def test_client_token_in_range_is_accepted(token):
    assert accept(command("SubmitServiceJob", (("clientToken",), token))).client_token == token


@pytest.mark.parametrize(
    "token", cases(("an empty clientToken is rejected", ""),
                   ("a 65-character clientToken is rejected", "t" * 65)),
)  # fmt: skip
def test_client_token_out_of_range_is_rejected(token):
    error = reject(command("SubmitServiceJob", (("clientToken",), token)))
    assert "clientToken" in error.reason


# -- serviceRequestPayload ---------------------------------------------------------------------


def _payload(**resource_config: Any) -> dict[str, Any]:
    return {
        "TrainingJobName": "train",
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/sm",
        "ResourceConfig": resource_config,
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _submit_payload(payload: Any) -> dict[str, Any]:
    return command("SubmitServiceJob", (("serviceRequestPayload",), payload), drop=("capacityUsage",))


PLAIN = _payload(InstanceType=P4, InstanceCount=2, VolumeSizeInGB=50)
GROUPS = _payload(InstanceGroups=[
    {"InstanceGroupName": "trainers", "InstanceType": P4, "InstanceCount": 4},
    {"InstanceGroupName": "loaders", "InstanceType": "ml.c5.4xlarge", "InstanceCount": 1},
], VolumeSizeInGB=50)  # fmt: skip


@pytest.mark.parametrize(
    "payload,need",
    cases(("a payload object gives the need of ResourceConfig", PLAIN, ((P4, 2),)),
          ("a payload string gives the need of ResourceConfig", json.dumps(PLAIN), ((P4, 2),)),
          ("a heterogeneous payload needs every instance group", GROUPS,
           ((P4, 4), ("ml.c5.4xlarge", 1))),
          ("a heterogeneous payload string needs every instance group", json.dumps(GROUPS),
           ((P4, 4), ("ml.c5.4xlarge", 1)))),
)  # fmt: skip
def test_service_request_payload_defines_the_need(payload, need):
    decoded = accept(_submit_payload(payload))
    assert decoded.need() == need
    assert decoded.service_request_payload == payload


def test_the_core_records_the_payload_need_as_capacity_usage():
    from quotasched.services.replay import replay_lines

    lines = [json.dumps(VALID[kind]) for kind in
             ("CreateServiceEnvironment", "CreateSchedulingPolicy", "CreateJobQueue", "CreateQuotaShare")]
    lines.append(json.dumps(_submit_payload(GROUPS)))
    submitted = [fact for fact in replay_lines(lines) if isinstance(fact, F.JobSubmitted)]
    assert [(u.capacity_unit, u.quantity) for u in submitted[0].capacity_usage] == [
        (P4, 4), ("ml.c5.4xlarge", 1)]  # fmt: skip


def _padded(size: int) -> dict[str, Any]:
    """PLAIN padded with a HyperParameters string so that its compact JSON is `size` bytes."""
    payload = dict(PLAIN, HyperParameters={"pad": ""})
    base = len(json.dumps(payload, separators=(",", ":")).encode())
    payload["HyperParameters"] = {"pad": "x" * (size - base)}
    assert len(json.dumps(payload, separators=(",", ":")).encode()) == size
    return payload


def test_a_payload_of_exactly_10_kib_is_accepted():
    assert accept(_submit_payload(_padded(10 * 1024))).need() == ((P4, 2),)


@pytest.mark.parametrize(
    "payload",
    cases(("a payload object over 10 KiB is rejected", _padded(10 * 1024 + 1)),
          ("a payload string over 10 KiB is rejected",
           json.dumps(_padded(10 * 1024 + 1), separators=(",", ":")))),
)  # fmt: skip
def test_a_payload_over_10_kib_is_rejected(payload):
    error = reject(_submit_payload(payload))
    assert "serviceRequestPayload" in error.reason
    assert "10 KiB" in error.reason


@pytest.mark.parametrize(
    "payload,words",
    cases(("a payload without ResourceConfig is rejected",
           {"TrainingJobName": "train"}, "ResourceConfig"),
          ("a payload string without ResourceConfig is rejected",
           json.dumps({"TrainingJobName": "train"}), "ResourceConfig"),
          ("a payload whose ResourceConfig is not an object is rejected",
           {"ResourceConfig": [P4, 2]}, "ResourceConfig"),
          ("a payload without InstanceType is rejected", _payload(InstanceCount=2), "InstanceType"),
          ("a payload with InstanceCount 0 is rejected", _payload(InstanceType=P4, InstanceCount=0),
           "InstanceCount"),
          ("a payload without InstanceCount is rejected", _payload(InstanceType=P4), "InstanceCount"),
          ("a payload with a string InstanceCount is rejected",
           _payload(InstanceType=P4, InstanceCount="2"), "InstanceCount"),
          ("a payload string that is not JSON is rejected", "{not json", "serviceRequestPayload"),
          ("a payload that is a number is rejected", 42, "serviceRequestPayload"),
          ("a payload that is a list is rejected", [PLAIN], "serviceRequestPayload")),
)  # fmt: skip
def test_a_payload_without_a_usable_resource_config_is_rejected(payload, words):
    error = reject(_submit_payload(payload))
    assert words in error.reason


@pytest.mark.parametrize(
    "changes,drop",
    cases(("both capacityUsage and serviceRequestPayload are rejected",
           [(("serviceRequestPayload",), PLAIN)], ()),
          ("neither capacityUsage nor serviceRequestPayload is rejected", [], ("capacityUsage",))),
)  # fmt: skip
def test_exactly_one_of_capacity_usage_or_payload(changes, drop):
    error = reject(command("SubmitServiceJob", *changes, drop=drop))
    assert "capacityUsage" in error.reason
    assert "serviceRequestPayload" in error.reason


def test_share_identifier_is_rejected_pointing_to_quota_share_name():
    error = reject(command("SubmitServiceJob", (("shareIdentifier",), "teamA")))
    assert "shareIdentifier" in error.reason
    assert "quotaShareName" in error.reason


# -- unknown fields and wrong JSON types --------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(VALID), ids=lambda kind: f"an unknown field of {kind} is rejected naming it")
def test_an_unknown_field_is_rejected_naming_it(kind):
    error = reject(command(kind, (("bogusField",), 1)))
    assert "bogusField" in error.reason
    assert error.kind == kind


@pytest.mark.parametrize(
    "kind,path,name",
    cases(("a misspelt jobName is rejected naming the misspelling", "SubmitServiceJob",
           ("jobname",), "jobname"),
          ("a snake_case field name is rejected naming it", "SubmitServiceJob",
           ("scheduling_priority",), "scheduling_priority"),
          ("an unknown field inside a capacity limit is rejected naming it", "CreateQuotaShare",
           ("capacityLimits", 0, "maxcapacity"), "maxcapacity"),
          ("an unknown field inside resourceSharingConfiguration is rejected naming it",
           "CreateQuotaShare", ("resourceSharingConfiguration", "borrowlimit"), "borrowlimit"),
          ("an unknown field inside retryStrategy is rejected naming it", "SubmitServiceJob",
           ("retryStrategy",), None)),
)  # fmt: skip
def test_misspelt_fields_are_rejected_naming_them(kind, path, name):
    if name is None:  # a whole nested object with a wrong key
        message, name = command(kind, (path, {"attempts": 2, "attemps": 3})), "attemps"
    else:
        message = command(kind, (path, 1))
    error = reject(message)
    assert name in error.reason


WRONG_TYPES = cases(
    ("a string priority is rejected", "SubmitServiceJob", ("schedulingPriority",), "3"),
    ("a fractional priority is rejected", "SubmitServiceJob", ("schedulingPriority",), 3.5),
    ("a boolean priority is rejected", "UpdateServiceJob", ("schedulingPriority",), True),
    ("a string maxCapacity is rejected", "CreateQuotaShare", ("capacityLimits", 0, "maxCapacity"), "3"),
    ("a fractional maxCapacity is rejected", "CreateQuotaShare", ("capacityLimits", 0, "maxCapacity"), 1.5),
    ("a boolean maxCapacity is rejected", "CreateServiceEnvironment", ("capacityLimits", 0, "maxCapacity"), True),
    ("a string quantity is rejected", "SubmitServiceJob", ("capacityUsage", 0, "quantity"), "1"),
    ("a fractional quantity is rejected", "SubmitServiceJob", ("capacityUsage", 0, "quantity"), 1.5),
    ("a boolean quantity is rejected", "SubmitServiceJob", ("capacityUsage", 0, "quantity"), True),
    ("a string borrowLimit is rejected", "CreateQuotaShare", ("resourceSharingConfiguration", "borrowLimit"), "200"),
    ("a fractional borrowLimit is rejected", "CreateQuotaShare", ("resourceSharingConfiguration", "borrowLimit"), 2.5),
    ("a boolean borrowLimit is rejected", "CreateQuotaShare", ("resourceSharingConfiguration", "borrowLimit"), True),
    ("a string attempts is rejected", "SubmitServiceJob", ("retryStrategy",), {"attempts": "2"}),
    ("a fractional attempts is rejected", "SubmitServiceJob", ("retryStrategy",), {"attempts": 2.5}),
    ("a boolean attempts is rejected", "SubmitServiceJob", ("retryStrategy",), {"attempts": True}),
    ("a string maxTimeSeconds is rejected", "CreateJobQueue", ("jobStateTimeLimitActions", 0, "maxTimeSeconds"), "600"),
    ("a fractional maxTimeSeconds is rejected", "CreateJobQueue", ("jobStateTimeLimitActions", 0, "maxTimeSeconds"), 600.5),
    ("a string attempt number is rejected", "ReportJobStatus", ("attempt",), "1"),
    ("a boolean attempt number is rejected", "ReportJobStatus", ("attempt",), True),
    ("a string at is rejected", "Tick", ("at",), "5"),
    ("a boolean at is rejected", "Tick", ("at",), True),
    ("a negative at is rejected", "Tick", ("at",), -1),
    ("a numeric jobName is rejected", "SubmitServiceJob", ("jobName",), 123),
    ("a numeric jobId is rejected", "TerminateServiceJob", ("jobId",), 7),
    ("a null required name is rejected", "CreateQuotaShare", ("quotaShareName",), None),
    ("capacityLimits given as an object is rejected", "CreateQuotaShare", ("capacityLimits",), {"items": LIMIT}),
    ("a lowercase enum value is rejected", "CreateQuotaShare", ("state",), "enabled"),
    ("an unknown reported status is rejected", "ReportJobStatus", ("status",), "PAUSED"),
    ("a RUNNABLE report is rejected (executors can't requeue)", "ReportJobStatus", ("status",), "RUNNABLE"),
)


@pytest.mark.parametrize("kind,path,value", WRONG_TYPES)
def test_wrong_json_types_are_rejected(kind, path, value):
    error = reject(command(kind, (path, value)))
    assert error.kind == kind
    named = [part for part in path if isinstance(part, str)]
    if path == ("retryStrategy",):  # the wrong value sits inside the nested object
        named += list(value)
    assert named[-1] in error.reason


def test_infinite_and_nan_times_are_rejected():
    for text in ('{"kind": "Tick", "at": NaN}', '{"kind": "Tick", "at": 1e400}'):
        assert "at" in reject(text).reason


def test_an_integer_at_is_accepted_as_seconds():
    assert accept(VALID["Tick"]).at == 5.0


# -- messages that are not commands at all ------------------------------------------------------


@pytest.mark.parametrize(
    "raw,kind",
    cases(("an unknown kind is named in the message", '{"at": 1, "kind": "LaunchRocket"}', "LaunchRocket"),
          ("a lowercase kind is an unknown kind", '{"at": 1, "kind": "tick"}', "tick")),
)  # fmt: skip
def test_unknown_kind_gives_a_decode_error_saying_so(raw, kind):
    error = reject(raw)
    assert "unknown command kind" in error.reason.lower()
    assert kind in error.reason
    assert error.kind == kind
    assert error.raw == raw


def test_unknown_kind_message_lists_the_known_kinds():
    error = reject('{"at": 1, "kind": "LaunchRocket"}')
    for kind in C.COMMAND_KINDS:
        assert kind in error.reason


def test_a_kind_that_is_not_a_string_gives_a_decode_error_about_the_kind():
    error = reject('{"at": 1, "kind": 5}')
    assert "kind" in error.reason.lower()


def test_missing_kind_gives_a_decode_error_saying_so():
    raw = '{"at": 1, "jobId": "j1", "schedulingPriority": 3}'
    error = reject(raw)
    assert "kind" in error.reason
    assert "no" in error.reason.lower() or "missing" in error.reason.lower()
    assert error.kind is None
    assert error.raw == raw


@pytest.mark.parametrize(
    "raw",
    cases(("a JSON array is not a command", "[1, 2]"), ("a JSON string is not a command", '"Tick"'),
          ("a JSON number is not a command", "42"), ("JSON null is not a command", "null"),
          ("JSON true is not a command", "true")),
)  # fmt: skip
def test_non_object_json_gives_a_decode_error_saying_so(raw):
    error = reject(raw)
    assert "object" in error.reason.lower()
    assert error.raw == raw


@pytest.mark.parametrize(
    "raw",
    cases(("a truncated object is invalid JSON", '{"at": 1, "kind": '),
          ("a Python dict literal is invalid JSON", "{'kind': 'Tick'}"),
          ("free text is invalid JSON", "submit my job please")),
)  # fmt: skip
def test_invalid_json_gives_a_decode_error_saying_so(raw):
    error = reject(raw)
    assert "invalid json" in error.reason.lower()
    assert error.raw == raw


@pytest.mark.parametrize("raw", cases(("an empty message says it is empty", ""),
                                      ("a blank message says it is empty", "   ")))
def test_an_empty_message_gives_a_decode_error_saying_so(raw):
    assert "empty" in reject(raw).reason.lower()


def test_non_utf8_bytes_give_a_decode_error_keeping_the_exact_bytes():
    data = b'\xff\xfe{"kind": "Tick"}'
    error = reject(data)
    assert "json" in error.reason.lower()
    assert error.raw_encoding == "base64"
    assert base64.b64decode(error.raw) == data


def test_decode_error_names_every_problem_found():
    error = reject(command("SubmitServiceJob", (("schedulingPriority",), 10000), (("jobName",), "a.b")))
    assert "schedulingPriority" in error.reason and "jobName" in error.reason


@pytest.mark.parametrize(
    "action", cases(("an EvaluateOnExit rule can be built in Python with RetryAction.EXIT", V.RetryAction.EXIT))
)
def test_an_evaluate_on_exit_rule_can_be_built_in_python(action):
    """Python code uses the snake_case models directly (contract section 1)."""
    rule = V.EvaluateOnExit(action=action, on_status_reason="Received status from SageMaker: *")
    assert rule.action is V.RetryAction.EXIT


def test_evaluate_on_exit_action_is_case_insensitive_on_the_wire():
    rules = [{"action": "exit", "onStatusReason": "*OutOfMemory*"}]
    decoded = accept(command("SubmitServiceJob", (("retryStrategy",), {"attempts": 2, "evaluateOnExit": rules})))
    assert decoded.retry_strategy.evaluate_on_exit[0].action is V.RetryAction.EXIT


# -- round trips --------------------------------------------------------------------------------

SUBMIT_FULL = C.SubmitServiceJob(
    at=3.5, job_name="train", job_queue="q", quota_share_name="qs1", job_id="j-1",
    service_request_payload=PLAIN, scheduling_priority=7,
    preemption_configuration=V.JobPreemptionConfiguration(preemption_retries_before_termination=2),
    # Built from JSON: EvaluateOnExit can't be built in Python (see the test below).
    retry_strategy=V.RetryStrategy.model_validate_json(json.dumps({"attempts": 3, "evaluateOnExit": [
        {"action": "EXIT", "onStatusReason": "Received status from SageMaker: *OOM*"}]})),
    timeout_config=V.TimeoutConfig(attempt_duration_seconds=7200), client_token="tok-1",
    tags={"team": "a"},
)  # fmt: skip

COMMAND_SAMPLES: list[C.Command] = [
    C.CreateServiceEnvironment(
        at=0, service_environment_name="se", state=V.State.DISABLED, tags={"env": "prod"},
        capacity_limits=[V.EnvironmentCapacityLimit(capacity_unit=G5, max_capacity=3),
                         V.EnvironmentCapacityLimit(capacity_unit=P4, max_capacity=0)],
    ),
    C.UpdateServiceEnvironment(
        at=1, service_environment="se", state=V.State.ENABLED,
        capacity_limits=[V.EnvironmentCapacityLimit(capacity_unit=G5, max_capacity=5)],
    ),
    C.CreateSchedulingPolicy(
        at=0, name="sp", tags={"a": "b"},
        quota_share_policy=V.QuotaSharePolicy(
            idle_resource_assignment_strategy=V.IdleResourceAssignmentStrategy.FIFO),
    ),
    C.CreateJobQueue(
        at=0, job_queue_name="q", scheduling_policy="sp", priority=10, state=V.State.ENABLED,
        service_environment_order=[V.ServiceEnvironmentOrder(order=1, service_environment="se")],
        job_state_time_limit_actions=[V.JobStateTimeLimitAction(
            reason=V.BlockedReason.CAPACITY_INSUFFICIENT, state=V.TimeLimitState.RUNNABLE,
            max_time_seconds=3600, action=V.TimeLimitAction.TERMINATE)],
        tags={"team": "ml"},
    ),
    C.UpdateJobQueue(at=2, job_queue="q", state=V.State.DISABLED, priority=5,
                     job_state_time_limit_actions=[]),
    C.CreateQuotaShare(
        at=0, quota_share_name="qs1", job_queue="q",
        capacity_limits=[V.CapacityLimit(capacity_unit=G5, max_capacity=2)],
        resource_sharing_configuration=V.ResourceSharingConfiguration(
            strategy=V.SharingStrategy.LEND_AND_BORROW, borrow_limit=150),
        preemption_configuration=V.SharePreemptionConfiguration(
            in_share_preemption=V.InSharePreemption.ENABLED),
        state=V.State.ENABLED, tags={"team": "a"},
    ),
    C.UpdateQuotaShare(
        at=4, job_queue="q", quota_share_name="qs1", state=V.State.DISABLED,
        capacity_limits=[V.CapacityLimit(capacity_unit=G5, max_capacity=1)],
        resource_sharing_configuration=V.ResourceSharingConfiguration(strategy=V.SharingStrategy.RESERVE),
        preemption_configuration=V.SharePreemptionConfiguration(
            in_share_preemption=V.InSharePreemption.DISABLED),
    ),
    C.DeleteQuotaShare(at=5, job_queue="q", quota_share_name="qs1"),
    C.SetQuotaShareOptions(at=5, job_queue="q", quota_share_name="qs1", options=V.QuotaShareOptions(
        min_runtime_before_preemption_seconds=600,
        preemption_budget=V.PreemptionBudget(max_preemptions=2, window_seconds=3600))),
    C.SetJobQueueOptions(at=5, job_queue="q", options=V.JobQueueOptions(
        idle_resource_assignment_strategy=V.IdleAssignment.FAIR_SHARE,
        fair_share=V.FairShare(half_life_seconds=86400,
                               weights=[V.FairShareWeight(quota_share_name="qs1", weight=2)]),
        share_groups=[V.ShareGroup(name="dept", quota_share_names=["qs1", "qs2"], max_capacity=[
            V.EnvironmentCapacityLimit(capacity_unit=G5, max_capacity=6)])])),
    SUBMIT_FULL,
    C.SubmitServiceJob(at=3, job_name="small", job_queue="q", quota_share_name="qs1",
                       capacity_usage=[V.CapacityUsage(capacity_unit=G5, quantity=2)]),
    C.UpdateServiceJob(at=6, job_id="j-1", scheduling_priority=9999),
    C.TerminateServiceJob(at=7, job_id="j-1", reason="cancelled by user"),
    C.ReportJobStatus(at=8, job_id="j-1", status=V.ReportedStatus.FAILED, attempt=2,
                      status_reason="Received status from SageMaker: AlgorithmError"),
    C.Tick(at=9),
    C.Tick(),
]  # fmt: skip

_USAGE = [V.CapacityUsage(capacity_unit=G5, quantity=2)]
_SHARE_CONFIG = dict(
    job_queue="q", quota_share_name="qs1",
    capacity_limits=[V.CapacityLimit(capacity_unit=G5, max_capacity=2)],
    resource_sharing_configuration=V.ResourceSharingConfiguration(
        strategy=V.SharingStrategy.LEND_AND_BORROW, borrow_limit=-1),
    preemption_configuration=V.SharePreemptionConfiguration(
        in_share_preemption=V.InSharePreemption.ENABLED),
    state=V.State.ENABLED,
)  # fmt: skip
_QUEUE_CONFIG = dict(
    job_queue="q", service_environment="se", scheduling_policy="sp", priority=1,
    state=V.State.ENABLED,
    job_state_time_limit_actions=[V.JobStateTimeLimitAction(
        reason=V.BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED, state=V.TimeLimitState.RUNNABLE,
        max_time_seconds=600, action=V.TimeLimitAction.TERMINATE)],
)  # fmt: skip

FACT_SAMPLES: list[F.Fact] = [
    F.CommandRejected(at=1, command_seq=1, command_kind="SubmitServiceJob",
                      status_reason="Quota share qs9 does not exist in job queue q",
                      job_id="j-1", job_queue="q", quota_share_name="qs9", raw='{"kind": "x"}'),
    F.ServiceEnvironmentCreated(at=0, command_seq=1, service_environment="se", state=V.State.ENABLED,
                                capacity_limits=[V.EnvironmentCapacityLimit(capacity_unit=G5, max_capacity=3)]),
    F.ServiceEnvironmentUpdated(at=9, command_seq=20, service_environment="se", state=V.State.DISABLED,
                                capacity_limits=[V.EnvironmentCapacityLimit(capacity_unit=G5, max_capacity=0)]),
    F.SchedulingPolicyCreated(at=0, command_seq=2, name="sp", quota_share_policy=V.QuotaSharePolicy(
        idle_resource_assignment_strategy=V.IdleResourceAssignmentStrategy.FIFO)),
    F.JobQueueCreated(at=0, command_seq=3, **_QUEUE_CONFIG),
    F.JobQueueUpdated(at=2, command_seq=9, **_QUEUE_CONFIG),
    F.QuotaShareCreated(at=0, command_seq=4, **_SHARE_CONFIG),
    F.QuotaShareUpdated(at=3, command_seq=10, **_SHARE_CONFIG),
    F.QuotaShareDeleted(at=4, command_seq=11, job_queue="q", quota_share_name="qs1"),
    F.JobSubmitted(
        at=1.25, command_seq=5, job_id="j-1", job_name="train", job_queue="q", quota_share_name="qs1",
        scheduling_priority=3, capacity_usage=_USAGE,
        preemption_configuration=SUBMIT_FULL.preemption_configuration,
        retry_strategy=SUBMIT_FULL.retry_strategy, timeout_config=SUBMIT_FULL.timeout_config,
        client_token="tok", tags={"team": "a"}, service_request_payload=json.dumps(PLAIN),
    ),
    F.SubmissionDeduplicated(at=2, command_seq=6, job_id="j-1", client_token="tok"),
    F.JobPriorityUpdated(at=2, command_seq=7, job_id="j-1", scheduling_priority=9),
    F.JobDispatched(at=2, command_seq=7, job_id="j-1", attempt=2, job_queue="q", quota_share_name="qs1",
                    capacity_usage=_USAGE, borrowed=[V.CapacityUsage(capacity_unit=G5, quantity=1)],
                    after_preemption_of=["j-0", "j-00"]),
    F.JobPreempted(at=2, command_seq=7, job_id="j-0", attempt=1, job_queue="q", quota_share_name="qs2",
                   preemptor_job_id="j-1", reason=V.PreemptionReason.CROSS_SHARE_RECLAIM,
                   outcome=V.PreemptionOutcome.FAILED, preempted_attempt_count=1),
    F.JobStatusChanged(at=3, command_seq=8, job_id="j-1", attempt=2, status=V.JobStatus.FAILED,
                       status_reason="cancelled", cause=V.StatusCause.TERMINATED, is_terminated=True),
    F.JobStatusChanged(at=3, command_seq=8, job_id="j-2", attempt=1, status=V.JobStatus.RUNNING,
                       status_reason=None, cause=V.StatusCause.REPORTED),
    F.ShareBlocked(at=4, command_seq=9, job_queue="q", quota_share_name="qs1", job_id="j-3",
                   reason=V.BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED,
                   status_reason="MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - Job requirements "
                                 "exceed quota share capacity limits."),
    F.JobReportIgnored(at=5, command_seq=10, job_id="j-1", attempt=1, status=V.ReportedStatus.RUNNING,
                       status_reason="attempt 1 is not running"),
    F.QuotaShareOptionsSet(at=4, command_seq=12, job_queue="q", quota_share_name="qs1",
                           options_version=1, options=V.QuotaShareOptions(
                               min_runtime_before_preemption_seconds=600)),
    F.JobQueueOptionsSet(at=4, command_seq=13, job_queue="q", options_version=1, options=V.JobQueueOptions(
        share_groups=[V.ShareGroup(name="dept", quota_share_names=["qs1"])])),
    F.JobExpired(at=604820, command_seq=14, job_id="j-1", job_queue="q", quota_share_name="qs1",
                 status=V.JobStatus.SUCCEEDED, status_reason=None, attempt=1,
                 preempted_attempt_count=0, scheduling_priority=3, ended_at=20),
]  # fmt: skip

FACT_KINDS = sorted(
    typing.get_args(member.model_fields["kind"].annotation)[0]
    for member in typing.get_args(typing.get_args(F.AnyFact)[0])
)


def test_the_samples_cover_every_command_and_fact_kind():
    assert {sample.kind for sample in COMMAND_SAMPLES} == set(C.COMMAND_KINDS)
    assert sorted({sample.kind for sample in FACT_SAMPLES}) == FACT_KINDS


def _keys(value: Any) -> list[str]:
    """Every object key in a JSON document, at any depth, except inside opaque payloads."""
    if isinstance(value, dict):
        keys = []
        for key, item in value.items():
            keys.append(key)
            if key not in ("serviceRequestPayload", "tags"):
                keys += _keys(item)
        return keys
    if isinstance(value, list):
        return [key for item in value for key in _keys(item)]
    return []


def _is_camel(key: str) -> bool:
    return "_" not in key and key[:1].islower()


@pytest.mark.parametrize(
    "sample", [pytest.param(s, id=f"{s.kind} #{i} encodes to camelCase and decodes back equal")
               for i, s in enumerate(COMMAND_SAMPLES)],
)  # fmt: skip
def test_command_round_trip(sample):
    text = encode(sample)
    document = json.loads(text)
    assert document["kind"] == sample.kind
    assert all(_is_camel(key) for key in _keys(document)), _keys(document)
    assert decode_command(text) == sample
    assert encode(decode_command(text)) == text


@pytest.mark.parametrize(
    "sample", [pytest.param(s, id=f"{s.kind} #{i} encodes to camelCase and decodes back equal")
               for i, s in enumerate(FACT_SAMPLES)],
)  # fmt: skip
def test_fact_round_trip(sample):
    text = encode(sample)
    document = json.loads(text)
    assert document["kind"] == sample.kind
    assert "commandSeq" in document and "at" in document
    assert all(_is_camel(key) for key in _keys(document)), _keys(document)
    assert decode_fact(text) == sample
    assert encode(decode_fact(text)) == text


@pytest.mark.parametrize(
    "sample,fields",
    cases(("JobDispatched carries the contract's fields", FACT_SAMPLES[12],
           {"jobId", "attempt", "jobQueue", "quotaShareName", "capacityUsage", "borrowed",
            "afterPreemptionOf", "at"}),
          ("JobPreempted carries the contract's fields", FACT_SAMPLES[13],
           {"jobId", "attempt", "preemptorJobId", "reason", "outcome", "preemptedAttemptCount", "at"}),
          ("JobSubmitted carries the contract's fields", FACT_SAMPLES[9],
           {"jobId", "jobName", "jobQueue", "quotaShareName", "schedulingPriority", "capacityUsage", "at"}),
          ("JobStatusChanged carries the contract's fields", FACT_SAMPLES[14],
           {"jobId", "attempt", "status", "statusReason", "at"}),
          ("ShareBlocked carries the contract's fields", FACT_SAMPLES[16],
           {"jobQueue", "quotaShareName", "jobId", "statusReason", "at"}),
          ("CommandRejected carries the contract's fields", FACT_SAMPLES[0],
           {"commandKind", "statusReason", "jobId", "quotaShareName", "at"}),
          ("JobPriorityUpdated carries the contract's fields", FACT_SAMPLES[11],
           {"jobId", "schedulingPriority", "at"})),
)  # fmt: skip
def test_facts_carry_at_least_the_contract_fields(sample, fields):
    assert fields <= set(json.loads(encode(sample)))


def test_encoding_is_canonical_and_compact():
    text = encode(COMMAND_SAMPLES[0])
    assert "\n" not in text and ", " not in text and ": " not in text
    assert text == encode(decode_command(text))


# -- JSON schema --------------------------------------------------------------------------------


def test_the_command_schema_mentions_every_command_kind():
    text = json.dumps(command_schema())
    for kind in C.COMMAND_KINDS:
        assert f'"{kind}"' in text, kind
    assert '"quotaShareName"' in text and "quota_share_name" not in text


def test_the_fact_schema_mentions_every_fact_kind():
    text = json.dumps(fact_schema())
    for kind in FACT_KINDS:
        assert f'"{kind}"' in text, kind
    assert '"afterPreemptionOf"' in text and "after_preemption_of" not in text


def test_the_schemas_are_discriminated_by_kind():
    for schema in (command_schema(), fact_schema()):
        assert schema["discriminator"]["propertyName"] == "kind"
