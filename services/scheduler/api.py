"""Read answers shaped like the AWS Batch API, computed from the scheduler's committed state.

`answer(state, verb, request)` is pure: the service calls it under its state lock for
`qm.api.<verb>` requests, and the tests call it directly.  Times are epoch milliseconds, as
AWS returns them; ARNs use region `local` and account `000000000000`.
"""

from __future__ import annotations

import re
from typing import Any

from quotasched.events.subjects import ANY, API_PREFIX
from quotasched.events.values import JobQueueOptions
from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.partition import Partition

ARN = "arn:aws:batch:local:000000000000"


class ApiError(ValueError):
    pass


def job_arn(job_id: str) -> str:
    return f"{ARN}:job/{job_id}"


def training_job_name(job_id: str, attempt: int) -> str:
    """The SageMaker training job an attempt runs as: each dispatch is a new one, named with
    the `AWSBatch` prefix Batch gives them (spec 4.1), at most 63 of SageMaker's name
    characters.  One function, so the name DescribeServiceJob shows is the one the SageMaker
    executor creates (services/executors/sagemaker.py)."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", f"AWSBatch-{job_id}")[:58].strip("-")
    return f"{name}-{attempt}"


def training_job_arn(job_id: str, attempt: int) -> str:
    """The attempt's training job as `serviceResourceId` shows it (region `local`)."""
    return f"arn:aws:sagemaker:local:000000000000:training-job/{training_job_name(job_id, attempt)}"


def attempt_shown(job_id: str, attempt: int, started: float | None, stopped: float | None,
                  reason: str | None) -> dict[str, Any]:
    """One entry of `attempts` (and `recentPreemptedAttempts`) as AWS shows it; the projection
    (projections/queries.py) shows its attempts through this too."""
    shown: dict[str, Any] = {"serviceResourceId": {
        "name": "TrainingJobArn", "value": training_job_arn(job_id, attempt)}}  # fmt: skip
    if started is not None:
        shown["startedAt"] = _ms(started)
    if stopped is not None:
        shown["stoppedAt"] = _ms(stopped)
    if reason is not None:
        shown["statusReason"] = reason
    return shown


def _attempt(job: Job, record: tuple) -> dict[str, Any]:
    attempt, _, started, stopped, reason, _ = record
    return attempt_shown(job.job_id, attempt, started, stopped, reason)


def _ms(at: float | None) -> int | None:
    return None if at is None else int(round(at * 1000))


def _name(value: str | None) -> str | None:
    if isinstance(value, str) and value.startswith("arn:"):
        return value.rsplit("/", 1)[-1]
    return value


def _job_summary(job: Job) -> dict[str, Any]:
    summary = {
        "jobArn": job_arn(job.job_id), "jobId": job.job_id, "jobName": job.job_name,
        "jobQueue": job.queue, "serviceJobType": "SAGEMAKER_TRAINING",
        "status": job.status.value, "statusReason": job.status_reason,
        "quotaShareName": job.share, "schedulingPriority": job.priority,
        "createdAt": _ms(job.created_at), "scheduledAt": _ms(job.dispatched_at),
        "capacityUsage": [{"capacityUnit": u, "quantity": n} for u, n in job.need],
        "attempt": job.attempt,
    }  # fmt: skip
    if job.history:
        latest = job.history[-1]
        summary["latestAttempt"] = {"serviceResourceId": _attempt(job, latest)["serviceResourceId"]}
        if latest[2] is not None:
            summary["startedAt"] = _ms(latest[2])
    if job.stopped_at is not None:
        summary["stoppedAt"] = _ms(job.stopped_at)
    if job.is_terminated:
        summary["isTerminated"] = True
    return summary


def describe_service_job(state: State, request: dict) -> dict[str, Any]:
    job_id = _name(request.get("jobId"))
    job = state.jobs.get(job_id)
    if job is None:
        raise ApiError(f"Job {job_id} does not exist")
    described = _job_summary(job)
    described.update({
        "borrowed": [{"capacityUnit": u, "quantity": n} for u, n in job.borrowed],
        "preemptionConfiguration": (
            None if job.preemption_retries is None
            else {"preemptionRetriesBeforeTermination": job.preemption_retries}
        ),
        "retryStrategy": {"attempts": job.attempts_max},
        "attemptsUsed": job.attempts_used,
        "timeoutConfig": (None if job.attempt_timeout_s is None
                          else {"attemptDurationSeconds": job.attempt_timeout_s}),
    })  # fmt: skip
    if job.history:
        described["attempts"] = [_attempt(job, record) for record in job.history]
    if job.preempted_count:
        described["preemptionSummary"] = {
            "preemptedAttemptCount": job.preempted_count,
            "recentPreemptedAttempts": [_attempt(job, record) for record in job.history
                                        if record[5]],
        }  # fmt: skip
    if job.tags:
        described["tags"] = dict(job.tags)
    if job.payload is not None:
        described["serviceRequestPayload"] = job.payload
    return described


