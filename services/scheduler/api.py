"""Read answers shaped like the AWS Batch API, computed from the scheduler's committed state.

`answer(state, verb, request)` is pure: the service calls it under its state lock for
`qm.api.<verb>` requests, and the tests call it directly.  Times are epoch milliseconds, as
AWS returns them; ARNs use region `local` and account `000000000000`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

from quotasched.events.subjects import ANY, API_PREFIX
from quotasched.events.values import JobQueueOptions
from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.core.waiting import in_order, waiting
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.reads import ReadIndex, Selection

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


# ListServiceJobs' bounds.  AWS: maxResults 1-1000, default 100.  AWS's model bounds neither
# the filters nor their values, so these are quotasched's (a value is at most a job name, 128).
MAX_RESULTS = 1000
DEFAULT_RESULTS = 100
MAX_FILTERS = 5
MAX_FILTER_VALUES = 100
MAX_FILTER_VALUE_CHARS = 128
MAX_ANSWER_BYTES = 1024 * 1024  # the server's default max_payload; the service passes its own
ANSWER_RESERVE_BYTES = 4096  # kept free in a page for the envelope (nextToken, scoping)
FILTER_NAMES = ("QUOTA_SHARE_NAME", "JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT")


def list_service_jobs(state: State, request: dict, reads: ReadIndex | None = None,
                      max_bytes: int = MAX_ANSWER_BYTES,
                      defer: bool = False) -> dict[str, Any]:  # fmt: skip
    """Newest first.  `jobStatus` defaults to RUNNING; a JOB_NAME filter ignores the status,
    a QUOTA_SHARE_NAME filter combines with it (spec 4.2).

    Paged: at most `maxResults` jobs and `max_bytes` of encoded answer, and a `nextToken`
    when there may be more.  The jobs come from `reads` (an index kept by the service;
    built here when not given), so a request costs its page plus at most `SCAN_BUDGET`
    jobs examined; a page may thus be short and still carry a `nextToken`.  `defer`: the
    summaries are left to encode (`{"jobSummaryList": JobPage}`, see `JobPage`)."""
    queue = _name(request.get("jobQueue"))
    if queue not in state.queues:
        raise ApiError(f"Job queue {queue} does not exist")
    status = job_status_asked(request)
    limit = max_results(request.get("maxResults"))
    filters = list_filters(request.get("filters"))
    before = created_bound(filters.get("BEFORE_CREATED_AT"))
    after = created_bound(filters.get("AFTER_CREATED_AT"))
    share_names = set(filters.get("QUOTA_SHARE_NAME", []))
    name_patterns = filters.get("JOB_NAME", [])
    use_status = not name_patterns and status != "ALL"
    cursor = _cursor(request.get("nextToken"))
    if reads is None or reads.state is not state:
        reads = ReadIndex(state)
    reads.catch_up()

    # AWS's JOB_NAME rule: case-insensitive, exact, or a prefix before a trailing `*`;
    # every value at once (a set and a tuple of prefixes: C-speed per job)
    lowered = [pattern.lower() for pattern in name_patterns]
    exact_names = {pattern for pattern in lowered if not pattern.endswith("*")}
    name_prefixes = tuple(pattern[:-1] for pattern in lowered if pattern.endswith("*"))

    def keep(job: Job) -> bool:
        if use_status and job.status.value != status:
            return False
        if share_names and job.share not in share_names:
            return False
        if name_patterns:
            name = job.job_name.lower()
            if name not in exact_names and not name.startswith(name_prefixes):
                return False
        created = _ms(job.created_at)
        return not ((before is not None and created >= before)
                    or (after is not None and created <= after))  # fmt: skip

    walk = reads.candidates(queue, share_names, name_patterns, status if use_status else "ALL",
                            cursor)  # fmt: skip
    if walk is None:  # an indexed lookup would cost more than the scan
        walk = reads.scan(queue, cursor)
    page = JobPage(Selection(walk, keep, limit), max_bytes)
    if defer:
        return {"jobSummaryList": page}
    for _ in page.steps():
        pass
    return page.document()


class JobPage:
    """A page of ListServiceJobs: its jobs selected, then their summaries encoded, a step at a
    time (`steps`, so that the service can let the decisions run between steps), cut where the
    answer would outgrow `max_bytes`; then the answer as a document or as the bytes to send."""

    # Summaries encoded between two steps: about 0.07 ms here.  A decision passes several
    # turns of the loop (command in, decide, append, acknowledgement), each of which may wait
    # for one step: with 20 a step (0.26 ms) the writer's p99 under the heaviest reads was
    # 3.1-3.9x quiet, with 5 it was 2.7x (read_pressure_bench.py, 2026-12-05), for as many reads.
    CHUNK = 5

    def __init__(self, selection: Selection, max_bytes: int) -> None:
        self.selection = selection
        self.next_seq: int | None = None
        self.max_bytes = max_bytes
        self.room = max_bytes - ANSWER_RESERVE_BYTES
        self.summaries: list[dict[str, Any]] = []
        self.encoded: list[str] = []

    def steps(self) -> Iterator[None]:
        """Select the page's jobs, then encode their summaries, a step at a time."""
        yield from self.selection.steps()
        self.next_seq = self.selection.next_seq
        for index, job in enumerate(self.selection.kept):
            if index and index % self.CHUNK == 0:
                yield
            summary = _job_summary(job)
            text = json.dumps(summary)
            self.room -= len(text.encode()) + 2
            if self.room < 0:
                if not self.summaries:
                    raise ApiError(f"Job {job.job_id}'s summary alone exceeds the answer limit "
                                   f"of {self.max_bytes} bytes")  # fmt: skip
                self.next_seq = job.seq + 1  # this job first on the next page
                return
            self.summaries.append(summary)
            self.encoded.append(text)

    def document(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"jobSummaryList": self.summaries}
        if self.next_seq is not None:
            answer["nextToken"] = _token(self.next_seq)
        return answer

    def encode(self) -> bytes:
        """`json.dumps(self.document())`, without encoding the summaries again."""
        tail = "" if self.next_seq is None else f', "nextToken": "{_token(self.next_seq)}"'
        return f'{{"jobSummaryList": [{", ".join(self.encoded)}]{tail}}}'.encode()


