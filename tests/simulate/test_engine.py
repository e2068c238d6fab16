"""The simulator drives the real core: hand-computed waits, conservation of work, determinism,
every scheduling invariant through a run, and validated-equivalent command construction."""

from __future__ import annotations

from itertools import groupby

import pytest

from quotasched.events.codec import encode
from quotasched.services.scheduler.core.invariants import DecisionAuditor, check_stable, check_state
from quotasched.services.simulate import Window, parse_config, simulate, summarize, synthetic
from tests.simulate.builders import config, trace

G5 = "ml.g5.xlarge"


def by_id(run, values):
    return dict(zip(run.trace.job_ids, values))


def test_hand_computed_waits_with_head_of_line_blocking():
    # One RESERVE share of 2 instances.  a and b fill it at t=0 until t=10.  c (2 GPUs,
    # t=5) waits for both: dispatched at 10, wait 5.  d (1 GPU, t=6) queues behind the head c
    # (strict head-of-line) although nothing fits before 10 anyway; c holds both until 15,
    # so d starts at 15: wait 9, done at 18.
    t = trace(("a", 0, 10, 1, "x"), ("b", 0, 10, 1, "x"), ("c", 5, 5, 2, "x"), ("d", 6, 3, 1, "x"))
    run = simulate(t, config([{"name": "s", "teams": ["x"], "strategy": "RESERVE", "limit": 2}], 2))
    starts = by_id(run, run.first_start)
    waits = {job: starts[job] - submit for job, submit in zip(t.job_ids, t.submit)}
    assert waits == {"a": 0.0, "b": 0.0, "c": 5.0, "d": 9.0}
    assert by_id(run, run.end) == {"a": 10.0, "b": 10.0, "c": 15.0, "d": 18.0}
    summary = summarize(run)
    assert summary.makespan_h == pytest.approx(18 / 3600)
    # over the submit span [0, 6) both instances are held throughout
    assert summary.utilization == pytest.approx(1.0)
    # over [0, 18): 2 instances except [15, 18) with 1: 2*15 + 3 = 33 of 36
    assert summarize(run, Window(0, 18, 0)).utilization == pytest.approx(33 / 36)


TWO_SHARES = [
    {"name": "a", "teams": ["ta"], "strategy": "LEND_AND_BORROW", "limit": 1},
    {"name": "b", "teams": ["tb"], "strategy": "LEND", "limit": 1},
]


@pytest.mark.parametrize("checkpoint, lost, y_end", [(None, 10.0, 115.0), (4, 2.0, 107.0)])
def test_reclaim_loses_work_since_the_last_checkpoint(checkpoint, lost, y_end):
    # x runs in a's own instance, y borrows b's idle one.  At t=10 b's z reclaims it: y is
    # preempted after 10 s of work (checkpointed every 4 s: 8 s kept, 2 lost) and requeued; z
    # runs 10..15, then y is dispatched again (borrowing) and needs 100 - kept seconds.
    t = trace(("x", 0, 100, 1, "ta"), ("y", 0, 100, 1, "ta"), ("z", 10, 5, 1, "tb"))
    extra = {} if checkpoint is None else {"checkpoint_interval_s": checkpoint}
    run = simulate(t, config(TWO_SHARES, 2, **extra))
    assert by_id(run, run.end) == {"x": 100.0, "y": y_end, "z": 15.0}
    assert by_id(run, run.lost) == {"x": 0.0, "y": lost, "z": 0.0}
    assert by_id(run, run.preemptions) == {"x": 0, "y": 1, "z": 0}
    assert by_id(run, run.first_start) == {"x": 0.0, "y": 0.0, "z": 10.0}
    summary = summarize(run)
    assert summary.lost_gpu_h == pytest.approx(lost / 3600)
    # a held 2 instances on a limit of 1 over [0, 10) and [15, 100): once x ends at 100, y
    # runs within a's own limit (borrowing is a share's usage beyond its limit)
    assert summary.borrowed_gpu_h == pytest.approx((10 + 85) / 3600)


