"""Options beyond AWS (SetQuotaShareOptions, docs/options.md): named scenarios, every expected
value worked out by hand.  Each runs through the Cluster, so the independent checker
(tests/checker.py rule 9) and the core's invariants watch every command too.

Conventions: `g5` capacity; times are the commands' `at` (the clock the scheduler owns); a
Tick at t fires every wake-up due up to t at its own moment.
"""

from __future__ import annotations

import json

from quotasched.events import facts as F
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import step_raw
from tests.builders import Cluster, dispatch_of, dispatched_ids, kinds, only, preempted_ids


def lend_pair(capacity: int = 2) -> Cluster:
    """a: LEND_AND_BORROW 1 (unlimited borrowing); b: LEND 1; the environment `capacity`."""
    c = Cluster()
    c.environment(g5=capacity)
    c.queue()
    c.share("a", "LEND_AND_BORROW", g5=1)
    c.share("b", "LEND", g5=1)
    return c


# -- minimum runtime before preemption -------------------------------------------------------


def test_a_protected_borrower_is_reclaimed_only_when_its_minimum_runtime_is_over():
    """a runs a1 (its own) and a2 (borrowing b's idle instance) from t=10.  b1 comes at t=100:
    AWS would reclaim a2 at once; with a's 600 s minimum runtime a2 is protected until 610, so
    b1 waits, a Tick at 300 changes nothing, and the Tick at 1000 preempts a2 and dispatches b1
    at 610, the moment the protection ends."""
    c = lend_pair()
    facts = c.options("a", minRuntimeBeforePreemptionSeconds=600)
    assert only(facts, F.QuotaShareOptionsSet).options.min_runtime_before_preemption_seconds == 600
    c.command("Tick", at=10)
    c.submit("a1", "a")
    c.submit("a2", "a")
    assert c.dispatched() == {"a1", "a2"}
    c.at = 100
    assert dispatched_ids(c.submit("b1", "b")) == []
    assert c.tick(300) == []
    fired = c.tick(1000)
    assert kinds(fired) == ["JobPreempted", "JobDispatched"]
    assert preempted_ids(fired) == ["a2"] and dispatch_of(fired, "b1").after_preemption_of == ["a2"]
    assert {fact.at for fact in fired} == {610.0}


def test_without_the_option_the_same_story_reclaims_at_once_as_aws_does():
    c = lend_pair()
    c.command("Tick", at=10)
    c.submit("a1", "a")
    c.submit("a2", "a")
    c.at = 100
    facts = c.submit("b1", "b")
    assert preempted_ids(facts) == ["a2"] and dispatch_of(facts, "b1").at == 100


def test_protection_belongs_to_the_victims_share_so_reclaim_takes_another_shares_borrower():
    """Capacity 4: a and c (LEND_AND_BORROW 1 each) each run one job of their own and one
    borrowed from b (LEND 2): a2 at t=1, c2 at t=2.  b1 at t=5 needs one instance back.  The
    victim order takes the most recently dispatched borrower first, c2; with c protected for
    600 s, a2 (unprotected) is taken instead, at once."""
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("a", "LEND_AND_BORROW", g5=1)
    c.share("c", "LEND_AND_BORROW", g5=1)
    c.share("b", "LEND", g5=2)
    c.options("c", minRuntimeBeforePreemptionSeconds=600)
    c.submit("a1", "a")
    c.submit("c1", "c")
    c.submit("a2", "a", at=1)
    c.submit("c2", "c", at=2)
    assert c.dispatched() == {"a1", "c1", "a2", "c2"}
    facts = c.submit("b1", "b", at=5)
    assert preempted_ids(facts) == ["a2"] and dispatch_of(facts, "b1").at == 5


def test_in_share_preemption_waits_for_the_minimum_runtime_too():
    """a: RESERVE 2 with in-share preemption, 300 s minimum runtime; low1 and low2 (priority
    1) dispatched at t=0.  high (priority 5) at t=100 waits; at 300 both protections end and
    the most recently dispatched of the lowest priority, low2, is preempted for high."""
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("a", "RESERVE", in_share=True, g5=2)
    c.options("a", minRuntimeBeforePreemptionSeconds=300)
    c.submit("low1", "a", priority=1)
    c.submit("low2", "a", priority=1)
    assert dispatched_ids(c.submit("high", "a", priority=5, at=100)) == []
    fired = c.tick(400)
    assert preempted_ids(fired) == ["low2"]
    assert only(fired, F.JobPreempted).reason.value == "IN_SHARE_PRIORITY"
    assert {fact.at for fact in fired} == {300.0}


def test_turning_the_option_off_lets_the_waiting_head_reclaim_at_that_moment():
    c = lend_pair()
    c.options("a", minRuntimeBeforePreemptionSeconds=600)
    c.submit("a1", "a")
    c.submit("a2", "a")
    c.submit("b1", "b", at=50)
    facts = c.options("a", at=60)  # {}: every option off
    assert kinds(facts) == ["QuotaShareOptionsSet", "JobPreempted", "JobDispatched"]
    assert preempted_ids(facts) == ["a2"] and dispatch_of(facts, "b1").at == 60


