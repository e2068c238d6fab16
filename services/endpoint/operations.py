"""Each supported AWS Batch operation, as the rest of quotasched already knows it: a write is
the same command every other path publishes (decided by the scheduler, its refusal answered
as AWS's ClientException), a read is the scheduler's read API (`services/scheduler/api.py`,
`qm.api.<queue>.<verb>`).  Nothing here keeps state: no second source of truth."""

from __future__ import annotations

import base64
import json
from typing import Any

from quotasched.services.endpoint.roles import ResourceDenied
from quotasched.services.scheduler.api import ARN, job_arn

DECISION_WAIT_S = 30.0  # a write's decision
READ_WAIT_S = 10.0  # a read's answer (no responders: asked again for at most RESPONDER_WAIT_S)


class Refused(Exception):
    """An answer in AWS's error shape: ClientException (400), TooManyRequestsException (429)
    or ServerException (500)."""

    def __init__(self, message: str, status: int = 400, kind: str = "ClientException"):
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind

    @property
    def service_side(self) -> bool:
        """The service's own trouble (throttled, or failed), not an answer about what was
        asked: never to be taken for a job's own refusal."""
        return self.status == 429 or self.status >= 500


def throttled(message: str) -> Refused:
    """AWS's throttling answer, which botocore retries with backoff (its standard and legacy
    retry modes both know TooManyRequestsException and HTTP 429).  A scheduler that did not
    answer in time (overloaded, failing over, or not running) is no fault of the request and
    no failure either: the client should come again, later."""
    return Refused(f"{message}; retry later", 429, "TooManyRequestsException")


def _name(value: str | None) -> str | None:
    return value.rsplit("/", 1)[-1] if isinstance(value, str) and value.startswith("arn:") else value


def share_arn(queue: str, share: str) -> str:
    return f"{ARN}:job-queue/{queue}/quota-share/{share}"


def _share_of(arn: str) -> tuple[str, str]:
    _, _, rest = arn.partition(":job-queue/")
    queue, _, share = rest.partition("/quota-share/")
    if not queue or not share or "/" in share:
        raise Refused(f"{arn} is not a quota share ARN ({ARN}:job-queue/<queue>/quota-share/<name>)")
    return queue, share


# -- the bus ---------------------------------------------------------------------------------


async def _decide(bus, command: dict[str, Any]) -> list:
    """Publish one command and wait for its decision; a refusal is a ClientException."""
    from nats.errors import NoRespondersError
    from nats.js.errors import NotFoundError

    from quotasched.events.codec import DecodeError, decode_command
    from quotasched.events.facts import CommandRejected
    from quotasched.services.client import ClientError, GateRefused

    command = {key: value for key, value in command.items() if value is not None}
    try:
        decode_command(json.dumps(command))
    except DecodeError as error:
        raise Refused(error.reason) from None
    try:
        facts = await bus.submit_and_wait(command, timeout=DECISION_WAIT_S)
    except GateRefused as error:  # over the share's limits: refused before the stream
        raise (Refused(str(error), 429, "TooManyRequestsException") if error.throttled
               else Refused(str(error))) from None  # fmt: skip
    except ClientError as error:  # e.g. the job to update does not exist
        raise Refused(str(error)) from None
    except NotFoundError:
        raise Refused("the NATS server has no quotasched streams yet", 500, "ServerException") from None
    except NoRespondersError:  # before anything was stored: finding the job, or JetStream
        raise throttled("nothing answered the command (no scheduler leading, or JetStream not "
                        "answering); nothing was stored") from None  # fmt: skip
    except TimeoutError:
        raise throttled(f"the scheduler did not decide within {DECISION_WAIT_S:g} s (overloaded, "
                        "or none is leading); the command may be stored and then decided, in "
                        "order (a SubmitServiceJob retried with its clientToken is the same job)"
                        ) from None  # fmt: skip
    for fact in facts:
        if isinstance(fact, CommandRejected):
            raise Refused(fact.status_reason)
    return facts


async def _ask(bus, verb: str, **params: Any) -> dict[str, Any]:
    """One read; an error the scheduler answers is a ClientException, as it says."""
    from nats.errors import NoRespondersError

    from quotasched.services.client import ClientError
    from quotasched.services.client.commands import SchedulerBusy
    from quotasched.services.client.reads import RESPONDER_WAIT_S

    try:
        return await bus.request(verb, timeout=READ_WAIT_S,
                                 **{k: v for k, v in params.items() if v is not None})
    except SchedulerBusy as error:  # its lists queue is full: the SDKs retry a 429
        raise Refused(str(error), 429, "TooManyRequestsException") from None
    except ClientError as error:
        raise Refused(str(error)) from None
    except NoRespondersError:
        raise throttled(f"no scheduler answered within {min(READ_WAIT_S, RESPONDER_WAIT_S):g} s "
                        "(none is leading: failing over, or not running)") from None  # fmt: skip
    except TimeoutError:
        raise throttled(f"the scheduler did not answer within {READ_WAIT_S:g} s "
                        "(overloaded)") from None  # fmt: skip


