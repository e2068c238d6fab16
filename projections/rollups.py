"""Utilization rollups: table macros over share_usage and queue_usage.

    SELECT * FROM utilization(t0, t1, bucket_s)        -- per job queue, quota share, unit, bucket
    SELECT * FROM queue_utilization(t0, t1, bucket_s)  -- per job queue, unit, bucket
    SELECT * FROM lending(t0, t1)  -- who lent to whom: lender, borrower, instance-seconds

Buckets are [t0 + k*bucket_s, t0 + (k+1)*bucket_s) clipped to [t0, t1), in logical seconds
(bucket_s defaults to 3600).  Every measure is an integral over the bucket of a step function,
in instance-seconds of the capacity unit (`*_s`) and instance-hours (`*_h` = `*_s` / 3600),
summed exactly (`_integral`), so the same to the last bit on every run.
A capacity unit is an instance type (ml.g5.xlarge, ...); the log does not say how many GPUs
an instance has, so "GPU-hours" are instance-hours of the GPU instance types.

For a share s, a unit, and the queue q it belongs to, at each instant:
    L  the share's own limit (maxCapacity; 0 when it does not list the unit)
    U  instances held by its dispatched attempts
    B_q = sum over the queue's shares of max(0, U - L)        (borrowed in the queue)
    I_q = sum over LEND / LEND_AND_BORROW shares of max(0, L - U)   (lendable idle)

  used_s      = integral of U
  borrowed_s  = integral of max(0, U - L): what the share ran beyond its own limit
  limit_s     = integral of L
  lent_s      = integral of max(0, L - U) * min(1, B_q / I_q) for a lending share, 0 for a
                RESERVE share.  Borrowing is pooled per queue and unit: the log records how
                much a job borrowed, never from whom.  So borrowed capacity is attributed to the
                lending shares in proportion to their idle capacity at that instant; the lent
                amounts of a queue then add up to min(B_q, I_q), which is B_q whenever
                borrowing is backed by idle capacity (ruling 1).  B_q > I_q happens only after
                a limit was lowered under running jobs.
  idle_s      = integral of max(0, L - U) - lent: own capacity that nobody used.

`lending(t0, t1)` splits the same attribution by borrower, one row per (queue, unit, lender,
borrower): while borrower b borrows B_b and lender l has lendable idle I_l, l lends b
B_b * I_l / I_q, so a lender's rows add up to its `lent_s` and a borrower's to its
`borrowed_s` (whenever borrowing is backed).
  So for every share: limit_s = (used_s - borrowed_s) + lent_s + idle_s.

For a queue q and a unit (capacity C: its service environment's maxCapacity):
  capacity_s = integral of C
  used_s     = integral of sum U           (= the sum of its shares' used_s)
  borrowed_s = integral of B_q             (= the sum of its shares' borrowed_s)
  lent_s     = integral of min(B_q, I_q)   (= the sum of its shares' lent_s)
  idle_s     = integral of max(0, C - sum U): capacity nobody used, including capacity that
               no share owns (which no share may borrow either, ruling 2).

A step function holds from its last change up to t1, so pass a t1 no later than the time the
projection is current to (`SELECT last_at FROM projection_state`).
"""

from __future__ import annotations

_BUCKET = "(CASE WHEN bucket_s > 0 THEN bucket_s ELSE error('bucket_s must be positive') END)"
# Each segment repeated once per bucket it overlaps (the unnest in the select list: as a
# lateral join DuckDB planned it as a hash join, a third slower over the whole macro).
_SPLIT = f"""
    SELECT *, t0 + k * bucket_s AS bucket_start FROM (
        SELECT seg.*, unnest(range(floor((greatest(a, t0) - t0) / {_BUCKET})::BIGINT,
                                   ceil((least(b, t1) - t0) / {_BUCKET})::BIGINT)) AS k
        FROM seg WHERE b > a AND b > t0 AND a < t1)"""
_OVERLAP = "least(b, t1, bucket_start + bucket_s) - greatest(a, t0, bucket_start)"


def _integral(measure: str) -> str:
    """The sum of `measure * d` over a bucket's pieces, exact whatever the order: each piece is
    rounded to 1e-12 instance-seconds and summed as a DECIMAL (integers underneath), so the
    result is the same bit for bit on every run and thread schedule (a DOUBLE sum is not)."""
    return f"sum(({measure} * d)::DECIMAL(38, 12))"


