"""Hand-computed projections for every way an attempt or a job can end.

The projection maps the fact that ends an attempt to `end_reason` (projections/rows.py):
    JobPreempted (outcome REQUEUED or FAILED)               -> PREEMPTED
    JobStatusChanged, cause TERMINATED / TIME_LIMIT / SHARE_DELETED -> TERMINATED
    JobStatusChanged to SUCCEEDED                           -> SUCCEEDED
    anything else (REPORTED failure, RETRY, ATTEMPT_TIMEOUT, CAPACITY_BOUNCE) -> FAILED
and keeps the precise StatusCause (or the preemption reason) in `end_cause`.  The causes are
events.values.StatusCause; UNBLOCKED never ends anything (the job is RUNNABLE), and TIME_LIMIT
only ever hits a RUNNABLE head, so it ends a job but never an attempt (a scenario below holds a
preempted attempt's end against a later TIME_LIMIT fact naming the same attempt number).

Each scenario's timeline is written out in its docstring; every expected number below was
worked out by hand from it and from the definitions in projections/README.md (run_s, wait_s,
limit/used/borrowed/lent/idle), not by running the code.  The facts come from the real
decision core.  One ml.g5.xlarge for one second is 1 instance-second.
"""

from __future__ import annotations

import json

import pytest

from quotasched.events.values import PreemptionOutcome, StatusCause
from tests.projections.helpers import (
    G5,
    command,
    facts_of,
    project,
    report,
    rows,
    setup,
    share,
    submit,
)


def _projected(scenario):
    """A module-scoped fixture: the projection (its connection) of the scenario's facts."""

    @pytest.fixture(scope="module")
    def fixture():
        with project(facts_of(scenario())) as projection:
            yield projection.con

    return fixture


def _shares(con, t1: int) -> dict:
    """{share: (limit_s, used_s, borrowed_s, lent_s, idle_s)} over [0, t1), one bucket."""
    return _by_job(con, "SELECT quota_share, limit_s, used_s, borrowed_s, lent_s, idle_s "
                        f"FROM utilization(0, {t1}, {t1})")  # fmt: skip


def _queue(con, t1: int) -> list[tuple]:
    return rows(con, "SELECT capacity_s, used_s, borrowed_s, lent_s, idle_s "
                     f"FROM queue_utilization(0, {t1}, {t1})")  # fmt: skip


def _by_job(con, sql: str) -> dict:
    """{first column: the rest of the row (one value when the rest is one column)}."""
    return {r[0]: r[1] if len(r) == 2 else r[1:] for r in rows(con, sql)}


# -- a share deleted mid-run ------------------------------------------------------------------


def share_deleted_mid_run() -> list[dict]:
    """doomed (LEND_AND_BORROW, limit 1, unlimited borrowing), stay (LEND, 2), other
    (RESERVE, 1); 4 instances.

    t=5  o1 (other) runs.
    t=10 d1 (doomed) runs within doomed's limit; d2 (doomed) runs borrowing 1 of stay's 2 idle
         instances; d3 (doomed, 2 instances) waits: only 1 instance is free, and stay has only
         1 idle instance left to lend (it is not blocked: 2 - 1 = 1 <= the other lenders' 2).
    t=20 s1 (stay) runs within stay's own limit (the last free instance; stay then has exactly
         the 1 idle instance d2 borrows, so nothing is reclaimed).
    t=30 doomed is DISABLED (nothing changes: its jobs go on, its limit and lending stay).
    t=40 doomed is deleted: d1 and d2 (running) and d3 (waiting) end FAILED, cause
         SHARE_DELETED, in acceptance order; then QuotaShareDeleted.
    t=60 o1 succeeds; t=70 s1 succeeds (the last fact: now = 70).
    """
    return [
        *setup({G5: 4}, [share("doomed", 1, "LEND_AND_BORROW", borrow_limit=-1),
                         share("stay", 2, "LEND"), share("other", 1, "RESERVE")]),
        submit(5, "o1", "other"),
        submit(10, "d1", "doomed"), submit(10, "d2", "doomed"),
        submit(10, "d3", "doomed", quantity=2),
        submit(20, "s1", "stay"),
        command("UpdateQuotaShare", 30, jobQueue="q", quotaShareName="doomed", state="DISABLED"),
        command("DeleteQuotaShare", 40, jobQueue="q", quotaShareName="doomed"),
        report(60, "o1", "SUCCEEDED"), report(70, "s1", "SUCCEEDED"),
    ]  # fmt: skip


