"""Read functions over a projection connection: AWS-shaped answers, rollups, checksums.

`describe_service_job`, `list_service_jobs` and `get_job_queue_snapshot` take the same request
dicts as the scheduler's `services/scheduler/api.py` and give the same answers (the tests check
this on every example scenario), but from the projection, so they need no running scheduler,
only a DuckDB file.  `answer(con, verb, request)` dispatches like `api.answer`.

Every function only reads; pass a read-only connection (`store.open(path, read_only=True).con`)
or, inside the projector's process, a `con.cursor()`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from quotasched.projections import schema, views

ARN = "arn:aws:batch:local:000000000000"  # as services/scheduler/api.py answers


class QueryError(ValueError):
    """The request names something the projection does not know (AWS: ClientException)."""


def _ms(at: float | None) -> int | None:
    return None if at is None else int(round(at * 1000))


def _name(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("arn:"):
        return value.rsplit("/", 1)[-1]
    return value


def _dicts(con, query: str, params: Any = None) -> list[dict[str, Any]]:
    cursor = con.execute(query, params) if params is not None else con.execute(query)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


_SUMMARY_COLUMNS = """job_id, job_name, job_queue, quota_share, priority, status, status_reason,
    submitted_at, last_dispatched_at, capacity_usage, last_attempt, is_terminated, finished_at,
    submitted_seq"""


def _summary(job: dict[str, Any]) -> dict[str, Any]:
    summary = {
        "jobArn": f"{ARN}:job/{job['job_id']}", "jobId": job["job_id"],
        "jobName": job["job_name"], "jobQueue": job["job_queue"],
        "serviceJobType": "SAGEMAKER_TRAINING", "status": job["status"],
        "statusReason": job["status_reason"], "quotaShareName": job["quota_share"],
        "schedulingPriority": job["priority"], "createdAt": _ms(job["submitted_at"]),
        "scheduledAt": _ms(job["last_dispatched_at"]),
        "capacityUsage": [{"capacityUnit": item["capacity_unit"], "quantity": item["quantity"]}
                          for item in job["capacity_usage"]],
        "attempt": job["last_attempt"],
    }  # fmt: skip
    if job["is_terminated"]:
        summary["isTerminated"] = True
    return summary


HISTORY_KEPT = 10  # the scheduler keeps a job's last 10 attempts (core/entities.py)

# A job's attempts as DescribeServiceJob shows them: started at its first STARTING/RUNNING
# report, stopped by the fact that ended it, with that fact's reason (a preemption's without
# the "exhausted" suffix, as the scheduler records it on the attempt).
_ATTEMPTS = """
SELECT a.attempt,
       (SELECT min(e."at") FROM job_events e WHERE e.job_id = a.job_id
            AND e.attempt = a.attempt AND e.status IN ('STARTING', 'RUNNING')) AS started_at,
       a.end_at,
       CASE WHEN a.end_reason = 'PREEMPTED' THEN
                (SELECT 'Preempted by job ' || p.preemptor_job_id || ' (' || p.reason || ')'
                 FROM preemptions p WHERE p.seq = a.end_seq AND p.job_id = a.job_id)
            ELSE (SELECT e.status_reason FROM job_events e
                  WHERE e.seq = a.end_seq AND e.job_id = a.job_id) END AS reason,
       a.end_reason = 'PREEMPTED' AS preempted
FROM attempts a WHERE a.job_id = $id ORDER BY a.attempt DESC LIMIT $kept"""


def _history(con, job_id: str) -> list[tuple]:
    rows = con.execute(_ATTEMPTS, {"id": job_id, "kept": HISTORY_KEPT}).fetchall()
    return rows[::-1]


def _attempt(job_id: str, row: tuple) -> dict[str, Any]:
    from quotasched.services.scheduler.api import attempt_shown  # one shape, one naming rule

    attempt, started, stopped, reason, _ = row
    return attempt_shown(job_id, attempt, started, stopped, reason)


def _with_attempts(con, job: dict[str, Any], summary: dict[str, Any]) -> list[tuple]:
    """Add the summary's latestAttempt, startedAt and stoppedAt; return the history."""
    history = _history(con, job["job_id"]) if job["last_attempt"] else []
    _with_latest(job, summary, history[-1][:2] if history else None)
    return history


# The last attempt of each of a page's jobs and when it started (as _ATTEMPTS tells it): one
# query for the page, not one per job (each reads the fact log's job events again).
_LATEST_ATTEMPTS = """
WITH latest AS (SELECT job_id, max(attempt) AS attempt FROM attempts
                WHERE list_contains($ids, job_id) GROUP BY job_id)
SELECT l.job_id, l.attempt,
       min(e."at") FILTER (WHERE e.status IN ('STARTING', 'RUNNING')) AS started_at
FROM latest l LEFT JOIN job_events e ON e.job_id = l.job_id AND e.attempt = l.attempt
GROUP BY l.job_id, l.attempt"""


