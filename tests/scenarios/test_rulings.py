"""The rulings of section 0 of the behaviour spec, one or more named tests each, plus the job
lifecycle rules around them (timeouts, retries, stale reports, idempotency, several queues,
several units, a DISABLED service environment, updates of finished jobs).

Expected values are worked out by hand from the spec; reason strings are quoted from it.
"""

from __future__ import annotations

from quotasched.events import facts as F
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
    preempted_ids,
)

LIMIT_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requirements exceed quota share capacity limits."
)


def limits(**capacity: int) -> list[dict]:
    units = {"g5": G5, "m5": M5, "m5l": M5L}
    return [{"capacityUnit": units.get(u, u), "maxCapacity": n} for u, n in capacity.items()]


# -- ruling 1: borrowing is always backed -----------------------------------------------------


def test_ruling1_a_lend_shares_head_reclaims_from_a_borrower_although_a_reserve_instance_is_free():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)  # borrows QS2's idle instance
    assert c.total() == 2  # one free instance in the SE, but it is QS3's (RESERVE)
    facts = c.submit("q2", "qs2", priority=0)
    assert preempted_ids(facts) == ["med"]
    assert only(facts, F.JobPreempted).reason.value == "CROSS_SHARE_RECLAIM"
    assert dispatch_of(facts, "q2").after_preemption_of == ["med"]
    assert c.total() == 2
    # QS3's instance was kept for QS3.
    facts = c.submit("q3", "qs3")
    assert dispatched_ids(facts) == ["q3"]
    assert of_kind(facts, F.JobPreempted) == []
    assert c.total() == 3


def test_ruling1_a_lender_reclaims_rather_than_use_capacity_that_no_share_owns():
    c = Cluster()
    c.environment(g5=5)  # limits add up to 3: two instances belong to nobody
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=2)
    c.share("C", "LEND_AND_BORROW", borrow=200, g5=1)
    facts = c.submit("c1", "C") + c.submit("c2", "C") + c.submit("c3", "C")
    assert borrowed(dispatch_of(facts, "c1")) == {}
    assert borrowed(dispatch_of(facts, "c2")) == {G5: 1}
    assert borrowed(dispatch_of(facts, "c3")) == {G5: 1}
    assert c.total() == 3
    # a1 fits A's own limit and the SE has 2 free instances, but A's idle capacity is lent
    # out: the most recently dispatched borrower is reclaimed.
    facts = c.submit("a1", "A")
    preempted = only(facts, F.JobPreempted)
    assert (preempted.job_id, preempted.reason.value) == ("c3", "CROSS_SHARE_RECLAIM")
    assert dispatch_of(facts, "a1").after_preemption_of == ["c3"]
    assert c.dispatched() == {"c1", "c2", "a1"}
    assert c.total() == 3


def test_ruling1_a_reserve_share_uses_its_own_capacity_while_other_borrowing_is_unbacked():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)  # borrows QS2's idle instance
    # QS2 stops lending: med's borrowing is no longer backed.  Nothing is preempted by itself.
    facts = c.update_share("qs2", resourceSharingConfiguration={"strategy": "RESERVE"})
    assert of_kind(facts, F.JobPreempted) == []
    assert c.dispatched() == {"high", "med"}
    # A RESERVE dispatch within its own limit does not make the backing worse: plain dispatch.
    facts = c.submit("r1", "qs3")
    assert dispatched_ids(facts) == ["r1"]
    assert of_kind(facts, F.JobPreempted) == []
    # QS2's own job reclaims its instance from the borrower.
    facts = c.submit("q2", "qs2")
    assert preempted_ids(facts) == ["med"]
    assert dispatch_of(facts, "q2").after_preemption_of == ["med"]


def test_ruling1_a_borrower_never_takes_capacity_a_lender_does_not_have_idle():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=-1, g5=1)
    c.share("B", "LEND", g5=1)
    c.submit("b1", "B")
    facts = c.submit("a1", "A") + c.submit("a2", "A")
    # B is busy with its own job: nothing is idle and lendable, although the SE has 2 free.
    assert dispatched_ids(facts) == ["a1"]
    assert c.status("a2") == "RUNNABLE"
    facts = c.finish("b1")
    assert dispatched_ids(facts) == ["a2"]
    assert borrowed(dispatch_of(facts, "a2")) == {G5: 1}


# -- ruling 2: only owned capacity is usable --------------------------------------------------


def test_ruling2_a_borrower_gets_only_the_lenders_limits_never_the_unowned_rest_of_the_environment():
    c = Cluster()
    c.environment(g5=10)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=-1, g5=1)
    c.share("B", "LEND", g5=1)
    facts = []
    for i in range(5):
        facts += c.submit(f"a{i}", "A")
    assert dispatched_ids(facts) == ["a0", "a1"]  # own 1 + B's 1
    assert c.total() == 2
    assert of_kind(facts, F.ShareBlocked) == []