deleted = _projected(share_deleted_mid_run)


def test_running_attempts_of_a_deleted_share_end_terminated_share_deleted(deleted):
    # d1 and d2 held doomed's capacity [10,40) and were ended by the deletion: TERMINATED,
    # with the precise cause SHARE_DELETED; d3 never ran, so it has no attempt row.
    assert rows(deleted, """
        SELECT job_id, attempt, quota_share, quantity, borrowed, start_at, end_at, end_reason,
               end_cause
        FROM allocations ORDER BY start_at, job_id""") == [
        ("o1", 1, "other", 1, 0, 5.0, 60.0, "SUCCEEDED", "REPORTED"),
        ("d1", 1, "doomed", 1, 0, 10.0, 40.0, "TERMINATED", "SHARE_DELETED"),
        ("d2", 1, "doomed", 1, 1, 10.0, 40.0, "TERMINATED", "SHARE_DELETED"),
        ("s1", 1, "stay", 1, 0, 20.0, 70.0, "SUCCEEDED", "REPORTED"),
    ]
    # Grouped the way the README suggests: seconds per share and end reason.
    assert rows(deleted, """
        SELECT quota_share, end_reason, count(*), sum(end_at - start_at) FROM allocations
        WHERE end_at IS NOT NULL GROUP BY ALL ORDER BY ALL""") == [
        ("doomed", "TERMINATED", 2, 60.0), ("other", "SUCCEEDED", 1, 55.0),
        ("stay", "SUCCEEDED", 1, 50.0)]


def test_jobs_of_a_deleted_share_running_and_waiting(deleted):
    # job: (status, is_terminated, attempts, submitted, first dispatched, finished, run_s,
    #       wait_s, status_reason)
    # d1, d2: ran [10,40): 30 s, no wait.  d3: waited [10,40): 30 s, never ran.
    # o1 ran [5,60): 55; s1 ran [20,70): 50.
    gone = "Quota share doomed was deleted"
    assert _by_job(deleted, """
        SELECT job_id, status, is_terminated, attempts, submitted_at, first_dispatched_at,
               finished_at, run_s, wait_s, status_reason FROM jobs""") == {
        "o1": ("SUCCEEDED", False, 1, 5.0, 5.0, 60.0, 55.0, 0.0, None),
        "d1": ("FAILED", True, 1, 10.0, 10.0, 40.0, 30.0, 0.0, gone),
        "d2": ("FAILED", True, 1, 10.0, 10.0, 40.0, 30.0, 0.0, gone),
        "d3": ("FAILED", True, 0, 10.0, None, 40.0, 0.0, 30.0, gone),
        "s1": ("SUCCEEDED", False, 1, 20.0, 20.0, 70.0, 50.0, 0.0, None),
    }
    assert rows(deleted, "SELECT count(*) FROM preemptions") == [(0,)]


def test_a_deleted_share_steps_to_zero_and_leaves_the_live_shares(deleted):
    # doomed: created (limit 1, lending 1 idle); d1 in; d2 in (borrowing 1); the DISABLE
    # changes nothing (no row); at 40 d1 out, d2 out, then the deletion drops the limit to 0
    # and its lending with it.  (at, in_use, borrowed, limit, lendable_idle)
    assert rows(deleted, """
        SELECT "at", in_use, borrowed, "limit", lendable_idle FROM share_usage
        WHERE quota_share = 'doomed' ORDER BY seq""") == [
        (0.0, 0, 0, 1, 1), (10.0, 1, 0, 1, 0), (10.0, 2, 1, 1, 0), (40.0, 1, 0, 1, 0),
        (40.0, 0, 0, 1, 1), (40.0, 0, 0, 0, 0)]
    assert [r[0] for r in rows(deleted, "SELECT quota_share FROM quota_shares ORDER BY created_seq")] == [
        "stay", "other"]


