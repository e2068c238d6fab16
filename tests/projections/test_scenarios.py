"""Hand-computed projections of three scenarios: instance-seconds per share, waits, borrowing.

Every expected number below was worked out by hand from the scenario's timeline (written out
in each docstring) and the definitions in projections/rollups.py and views.py; the facts come
from the real decision core.  One instance of ml.g5.xlarge for one second is 1 instance-second.
"""

from __future__ import annotations

import pytest

from tests.projections.helpers import (
    command,
    facts_of,
    project,
    report,
    rows,
    setup,
    share,
    submit,
)

NOTEBOOK_SHARES = [
    share("qs1", 1, "LEND_AND_BORROW", borrow_limit=200, in_share=True),
    share("qs2", 1, "LEND"),
    share("qs3", 1, "RESERVE"),
]


def notebook_extended() -> list[dict]:
    """The official notebook (examples/notebook.jsonl), then executors report.

    t=1 high (qs1, p3) runs; t=2 med (qs1, p2) runs borrowing qs2's idle instance; t=3 low
    (qs1, p1) waits; t=4 b1 (qs2) reclaims: med is preempted, b1 runs; t=5 low's priority
    becomes 4: it preempts high inside qs1.  Then:
    t=20 b1 succeeds: high runs again (attempt 2), borrowing qs2's idle instance;
    t=30 low succeeds: med runs again (attempt 2), borrowing; t=40 high succeeds;
    t=50 med succeeds.
    """
    return [
        *setup({"ml.g5.xlarge": 3}, NOTEBOOK_SHARES),
        submit(1, "high", "qs1", priority=3), submit(2, "med", "qs1", priority=2),
        submit(3, "low", "qs1", priority=1), submit(4, "b1", "qs2", priority=1),
        command("UpdateServiceJob", 5, jobId="low", schedulingPriority=4),
        report(10, "low", "RUNNING"), report(20, "b1", "SUCCEEDED"),
        report(30, "low", "SUCCEEDED"), report(40, "high", "SUCCEEDED", attempt=2),
        report(50, "med", "SUCCEEDED", attempt=2),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def notebook():
    projection = project(facts_of(notebook_extended()))
    yield projection.con
    projection.close()


def test_notebook_jobs_have_hand_computed_runs_and_waits(notebook):
    # job: (status, attempts, preemptions, submitted, first dispatched, finished, run_s, wait_s)
    # high: [1,5) + [20,40) = 24 s running, (40 - 1) - 24 = 15 s waiting;
    # med: [2,4) + [30,50) = 22, (50 - 2) - 22 = 26; low: [5,30) = 25, (30 - 3) - 25 = 2;
    # b1: [4,20) = 16, no wait.
    assert {r[0]: r[1:] for r in rows(notebook, """
        SELECT job_id, status, attempts, preemptions, submitted_at, first_dispatched_at,
               finished_at, run_s, wait_s FROM jobs""")} == {
        "high": ("SUCCEEDED", 2, 1, 1.0, 1.0, 40.0, 24.0, 15.0),
        "med": ("SUCCEEDED", 2, 1, 2.0, 2.0, 50.0, 22.0, 26.0),
        "low": ("SUCCEEDED", 1, 0, 3.0, 5.0, 30.0, 25.0, 2.0),
        "b1": ("SUCCEEDED", 1, 0, 4.0, 4.0, 20.0, 16.0, 0.0),
    }


def test_notebook_allocations_record_borrowing_and_why_each_attempt_ended(notebook):
    assert rows(notebook, """
        SELECT job_id, attempt, quota_share, quantity, borrowed, start_at, end_at, end_reason
        FROM allocations ORDER BY start_at, job_id""") == [
        ("high", 1, "qs1", 1, 0, 1.0, 5.0, "PREEMPTED"),
        ("med", 1, "qs1", 1, 1, 2.0, 4.0, "PREEMPTED"),
        ("b1", 1, "qs2", 1, 0, 4.0, 20.0, "SUCCEEDED"),
        ("low", 1, "qs1", 1, 0, 5.0, 30.0, "SUCCEEDED"),
        ("high", 2, "qs1", 1, 1, 20.0, 40.0, "SUCCEEDED"),
        ("med", 2, "qs1", 1, 1, 30.0, 50.0, "SUCCEEDED"),
    ]


def test_notebook_preemptions_name_both_shares(notebook):
    assert rows(notebook, """
        SELECT "at", job_id, attempt, preemptor_job_id, reason, outcome, quota_share,
               preemptor_share FROM preemptions ORDER BY seq""") == [
        (4.0, "med", 1, "b1", "CROSS_SHARE_RECLAIM", "REQUEUED", "qs1", "qs2"),
        (5.0, "high", 1, "low", "IN_SHARE_PRIORITY", "REQUEUED", "qs1", "qs1"),
    ]


def test_notebook_share_usage_is_the_step_function_of_qs1(notebook):
    # At t=5 the preemption and the dispatch it makes room for are two rows at one instant.
    assert rows(notebook, """
        SELECT "at", in_use, borrowed, "limit" FROM share_usage
        WHERE quota_share = 'qs1' ORDER BY seq""") == [
        (0.0, 0, 0, 1), (1.0, 1, 0, 1), (2.0, 2, 1, 1), (4.0, 1, 0, 1), (5.0, 0, 0, 1),
        (5.0, 1, 0, 1), (20.0, 2, 1, 1), (30.0, 1, 0, 1), (30.0, 2, 1, 1), (40.0, 1, 0, 1),
        (50.0, 0, 0, 1),
    ]


def test_notebook_instance_seconds_per_share(notebook):
    # qs1 holds 1 on [1,2), 2 on [2,4), 1 on [4,20), 2 on [20,40), 1 on [40,50): 71 s used,
    # 22 s beyond its limit of 1.  Only qs2 lends (qs1 never has idle while anyone borrows,
    # qs3 is RESERVE), so qs2 lent all 22 s; its own idle [0,4) + [20,60) = 44 s, so 22 s idle.
    # limit_s = used - borrowed + lent + idle for every share.
    assert {r[0]: r[1:] for r in rows(notebook, """
        SELECT quota_share, limit_s, used_s, borrowed_s, lent_s, idle_s
        FROM utilization(0, 60, 60)""")} == {
        "qs1": (60.0, 71.0, 22.0, 0.0, 11.0),
        "qs2": (60.0, 16.0, 0.0, 22.0, 22.0),
        "qs3": (60.0, 0.0, 0.0, 0.0, 60.0),
    }


def test_notebook_queue_rollup_and_half_hour_buckets(notebook):
    # 3 instances x 60 s = 180; 87 used (71 + 16), so 93 idle; 22 borrowed = 22 lent.
    assert rows(notebook, """SELECT capacity_s, used_s, borrowed_s, lent_s, idle_s, used_h
                             FROM queue_utilization(0, 60, 60)""") == [
        (180.0, 87.0, 22.0, 22.0, 93.0, 87.0 / 3600)]
    # Buckets of 30 s: qs1 borrowed [2,4) + [20,30) = 12 in the first, [30,40) = 10 in the
    # second; qs2 lent the same, and its idle is 14 - 12 = 2, then 30 - 10 = 20.
    assert rows(notebook, """
        SELECT quota_share, bucket_start, bucket_end, used_s, borrowed_s, lent_s, idle_s
        FROM utilization(0, 60, 30) WHERE quota_share IN ('qs1', 'qs2')""") == [
        ("qs1", 0.0, 30.0, 41.0, 12.0, 0.0, 1.0), ("qs1", 30.0, 60.0, 30.0, 10.0, 0.0, 10.0),
        ("qs2", 0.0, 30.0, 16.0, 0.0, 12.0, 2.0), ("qs2", 30.0, 60.0, 0.0, 0.0, 10.0, 20.0),
    ]


def borrowing_over_time() -> list[dict]:
    """A borrower runs past its limit on a lender's idle capacity until the lender wants it.

    lender L=2 LEND, borrower L=1 LEND_AND_BORROW (unlimited), reserve L=1 RESERVE; 4 instances.
    t=10 b1..b4 submitted: b1 fits, b2 and b3 borrow the lender's 2 idle instances, b4 waits
         (nothing left to borrow).
    t=40 b2 succeeds: b4 runs, borrowing.
    t=70 l1 (lender) arrives: the lender's capacity is lent out, so the most recently
         dispatched borrowing job, b4, is preempted and requeued; l1 runs.
    t=100 b1 succeeds: b4 runs again (attempt 2), borrowing the lender's remaining idle one.
    t=130 l1, b3 and b4 succeed.
    """
    return [
        *setup({"ml.g5.xlarge": 4}, [share("lender", 2, "LEND"),
                                     share("borrower", 1, "LEND_AND_BORROW", borrow_limit=-1),
                                     share("reserve", 1, "RESERVE")]),
        *(submit(10, f"b{n}", "borrower") for n in (1, 2, 3, 4)),
        report(40, "b2", "SUCCEEDED"), submit(70, "l1", "lender"), report(100, "b1", "SUCCEEDED"),
        report(130, "l1", "SUCCEEDED"), report(130, "b3", "SUCCEEDED"),
        report(130, "b4", "SUCCEEDED", attempt=2),
    ]  # fmt: skip


def test_borrowing_over_time_per_share_and_queue():
    con = project(facts_of(borrowing_over_time())).con
    # borrower holds 3 on [10,70), 2 on [70,130): 300 s used, 180 s beyond its limit.
    # lender: l1 on [70,130) = 60 used; own idle 2x70 + 1x60 + 2x20 = 240, of which it lent
    # borrowed/idle = 2/2 of 2 on [10,70) = 120 and 1/1 of 1 on [70,130) = 60: 180 lent.
    assert {r[0]: r[1:] for r in rows(con, """
        SELECT quota_share, used_s, borrowed_s, lent_s, idle_s
        FROM utilization(0, 150, 150)""")} == {
        "borrower": (300.0, 180.0, 0.0, 30.0),
        "lender": (60.0, 0.0, 180.0, 60.0),
        "reserve": (0.0, 0.0, 0.0, 150.0),
    }
    assert rows(con, "SELECT capacity_s, used_s, borrowed_s, lent_s, idle_s "
                     "FROM queue_utilization(0, 150, 150)") == [(600.0, 360.0, 180.0, 180.0, 240.0)]
    # Per 50 s: borrowed 2x40, then 2x20 + 1x30, then 1x30.
    assert rows(con, """SELECT bucket_start, used_s, borrowed_s FROM utilization(0, 150, 50)
                        WHERE quota_share = 'borrower'""") == [
        (0.0, 120.0, 80.0), (50.0, 120.0, 70.0), (100.0, 60.0, 30.0)]


def test_preempted_borrower_requeues_and_completes_later():
    con = project(facts_of(borrowing_over_time())).con
    assert rows(con, """SELECT attempt, borrowed, start_at, end_at, end_reason, end_cause
                        FROM allocations WHERE job_id = 'b4' ORDER BY attempt""") == [
        (1, 1, 40.0, 70.0, "PREEMPTED", "CROSS_SHARE_RECLAIM"),
        (2, 1, 100.0, 130.0, "SUCCEEDED", "REPORTED"),
    ]
    # b4 waited [10,40) and [70,100): 60 s; it ran 60 s.
    assert rows(con, """SELECT job_id, status, attempts, preemptions, run_s, wait_s FROM jobs
                        ORDER BY job_id""") == [
        ("b1", "SUCCEEDED", 1, 0, 90.0, 0.0), ("b2", "SUCCEEDED", 1, 0, 30.0, 0.0),
        ("b3", "SUCCEEDED", 1, 0, 120.0, 0.0), ("b4", "SUCCEEDED", 2, 1, 60.0, 60.0),
        ("l1", "SUCCEEDED", 1, 0, 60.0, 0.0),
    ]
    assert rows(con, "SELECT preemptor_job_id, quota_share, preemptor_share, outcome "
                     "FROM preemptions") == [("l1", "borrower", "lender", "REQUEUED")]


def retries_and_terminations() -> list[dict]:
    """In-share preemption, a retried failure and two terminations in a RESERVE share of 2.

    t=0  j1 (p1, 2 attempts) and j2 (p1) run.
    t=10 hi (p9) preempts j2 (the more recently dispatched) and runs.
    t=20 j1 fails: it is retried, and as the earlier submission it runs again (attempt 2).
    t=30 j2 is terminated while waiting; t=40 hi succeeds; t=50 j1 is terminated running.
    """
    return [
        *setup({"ml.g5.xlarge": 2}, [share("team", 2, "RESERVE", in_share=True)]),
        submit(0, "j1", "team", retryStrategy={"attempts": 2}), submit(0, "j2", "team"),
        submit(10, "hi", "team", priority=9), report(20, "j1", "FAILED", statusReason="oom"),
        command("TerminateServiceJob", 30, jobId="j2", reason="not needed"),
        report(40, "hi", "SUCCEEDED"),
        command("TerminateServiceJob", 50, jobId="j1", reason="stop"),
        command("Tick", 60),
    ]  # fmt: skip


def test_attempt_end_reasons_for_retry_preemption_success_and_termination():
    con = project(facts_of(retries_and_terminations())).con
    assert rows(con, """SELECT job_id, attempt, start_at, end_at, end_reason, end_cause
                        FROM attempts ORDER BY start_at, job_id""") == [
        ("j1", 1, 0.0, 20.0, "FAILED", "RETRY"),
        ("j2", 1, 0.0, 10.0, "PREEMPTED", "IN_SHARE_PRIORITY"),
        ("hi", 1, 10.0, 40.0, "SUCCEEDED", "REPORTED"),
        ("j1", 2, 20.0, 50.0, "TERMINATED", "TERMINATED"),
    ]
    # j2 ran [0,10), then waited until it was terminated at 30: 20 s.
    assert rows(con, """SELECT job_id, status, is_terminated, attempts_used, finished_at, run_s,
                               wait_s FROM jobs ORDER BY job_id""") == [
        ("hi", "SUCCEEDED", False, 1, 40.0, 30.0, 0.0),
        ("j1", "FAILED", True, 2, 50.0, 50.0, 0.0),
        ("j2", "FAILED", True, 1, 30.0, 10.0, 20.0),
    ]
    # The share holds 2 until 40, 1 until 50: 90 s of 120; RESERVE lends nothing.
    assert rows(con, "SELECT used_s, borrowed_s, lent_s, idle_s FROM utilization(0, 60, 60)") == [
        (90.0, 0.0, 0.0, 30.0)]


def test_who_lent_to_whom_in_the_notebook(notebook):
    # Only qs2 lends while qs1 borrows (above): all 22 s from qs2 to qs1; [2,4) + [20,30) = 12
    # of them before t=30.
    assert rows(notebook, "SELECT * FROM lending(0, 60)") == [
        ("q", "ml.g5.xlarge", "qs2", "qs1", 22.0, 22.0 / 3600)]
    assert rows(notebook, "SELECT lender, borrower, lent_s FROM lending(0, 30)") == [
        ("qs2", "qs1", 12.0)]


def test_who_lent_to_whom_splits_pro_rata_to_idle_capacity():
    """Lenders a (LEND, 2) and b (LEND, 1), borrowers x and y (LEND_AND_BORROW, 1 each, no
    ceiling) on 6 instances.  At t=0 each borrower runs one job within its limit and one
    beyond: 2 borrowed against 3 idle.  By hand, each borrowed instance comes 2/3 from a and
    1/3 from b, so over 30 s a lends x and y 20 s each, b 10 s each; a's rows add up to its
    lent_s (2 idle x 2/3 x 30 = 40) and x's to its borrowed_s (30)."""
    con = project(facts_of([
        *setup({"ml.g5.xlarge": 6}, [share("a", 2, "LEND"), share("b", 1, "LEND"),
                                     share("x", 1, "LEND_AND_BORROW", borrow_limit=-1),
                                     share("y", 1, "LEND_AND_BORROW", borrow_limit=-1)]),
        *(submit(0, job_id, to) for job_id, to in (("x1", "x"), ("x2", "x"), ("y1", "y"), ("y2", "y"))),
    ])).con  # fmt: skip
    assert rows(con, "SELECT lender, borrower, lent_s FROM lending(0, 30)") == [
        ("a", "x", 20.0), ("a", "y", 20.0), ("b", "x", 10.0), ("b", "y", 10.0)]
    assert {r[0]: r[1:] for r in rows(con, "SELECT quota_share, lent_s, borrowed_s "
                                           "FROM utilization(0, 30, 30)")} == {
        "a": (40.0, 0.0), "b": (20.0, 0.0), "x": (0.0, 30.0), "y": (0.0, 30.0)}
