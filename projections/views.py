"""Views: everything that depends on more than one fact, computed from the append-only tables.

    facts        the raw log for audits: seq, at, kind, job_queue, job_id, body (the issue's)
    job_submitted / job_events   the job facts, typed (read from fact_log)
    attempts     one row per dispatched attempt: start, end, why it ended
    allocations  one row per dispatched attempt and capacity unit (the issue's allocations)
    jobs         one row per job: current status, priority, timing (the issue's jobs)
    share_usage  the step function of a share's usage, one row per change
    queue_usage  the same per job queue, with the totals the rollups need
    quota_shares the current configuration of every live quota share, in creation order

Time: `now` is the logical time of the last applied fact (`projection_state.last_at`).  An
attempt still running counts up to `now`; `wait_s` of a job still waiting too.

Rows with equal `at` in share_usage / queue_usage are ordered by `seq`; only the last one at an
instant holds for a positive time (a preemption and the dispatch it makes room for happen at
the same `at`).  A row that changes nothing (e.g. a share's state going DISABLED) is dropped.

Sums of float durations are taken in attempt order (`list_sum` over an ordered list), so the
views come out bit-identical whatever the thread schedule: the rebuild checksums cover them.
"""

from __future__ import annotations

VIEWS_DDL = """
CREATE VIEW job_submitted AS
SELECT seq, "at", job_id, fields.jobName AS job_name, job_queue, quota_share,
       fields.schedulingPriority AS priority,
       [{'capacity_unit': x.capacityUnit, 'quantity': x.quantity} FOR x IN fields.capacityUsage]
           AS capacity_usage,
       fields.retryStrategy.attempts AS retry_attempts,
       fields.preemptionConfiguration.preemptionRetriesBeforeTermination AS preemption_retries,
       fields.timeoutConfig.attemptDurationSeconds AS attempt_timeout_s,
       fields.clientToken AS client_token
FROM fact_log WHERE kind = 'JobSubmitted';

CREATE VIEW facts AS
SELECT l.seq, l."at", l.kind, l.command_seq, coalesce(l.job_queue, j.job_queue) AS job_queue,
       coalesce(l.quota_share, j.quota_share) AS quota_share, l.job_id, l.body
FROM fact_log l LEFT JOIN job_submitted j
    ON j.job_id = l.job_id AND l.job_queue IS NULL AND l.kind <> 'JobSubmitted';

-- One row per fact that changes a job's status, status reason or priority.  NULL status or
-- priority: unchanged by this fact; sets_reason: it sets status_reason (maybe to NULL).  The
-- reason strings are evolve's (services/scheduler/core/evolve.py), so the describe answers
-- read from here match the scheduler's.
CREATE VIEW job_events AS
SELECT seq, "at", job_id, kind,
       CASE kind WHEN 'JobSubmitted' THEN 'RUNNABLE' WHEN 'JobDispatched' THEN 'SCHEDULED'
           WHEN 'JobStatusChanged' THEN fields.status
           WHEN 'JobPreempted' THEN CASE fields.outcome WHEN 'REQUEUED' THEN 'RUNNABLE'
                                    ELSE 'FAILED' END
       END AS status,
       kind <> 'JobPriorityUpdated' AS sets_reason,
       CASE WHEN kind IN ('JobStatusChanged', 'ShareBlocked') THEN fields.statusReason
           WHEN kind = 'JobPreempted' THEN 'Preempted by job ' || fields.preemptorJobId
               || ' (' || fields.reason || ')'
               || CASE fields.outcome WHEN 'REQUEUED' THEN ''
                      ELSE '; preemptionRetriesBeforeTermination exhausted' END
       END AS status_reason,
       CASE WHEN kind IN ('JobSubmitted', 'JobPriorityUpdated') THEN fields.schedulingPriority
       END AS priority,
       CASE WHEN kind IN ('JobDispatched', 'JobStatusChanged', 'JobPreempted')
           THEN fields.attempt END AS attempt,
       CASE WHEN kind = 'JobStatusChanged' THEN fields.cause END AS cause,
       coalesce(fields.isTerminated, false) AS is_terminated
FROM fact_log
WHERE kind IN ('JobSubmitted', 'JobPriorityUpdated', 'JobDispatched', 'JobStatusChanged',
               'JobPreempted', 'ShareBlocked');

CREATE VIEW attempts AS
SELECT s.job_id, s.attempt, s.job_queue, s.quota_share, s."at" AS start_at, e."at" AS end_at,
       e.end_reason, e.cause AS end_cause, s.seq AS start_seq, e.seq AS end_seq
FROM (SELECT job_id, attempt, any_value(job_queue) AS job_queue,
             any_value(quota_share) AS quota_share, min("at") AS "at", min(seq) AS seq
      FROM allocation_starts GROUP BY job_id, attempt) s
LEFT JOIN allocation_ends e USING (job_id, attempt);

CREATE VIEW allocations AS
SELECT s.job_id, s.attempt, s.job_queue, s.quota_share, s.capacity_unit, s.quantity,
       s.borrowed, s."at" AS start_at, e."at" AS end_at, e.end_reason, e.cause AS end_cause,
       s.unit_index, s.seq AS start_seq, e.seq AS end_seq
FROM allocation_starts s LEFT JOIN allocation_ends e USING (job_id, attempt);

CREATE VIEW jobs AS
WITH now AS (SELECT last_at AS now FROM projection_state),
events AS (
    SELECT job_id,
           arg_max(status, seq) FILTER (WHERE status IS NOT NULL) AS status,
           arg_max_null(status_reason, seq) FILTER (WHERE sets_reason) AS status_reason,
           arg_max(priority, seq) FILTER (WHERE priority IS NOT NULL) AS priority,
           min("at") FILTER (WHERE status IN ('SUCCEEDED', 'FAILED')) AS finished_at,
           bool_or(is_terminated) AS is_terminated,
           count(*) FILTER (WHERE cause = 'RETRY') AS retries
    FROM job_events GROUP BY job_id),
runs AS (
    SELECT job_id, min(start_at) AS first_dispatched_at, max(start_at) AS last_dispatched_at,
           count(*) AS attempts, max(attempt) AS last_attempt,
           list_sum(list(coalesce(end_at, (SELECT now FROM now)) - start_at ORDER BY attempt))
               AS run_s
    FROM attempts GROUP BY job_id),
preempted AS (
    SELECT job_id, count(*) AS preemptions,
           arg_max(preempted_attempt_count, seq) AS preempted_attempt_count
    FROM preemptions GROUP BY job_id)
SELECT j.job_id, j.job_name, j.job_queue, j.quota_share, e.priority, e.status,
       j.capacity_usage[1].capacity_unit AS capacity_unit,
       j.capacity_usage[1].quantity AS quantity,
       j."at" AS submitted_at, r.first_dispatched_at, e.finished_at,
       coalesce(r.attempts, 0) AS attempts, coalesce(p.preemptions, 0) AS preemptions,
       coalesce(e.finished_at, (SELECT now FROM now)) - j."at" - coalesce(r.run_s, 0) AS wait_s,
       coalesce(r.run_s, 0) AS run_s,
       e.status_reason, e.is_terminated, coalesce(r.last_attempt, 0) AS last_attempt,
       r.last_dispatched_at, 1 + e.retries AS attempts_used,
       coalesce(p.preempted_attempt_count, 0) AS preempted_attempt_count,
       j.capacity_usage, j.retry_attempts, j.preemption_retries, j.attempt_timeout_s,
       j.client_token, j.seq AS submitted_seq
FROM job_submitted j
JOIN events e USING (job_id)
LEFT JOIN runs r USING (job_id)
LEFT JOIN preempted p USING (job_id);

CREATE VIEW share_usage AS
WITH steps AS (
    SELECT job_queue, quota_share, capacity_unit, seq, "at",
           sum(delta) OVER w AS in_use,
           coalesce(last_value(new_limit IGNORE NULLS) OVER w, 0) AS "limit",
           coalesce(last_value(new_lends IGNORE NULLS) OVER w, false) AS lends,
           coalesce(last_value(new_cap IGNORE NULLS) OVER w, -1) AS cap
    FROM share_changes
    WINDOW w AS (PARTITION BY job_queue, quota_share, capacity_unit ORDER BY seq
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
SELECT job_queue, quota_share, capacity_unit, "at", in_use::INTEGER AS in_use,
       greatest(in_use - "limit", 0)::INTEGER AS borrowed, "limit",
       CASE WHEN NOT lends THEN 0
            WHEN cap >= 0 THEN least(greatest("limit" - in_use, 0), cap)
            ELSE greatest("limit" - in_use, 0) END::INTEGER AS lendable_idle,
       lends, seq
FROM steps
QUALIFY (in_use, "limit", lends, cap) IS DISTINCT FROM lag((in_use, "limit", lends, cap))
        OVER (PARTITION BY job_queue, quota_share, capacity_unit ORDER BY seq);

CREATE VIEW queue_usage AS
WITH deltas AS (
    SELECT job_queue, capacity_unit, seq, "at",
           in_use - coalesce(lag(in_use) OVER w, 0) AS d_in_use,
           borrowed - coalesce(lag(borrowed) OVER w, 0) AS d_borrowed,
           lendable_idle - coalesce(lag(lendable_idle) OVER w, 0) AS d_lendable,
           NULL::INTEGER AS capacity
    FROM share_usage
    WINDOW w AS (PARTITION BY job_queue, quota_share, capacity_unit ORDER BY seq)
    UNION ALL
    SELECT job_queue, capacity_unit, seq, "at", 0, 0, 0, capacity FROM capacity_changes),
per_fact AS (
    SELECT job_queue, capacity_unit, seq, any_value("at") AS "at",
           sum(d_in_use) AS d_in_use, sum(d_borrowed) AS d_borrowed,
           sum(d_lendable) AS d_lendable, max(capacity) AS capacity
    FROM deltas GROUP BY job_queue, capacity_unit, seq),
steps AS (
    SELECT job_queue, capacity_unit, seq, "at",
           sum(d_in_use) OVER w AS in_use,
           coalesce(last_value(capacity IGNORE NULLS) OVER w, 0) AS capacity,
           sum(d_borrowed) OVER w AS borrowed,
           sum(d_lendable) OVER w AS lendable_idle
    FROM per_fact
    WINDOW w AS (PARTITION BY job_queue, capacity_unit ORDER BY seq
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
SELECT job_queue, capacity_unit, "at", in_use::INTEGER AS in_use, capacity,
       borrowed::INTEGER AS borrowed, lendable_idle::INTEGER AS lendable_idle, seq
FROM steps
QUALIFY (in_use, capacity, borrowed, lendable_idle)
        IS DISTINCT FROM lag((in_use, capacity, borrowed, lendable_idle))
        OVER (PARTITION BY job_queue, capacity_unit ORDER BY seq);

CREATE VIEW quota_shares AS
SELECT c.job_queue, c.quota_share, c.strategy, c.borrow_limit, c.in_share_preemption, c.state,
       c.capacity_limits, created.seq AS created_seq, c.seq AS config_seq
FROM (SELECT * FROM share_config
      QUALIFY row_number() OVER (PARTITION BY job_queue, quota_share ORDER BY seq DESC) = 1) c
JOIN (SELECT job_queue, quota_share, max(seq) AS seq FROM share_config
      WHERE kind = 'QuotaShareCreated' GROUP BY ALL) created USING (job_queue, quota_share)
WHERE NOT c.deleted;
"""

VIEWS = ("job_submitted", "facts", "job_events", "attempts", "allocations", "jobs",
         "share_usage", "queue_usage", "quota_shares")