def test_ruling2_reserve_shares_never_lend_and_lend_shares_never_borrow():
    c = Cluster.notebook()
    facts = c.submit("l1", "qs2") + c.submit("l2", "qs2")
    # QS1's instance is idle and lendable, but a LEND share does not borrow.
    assert dispatched_ids(facts) == ["l1"]
    facts = c.submit("o1", "qs1") + c.submit("o2", "qs1")
    # QS3's instance is idle, but a RESERVE share lends nothing.
    assert dispatched_ids(facts) == ["o1"]
    assert (c.status("l2"), c.status("o2")) == ("RUNNABLE", "RUNNABLE")
    assert c.total() == 2


def test_ruling2_a_job_of_a_unit_its_share_does_not_list_is_blocked():
    c = Cluster()
    c.environment(g5=4, m5=4)
    c.queue()
    c.share("S", "RESERVE", g5=2)
    c.share("T", "LEND", m5=4)
    facts = c.submit("wrong", "S", unit="m5")
    blocked = only(facts, F.ShareBlocked)
    assert blocked.job_id == "wrong"
    assert blocked.status_reason == LIMIT_EXCEEDED
    assert c.status("wrong") == "RUNNABLE"
    assert c.total("m5") == 0


def test_ruling2_an_unlimited_borrower_is_still_blocked_for_a_unit_it_has_no_limit_for():
    c = Cluster()
    c.environment(g5=4, m5=4)
    c.queue()
    c.share("S", "LEND_AND_BORROW", borrow=-1, g5=2)
    c.share("T", "LEND", m5=4)
    facts = c.submit("wrong", "S", unit="m5")
    blocked = only(facts, F.ShareBlocked)
    assert blocked.job_id == "wrong"
    assert blocked.status_reason.startswith("MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED")
    assert c.total("m5") == 0


# -- ruling 3: the SE is a hard ceiling; lowering preempts nothing ----------------------------


def test_ruling3_lowering_the_environment_preempts_nothing_but_caps_later_dispatches():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)
    c.submit("s1", "qs3")
    c.submit("s2", "qs3")
    assert c.dispatched() == {"high", "med", "s1"}
    facts = c.command("UpdateServiceEnvironment", serviceEnvironment="se",
                      capacityLimits=limits(g5=1))  # fmt: skip
    assert of_kind(facts, F.JobPreempted) == []
    assert c.dispatched() == {"high", "med", "s1"}
    # s2 is QS3's own head, but 2 of 1 instances are in use: it waits.
    facts = c.finish("s1")
    assert dispatched_ids(facts) == []
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("s2") == "RUNNABLE"
    # A QS2 job that would reclaim med still can't fit under the ceiling: nothing happens.
    facts = c.submit("q2", "qs2")
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("q2") == "RUNNABLE"
    assert c.dispatched() == {"high", "med"}
    facts = c.finish("med")
    assert dispatched_ids(facts) == []
    assert c.total() == 1
    facts = c.finish("high")
    # One instance under the ceiling: the owners' heads tie on usage and priority, and s2
    # was accepted first (spec 3.3).
    assert dispatched_ids(facts) == ["s2"]
    assert c.total() == 1


def test_ruling3_lowering_a_share_limit_preempts_nothing_and_the_excess_is_not_replaced():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("S", "RESERVE", g5=2)
    c.submit("s1", "S")
    c.submit("s2", "S")
    c.submit("s3", "S")
    facts = c.update_share("S", capacityLimits=limits(g5=1))
    assert of_kind(facts, F.JobPreempted) == []
    assert c.dispatched() == {"s1", "s2"}
    facts = c.finish("s1")
    assert dispatched_ids(facts) == []  # S is at its new limit of 1
    assert c.status("s3") == "RUNNABLE"
    facts = c.finish("s2")
    assert dispatched_ids(facts) == ["s3"]


def test_ruling3_shares_within_their_limits_never_preempt_each_other_in_an_oversubscribed_environment():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "RESERVE", g5=2)
    c.share("B", "RESERVE", g5=2)
    c.submit("a1", "A", priority=0)
    c.submit("a2", "A", priority=0)
    c.submit("b1", "B", priority=9)
    facts = c.submit("b2", "B", priority=9)
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("b2") == "RUNNABLE"
    assert c.total() == 3


# -- ruling 4: every command ends with a pass that repeats until nothing fits -----------------


