"""What DescribeServiceJob and ListServiceJobs show of a job's history: its attempts (one per
dispatch, each a SageMaker training job named with Batch's `AWSBatch` prefix), `startedAt` /
`stoppedAt`, `latestAttempt`, `preemptionSummary.recentPreemptedAttempts`, its tags and its
payload as submitted (spec 4.3, section 0 item 21).

The expectations are worked out by hand from fixture N (3 ml.g5.xlarge; qs1 LEND_AND_BORROW 1,
qs2 LEND 1, qs3 RESERVE 1): `own` takes qs1's instance at t=10; `x` (qs1) borrows qs2's idle
instance at 11 and runs from 20; `y` (qs2) reclaims it at 30, preempting `x` (requeued, qs3
lends nothing); `y` ends at 40, `x` is dispatched again on qs2's instance, runs from 45 and
succeeds at 50.  Times are milliseconds, as AWS gives them.
"""

from __future__ import annotations

import json

from quotasched.services.scheduler.api import answer
from tests.builders import G5, Cluster

TRAINING = "arn:aws:sagemaker:local:000000000000:training-job/AWSBatch-x-"
PAYLOAD = {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}}


def preempted_then_succeeded() -> Cluster:
    c = Cluster.notebook()
    c.at = 10.0
    c.submit("own", "qs1")
    c.command("SubmitServiceJob", at=11.0, jobId="x", jobName="x-train", jobQueue="q",
              quotaShareName="qs1", tags={"team": "vision"}, serviceRequestPayload=PAYLOAD)  # fmt: skip
    c.at = 20.0
    c.report("x", "RUNNING", attempt=1)
    c.at = 30.0
    c.submit("y", "qs2")
    c.at = 40.0
    c.finish("y")
    c.at = 45.0
    c.report("x", "RUNNING", attempt=2)
    c.at = 50.0
    c.finish("x")
    return c


def test_every_dispatch_is_an_attempt_with_its_start_stop_and_reason():
    described = answer(preempted_then_succeeded().state, "describe-service-job", {"jobId": "x"})
    first = {"serviceResourceId": {"name": "TrainingJobArn", "value": TRAINING + "1"},
             "startedAt": 20000, "stoppedAt": 30000,
             "statusReason": "Preempted by job y (CROSS_SHARE_RECLAIM)"}  # fmt: skip
    second = {"serviceResourceId": {"name": "TrainingJobArn", "value": TRAINING + "2"},
              "startedAt": 45000, "stoppedAt": 50000}  # fmt: skip
    assert described["attempts"] == [first, second]
    assert described["latestAttempt"] == {"serviceResourceId": second["serviceResourceId"]}
    assert described["preemptionSummary"] == {"preemptedAttemptCount": 1,
                                              "recentPreemptedAttempts": [first]}  # fmt: skip
    assert (described["createdAt"], described["scheduledAt"]) == (11000, 40000)
    assert (described["startedAt"], described["stoppedAt"]) == (45000, 50000)


def test_tags_and_payload_come_back_as_submitted():
    described = answer(preempted_then_succeeded().state, "describe-service-job", {"jobId": "x"})
    assert described["tags"] == {"team": "vision"}
    assert json.loads(described["serviceRequestPayload"]) == PAYLOAD


def test_the_summary_carries_the_latest_attempt_and_its_times():
    listed = answer(preempted_then_succeeded().state, "list-service-jobs",
                    {"jobQueue": "q", "jobStatus": "SUCCEEDED"})["jobSummaryList"]  # fmt: skip
    x = next(job for job in listed if job["jobId"] == "x")
    assert x["latestAttempt"] == {"serviceResourceId": {"name": "TrainingJobArn",
                                                        "value": TRAINING + "2"}}  # fmt: skip
    assert (x["startedAt"], x["stoppedAt"]) == (45000, 50000)


def test_a_job_ended_in_its_queue_has_a_stop_and_no_attempt():
    c = Cluster.notebook()
    c.at = 5.0
    c.submit("a", "qs3")  # qs3's own instance
    c.submit("b", "qs3")  # waits: RESERVE borrows nothing
    c.at = 7.0
    c.terminate("b")
    described = answer(c.state, "describe-service-job", {"jobId": "b"})
    assert described["status"] == "FAILED" and described["stoppedAt"] == 7000
    assert "attempts" not in described and "latestAttempt" not in described
    assert "startedAt" not in described


def test_a_scheduled_attempt_has_no_start_until_it_runs():
    c = Cluster.notebook()
    c.at = 5.0
    c.submit("a", "qs3")
    described = answer(c.state, "describe-service-job", {"jobId": "a"})
    assert described["attempts"] == [{"serviceResourceId": {
        "name": "TrainingJobArn",
        "value": "arn:aws:sagemaker:local:000000000000:training-job/AWSBatch-a-1"}}]  # fmt: skip
    assert "startedAt" not in described and "stoppedAt" not in described


def test_a_mistyped_job_status_is_refused_naming_the_valid_ones():
    """Issue 21: `list_jobs(status="RUNING")` answered an empty list, as if nothing ran."""
    c = Cluster.notebook()
    refused = answer(c.state, "list-service-jobs", {"jobQueue": "q", "jobStatus": "RUNING"})
    assert refused == {"error": {"type": "ClientException", "message": (
        "jobStatus 'RUNING' is not a job status; expected one of SUBMITTED, PENDING, RUNNABLE, "
        "SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED or ALL")}}  # fmt: skip
    assert answer(c.state, "list-service-jobs", {"jobQueue": "q", "jobStatus": "ALL"}) == {
        "jobSummaryList": []}
