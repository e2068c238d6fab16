"""Traces and configurations: what is accepted, and the precise errors for what is not."""

from __future__ import annotations

import pytest

from quotasched.services.simulate import (ConfigError, TraceError, parse_config, read_trace, synthetic,
                               write_trace)  # fmt: skip
from quotasched.services.simulate.config import load_config
from quotasched.services.simulate.cluster import plan

HEADER = "job_id,submit_time_s,duration_s,gpus,team,job_type\n"
SHARE = {"name": "s", "teams": ["x"], "strategy": "RESERVE", "limit": 2}


def base(**changes) -> dict:
    return {"name": "t", "environment": {"max_instances": 10}, "shares": [SHARE], **changes}


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "c.yaml")
    return str(caught.value)


@pytest.mark.parametrize("data, expected", [
    (base(shares=[{**SHARE, "borrow_limit": 50}]),
     "shares.0: borrow_limit can only be applied to the LEND_AND_BORROW strategy, not RESERVE"),
    (base(shares=[{**SHARE, "weight": 2}]), "shares.0: give exactly one of limit"),
    (base(shares=[{**SHARE, "limit": 0}]), "shares.0.limit: Input should be greater than or equal to 1"),
    (base(shares=[{**SHARE, "strategy": "SHARE"}]), "shares.0.strategy: Input should be 'RESERVE'"),
    (base(shares=[{**SHARE, "name": "bad name"}]), "shares.0.name: String should match pattern"),
    (base(shares=[{**SHARE, "borrowLimit": 5}]), "shares.0.borrowLimit: Extra inputs are not permitted"),
    (base(shares=[{**SHARE, "name": f"s{i}", "teams": [f"t{i}"]} for i in range(21)]),
     "shares: List should have at most 20 items"),
    (base(shares=[SHARE, {**SHARE, "name": "u"}]), "team x is mapped to both s and u"),
    (base(shares=[SHARE, SHARE]), "share s is listed more than once"),
    (base(default_share="nope"), "default_share nope is not one of the shares"),
    (base(environment={"max_instances": 0}), "environment.max_instances: Input should be greater"),
    (base(priority={"kind": "dice"}), "priority: Input tag 'dice' found using 'kind' does not match"),
    (base(priority={"kind": "random", "values": [1, 2], "weights": [1]}),
     "priority.random: weights has 1 entries, values has 2"),
    (base(priority={"kind": "rule", "rules": [{"priority": 3}]}),
     "a rule needs at least one of gpus_at_least"),
    (base(priority={"kind": "constant", "value": 10000}),
     "priority.constant.value: Input should be less than or equal to 9999"),
    (base(checkpoint_interval_s=0), "checkpoint_interval_s: Input should be greater than 0"),
    (base(shares=[{**SHARE, "options": {"minRuntimeBeforePreemptionSeconds": 0}}]),
     "shares.0.options.minRuntimeBeforePreemptionSeconds: Input should be greater than or equal to 1"),
    (base(shares=[{**SHARE, "options": {"preemptionBudget": {"maxPreemptions": 2}}}]),
     "shares.0.options.preemptionBudget.windowSeconds: Field required"),
    (base(shares=[{**SHARE, "options": {"minRuntime": 60}}]),
     "shares.0.options.minRuntime: Extra inputs are not permitted"),
])  # fmt: skip
def test_config_errors_name_the_field(data, expected):
    message = error_of(data)
    assert message.startswith("c.yaml: invalid configuration")
    assert expected in message, message


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text("- just a list\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(str(tmp_path / "missing.yaml"))


def test_weights_split_the_pool_and_cover_the_largest_job():
    shares = [{"name": n, "teams": [n], "strategy": "LEND", "weight": w}
              for n, w in (("a", 1), ("b", 1), ("c", 1))]  # fmt: skip
    c = parse_config(base(environment={"max_instances": 10}, shares=shares))
    assert c.limits({}) == {"a": 4, "b": 3, "c": 3}  # largest remainder, ties by name
    assert c.limits({"c": 6}) == {"a": 4, "b": 3, "c": 6}
    assert parse_config(base(shares=shares, raise_to_largest_job=False)).limits({"c": 6})["c"] == 3
    # a larger pool: weighted quotas follow it; absolute limits scale with it
    assert c.with_pool(20).limits({}) == {"a": 7, "b": 7, "c": 6}
    assert parse_config(base()).with_pool(30).shares[0].limit == 6


def test_unmapped_teams_are_named_unless_a_default_share_takes_them():
    t = synthetic(40, teams=3, seed=1)
    with pytest.raises(ConfigError, match="trace teams without a share: team2, team3"):
        plan(t, parse_config(base(shares=[{**SHARE, "teams": ["team1"]}])))
    planned = plan(t, parse_config(base(shares=[{**SHARE, "teams": ["team1"]}], default_share="s")))
    assert set(planned.share_of_job) == {"s"}


def test_priorities_from_job_type_rule_and_seed():
    c = parse_config(base(priority={"kind": "job_type", "map": {"prod": 7}, "default": 1}))
    assert c.priorities(["prod", "dev", ""], [1, 1, 1], [1, 1, 1]) == [7, 1, 1]
    strict = parse_config(base(priority={"kind": "job_type", "map": {"prod": 7}}))
    with pytest.raises(ConfigError, match="no entry for job_type 'dev' \\(row 2"):
        strict.priorities(["prod", "dev"], [1, 1], [1, 1])
    rule = parse_config(base(priority={"kind": "rule", "default": 2, "rules": [
        {"gpus_at_least": 8, "priority": 9}, {"duration_at_most_s": 60, "priority": 5}]}))  # fmt: skip
    assert rule.priorities(["", "", ""], [8, 1, 1], [10, 10, 100]) == [9, 5, 2]
    drawn = {"kind": "random", "values": [0, 5], "seed": 4}
    one = parse_config(base(priority=drawn)).priorities([""] * 50, [1] * 50, [1] * 50)
    assert one == parse_config(base(priority=drawn)).priorities([""] * 50, [1] * 50, [1] * 50)
    assert set(one) == {0, 5}


def test_trace_round_trip_and_synthetic_is_seeded(tmp_path):
    t = synthetic(50, teams=2, seed=9)
    assert synthetic(50, teams=2, seed=9) == t
    assert synthetic(50, teams=2, seed=10).duration != t.duration
    path = tmp_path / "t.csv"
    write_trace(t, str(path))
    again = read_trace(str(path))
    assert (again.job_ids, again.submit, again.duration, again.gpus, again.team, again.job_type) == (
        t.job_ids, t.submit, t.duration, t.gpus, t.team, t.job_type)


def test_trace_rows_are_put_in_submission_order(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "b,20,5,1,x,\na,10,5,1,x,\n")
    assert read_trace(str(path)).job_ids == ["a", "b"]


@pytest.mark.parametrize("body, expected", [
    ("", "empty file"),
    ("job_id,submit_time_s,gpus,team\n", "header lacks duration_s"),
    (HEADER, "no jobs after the header"),
    (HEADER + "a,1,0,1,x,\n", ":2: duration_s must be > 0, got '0'"),
    (HEADER + "a,1,5,1.5,x,\n", ":2: gpus must be an integer, got '1.5'"),
    (HEADER + "a,-1,5,1,x,\n", ":2: submit_time_s must be >= 0"),
    (HEADER + "a,1,nan,1,x,\n", ":2: duration_s must be finite"),
    (HEADER + "a,1,5,1,x,\na,2,5,1,x,\n", ":3: job_id a appears twice"),
    (HEADER + "a b,1,5,1,x,\n", ":2: job_id 'a b' must be 1-128 characters"),
    (HEADER + "a,1,5,1,,\n", ":2: team is empty"),
    (HEADER + "a,1,5,1\n", ":2: 4 fields, the header has 6"),
])  # fmt: skip
def test_trace_errors_name_line_and_column(tmp_path, body, expected):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(TraceError) as caught:
        read_trace(str(path))
    assert expected in str(caught.value)
