"""ListServiceJobs' bounds through the AWS endpoint with boto3 (issue 29 point 1): the
scheduler's refusal of a maxResults outside 1-1000 reaches the client as AWS's
ClientException, and boto3's paginator walks the scheduler's own pages (its nextToken)."""

from __future__ import annotations

import pytest

from tests.integration.test_aws_endpoint import endpoint  # noqa: F401  (a fixture: one `up`)

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def client(url: str):
    import boto3

    return boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy")


def test_max_results_over_a_thousand_is_a_client_exception_and_pages_hold_every_job(
        endpoint):  # noqa: F811
    from botocore.exceptions import ClientError

    batch = client(endpoint)
    policy = batch.create_scheduling_policy(
        name="sp-limits", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName="se-limits", serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}])
    batch.create_job_queue(
        jobQueueName="q-limits", priority=1, schedulingPolicyArn=policy["arn"],
        jobQueueType="SAGEMAKER_TRAINING",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se-limits"}])
    batch.create_quota_share(
        jobQueue="q-limits", quotaShareName="qs1",
        capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
        resourceSharingConfiguration={"strategy": "RESERVE"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"})
    payload = '{"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}}'
    ids = [batch.submit_service_job(
        jobName=f"limits-{i}", jobQueue="q-limits", quotaShareName="qs1",
        serviceJobType="SAGEMAKER_TRAINING", serviceRequestPayload=payload)["jobId"]
        for i in range(5)]  # fmt: skip

    with pytest.raises(ClientError) as refused:
        batch.list_service_jobs(jobQueue="q-limits", maxResults=1001)
    assert refused.value.response["Error"]["Code"] == "ClientException"
    assert "maxResults" in refused.value.response["Error"]["Message"]

    pages = batch.get_paginator("list_service_jobs").paginate(
        jobQueue="q-limits", filters=[{"name": "JOB_NAME", "values": ["limits-*"]}],
        PaginationConfig={"PageSize": 2})
    listed = [job["jobId"] for page in pages for job in page["jobSummaryList"]]
    assert sorted(listed) == sorted(ids) and len(listed) == len(set(listed))