def test_ruling4_raising_environment_capacity_dispatches_every_waiting_job_that_now_fits():
    c = Cluster()
    c.environment(g5=1)
    c.queue()
    c.share("X", "RESERVE", g5=2)
    c.share("Y", "RESERVE", g5=2)
    c.submit("x1", "X")
    c.submit("x2", "X")
    c.submit("y1", "Y")
    c.submit("y2", "Y")
    assert c.dispatched() == {"x1"}
    facts = c.command("UpdateServiceEnvironment", serviceEnvironment="se",
                      capacityLimits=limits(g5=4))  # fmt: skip
    assert sorted(dispatched_ids(facts)) == ["x2", "y1", "y2"]
    assert c.total() == 4


def test_ruling4_raising_a_share_limit_dispatches_its_waiting_jobs_in_the_same_command():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("S", "RESERVE", g5=1)
    for job_id in ("s1", "s2", "s3"):
        c.submit(job_id, "S")
    facts = c.update_share("S", capacityLimits=limits(g5=3))
    assert dispatched_ids(facts) == ["s2", "s3"]


def test_ruling4_a_tick_with_nothing_due_changes_nothing():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    assert c.tick(1000) == []
    assert c.status("high") == "SCHEDULED"


# -- ruling 5: a preemption frees capacity at once; the dispatch names its victims ------------


def test_ruling5_the_preemptors_dispatch_lists_every_victim_and_their_capacity_is_free_at_once():
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=2)
    c.submit("l1", "S", priority=1)
    c.submit("l2", "S", priority=2)
    facts = c.submit("h", "S", priority=9, n=2)
    assert sorted(preempted_ids(facts)) == ["l1", "l2"]
    dispatch = dispatch_of(facts, "h")
    assert sorted(dispatch.after_preemption_of) == ["l1", "l2"]
    # Victims' preemptions come before the preemptor's dispatch, in the same command.
    order = kinds(facts)
    assert order.index("JobDispatched") > max(i for i, k in enumerate(order) if k == "JobPreempted")
    assert c.dispatched() == {"h"}
    assert c.usage("S") == 2
    assert (c.status("l1"), c.status("l2")) == ("RUNNABLE", "RUNNABLE")


def test_ruling5_a_dispatch_without_preemption_names_no_victims():
    c = Cluster.notebook()
    facts = c.submit("high", "qs1", priority=3)
    assert dispatch_of(facts, "high").after_preemption_of == []


# -- ruling 6: victim ranking and minimal victim sets -----------------------------------------


def test_ruling6_a_job_that_borrowed_is_reclaimed_before_lower_priority_jobs_that_did_not():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=2)
    c.share("B", "LEND", g5=1)
    c.submit("a1", "A", priority=1)
    c.submit("a2", "A", priority=2)
    facts = c.submit("a3", "A", priority=9)
    assert borrowed(dispatch_of(facts, "a3")) == {G5: 1}
    facts = c.submit("b1", "B")
    assert preempted_ids(facts) == ["a3"]
    assert c.dispatched() == {"a1", "a2", "b1"}


def _lowered_lender(priorities: dict[str, int]) -> Cluster:
    """A (LEND, limit 2) runs two jobs and is then lowered to 1; B (RESERVE, 2) runs one job.
    The SE (3) is full, so B's next job must reclaim A's excess."""
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND", g5=2)
    c.share("B", "RESERVE", g5=2)
    for job_id, priority in priorities.items():
        c.submit(job_id, "A", priority=priority)
    c.submit("b1", "B")
    c.update_share("A", capacityLimits=limits(g5=1))
    assert c.total() == 3
    return c


def test_ruling6_among_non_borrowing_victims_the_lowest_priority_goes_first_even_if_older():
    c = _lowered_lender({"old_low": 1, "new_high": 5})
    facts = c.submit("b2", "B")
    assert preempted_ids(facts) == ["old_low"]
    assert dispatch_of(facts, "b2").after_preemption_of == ["old_low"]


def test_ruling6_among_equal_priorities_the_most_recently_dispatched_job_is_reclaimed():
    c = _lowered_lender({"first": 5, "second": 5})
    facts = c.submit("b2", "B")
    assert preempted_ids(facts) == ["second"]


def test_ruling6_jobs_of_a_share_within_its_limit_are_never_reclaimed():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND", g5=2)
    c.share("C", "LEND", g5=1)
    c.share("B", "RESERVE", g5=1)
    c.submit("a1", "A", priority=5)
    c.submit("a2", "A", priority=5)
    c.submit("c1", "C", priority=0)  # lowest priority of all, but C is within its limit
    c.update_share("A", capacityLimits=limits(g5=1))
    facts = c.submit("b1", "B")
    assert preempted_ids(facts) == ["a2"]
    assert c.status("c1") == "SCHEDULED"


