"""Acceptance scenarios A1-A22 of the behaviour spec (aws-quota-management.md, section 8).

Every expected value below was worked out by hand from the spec (section 0 rulings first, then
sections 2 and 3).  Reason strings are spelled out here, copied from the spec, rather than
imported from the implementation, so a wrong constant in the code fails these tests.
"""

from __future__ import annotations

import json

import pytest

from quotasched.events import facts as F
from quotasched.events.codec import DecodeError
from quotasched.services.scheduler.core import state_document
from tests.builders import (
    G5,
    M5,
    M5L,
    Cluster,
    borrowed,
    changes_of,
    dispatch_of,
    dispatched_ids,
    kinds,
    of_kind,
    only,
)

# -- reason strings quoted from the spec (3.2 and section 2) ---------------------------------

SE_MAX_RESOURCE = (
    "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE - Service environment(s) associated with "
    "the job queue cannot meet the capacity requirement of the job."
)
LIMIT_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requirements exceed quota share capacity limits."
)
LIMIT_AND_BORROW_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requirements exceed quota share capacity limits and borrow limits."
)
BORROWABLE_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requires borrowing that exceeds all configured borrowable capacity."
)
CAPACITY_BOUNCED = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Unable to provision requested compute resources"
)


def notebook_after_a1() -> Cluster:
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)
    c.submit("low", "qs1", priority=1)
    return c


def notebook_after_a2() -> Cluster:
    c = notebook_after_a1()
    c.submit("qs2_job_1", "qs2", priority=1)
    return c


# -- A1 -- A3: the official notebook ---------------------------------------------------------


def test_a01_borrows_from_a_lend_share_and_reserve_lends_nothing():
    c = Cluster.notebook()
    high = dispatch_of(c.submit("high", "qs1", priority=3), "high")
    assert borrowed(high) == {}  # on QS1's own quota
    med = dispatch_of(c.submit("med", "qs1", priority=2), "med")
    assert borrowed(med) == {G5: 1}  # QS2's idle instance
    facts = c.submit("low", "qs1", priority=1)
    # borrowLimit 200 would allow 2 more, but QS3 is RESERVE: low simply waits, not blocked.
    assert of_kind(facts, F.JobDispatched) == []
    assert of_kind(facts, F.ShareBlocked) == []
    assert c.status("high") == "SCHEDULED"
    assert c.status("med") == "SCHEDULED"
    assert c.status("low") == "RUNNABLE"
    assert c.job("low")["statusReason"] is None
    assert c.usage("qs1") == 2
    assert c.total() == 2
    assert (c.usage("qs2"), c.usage("qs3")) == (0, 0)


def test_a02_lend_share_reclaims_its_instance_from_a_borrower_whatever_the_priorities():
    c = notebook_after_a1()
    facts = c.submit("qs2_job_1", "qs2", priority=1)
    preempted = only(facts, F.JobPreempted)
    assert preempted.job_id == "med"
    assert preempted.reason.value == "CROSS_SHARE_RECLAIM"
    assert preempted.outcome.value == "REQUEUED"
    assert preempted.preempted_attempt_count == 1
    assert preempted.attempt == 1  # the attempt that joins recentPreemptedAttempts
    assert preempted.preemptor_job_id == "qs2_job_1"
    assert c.status("med") == "RUNNABLE"
    assert c.job("med")["preemptedAttemptCount"] == 1
    dispatch = dispatch_of(facts, "qs2_job_1")
    assert dispatch.after_preemption_of == ["med"]
    assert borrowed(dispatch) == {}
    assert c.status("qs2_job_1") == "SCHEDULED"
    assert c.status("high") == "SCHEDULED"  # high keeps running
    assert c.status("low") == "RUNNABLE"
    assert (c.usage("qs1"), c.usage("qs2"), c.usage("qs3")) == (1, 1, 0)


