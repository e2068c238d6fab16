"""Fact -> rows, in SQL: parse a staged batch once into `fact_log`, then one INSERT ... SELECT
per derived table.

The store stages a batch as `staged(seq, body)` (the fact's JSON exactly as logged) and, inside
the one transaction that also advances the position, runs `FACT_LOG_INSERT` for the range
(lo, hi], creates the `batch` view over that range, and runs `STATEMENTS` in order.  Each
statement is a pure function of the batch's facts and of rows that earlier facts produced: a
release finds the attempt's units in `allocation_starts`, a configuration change finds the
previous configuration in its own table, a preemption finds the preemptor's share in the log.
(Attempts are looked up in `attempt_starts` / `attempt_ends`, TEMP copies of the rows of the
batch's jobs made inside the batch's transaction and dropped before it commits.)  There is no
other state, so batch boundaries cannot change the result and a restart needs only the
position (store.py).

Why SQL and not a Python state machine over decoded facts: the rebuild target is 500k facts/s
on two cores.  Measured on this machine (benchmarks/projections_bench.py): pydantic decodes
220-310k of these facts/s, orjson 0.65-1.2M/s in a bare loop; the DuckDB Appender writes
400-750k rows/s, and a fact gives 2-4 rows.  Adding the per-fact Python work, such a path
would land near 100k facts/s (an estimate from those parts; it was not built).  Here DuckDB's
JSON reader parses each fact once (`json_transform`; pydantic stays out of the hot path), and
every statement runs vectorized on both cores.  The scheduler
validated the facts with pydantic when it wrote them; what the projection relies on is checked
again, loudly, in checks.py.

How an attempt ends (allocation_ends.end_reason), from the first fact after its dispatch that
takes it out of SCHEDULED/STARTING/RUNNING:
    JobPreempted                                                -> PREEMPTED
    JobStatusChanged, cause TERMINATED / TIME_LIMIT / SHARE_DELETED -> TERMINATED
    JobStatusChanged to SUCCEEDED                               -> SUCCEEDED
    anything else: a FAILED report, ATTEMPT_TIMEOUT, and the RETRY or CAPACITY_BOUNCE that put
    the job back to RUNNABLE                                    -> FAILED (the attempt failed,
                                                                   even when the job goes on)
`allocation_ends.cause` keeps the precise StatusCause (or the preemption reason).
"""

from __future__ import annotations

import json

_UNITS = [{"capacityUnit": "VARCHAR", "quantity": "INTEGER"}]
_LIMITS = [{"capacityUnit": "VARCHAR", "maxCapacity": "INTEGER"}]
# Every field any projected fact kind carries; absent keys come out NULL.
SPEC = json.dumps({
    "kind": "VARCHAR", "at": "DOUBLE", "commandSeq": "BIGINT", "jobId": "VARCHAR",
    "jobName": "VARCHAR", "jobQueue": "VARCHAR", "quotaShareName": "VARCHAR",
    "attempt": "INTEGER", "status": "VARCHAR", "cause": "VARCHAR", "statusReason": "VARCHAR",
    "isTerminated": "BOOLEAN", "schedulingPriority": "INTEGER", "capacityUsage": _UNITS,
    "borrowed": _UNITS, "preemptorJobId": "VARCHAR", "reason": "VARCHAR", "outcome": "VARCHAR",
    "preemptedAttemptCount": "INTEGER", "serviceEnvironment": "VARCHAR",
    "capacityLimits": _LIMITS, "state": "VARCHAR", "schedulingPolicy": "VARCHAR",
    "priority": "INTEGER",
    "resourceSharingConfiguration": {"strategy": "VARCHAR", "borrowLimit": "INTEGER"},
    "preemptionConfiguration": {"inSharePreemption": "VARCHAR",
                                "preemptionRetriesBeforeTermination": "INTEGER"},
    "retryStrategy": {"attempts": "INTEGER"},
    "timeoutConfig": {"attemptDurationSeconds": "INTEGER"}, "clientToken": "VARCHAR",
    "options": {"lendingLimits": _LIMITS},
})  # fmt: skip

# The staged range is parsed once, straight into the persisted log; every statement below
# reads the flat `batch` view over that range of `fact_log`.  The fields that have their own
# column are not stored again in `fields` (that halves the cost of writing the struct).
_TOP = ("kind", "at", "commandSeq", "jobId", "jobQueue", "quotaShareName")
FIELDS = "struct_pack(" + ", ".join(
    f'"{key}" := f."{key}"' for key in json.loads(SPEC) if key not in _TOP) + ")"