def test_instance_seconds_around_a_share_deletion(deleted):
    # doomed: limit 1 on [0,40), 0 after: 40.  Used 2 on [10,40): 60; beyond its limit 1 on
    #   [10,40): 30.  Idle max(0, L - U) = 1 on [0,10) only, when nobody borrows: lent 0,
    #   idle 10.  40 = 60 - 30 + 0 + 10.
    # stay: limit 2 x 70 = 140.  Used 1 on [20,70): 50.  Queue borrowed B = 1 on [10,40).
    #   Lendable idle I: [10,20) stay 2 (doomed 0): lent 2 x min(1, 1/2) = 1 for 10 s;
    #   [20,40) stay 1: lent 1 x min(1, 1/1) = 1 for 20 s; lent 30.  Own idle 2 x 20 + 1 x 50
    #   = 90, so idle 60.  140 = 50 + 30 + 60.
    # other (RESERVE): used [5,60) = 55, idle 5 + 10 = 15, lends nothing.
    assert _shares(deleted, 70) == {
        "doomed": (40.0, 60.0, 30.0, 0.0, 10.0),
        "stay": (140.0, 50.0, 0.0, 30.0, 60.0),
        "other": (70.0, 55.0, 0.0, 0.0, 15.0),
    }
    # Queue: 4 x 70 = 280; used 165; borrowed = lent = 30; idle: 4x5 + 3x5 + 1x10 + 0x20 +
    # 2x20 + 3x10 = 115 = 280 - 165.
    assert _queue(deleted, 70) == [
        (280.0, 165.0, 30.0, 30.0, 115.0)]


# -- failures: reported, retried, timed out, bounced, terminated ------------------------------


def failures_of_every_kind() -> list[dict]:
    """One RESERVE share "t" of 5 on 5 instances; at t=0 five jobs run at once:
    f1 (no retry), r1 (retryStrategy 2 attempts), to1 (attemptDurationSeconds 30), b1, k1.

    t=5  b1's backend lacks capacity (INSUFFICIENT_CAPACITY): attempt 1 ends, cause
         CAPACITY_BOUNCE; its instance is free again, so b1 runs again at once (attempt 2).
    t=10 f1 fails: no retry left, the job FAILED (cause REPORTED).
    t=15 r1 fails: retried (cause RETRY), runs again at once (attempt 2).
    t=20 k1 is terminated while running (cause TERMINATED).
    t=25 r1's attempt 2 fails: out of attempts, FAILED (cause REPORTED).
    t=30 to1's attempt times out (fired by the Tick at 40, at its own deadline 30): FAILED,
         cause ATTEMPT_TIMEOUT (no retry strategy, so not RETRY).
    t=50 b1's attempt 2 succeeds (the last fact: now = 50).
    """
    return [
        *setup({G5: 5}, [share("t", 5, "RESERVE")]),
        submit(0, "f1", "t"), submit(0, "r1", "t", retryStrategy={"attempts": 2}),
        submit(0, "to1", "t", timeoutConfig={"attemptDurationSeconds": 30}),
        submit(0, "b1", "t"), submit(0, "k1", "t"),
        report(5, "b1", "INSUFFICIENT_CAPACITY", attempt=1),
        report(10, "f1", "FAILED", attempt=1, statusReason="boom"),
        report(15, "r1", "FAILED", attempt=1, statusReason="flaky"),
        command("TerminateServiceJob", 20, jobId="k1", reason="not needed"),
        report(25, "r1", "FAILED", attempt=2, statusReason="flaky again"),
        command("Tick", 40),
        report(50, "b1", "SUCCEEDED", attempt=2),
    ]  # fmt: skip


failures = _projected(failures_of_every_kind)


def test_every_failure_cause_ends_its_attempt_with_the_right_reason(failures):
    assert rows(failures, """
        SELECT job_id, attempt, start_at, end_at, end_reason, end_cause
        FROM attempts ORDER BY start_at, job_id, attempt""") == [
        ("b1", 1, 0.0, 5.0, "FAILED", "CAPACITY_BOUNCE"),
        ("f1", 1, 0.0, 10.0, "FAILED", "REPORTED"),
        ("k1", 1, 0.0, 20.0, "TERMINATED", "TERMINATED"),
        ("r1", 1, 0.0, 15.0, "FAILED", "RETRY"),
        ("to1", 1, 0.0, 30.0, "FAILED", "ATTEMPT_TIMEOUT"),
        ("b1", 2, 5.0, 50.0, "SUCCEEDED", "REPORTED"),
        ("r1", 2, 15.0, 25.0, "FAILED", "REPORTED"),
    ]