def test_a03_raising_a_priority_preempts_a_lower_priority_job_of_the_same_share():
    c = notebook_after_a2()
    facts = c.prioritize("low", 4)
    assert only(facts, F.JobPriorityUpdated).scheduling_priority == 4
    preempted = only(facts, F.JobPreempted)
    assert preempted.job_id == "high"
    assert preempted.reason.value == "IN_SHARE_PRIORITY"
    assert preempted.outcome.value == "REQUEUED"
    assert preempted.preempted_attempt_count == 1
    dispatch = only(facts, F.JobDispatched)
    assert dispatch.job_id == "low"
    assert dispatch.after_preemption_of == ["high"]
    assert borrowed(dispatch) == {}
    assert c.status("high") == "RUNNABLE"
    assert c.status("low") == "SCHEDULED"
    # med (p2) is below high (p3): it stays RUNNABLE and preempts nothing.
    assert c.status("med") == "RUNNABLE"
    assert c.job("med")["preemptedAttemptCount"] == 1  # unchanged since A2
    # QS2 and QS3 are unaffected.
    assert c.status("qs2_job_1") == "SCHEDULED"
    assert (c.usage("qs1"), c.usage("qs2"), c.usage("qs3")) == (1, 1, 0)
    touched = {getattr(fact, "job_id", None) for fact in facts}
    assert "qs2_job_1" not in touched


# -- A4 -- A6: isolation and ceilings ---------------------------------------------------------


def test_a04_a_reserve_share_never_borrows_even_with_idle_instances_in_the_environment():
    c = Cluster.notebook()
    c.submit("r1", "qs3")
    facts = c.submit("r2", "qs3")
    assert c.status("r1") == "SCHEDULED"
    assert c.status("r2") == "RUNNABLE"
    assert of_kind(facts, F.ShareBlocked) == []
    assert c.total() == 1  # two instances sit idle in the SE


def test_a05_a_lend_share_never_borrows_even_when_another_share_could_lend():
    c = Cluster.notebook()
    c.submit("l1", "qs2")
    c.submit("l2", "qs2")
    c.submit("l3", "qs2")
    assert c.status("l1") == "SCHEDULED"
    assert (c.status("l2"), c.status("l3")) == ("RUNNABLE", "RUNNABLE")
    assert c.usage("qs2") == 1
    assert c.total() == 1  # QS1's instance stays idle


def test_a06_borrowing_stops_at_the_borrow_limit_and_a_too_large_job_is_blocked():
    c = Cluster()
    c.environment(m5=20)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=50, m5=2)
    c.share("B", "LEND", m5=10)
    facts = []
    for job_id in ("a1", "a2", "a3", "a4"):
        facts += c.submit(job_id, "A", unit="m5")
    # 2 own + 1 borrowed (2 x 50 %); the 4th waits without being blocked.
    assert dispatched_ids(facts) == ["a1", "a2", "a3"]
    assert borrowed(dispatch_of(facts, "a3")) == {M5: 1}
    assert c.status("a4") == "RUNNABLE"
    assert of_kind(facts, F.ShareBlocked) == []
    assert c.job("a4")["statusReason"] is None
    assert c.usage("A", "m5") == 3
    # A 4-instance job (4 > 2 + 1) at the head of A is blocked.
    facts = c.submit("big", "A", priority=9, n=4, unit="m5")
    blocked = only(facts, F.ShareBlocked)
    assert (blocked.quota_share_name, blocked.job_id) == ("A", "big")
    assert blocked.status_reason == LIMIT_AND_BORROW_EXCEEDED
    assert c.status("big") == "RUNNABLE"
    assert c.job("big")["statusReason"] == LIMIT_AND_BORROW_EXCEEDED