FACT_LOG_INSERT = (
    "INSERT INTO fact_log SELECT seq, f.\"at\", f.kind, f.commandSeq, f.jobId, f.jobQueue, "
    f"f.quotaShareName, {FIELDS}, body FROM (SELECT seq, body, json_transform(body, '{SPEC}') "
    "AS f FROM {source})"
)
# A batch handed to the store, staged through the Appender.
FROM_STAGED = "staged WHERE seq > $lo AND seq <= $hi"


def file_lines(path: str) -> str:
    """A JSON Lines fact file read by DuckDB itself into the TEMP table `file_lines(body)`, in
    file order (blank lines skipped), in parallel: DuckDB keeps insertion order for a single
    scan (`preserve_insertion_order`, on by default and never changed here), so a fresh
    table's rowid + 1 is the fact's position.  Cheaper than numbering with row_number() OVER
    (), which reads the file on one thread, and than copying the lines into `staged`."""
    quoted = "'" + path.replace("'", "''") + "'"
    return ("CREATE OR REPLACE TEMP TABLE file_lines AS "
            f"SELECT json::VARCHAR AS body FROM read_ndjson_objects({quoted})")  # fmt: skip


def from_file(first_seq: int = 1) -> str:
    """The rows of `file_lines`, numbered from `first_seq` (an int: no injection)."""
    return (f"(SELECT rowid + {int(first_seq)} AS seq, body FROM file_lines) "
            "WHERE seq > $lo AND seq <= $hi")  # fmt: skip


SESSION_DDL = "CREATE TEMP TABLE IF NOT EXISTS staged (seq BIGINT NOT NULL, body VARCHAR NOT NULL)"


_BATCH_FIELDS = {
    "jobName": "job_name", "attempt": "attempt", "status": "status", "cause": "cause",
    "statusReason": "status_reason", "isTerminated": "is_terminated",
    "schedulingPriority": "scheduling_priority", "capacityUsage": "capacity_usage",
    "borrowed": "borrowed", "preemptorJobId": "preemptor", "reason": "reason",
    "outcome": "outcome", "preemptedAttemptCount": "preempted_count",
    "serviceEnvironment": "environment", "capacityLimits": "capacity_limits", "state": "state",
    "schedulingPolicy": "policy", "priority": "queue_priority",
    "resourceSharingConfiguration": "sharing", "preemptionConfiguration": "preemption",
    "options": "options",
}  # fmt: skip


def batch_view(lo: int, hi: int) -> str:
    """The range (lo, hi] of the log with one column per field (ints only: no injection)."""
    fields = ", ".join(f"fields.{key} AS {name}" for key, name in _BATCH_FIELDS.items())
    return (f'CREATE OR REPLACE TEMP VIEW batch AS SELECT seq, body, kind, "at", command_seq, '
            f"job_id, job_queue, quota_share, {fields} "
            f"FROM fact_log WHERE seq > {int(lo)} AND seq <= {int(hi)}")  # fmt: skip


# The fact kinds each statement reads (directly or through rows of this batch); a statement
# is skipped for a batch without any of them, where it would insert nothing.
_SHARE_CONFIG = ("QuotaShareCreated", "QuotaShareUpdated", "QuotaShareDeleted")
_ENVIRONMENT = ("ServiceEnvironmentCreated", "ServiceEnvironmentUpdated")
_ATTEMPT_FACTS = ("JobDispatched", "JobPreempted", "JobStatusChanged")
READS = {
    "allocation_starts": ("JobDispatched",),
    # The lookup tables are read by allocation_ends, share_changes and the history checks.
    "attempt_starts": (*_ATTEMPT_FACTS, *_SHARE_CONFIG),
    "attempt_ends": (*_ATTEMPT_FACTS, *_SHARE_CONFIG),
    "allocation_ends": ("JobPreempted", "JobStatusChanged"),
    "attempt_ends_added": ("JobPreempted", "JobStatusChanged"),
    "preemptions": ("JobPreempted",),
    "environment_config": _ENVIRONMENT,
    "queue_config": ("JobQueueCreated", "JobQueueUpdated"),
    "share_config": _SHARE_CONFIG,
    "share_changes": ("JobDispatched", "JobPreempted", "JobStatusChanged", *_SHARE_CONFIG,
                      "QuotaShareOptionsSet"),
    "capacity_changes": ("JobQueueCreated", *_ENVIRONMENT),
}

DISPATCHED = "('SCHEDULED', 'STARTING', 'RUNNING')"
_IN_RANGE = "seq > $lo AND seq <= $hi"
_ATTEMPT_KINDS = "(" + ", ".join(f"'{kind}'" for kind in _ATTEMPT_FACTS) + ")"
_LIMIT_LIST = ("[{'capacity_unit': x.capacityUnit, 'max_capacity': x.maxCapacity} "
               "FOR x IN capacity_limits]")