SMALL = [
    {"name": "big", "teams": ["team1"], "strategy": "LEND_AND_BORROW", "weight": 2,
     "in_share_preemption": True},
    {"name": "mid", "teams": ["team2"], "strategy": "LEND", "weight": 1},
    {"name": "low", "teams": ["team3"], "strategy": "LEND_AND_BORROW", "borrow_limit": 100,
     "weight": 1},
]  # fmt: skip
RANDOM = {"kind": "random", "values": [0, 1, 5], "seed": 11}


# options beyond AWS on both borrowers: protections and budgets lapse between trace events
PROTECTED = {"minRuntimeBeforePreemptionSeconds": 1800,
             "preemptionBudget": {"maxPreemptions": 2, "windowSeconds": 7200}}  # fmt: skip


@pytest.fixture(scope="module", params=[False, True], ids=["aws", "options"])
def busy(request):
    """300 jobs on a pool small enough that borrowing, reclaim and in-share preemption happen
    (with options beyond AWS on the borrowing shares, or without)."""
    t = synthetic(300, teams=3, seed=3)
    shares = SMALL
    if request.param:
        shares = [{**share, "options": PROTECTED} if share["strategy"] == "LEND_AND_BORROW" else share
                  for share in SMALL]  # fmt: skip
    return t, config(shares, 24, priority=RANDOM)


@pytest.mark.parametrize("checkpoint", [None, 600])
def test_conservation_of_work(busy, checkpoint):
    t, c = busy
    if checkpoint:
        c = c.model_copy(update={"checkpoint_interval_s": checkpoint})
    run = simulate(t, c)
    assert sum(run.preemptions) > 0, "the workload must exercise preemption"
    assert all(end >= 0 for end in run.end) and not any(run.failed)
    for i in range(len(t)):
        # every second an attempt ran is either the job's own work or work later thrown away
        assert run.ran[i] == pytest.approx(t.duration[i] + run.lost[i], abs=1e-6)
        assert 0 <= run.lost[i] <= run.ran[i]
        if checkpoint:
            assert run.lost[i] < checkpoint * run.preemptions[i] + 1e-9
    summary = summarize(run)
    assert summary.run_gpu_h == pytest.approx(summary.trace_gpu_h + summary.lost_gpu_h)
    # the instance-time held equals the GPU-time of every attempt (1 GPU per instance)
    assert sum(run.used_area.values()) == pytest.approx(summary.run_gpu_h * 3600)
    # the time kept of each job's attempts adds up to its duration: the rest was lost
    kept = [0.0] * len(t)
    for j, lo, hi in run.kept:
        kept[j] += hi - lo
    assert kept == pytest.approx(t.duration)
    # over the whole run, utilization is the instance-time held / pool x makespan
    whole = summarize(run, Window(t.submit[0], summary.last_end, t.submit[0]))
    held = sum(run.used_area.values())
    assert whole.utilization == pytest.approx(held / (24 * (summary.last_end - t.submit[0])))
    assert whole.useful_utilization == pytest.approx(
        t.gpu_seconds() / (24 * (summary.last_end - t.submit[0])))  # fmt: skip
    # every job started; time queued is at least the wait for the first start
    assert summary.still_waiting == 0
    assert all(queued >= start - submit - 1e-9 for queued, start, submit
               in zip(run.queued, run.first_start, t.submit))  # fmt: skip


def test_same_seed_same_results_other_seed_differs(busy):
    t, c = busy
    first, second = simulate(t, c, record=True), simulate(t, c, record=True)
    assert [encode(f) for f in first.facts] == [encode(f) for f in second.facts]
    a, b = summarize(first), summarize(second)
    a.seconds = b.seconds = 0.0
    assert a == b
    other = c.model_copy(update={"priority": parse_config({
        "name": "o", "environment": {"max_instances": 1}, "shares": SMALL,
        "priority": {**RANDOM, "seed": 12}}).priority})  # fmt: skip
    assert simulate(t, other).priority != first.priority