def _page(items: list, params: dict[str, Any], key: str, default: int = 100) -> dict[str, Any]:
    """AWS's paging over a list: `maxResults`, and an opaque `nextToken` (an offset)."""
    start = _offset(params["nextToken"]) if params.get("nextToken") else 0
    limit = params.get("maxResults") or default
    page = {key: items[start : start + limit]}
    if len(items) > start + limit:
        token = json.dumps({"offset": start + limit}).encode()
        page["nextToken"] = base64.urlsafe_b64encode(token).decode()
    return page


# -- writes ----------------------------------------------------------------------------------


async def create_scheduling_policy(bus, p: dict) -> dict:
    if p.get("fairsharePolicy") is not None:
        raise Refused("fairsharePolicy is not supported: quotasched schedules quota-share queues "
                      "(give quotaSharePolicy)")  # fmt: skip
    await _decide(bus, {"kind": "CreateSchedulingPolicy", "name": p["name"],
                        "quotaSharePolicy": p.get("quotaSharePolicy"), "tags": p.get("tags")})
    return {"name": p["name"], "arn": f"{ARN}:scheduling-policy/{p['name']}"}


async def update_scheduling_policy(bus, p: dict) -> dict:
    """FIFO is the only idle-resource strategy AWS's model allows, so an update of an existing
    policy's quotaSharePolicy can only restate it: answered, with nothing to publish."""
    if p.get("fairsharePolicy") is not None:
        raise Refused("fairsharePolicy is not supported: quotasched schedules quota-share queues "
                      "(give quotaSharePolicy)")  # fmt: skip
    name = _name(p["arn"])
    policies = (await _ask(bus, "describe-scheduling-policies"))["schedulingPolicies"]
    if not any(policy["name"] == name for policy in policies):
        raise Refused(f"Scheduling policy {name} does not exist")
    return {}


async def create_service_environment(bus, p: dict) -> dict:
    await _decide(bus, {"kind": "CreateServiceEnvironment", **p})
    name = p["serviceEnvironmentName"]
    return {"serviceEnvironmentName": name, "serviceEnvironmentArn": f"{ARN}:service-environment/{name}"}


async def update_service_environment(bus, p: dict) -> dict:
    await _decide(bus, {"kind": "UpdateServiceEnvironment", **p})
    name = _name(p["serviceEnvironment"])
    return {"serviceEnvironmentName": name, "serviceEnvironmentArn": f"{ARN}:service-environment/{name}"}


def _no_compute(p: dict) -> None:
    if p.get("computeEnvironmentOrder") is not None:
        raise Refused("quotasched job queues run on service environments: give "
                      "serviceEnvironmentOrder, not computeEnvironmentOrder")  # fmt: skip


async def create_job_queue(bus, p: dict) -> dict:
    _no_compute(p)
    if not p.get("schedulingPolicyArn"):
        raise Refused("a quota-share job queue needs schedulingPolicyArn (a scheduling policy "
                      "with a quotaSharePolicy)")  # fmt: skip
    command = {key: value for key, value in p.items() if key != "schedulingPolicyArn"}
    await _decide(bus, {"kind": "CreateJobQueue", **command,
                        "schedulingPolicy": p["schedulingPolicyArn"]})
    name = p["jobQueueName"]
    return {"jobQueueName": name, "jobQueueArn": f"{ARN}:job-queue/{name}"}


async def update_job_queue(bus, p: dict) -> dict:
    _no_compute(p)
    for member in ("schedulingPolicyArn", "serviceEnvironmentOrder"):
        if p.get(member) is not None:
            raise Refused(f"changing a job queue's {member} is not supported by quotasched yet")
    await _decide(bus, {"kind": "UpdateJobQueue", **p})
    name = _name(p["jobQueue"])
    return {"jobQueueName": name, "jobQueueArn": f"{ARN}:job-queue/{name}"}


async def create_quota_share(bus, p: dict) -> dict:
    await _decide(bus, {"kind": "CreateQuotaShare", **p})
    queue = _name(p["jobQueue"])
    return {"quotaShareName": p["quotaShareName"],
            "quotaShareArn": share_arn(queue, p["quotaShareName"])}


async def update_quota_share(bus, p: dict) -> dict:
    queue, share = _share_of(p["quotaShareArn"])
    rest = {key: value for key, value in p.items() if key != "quotaShareArn"}
    await _decide(bus, {"kind": "UpdateQuotaShare", "jobQueue": queue, "quotaShareName": share,
                        **rest})
    return {"quotaShareName": share, "quotaShareArn": share_arn(queue, share)}