def test_ruling6_reclaim_takes_only_as_much_as_needed_from_a_share_over_its_limit():
    c = _lowered_lender({"x1": 5, "x2": 5})
    facts = c.submit("b2", "B")
    assert len(preempted_ids(facts)) == 1
    assert c.usage("A") == 1  # back at its limit, not below


def test_ruling6_cross_share_reclaim_picks_the_lowest_priority_borrower_across_all_borrowing_shares():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("C", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND", g5=2)
    c.submit("a1", "A", priority=0)
    c.submit("a2", "A", priority=5)  # borrows
    c.submit("c1", "C", priority=0)
    facts = c.submit("c2", "C", priority=2)  # borrows
    assert borrowed(dispatch_of(facts, "c2")) == {G5: 1}
    assert c.total() == 4
    facts = c.submit("b1", "B")
    assert preempted_ids(facts) == ["c2"]
    assert c.dispatched() == {"a1", "a2", "c1", "b1"}


def test_ruling6_one_two_instance_job_is_reclaimed_rather_than_two_one_instance_jobs_of_equal_rank():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("A", "LEND", g5=4)
    c.share("B", "RESERVE", g5=2)
    c.submit("pair", "A", priority=5, n=2)  # dispatched first: the oldest
    c.submit("x1", "A", priority=5)
    c.submit("x2", "A", priority=5)  # the most recently dispatched
    c.update_share("A", capacityLimits=limits(g5=2))
    assert c.total() == 4
    facts = c.submit("b", "B", n=2)
    assert preempted_ids(facts) == ["pair"]
    assert dispatch_of(facts, "b").after_preemption_of == ["pair"]
    assert c.dispatched() == {"x1", "x2", "b"}


def test_ruling6_lower_priority_jobs_are_reclaimed_before_a_single_higher_priority_job_that_would_suffice():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("A", "LEND", g5=4)
    c.share("B", "RESERVE", g5=2)
    c.submit("pair", "A", priority=5, n=2)
    c.submit("x1", "A", priority=1)
    c.submit("x2", "A", priority=1)
    c.update_share("A", capacityLimits=limits(g5=2))
    facts = c.submit("b", "B", n=2)
    assert sorted(preempted_ids(facts)) == ["x1", "x2"]
    assert c.dispatched() == {"pair", "b"}


def test_ruling6_in_share_preemption_spares_a_low_priority_job_the_preemptor_does_not_need():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=4)
    c.submit("x", "S", priority=1, n=1)
    c.submit("y", "S", priority=2, n=3)
    facts = c.submit("h", "S", priority=9, n=3)
    # Preempting x (lowest priority) frees 1, not enough; y alone frees enough: x is spared.
    assert preempted_ids(facts) == ["y"]
    assert dispatch_of(facts, "h").after_preemption_of == ["y"]
    assert c.dispatched() == {"x", "h"}


def test_ruling6_in_share_victims_are_lowest_priority_first_then_most_recently_dispatched():
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=2)
    c.submit("old_low", "S", priority=2)
    c.submit("new_high", "S", priority=4)
    facts = c.submit("h", "S", priority=9)
    assert preempted_ids(facts) == ["old_low"]
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=2)
    c.submit("first", "S", priority=3)
    c.submit("second", "S", priority=3)
    facts = c.submit("h", "S", priority=9)
    assert preempted_ids(facts) == ["second"]


# -- ruling 7: owners first, then borrowers first come first served ---------------------------


def test_ruling7_an_owner_is_served_before_an_earlier_borrower_in_the_same_pass():
    c = Cluster()
    c.environment(g5=2)  # oversubscribed: limits add up to 3
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND", g5=1)
    c.share("R", "RESERVE", g5=1)
    c.submit("r1", "R", at=0)
    c.submit("a1", "A", at=0)
    c.submit("a2", "A", at=1)  # would borrow B's idle instance, but the SE is full
    c.submit("b1", "B", at=2)  # within B's own limit, but the SE is full
    assert (c.status("a2"), c.status("b1")) == ("RUNNABLE", "RUNNABLE")
    facts = c.finish("r1")
    assert dispatched_ids(facts) == ["b1"]
    assert of_kind(facts, F.JobPreempted) == []  # no lending only to reclaim
    assert c.status("a2") == "RUNNABLE"


def test_ruling7_borrowers_are_served_in_submission_order_whatever_their_priorities():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("C", "LEND", g5=1)
    c.submit("a1", "A")
    c.submit("b1", "B")
    c.submit("c1", "C")
    c.submit("a2", "A", priority=0, at=1)
    c.submit("b2", "B", priority=9999, at=2)
    facts = c.finish("c1")
    assert dispatched_ids(facts) == ["a2"]
    assert c.status("b2") == "RUNNABLE"