def _latest_attempts(con, jobs: list[dict[str, Any]]) -> dict[str, tuple]:
    ids = [job["job_id"] for job in jobs if job["last_attempt"]]
    if not ids:
        return {}
    rows = con.execute(_LATEST_ATTEMPTS, {"ids": ids}).fetchall()
    return {job_id: (attempt, started) for job_id, attempt, started in rows}


def _with_latest(job: dict[str, Any], summary: dict[str, Any], latest: tuple | None) -> None:
    """Add the summary's latestAttempt and startedAt (`latest`: the last attempt's number and
    start, None before a first dispatch), and stoppedAt."""
    if latest is not None:
        shown = _attempt(job["job_id"], (*latest, None, None, False))
        summary["latestAttempt"] = {"serviceResourceId": shown["serviceResourceId"]}
        if "startedAt" in shown:
            summary["startedAt"] = shown["startedAt"]
    if job["finished_at"] is not None:
        summary["stoppedAt"] = _ms(job["finished_at"])
    if summary.pop("isTerminated", None):  # AWS's order: isTerminated last
        summary["isTerminated"] = True


def _submitted_extras(con, job_id: str) -> dict[str, Any]:
    """Tags and payload as submitted (the scheduler shows an object payload as json.dumps)."""
    body = con.execute("SELECT body FROM fact_log WHERE kind = 'JobSubmitted' AND job_id = $id",
                       {"id": job_id}).fetchone()  # fmt: skip
    submitted = json.loads(body[0]) if body else {}
    extras: dict[str, Any] = {}
    if submitted.get("tags"):
        extras["tags"] = submitted["tags"]
    payload = submitted.get("serviceRequestPayload")
    if payload is not None:
        extras["serviceRequestPayload"] = payload if isinstance(payload, str) else json.dumps(payload)
    return extras


def describe_service_job(con, request: dict) -> dict[str, Any]:
    job_id = _name(request.get("jobId"))
    found = _dicts(con, "SELECT * FROM jobs WHERE job_id = $id", {"id": job_id})
    if not found:
        raise QueryError(f"Job {job_id} does not exist")
    job = found[0]
    borrowed = con.execute(
        "SELECT capacity_unit, borrowed FROM allocation_starts WHERE job_id = $id "
        "AND attempt = $attempt AND borrowed > 0 ORDER BY unit_index",
        {"id": job_id, "attempt": job["last_attempt"]},
    ).fetchall()
    described = _summary(job)
    history = _with_attempts(con, job, described)
    described.update({
        "borrowed": [{"capacityUnit": unit, "quantity": n} for unit, n in borrowed],
        "preemptionConfiguration": (
            None if job["preemption_retries"] is None
            else {"preemptionRetriesBeforeTermination": job["preemption_retries"]}
        ),
        "retryStrategy": {"attempts": job["retry_attempts"] or 1},
        "attemptsUsed": job["attempts_used"],
        "timeoutConfig": (None if job["attempt_timeout_s"] is None
                          else {"attemptDurationSeconds": job["attempt_timeout_s"]}),
    })  # fmt: skip
    if history:
        described["attempts"] = [_attempt(job_id, row) for row in history]
    if job["preempted_attempt_count"]:
        described["preemptionSummary"] = {
            "preemptedAttemptCount": job["preempted_attempt_count"],
            "recentPreemptedAttempts": [_attempt(job_id, row) for row in history if row[4]],
        }  # fmt: skip
    described.update(_submitted_extras(con, job_id))
    return described


def _queue_exists(con, queue: Any) -> None:
    if not con.execute("SELECT count(*) FROM queue_config WHERE job_queue = $q",
                       {"q": queue}).fetchone()[0]:  # fmt: skip
        raise QueryError(f"Job queue {queue} does not exist")


def list_params(request: dict) -> tuple[str, int, dict[str, list[str]], int | None]:
    """A ListServiceJobs request's status, page size, filters and cursor, refused as the
    scheduler refuses them (one rule: `maxResults` 1-1000, default 100; at most 5 filters of
    100 values of 128 characters), before any job is read."""
    from quotasched.services.scheduler.api import ApiError, job_status_asked, list_filters, max_results

    try:
        status = job_status_asked(request)
        limit = max_results(request.get("maxResults"))
        filters = list_filters(request.get("filters"))
    except ApiError as error:
        raise QueryError(str(error)) from None
    return status, limit, filters, _cursor(request.get("nextToken"))