# AWS's ServiceJobStatus values, and ALL (every status; the AWS clients' model has no ALL).
JOB_STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING",
                "SUCCEEDED", "FAILED")  # fmt: skip


def job_status_asked(request: dict) -> str:
    """`jobStatus` (default RUNNING), refused when it is no status at all: a typo such as
    RUNING must not answer an empty list as if no job were running."""
    status = request.get("jobStatus") or "RUNNING"
    if status != "ALL" and status not in JOB_STATUSES:
        raise ApiError(f"jobStatus {status!r} is not a job status; expected one of "
                       f"{', '.join(JOB_STATUSES)} or ALL")  # fmt: skip
    return status


def list_service_jobs(state: State, request: dict) -> dict[str, Any]:
    """Newest first.  `jobStatus` defaults to RUNNING; a JOB_NAME filter ignores the status,
    a QUOTA_SHARE_NAME filter combines with it (spec 4.2)."""
    queue = _name(request.get("jobQueue"))
    if queue not in state.queues:
        raise ApiError(f"Job queue {queue} does not exist")
    status = job_status_asked(request)
    filters = {item["name"]: item.get("values", []) for item in request.get("filters") or []}
    unknown = set(filters) - {"QUOTA_SHARE_NAME", "JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT"}
    if "SHARE_IDENTIFIER" in unknown:
        raise ApiError("SHARE_IDENTIFIER filters fair-share queues; use QUOTA_SHARE_NAME")
    if unknown:
        raise ApiError(f"Unknown filter {sorted(unknown)[0]}; expected QUOTA_SHARE_NAME, "
                       "JOB_NAME, BEFORE_CREATED_AT or AFTER_CREATED_AT")  # fmt: skip
    before = _created_bound(filters.get("BEFORE_CREATED_AT"))
    after = _created_bound(filters.get("AFTER_CREATED_AT"))
    share_names = set(filters.get("QUOTA_SHARE_NAME", []))
    name_patterns = filters.get("JOB_NAME", [])
    use_status = not name_patterns
    limit = int(request.get("maxResults") or 100)
    jobs = []
    for job in reversed(list(state.jobs.values())):
        if job.queue != queue:
            continue
        if use_status and status != "ALL" and job.status.value != status:
            continue
        if share_names and job.share not in share_names:
            continue
        if name_patterns and not any(_name_matches(job.job_name, p) for p in name_patterns):
            continue
        created = _ms(job.created_at)
        if (before is not None and created >= before) or (after is not None and created <= after):
            continue
        jobs.append(_job_summary(job))
        if len(jobs) >= limit:
            break
    return {"jobSummaryList": jobs}


def _created_bound(values: list | None) -> int | None:
    """AWS takes the creation-time bound as epoch milliseconds in the filter's values."""
    if not values:
        return None
    try:
        return int(values[0])
    except (TypeError, ValueError):
        raise ApiError(f"created-at filters take epoch milliseconds, not {values[0]!r}") from None


def _name_matches(name: str, pattern: str) -> bool:
    name, pattern = name.lower(), pattern.lower()
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


def get_job_queue_snapshot(state: State, request: dict) -> dict[str, Any]:
    queue_name = _name(request.get("jobQueue"))
    queue = state.queues.get(queue_name)
    if queue is None:
        raise ApiError(f"Job queue {queue_name} does not exist")
    fronts = {}
    runnable = []
    for share in queue.shares.values():
        head = state_head(state, share)
        fronts[share.name] = [] if head is None else [
            {"jobArn": job_arn(head.job_id), "earliestTimeAtPosition": _ms(head.created_at)}
        ]
    for job in state.jobs.values():
        if job.queue == queue_name and job.status.value == "RUNNABLE":
            runnable.append(job)
    runnable.sort(key=lambda job: (-job.priority, job.seq))
    return {
        "frontOfQueue": {"jobs": [{"jobArn": job_arn(job.job_id),
                                   "earliestTimeAtPosition": _ms(job.created_at)}
                                  for job in runnable[:100]]},
        "frontOfQuotaShares": {"quotaShares": fronts},
        "queueUtilization": {
            "totalCapacityUsage": [{"capacityUnit": u, "quantity": float(n)}
                                   for u, n in sorted(queue.usage.items()) if n],
            "quotaShareUtilization": {"topCapacityUtilization": [
                {"quotaShareName": share.name,
                 "capacityUsage": [{"capacityUnit": u, "quantity": float(n)}
                                   for u, n in sorted(share.usage.items()) if n]}
                for share in queue.shares.values() if any(share.usage.values())
            ]},
        },
    }  # fmt: skip