# -- A7 -- A9: blocked heads ------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["RESERVE", "LEND"])
def test_a07_a_job_larger_than_its_share_limit_is_blocked_then_terminated_by_the_time_limit(
    strategy,
):
    c = Cluster()
    c.environment(m5=10)
    c.queue(jobStateTimeLimitActions=[{
        "state": "RUNNABLE", "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
        "maxTimeSeconds": 600, "action": "TERMINATE",
    }])  # fmt: skip
    c.share("S", strategy, m5=4)
    facts = c.submit("big", "S", n=5, unit="m5", at=10)
    blocked = only(facts, F.ShareBlocked)
    assert (blocked.quota_share_name, blocked.job_id) == ("S", "big")
    assert blocked.status_reason == LIMIT_EXCEEDED
    assert c.status("big") == "RUNNABLE"
    assert c.job("big")["statusReason"] == LIMIT_EXCEEDED
    # A job behind the blocked head waits (strict head of line).
    c.submit("next", "S", n=1, unit="m5", at=20)
    assert c.status("next") == "RUNNABLE"
    assert c.tick(609) == []
    assert c.status("big") == "RUNNABLE"
    facts = c.tick(610)
    (failed,) = changes_of(facts, "big")
    assert failed.status.value == "FAILED"
    assert failed.status_reason == (
        "Terminated by JobStateTimeLimit action due to reason: "
        "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
    )
    assert c.status("big") == "FAILED"
    assert c.job("big")["statusReason"] == failed.status_reason
    # The job behind it can now advance.
    assert dispatched_ids(facts) == ["next"]
    assert c.status("next") == "SCHEDULED"


def _two_borrowers() -> Cluster:
    c = Cluster()
    c.environment(m5=12)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=200, m5=4)
    c.share("B", "LEND_AND_BORROW", borrow=200, m5=4)
    return c


def test_a08_a_job_needing_more_than_all_borrowable_capacity_is_blocked_but_one_that_fits_is_not():
    c = _two_borrowers()
    facts = c.submit("ten", "A", n=10, unit="m5")
    blocked = only(facts, F.ShareBlocked)
    assert (blocked.quota_share_name, blocked.job_id) == ("A", "ten")
    assert blocked.status_reason == BORROWABLE_EXCEEDED
    assert c.status("ten") == "RUNNABLE"
    assert c.job("ten")["statusReason"] == BORROWABLE_EXCEEDED
    assert c.usage("A", "m5") == 0
    # Positive case: 8 = own 4 + B's idle 4.
    c = _two_borrowers()
    facts = c.submit("eight", "A", n=8, unit="m5")
    assert of_kind(facts, F.ShareBlocked) == []
    dispatch = dispatch_of(facts, "eight")
    assert borrowed(dispatch) == {M5: 4}
    assert c.status("eight") == "SCHEDULED"
    assert c.usage("A", "m5") == 8


def test_a09_a_job_larger_than_the_service_environment_is_blocked_with_the_environment_reason():
    c = Cluster()
    c.environment(m5=10)
    c.queue()
    c.share("X", "LEND_AND_BORROW", borrow=100, m5=10)
    c.share("Y", "LEND", m5=5)
    facts = c.submit("twelve", "X", n=12, unit="m5")
    blocked = only(facts, F.ShareBlocked)
    assert (blocked.quota_share_name, blocked.job_id) == ("X", "twelve")
    assert blocked.status_reason == SE_MAX_RESOURCE  # checked before the share's 15
    assert c.status("twelve") == "RUNNABLE"
    assert c.job("twelve")["statusReason"] == SE_MAX_RESOURCE
    assert c.total("m5") == 0


# -- A10 -- A11: preemption retries -----------------------------------------------------------


def test_a10_a_job_with_zero_preemption_retries_fails_on_its_first_preemption():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    facts = c.submit("med", "qs1", priority=2,
                     preemptionConfiguration={"preemptionRetriesBeforeTermination": 0})  # fmt: skip
    assert borrowed(dispatch_of(facts, "med")) == {G5: 1}
    assert c.dispatched() == {"high", "med"}
    facts = c.submit("qs2_job", "qs2", priority=1)
    preempted = only(facts, F.JobPreempted)
    assert preempted.job_id == "med"
    assert preempted.outcome.value == "FAILED"
    assert preempted.preempted_attempt_count == 1
    assert c.status("med") == "FAILED"
    assert dispatch_of(facts, "qs2_job").after_preemption_of == ["med"]
    assert c.status("qs2_job") == "SCHEDULED"
    # Not requeued: freeing the borrowed instance again does not bring med back.
    facts = c.finish("qs2_job")
    assert "med" not in dispatched_ids(facts)
    assert c.status("med") == "FAILED"