def list_service_jobs(con, request: dict, max_bytes: int | None = None) -> dict[str, Any]:
    """Newest first.  `jobStatus` defaults to RUNNING; a JOB_NAME filter ignores the status,
    a QUOTA_SHARE_NAME filter combines with it (as the scheduler answers).

    Paged as the scheduler pages, so that every answer fits one NATS message: at most
    `maxResults` jobs and `max_bytes` of summaries (the scheduler's bound by default), and a
    `nextToken` while more match.  The token is a keyset cursor (the log position of the last
    job's submission, which orders the list), not an offset: a job submitted meanwhile never
    shows one job on two pages or skips one."""
    from quotasched.services.scheduler.api import ANSWER_RESERVE_BYTES, MAX_ANSWER_BYTES

    queue = _name(request.get("jobQueue"))
    _queue_exists(con, queue)
    status, limit, filters, before = list_params(request)
    where, params = _job_filters(queue, status, filters)
    if before is not None:
        where.append("submitted_seq < $before")
        params["before"] = before
    params["limit"] = limit + 1  # one more: is there a next page?
    jobs = _dicts(con, f"SELECT {_SUMMARY_COLUMNS} FROM jobs WHERE {' AND '.join(where)} "
                       "ORDER BY submitted_seq DESC LIMIT $limit", params)  # fmt: skip
    room = (MAX_ANSWER_BYTES if max_bytes is None else max_bytes) - ANSWER_RESERVE_BYTES
    latest = _latest_attempts(con, jobs[:limit])
    summaries: list[dict[str, Any]] = []
    for job in jobs[:limit]:
        summary = _summary(job)
        _with_latest(job, summary, latest.get(job["job_id"]))
        room -= len(json.dumps(summary, default=str).encode()) + 2
        if room < 0:
            if not summaries:
                raise QueryError(f"Job {job['job_id']}'s summary alone exceeds the answer limit")
            break
        summaries.append(summary)
    answer: dict[str, Any] = {"jobSummaryList": summaries}
    if len(jobs) > len(summaries):  # cut by maxResults or by bytes: the rest on later pages
        answer["nextToken"] = _token(jobs[len(summaries) - 1]["submitted_seq"])
    return answer


def _job_filters(queue: str, status: str,
                 filters: dict[str, list[str]]) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
    """The WHERE terms (and their parameters) of a ListServiceJobs request."""
    where, params = ["job_queue = $queue"], {"queue": queue}
    patterns = filters.get("JOB_NAME", [])
    if not patterns and status != "ALL":
        where.append("status = $status")
        params["status"] = status
    if filters.get("QUOTA_SHARE_NAME"):
        where.append("list_contains($shares, quota_share)")
        params["shares"] = list(filters["QUOTA_SHARE_NAME"])
    if patterns:  # AWS: a trailing * matches a prefix; case-insensitive
        matches = []
        for index, pattern in enumerate(patterns):
            params[f"name{index}"] = pattern.lower().rstrip("*") if pattern.endswith("*") \
                else pattern.lower()
            matches.append(f"starts_with(lower(job_name), $name{index})" if pattern.endswith("*")
                           else f"lower(job_name) = $name{index}")
        where.append(f"({' OR '.join(matches)})")
    for name, op in (("BEFORE_CREATED_AT", "<"), ("AFTER_CREATED_AT", ">")):
        bound = _created_bound(filters.get(name))
        if bound is not None:
            where.append(f"CAST(round(submitted_at * 1000) AS BIGINT) {op} ${name.lower()}")
            params[name.lower()] = bound
    return where, params


def _token(submitted_seq: int) -> str:
    """Opaque to clients; its own key, so that a scheduler's token (another numbering) is
    refused here rather than read as a position of this log."""
    text = json.dumps({"submittedBefore": submitted_seq})
    return base64.urlsafe_b64encode(text.encode()).decode()


def _cursor(token: Any) -> int | None:
    """The submission position a `nextToken` continues below (None: from the newest)."""
    if token is None or token == "":
        return None
    try:
        before = json.loads(base64.urlsafe_b64decode(str(token)))["submittedBefore"]
        if isinstance(before, int) and not isinstance(before, bool):
            return before
    except (ValueError, KeyError, TypeError):
        pass
    raise QueryError("nextToken is not one the projection gave")


def _created_bound(values: list | None) -> int | None:
    """The scheduler's rule (`api.created_bound`), refused as this module refuses."""
    from quotasched.services.scheduler.api import ApiError, created_bound

    try:
        return created_bound(values)
    except ApiError as error:
        raise QueryError(str(error)) from None