def test_ruling7_owners_are_served_in_order_of_their_shares_usage_relative_to_their_limits():
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("X", "RESERVE", g5=2)
    c.share("Y", "RESERVE", g5=3)
    c.submit("y1", "Y", at=0)
    c.submit("y2", "Y", at=0)
    c.submit("y3", "Y", priority=9, at=1)  # within Y's limit; the SE is full
    c.submit("x1", "X", priority=0, at=2)  # within X's limit; the SE is full
    facts = c.finish("y1")  # Y uses 1/3 of its limit, X 0/2: X first
    assert dispatched_ids(facts) == ["x1"]
    assert c.status("y3") == "RUNNABLE"


def test_ruling7_a_borrowing_head_may_preempt_lower_priority_jobs_of_its_own_share():
    c = Cluster.notebook()
    c.submit("q2", "qs2")  # nothing to lend
    c.submit("low", "qs1", priority=1)
    facts = c.submit("top", "qs1", priority=7)  # would borrow: impossible; in-share instead
    assert preempted_ids(facts) == ["low"]
    assert only(facts, F.JobPreempted).reason.value == "IN_SHARE_PRIORITY"
    assert dispatch_of(facts, "top").after_preemption_of == ["low"]


# -- ruling 8: acceptance order is submission order -------------------------------------------


def test_ruling8_equal_times_keep_acceptance_order_within_a_share():
    c = Cluster()
    c.environment(g5=1)
    c.queue()
    c.share("S", "RESERVE", g5=1)
    c.submit("busy", "S", at=5)
    c.submit("zeta", "S", priority=5, at=5)
    c.submit("alpha", "S", priority=5, at=5)
    assert dispatched_ids(c.finish("busy")) == ["zeta"]
    assert dispatched_ids(c.finish("zeta")) == ["alpha"]


def test_ruling8_equal_times_keep_acceptance_order_among_borrowers():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("C", "LEND", g5=1)
    for job_id in ("a1", "b1", "c1"):
        c.submit(job_id, job_id[0].upper(), at=7)
    c.submit("B2", "B", at=7)
    c.submit("A2", "A", at=7)
    assert dispatched_ids(c.finish("c1")) == ["B2"]


def test_ruling8_a_job_requeued_by_in_share_preemption_keeps_its_place():
    c = Cluster()
    c.environment(g5=1)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=1)
    c.submit("v", "S", priority=5, at=1)
    c.submit("w", "S", priority=5, at=2)
    facts = c.submit("h", "S", priority=9, at=3)
    assert preempted_ids(facts) == ["v"]
    assert dispatched_ids(c.finish("h")) == ["v"]  # v was accepted before w
    assert c.status("w") == "RUNNABLE"