def _preempt_med_repeatedly(retries: int | None, rounds: int):
    """A10's loop: med borrows QS2's instance, a QS2 job reclaims it, the QS2 job finishes."""
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    extra = {}
    if retries is not None:
        extra["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": retries}
    c.submit("med", "qs1", priority=2, **extra)
    seen = []
    for i in range(1, rounds + 1):
        assert c.status("med") == "SCHEDULED"
        facts = c.submit(f"qs2_job_{i}", "qs2", priority=1)
        preempted = only(facts, F.JobPreempted)
        assert preempted.job_id == "med"
        seen.append((preempted.outcome.value, preempted.preempted_attempt_count,
                     c.status("med"), c.job("med")["preemptedAttemptCount"]))  # fmt: skip
        facts = c.finish(f"qs2_job_{i}")
        if c.status("med") == "FAILED":
            assert "med" not in dispatched_ids(facts)
            break
        # med is dispatched again by borrowing QS2's idle instance.
        assert borrowed(dispatch_of(facts, "med")) == {G5: 1}
    return c, seen


def test_a11_a_job_with_two_preemption_retries_is_requeued_twice_and_fails_on_the_third():
    c, seen = _preempt_med_repeatedly(retries=2, rounds=5)
    assert seen == [
        ("REQUEUED", 1, "RUNNABLE", 1),
        ("REQUEUED", 2, "RUNNABLE", 2),
        ("FAILED", 3, "FAILED", 3),
    ]
    assert c.status("med") == "FAILED"


def test_a11_a_job_without_preemption_retries_is_requeued_every_time():
    c, seen = _preempt_med_repeatedly(retries=None, rounds=5)
    assert seen == [("REQUEUED", n, "RUNNABLE", n) for n in range(1, 6)]
    assert c.status("med") == "SCHEDULED"
    assert c.job("med")["preemptedAttemptCount"] == 5


# -- A12 -- A13: one slot ---------------------------------------------------------------------


def _single_slot(in_share: bool) -> Cluster:
    c = Cluster()
    c.environment(g5=1)
    c.queue()
    c.share("S", "RESERVE", in_share=in_share, g5=1)
    return c


def test_a12_with_in_share_preemption_disabled_a_higher_priority_job_waits_for_the_slot():
    c = _single_slot(in_share=False)
    c.submit("L", "S", priority=1)
    assert c.status("L") == "SCHEDULED"
    facts = c.submit("H", "S", priority=9)
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("H") == "RUNNABLE"
    assert c.status("L") == "SCHEDULED"
    facts = c.finish("L")
    assert c.status("L") == "SUCCEEDED"
    assert dispatched_ids(facts) == ["H"]
    assert dispatch_of(facts, "H").after_preemption_of == []
    assert c.status("H") == "SCHEDULED"


def test_a12_with_in_share_preemption_enabled_a_higher_priority_job_preempts_at_once():
    c = _single_slot(in_share=True)
    c.submit("L", "S", priority=1)
    facts = c.submit("H", "S", priority=9)
    preempted = only(facts, F.JobPreempted)
    assert (preempted.job_id, preempted.reason.value, preempted.outcome.value) == (
        "L", "IN_SHARE_PRIORITY", "REQUEUED"
    )
    assert dispatch_of(facts, "H").after_preemption_of == ["L"]
    assert c.status("L") == "RUNNABLE"
    assert c.status("H") == "SCHEDULED"


def test_a13_equal_priorities_are_served_first_in_first_out():
    c = _single_slot(in_share=False)
    c.submit("busy", "S", priority=0, at=0)
    c.submit("X", "S", priority=5, at=1)
    c.submit("Y", "S", priority=5, at=2)
    facts = c.finish("busy")
    assert dispatched_ids(facts) == ["X"]
    assert c.status("Y") == "RUNNABLE"
    facts = c.finish("X")
    assert dispatched_ids(facts) == ["Y"]


