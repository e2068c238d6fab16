"""What makes a fact impossible to project, checked in the batch's own transaction.

A projector that skipped such a fact would write tables that silently disagree with the log
(usage that is never released, a job without a queue), so the store raises instead and the
whole batch is rolled back: STYLE.md's "fail loudly", and redelivery retries it.

Two queries over the staged batch, each row (seq, kind, problem): `BATCH_PROBLEMS` (the fact
alone is malformed) before any row is written, `HISTORY_PROBLEMS` (it contradicts earlier
facts) after the batch's rows were inserted, so "before" means a smaller seq, in this batch or
an earlier one.  Attempts are looked up in `attempt_starts` / `attempt_ends`, the rows of the
batch's jobs (rows.py), which by then include the batch's own.
Field names in the messages are the wire's (camelCase).
"""

from __future__ import annotations

from quotasched.projections.rows import DISPATCHED

KINDS = (
    "CommandRejected", "ServiceEnvironmentCreated", "ServiceEnvironmentUpdated",
    "SchedulingPolicyCreated", "JobQueueCreated", "JobQueueUpdated", "QuotaShareCreated",
    "QuotaShareUpdated", "QuotaShareDeleted", "QuotaShareOptionsSet", "JobQueueOptionsSet",
    "JobSubmitted", "SubmissionDeduplicated",
    "JobPriorityUpdated", "JobDispatched", "JobPreempted", "JobStatusChanged", "ShareBlocked",
    "JobReportIgnored", "JobExpired",
)  # fmt: skip

# batch column -> wire field
_WIRE = {
    "job_id": "jobId", "job_name": "jobName", "job_queue": "jobQueue",
    "quota_share": "quotaShareName", "scheduling_priority": "schedulingPriority",
    "capacity_usage": "capacityUsage", "borrowed": "borrowed", "attempt": "attempt",
    "preemptor": "preemptorJobId", "reason": "reason", "outcome": "outcome",
    "preempted_count": "preemptedAttemptCount", "status": "status", "cause": "cause",
    "environment": "serviceEnvironment", "capacity_limits": "capacityLimits", "state": "state",
    "policy": "schedulingPolicy", "queue_priority": "priority",
    "sharing.strategy": "resourceSharingConfiguration.strategy",
}  # fmt: skip
_JOB = ("job_id",)
_SHARE = ("job_queue", "quota_share")
REQUIRED = {
    "JobSubmitted": (*_JOB, "job_name", *_SHARE, "scheduling_priority", "capacity_usage"),
    "JobPriorityUpdated": (*_JOB, "scheduling_priority"),
    "JobDispatched": (*_JOB, "attempt", *_SHARE, "capacity_usage", "borrowed"),
    "JobPreempted": (*_JOB, "attempt", *_SHARE, "preemptor", "reason", "outcome",
                     "preempted_count"),
    "JobStatusChanged": (*_JOB, "attempt", "status", "cause"),
    "ShareBlocked": (*_JOB, *_SHARE),
    "JobReportIgnored": _JOB,
    "JobExpired": (*_JOB, *_SHARE, "status"),  # in `facts`; the job's rows stay as they were
    "SubmissionDeduplicated": _JOB,
    "ServiceEnvironmentCreated": ("environment", "capacity_limits", "state"),
    "ServiceEnvironmentUpdated": ("environment", "capacity_limits", "state"),
    "JobQueueCreated": ("job_queue", "environment", "policy", "queue_priority", "state"),
    "JobQueueUpdated": ("job_queue", "environment", "policy", "queue_priority", "state"),
    "QuotaShareCreated": (*_SHARE, "capacity_limits", "sharing.strategy", "state"),
    "QuotaShareUpdated": (*_SHARE, "capacity_limits", "sharing.strategy", "state"),
    "QuotaShareDeleted": _SHARE,
    "QuotaShareOptionsSet": _SHARE,  # options beyond AWS: in `facts`, no table reads them
    "JobQueueOptionsSet": ("job_queue",),  # likewise (fair share, share groups)
}  # fmt: skip


def _missing_fields() -> str:
    cases = []
    for kind, fields in REQUIRED.items():
        whens = " ".join(f"WHEN {field} IS NULL THEN '{_WIRE[field]}'" for field in fields)
        cases.append(f"WHEN kind = '{kind}' THEN CASE {whens} END")
    return f"CASE {' '.join(cases)} END"


_KINDS = ", ".join(f"'{kind}'" for kind in KINDS)
_JOB_FACTS = ("'JobPriorityUpdated', 'JobDispatched', 'JobPreempted', 'JobStatusChanged', "
              "'ShareBlocked', 'JobReportIgnored', 'SubmissionDeduplicated', 'JobExpired'")  # fmt: skip

_ORDERED = "ORDER BY seq, problem LIMIT 5"
_RANGE = "seq > $lo AND seq <= $hi"

# Run right after parsing: the fact alone is malformed.
BATCH_PROBLEMS = f"""
SELECT seq, kind, problem FROM (
SELECT seq, coalesce(kind, '?') AS kind,
       'unknown fact kind ' || coalesce('''' || kind || '''', '(none)') AS problem
FROM batch WHERE kind IS NULL OR kind NOT IN ({_KINDS})
UNION ALL
SELECT seq, kind, 'lacks ' || CASE WHEN "at" IS NULL THEN 'at' ELSE 'commandSeq' END
    || ' (or it has the wrong type)'
FROM batch WHERE kind IN ({_KINDS}) AND ("at" IS NULL OR command_seq IS NULL)
UNION ALL
SELECT seq, kind, 'lacks ' || missing || ' (or it has the wrong type)'
FROM (SELECT seq, kind, {_missing_fields()} AS missing FROM batch) WHERE missing IS NOT NULL
) {_ORDERED}"""