def test_ruling8_a_reclaimed_borrower_keeps_its_first_come_place_among_borrowers():
    c = Cluster()
    c.environment(g5=3)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("B", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("C", "LEND", g5=1)
    c.submit("a1", "A")
    c.submit("b1", "B")
    c.submit("c1", "C")
    c.submit("A2", "A", at=1)
    c.submit("B2", "B", at=2)
    assert dispatched_ids(c.finish("c1")) == ["A2"]
    facts = c.submit("c2", "C", at=3)
    assert preempted_ids(facts) == ["A2"]
    facts = c.finish("c2")
    assert dispatched_ids(facts) == ["A2"]
    assert c.status("B2") == "RUNNABLE"


# -- ruling 9: time never goes backwards ------------------------------------------------------


def test_ruling9_a_command_stamped_earlier_than_the_previous_one_happens_at_the_previous_time():
    c = Cluster.notebook()
    c.tick(100)
    facts = c.submit("late", "qs3", at=50)
    assert facts and all(fact.at == 100 for fact in facts)
    assert only(facts, F.JobSubmitted).at == 100


def test_ruling9_timers_count_from_the_effective_time_not_an_earlier_stamp():
    c = _two_slots()
    c.tick(100)
    facts = c.submit("j", "S", timeoutConfig={"attemptDurationSeconds": 50}, at=20)
    assert dispatch_of(facts, "j").at == 100
    assert c.tick(149) == []  # 20 + 50 = 70 would already have fired
    assert c.tick(30) == []  # earlier than 149: treated as 149
    facts = c.tick(150)
    (change,) = changes_of(facts, "j")
    assert change.at == 150
    assert change.status.value == "FAILED"


# -- the job lifecycle around the rulings -----------------------------------------------------


def _two_slots() -> Cluster:
    c = Cluster()
    c.environment(g5=2)
    c.queue()
    c.share("S", "RESERVE", g5=2)
    return c


def test_an_attempt_that_runs_past_its_timeout_fails_the_job_when_no_retry_is_left():
    c = _two_slots()
    c.submit("j", "S", timeoutConfig={"attemptDurationSeconds": 100}, at=0)
    c.report("j", "RUNNING", attempt=1, at=10)
    assert c.tick(99) == []
    assert c.status("j") == "RUNNING"
    facts = c.tick(500)
    (change,) = changes_of(facts, "j")
    assert change.status.value == "FAILED"
    assert change.at == 100
    assert change.cause.value == "ATTEMPT_TIMEOUT"
    assert change.status_reason
    assert c.status("j") == "FAILED"
    assert c.usage("S") == 0


def test_a_timed_out_attempt_is_retried_under_retry_strategy_and_the_timeout_restarts():
    c = _two_slots()
    c.submit("j", "S", timeoutConfig={"attemptDurationSeconds": 100},
             retryStrategy={"attempts": 2}, at=0)  # fmt: skip
    facts = c.tick(250)
    changes = changes_of(facts, "j")
    assert [(ch.status.value, ch.at) for ch in changes] == [("RUNNABLE", 100), ("FAILED", 200)]
    redispatch = dispatch_of(facts, "j")
    assert (redispatch.attempt, redispatch.at) == (2, 100)
    assert c.status("j") == "FAILED"
    assert c.usage("S") == 0


def test_a_job_that_never_gets_dispatched_never_times_out():
    c = _two_slots()
    c.submit("big1", "S", n=2)
    c.submit("j", "S", timeoutConfig={"attemptDurationSeconds": 100}, at=0)
    assert c.tick(1000) == []
    assert c.status("j") == "RUNNABLE"


def _retrying_job(c: Cluster, job_id: str) -> None:
    c.submit(job_id, "S", retryStrategy={"attempts": 3, "evaluateOnExit": [
        {"action": "RETRY", "onStatusReason": "*InternalServerError*"},
        {"action": "EXIT", "onStatusReason": "*"},
    ]})  # fmt: skip


def test_evaluate_on_exit_retry_sends_a_failed_attempt_back_to_runnable():
    c = _two_slots()
    _retrying_job(c, "j")
    facts = c.report("j", "FAILED", attempt=1,
                     statusReason="Received status from SageMaker: InternalServerError")  # fmt: skip
    (change,) = changes_of(facts, "j")
    assert change.status.value == "RUNNABLE"
    assert dispatch_of(facts, "j").attempt == 2
    assert c.status("j") == "SCHEDULED"


def test_evaluate_on_exit_exit_fails_the_job_although_attempts_remain():
    c = _two_slots()
    _retrying_job(c, "j")
    facts = c.report("j", "FAILED", attempt=1,
                     statusReason="Received status from SageMaker: AlgorithmError: bad input")  # fmt: skip
    (change,) = changes_of(facts, "j")
    assert change.status.value == "FAILED"
    assert dispatched_ids(facts) == []
    assert c.status("j") == "FAILED"


def test_retry_attempts_run_out_after_the_configured_number_of_placements():
    c = _two_slots()
    _retrying_job(c, "j")
    reason = "Received status from SageMaker: InternalServerError"
    statuses = []
    for attempt in (1, 2, 3):
        c.report("j", "FAILED", attempt=attempt, statusReason=reason)
        statuses.append(c.status("j"))
    assert statuses == ["SCHEDULED", "SCHEDULED", "FAILED"]


def test_a_report_about_an_old_attempt_is_recorded_and_ignored():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)  # attempt 1, borrowing
    c.submit("q2", "qs2")  # reclaims med
    c.finish("q2")  # med dispatched again: attempt 2
    assert c.status("med") == "SCHEDULED"
    assert c.job("med")["attempt"] == 2
    for status in ("RUNNING", "SUCCEEDED", "FAILED"):
        facts = c.report("med", status, attempt=1)
        ignored = only(facts, F.JobReportIgnored)
        assert (ignored.job_id, ignored.attempt) == ("med", 1)
        assert kinds(facts) == ["JobReportIgnored"]
        assert c.status("med") == "SCHEDULED"
    facts = c.report("med", "RUNNING", attempt=2)
    assert changes_of(facts, "med")[0].status.value == "RUNNING"
    assert c.status("med") == "RUNNING"


def test_a_report_about_a_job_that_is_not_dispatched_is_ignored():
    c = Cluster.notebook()
    c.submit("r1", "qs3")
    c.submit("r2", "qs3")
    facts = c.report("r2", "RUNNING", attempt=1)
    assert kinds(facts) == ["JobReportIgnored"]
    assert c.status("r2") == "RUNNABLE"


