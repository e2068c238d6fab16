"""The SageMaker executor's decisions, as pure functions (services/executors/sagemaker.py).

moto's SageMaker (the server the integration tests run, tests/integration/
test_sagemaker_executor.py) completes a training job the moment it is created and has no
StopTrainingJob, so what it cannot show is checked here, against SageMaker's documented
statuses (DescribeTrainingJob: TrainingJobStatus and SecondaryStatus, whose values the
botocore service model lists) and failure messages, without any stand-in for SageMaker.
"""

from __future__ import annotations

import itertools
import json
import re

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters
import pytest

from quotasched.services.executors.sagemaker import (
    ATTEMPT_TAG,
    JOB_ID_TAG,
    STOPPED_OUTSIDE,
    backoff,
    create_outcome,
    is_capacity_failure,
    not_found,
    report_for,
    resumed,
    stop_confirmed,
    training_request,
)
from quotasched.services.scheduler.api import training_job_arn, training_job_name

MODEL = botocore.session.get_session().get_service_model("sagemaker")


def described(status: str, secondary: str | None = None, reason: str | None = None) -> dict:
    answer = {"TrainingJobName": "AWSBatch-j-1", "TrainingJobStatus": status}
    if secondary is not None:
        answer["SecondaryStatus"] = secondary
    if reason is not None:
        answer["FailureReason"] = reason
    return answer


# -- the status mapping -------------------------------------------------------------------------

IN_PROGRESS = {
    # SageMaker prepares the job: provisioning, the container, the data
    "Starting": "STARTING", "Pending": "STARTING", "LaunchingMLInstances": "STARTING",
    "PreparingTrainingStack": "STARTING", "Downloading": "STARTING",
    "DownloadingTrainingImage": "STARTING", "Restarting": "STARTING",
    # the training script runs (Uploading: it has finished, the model is being saved)
    "Training": "RUNNING", "Uploading": "RUNNING",
    # nothing new to say: a stop under way, a configuration update
    "Stopping": None, "Updating": None,
}  # fmt: skip


@pytest.mark.parametrize(("secondary", "expected"), IN_PROGRESS.items())
def test_an_in_progress_job_is_starting_until_it_trains(secondary, expected):
    news = report_for(described("InProgress", secondary))
    assert (news and news[0]) == expected


def test_every_secondary_status_sagemaker_documents_is_mapped_on_purpose():
    """The service model's list: one SageMaker adds later fails here, to be placed."""
    terminal = {"Stopped", "MaxRuntimeExceeded", "Completed", "Failed", "Interrupted",
                "MaxWaitTimeExceeded"}  # fmt: skip (seen with a terminal TrainingJobStatus)
    assert set(MODEL.shape_for("SecondaryStatus").enum) == set(IN_PROGRESS) | terminal


@pytest.mark.parametrize(("status", "secondary", "reason", "expected"), [
    ("Completed", "Completed", None, ("SUCCEEDED", None)),
    ("Failed", "Failed", "AlgorithmError: ExecuteUserScriptError: exit code 1",
     ("FAILED", "AlgorithmError: ExecuteUserScriptError: exit code 1")),
    ("Failed", "Failed", None, ("FAILED", "Training job failed (SageMaker gave no reason)")),
    ("Failed", "Failed", "CapacityError: Unable to provision requested ML compute capacity. "
     "Please retry using a different ML instance type.",
     ("INSUFFICIENT_CAPACITY", "CapacityError: Unable to provision requested ML compute "
      "capacity. Please retry using a different ML instance type.")),
    ("Stopped", "Stopped", None, ("FAILED", STOPPED_OUTSIDE)),
    ("Stopped", "MaxRuntimeExceeded", None,
     ("FAILED", "Training job stopped by SageMaker: MaxRuntimeExceeded")),
    ("Stopped", "MaxWaitTimeExceeded", None,
     ("FAILED", "Training job stopped by SageMaker: MaxWaitTimeExceeded")),
    ("Stopped", "Interrupted", None, ("FAILED", "Training job stopped by SageMaker: Interrupted")),
    ("Deleting", None, None, ("FAILED", "Training job deleted outside quotasched")),
    ("Stopping", "Stopping", None, None),
])  # fmt: skip
def test_how_a_job_ends(status, secondary, reason, expected):
    assert report_for(described(status, secondary, reason)) == expected