def test_a13_a_later_higher_priority_job_goes_ahead_of_earlier_equal_priority_jobs():
    c = _single_slot(in_share=False)
    c.submit("busy", "S", priority=0, at=0)
    c.submit("X", "S", priority=5, at=1)
    c.submit("Y", "S", priority=5, at=2)
    c.submit("Z", "S", priority=6, at=3)
    order = []
    for running in ("busy", "Z", "X"):
        order += dispatched_ids(c.finish(running))
    assert order == ["Z", "X", "Y"]


def test_a13_an_equal_priority_job_never_preempts_in_share():
    c = _single_slot(in_share=True)
    c.submit("X", "S", priority=5, at=1)
    facts = c.submit("Y", "S", priority=5, at=2)
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("X") == "SCHEDULED"
    assert c.status("Y") == "RUNNABLE"


# -- A14: lowering a limit --------------------------------------------------------------------


def test_a14_a_lowered_limit_preempts_nothing_until_another_share_needs_its_own_capacity():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND", g5=2)
    c.share("B", "LEND_AND_BORROW", borrow=100, g5=1)
    # 1. A runs a1 (p1) and a2 (p5); B runs b1.  The SE is full.
    c.submit("a1", "A", priority=1)
    c.submit("a2", "A", priority=5)
    c.submit("b1", "B")
    assert c.dispatched() == {"a1", "a2", "b1"}
    assert c.total() == 3
    # 2. Lowering A's limit preempts nothing; A is now 1 over its limit.
    facts = c.update_share("A", capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}])
    assert of_kind(facts, F.JobPreempted) == []
    assert c.dispatched() == {"a1", "a2", "b1"}
    assert c.usage("A") == 2
    # 3. b2 would borrow; a borrower can't trigger preemption and nobody has idle capacity.
    facts = c.submit("b2", "B")
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("b2") == "RUNNABLE"
    # 4. Raising B's limit makes b2 fit B's own quota: A's excess is reclaimed, a1 first.
    facts = c.update_share("B", capacityLimits=[{"capacityUnit": G5, "maxCapacity": 2}])
    preempted = only(facts, F.JobPreempted)
    assert preempted.job_id == "a1"
    assert preempted.reason.value == "CROSS_SHARE_RECLAIM"
    assert preempted.outcome.value == "REQUEUED"
    assert c.status("a1") == "RUNNABLE"
    assert c.status("a2") == "SCHEDULED"
    dispatch = dispatch_of(facts, "b2")
    assert dispatch.after_preemption_of == ["a1"]
    assert borrowed(dispatch) == {}
    assert c.status("b2") == "SCHEDULED"
    assert (c.usage("A"), c.usage("B"), c.total()) == (1, 2, 3)


# -- A15: disabling and deleting a share ------------------------------------------------------