def test_a_repeated_job_id_is_idempotent_and_creates_no_second_job():
    c = Cluster.notebook()
    c.submit("j", "qs3")
    facts = c.submit("j", "qs3")
    dedup = only(facts, F.SubmissionDeduplicated)
    assert dedup.job_id == "j"
    assert of_kind(facts, F.JobSubmitted) == []
    assert list(c.state.jobs) == ["j"]
    assert c.status("j") == "SCHEDULED"
    assert c.total() == 1


def test_a_repeated_client_token_is_idempotent_and_creates_no_second_job():
    c = Cluster.notebook()
    fields = {"jobName": "train", "jobQueue": "q", "quotaShareName": "qs3",
              "capacityUsage": [{"capacityUnit": G5, "quantity": 1}], "clientToken": "tok-1"}  # fmt: skip
    facts = c.command("SubmitServiceJob", **fields)
    job_id = only(facts, F.JobSubmitted).job_id
    facts = c.command("SubmitServiceJob", **fields)
    dedup = only(facts, F.SubmissionDeduplicated)
    assert dedup.job_id == job_id
    assert dedup.client_token == "tok-1"
    assert of_kind(facts, F.JobSubmitted) == []
    assert list(c.state.jobs) == [job_id]
    assert c.total() == 1


def test_job_queues_side_by_side_neither_lend_to_nor_preempt_each_other():
    c = Cluster()
    c.environment("se1", g5=2)
    c.environment("se2", g5=2)
    c.queue("q1", "se1")
    c.queue("q2", "se2")
    for queue in ("q1", "q2"):
        c.share("team", "LEND_AND_BORROW", borrow=100, queue=queue, g5=1)
        c.share("lender", "LEND", queue=queue, g5=1)
    facts = c.submit("t1", "team", queue="q1") + c.submit("t2", "team", queue="q1")
    facts += c.submit("t3", "team", queue="q1")
    # own 1 + q1's lender 1; q2's idle capacity and se2 are not available to q1.
    assert dispatched_ids(facts) == ["t1", "t2"]
    assert c.status("t3") == "RUNNABLE"
    assert (c.total(queue="q1"), c.total(queue="q2")) == (2, 0)
    facts = c.submit("u1", "team", queue="q2") + c.submit("v1", "lender", queue="q2")
    assert dispatched_ids(facts) == ["u1", "v1"]
    assert of_kind(facts, F.JobPreempted) == []
    assert borrowed(dispatch_of(facts, "u1")) == {}
    facts = c.submit("w1", "lender", queue="q1")
    assert preempted_ids(facts) == ["t2"]
    assert {c.status("u1"), c.status("v1")} == {"SCHEDULED"}
    assert (c.usage("team", queue="q1"), c.usage("team", queue="q2")) == (1, 1)
    # A service environment serves one job queue only.
    facts = c.queue("q3", "se1")
    assert only(facts, F.CommandRejected).command_kind == "CreateJobQueue"
    assert "q3" not in c.state.queues


def test_a_job_needing_two_units_is_dispatched_only_when_both_fit_and_holds_both():
    c = Cluster()
    c.environment(m5l=10, m5=5)
    c.queue()
    c.share("TeamAShare", "LEND_AND_BORROW", borrow=200, m5l=10, m5=5)
    two = lambda job_id, large, xlarge: c.command(  # noqa: E731
        "SubmitServiceJob", jobId=job_id, jobName=job_id, jobQueue="q",
        quotaShareName="TeamAShare",
        capacityUsage=[{"capacityUnit": M5L, "quantity": large},
                       {"capacityUnit": M5, "quantity": xlarge}],
    )  # fmt: skip
    facts = two("h1", 4, 2)
    assert dispatched_ids(facts) == ["h1"]
    assert (c.usage("TeamAShare", "m5l"), c.usage("TeamAShare", "m5")) == (4, 2)
    facts = two("h2", 4, 4)  # m5l fits, m5 (2 + 4 > 5) does not: nothing is held
    assert dispatched_ids(facts) == []
    assert (c.usage("TeamAShare", "m5l"), c.usage("TeamAShare", "m5")) == (4, 2)
    facts = c.finish("h1")
    assert dispatched_ids(facts) == ["h2"]
    assert (c.usage("TeamAShare", "m5l"), c.usage("TeamAShare", "m5")) == (4, 4)


def test_the_need_is_read_from_the_sagemaker_payload_resource_config():
    c = _two_slots()
    facts = c.command(
        "SubmitServiceJob", jobId="p", jobName="p", jobQueue="q", quotaShareName="S",
        serviceRequestPayload={"TrainingJobName": "p",
                               "ResourceConfig": {"InstanceType": G5, "InstanceCount": 2}},
    )  # fmt: skip
    submitted = only(facts, F.JobSubmitted)
    assert [(u.capacity_unit, u.quantity) for u in submitted.capacity_usage] == [(G5, 2)]
    assert c.usage("S") == 2