_LENDS = "(NOT c.deleted AND c.strategy <> 'RESERVE')"

STATEMENTS = {
    "allocation_starts": """
INSERT INTO allocation_starts SELECT seq, "at", job_id, attempt, job_queue, quota_share, i,
    capacity_usage[i].capacityUnit, capacity_usage[i].quantity,
    coalesce(list_sum([x.quantity FOR x IN borrowed
                       IF x.capacityUnit = capacity_usage[i].capacityUnit]), 0)
FROM (SELECT *, unnest(range(1, len(capacity_usage) + 1)) AS i
      FROM batch WHERE kind = 'JobDispatched')""",
    # Every lookup of an attempt's start or end is keyed by a job of this batch's dispatches,
    # preemptions and status changes, so those rows are copied once into two small TEMP
    # tables and the statements and checks join those: a hash join reads all key columns of
    # the table it probes, so probing the whole allocation tables made a batch's cost grow
    # with the file (benchmarks/projections_bench.py).  attempt_ends holds the ends before
    # this batch until allocation_ends has run, then also this batch's (attempt_ends_added).
    "attempt_starts": f"""
CREATE OR REPLACE TEMP TABLE attempt_starts AS SELECT * FROM allocation_starts
WHERE job_id IN (SELECT job_id FROM batch WHERE kind IN {_ATTEMPT_KINDS})""",
    "attempt_ends": f"""
CREATE OR REPLACE TEMP TABLE attempt_ends AS SELECT * FROM allocation_ends
WHERE job_id IN (SELECT job_id FROM batch WHERE kind IN {_ATTEMPT_KINDS})""",
    # Candidates: every fact that would take a dispatched attempt out of SCHEDULED/STARTING/
    # RUNNING; the attempt ends at the first one after its dispatch.  A later candidate for
    # the same attempt (e.g. a requeued job terminated while RUNNABLE) is not an end.
    "allocation_ends": f"""
INSERT INTO allocation_ends SELECT seq, "at", job_id, attempt, end_reason, cause FROM (
    SELECT seq, "at", job_id, attempt,
        CASE WHEN kind = 'JobPreempted' THEN 'PREEMPTED'
             WHEN cause IN ('TERMINATED', 'TIME_LIMIT', 'SHARE_DELETED') THEN 'TERMINATED'
             WHEN status = 'SUCCEEDED' THEN 'SUCCEEDED' ELSE 'FAILED' END AS end_reason,
        CASE WHEN kind = 'JobPreempted' THEN reason ELSE cause END AS cause
    FROM batch c
    WHERE (kind = 'JobPreempted' OR (kind = 'JobStatusChanged' AND status NOT IN {DISPATCHED}))
      AND EXISTS (SELECT 1 FROM attempt_starts s
                  WHERE s.job_id = c.job_id AND s.attempt = c.attempt AND s.seq < c.seq)
      AND NOT EXISTS (SELECT 1 FROM attempt_ends e
                      WHERE e.job_id = c.job_id AND e.attempt = c.attempt)
    QUALIFY row_number() OVER (PARTITION BY job_id, attempt ORDER BY seq) = 1)""",
    "attempt_ends_added": f"""
INSERT INTO attempt_ends SELECT * FROM allocation_ends WHERE {_IN_RANGE}""",
    "preemptions": """
INSERT INTO preemptions SELECT b.seq, b."at", b.job_id, b.attempt, b.preemptor, b.reason,
    b.outcome, b.job_queue, b.quota_share, j.quota_share, b.preempted_count
FROM batch b LEFT JOIN (
    SELECT job_id, quota_share FROM fact_log WHERE kind = 'JobSubmitted'
        AND job_id IN (SELECT preemptor FROM batch WHERE kind = 'JobPreempted')) j
    ON j.job_id = b.preemptor
WHERE b.kind = 'JobPreempted'""",
    "environment_config": f"""
INSERT INTO environment_config SELECT seq, "at", environment, state, {_LIMIT_LIST}
FROM batch WHERE kind IN ('ServiceEnvironmentCreated', 'ServiceEnvironmentUpdated')""",
    "queue_config": """
INSERT INTO queue_config SELECT seq, "at", kind, job_queue, environment, policy,
    queue_priority, state
FROM batch WHERE kind IN ('JobQueueCreated', 'JobQueueUpdated')""",
    "share_config": f"""
INSERT INTO share_config SELECT seq, "at", kind, job_queue, quota_share,
    kind = 'QuotaShareDeleted', sharing.strategy, sharing.borrowLimit,
    preemption.inSharePreemption, state, coalesce({_LIMIT_LIST}, [])
FROM batch WHERE kind IN ('QuotaShareCreated', 'QuotaShareUpdated', 'QuotaShareDeleted')""",
    # +quantity at a dispatch, -quantity at the end of the attempt, and for a configuration
    # change the new limit of every unit it lists, plus limit 0 for every unit the previous
    # configuration listed and this one does not (a deleted share lists none).
    # A lending limit (QuotaShareOptionsSet, an option beyond AWS) is `new_cap` (-1: none) for
    # every unit the share lists and every unit the option names; a share created anew starts
    # without one.
    "share_changes": f"""
INSERT INTO share_changes
SELECT seq, "at", job_queue, quota_share, capacity_unit, quantity, NULL, NULL, NULL
FROM allocation_starts WHERE {_IN_RANGE}
UNION ALL
SELECT e.seq, e."at", s.job_queue, s.quota_share, s.capacity_unit, -s.quantity, NULL, NULL, NULL
FROM allocation_ends e JOIN attempt_starts s ON s.job_id = e.job_id AND s.attempt = e.attempt
WHERE e.seq > $lo AND e.seq <= $hi
UNION ALL
SELECT seq, "at", job_queue, quota_share, u.capacity_unit, 0, u.max_capacity, lends,
       CASE WHEN kind = 'QuotaShareCreated' THEN -1 END
FROM (SELECT c.*, {_LENDS} AS lends, unnest(c.capacity_limits) AS u
      FROM share_config c WHERE {_IN_RANGE})
UNION ALL
SELECT seq, "at", job_queue, quota_share, unit, 0, 0, lends, NULL
FROM (SELECT c.seq, c."at", c.job_queue, c.quota_share, {_LENDS} AS lends,
          unnest([x.capacity_unit FOR x IN p.capacity_limits
                  IF NOT list_contains([y.capacity_unit FOR y IN c.capacity_limits],
                                       x.capacity_unit)]) AS unit
      FROM share_config c ASOF JOIN share_config p
          ON p.job_queue = c.job_queue AND p.quota_share = c.quota_share AND c.seq > p.seq
      WHERE c.seq > $lo AND c.seq <= $hi)
UNION ALL
SELECT seq, "at", job_queue, quota_share, unit, 0, NULL, NULL,
       coalesce(list_extract([x.maxCapacity FOR x IN caps IF x.capacityUnit = unit], 1), -1)
FROM (SELECT b.seq, b."at", b.job_queue, b.quota_share,
             coalesce(b.options.lendingLimits, []) AS caps,
             unnest(list_distinct([x.capacity_unit FOR x IN p.capacity_limits]
                                  || [x.capacityUnit FOR x IN coalesce(b.options.lendingLimits, [])])) AS unit
      FROM batch b ASOF JOIN share_config p
          ON p.job_queue = b.job_queue AND p.quota_share = b.quota_share AND b.seq > p.seq
      WHERE b.kind = 'QuotaShareOptionsSet')""",
    # A queue gets its environment's capacity when it is created and whenever the
    # environment's capacity changes (a unit it no longer lists drops to 0).
    "capacity_changes": """
INSERT INTO capacity_changes
SELECT seq, "at", job_queue, u.capacity_unit, u.max_capacity
FROM (SELECT q.seq, q."at", q.job_queue, unnest(e.capacity_limits) AS u
      FROM queue_config q ASOF JOIN environment_config e
          ON e.service_environment = q.service_environment AND q.seq > e.seq
      WHERE q.kind = 'JobQueueCreated' AND q.seq > $lo AND q.seq <= $hi)
UNION ALL
SELECT seq, "at", job_queue, u.capacity_unit, u.max_capacity
FROM (SELECT e.seq, e."at", q.job_queue, unnest(e.capacity_limits) AS u
      FROM environment_config e JOIN queue_config q
          ON q.service_environment = e.service_environment AND q.kind = 'JobQueueCreated'
             AND q.seq < e.seq
      WHERE e.seq > $lo AND e.seq <= $hi)
UNION ALL
SELECT seq, "at", job_queue, unit, 0
FROM (SELECT e.seq, e."at", q.job_queue,
          unnest([x.capacity_unit FOR x IN p.capacity_limits
                  IF NOT list_contains([y.capacity_unit FOR y IN e.capacity_limits],
                                       x.capacity_unit)]) AS unit
      FROM environment_config e
      ASOF JOIN environment_config p
          ON p.service_environment = e.service_environment AND e.seq > p.seq
      JOIN queue_config q ON q.service_environment = e.service_environment
          AND q.kind = 'JobQueueCreated' AND q.seq < e.seq
      WHERE e.seq > $lo AND e.seq <= $hi)""",
}