async def delete_quota_share(bus, p: dict) -> dict:
    queue, share = _share_of(p["quotaShareArn"])
    await _decide(bus, {"kind": "DeleteQuotaShare", "jobQueue": queue, "quotaShareName": share})
    return {}


async def submit_service_job(bus, p: dict) -> dict:
    facts = await _decide(bus, {"kind": "SubmitServiceJob", **p})
    # the decision may begin with timers it fired (other jobs' facts): take the job's own
    job_id = next(fact.job_id for fact in facts
                  if fact.kind in ("JobSubmitted", "SubmissionDeduplicated"))  # fmt: skip
    return {"jobArn": job_arn(job_id), "jobName": p["jobName"], "jobId": job_id}


async def update_service_job(bus, p: dict) -> dict:
    job = await _ask(bus, "describe-service-job", jobId=p["jobId"])
    await _decide(bus, {"kind": "UpdateServiceJob", "jobId": job["jobId"],
                        "schedulingPriority": p["schedulingPriority"]})
    return {"jobArn": job_arn(job["jobId"]), "jobName": job["jobName"], "jobId": job["jobId"]}


async def terminate_service_job(bus, p: dict) -> dict:
    await _decide(bus, {"kind": "TerminateServiceJob", "jobId": _name(p["jobId"]),
                        "reason": p["reason"]})
    return {}


async def terminate_service_jobs(bus, p: dict) -> dict:
    """Each job terminated on its own (AWS's bulk form): a job that cannot be found counts as
    successful, as AWS says; any other refusal is that job's entry in `errors`.  The service's
    own trouble (a throttle, a failure) is the whole request's answer."""
    successful, errors = [], []
    for job in p["jobs"]:
        try:
            await _ask(bus, "describe-service-job", jobId=job)
        except Refused as refused:
            if refused.service_side:
                raise
            successful.append(job)  # not found
            continue
        try:
            await terminate_service_job(bus, {"jobId": job, "reason": p["reason"]})
        except Refused as refused:
            if refused.service_side:
                raise
            errors.append({"job": job, "code": refused.kind, "message": refused.message})
        else:
            successful.append(job)
    return {"successful": successful, "errors": errors}


# -- reads -----------------------------------------------------------------------------------


async def describe_service_job(bus, p: dict) -> dict:
    """With a team's key (`own_share`), a job of another share is AccessDeniedException, as
    AWS answers for a resource outside the caller's IAM policy: AWS never returns a job with
    its payload cut out.  Its summary stays visible through ListServiceJobs."""
    job = await _ask(bus, "describe-service-job", jobId=p["jobId"])
    own = getattr(bus, "own_share", None)
    if own is not None and (job.get("jobQueue"), job.get("quotaShareName")) != own:
        raise ResourceDenied(bus.role, job_arn(job["jobId"]),
                             f"the job belongs to quota share {job.get('quotaShareName')}, not "
                             f"{own[1]}")  # fmt: skip
    return job


async def list_service_jobs(bus, p: dict) -> dict:
    """One job queue's jobs, or (no `jobQueue`) every queue's, newest first as AWS lists them.

    `maxResults` is AWS's 1-1000 (a ClientException otherwise, as the scheduler's own refusal
    would be: the bus client would split a larger one into pages).  One queue: the
    scheduler's pages and `nextToken`.  Every queue: each queue's pages followed until the
    merged page is known, and an offset as `nextToken`."""
    limit = 100 if p.get("maxResults") is None else p["maxResults"]
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise Refused(f"maxResults must be an integer from 1 to 1000, not {limit!r}")
    if p.get("jobQueue"):
        return await _ask(bus, "list-service-jobs", jobQueue=p["jobQueue"],
                          jobStatus=p.get("jobStatus"), filters=p.get("filters"),
                          maxResults=limit, nextToken=p.get("nextToken"))
    start = _offset(p["nextToken"]) if p.get("nextToken") else 0
    wanted = start + limit + 1
    queues = [queue["jobQueueName"]
              for queue in (await _ask(bus, "describe-job-queues"))["jobQueues"]]  # fmt: skip
    jobs = []
    for queue in queues:
        token, found = None, []
        while len(found) < wanted:
            answer = await _ask(bus, "list-service-jobs", jobQueue=queue,
                                jobStatus=p.get("jobStatus"), filters=p.get("filters"),
                                maxResults=min(1000, wanted - len(found)), nextToken=token)
            found.extend(answer["jobSummaryList"])
            token = answer.get("nextToken")
            if token is None:
                break
        jobs.extend(found)
    jobs.sort(key=lambda job: job["createdAt"], reverse=True)  # stable: ties keep queue order
    return _page(jobs, p, "jobSummaryList")


