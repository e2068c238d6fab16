"""A team reads the payloads and tags of its own share's jobs only (issue 28, point 7), on a
real nats-server started with the configuration `quotasched auth generate` wrote, the scheduler
under its role and `quotasched endpoint --keys`.

Teams qs1 and qs2 of queue q each submit a job whose serviceRequestPayload carries an
`Environment` secret, with tags.  Through NATS (the team's raw connection, and the Python SDK
with the team's credentials file) and through the AWS endpoint (the real boto3 client, the
team's key): the team sees its own job whole; it sees the other team's job in the queue's
list (id, name, status, share, priority, capacity) but never its payload or tags: on NATS the
description comes without them, through the endpoint DescribeServiceJob is
AccessDeniedException, as AWS answers for a resource outside an IAM policy.  The admin sees
everything.
"""

from __future__ import annotations

import json

import pytest

from quotasched.services.client import Bus
from tests.integration.test_aws_endpoint_auth import REGION, creds, secured_endpoint
from tests.reliability.test_permissions import Client, generated  # noqa: F401

pytestmark = [pytest.mark.nats]

G5 = "ml.g5.xlarge"
TEAMS = {"qs1": "pipeline-q-qs1", "qs2": "pipeline-q-qs2"}


def secret_payload(share: str) -> str:
    return json.dumps({"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
                       "Environment": {"WANDB_API_KEY": f"secret-of-{share}"}})  # fmt: skip


@pytest.fixture(scope="module")
def stack(generated, tmp_path_factory):  # noqa: F811
    """(NATS URL, endpoint URL, auth directory, share -> job id) with queue q, shares qs1-qs3
    and one job per team, named `job-qs1` and `job-qs2`, each submitted with its team's key."""
    with secured_endpoint(generated, tmp_path_factory.mktemp("scoped-reads")) as (
            server, _, url):  # fmt: skip
        ids: dict[str, str] = {}
        deployment = (server.url, url, generated, ids)
        admin = batch(deployment, "admin")
        policy = admin.create_scheduling_policy(
            name="sp", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
        admin.create_service_environment(
            serviceEnvironmentName="se", serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 3}])  # fmt: skip
        admin.create_job_queue(
            jobQueueName="q", priority=1, schedulingPolicyArn=policy["arn"],
            jobQueueType="SAGEMAKER_TRAINING",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}])  # fmt: skip
        for share in ("qs1", "qs2", "qs3"):
            admin.create_quota_share(
                jobQueue="q", quotaShareName=share,
                capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
                resourceSharingConfiguration={"strategy": "RESERVE"},
                preemptionConfiguration={"inSharePreemption": "DISABLED"})  # fmt: skip
        for share, role in TEAMS.items():
            ids[share] = batch(deployment, role).submit_service_job(
                jobName=f"job-{share}", jobQueue="q", quotaShareName=share,
                serviceJobType="SAGEMAKER_TRAINING", serviceRequestPayload=secret_payload(share),
                tags={"owner": f"team-{share}"}, schedulingPriority=3)["jobId"]  # fmt: skip
        yield deployment


