"""The AWS CLI parameter syntax of services/cli/shorthand.py: shorthand, JSON, file://."""

from __future__ import annotations

import pytest

from quotasched.services.cli.shorthand import (
    SHAPES,
    ShorthandError,
    expand_multi_value_args,
    parse_list_param,
    parse_param,
    parse_shorthand,
)

G5 = "ml.g5.xlarge"

PARSED = [
    # (test id, option, shape name, text, expected)
    ("integers converted where the shape is numeric", "--capacity-limits", "capacityLimits",
     f"maxCapacity=1,capacityUnit={G5}", [{"maxCapacity": 1, "capacityUnit": G5}]),
    ("a negative integer", "--resource-sharing-configuration", "resourceSharingConfiguration",
     "strategy=LEND_AND_BORROW,borrowLimit=-1", {"strategy": "LEND_AND_BORROW", "borrowLimit": -1}),
    ("a one-key structure", "--quota-share-policy", "quotaSharePolicy",
     "idleResourceAssignmentStrategy=FIFO", {"idleResourceAssignmentStrategy": "FIFO"}),
    ("spaces around tokens are ignored", "--service-environment-order", "serviceEnvironmentOrder",
     " order = 1 , serviceEnvironment = se ", [{"order": 1, "serviceEnvironment": "se"}]),
    ("comma-separated values become a list", "--filters", "filters",
     "name=JOB_NAME,values=train-1,train-2",
     [{"name": "JOB_NAME", "values": ["train-1", "train-2"]}]),
    ("a single value of a list member is a list of one", "--filters", "filters",
     "name=QUOTA_SHARE_NAME,values=qs1", [{"name": "QUOTA_SHARE_NAME", "values": ["qs1"]}]),
    ("an explicit [list]", "--filters", "filters", "values=[a,b],name=JOB_NAME",
     [{"values": ["a", "b"], "name": "JOB_NAME"}]),
    ("a list value followed by another key", "--filters", "filters",
     "values=a,b,name=JOB_NAME", [{"values": ["a", "b"], "name": "JOB_NAME"}]),
    ("quoted values keep commas and equals signs", "--tags", "tags",
     "note='a,b=c',other=\"x\\\"y\"", {"note": "a,b=c", "other": 'x"y'}),
    ("a map of strings", "--tags", "tags", "team=research,env=dev",
     {"team": "research", "env": "dev"}),
    ("nested lists of structures", "--retry-strategy", "retryStrategy",
     "attempts=3,evaluateOnExit=[{action=RETRY,onStatusReason='Received status*'},"
     "{action=EXIT,onStatusReason=*}]",
     {"attempts": 3, "evaluateOnExit": [{"action": "RETRY", "onStatusReason": "Received status*"},
                                        {"action": "EXIT", "onStatusReason": "*"}]}),
    ("an empty value is an empty string", "--tags", "tags", "empty=", {"empty": ""}),
    ("JSON is taken as written, never converted", "--capacity-limits", "capacityLimits",
     '[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": "1"}]',
     [{"capacityUnit": G5, "maxCapacity": "1"}]),
    ("a JSON object given to a list shape is one item", "--capacity-limits", "capacityLimits",
     '{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 2}',
     [{"capacityUnit": G5, "maxCapacity": 2}]),
    ("a JSON structure", "--timeout-config", "timeoutConfig", ' {"attemptDurationSeconds": 60}',
     {"attemptDurationSeconds": 60}),
]


@pytest.mark.parametrize("option, shape, text, expected", [case[1:] for case in PARSED],
                         ids=[case[0] for case in PARSED])  # fmt: skip
def test_parameters_parse_into_the_api_shape(option, shape, text, expected):
    assert parse_param(option, text, SHAPES[shape]) == expected


def test_a_list_option_collects_every_value_in_order_and_json_lists_are_flattened():
    values = [f"capacityUnit={G5},maxCapacity=1",
              '[{"capacityUnit": "ml.p4d.24xlarge", "maxCapacity": 2}]',
              "capacityUnit=ml.m5.large,maxCapacity=3"]  # fmt: skip
    assert parse_list_param("--capacity-limits", values, SHAPES["capacityLimits"]) == [
        {"capacityUnit": G5, "maxCapacity": 1},
        {"capacityUnit": "ml.p4d.24xlarge", "maxCapacity": 2},
        {"capacityUnit": "ml.m5.large", "maxCapacity": 3},
    ]


def test_a_list_option_never_given_is_none():
    assert parse_list_param("--capacity-limits", None, SHAPES["capacityLimits"]) is None
    assert parse_list_param("--capacity-limits", [], SHAPES["capacityLimits"]) is None