def test_a15_a_disabled_share_refuses_submissions_and_deleting_it_fails_its_remaining_jobs():
    c = Cluster()
    c.environment(g5=1)
    c.queue()
    c.share("S", "RESERVE", g5=1)
    # 1. One RUNNING and (here two) RUNNABLE jobs.
    c.submit("r1", "S")
    c.report("r1", "RUNNING", attempt=1)
    c.submit("r2", "S")
    c.submit("r3", "S")
    assert (c.status("r1"), c.status("r2"), c.status("r3")) == ("RUNNING", "RUNNABLE", "RUNNABLE")
    # 3. Deleting while still ENABLED is refused and changes nothing.
    facts = c.command("DeleteQuotaShare", jobQueue="q", quotaShareName="S")
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "DeleteQuotaShare"
    assert rejected.quota_share_name == "S"
    assert kinds(facts) == ["CommandRejected"]
    assert "S" in c.state.queues["q"].shares
    assert (c.status("r1"), c.status("r2"), c.status("r3")) == ("RUNNING", "RUNNABLE", "RUNNABLE")
    # 2. Disable: new submissions are refused; the running job continues.
    facts = c.update_share("S", state="DISABLED")
    assert only(facts, F.QuotaShareUpdated).state.value == "DISABLED"
    assert c.status("r1") == "RUNNING"
    facts = c.submit("r4", "S")
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "SubmitServiceJob"
    assert rejected.job_id == "r4"
    assert "r4" not in c.state.jobs
    assert of_kind(facts, F.JobSubmitted) == []
    # ... and a RUNNABLE job can still be dispatched.
    facts = c.finish("r1")
    assert dispatched_ids(facts) == ["r2"]
    assert c.status("r2") == "SCHEDULED"
    # 4. Delete after disabling: the remaining jobs end FAILED, terminated.
    facts = c.command("DeleteQuotaShare", jobQueue="q", quotaShareName="S")
    assert of_kind(facts, F.CommandRejected) == []
    only(facts, F.QuotaShareDeleted)
    for job_id in ("r2", "r3"):
        (change,) = changes_of(facts, job_id)
        assert change.status.value == "FAILED"
        assert change.is_terminated is True
        assert c.status(job_id) == "FAILED"
    assert c.status("r1") == "SUCCEEDED"
    assert c.total() == 0
    # ... and the share no longer exists.
    facts = c.update_share("S", state="ENABLED")
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "UpdateQuotaShare"
    assert "does not exist" in rejected.status_reason


# -- A16: validation --------------------------------------------------------------------------


def _submit_fields(**overrides):
    fields = {"jobId": "j", "jobName": "j", "jobQueue": "q", "quotaShareName": "qs1",
              "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip
    fields.update(overrides)
    return {key: value for key, value in fields.items() if value is not None}


def _share_fields(**overrides):
    fields = {
        "jobQueue": "q", "quotaShareName": "s",
        "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
        "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 100},
        "preemptionConfiguration": {"inSharePreemption": "DISABLED"},
    }  # fmt: skip
    fields.update(overrides)
    return fields


@pytest.mark.parametrize(
    ("kind", "fields", "names"),
    [
        ("SubmitServiceJob", _submit_fields(quotaShareName=None), "quotaShareName"),
        ("SubmitServiceJob", _submit_fields(shareIdentifier="team"), "shareIdentifier"),
        ("SubmitServiceJob", _submit_fields(schedulingPriority=10000), "schedulingPriority"),
        ("SubmitServiceJob", _submit_fields(retryStrategy={"attempts": 11}),
         "retryStrategy.attempts"),
        ("CreateQuotaShare", _share_fields(capacityLimits=[
            {"capacityUnit": f"ml.type{i}.xlarge", "maxCapacity": 1} for i in range(6)
        ]), "capacityLimits"),
        ("CreateQuotaShare", _share_fields(quotaShareName="s" * 129), "quotaShareName"),
        ("CreateQuotaShare", _share_fields(quotaShareName="team.a"), "quotaShareName"),
        ("CreateQuotaShare", _share_fields(
            resourceSharingConfiguration={"strategy": "LEND", "borrowLimit": 100}
        ), "borrowLimit"),
        ("CreateQuotaShare", _share_fields(
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 0}]
        ), "maxCapacity"),
    ],
    ids=["no-quotaShareName", "shareIdentifier", "priority-10000", "attempts-11",
         "6-capacity-limits", "name-129-chars", "name-with-dot", "borrowLimit-on-LEND",
         "maxCapacity-0"],  # fmt: skip
)
def test_a16_malformed_requests_are_refused_with_a_message_naming_the_problem(kind, fields, names):
    c = Cluster.notebook()
    shares_before = list(c.state.queues["q"].shares)
    with pytest.raises(DecodeError) as error:
        c.command(kind, **fields)
    assert names in str(error.value)
    assert error.value.kind == kind
    assert c.state.jobs == {}
    assert list(c.state.queues["q"].shares) == shares_before


def test_a16_a_valid_128_character_share_name_is_accepted():
    c = Cluster.notebook()
    facts = c.command("CreateQuotaShare", **_share_fields(quotaShareName="s" * 128))
    assert kinds(facts) == ["QuotaShareCreated"]