def max_results(value: Any) -> int:
    """A list request's maxResults: 1 to MAX_RESULTS (AWS's bound), DEFAULT_RESULTS when absent;
    shared with the projection's answer to the same request (projections/queries.py)."""
    if value is None:
        return DEFAULT_RESULTS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RESULTS:
        raise ApiError(f"maxResults must be an integer from 1 to {MAX_RESULTS}, not {value!r}")
    return value


def list_filters(given: Any) -> dict[str, list[str]]:
    """The request's filters by name, refused when unknown or over the bounds."""
    given = given or []
    if not isinstance(given, list) or len(given) > MAX_FILTERS:
        raise ApiError(f"filters must be a list of at most {MAX_FILTERS} filters")
    filters: dict[str, list[str]] = {}
    for item in given:
        name = item.get("name") if isinstance(item, dict) else None
        if name == "SHARE_IDENTIFIER":
            raise ApiError("SHARE_IDENTIFIER filters fair-share queues; use QUOTA_SHARE_NAME")
        if name not in FILTER_NAMES:
            raise ApiError(f"Unknown filter {name}; expected QUOTA_SHARE_NAME, "
                           "JOB_NAME, BEFORE_CREATED_AT or AFTER_CREATED_AT")  # fmt: skip
        values = item.get("values") or []
        if not isinstance(values, list) or len(values) > MAX_FILTER_VALUES:
            raise ApiError(f"filter {name} takes at most {MAX_FILTER_VALUES} values")
        for value in values:
            if not isinstance(value, str) or len(value) > MAX_FILTER_VALUE_CHARS:
                raise ApiError(f"filter {name}'s values are strings of at most "
                               f"{MAX_FILTER_VALUE_CHARS} characters")  # fmt: skip
        filters[name] = values
    return filters


