"""The projection held against a tiny independent fold of the fact log.

test_determinism.py proves that every way of building a projection gives the same tables, but
it compares the projection's SQL with itself: a wrong rule built the same way every time passes.
Here a few lines of plain Python, importing nothing from projections/ or the scheduler core,
read the facts (JSON) and compute straight from the definitions:

- every attempt's start, end and end reason (the first fact after its dispatch that takes it
  out of SCHEDULED/STARTING/RUNNING: JobPreempted -> PREEMPTED; cause TERMINATED, TIME_LIMIT or
  SHARE_DELETED -> TERMINATED; SUCCEEDED -> SUCCEEDED; anything else -> FAILED);
- each job's run_s (time holding capacity, running attempts up to "now");
- per share and unit, used instance-seconds (the integral of what its attempts held) and
  borrowed instance-seconds (the integral of max(0, held - own limit), the limit following the
  share's create / update / delete facts; a unit not listed, or a deleted share, has limit 0).

The projection's `attempts`, `jobs` and `utilization(0, now, now)` must agree, on the random
workload the determinism tests use (its share "gone" is deleted with jobs running in it), on a
second seed, and on the example files.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.projections import test_end_reasons as end_reasons
from tests.projections.helpers import example_facts, facts_of, project, random_workload, rows

HOLDING = ("SCHEDULED", "STARTING", "RUNNING")
ENDED_BY_SCHEDULER = ("TERMINATED", "TIME_LIMIT", "SHARE_DELETED")


def fold(lines: list[str]) -> dict:
    facts = [json.loads(line) for line in lines]
    now = facts[-1]["at"]
    starts: dict[tuple[str, int], dict] = {}
    ends: dict[tuple[str, int], tuple[float, str, str]] = {}
    # per (queue, share, unit): a list of (at, held delta, new limit or None), in log order
    steps: dict[tuple[str, str, str], list] = defaultdict(list)
    listed: dict[tuple[str, str], set[str]] = {}
    for fact in facts:
        kind, at = fact["kind"], fact["at"]
        if kind == "JobDispatched":
            key = (fact["jobId"], fact["attempt"])
            starts[key] = {"at": at, "queue": fact["jobQueue"], "share": fact["quotaShareName"],
                           "usage": [(u["capacityUnit"], u["quantity"])
                                     for u in fact["capacityUsage"]]}  # fmt: skip
            for unit, quantity in starts[key]["usage"]:
                steps[(fact["jobQueue"], fact["quotaShareName"], unit)].append((at, quantity, None))
        elif kind in ("JobPreempted", "JobStatusChanged"):
            key = (fact["jobId"], fact["attempt"])
            if key not in starts or key in ends:
                continue
            if kind == "JobPreempted":
                ends[key] = (at, "PREEMPTED", fact["reason"])
            elif fact["status"] not in HOLDING:
                cause = fact["cause"]
                reason = ("TERMINATED" if cause in ENDED_BY_SCHEDULER else
                          "SUCCEEDED" if fact["status"] == "SUCCEEDED" else "FAILED")  # fmt: skip
                ends[key] = (at, reason, cause)
            else:
                continue
            start = starts[key]
            for unit, quantity in start["usage"]:
                steps[(start["queue"], start["share"], unit)].append((at, -quantity, None))
        elif kind in ("QuotaShareCreated", "QuotaShareUpdated", "QuotaShareDeleted"):
            name = (fact["jobQueue"], fact["quotaShareName"])
            limits = {} if kind == "QuotaShareDeleted" else {
                x["capacityUnit"]: x["maxCapacity"] for x in fact["capacityLimits"]}
            for unit in listed.get(name, set()) | set(limits):
                steps[(*name, unit)].append((at, 0, limits.get(unit, 0)))
            listed[name] = set(limits)
    used: dict[tuple, float] = {}
    borrowed: dict[tuple, float] = {}
    for key, changes in steps.items():
        held, limit, u, b = 0, 0, 0.0, 0.0
        for (at, delta, new_limit), following in zip(changes, [*changes[1:], (now, 0, None)]):
            held += delta
            limit = limit if new_limit is None else new_limit
            span = following[0] - at
            u += held * span
            b += max(0, held - limit) * span
        used[key], borrowed[key] = u, b
    run: dict[str, float] = defaultdict(float)
    attempts = set()
    for key, start in starts.items():
        end_at, reason, cause = ends.get(key, (None, None, None))
        run[key[0]] += (now if end_at is None else end_at) - start["at"]
        attempts.add((*key, start["at"], end_at, reason, cause))
    return {"now": now, "attempts": attempts, "run": dict(run), "used": used,
            "borrowed": borrowed}  # fmt: skip


def _check(lines: list[str]) -> dict:
    expected = fold(lines)
    with project(lines, batch=97) as projection:
        con = projection.con
        assert rows(con, "SELECT last_at FROM projection_state") == [(expected["now"],)]
        assert set(rows(con, """SELECT job_id, attempt, start_at, end_at, end_reason, end_cause
                                FROM attempts""")) == expected["attempts"]  # fmt: skip
        run = {job: seconds for job, seconds in rows(con, "SELECT job_id, run_s FROM jobs")
               if seconds}  # fmt: skip
        assert run == pytest.approx({j: s for j, s in expected["run"].items() if s}, abs=1e-6)
        now = expected["now"]
        measured = {(q, s, u): (used, borrowed) for q, s, u, used, borrowed in rows(con, f"""
            SELECT job_queue, quota_share, capacity_unit, sum(used_s)::DOUBLE,
                   sum(borrowed_s)::DOUBLE
            FROM utilization(0, {float(now)}, {float(max(now, 1.0))}) GROUP BY ALL""")}
    keys = set(measured) | set(expected["used"])
    for index, measure in enumerate(("used", "borrowed")):
        assert {k: measured.get(k, (0.0, 0.0))[index] for k in keys} == pytest.approx(
            {k: expected[measure].get(k, 0.0) for k in keys}, abs=1e-6), measure
    return expected


@pytest.mark.parametrize("seed", [7, 11])
def test_the_random_workload_projects_as_the_independent_fold_says(seed):
    expected = _check(facts_of(random_workload(seed=seed)))
    reasons = {(reason, cause) for *_, reason, cause in expected["attempts"]}
    # The workload reaches most of the rules (its deleted share "gone" has nothing running by
    # then: the scenarios below cover SHARE_DELETED), and its shares both borrowed and ran.
    assert {("TERMINATED", "TERMINATED"), ("FAILED", "CAPACITY_BOUNCE"), ("FAILED", "RETRY"),
            ("FAILED", "ATTEMPT_TIMEOUT"), ("PREEMPTED", "IN_SHARE_PRIORITY"),
            ("PREEMPTED", "CROSS_SHARE_RECLAIM"), ("SUCCEEDED", "REPORTED")} <= reasons
    assert sum(expected["borrowed"].values()) > 0 and sum(expected["used"].values()) > 0


@pytest.mark.parametrize("scenario", [end_reasons.share_deleted_mid_run,
                                      end_reasons.failures_of_every_kind,
                                      end_reasons.preemptions_requeued_and_failed,
                                      end_reasons.time_limits])
def test_the_end_reason_scenarios_project_as_the_independent_fold_says(scenario):
    expected = _check(facts_of(scenario()))
    if scenario is end_reasons.share_deleted_mid_run:
        assert {(job, reason, cause) for job, _, _, _, reason, cause in expected["attempts"]
                if job.startswith("d")} == {("d1", "TERMINATED", "SHARE_DELETED"),
                                            ("d2", "TERMINATED", "SHARE_DELETED")}


@pytest.mark.parametrize("name", ["notebook.jsonl", "reclaim-and-retries.jsonl",
                                  "two-teams-day.jsonl", "blocked-heads-and-capacity-events.jsonl"])
def test_every_example_projects_as_the_independent_fold_says(name):
    _check(example_facts(name))