def _offset(token: str) -> int:
    try:
        return int(json.loads(base64.urlsafe_b64decode(token))["offset"])
    except (ValueError, KeyError, TypeError):
        raise Refused("nextToken is not one this endpoint gave") from None


async def get_job_queue_snapshot(bus, p: dict) -> dict:
    return await _ask(bus, "get-job-queue-snapshot", jobQueue=p["jobQueue"])


async def list_quota_shares(bus, p: dict) -> dict:
    answer = await _ask(bus, "list-quota-shares", jobQueue=p["jobQueue"])
    return _page(answer["quotaShares"], p, "quotaShares")


async def describe_quota_share(bus, p: dict) -> dict:
    queue, _ = _share_of(p["quotaShareArn"])
    return await _ask(bus, "describe-quota-share", jobQueue=queue, quotaShareArn=p["quotaShareArn"])


def _named(items: list[dict], wanted: list[str] | None, field: str) -> list[dict]:
    names = {_name(item) for item in wanted or []}
    return [item for item in items if not names or item[field] in names]


async def describe_service_environments(bus, p: dict) -> dict:
    answer = await _ask(bus, "describe-service-environments")
    items = [{**env, "serviceEnvironmentArn": f"{ARN}:service-environment/{env['serviceEnvironmentName']}",
              "serviceEnvironmentType": "SAGEMAKER_TRAINING"}
             for env in answer["serviceEnvironments"]]  # fmt: skip
    return _page(_named(items, p.get("serviceEnvironments"), "serviceEnvironmentName"), p,
                 "serviceEnvironments")  # fmt: skip


async def describe_job_queues(bus, p: dict) -> dict:
    answer = await _ask(bus, "describe-job-queues")
    items = []
    for queue in answer["jobQueues"]:
        policy = queue.get("schedulingPolicy")
        items.append({**queue, "jobQueueType": "SAGEMAKER_TRAINING", "schedulingPolicyArn": (
            policy if policy is None or policy.startswith("arn:")
            else f"{ARN}:scheduling-policy/{policy}")})  # fmt: skip
    return _page(_named(items, p.get("jobQueues"), "jobQueueName"), p, "jobQueues")


async def describe_scheduling_policies(bus, p: dict) -> dict:
    answer = await _ask(bus, "describe-scheduling-policies")
    return {"schedulingPolicies": _named(answer["schedulingPolicies"], p.get("arns"), "name")}


OPERATIONS = {
    "CreateSchedulingPolicy": create_scheduling_policy,
    "UpdateSchedulingPolicy": update_scheduling_policy,
    "CreateServiceEnvironment": create_service_environment,
    "UpdateServiceEnvironment": update_service_environment,
    "CreateJobQueue": create_job_queue,
    "UpdateJobQueue": update_job_queue,
    "CreateQuotaShare": create_quota_share,
    "UpdateQuotaShare": update_quota_share,
    "DeleteQuotaShare": delete_quota_share,
    "SubmitServiceJob": submit_service_job,
    "UpdateServiceJob": update_service_job,
    "TerminateServiceJob": terminate_service_job,
    "TerminateServiceJobs": terminate_service_jobs,
    "DescribeServiceJob": describe_service_job,
    "ListServiceJobs": list_service_jobs,
    "GetJobQueueSnapshot": get_job_queue_snapshot,
    "ListQuotaShares": list_quota_shares,
    "DescribeQuotaShare": describe_quota_share,
    "DescribeServiceEnvironments": describe_service_environments,
    "DescribeJobQueues": describe_job_queues,
    "DescribeSchedulingPolicies": describe_scheduling_policies,
}


# Operations of the model quotasched does not perform, and why (the rest are container Batch).
NOT_HERE = {
    "DeleteSchedulingPolicy": "scheduling policies are never deleted in quotasched",
    "DeleteJobQueue": "job queues are never deleted in quotasched: disable one with "
                      "update-job-queue --state DISABLED",
    "DeleteServiceEnvironment": "service environments are never deleted in quotasched: "
                                "disable one with update-service-environment --state DISABLED",
    "TagResource": "tags are given when a job is submitted (describe-service-job shows them)",
    "UntagResource": "tags are given when a job is submitted (describe-service-job shows them)",
    "ListTagsForResource": "describe-service-job shows a job's tags",
}


async def perform(bus, operation: str, params: dict[str, Any]) -> dict[str, Any]:
    handler = OPERATIONS.get(operation)
    if handler is None:
        why = NOT_HERE.get(operation, "quotasched serves AWS Batch quota management (service "
                                      "environments, quota-share job queues, service jobs)")
        raise Refused(f"{operation} is not supported by quotasched: {why}")
    return await handler(bus, params)