def _token(before_seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"before": before_seq}).encode()).decode()


def _cursor(token: Any) -> int | None:
    """The acceptance seq a `nextToken` continues below (None: from the newest)."""
    if token is None or token == "":
        return None
    try:
        before = json.loads(base64.urlsafe_b64decode(str(token)))["before"]
        if isinstance(before, int) and not isinstance(before, bool):
            return before
    except (ValueError, KeyError, TypeError):
        pass
    raise ApiError("nextToken is not one this API gave")


def created_bound(values: list | None) -> int | None:
    """AWS takes the creation-time bound as epoch milliseconds in the filter's values (one
    rule for the scheduler's answer and the projection's, projections/queries.py)."""
    if not values:
        return None
    try:
        return int(values[0])
    except (TypeError, ValueError):
        raise ApiError(f"created-at filters take epoch milliseconds, not {values[0]!r}") from None


def get_job_queue_snapshot(state: State, request: dict) -> dict[str, Any]:
    queue_name = _name(request.get("jobQueue"))
    queue = state.queues.get(queue_name)
    if queue is None:
        raise ApiError(f"Job queue {queue_name} does not exist")
    fronts = {}
    runnable = []
    for share in queue.shares.values():
        head = state.peek(share)
        fronts[share.name] = [] if head is None else [
            {"jobArn": job_arn(head.job_id), "earliestTimeAtPosition": _ms(head.created_at),
             "waitingReason": waiting_reason(state, head)}
        ]  # fmt: skip
    for job in state.jobs.values():
        if job.queue == queue_name and job.status.value == "RUNNABLE":
            runnable.append(job)
    runnable.sort(key=lambda job: (-job.priority, job.seq))
    updated = _ms(state.time)  # as of the last command decided (the scheduler's clock)
    return {
        "frontOfQueue": {"jobs": [{"jobArn": job_arn(job.job_id),
                                   "earliestTimeAtPosition": _ms(job.created_at)}
                                  for job in runnable[:100]], "lastUpdatedAt": updated},
        "frontOfQuotaShares": {"quotaShares": fronts, "lastUpdatedAt": updated},
        "queueUtilization": {
            "lastUpdatedAt": updated,
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


# list-waiting-jobs' bounds (quotasched's own verb).  A page costs what it shows: the core
# walks the share's heap best-first to the page (`core.waiting.in_order`) and tells each job
# how many are ahead of it, so no reason walks the whole share.
WAITING_LIMIT_MAX = 100
WAITING_LIMIT_DEFAULT = 20


def _page_bound(request: dict, name: str, default: int, most: int | None) -> int:
    value = request.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
            most is not None and value > most):  # fmt: skip
        bounds = f"from 0 to {most}" if most is not None else "of 0 or more"
        raise ApiError(f"{name} must be an integer {bounds}, not {value!r}")
    return value


def list_waiting_jobs(state: State, request: dict) -> dict[str, Any]:
    """The RUNNABLE jobs of one quota share in dispatch order (priority, then acceptance: its
    heap's order), `offset` of them skipped, at most `limit` (0 to WAITING_LIMIT_MAX, default
    WAITING_LIMIT_DEFAULT), each with why it waits as the core says it (`waitingReason`, as
    get-job-queue-snapshot gives the heads); `total` counts them all (the share's queued jobs
    less its dispatched ones), `nextOffset` is where the next page starts (None: no more).
    An offset past the end answers no jobs.  quotasched's own verb: AWS has no such list."""
    queue_name = _name(request.get("jobQueue"))
    queue = state.queues.get(queue_name)
    if queue is None:
        raise ApiError(f"Job queue {queue_name} does not exist")
    share_name = request.get("quotaShareName")
    share = queue.shares.get(share_name) if isinstance(share_name, str) else None
    if share is None:
        raise ApiError(f"Quota share {share_name} does not exist in job queue {queue_name}")
    offset = _page_bound(request, "offset", 0, None)
    limit = _page_bound(request, "limit", WAITING_LIMIT_DEFAULT, WAITING_LIMIT_MAX)
    total = max(0, share.live - len(share.dispatched))
    page = [{"jobId": job.job_id, "jobName": job.job_name, "schedulingPriority": job.priority,
             "createdAt": _ms(job.created_at),
             "waitingReason": waiting_reason(state, job, ahead=offset + index)}
            for index, job in enumerate(in_order(state, share, offset, limit))]  # fmt: skip
    after = offset + len(page)
    return {"jobQueue": queue_name, "quotaShareName": share.name, "offset": offset,
            "limit": limit, "total": total, "jobs": page,
            "nextOffset": after if after < total and limit else None}  # fmt: skip


def waiting_reason(state: State, job: Job, ahead: int | None = None) -> dict[str, str]:
    """Why a RUNNABLE job waits, as the core says it (`core.waiting`): `code` (the metric's
    `reason` label) and `message`, the sentence `quotasched explain` tells.  An addition to
    AWS's shapes, which AWS clients ignore.  `ahead`: the jobs before it, when known."""
    found = waiting(state, job, ahead=ahead)
    return {"code": found.code, "message": found.text}


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
    "list-waiting-jobs": list_waiting_jobs,
    "list-quota-shares": list_quota_shares,
    "describe-quota-share": describe_quota_share,
    "describe-service-environments": describe_service_environments,
    "describe-job-queues": describe_job_queues,
    "describe-scheduling-policies": describe_scheduling_policies,
}


