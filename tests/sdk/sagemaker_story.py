"""The seed notebook's story through the real SageMaker Python SDK v3 (`TrainingQueue`, from
`sagemaker.train.aws_batch`), unchanged, against quotasched's AWS Batch endpoint.

Run by tests/integration/test_sagemaker_sdk.py with the SDK's own virtualenv (.venv-sagemaker,
built by `make test`), as a user's notebook would run: the only quotasched-specific thing is
AWS_ENDPOINT_URL_BATCH in the environment.  It imports nothing of quotasched.  It prints one
JSON object of what it observed; the test compares it with expectations worked out by hand.

Offline: a ModelTrainer needs no AWS call when it is given a role, an output path and S3
inputs, with SAGEMAKER_VALIDATE_ROLE=false (the SDK's switch for its IAM role check).  The one
SDK call that needs SageMaker itself is `TrainingQueuedJob.get_model_trainer()` on a job that
has started: it calls SageMaker's DescribeTrainingJob for the attempt's training job.  On a job
still waiting it raises NoTrainingJob without any call, which is what this story does.
"""

from __future__ import annotations

import json
import sys
import time

import boto3
from sagemaker.core.helper.session_helper import Session
from sagemaker.train.aws_batch.exception import NoTrainingJob
from sagemaker.train.aws_batch.training_queue import TrainingQueue
from sagemaker.train.configs import Compute, InputData, OutputDataConfig
from sagemaker.train.model_trainer import ModelTrainer

G5 = "ml.g5.xlarge"
LONG = {"duration": "1000000"}  # the simulated executor runs it for 1000 s at --speed 1000
CEILING_S = 60.0


def setup(batch, queue: str) -> None:
    """Fixture N of the spec, through boto3: 3 ml.g5.xlarge; qs1 LEND_AND_BORROW (borrow 200 %,
    in-share preemption on), qs2 LEND, qs3 RESERVE, one instance each."""
    policy = batch.create_scheduling_policy(
        name=f"{queue}-policy", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    batch.create_service_environment(
        serviceEnvironmentName=f"{queue}-se", serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": G5, "maxCapacity": 3}])
    batch.create_job_queue(
        jobQueueName=queue, priority=1, schedulingPolicyArn=policy["arn"],
        jobQueueType="SAGEMAKER_TRAINING",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": f"{queue}-se"}])
    for share, sharing, preemption in (
            ("qs1", {"strategy": "LEND_AND_BORROW", "borrowLimit": 200}, "ENABLED"),
            ("qs2", {"strategy": "LEND"}, "DISABLED"),
            ("qs3", {"strategy": "RESERVE"}, "DISABLED")):
        batch.create_quota_share(
            jobQueue=queue, quotaShareName=share,
            capacityLimits=[{"capacityUnit": G5, "maxCapacity": 1}],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": preemption})


def trainer() -> ModelTrainer:
    session = Session(boto_session=boto3.Session(), default_bucket="notebook-bucket")
    return ModelTrainer(
        training_image="123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-train:latest",
        role="arn:aws:iam::123456789012:role/SageMakerTrainingRole",
        compute=Compute(instance_type=G5, instance_count=1),
        output_data_config=OutputDataConfig(s3_output_path="s3://notebook-bucket/output"),
        base_job_name="llm-finetune", sagemaker_session=session)


def until(condition, what: str):
    deadline = time.monotonic() + CEILING_S
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.2)


def names(jobs) -> list[str]:
    return sorted(job.job_name for job in jobs)


def main(queue: str) -> dict:
    seen: dict = {}
    setup(boto3.client("batch"), queue)
    training = trainer()
    inputs = [InputData(channel_name="train", data_source="s3://notebook-bucket/data")]
    tq = TrainingQueue(queue)

    jobs = {name: tq.submit(training, inputs, job_name=name, priority=priority,
                            quota_share_name="qs1", tags=LONG)
            for name, priority in (("high", 3), ("med", 2), ("low", 1))}  # fmt: skip
    seen["arns"] = {name: job.job_arn for name, job in jobs.items()}
    seen["running"] = until(lambda: (lambda r: r if len(r) == 2 else None)(
        names(tq.list_jobs(status="RUNNING"))), "two jobs running")
    seen["runnable_in_qs1"] = names(tq.list_jobs_by_share(status="RUNNABLE",
                                                          quota_share_name="qs1"))
    low = jobs["low"].describe()
    seen["low"] = {key: low.get(key) for key in ("status", "schedulingPriority", "quotaShareName",
                                                  "tags", "serviceJobType")}
    seen["low_payload"] = json.loads(low["serviceRequestPayload"])
    seen["by_name"] = tq.get_job("med").job_arn

    # the notebook's priority update: low (now 4) outranks med in qs1 and preempts it
    seen["update"] = sorted(jobs["low"].update(4))
    until(lambda: jobs["med"].describe()["status"] == "RUNNABLE", "med preempted")
    seen["running_after"] = until(lambda: (lambda r: r if len(r) == 2 else None)(
        names(tq.list_jobs(status="RUNNING"))), "low running")
    med = jobs["med"].describe()
    seen["med_preemption"] = med.get("preemptionSummary")
    seen["med_attempts"] = med.get("attempts")
    try:
        jobs["med"].get_model_trainer()
        seen["med_trainer"] = "a ModelTrainer"
    except NoTrainingJob as error:
        seen["med_trainer"] = f"NoTrainingJob: {error}"
    running = jobs["high"].describe()
    seen["high_latest_attempt"] = running.get("latestAttempt")
    seen["high_started"] = running.get("startedAt", 0) >= running.get("scheduledAt", 0) > 0

    jobs["med"].terminate("not needed")
    ended = jobs["med"].describe()
    seen["med_ended"] = [ended["status"], ended.get("statusReason"), ended.get("isTerminated")]
    for name in ("high", "low"):
        jobs[name].terminate("story over")

    # a short job to qs3 (its own instance) runs to the end: wait() and result()
    quick = tq.submit(training, inputs, job_name="quick", quota_share_name="qs3",
                      tags={"duration": "1"})
    waited = quick.wait(timeout=int(CEILING_S))
    seen["quick_wait"] = waited["status"]
    seen["quick_result"] = quick.result(timeout=int(CEILING_S))["status"]
    failing = tq.submit(training, inputs, job_name="broken", quota_share_name="qs3",
                        tags={"duration": "1", "outcome": "FAILED"})
    try:
        failing.result(timeout=int(CEILING_S))
        seen["broken_result"] = "no error"
    except RuntimeError as error:
        seen["broken_result"] = f"RuntimeError: {error}"
    seen["mapped"] = [job.job_name for job in tq.map(
        training, [inputs, inputs], job_names=["map-a", "map-b"], quota_share_name="qs2")]
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