def state_head(state: State, share) -> Job | None:
    """The share's head without touching the heap (readers must not mutate state)."""
    best = None
    for priority, seq, job_id in share.heap:
        job = state.jobs.get(job_id)
        if job is None or job.status.value != "RUNNABLE" or (-job.priority, job.seq) != (priority, seq):
            continue
        if best is None or (priority, seq) < (-best.priority, best.seq):
            best = job
    return best


def _share_detail(queue_name: str, share) -> dict[str, Any]:
    config = share.config.model_dump(mode="json", by_alias=True)
    for key in ("kind", "at", "commandSeq"):
        config.pop(key, None)
    config.update({
        "quotaShareArn": f"{ARN}:job-queue/{queue_name}/quota-share/{share.name}",
        "jobQueueArn": f"{ARN}:job-queue/{queue_name}", "status": "VALID",
        "usage": dict(share.usage),
    })  # fmt: skip
    if share.options is not None:  # quotasched's options beyond AWS; AWS clients ignore it
        options = share.options.options.model_dump(mode="json", by_alias=True, exclude_none=True)
        if options:
            config["options"] = options
    return config


def list_quota_shares(state: State, request: dict) -> dict[str, Any]:
    queue_name = _name(request.get("jobQueue"))
    queue = state.queues.get(queue_name)
    if queue is None:
        raise ApiError(f"Job queue {queue_name} does not exist")
    return {"quotaShares": [_share_detail(queue_name, share) for share in queue.shares.values()]}


def describe_quota_share(state: State, request: dict) -> dict[str, Any]:
    arn = request.get("quotaShareArn")
    if arn:
        _, _, rest = arn.partition("job-queue/")
        queue_name, _, share_name = rest.partition("/quota-share/")
    else:
        queue_name, share_name = _name(request.get("jobQueue")), request.get("quotaShareName")
    queue = state.queues.get(queue_name)
    share = queue.shares.get(share_name) if queue else None
    if share is None:
        raise ApiError(f"Quota share {share_name} does not exist in job queue {queue_name}")
    return _share_detail(queue_name, share)


def describe_service_environments(state: State, request: dict) -> dict[str, Any]:
    return {"serviceEnvironments": [
        {"serviceEnvironmentName": env.name, "state": env.state.value, "status": "VALID",
         "capacityLimits": [{"capacityUnit": u, "maxCapacity": n} for u, n in env.capacity.items()],
         "jobQueue": env.queue}
        for env in state.environments.values()
    ]}  # fmt: skip


def _queue_detail(q) -> dict[str, Any]:
    detail = {
        "jobQueueName": q.name, "jobQueueArn": f"{ARN}:job-queue/{q.name}", "state": q.state.value,
        "status": "VALID", "priority": q.priority, "schedulingPolicy": q.policy,
        "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": q.environment}],
        "jobStateTimeLimitActions": [action.model_dump(mode="json", by_alias=True)
                                     for action in q.config.job_state_time_limit_actions],
    }  # fmt: skip
    # quotasched's queue options beyond AWS, so `config plan` can compare them; AWS clients
    # ignore it, and a queue whose options are all off shows none, as before they existed
    options = JobQueueOptions() if q.options is None else q.options.options
    if options != JobQueueOptions():
        detail["options"] = options.model_dump(mode="json", by_alias=True, exclude_none=True)
    return detail


def describe_job_queues(state: State, request: dict) -> dict[str, Any]:
    return {"jobQueues": [_queue_detail(q) for q in state.queues.values()]}


def describe_scheduling_policies(state: State, request: dict) -> dict[str, Any]:
    return {"schedulingPolicies": [
        {"name": name, "arn": f"{ARN}:scheduling-policy/{name}",
         "quotaSharePolicy": policy.quota_share_policy.model_dump(mode="json", by_alias=True)}
        for name, policy in state.policies.items()
    ]}  # fmt: skip