def test_jobs_after_failures_retries_timeouts_bounces_and_a_termination(failures):
    # job: (status, is_terminated, attempts, attempts_used, finished_at, run_s, wait_s)
    # Every retry and bounce was re-dispatched at the same instant, so nobody waited.
    # b1 ran [0,5) + [5,50) = 50; a bounce is not a retry (attempts_used stays 1).
    # r1 ran [0,15) + [15,25) = 25, one retry: attempts_used 2.  Only k1 was terminated.
    assert _by_job(failures, """
        SELECT job_id, status, is_terminated, attempts, attempts_used, finished_at, run_s, wait_s
        FROM jobs""") == {
        "b1": ("SUCCEEDED", False, 2, 1, 50.0, 50.0, 0.0),
        "f1": ("FAILED", False, 1, 1, 10.0, 10.0, 0.0),
        "k1": ("FAILED", True, 1, 1, 20.0, 20.0, 0.0),
        "r1": ("FAILED", False, 2, 2, 25.0, 25.0, 0.0),
        "to1": ("FAILED", False, 1, 1, 30.0, 30.0, 0.0),
    }


def test_instance_seconds_after_failures(failures):
    # In use: 5 on [0,10), 4 on [10,20), 3 on [20,25), 2 on [25,30), 1 on [30,50):
    # 50 + 40 + 15 + 10 + 20 = 135 of 5 x 50 = 250; RESERVE: nothing borrowed or lent.
    assert rows(failures, """SELECT limit_s, used_s, borrowed_s, lent_s, idle_s
                             FROM utilization(0, 50, 50)""") == [
        (250.0, 135.0, 0.0, 0.0, 115.0)]


# -- preemptions: requeued and failed, cross-share and in-share ------------------------------


def preemptions_requeued_and_failed() -> list[dict]:
    """owner (LEND, 1), user (LEND_AND_BORROW, 1, unlimited, in-share preemption); 2 instances.

    t=0  u1 (user) runs within user's limit; u2 (user, preemptionRetriesBeforeTermination 0)
         runs borrowing owner's idle instance.
    t=10 o1 (owner) reclaims its instance: u2, the borrowing job, is preempted
         (CROSS_SHARE_RECLAIM) and, with no preemption retries, FAILED; o1 runs.
    t=20 u3 (user, priority 9) would have to borrow, and owner has nothing idle: it preempts
         u1 inside user (IN_SHARE_PRIORITY), which is requeued; u3 runs within user's limit.
    t=30 o1 succeeds: u1 runs again (attempt 2), borrowing owner's idle instance.
    t=40 u3 succeeds; t=50 u1 succeeds (the last fact: now = 50).
    """
    return [
        *setup({G5: 2}, [share("owner", 1, "LEND"),
                         share("user", 1, "LEND_AND_BORROW", borrow_limit=-1, in_share=True)]),
        submit(0, "u1", "user"),
        submit(0, "u2", "user",
               preemptionConfiguration={"preemptionRetriesBeforeTermination": 0}),
        submit(10, "o1", "owner"), submit(20, "u3", "user", priority=9),
        report(30, "o1", "SUCCEEDED"), report(40, "u3", "SUCCEEDED"),
        report(50, "u1", "SUCCEEDED", attempt=2),
    ]  # fmt: skip


preempted = _projected(preemptions_requeued_and_failed)