# -- preemption budget -----------------------------------------------------------------------


def test_a_spent_preemption_budget_holds_the_next_reclaim_until_its_window_moves_on():
    """a may lose at most 1 job per 1000 s.  t=0: a1 (own), a2 (borrowed).  t=10: b1 reclaims
    a2 (the budget's one preemption, counted until 1010).  t=20: b1 ends, a2 runs again on b's
    idle instance.  t=30: b2 needs it back, but a's budget is spent: b2 waits until 1010, when
    a2 is preempted for it."""
    c = lend_pair()
    c.options("a", preemptionBudget={"maxPreemptions": 1, "windowSeconds": 1000})
    c.submit("a1", "a")
    c.submit("a2", "a")
    assert preempted_ids(c.submit("b1", "b", at=10)) == ["a2"]
    c.at = 20
    assert dispatched_ids(c.finish("b1")) == ["a2"]
    c.at = 30
    assert dispatched_ids(c.submit("b2", "b")) == []
    assert c.tick(1009) == []
    fired = c.tick(1500)
    assert preempted_ids(fired) == ["a2"] and dispatch_of(fired, "b2").at == 1010


def test_a_budget_of_two_lets_one_search_take_two_victims_and_no_third():
    """Capacity 4; a (LEND_AND_BORROW 1) runs a1 on its own instance and a2-a4 on the three b
    (LEND 3) lends it.  b1 needs 3 instances back: three victims, but a may lose at most 2 per
    1000 s, so b1 waits (no window ever allows three at once).  When a1 ends at t=50 one
    instance is free, two victims suffice, and b1 takes two of a's borrowers."""
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("a", "LEND_AND_BORROW", g5=1)
    c.share("b", "LEND", g5=3)
    c.options("a", preemptionBudget={"maxPreemptions": 2, "windowSeconds": 1000})
    for name in ("a1", "a2", "a3", "a4"):
        c.submit(name, "a")
    assert dispatched_ids(c.submit("b1", "b", n=3, at=10)) == []
    c.at = 50
    facts = c.finish("a1")
    assert len(preempted_ids(facts)) == 2 and dispatch_of(facts, "b1").at == 50
    assert set(preempted_ids(facts)) <= {"a2", "a3", "a4"}


# -- the command itself ----------------------------------------------------------------------


def test_options_for_a_share_that_does_not_exist_are_refused_by_name():
    c = lend_pair()
    facts = c.options("nope", minRuntimeBeforePreemptionSeconds=60)
    assert only(facts, F.CommandRejected).status_reason == "Quota share nope does not exist in job queue q"


def test_bad_options_are_refused_naming_the_field():
    c = lend_pair()
    for number, (bad, field) in enumerate((
            ({"minRuntimeBeforePreemptionSeconds": 0}, "minRuntimeBeforePreemptionSeconds"),
            ({"preemptionBudget": {"maxPreemptions": 0, "windowSeconds": 60}}, "maxPreemptions"),
            ({"preemptionBudget": {"maxPreemptions": 1}}, "windowSeconds"),
            ({"minRuntime": 3}, "minRuntime"))):  # fmt: skip
        line = json.dumps({"kind": "SetQuotaShareOptions", "jobQueue": "q", "quotaShareName": "a",
                           "options": bad})  # fmt: skip
        rejected = only(step_raw(c.state, line, 100 + number), F.CommandRejected)
        assert rejected.command_kind == "SetQuotaShareOptions" and field in rejected.status_reason
    assert c.state.queues["q"].shares["a"].options is None  # nothing was set


