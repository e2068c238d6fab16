"""The real AWS clients against `quotasched up`'s AWS Batch endpoint, unchanged but for the
endpoint URL: the `aws batch` CLI (awscli, a subprocess) and `boto3.client("batch")`.

One real `up` (embedded nats-server, scheduler, no executor: a dispatched job stays SCHEDULED,
no timer ticks) serves every test of this module; each test has its own service environment
and job queue.  The expectations are the seed notebook's, worked out by hand from the spec
(examples/notebook.jsonl): a service environment of 3 ml.g5.xlarge; in queue q shares qs1 (1,
LEND_AND_BORROW, borrowLimit 200), qs2 (1, LEND) and qs3 (1, RESERVE).  Three jobs of one
instance each submitted to qs1: the first runs on qs1's own instance, the second borrows qs2's
idle one (LEND lends), the third stays RUNNABLE (qs3 RESERVE lends nothing, the third instance
is qs3's).  Scheduling order is by priority within a share (high 3, med 2, low 1).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import Process
from tests.integration.helpers import NO_TICKS, ROOT

pytestmark = [pytest.mark.nats, pytest.mark.slow]

AWS = str(Path(sys.executable).parent / "aws")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy-secret",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
               "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}  # fmt: skip
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}})
START_CEILING_S = 120.0  # a generous ceiling for `up` to print its endpoint on 2 busy cores


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """The URL of the AWS Batch endpoint of a real `quotasched up` (its second line)."""
    tmp = tmp_path_factory.mktemp("aws-endpoint")
    env = {**os.environ, **NO_TICKS}
    up = Process(["up", "--data-dir", str(tmp / "data"), "--executor", "none", "--no-projector"],
                 env, tmp / "up.log")  # fmt: skip
    try:
        deadline = time.monotonic() + START_CEILING_S
        while True:
            lines = [line for line in up.output().splitlines()
                     if line.startswith("AWS_ENDPOINT_URL_BATCH=")]  # fmt: skip
            if lines:
                break
            if up.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`up` printed no AWS endpoint:\n{up.output()}")
            time.sleep(0.1)
        url = lines[0].split("=", 1)[1]
        assert url.startswith("http://127.0.0.1:")  # loopback only
        yield url
    finally:
        assert up.stop() == 0, up.output()


def aws(endpoint: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([AWS, "batch", "--endpoint-url", endpoint, *args], text=True,
                          capture_output=True, env={**os.environ, **CREDENTIALS})  # fmt: skip
    if check:
        assert done.returncode == 0, f"aws batch {args[0]}: {done.returncode} {done.stderr}"
    return done


def aws_json(endpoint: str, *args: str) -> dict:
    return json.loads(aws(endpoint, *args).stdout or "{}")


def aws_text(endpoint: str, *args: str) -> list[str]:
    return aws(endpoint, *args, "--output", "text").stdout.split()


def test_the_seed_notebook_through_the_real_aws_cli(endpoint):
    se, q = "se-cli", "q-cli"
    policy = aws_json(endpoint, "create-scheduling-policy", "--name", "sp-cli",
                      "--quota-share-policy", "idleResourceAssignmentStrategy=FIFO")
    assert policy == {"name": "sp-cli",
                      "arn": "arn:aws:batch:local:000000000000:scheduling-policy/sp-cli"}
    aws(endpoint, "create-service-environment", "--service-environment-name", se,
        "--service-environment-type", "SAGEMAKER_TRAINING",
        "--capacity-limits", "capacityUnit=ml.g5.xlarge,maxCapacity=3")
    queue = aws_json(endpoint, "create-job-queue", "--job-queue-name", q, "--priority", "1",
                     "--scheduling-policy-arn", policy["arn"], "--job-queue-type",
                     "SAGEMAKER_TRAINING", "--service-environment-order",
                     f"order=1,serviceEnvironment={se}")  # fmt: skip
    assert queue["jobQueueArn"] == f"arn:aws:batch:local:000000000000:job-queue/{q}"
    for share, sharing, preemption in (("qs1", "strategy=LEND_AND_BORROW,borrowLimit=200", "ENABLED"),
                                       ("qs2", "strategy=LEND", "DISABLED"),
                                       ("qs3", "strategy=RESERVE", "DISABLED")):  # fmt: skip
        created = aws_json(endpoint, "create-quota-share", "--job-queue", q,
                           "--quota-share-name", share,
                           "--capacity-limits", "capacityUnit=ml.g5.xlarge,maxCapacity=1",
                           "--resource-sharing-configuration", sharing,
                           "--preemption-configuration", f"inSharePreemption={preemption}")
        assert created["quotaShareArn"].endswith(f":job-queue/{q}/quota-share/{share}")
    assert aws_text(endpoint, "list-quota-shares", "--job-queue", q, "--query",
                    "quotaShares[].[quotaShareName,resourceSharingConfiguration.strategy]") == [
        "qs1", "LEND_AND_BORROW", "qs2", "LEND", "qs3", "RESERVE"]  # fmt: skip

    ids = {}
    for name, priority in (("high", "3"), ("med", "2"), ("low", "1")):
        submitted = aws_json(endpoint, "submit-service-job", "--job-name", name, "--job-queue", q,
                             "--quota-share-name", "qs1", "--scheduling-priority", priority,
                             "--service-job-type", "SAGEMAKER_TRAINING",
                             "--service-request-payload", PAYLOAD,
                             "--tags", f"stage={name}")  # fmt: skip
        assert submitted["jobName"] == name
        assert submitted["jobArn"] == f"arn:aws:batch:local:000000000000:job/{submitted['jobId']}"
        ids[name] = submitted["jobId"]

    def names(status: str) -> list[str]:
        return sorted(aws_text(endpoint, "list-service-jobs", "--job-queue", q, "--job-status",
                               status, "--query", "jobSummaryList[].jobName"))  # fmt: skip

    assert names("SCHEDULED") == ["high", "med"]  # own instance, and qs2's lent one
    assert names("RUNNABLE") == ["low"]  # qs3 RESERVE lends nothing

    low = aws_json(endpoint, "describe-service-job", "--job-id", ids["low"])
    assert (low["status"], low["quotaShareName"], low["schedulingPriority"], low["jobQueue"]) == (
        "RUNNABLE", "qs1", 1, q)  # fmt: skip
    assert low["capacityUsage"] == [{"capacityUnit": "ml.g5.xlarge", "quantity": 1.0}]
    assert low["tags"] == {"stage": "low"} and json.loads(low["serviceRequestPayload"]) == json.loads(PAYLOAD)
    assert "attempts" not in low  # never dispatched
    high = aws_json(endpoint, "describe-service-job", "--job-id", ids["high"])
    assert [attempt["serviceResourceId"]["value"] for attempt in high["attempts"]] == [
        f"arn:aws:sagemaker:local:000000000000:training-job/AWSBatch-{ids['high']}-1"]  # fmt: skip

    # the notebook's priority update: low (now 4) outranks med (2) in qs1, whose in-share
    # preemption is ENABLED: med is preempted back to RUNNABLE and low takes its instance
    aws(endpoint, "update-service-job", "--job-id", ids["low"], "--scheduling-priority", "4")
    assert aws_text(endpoint, "describe-service-job", "--job-id", ids["low"], "--query",
                    "schedulingPriority") == ["4"]  # fmt: skip
    assert names("SCHEDULED") == ["high", "low"]
    assert names("RUNNABLE") == ["med"]

    # paging, over every job (a JOB_NAME filter ignores the status; "ALL" is not AWS's):
    # the CLI follows nextToken itself; --max-items stops it and prints NextToken
    first = aws_json(endpoint, "list-service-jobs", "--job-queue", q, "--filters", "name=JOB_NAME,values=*",
                     "--max-items", "2")  # fmt: skip
    assert [job["jobName"] for job in first["jobSummaryList"]] == ["low", "med"]  # newest first
    rest = aws_json(endpoint, "list-service-jobs", "--job-queue", q, "--filters", "name=JOB_NAME,values=*",
                    "--starting-token", first["NextToken"])  # fmt: skip
    assert [job["jobName"] for job in rest["jobSummaryList"]] == ["high"]
    assert aws_text(endpoint, "list-service-jobs", "--job-queue", q, "--filters", "name=JOB_NAME,values=*",
                    "--page-size", "1", "--query", "jobSummaryList[].jobName") == [
        "low", "med", "high"]  # fmt: skip

    snapshot = aws_json(endpoint, "get-job-queue-snapshot", "--job-queue", q)
    assert [job["jobArn"] for job in snapshot["frontOfQueue"]["jobs"]] == [
        f"arn:aws:batch:local:000000000000:job/{ids['med']}"]  # fmt: skip
    assert snapshot["queueUtilization"]["totalCapacityUsage"] == [
        {"capacityUnit": "ml.g5.xlarge", "quantity": 2.0}]  # fmt: skip

    aws(endpoint, "terminate-service-job", "--job-id", ids["med"], "--reason", "not needed")
    ended = aws_json(endpoint, "describe-service-job", "--job-id", ids["med"])
    assert (ended["status"], ended["isTerminated"], ended["statusReason"]) == (
        "FAILED", True, "not needed")  # fmt: skip
    assert names("RUNNABLE") == []

    # AWS's error text, from the scheduler's own refusal; awscli (v1, the PyPI package)
    # exits 255 on every error (AWS CLI v2, not on PyPI, exits 254 on a service error)
    missing = aws(endpoint, "describe-service-job", "--job-id", "nope", check=False)
    assert missing.returncode == 255
    assert missing.stderr.strip() == ("An error occurred (ClientException) when calling the "
                                      "DescribeServiceJob operation: Job nope does not exist")
    again = aws(endpoint, "create-quota-share", "--job-queue", q, "--quota-share-name", "qs1",
                "--capacity-limits", "capacityUnit=ml.g5.xlarge,maxCapacity=1",
                "--resource-sharing-configuration", "strategy=RESERVE",
                "--preemption-configuration", "inSharePreemption=DISABLED", check=False)
    assert again.returncode == 255
    assert again.stderr.strip() == ("An error occurred (ClientException) when calling the "
                                    f"CreateQuotaShare operation: Quota share qs1 already "
                                    f"exists in job queue {q}")  # fmt: skip


def test_the_same_story_through_boto3_with_its_paginator(endpoint):
    import boto3
    from botocore.exceptions import ClientError

    batch = boto3.client("batch", endpoint_url=endpoint, region_name="us-east-1",
                         aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy")
    se, q = "se-boto", "q-boto"
    policy = batch.create_scheduling_policy(
        name="sp-boto", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName=se, serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}])
    batch.create_job_queue(
        jobQueueName=q, priority=1, schedulingPolicyArn=policy["arn"],
        jobQueueType="SAGEMAKER_TRAINING",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": se}])
    arns = {}
    for share, sharing, preemption in (
            ("qs1", {"strategy": "LEND_AND_BORROW", "borrowLimit": 200}, "ENABLED"),
            ("qs2", {"strategy": "LEND"}, "DISABLED"), ("qs3", {"strategy": "RESERVE"}, "DISABLED")):
        arns[share] = batch.create_quota_share(
            jobQueue=q, quotaShareName=share,
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": preemption})["quotaShareArn"]
    described = batch.describe_quota_share(quotaShareArn=arns["qs2"])
    assert (described["quotaShareName"], described["resourceSharingConfiguration"]["strategy"],
            described["jobQueueArn"]) == ("qs2", "LEND", f"arn:aws:batch:local:000000000000:job-queue/{q}")

    ids = {}
    for name, priority in (("high", 3), ("med", 2), ("low", 1)):
        ids[name] = batch.submit_service_job(
            jobName=name, jobQueue=q, quotaShareName="qs1", schedulingPriority=priority,
            serviceJobType="SAGEMAKER_TRAINING", serviceRequestPayload=PAYLOAD)["jobId"]

    pages = list(batch.get_paginator("list_service_jobs").paginate(
        jobQueue=q, filters=[{"name": "JOB_NAME", "values": ["*"]}], PaginationConfig={"PageSize": 1}))
    assert [[job["jobName"] for job in page["jobSummaryList"]] for page in pages] == [
        ["low"], ["med"], ["high"]]  # one a page, newest first
    scheduled = batch.list_service_jobs(jobQueue=q, jobStatus="SCHEDULED")["jobSummaryList"]
    assert sorted(job["jobName"] for job in scheduled) == ["high", "med"]
    share_jobs = batch.list_service_jobs(
        jobQueue=q, jobStatus="RUNNABLE",
        filters=[{"name": "QUOTA_SHARE_NAME", "values": ["qs1"]}])["jobSummaryList"]
    assert [job["jobId"] for job in share_jobs] == [ids["low"]]
    assert batch.describe_service_job(jobId=ids["med"])["status"] == "SCHEDULED"
    snapshot = batch.get_job_queue_snapshot(jobQueue=q)
    created = batch.describe_service_job(jobId=ids["low"])["createdAt"]
    assert snapshot["frontOfQuotaShares"]["quotaShares"] == {
        "qs1": [{"jobArn": f"arn:aws:batch:local:000000000000:job/{ids['low']}",
                 "earliestTimeAtPosition": created}],
        "qs2": [], "qs3": []}  # fmt: skip
    # each part's lastUpdatedAt (epoch ms, as boto3 parses the model's Long): as of the
    # scheduler's last command, after low's submission and not after now
    updated = {snapshot[part]["lastUpdatedAt"]
               for part in ("frontOfQueue", "frontOfQuotaShares", "queueUtilization")}
    assert len(updated) == 1 and created <= updated.pop() <= time.time() * 1000

    # qs3 stops reserving: it lends its idle instance, and low (qs1) is scheduled on it
    batch.update_quota_share(quotaShareArn=arns["qs3"],
                             resourceSharingConfiguration={"strategy": "LEND"})
    assert batch.describe_service_job(jobId=ids["low"])["status"] == "SCHEDULED"

    # FIFO is the model's only strategy: an update restates it; an unknown policy is refused
    batch.update_scheduling_policy(arn=policy["arn"],
                                   quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    with pytest.raises(ClientError, match="Scheduling policy sp-none does not exist"):
        batch.update_scheduling_policy(arn="arn:aws:batch:local:000000000000:scheduling-policy/sp-none",
                                       quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    with pytest.raises(ClientError) as refused:
        batch.describe_service_job(jobId="nope")
    assert refused.value.response["Error"] == {"Code": "ClientException",
                                               "Message": "Job nope does not exist"}
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as unsupported:
        batch.list_jobs(jobQueue=q)
    assert unsupported.value.response["Error"]["Message"] == (
        "ListJobs is not supported by quotasched: quotasched serves AWS Batch quota management "
        "(service environments, quota-share job queues, service jobs)")

    # the bulk terminate: a job not found counts as successful (AWS's documented rule)
    done = batch.terminate_service_jobs(jobs=[ids["high"], "no-such-job"], reason="bulk")
    assert (sorted(done["successful"]), done["errors"]) == (sorted([ids["high"], "no-such-job"]), [])
    high = batch.describe_service_job(jobId=ids["high"])
    assert (high["status"], high["statusReason"], high["isTerminated"]) == ("FAILED", "bulk", True)
    assert high["stoppedAt"] >= high["scheduledAt"]
    assert high["latestAttempt"]["serviceResourceId"]["name"] == "TrainingJobArn"
    # no jobQueue: every queue's jobs, newest first
    everywhere = batch.list_service_jobs(jobStatus="FAILED")["jobSummaryList"]
    assert ids["high"] in [job["jobId"] for job in everywhere]

    with pytest.raises(ClientError, match="must be DISABLED before it can be deleted"):
        batch.delete_quota_share(quotaShareArn=arns["qs2"])
    batch.update_quota_share(quotaShareArn=arns["qs2"], state="DISABLED")
    batch.delete_quota_share(quotaShareArn=arns["qs2"])
    left = batch.list_quota_shares(jobQueue=q)["quotaShares"]
    assert [share["quotaShareName"] for share in left] == ["qs1", "qs3"]


def test_the_endpoint_validates_with_botocores_model_itself(endpoint):
    """With the client's own validation off, the server refuses what the model forbids."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    batch = boto3.client("batch", endpoint_url=endpoint, region_name="us-east-1",
                         aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy",
                         config=Config(parameter_validation=False))
    with pytest.raises(ClientError) as bad_enum:
        batch.create_service_environment(
            serviceEnvironmentName="se-bad", serviceEnvironmentType="SAGEMAKER_TRAINING",
            state="SOMETIMES", capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}])
    assert bad_enum.value.response["Error"]["Code"] == "ClientException"
    assert "Invalid value for parameter state" in bad_enum.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as missing:
        batch.describe_service_job()
    assert 'Missing required parameter in input: "jobId"' in missing.value.response["Error"]["Message"]

    request = urllib.request.Request(f"{endpoint}/v1/describeservicejob", data=b"not json",
                                     method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as not_json:
        urllib.request.urlopen(request)
    assert not_json.value.code == 400
    assert not_json.value.headers["x-amzn-ErrorType"] == "ClientException"
    assert json.loads(not_json.value.read())["__type"] == "ClientException"


# The migration guide's commands in an order that lets each one succeed (the guide lists them
# by resource; a queue is disabled and a share deleted last).
GUIDE_ORDER = (
    "create-service-environment", "update-service-environment", "describe-service-environments",
    "create-scheduling-policy", "update-scheduling-policy", "describe-scheduling-policies",
    "create-job-queue", "describe-job-queues", "create-quota-share", "describe-quota-share",
    "list-quota-shares", "submit-service-job", "update-service-job", "describe-service-job",
    "list-service-jobs", "get-job-queue-snapshot", "terminate-service-job",
    "terminate-service-jobs", "update-job-queue", "update-quota-share", "delete-quota-share",
)  # fmt: skip


def test_the_migration_guides_commands_run_with_the_cli_it_names(endpoint):
    """Every `aws batch` command of docs/migration-aws-batch.md, as written there (placeholders
    filled), with the AWS CLI the guide names (awscli 1.46.3, the one `make test` installs).
    That CLI's bundled botocore (1.43.62) has no TerminateServiceJobs: the guide says so, and
    `terminate-service-jobs` is refused by the CLI itself (boto3 has it: the test above)."""
    import shlex

    guide = (ROOT / "docs" / "migration-aws-batch.md").read_text()
    rows = dict((line.split()[0], line) for line in
                re.findall(r"^\| `aws batch ([^`]+)` \|", guide, re.M))  # fmt: skip
    assert set(rows) == set(GUIDE_ORDER), sorted(set(rows) ^ set(GUIDE_ORDER))
    assert "awscli 1.46.3" in guide and "no `terminate-service-jobs`" in guide
    version = subprocess.run([AWS, "--version"], capture_output=True, text=True).stdout
    assert version.startswith("aws-cli/1.46.3 "), version
    arns = {"policy": "arn:aws:batch:local:000000000000:scheduling-policy/sp",
            "share": "arn:aws:batch:local:000000000000:job-queue/q/quota-share/qs1"}
    job_id = None
    for verb in GUIDE_ORDER:
        line = rows[verb].replace("'<CreateTrainingJob JSON>'", shlex.quote(PAYLOAD))
        line = line.replace("<arn>", arns["share"] if "quota-share" in verb else arns["policy"])
        if job_id is not None:
            line = line.replace("<id>", job_id)
        done = aws(endpoint, *shlex.split(line), check=False)
        if verb == "terminate-service-jobs":  # not in this CLI's model: the CLI refuses it
            assert done.returncode != 0 and "Invalid choice" in done.stderr, done.stderr
            continue
        assert done.returncode == 0, f"aws batch {line}: {done.stderr}"
        if verb == "submit-service-job":
            job_id = json.loads(done.stdout)["jobId"]
    assert job_id is not None