def test_preempted_attempts_end_preempted_whether_requeued_or_failed(preempted):
    assert rows(preempted, """
        SELECT job_id, attempt, quota_share, borrowed, start_at, end_at, end_reason, end_cause
        FROM allocations ORDER BY start_at, job_id, attempt""") == [
        ("u1", 1, "user", 0, 0.0, 20.0, "PREEMPTED", "IN_SHARE_PRIORITY"),
        ("u2", 1, "user", 1, 0.0, 10.0, "PREEMPTED", "CROSS_SHARE_RECLAIM"),
        ("o1", 1, "owner", 0, 10.0, 30.0, "SUCCEEDED", "REPORTED"),
        ("u3", 1, "user", 0, 20.0, 40.0, "SUCCEEDED", "REPORTED"),
        ("u1", 2, "user", 1, 30.0, 50.0, "SUCCEEDED", "REPORTED"),
    ]
    assert rows(preempted, """
        SELECT "at", job_id, attempt, preemptor_job_id, reason, outcome, quota_share,
               preemptor_share, preempted_attempt_count FROM preemptions ORDER BY seq""") == [
        (10.0, "u2", 1, "o1", "CROSS_SHARE_RECLAIM", "FAILED", "user", "owner", 1),
        (20.0, "u1", 1, "u3", "IN_SHARE_PRIORITY", "REQUEUED", "user", "user", 1),
    ]


def test_jobs_after_a_failed_and_a_requeued_preemption(preempted):
    # job: (status, is_terminated, attempts, preemptions, finished_at, run_s, wait_s)
    # u1 ran [0,20) + [30,50) = 40 and waited [20,30): 10.  u2 ran [0,10) and ended FAILED by
    # the preemption itself (not a termination).  o1 [10,30) = 20, u3 [20,40) = 20.
    assert _by_job(preempted, """
        SELECT job_id, status, is_terminated, attempts, preemptions, finished_at, run_s, wait_s
        FROM jobs""") == {
        "u1": ("SUCCEEDED", False, 2, 1, 50.0, 40.0, 10.0),
        "u2": ("FAILED", False, 1, 1, 10.0, 10.0, 0.0),
        "o1": ("SUCCEEDED", False, 1, 0, 30.0, 20.0, 0.0),
        "u3": ("SUCCEEDED", False, 1, 0, 40.0, 20.0, 0.0),
    }


def test_instance_seconds_with_reclaim_and_in_share_preemption(preempted):
    # user (limit 1): in use 2 on [0,10), 1 on [10,30), 2 on [30,40), 1 on [40,50): 70 used,
    #   beyond its limit 1 on [0,10) and [30,40): 20; never idle.  50 = 70 - 20 + 0 + 0.
    # owner (limit 1): in use [10,30): 20.  Idle 1 on [0,10) and [30,50): 30, of which lent
    #   1 x min(1, B/I = 1/1) on [0,10) and [30,40): 20; idle 10.  50 = 20 + 20 + 10.
    assert _shares(preempted, 50) == {
        "owner": (50.0, 20.0, 0.0, 20.0, 10.0),
        "user": (50.0, 70.0, 20.0, 0.0, 0.0),
    }
    # Queue: 2 x 50 = 100; used 90; borrowed = lent = 20; idle 10.
    assert _queue(preempted, 50) == [
        (100.0, 90.0, 20.0, 20.0, 10.0)]


# -- job-state time limits ----------------------------------------------------------------------


QUOTA_LIMIT = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
SE_LIMIT = "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE"


def time_limits() -> list[dict]:
    """small (RESERVE, 2, in-share preemption), other (RESERVE, 1); 2 instances.  The queue
    terminates a head blocked by QUOTA_MANAGEMENT_LIMIT_EXCEEDED after 600 s, and one blocked
    by SERVICE_ENVIRONMENT_MAX_RESOURCE after 900 s.

    t=0   v (small, 2 instances) runs.
    t=10  hi (small, priority 9) preempts v inside small (requeued); hi runs.  v waits: it
          needs 2 and hi holds 1 of small's 2.
    t=20  small's limit drops to 1: v (needs 2) can never fit, it is blocked with
          QUOTA_MANAGEMENT_LIMIT_EXCEEDED from 20 (hi's 1 instance still fits).
    t=30  n (other, 3 instances) is blocked at once: 3 > the environment's 2.
    t=620 v's limit fires: FAILED, TIME_LIMIT; that fact names attempt 1 again, which had
          already ended (PREEMPTED at 10): it ends the job, not the attempt.
    t=930 n's limit fires.  (Both fired when the report at 1000 arrives.)
    t=1000 hi succeeds (the last fact: now = 1000).
    """
    commands = setup({G5: 2}, [share("small", 2, "RESERVE", in_share=True),
                               share("other", 1, "RESERVE")])  # fmt: skip
    [queue] = [c for c in commands if c["kind"] == "CreateJobQueue"]
    queue["jobStateTimeLimitActions"] = [
        {"reason": QUOTA_LIMIT, "state": "RUNNABLE", "maxTimeSeconds": 600, "action": "TERMINATE"},
        {"reason": SE_LIMIT, "state": "RUNNABLE", "maxTimeSeconds": 900, "action": "TERMINATE"},
    ]  # fmt: skip
    return [
        *commands,
        submit(0, "v", "small", quantity=2), submit(10, "hi", "small", priority=9),
        command("UpdateQuotaShare", 20, jobQueue="q", quotaShareName="small",
                capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}]),
        submit(30, "n", "other", quantity=3),
        report(1000, "hi", "SUCCEEDED"),
    ]  # fmt: skip