def batch(deployment, role: str):
    import boto3

    _, url, auth_dir, _ = deployment
    keys = creds(auth_dir, role)
    return boto3.client("batch", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"])  # fmt: skip


def nats_env(deployment, role: str) -> dict[str, str]:
    nats_url, _, auth_dir, _ = deployment
    return {**creds(auth_dir, role), "url": nats_url}


async def ask(client: Client, subject: str, **params) -> dict:
    reply = await client.nc.request(subject, json.dumps(params).encode(), timeout=5)
    return json.loads(reply.data)


def whole(job: dict, share: str) -> None:
    assert json.loads(job["serviceRequestPayload"])["Environment"] == {
        "WANDB_API_KEY": f"secret-of-{share}"}, job
    assert job["tags"] == {"owner": f"team-{share}"}, job


def summary_only(job: dict, share: str) -> None:
    assert "serviceRequestPayload" not in job and "tags" not in job, job
    assert f"secret-of-{share}" not in json.dumps(job)
    assert (job["jobName"], job["quotaShareName"], job["schedulingPriority"]) == (
        f"job-{share}", share, 3)
    assert job["capacityUsage"] == [{"capacityUnit": G5, "quantity": 1}]
    assert job["status"]


async def test_a_teams_nats_credentials_read_its_own_payload_and_only_the_summary_of_anothers(
        stack):  # fmt: skip
    ids = stack[3]
    async with Client(nats_env(stack, "pipeline-q-qs1")) as team:
        mine = await ask(team, "qm.api.q.qs1.describe-service-job", jobId=ids["qs1"])
        whole(mine, "qs1")
        theirs = await ask(team, "qm.api.q.qs1.describe-service-job", jobId=ids["qs2"])
        summary_only(theirs, "qs2")
        listed = await ask(team, "qm.api.q.qs1.list-service-jobs", jobStatus="ALL")
        by_id = {job["jobId"]: job for job in listed["jobSummaryList"]}
        summary_only(by_id[ids["qs2"]], "qs2")
        snapshot = await ask(team, "qm.api.q.qs1.get-job-queue-snapshot")
        assert "secret-of" not in json.dumps(snapshot)
        # the admin's subjects, where nothing is scoped, and another share's: refused
        for subject in ("qm.api.q.describe-service-job", "qm.api.q.qs2.describe-service-job",
                        "qm.api.describe-service-job"):  # fmt: skip
            with pytest.raises(Exception):
                await team.nc.request(subject, json.dumps({"jobId": ids["qs2"]}).encode(),
                                      timeout=1.0)  # fmt: skip
            await team.violation(subject)

    # the Python SDK with the team's credentials file routes to the team's own subject
    nats_url, _, auth_dir, _ = stack
    async with Bus(nats_url, credentials=creds(auth_dir, "pipeline-q-qs2")) as sdk:
        whole(await sdk.request("describe-service-job", jobId=ids["qs2"], jobQueue="q"), "qs2")
        summary_only(await sdk.request("describe-service-job", jobId=ids["qs1"], jobQueue="q"),
                     "qs1")  # fmt: skip

    async with Client(nats_env(stack, "admin")) as admin:  # the admin override: everything
        for share in TEAMS:
            whole(await ask(admin, "qm.api.q.describe-service-job", jobId=ids[share]), share)


async def test_a_shares_subject_never_shows_another_shares_secrets_whoever_asks(stack):
    """Even the admin asking on a share's subject gets that share's view: the subject, not
    the asker, decides (so a team's pinned subject always does)."""
    ids = stack[3]
    async with Client(nats_env(stack, "admin")) as admin:
        summary_only(await ask(admin, "qm.api.q.qs3.describe-service-job", jobId=ids["qs1"]),
                     "qs1")  # fmt: skip
        for deeper in ("qm.api.q.qs3.x.describe-service-job",):  # never the unscoped form
            answer = await ask(admin, deeper, jobId=ids["qs1"])
            assert "secret-of" not in json.dumps(answer), answer


def test_a_teams_key_through_the_aws_endpoint_is_denied_anothers_job_and_sees_its_summary(stack):
    from botocore.exceptions import ClientError

    ids = stack[3]
    one, two = batch(stack, "pipeline-q-qs1"), batch(stack, "pipeline-q-qs2")
    for team, share, other in ((one, "qs1", "qs2"), (two, "qs2", "qs1")):
        own = team.describe_service_job(jobId=ids[share])
        whole(own, share)
        with pytest.raises(ClientError) as denied:
            team.describe_service_job(jobId=ids[other])
        error = denied.value.response["Error"]
        assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert error["Code"] == "AccessDeniedException"
        assert ("batch:DescribeServiceJob on resource: "
                f"arn:aws:batch:local:000000000000:job/{ids[other]}") in error["Message"], error
        assert "secret-of" not in json.dumps(denied.value.response)
        listed = team.list_service_jobs(jobQueue="q", filters=[
            {"name": "JOB_NAME", "values": ["*"]}])  # fmt: skip
        by_id = {job["jobId"]: job for job in listed["jobSummaryList"]}
        assert by_id[ids[other]]["quotaShareName"] == other
        assert "secret-of" not in json.dumps(listed)
    admin = batch(stack, "admin")
    for share in TEAMS:
        whole(admin.describe_service_job(jobId=ids[share]), share)