def test_a16_a_twenty_first_quota_share_on_a_queue_is_rejected():
    c = Cluster()
    c.environment(g5=40)
    c.queue()
    for i in range(20):
        assert kinds(c.share(f"s{i:02d}", g5=1)) == ["QuotaShareCreated"]
    facts = c.share("s20", g5=1)
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "CreateQuotaShare"
    assert rejected.quota_share_name == "s20"
    assert len(c.state.queues["q"].shares) == 20
    assert "s20" not in c.state.queues["q"].shares


def test_a16_a_submission_naming_an_unknown_share_is_rejected():
    c = Cluster.notebook()
    facts = c.submit("j", "nope")
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "SubmitServiceJob"
    assert rejected.job_id == "j"
    assert "j" not in c.state.jobs


# -- A17: FIFO assignment of idle capacity ----------------------------------------------------


def _a17(first: str, second: str) -> Cluster:
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("C", "LEND", g5=1)
    c.submit("a1", "A", at=0)
    c.submit("b1", "B", at=0)
    c.submit("c1", "C", at=0)
    assert c.total() == 3
    c.submit(first, first[0], at=1)
    c.submit(second, second[0], at=2)
    assert (c.status(first), c.status(second)) == ("RUNNABLE", "RUNNABLE")
    return c


@pytest.mark.parametrize(("first", "second"), [("A2", "B2"), ("B2", "A2")])
def test_a17_idle_lendable_capacity_goes_to_the_earliest_borrower_and_is_reclaimed_by_its_owner(
    first, second,
):
    c = _a17(first, second)
    facts = c.finish("c1")  # C has nothing queued: its instance becomes idle and lendable
    assert dispatched_ids(facts) == [first]
    assert borrowed(dispatch_of(facts, first)) == {G5: 1}
    assert c.status(second) == "RUNNABLE"
    # C reclaims its instance from the borrower.
    facts = c.submit("c2", "C")
    preempted = only(facts, F.JobPreempted)
    assert (preempted.job_id, preempted.reason.value) == (first, "CROSS_SHARE_RECLAIM")
    assert dispatch_of(facts, "c2").after_preemption_of == [first]
    assert c.status(first) == "RUNNABLE"
    assert c.status(second) == "RUNNABLE"
    assert c.dispatched() == {"a1", "b1", "c2"}


# -- A18 -- A19: several units; unowned capacity -----------------------------------------------


def test_a18_each_capacity_unit_of_a_share_is_accounted_separately():
    c = Cluster()
    c.environment(m5l=10, m5=5)
    c.queue()
    c.share("TeamAShare", "LEND_AND_BORROW", borrow=200, m5l=10, m5=5)
    c.submit("large6", "TeamAShare", n=6, unit="m5l")
    c.submit("large4", "TeamAShare", n=4, unit="m5l")
    assert c.usage("TeamAShare", "m5l") == 10
    facts = c.submit("xl5", "TeamAShare", n=5, unit="m5")
    dispatch = dispatch_of(facts, "xl5")
    assert borrowed(dispatch) == {}
    assert c.dispatched() == {"large6", "large4", "xl5"}
    document = state_document(c.state)["queues"]["q"]
    assert document["quotaShares"]["TeamAShare"] == {M5L: 10, M5: 5}
    assert document["totalCapacityUsage"] == {M5L: 10, M5: 5}


def test_a19_environment_capacity_no_share_owns_is_never_used():
    c = Cluster()
    c.environment(g5=5)
    c.queue()
    c.share("only", "LEND_AND_BORROW", borrow=-1, g5=2)
    facts = []
    for job_id in ("j1", "j2", "j3", "j4"):
        facts += c.submit(job_id, "only")
    assert dispatched_ids(facts) == ["j1", "j2"]
    assert (c.status("j3"), c.status("j4")) == ("RUNNABLE", "RUNNABLE")
    assert of_kind(facts, F.ShareBlocked) == []
    assert c.total() == 2