def get_job_queue_snapshot(con, request: dict) -> dict[str, Any]:
    queue = _name(request.get("jobQueue"))
    _queue_exists(con, queue)
    params = {"q": queue}
    # One pass over the queue's RUNNABLE jobs gives both the queue's first 100 and each
    # share's head; current usage is the sum of the share's usage changes (share_usage and
    # queue_usage integrate the same deltas, with a window over every change).
    front: list[tuple[str, float]] = []
    heads: dict[str, tuple[str, float]] = {}
    for share, job_id, at, queue_rank, share_rank in con.execute(
        "SELECT quota_share, job_id, submitted_at, row_number() OVER (ORDER BY priority DESC, "
        "submitted_seq) AS queue_rank, row_number() OVER (PARTITION BY quota_share ORDER BY "
        "priority DESC, submitted_seq) AS share_rank FROM jobs WHERE job_queue = $q AND status "
        "= 'RUNNABLE' QUALIFY queue_rank <= 100 OR share_rank = 1 ORDER BY queue_rank", params,
    ).fetchall():  # fmt: skip
        if queue_rank <= 100:
            front.append((job_id, at))
        if share_rank == 1:
            heads[share] = (job_id, at)
    shares = [row[0] for row in con.execute(
        "SELECT quota_share FROM quota_shares WHERE job_queue = $q ORDER BY created_seq",
        params).fetchall()]  # fmt: skip
    share_use: dict[str, list] = {}
    total: dict[str, int] = {}
    for share, unit, n in con.execute(
        "SELECT quota_share, capacity_unit, sum(delta) AS n FROM share_changes "
        "WHERE job_queue = $q GROUP BY ALL HAVING n <> 0 ORDER BY capacity_unit", params,
    ).fetchall():  # fmt: skip
        share_use.setdefault(share, []).append({"capacityUnit": unit, "quantity": float(n)})
        total[unit] = total.get(unit, 0) + n
    total_use = [(unit, n) for unit, n in sorted(total.items()) if n]

    def position(job_id: str, at: float) -> dict[str, Any]:
        return {"jobArn": f"{ARN}:job/{job_id}", "earliestTimeAtPosition": _ms(at)}

    # as of the last fact applied (the scheduler's answer is as of its last command)
    last_at = con.execute("SELECT last_at FROM projection_state").fetchone()[0]
    updated = _ms(last_at or 0.0)
    return {
        "frontOfQueue": {"jobs": [position(job_id, at) for job_id, at in front],
                         "lastUpdatedAt": updated},
        "frontOfQuotaShares": {"quotaShares": {
            share: [position(*heads[share])] if share in heads else [] for share in shares
        }, "lastUpdatedAt": updated},
        "queueUtilization": {
            "lastUpdatedAt": updated,
            "totalCapacityUsage": [{"capacityUnit": u, "quantity": float(n)}
                                   for u, n in total_use],
            "quotaShareUtilization": {"topCapacityUtilization": [
                {"quotaShareName": share, "capacityUsage": share_use[share]}
                for share in shares if share in share_use
            ]},
        },
    }  # fmt: skip


VERBS = {
    "describe-service-job": describe_service_job,
    "list-service-jobs": list_service_jobs,
    "get-job-queue-snapshot": get_job_queue_snapshot,
}


def answer(con, verb: str, request: dict) -> dict[str, Any]:
    """Like services.scheduler.api.answer: a ClientException document on a bad request."""
    handler = VERBS.get(verb)
    if handler is None:
        raise QueryError(f"Unknown operation {verb}; expected one of {', '.join(VERBS)}")
    try:
        return handler(con, request)
    except QueryError as error:
        return {"error": {"type": "ClientException", "message": str(error)}}


def utilization(con, t0: float, t1: float, bucket_s: float = 3600,
                per: str = "share") -> list[dict[str, Any]]:  # fmt: skip
    """Rows of the `utilization` (per="share") or `queue_utilization` (per="queue") macro;
    the measures are defined in rollups.py."""
    macro = {"share": "utilization", "queue": "queue_utilization"}[per]
    return _dicts(con, f"SELECT * FROM {macro}($t0, $t1, $bucket)",
                  {"t0": float(t0), "t1": float(t1), "bucket": float(bucket_s)})  # fmt: skip


def checksum(con) -> dict[str, tuple[int, int]]:
    """(rows, order-independent hash of every row) of every table and view: two projections
    of the same facts must give equal dicts, whatever their batch sizes."""
    result = {}
    for name in (*schema.TABLES, *views.VIEWS):
        rows, digest = con.execute(
            f"SELECT count(*), coalesce(sum(hash(t)::HUGEINT), 0) FROM {name} t").fetchone()
        result[name] = (rows, int(digest))
    return result


def run_sql(con, query: str) -> tuple[list[str], list[tuple]]:
    cursor = con.execute(query)
    if cursor.description is None:
        return [], []
    return [column[0] for column in cursor.description], cursor.fetchall()


__all__ = ["answer", "checksum", "describe_service_job", "get_job_queue_snapshot",
           "list_service_jobs", "run_sql", "utilization", "QueryError"]