VERBS = {
    "describe-service-job": describe_service_job,
    "list-service-jobs": list_service_jobs,
    "get-job-queue-snapshot": get_job_queue_snapshot,
    "list-quota-shares": list_quota_shares,
    "describe-quota-share": describe_quota_share,
    "describe-service-environments": describe_service_environments,
    "describe-job-queues": describe_job_queues,
    "describe-scheduling-policies": describe_scheduling_policies,
}


def answer(state: State, verb: str, request: dict) -> dict[str, Any]:
    handler = VERBS.get(verb)
    if handler is None:
        raise ApiError(f"Unknown operation {verb}; expected one of {', '.join(VERBS)}")
    try:
        return handler(state, request)
    except ApiError as error:
        return {"error": {"type": "ClientException", "message": str(error)}}


FLEET_VERBS = frozenset({"describe-service-environments", "describe-scheduling-policies"})


# What a job's description shows to its own share only: AWS scopes them by IAM policy, here
# the subject a team's credentials pin says whose they are (`events.subjects.api_subject`).
PRIVATE = ("serviceRequestPayload", "tags")


def scoped(answer: Any, queue: str | None, share: str) -> Any:
    """`answer` as a team of (`queue`, `share`) may see it: every job of another share, at any
    depth of the answer (a description, a list's summaries, whatever a verb may add), without
    its `PRIVATE` members; its summary stays (id, name, status, share, priority, usage)."""
    if isinstance(answer, list):
        return [scoped(item, queue, share) for item in answer]
    if not isinstance(answer, dict):
        return answer
    other = "jobId" in answer and (answer.get("jobQueue"), answer.get("quotaShareName")) != (
        queue, share)  # fmt: skip
    return {key: scoped(value, queue, share) for key, value in answer.items()
            if not (other and key in PRIVATE)}  # fmt: skip


def answer_in(scope: Partition, state: State, verb: str, request: dict,
              subject_queue: str | None = None,
              subject_share: str | None = None) -> dict[str, Any]:  # fmt: skip
    """`answer` as one scheduling partition gives it (see `partition.py`), to a request that
    arrived on `qm.api.<subject_queue>.<verb>` (None: `qm.api.~.<verb>` or `qm.api.<verb>`),
    or on a team's `qm.api.<subject_queue>.<subject_share>.<verb>`: then answered about that
    queue and with the payloads and tags of that share's jobs only (`scoped`).

    A request on a queue's subject is answered about that queue only, whoever answers it, so
    NATS permissions on `qm.api.<queue>.<share>.*` confine a team's reads to its queue.  A single
    partition knows everything.  The fleet partition answers the fleet-wide verbs and, for
    the rest, names the job queues to ask instead (`{"redirect": [...]}`: the client asks each
    queue's partition on `qm.api.<queue>.<verb>` and merges).  A queue partition answers for
    its own queue, whose state (and configuration updates) only it holds.
    """
    if subject_share is not None:  # `~` for a missing queue: about no queue, so nothing
        answered = answer_in(scope, state, verb, request, subject_queue or ANY)
        return scoped(answered, subject_queue, subject_share)
    if verb in FLEET_VERBS or verb not in VERBS:
        return answer(state, verb, request)
    if subject_queue is None and scope.token is not None and not scope.is_queue:
        return {"redirect": sorted(state.queues)}
    queue = subject_queue or (scope.token if scope.is_queue else None)
    if queue is None:
        return answer(state, verb, request)
    named = _name(request.get("jobQueue"))
    arn = request.get("quotaShareArn")
    if arn and "job-queue/" in arn:
        named = arn.split("job-queue/", 1)[1].split("/", 1)[0]
    if named is not None and named != queue:
        return {"error": {"type": "ClientException", "message": (
            f"A request about job queue {named} must be sent on {API_PREFIX}.{named}.{verb}")}}
    if verb in ("list-service-jobs", "get-job-queue-snapshot", "list-quota-shares") or (
            verb == "describe-quota-share" and not arn):  # fmt: skip
        request = {**request, "jobQueue": queue}
    described = answer(state, verb, request)
    if verb == "describe-service-job" and described.get("jobQueue") not in (None, queue):
        return {"error": {"type": "ClientException",
                          "message": f"Job {_name(request.get('jobId'))} does not exist"}}
    if verb == "describe-job-queues":
        described["jobQueues"] = [q for q in described["jobQueues"] if q["jobQueueName"] == queue]
    return described