# -- A20 -- A21: capacity bounce, termination -------------------------------------------------


def test_a20_a_capacity_bounce_returns_the_job_to_runnable_without_using_a_retry_or_a_preemption():
    c = _single_slot(in_share=False)
    c.submit("j", "S", priority=1, retryStrategy={"attempts": 2})
    c.submit("k", "S", priority=5)  # waits behind j; will take the slot j gives back
    assert c.status("j") == "SCHEDULED"
    facts = c.report("j", "INSUFFICIENT_CAPACITY", attempt=1)
    (bounce,) = changes_of(facts, "j")
    assert bounce.status.value == "RUNNABLE"
    assert bounce.status_reason == CAPACITY_BOUNCED
    assert c.status("j") == "RUNNABLE"
    assert c.job("j")["statusReason"] == CAPACITY_BOUNCED
    assert c.job("j")["preemptedAttemptCount"] == 0
    assert of_kind(facts, F.JobPreempted) == []
    assert dispatched_ids(facts) == ["k"]  # the capacity was released
    # j is dispatched again; a failed attempt is still retried: the bounce used no attempt.
    facts = c.finish("k")
    assert dispatched_ids(facts) == ["j"]
    facts = c.finish("j", "FAILED")
    (retry,) = changes_of(facts, "j")
    assert retry.status.value == "RUNNABLE"
    assert dispatched_ids(facts) == ["j"]
    facts = c.finish("j", "FAILED")
    assert c.status("j") == "FAILED"
    assert c.job("j")["preemptedAttemptCount"] == 0


def test_a21_terminating_a_runnable_or_scheduled_job_fails_it_as_terminated_with_the_reason():
    c = Cluster.notebook()
    c.submit("s1", "qs3")
    c.submit("s2", "qs3")
    c.submit("s3", "qs3")
    assert (c.status("s1"), c.status("s2")) == ("SCHEDULED", "RUNNABLE")
    facts = c.terminate("s2", reason="no longer needed")
    (change,) = changes_of(facts, "s2")
    assert change.status.value == "FAILED"
    assert change.is_terminated is True
    assert "no longer needed" in change.status_reason
    assert c.status("s2") == "FAILED"
    assert "no longer needed" in c.job("s2")["statusReason"]
    assert c.status("s1") == "SCHEDULED"
    # From SCHEDULED: the job is stopped, its capacity freed, the next job dispatched.
    facts = c.terminate("s1", reason="stop the training job")
    (change,) = changes_of(facts, "s1")
    assert change.status.value == "FAILED"
    assert change.is_terminated is True
    assert "stop the training job" in change.status_reason
    assert c.status("s1") == "FAILED"
    assert dispatched_ids(facts) == ["s3"]
    assert c.usage("qs3") == 1


# -- A22: snapshot arithmetic -----------------------------------------------------------------


def test_a22_the_snapshot_totals_sum_the_shares_dispatched_instances():
    c = Cluster()
    c.environment(m5l=9)
    c.queue()
    c.share("team-a-share", "RESERVE", m5l=5)
    c.share("team-b-share", "RESERVE", m5l=4)
    c.submit("a3", "team-a-share", n=3, unit="m5l")
    c.submit("a2", "team-a-share", n=2, unit="m5l")
    for i in range(4):
        c.submit(f"b{i}", "team-b-share", unit="m5l")
    c.submit("a-waiting", "team-a-share", unit="m5l")
    document = state_document(c.state)["queues"]["q"]
    assert document["totalCapacityUsage"] == {M5L: 9.0}
    assert document["quotaShares"] == {"team-a-share": {M5L: 5.0}, "team-b-share": {M5L: 4.0}}
    # Front of each share: team-a's first RUNNABLE job; team-b has none.
    shares = c.state.queues["q"].shares
    assert c.state.head(shares["team-a-share"]).job_id == "a-waiting"
    assert c.state.head(shares["team-b-share"]) is None
    assert json.dumps(document)  # plain JSON, as `replay --state-out` writes it