def answer(state: State, verb: str, request: dict, reads: ReadIndex | None = None,
           max_bytes: int = MAX_ANSWER_BYTES, defer: bool = False) -> dict[str, Any]:  # fmt: skip
    """`reads`: the service's index of `state`'s jobs (list-service-jobs builds one when not
    given); `max_bytes`: the most a list's encoded answer may take (the bus's max_payload);
    `defer`: a list's page is left to encode (see `JobPage`)."""
    handler = VERBS.get(verb)
    if handler is None:
        raise ApiError(f"Unknown operation {verb}; expected one of {', '.join(VERBS)}")
    try:
        if handler is list_service_jobs:
            return list_service_jobs(state, request, reads, max_bytes, defer)
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
              subject_queue: str | None = None, subject_share: str | None = None,
              reads: ReadIndex | None = None, max_bytes: int = MAX_ANSWER_BYTES,
              defer: bool = False) -> dict[str, Any]:  # fmt: skip
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
        answered = answer_in(scope, state, verb, request, subject_queue or ANY, None, reads,
                             max_bytes, defer)  # fmt: skip
        return scoped(answered, subject_queue, subject_share)
    if verb in FLEET_VERBS or verb not in VERBS:
        return answer(state, verb, request, reads, max_bytes, defer)
    if subject_queue is None and scope.token is not None and not scope.is_queue:
        return {"redirect": sorted(state.queues)}
    queue = subject_queue or (scope.token if scope.is_queue else None)
    if queue is None:
        return answer(state, verb, request, reads, max_bytes, defer)
    named = _name(request.get("jobQueue"))
    arn = request.get("quotaShareArn")
    if arn and "job-queue/" in arn:
        named = arn.split("job-queue/", 1)[1].split("/", 1)[0]
    if named is not None and named != queue:
        return {"error": {"type": "ClientException", "message": (
            f"A request about job queue {named} must be sent on {API_PREFIX}.{named}.{verb}")}}
    if verb in ("list-service-jobs", "get-job-queue-snapshot", "list-waiting-jobs",
                "list-quota-shares") or (
            verb == "describe-quota-share" and not arn):  # fmt: skip
        request = {**request, "jobQueue": queue}
    described = answer(state, verb, request, reads, max_bytes, defer)
    if verb == "describe-service-job" and described.get("jobQueue") not in (None, queue):
        return {"error": {"type": "ClientException",
                          "message": f"Job {_name(request.get('jobId'))} does not exist"}}
    if verb == "describe-job-queues":
        described["jobQueues"] = [q for q in described["jobQueues"] if q["jobQueueName"] == queue]
    return described