def test_every_training_job_status_sagemaker_documents_is_mapped():
    for status in MODEL.shape_for("TrainingJobStatus").enum:
        news = report_for(described(status, "Training" if status == "InProgress" else status))
        assert news is not None or status == "Stopping", status


# -- capacity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "capacity"), [
    ("CapacityError: Unable to provision requested ML compute capacity.", True),
    ("InsufficientInstanceCapacity: We currently do not have sufficient capacity", True),
    ("Insufficient capacity error: not enough ml.p4d.24xlarge", True),
    ("ResourceLimitExceeded: The account-level service limit 'ml.g5.xlarge for training job "
     "usage' is 2 Instances", True),
    ("AlgorithmError: ExecuteUserScriptError: CUDA out of memory", False),
    ("ClientError: Data download failed", False),
    (None, False),
    ("", False),
])  # fmt: skip
def test_capacity_failures_are_told_from_job_failures(reason, capacity):
    assert is_capacity_failure(reason) is capacity


@pytest.mark.parametrize(("code", "message", "expected"), [
    ("ResourceInUse", "Training job names must be unique within an AWS account and region, "
     "and a training job with this name already exists (arn:...)", "exists"),
    ("ValidationException", "Training job AWSBatch-j-1 already exists", "exists"),
    ("ResourceLimitExceeded", "The account-level service limit 'ml.p4d.24xlarge for training "
     "job usage' is 0 Instances",
     ("INSUFFICIENT_CAPACITY", "CreateTrainingJob: ResourceLimitExceeded: The account-level "
      "service limit 'ml.p4d.24xlarge for training job usage' is 0 Instances")),
    ("CapacityError", "no capacity",
     ("INSUFFICIENT_CAPACITY", "CreateTrainingJob: CapacityError: no capacity")),
    ("ValidationException", "1 validation error detected: Value at 'roleArn' failed",
     ("FAILED", "CreateTrainingJob: ValidationException: 1 validation error detected: Value at "
      "'roleArn' failed")),
    ("AccessDeniedException", "not authorized",
     ("FAILED", "CreateTrainingJob: AccessDeniedException: not authorized")),
    ("InternalFailure", "", "unknown"),  # the create may have happened: look first
    ("ServiceUnavailable", "", "unknown"),
])  # fmt: skip
def test_what_a_create_error_means(code, message, expected):
    assert create_outcome(code, message) == expected


# -- back-off and stop confirmation --------------------------------------------------------------


def test_the_poll_backs_off_from_one_second_to_thirty():
    assert list(itertools.islice(backoff(1.0, 30.0), 8)) == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_short_back_off_for_tests_and_a_cap_below_the_start():
    assert list(itertools.islice(backoff(0.1, 0.25), 4)) == [0.1, 0.2, 0.25, 0.25]
    assert list(itertools.islice(backoff(5.0, 2.0), 2)) == [2.0, 2.0]


@pytest.mark.parametrize(("description", "stopped"), [
    (None, True),  # no such job: it holds nothing
    (described("Stopped", "Stopped"), True),
    (described("Completed", "Completed"), True),  # it ended before the stop came
    (described("Failed", "Failed", "x"), True),
    (described("Stopping", "Stopping"), False),  # SIGTERM sent, instances still held
    (described("InProgress", "Training"), False),
    (described("InProgress", "Stopping"), False),
])  # fmt: skip
def test_a_stop_is_confirmed_once_the_job_no_longer_holds_instances(description, stopped):
    assert stop_confirmed(description) is stopped


def _refused(code: str, message: str) -> ClientError:
    """The error botocore raises for a SageMaker error answer."""
    return ClientError({"Error": {"Code": code, "Message": message}}, "DescribeTrainingJob")