limited = _projected(time_limits)


def test_a_time_limit_ends_the_job_and_leaves_an_earlier_attempt_end_alone(limited):
    assert rows(limited, """
        SELECT job_id, attempt, start_at, end_at, end_reason, end_cause
        FROM attempts ORDER BY start_at""") == [
        ("v", 1, 0.0, 10.0, "PREEMPTED", "IN_SHARE_PRIORITY"),
        ("hi", 1, 10.0, 1000.0, "SUCCEEDED", "REPORTED"),
    ]
    # job: (status, is_terminated, attempts, preemptions, finished_at, run_s, wait_s)
    # v ran [0,10) and waited [10,620): 610.  n never ran and waited [30,930): 900.
    # hi ran [10,1000): 990.
    assert _by_job(limited, """
        SELECT job_id, status, is_terminated, attempts, preemptions, finished_at, run_s, wait_s
        FROM jobs""") == {
        "v": ("FAILED", True, 1, 1, 620.0, 10.0, 610.0),
        "hi": ("SUCCEEDED", False, 1, 0, 1000.0, 990.0, 0.0),
        "n": ("FAILED", True, 0, 0, 930.0, 0.0, 900.0),
    }
    reason = "Terminated by JobStateTimeLimit action due to reason: "
    assert _by_job(limited, "SELECT job_id, status_reason FROM jobs WHERE job_id <> 'hi'") == {
        "v": reason + QUOTA_LIMIT, "n": reason + SE_LIMIT}
    assert rows(limited, """SELECT job_id, "at", cause FROM job_events
                            WHERE cause = 'TIME_LIMIT' ORDER BY seq""") == [
        ("v", 620.0, "TIME_LIMIT"), ("n", 930.0, "TIME_LIMIT")]


def test_instance_seconds_with_time_limited_heads(limited):
    # small: limit 2 on [0,20), 1 on [20,1000): 40 + 980 = 1020.  In use 2 on [0,10), 1 on
    #   [10,1000): 20 + 990 = 1010; never beyond its limit; idle 1 on [10,20): 10.
    # other: limit 1 x 1000, never used (n was never dispatched).
    assert _shares(limited, 1000) == {
        "small": (1020.0, 1010.0, 0.0, 0.0, 10.0),
        "other": (1000.0, 0.0, 0.0, 0.0, 1000.0),
    }


# -- the list of causes is complete -----------------------------------------------------------


def test_these_scenarios_cover_every_status_cause_and_preemption_outcome():
    """A new StatusCause (or PreemptionOutcome) must come with a scenario here."""
    causes, outcomes = set(), set()
    for scenario in (share_deleted_mid_run, failures_of_every_kind,
                     preemptions_requeued_and_failed, time_limits):  # fmt: skip
        for fact in map(json.loads, facts_of(scenario())):
            if fact["kind"] == "JobStatusChanged":
                causes.add(fact["cause"])
            elif fact["kind"] == "JobPreempted":
                outcomes.add(fact["outcome"])
    # UNBLOCKED (a blocked head is waiting normally again) ends nothing; it is covered by
    # examples/blocked-heads-and-capacity-events.jsonl, not needed here.
    assert causes == {c.value for c in StatusCause} - {"UNBLOCKED"}
    assert outcomes == {o.value for o in PreemptionOutcome}