def test_a_disabled_service_environment_dispatches_nothing_until_it_is_enabled_again():
    c = _two_slots()
    c.submit("s1", "S")
    facts = c.command("UpdateServiceEnvironment", serviceEnvironment="se", state="DISABLED")
    assert of_kind(facts, F.JobPreempted) == []
    assert c.status("s1") == "SCHEDULED"  # dispatched jobs run on
    assert dispatched_ids(c.submit("s2", "S")) == []
    assert c.status("s2") == "RUNNABLE"
    assert dispatched_ids(c.finish("s1")) == []
    c.submit("s3", "S")
    facts = c.command("UpdateServiceEnvironment", serviceEnvironment="se", state="ENABLED")
    assert dispatched_ids(facts) == ["s2", "s3"]


def test_updating_the_priority_of_a_finished_job_is_rejected_but_a_scheduled_one_is_allowed():
    c = Cluster.notebook()
    c.submit("j", "qs3", priority=1)
    facts = c.prioritize("j", 5)
    assert only(facts, F.JobPriorityUpdated).scheduling_priority == 5
    assert c.job("j")["schedulingPriority"] == 5
    c.finish("j")
    facts = c.prioritize("j", 9)
    rejected = only(facts, F.CommandRejected)
    assert rejected.command_kind == "UpdateServiceJob"
    assert rejected.job_id == "j"
    assert c.job("j")["schedulingPriority"] == 5
    assert c.status("j") == "SUCCEEDED"


def test_terminating_a_finished_job_is_rejected():
    c = Cluster.notebook()
    c.submit("j", "qs3")
    c.finish("j")
    rejected = only(c.terminate("j"), F.CommandRejected)
    assert rejected.job_id == "j"
    assert c.status("j") == "SUCCEEDED"


def test_a_blocked_head_holds_back_the_jobs_behind_it_in_its_share_only():
    c = Cluster()
    c.environment(m5=10)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=50, m5=2)
    c.share("B", "LEND", m5=2)
    c.submit("big", "A", n=4, unit="m5", priority=9)  # 4 > 2 + 1: blocked
    facts = c.submit("small", "A", n=1, unit="m5")
    assert c.status("small") == "RUNNABLE"  # no backfill past the blocked head
    assert dispatched_ids(facts) == []
    assert dispatched_ids(c.submit("other", "B", unit="m5")) == ["other"]


def test_a_time_limit_for_a_misconfiguration_does_not_fire_on_a_head_that_only_waits_for_capacity():
    c = Cluster()
    c.environment(g5=1)
    c.queue(jobStateTimeLimitActions=[{
        "state": "RUNNABLE", "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
        "maxTimeSeconds": 600, "action": "TERMINATE",
    }])  # fmt: skip
    c.share("S", "RESERVE", g5=1)
    c.submit("s1", "S", at=0)
    c.submit("s2", "S", at=0)
    assert c.tick(5000) == []
    assert c.status("s2") == "RUNNABLE"


# -- borrow ceilings: borrowLimit percent of the share's own limit, rounded down -------------


def ceiling_fleet(limit: int, percent: int) -> Cluster:
    """SE 10 g5; A LEND_AND_BORROW `limit` g5 borrowing `percent` %, B LEND 6 g5 (idle)."""
    c = Cluster()
    c.environment(g5=10)
    c.queue()
    c.share("A", "LEND_AND_BORROW", borrow=percent, g5=limit)
    c.share("B", "LEND", g5=6)
    return c


def fill(c: Cluster, share: str, count: int) -> list[str]:
    """Submit `count` one-instance jobs to `share`; the ids of those dispatched."""
    out = []
    for index in range(count):
        out += dispatched_ids(c.submit(f"{share}{index}", share))
    return out


def test_a_50_percent_ceiling_of_3_instances_lets_the_share_borrow_1_not_2():
    c = ceiling_fleet(3, 50)  # 1.5 rounds down to 1
    assert fill(c, "A", 6) == ["A0", "A1", "A2", "A3"]
    assert c.usage("A") == 4 and c.status("A4") == "RUNNABLE"


def test_a_50_percent_ceiling_of_1_instance_lets_the_share_borrow_nothing():
    c = ceiling_fleet(1, 50)  # 0.5 rounds down to 0
    assert fill(c, "A", 3) == ["A0"]
    assert c.usage("A") == 1


def test_a_150_percent_ceiling_of_3_instances_lets_the_share_borrow_4():
    c = ceiling_fleet(3, 150)  # 4.5 rounds down to 4
    assert fill(c, "A", 9) == [f"A{i}" for i in range(7)]
    assert c.usage("A") == 7 and c.status("A7") == "RUNNABLE"