def test_no_such_job_is_told_from_other_errors():
    assert not_found(_refused("ValidationException", "Could not find training job 'arn:x'."))
    assert not_found(_refused("ResourceNotFound", "Requested resource not found."))
    assert not not_found(_refused("ValidationException", "The job status is Completed."))
    assert not not_found(_refused("ThrottlingException", "Rate exceeded"))


# -- the request ----------------------------------------------------------------------------------

PAYLOAD = {
    "TrainingJobName": "sdk-chosen-name",
    "AlgorithmSpecification": {"TrainingImage": "img:1", "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTrainingRole",
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
    "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints/train-7"},
    "Tags": [{"Key": "team", "Value": "vision"}, {"Key": ATTEMPT_TAG, "Value": "stale"}],
}


@pytest.mark.parametrize("payload", [PAYLOAD, json.dumps(PAYLOAD)], ids=["object", "string"])
def test_the_request_is_the_payload_under_the_attempts_name_with_its_tags(payload):
    request = training_request({"payload": payload, "tags": {}}, "train-7", 2)
    assert request["TrainingJobName"] == "AWSBatch-train-7-2"
    assert request["Tags"] == [{"Key": "team", "Value": "vision"},
                               {"Key": JOB_ID_TAG, "Value": "train-7"},
                               {"Key": ATTEMPT_TAG, "Value": "2"}]  # fmt: skip
    assert request["CheckpointConfig"] == PAYLOAD["CheckpointConfig"]  # passed through
    assert {k: v for k, v in request.items() if k not in ("TrainingJobName", "Tags")} == {
        k: v for k, v in PAYLOAD.items() if k not in ("TrainingJobName", "Tags")}
    validate_parameters(request, MODEL.operation_model("CreateTrainingJob").input_shape)


@pytest.mark.parametrize("payload", [None, "not json", "[1, 2]"])
def test_a_job_without_a_create_training_job_request_cannot_run(payload):
    with pytest.raises(ValueError, match="not a CreateTrainingJob request"):
        training_request({"payload": payload, "tags": {}}, "j", 1)


@pytest.mark.parametrize("job_id", ["train-7", "a" * 128, "x_y.z",
                                    "3f2a9c1e-0d4b-4e8f-9a7b-1c2d3e4f5a6b"])
@pytest.mark.parametrize("attempt", [1, 10, 9999])
def test_the_name_is_describe_service_jobs_and_one_sagemaker_accepts(job_id, attempt):
    name = training_job_name(job_id, attempt)
    assert training_job_arn(job_id, attempt).endswith(f":training-job/{name}")
    rule = MODEL.shape_for("TrainingJobName").metadata
    assert len(name) <= rule["max"] and re.fullmatch(rule["pattern"], name), name


# -- a restart: what the next executor does with a training job its predecessor created -------


@pytest.mark.parametrize(("description", "running", "expected"), [
    # never created (the predecessor stopped between the ledger and CreateTrainingJob)
    (None, False, "create"),
    # still running or stopping: followed, never stopped, never created again
    (described("InProgress", "Starting"), False, "follow"),
    (described("InProgress", "Training"), True, "follow"),
    (described("InProgress", "Training"), False, "follow"),  # RUNNING comes from _follow
    (described("Stopping", "Stopping"), True, "follow"),
    # ended while no executor watched: reported as it ended
    (described("Completed", "Completed"), True, ("SUCCEEDED", None)),
    (described("Failed", "Failed", "AlgorithmError: exit 1"), True,
     ("FAILED", "AlgorithmError: exit 1")),
    (described("Stopped", "MaxRuntimeExceeded"), True,
     ("FAILED", "Training job stopped by SageMaker: MaxRuntimeExceeded")),
    # a capacity failure is a bounce only before RUNNING was reported
    (described("Failed", "Failed", "CapacityError: Unable to provision"), False,
     ("INSUFFICIENT_CAPACITY", "CapacityError: Unable to provision")),
    (described("Failed", "Failed", "CapacityError: Unable to provision"), True,
     ("FAILED", "CapacityError: Unable to provision")),
])  # fmt: skip
def test_a_restarted_executor_follows_what_its_predecessor_created(description, running, expected):
    assert resumed(description, running) == expected
