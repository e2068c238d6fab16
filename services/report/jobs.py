"""Jobs in the report: who waited (per share over time, and who still waits at the end of the
window, with why) and who was preempted by whom, read from the projection's `job_events` view
(one row per fact that changes a job's status, reason or priority), `job_submitted` and
`preemptions`.

A job waits while its status is RUNNABLE (submitted, requeued after a preemption, or retried,
and not yet dispatched again).  It is *blocked* while the last fact that set its status reason
is a ShareBlocked: the scheduler found that, as configured, it can never fit (the reason codes
of `jobStateTimeLimitActions`, e.g. MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE); a
dispatch, a preemption or an UNBLOCKED status change replaces that reason.

`window` is {"q": job queue, "t0", "t1": the window, "pos": the position read first}.
"""

from __future__ import annotations

from .model import Preemption, WaitingJob, WaitStep, by_instant
from .readers import Reader

# Per job and fact: its status and whether it is blocked, carried forward from earlier facts.
_JOB_STATES = """
WITH events AS (
    SELECT e.seq, e."at", e.job_id, j.job_name, j.quota_share, e.kind, e.status,
           e.sets_reason, e.status_reason, e.priority
    FROM job_events e JOIN job_submitted j USING (job_id)
    WHERE j.job_queue = $q AND e.seq <= $pos AND e."at" <= $t1),
states AS (
    SELECT *, last_value(status IGNORE NULLS) OVER w AS state,
           last_value(CASE WHEN sets_reason THEN kind END IGNORE NULLS) OVER w AS reason_kind
    FROM events
    WINDOW w AS (PARTITION BY job_id ORDER BY seq
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)),
flags AS (
    SELECT *, (state = 'RUNNABLE')::INTEGER AS waiting,
           (state = 'RUNNABLE' AND reason_kind = 'ShareBlocked')::INTEGER AS blocked
    FROM states)
"""


def waiting(reader: Reader, window: dict) -> list[WaitStep]:
    """Per share, how many jobs waited and how many of them were blocked, over [t0, t1)."""
    changes = reader.rows(_JOB_STATES + """,
        deltas AS (
            SELECT seq, "at", quota_share,
                   waiting - coalesce(lag(waiting) OVER v, 0) AS d_waiting,
                   blocked - coalesce(lag(blocked) OVER v, 0) AS d_blocked
            FROM flags WINDOW v AS (PARTITION BY job_id ORDER BY seq))
        SELECT seq, any_value("at"), quota_share, sum(d_waiting)::INTEGER,
               sum(d_blocked)::INTEGER
        FROM deltas WHERE d_waiting <> 0 OR d_blocked <> 0
        GROUP BY seq, quota_share ORDER BY seq, quota_share""", window)  # fmt: skip
    state: dict[str, tuple[int, int]] = {}
    steps: list[WaitStep] = []
    for group, a, b in by_instant(changes, window["t0"], window["t1"]):
        for _seq, _at, share, d_waiting, d_blocked in group:
            waiting_now, blocked_now = state.get(share, (0, 0))
            state[share] = (waiting_now + d_waiting, blocked_now + d_blocked)
        if b > a:
            if steps and (steps[-1].shares, steps[-1].b) == (state, a):
                steps[-1].b = b
            else:
                steps.append(WaitStep(a, b, dict(state)))
    return steps


def waiting_at_end(reader: Reader, window: dict) -> list[WaitingJob]:
    """The jobs RUNNABLE at t1, longest waiting first: share, priority, since when, why."""
    rows = reader.rows(_JOB_STATES + """,
        jobs AS (
            SELECT job_id, any_value(job_name) AS job_name, any_value(quota_share) AS share,
                   arg_max(waiting, seq) AS waiting, arg_max(blocked, seq) AS blocked,
                   arg_max(priority, seq) FILTER (WHERE priority IS NOT NULL) AS priority,
                   arg_max_null(status_reason, seq) FILTER (WHERE sets_reason) AS reason,
                   max(seq) FILTER (WHERE state <> 'RUNNABLE') AS left_seq
            FROM flags GROUP BY job_id)
        SELECT j.job_id, j.job_name, j.share, j.priority,
               (SELECT min(f."at") FROM flags f WHERE f.job_id = j.job_id
                AND f.seq > coalesce(j.left_seq, -1)) AS since,
               j.blocked, j.reason
        FROM jobs j WHERE j.waiting = 1 ORDER BY since, j.job_id""", window)  # fmt: skip
    return [WaitingJob(job_id, name or job_id, share, priority, since,
                       reason if blocked else None, None if blocked else reason)
            for job_id, name, share, priority, since, blocked, reason in rows]  # fmt: skip


FOLD_MAX = 200_000  # facts folded at most to say why each job waits at t1


def reasons(reader: Reader, window: dict) -> dict[str, tuple[str, str]] | None:
    """Why each job RUNNABLE at t1 waits, as the scheduler's core says it (core.waiting: what
    explain, the web view and the snapshot say): job id -> (code, sentence), from the log's
    facts up to t1 folded with the core's own `evolve`.  None past FOLD_MAX facts (the report
    then shows each job's last status reason; `quotasched explain JOB` tells one job's)."""
    from quotasched.events.codec import decode_fact
    from quotasched.events.values import JobStatus
    from quotasched.services.scheduler.core import fold
    from quotasched.services.scheduler.core.waiting import waiting

    where = 'FROM fact_log WHERE seq <= $pos AND "at" <= $t1'
    (count,), = reader.rows(f"SELECT count(*) {where}", window)
    if count > FOLD_MAX:
        return None
    state = fold(decode_fact(body) for (body,) in reader.rows(f"SELECT body {where} ORDER BY seq",
                                                              window))  # fmt: skip
    told = {}
    for job in state.jobs.values():
        if job.status is JobStatus.RUNNABLE:
            found = waiting(state, job)
            told[job.job_id] = (found.code, found.text)
    return told


def preemptions(reader: Reader, window: dict) -> list[Preemption]:
    """The queue's preemptions in [t0, t1], with both jobs' names and the victim's units."""
    rows = reader.rows(
        'SELECT p.seq, p."at", p.job_id, p.attempt, p.preemptor_job_id, p.reason, p.outcome, '
        "p.quota_share, p.preemptor_share, "
        "(SELECT any_value(job_name) FROM job_submitted WHERE job_id = p.job_id), "
        "(SELECT any_value(job_name) FROM job_submitted WHERE job_id = p.preemptor_job_id), "
        "(SELECT list(DISTINCT a.capacity_unit ORDER BY a.capacity_unit) FROM "
        "allocation_starts a WHERE a.job_id = p.job_id AND a.attempt = p.attempt) "
        'FROM preemptions p WHERE p.job_queue = $q AND p."at" BETWEEN $t0 AND $t1 '
        "AND p.seq <= $pos ORDER BY p.seq", window)  # fmt: skip
    return [Preemption(*fields, tuple(units or ())) for *fields, units in rows]