# Run after the batch's rows were inserted: the fact contradicts what came before it.  Each
# check runs only when the batch holds a kind it looks at (`history_problems`), which keeps
# small live batches cheap.
_CONFIG = ("QuotaShareCreated", "QuotaShareUpdated", "QuotaShareDeleted")
HISTORY_CHECKS: tuple[tuple[tuple[str, ...], str], ...] = (
    # One join for both: a submission must be the job's first, any other job fact follow it.
    (("JobSubmitted", *(k.strip("' ") for k in _JOB_FACTS.split(","))), f"""
SELECT b.seq, b.kind, 'job ' || b.job_id || CASE WHEN b.kind = 'JobSubmitted'
    THEN ' was already submitted' ELSE ' was never submitted' END AS problem
FROM batch b LEFT JOIN (SELECT job_id, seq FROM fact_log WHERE kind = 'JobSubmitted') j
    ON j.job_id = b.job_id AND j.seq < b.seq
WHERE b.kind IN ('JobSubmitted', {_JOB_FACTS}) AND b.job_id IS NOT NULL
  AND (j.seq IS NULL) = (b.kind <> 'JobSubmitted')"""),
    (("JobSubmitted", "JobDispatched"), """
SELECT b.seq, b.kind, 'quota share ' || b.job_queue || '/' || b.quota_share || ' does not exist'
FROM batch b LEFT JOIN (SELECT job_queue, quota_share, min(seq) AS seq FROM share_config
                        GROUP BY job_queue, quota_share) c
    ON c.job_queue = b.job_queue AND c.quota_share = b.quota_share
WHERE b.kind IN ('JobSubmitted', 'JobDispatched') AND b.quota_share IS NOT NULL
  AND (c.seq IS NULL OR c.seq > b.seq)"""),
    (("JobStatusChanged",), f"""
SELECT b.seq, b.kind, 'status ' || b.status || ' for attempt ' || b.attempt || ' of job '
    || b.job_id || ', which is not holding capacity'
FROM batch b
LEFT JOIN attempt_starts s
    ON s.job_id = b.job_id AND s.attempt = b.attempt AND s.unit_index = 1
LEFT JOIN attempt_ends e ON e.job_id = b.job_id AND e.attempt = b.attempt
WHERE b.kind = 'JobStatusChanged' AND b.status IN {DISPATCHED}
  AND (s.seq IS NULL OR s.seq > b.seq OR e.seq < b.seq)"""),
    # The rest reads the batch's few rows in the small derived tables.
    (("JobPreempted",), f"""
SELECT seq, 'JobPreempted', 'preemptor job ' || preemptor_job_id || ' was never submitted'
FROM preemptions WHERE {_RANGE} AND preemptor_share IS NULL
UNION ALL
SELECT p.seq, 'JobPreempted', 'attempt ' || p.attempt || ' of job ' || p.job_id
    || ' is not holding capacity'
FROM preemptions p WHERE p.seq > $lo AND p.seq <= $hi
  AND NOT EXISTS (SELECT 1 FROM allocation_ends e WHERE e.seq = p.seq)"""),
    (("JobDispatched",), """
SELECT s.seq, 'JobDispatched', 'attempt ' || s.attempt || ' of job ' || s.job_id
    || ' was already dispatched'
FROM attempt_starts s JOIN attempt_starts t
    ON t.job_id = s.job_id AND t.attempt = s.attempt AND t.unit_index = s.unit_index
       AND t.seq < s.seq
WHERE s.seq > $lo AND s.seq <= $hi
UNION ALL
-- Attempts are numbered 1, 2, ...: attempt k may start only after attempt k-1 ended.
SELECT s.seq, 'JobDispatched', 'job ' || s.job_id || ' is dispatched as attempt ' || s.attempt
    || ' but attempt ' || (s.attempt - 1) || ' has not ended'
FROM attempt_starts s
WHERE s.seq > $lo AND s.seq <= $hi AND s.unit_index = 1 AND s.attempt > 1
  AND NOT EXISTS (SELECT 1 FROM attempt_ends e WHERE e.job_id = s.job_id
                  AND e.attempt = s.attempt - 1 AND e.seq <= s.seq)"""),
    (_CONFIG, """
SELECT c.seq, c.kind, 'job queue ' || c.job_queue || ' does not exist'
FROM share_config c WHERE c.seq > $lo AND c.seq <= $hi
  AND NOT EXISTS (SELECT 1 FROM queue_config q
                  WHERE q.job_queue = c.job_queue AND q.seq < c.seq)"""),
    (("JobQueueCreated",), """
SELECT q.seq, q.kind, 'service environment ' || q.service_environment || ' does not exist'
FROM queue_config q WHERE q.seq > $lo AND q.seq <= $hi AND q.kind = 'JobQueueCreated'
  AND NOT EXISTS (SELECT 1 FROM environment_config e
                  WHERE e.service_environment = q.service_environment AND e.seq < q.seq)"""),
    (("ServiceEnvironmentUpdated",), """
SELECT seq, kind, 'service environment ' || environment || ' does not exist'
FROM batch b WHERE kind = 'ServiceEnvironmentUpdated'
  AND NOT EXISTS (SELECT 1 FROM environment_config e
                  WHERE e.service_environment = b.environment AND e.seq < b.seq)"""),
)


def history_problems(kinds: set[str]) -> str | None:
    """The history checks that apply to a batch holding these fact kinds, as one query."""
    parts = [f"SELECT * FROM ({sql}) AS part(seq, kind, problem)"
             for applies_to, sql in HISTORY_CHECKS if kinds.intersection(applies_to)]
    if not parts:
        return None
    return f"SELECT seq, kind, problem FROM ({' UNION ALL '.join(parts)}) {_ORDERED}"