def test_every_invariant_holds_through_a_simulation(busy):
    from tests.checker import IndependentChecker

    t, c = busy
    run = simulate(t, c, record=True)
    auditor = DecisionAuditor()
    independent = IndependentChecker()  # tests/checker.py: the rules over the facts alone
    commands = 0
    for _seq, group in groupby(run.facts, key=lambda fact: fact.command_seq):
        facts = list(group)
        for fact in facts:
            auditor.feed(fact)
        independent.check_command([fact.model_dump(by_alias=True, mode="json") for fact in facts])
        commands += 1
        problems = check_state(auditor.state) + auditor.problems
        assert not problems, problems
        assert check_stable(auditor.state) == [], "a full pass would still dispatch"
    assert commands > len(t)  # submissions and completions both produced facts
    kinds = {fact.kind for fact in run.facts}
    assert {"JobDispatched", "JobPreempted", "JobStatusChanged"} <= kinds


def test_copied_commands_decide_exactly_like_decoded_ones(busy):
    t, c = busy
    fast, checked = simulate(t, c, record=True), simulate(t, c, record=True, validate=True)
    assert [encode(f) for f in fast.facts] == [encode(f) for f in checked.facts]


def test_a_job_too_big_for_a_reserve_share_blocks_it_and_is_reported():
    t = trace(("big", 0, 10, 4, "x"), ("small", 1, 10, 1, "x"))
    shares = [{"name": "s", "teams": ["x"], "strategy": "RESERVE", "limit": 2}]
    run = simulate(t, config(shares, 8, raise_to_largest_job=False))
    summary = summarize(run)
    assert summary.still_waiting == 2 and summary.finished == 0
    assert "s" in summary.blocked and "QUOTA_MANAGEMENT_LIMIT_EXCEEDED" in summary.blocked["s"]
    # raised to the largest job (the default), the share runs both
    assert summarize(simulate(t, config(shares, 8))).finished == 2


def test_lent_gpu_hours_are_measured_apart_and_equal_the_borrowed_ones(busy):
    """Borrowed: what shares held beyond their limits; lent: lenders' idle capacity that
    covered it, at every moment (ruling 1 makes them equal, measured independently)."""
    t, c = busy
    with_reserve = [*SMALL[:2], {"name": "low", "teams": ["team3"], "strategy": "RESERVE",
                                 "weight": 1}]  # its idle capacity is never lent
    summary = summarize(simulate(t, config(with_reserve, 24, priority=RANDOM)))
    assert summary.borrowed_gpu_h > 0
    assert summary.lent_gpu_h == pytest.approx(summary.borrowed_gpu_h, rel=1e-9)
    assert sum(share.borrowed_gpu_h for share in summary.shares) == pytest.approx(
        summary.borrowed_gpu_h)  # fmt: skip


@pytest.mark.parametrize("lender", ["LEND", "LEND_AND_BORROW"])
def test_lending_alone_changes_nothing_without_a_borrower(busy, lender):
    """With no share that borrows, LEND (or one lone LEND_AND_BORROW share with nobody to
    borrow from) schedules exactly like RESERVE: the same starts and ends for every job."""
    t, _ = busy
    shares = [{"name": f"s{i}", "teams": [f"team{i}"], "strategy": "RESERVE", "limit": 8}
              for i in (1, 2, 3)]  # fmt: skip
    reserve = simulate(t, config(shares, 24))
    lending = [{**share, "strategy": "LEND"} for share in shares]
    if lender == "LEND_AND_BORROW":
        lending[0]["strategy"] = "RESERVE"
        lending[1]["strategy"] = "RESERVE"
        lending[2]["strategy"] = "LEND_AND_BORROW"  # nobody lends to it
    lent = simulate(t, config(lending, 24))
    assert lent.first_start == reserve.first_start and lent.end == reserve.end
    assert summarize(lent).borrowed_gpu_h == summarize(lent).lent_gpu_h == 0