def test_a_command_file_with_options_replays_to_the_same_facts_twice():
    lines = [json.dumps(line) for line in (
        {"kind": "CreateServiceEnvironment", "at": 0, "serviceEnvironmentName": "se",
         "capacityLimits": [{"capacityUnit": "g", "maxCapacity": 1}]},
        {"kind": "CreateSchedulingPolicy", "at": 0, "name": "sp",
         "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
        {"kind": "CreateJobQueue", "at": 0, "jobQueueName": "q", "schedulingPolicy": "sp",
         "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
        {"kind": "CreateQuotaShare", "at": 0, "jobQueue": "q", "quotaShareName": "a",
         "capacityLimits": [{"capacityUnit": "g", "maxCapacity": 1}],
         "resourceSharingConfiguration": {"strategy": "RESERVE"},
         "preemptionConfiguration": {"inSharePreemption": "ENABLED"}},
        {"kind": "SetQuotaShareOptions", "at": 0, "jobQueue": "q", "quotaShareName": "a",
         "options": {"minRuntimeBeforePreemptionSeconds": 90}},
        {"kind": "SubmitServiceJob", "at": 0, "jobId": "lo", "jobName": "lo", "jobQueue": "q",
         "quotaShareName": "a", "schedulingPriority": 1, "capacityUsage": [{"capacityUnit": "g", "quantity": 1}]},
        {"kind": "SubmitServiceJob", "at": 10, "jobId": "hi", "jobName": "hi", "jobQueue": "q",
         "quotaShareName": "a", "schedulingPriority": 9, "capacityUsage": [{"capacityUnit": "g", "quantity": 1}]},
        {"kind": "Tick", "at": 100},
    )]  # fmt: skip
    first = [fact.model_dump_json(by_alias=True) for fact in replay_lines(lines)]
    assert first == [fact.model_dump_json(by_alias=True) for fact in replay_lines(lines)]
    preempted = [json.loads(text) for text in first if '"JobPreempted"' in text]
    assert [(fact["jobId"], fact["at"]) for fact in preempted] == [("lo", 90.0)]


# -- lending limits --------------------------------------------------------------------------


def lender_and_borrower(cap: int | None) -> Cluster:
    """Capacity 5; a: LEND_AND_BORROW 1; b: LEND 4, lending at most `cap` (None: no limit)."""
    c = Cluster()
    c.environment(g5=5)
    c.queue()
    c.share("a", "LEND_AND_BORROW", g5=1)
    c.share("b", "LEND", g5=4)
    if cap is not None:
        c.options("b", lendingLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": cap}])
    return c


def test_a_lending_limit_caps_what_others_borrow_and_spares_the_lender_a_reclaim():
    """a submits four 1-instance jobs at t=1: a1 runs on a's own instance and b lends at most 2,
    so a2 and a3 borrow and a4 waits although b has 4 idle.  b's own b1 and b2 (t=2) then fit
    with no reclaim: b's idle (3, then 2) still covers the 2 it lends.  Without the limit a
    borrows 3, and b2 must reclaim a4."""
    c = lender_and_borrower(2)
    for name in ("a1", "a2", "a3", "a4"):
        c.submit(name, "a", at=1)
    assert c.dispatched() == {"a1", "a2", "a3"}
    for name in ("b1", "b2"):
        assert preempted_ids(c.submit(name, "b", at=2)) == []
    assert c.dispatched() == {"a1", "a2", "a3", "b1", "b2"}

    aws = lender_and_borrower(None)
    for name in ("a1", "a2", "a3", "a4"):
        aws.submit(name, "a", at=1)
    assert aws.dispatched() == {"a1", "a2", "a3", "a4"}
    aws.submit("b1", "b", at=2)
    assert preempted_ids(aws.submit("b2", "b", at=2)) == ["a4"]


def test_a_job_that_needs_more_than_can_ever_be_lent_blocks_its_share():
    """a (limit 1) asks for 4 at once: 3 beyond its limit, but b lends at most 2 (spec 3.2:
    the borrowable pool is the other lenders' lendable quota), so a's head can never fit."""
    c = lender_and_borrower(2)
    blocked = only(c.submit("wide", "a", n=4, at=1), F.ShareBlocked)
    assert blocked.status_reason.endswith("Job requires borrowing that exceeds all configured borrowable capacity.")
    assert dispatched_ids(lender_and_borrower(3).submit("wide", "a", n=4, at=1)) == ["wide"]


def test_lowering_a_lending_limit_preempts_nothing_and_reclaims_only_what_capacity_needs():
    """a borrows 3 of b's idle; b's limit drops to 1 (t=5): nothing is preempted (a
    configuration change, ruling 3), and the borrowing is no longer backed.  b1 (t=6) still
    fits without a reclaim: b's own idle (4, then 3) stays above the 1 it lends, so the unbacked
    part does not grow (ruling 1 asks no more).  b2 (t=7) finds the environment full (5 of 5)
    and reclaims one instance, the most recent borrower a4; a keeps borrowing 2 that b, lending
    1, does not back: as after a lowered limit, it is taken back only as b needs it."""
    c = lender_and_borrower(None)
    for name in ("a1", "a2", "a3", "a4"):
        c.submit(name, "a", at=1)
    lowered = c.options("b", at=5, lendingLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}])
    assert kinds(lowered) == ["QuotaShareOptionsSet"]
    assert preempted_ids(c.submit("b1", "b", at=6)) == []
    facts = c.submit("b2", "b", at=7)
    assert preempted_ids(facts) == ["a4"] and dispatch_of(facts, "b2").at == 7


def test_explain_names_the_option_that_holds_a_job_back():
    from quotasched.services.explain import explain, render

    c = lend_pair()
    c.options("a", minRuntimeBeforePreemptionSeconds=600)
    c.submit("a1", "a", at=10)
    c.submit("a2", "a", at=10)
    c.submit("b1", "b", at=100)
    told = render(explain(iter(c.facts), "b1"), "b1")
    assert ("a2 of a may not be preempted before t=610 s (a's minimum runtime before "
            "preemption is 600 s, an option beyond AWS)") in told

    capped = lender_and_borrower(2)
    for name in ("a1", "a2", "a3", "a4"):
        capped.submit(name, "a", at=1)
    told = render(explain(iter(capped.facts), "a4"), "a4")
    assert "b (LEND) uses 0 of its limit 4, 4 idle (lends at most 2: its lending limit)" in told