def test_file_urls_are_read_then_parsed_as_json_or_shorthand(tmp_path, monkeypatch):
    (tmp_path / "limits.json").write_text('[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}]')
    (tmp_path / "policy.txt").write_text("idleResourceAssignmentStrategy=FIFO\n")
    monkeypatch.chdir(tmp_path)
    assert parse_param("--capacity-limits", "file://limits.json", SHAPES["capacityLimits"]) == [
        {"capacityUnit": G5, "maxCapacity": 3}]
    assert parse_param("--quota-share-policy", f"file://{tmp_path / 'policy.txt'}",
                       SHAPES["quotaSharePolicy"]) == {"idleResourceAssignmentStrategy": "FIFO"}


def test_file_urls_can_be_read_by_an_injected_reader():
    read = {"payload.json": '{"attemptDurationSeconds": 5}'}.__getitem__
    assert parse_param("--timeout-config", "file://payload.json", SHAPES["timeoutConfig"],
                       read_file=read) == {"attemptDurationSeconds": 5}  # fmt: skip


def test_raw_shorthand_keeps_strings_and_nests():
    assert parse_shorthand("--x", "a=1,b={c=2,d=[3,4]},e=[]") == {
        "a": "1", "b": {"c": "2", "d": ["3", "4"]}, "e": []}


BAD = [
    # (test id, option, shape name, text, words the message must contain)
    ("a key without =", "--capacity-limits", "capacityLimits", "capacityUnit,maxCapacity=1",
     ["'--capacity-limits'", "Expected: '='", "^"]),
    ("a word where a number belongs", "--capacity-limits", "capacityLimits",
     f"capacityUnit={G5},maxCapacity=three", ["maxCapacity must be an integer", "'three'"]),
    ("an unknown key", "--capacity-limits", "capacityLimits", "capacityUnit=a,maxCapacty=1",
     ["unknown key 'maxCapacty'", "capacityUnit, maxCapacity"]),
    ("a key given twice", "--tags", "tags", "a=1,a=2", ["'a' is given twice"]),
    ("an unterminated quote", "--tags", "tags", "a='open", ["closing '"]),
    ("invalid JSON", "--capacity-limits", "capacityLimits", '[{"capacityUnit": }]',
     ["Invalid JSON"]),
    ("a list where one value belongs", "--capacity-limits", "capacityLimits",
     "capacityUnit=a,b,maxCapacity=1", ["capacityUnit takes one string"]),
    ("a bare word instead of key=value", "--preemption-configuration",
     "sharePreemptionConfiguration", "ENABLED", ["Expected: '='"]),
    ("an unclosed list", "--filters", "filters", "name=JOB_NAME,values=[a,b",
     ["Expected: ','"]),
    ("a missing file", "--capacity-limits", "capacityLimits", "file:///nonexistent/limits.json",
     ["Unable to load paramfile file:///nonexistent/limits.json"]),
]


@pytest.mark.parametrize("option, shape, text, words", [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])  # fmt: skip
def test_bad_syntax_is_refused_with_a_message_naming_the_parameter(option, shape, text, words):
    with pytest.raises(ShorthandError) as raised:
        parse_param(option, text, SHAPES[shape])
    for word in words:
        assert word in str(raised.value)


EXPANDED = [
    ("space-separated values repeat the option",
     ["--capacity-limits", "a=1", "b=2", "--state", "ENABLED"],
     ["--capacity-limits", "a=1", "--capacity-limits", "b=2", "--state", "ENABLED"]),
    ("options that are not lists are left alone", ["--job-name", "x", "--wait"],
     ["--job-name", "x", "--wait"]),
    ("--opt=value takes further values too", ["--filters=a=1", "b=2"],
     ["--filters=a=1", "--filters", "b=2"]),
    ("a negative number is a value, not an option", ["--capacity-limits", "a=1", "-1"],
     ["--capacity-limits", "a=1", "--capacity-limits", "-1"]),
    ("nothing after -- is touched", ["--filters", "a=1", "--", "b=2"],
     ["--filters", "a=1", "--", "b=2"]),
    ("a stray value after a plain option stays stray (the parser will refuse it)",
     ["--job-name", "x", "y"], ["--job-name", "x", "y"]),
]


@pytest.mark.parametrize("args, expected", [case[1:] for case in EXPANDED],
                         ids=[case[0] for case in EXPANDED])  # fmt: skip
def test_list_options_take_space_separated_values_like_the_aws_cli(args, expected):
    assert expand_multi_value_args(args, {"--capacity-limits", "--filters"}) == expected