MACROS_DDL = f"""
CREATE MACRO utilization(t0, t1, bucket_s := 3600) AS TABLE
WITH share_seg AS (
    SELECT job_queue, quota_share, capacity_unit, "at" AS a,
           lead("at", 1, t1::DOUBLE) OVER (PARTITION BY job_queue, quota_share, capacity_unit
                                           ORDER BY seq) AS b,
           in_use::DOUBLE AS used, borrowed::DOUBLE AS borrowed, "limit"::DOUBLE AS lim,
           greatest("limit" - in_use, 0)::DOUBLE AS own_idle, 0.0::DOUBLE AS lent
    FROM share_usage),
queue_seg AS (
    SELECT job_queue, capacity_unit, seq, "at" AS a,
           lead("at", 1, t1::DOUBLE) OVER (PARTITION BY job_queue, capacity_unit
                                           ORDER BY seq) AS b,
           least(1.0, borrowed::DOUBLE / lendable_idle) AS factor
    FROM queue_usage
    QUALIFY borrowed > 0 AND lendable_idle > 0),
lenders AS (SELECT DISTINCT job_queue, quota_share, capacity_unit FROM share_usage
            WHERE lendable_idle > 0),
-- A share's lendable idle changes only together with its queue's total, so it is constant
-- on every queue segment: its value at the segment's start is its value throughout.
lent_seg AS (
    SELECT q.job_queue, q.quota_share, q.capacity_unit, q.a, q.b, 0.0, 0.0, 0.0, 0.0,
           s.lendable_idle * q.factor
    FROM (SELECT * FROM queue_seg JOIN lenders USING (job_queue, capacity_unit)) q
    ASOF JOIN share_usage s
        ON s.job_queue = q.job_queue AND s.quota_share = q.quota_share
           AND s.capacity_unit = q.capacity_unit AND q.seq >= s.seq
    WHERE s.lendable_idle > 0),
seg AS (SELECT * FROM share_seg UNION ALL SELECT * FROM lent_seg),
split AS ({_SPLIT}),
parts AS (SELECT *, {_OVERLAP} AS d FROM split)
SELECT job_queue, quota_share, capacity_unit, bucket_start,
       least(bucket_start + bucket_s, t1) AS bucket_end,
       {_integral("lim")}::DOUBLE AS limit_s, {_integral("used")}::DOUBLE AS used_s,
       {_integral("borrowed")}::DOUBLE AS borrowed_s, {_integral("lent")}::DOUBLE AS lent_s,
       ({_integral("own_idle")} - {_integral("lent")})::DOUBLE AS idle_s,
       used_s / 3600 AS used_h, borrowed_s / 3600 AS borrowed_h, lent_s / 3600 AS lent_h,
       idle_s / 3600 AS idle_h
FROM parts GROUP BY job_queue, quota_share, capacity_unit, bucket_start
ORDER BY job_queue, quota_share, capacity_unit, bucket_start;

CREATE MACRO queue_utilization(t0, t1, bucket_s := 3600) AS TABLE
WITH seg AS (
    SELECT job_queue, capacity_unit, "at" AS a,
           lead("at", 1, t1::DOUBLE) OVER (PARTITION BY job_queue, capacity_unit
                                           ORDER BY seq) AS b,
           capacity::DOUBLE AS capacity, in_use::DOUBLE AS used, borrowed::DOUBLE AS borrowed,
           least(borrowed, lendable_idle)::DOUBLE AS lent,
           greatest(capacity - in_use, 0)::DOUBLE AS idle
    FROM queue_usage),
split AS ({_SPLIT}),
parts AS (SELECT *, {_OVERLAP} AS d FROM split)
SELECT job_queue, capacity_unit, bucket_start, least(bucket_start + bucket_s, t1) AS bucket_end,
       {_integral("capacity")}::DOUBLE AS capacity_s, {_integral("used")}::DOUBLE AS used_s,
       {_integral("borrowed")}::DOUBLE AS borrowed_s, {_integral("lent")}::DOUBLE AS lent_s,
       {_integral("idle")}::DOUBLE AS idle_s,
       capacity_s / 3600 AS capacity_h, used_s / 3600 AS used_h,
       borrowed_s / 3600 AS borrowed_h, lent_s / 3600 AS lent_h, idle_s / 3600 AS idle_h
FROM parts GROUP BY job_queue, capacity_unit, bucket_start
ORDER BY job_queue, capacity_unit, bucket_start;

CREATE MACRO lending(t0, t1) AS TABLE
WITH queue_seg AS (
    SELECT job_queue, capacity_unit, seq, "at" AS a,
           lead("at", 1, t1::DOUBLE) OVER (PARTITION BY job_queue, capacity_unit
                                           ORDER BY seq) AS b,
           lendable_idle::DOUBLE AS pool
    FROM queue_usage
    QUALIFY borrowed > 0 AND lendable_idle > 0),
shares AS (SELECT DISTINCT job_queue, quota_share, capacity_unit FROM share_usage),
-- Every share's borrowed and lendable idle at each segment's start, which hold throughout it
-- (they change only together with the queue's totals, as in `utilization`).
at_seg AS (
    SELECT q.job_queue, q.capacity_unit, q.seq, q.a, q.b, q.pool, q.quota_share,
           s.borrowed::DOUBLE AS borrowed, s.lendable_idle::DOUBLE AS idle
    FROM (SELECT * FROM queue_seg JOIN shares USING (job_queue, capacity_unit)) q
    ASOF JOIN share_usage s
        ON s.job_queue = q.job_queue AND s.quota_share = q.quota_share
           AND s.capacity_unit = q.capacity_unit AND q.seq >= s.seq),
pairs AS (
    SELECT l.job_queue, l.capacity_unit, l.quota_share AS lender, r.quota_share AS borrower,
           r.borrowed * l.idle / l.pool AS amount,
           least(l.b, t1) - greatest(l.a, t0) AS d
    FROM at_seg l JOIN at_seg r USING (job_queue, capacity_unit, seq)
    WHERE l.idle > 0 AND r.borrowed > 0 AND l.b > t0 AND l.a < t1)
SELECT job_queue, capacity_unit, lender, borrower, {_integral("amount")}::DOUBLE AS lent_s,
       lent_s / 3600 AS lent_h
FROM pairs WHERE d > 0 GROUP BY ALL
ORDER BY job_queue, capacity_unit, lender, borrower;
"""

MACROS = ("utilization", "queue_utilization", "lending")
