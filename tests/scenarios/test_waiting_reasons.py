"""Why a job waits, as the core says it (`scheduler.core.waiting`): one named situation per
code, each worked out by hand from the spec (the fixture's numbers are in each comment), and
the snapshot's `waitingReason` for the same heads (the scheduler's read API over the same
state)."""

from __future__ import annotations

import pytest

from quotasched.services.scheduler.api import get_job_queue_snapshot
from quotasched.services.scheduler.core.waiting import waiting
from tests.builders import Cluster


def reason(c: Cluster, job_id: str) -> tuple[str, str]:
    found = waiting(c.state, c.state.jobs[job_id])
    return found.code, found.text


def test_a_borrower_with_nothing_idle_to_borrow_waits_for_lendable_capacity():
    c = Cluster.notebook()  # SE 3; qs1 L&B 1 (200 %), qs2 LEND 1, qs3 RESERVE 1
    c.submit("high", "qs1", priority=3)  # within qs1's limit
    c.submit("med", "qs1", priority=2)  # borrows qs2's idle instance
    c.submit("low", "qs1", priority=1)  # would borrow a 2nd: qs3 is RESERVE, qs2 lent out
    code, text = reason(c, "low")
    assert code == "no_idle_lendable"
    assert text.startswith("low waits (RUNNABLE): it would borrow 1 ml.g5.xlarge beyond qs1's "
                           "own limit (2 of 1 in use) but there is no idle lendable capacity")


def test_a_reserve_share_at_its_limit_may_not_borrow():
    c = Cluster.notebook()
    c.submit("r1", "qs3")  # qs3 RESERVE, limit 1: its own
    c.submit("r2", "qs3")  # beyond the limit: RESERVE never borrows
    code, text = reason(c, "r2")
    assert code == "may_not_borrow"
    assert "qs3 is at its own limit (1 of 1 ml.g5.xlarge in use, r2 needs 1) and a RESERVE share" in text


def test_a_share_within_its_limit_waits_when_the_environment_is_full():
    c = Cluster()
    c.environment(g5=1)  # one instance, two shares of one each: the environment is the cap
    c.queue()
    c.share("a", "LEND_AND_BORROW", borrow=100, g5=1)
    c.share("b", "LEND_AND_BORROW", borrow=100, g5=1)
    c.submit("a1", "a")
    c.submit("b1", "b")  # within b's own limit, but the one instance is a1's
    code, text = reason(c, "b1")
    assert code == "environment_full"
    assert "service environment se is full: 1 of its 1 ml.g5.xlarge are in use and b1 needs 1" in text
    # nothing to reclaim: a is within its own limit
    assert "cross-share reclaim finds nothing to take back" in text


def test_a_borrower_stops_at_its_borrow_ceiling():
    c = Cluster()
    c.environment(g5=4)
    c.queue()
    c.share("a", "LEND_AND_BORROW", borrow=100, g5=1)  # may hold 1 + 1
    c.share("l", "LEND", g5=3)
    c.submit("a1", "a")
    c.submit("a2", "a")  # borrows 1 of l's idle 3
    c.submit("a3", "a")  # a 3rd would pass 1 + 100 % of 1
    code, text = reason(c, "a3")
    assert code == "borrow_ceiling"
    assert "a has reached its borrow ceiling: it may use at most 2 ml.g5.xlarge" in text


def test_jobs_behind_a_head_wait_behind_it_and_say_how_many_are_ahead():
    c = Cluster.notebook()
    c.submit("r1", "qs3", priority=5)
    c.submit("head", "qs3", priority=5)  # qs3's head: RESERVE at its limit
    c.submit("lower", "qs3", priority=1)
    c.submit("same", "qs3", priority=5)  # after head, same priority
    assert reason(c, "lower")[0] == "behind_higher_priority"
    assert reason(c, "same")[0] == "behind_earlier"
    code, text = reason(c, "lower")
    assert "it is behind higher-priority job head (priority 5, its own is 1) at the head of qs3 " \
           "(2 jobs are ahead of it in qs3)" in text  # head and same
    assert "head itself waits because qs3 is at its own limit" in text


def test_a_head_that_can_never_fit_is_blocked_and_so_is_every_job_behind_it():
    c = Cluster.notebook()
    c.submit("huge", "qs3", n=2)  # RESERVE with limit 1 can never hold 2 (spec 3.7)
    c.submit("after", "qs3")
    code, text = reason(c, "huge")
    assert code == "blocked"
    assert "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED" in text
    assert reason(c, "after")[0] == "behind_blocked_head"


def test_a_disabled_environment_is_the_first_reason_for_every_job():
    c = Cluster.notebook()
    c.command("UpdateServiceEnvironment", serviceEnvironment="se", state="DISABLED")
    c.submit("x", "qs1")
    c.submit("y", "qs1")
    assert reason(c, "x")[0] == "environment_disabled"
    assert reason(c, "y")[0] == "environment_disabled"
    assert reason(c, "x")[1].startswith("x waits (RUNNABLE): service environment se is DISABLED")


@pytest.mark.parametrize("share, head", [("qs1", "low"), ("qs3", "r2")])
def test_the_snapshot_gives_each_head_the_cores_reason(share, head):
    c = Cluster.notebook()
    for job_id, to in (("high", "qs1"), ("med", "qs1"), ("low", "qs1"), ("r1", "qs3"), ("r2", "qs3")):
        c.submit(job_id, to)
    before = c.state.queues["q"].shares[share].heap[:]
    front = get_job_queue_snapshot(c.state, {"jobQueue": "q"})["frontOfQuotaShares"]["quotaShares"]
    assert front[share][0]["jobArn"].endswith(f"/{head}")
    code, text = reason(c, head)
    assert front[share][0]["waitingReason"] == {"code": code, "message": text}
    assert c.state.queues["q"].shares[share].heap == before  # a read changes nothing
