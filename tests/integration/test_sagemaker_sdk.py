"""The real SageMaker Python SDK v3 `TrainingQueue` against `quotasched up`, unchanged but for
AWS_ENDPOINT_URL_BATCH: tests/sdk/sagemaker_story.py runs in the SDK's own virtualenv
(.venv-sagemaker, built by `make test` from tests/sdk/requirements.txt) and reports what it saw.

Expectations, by hand from the spec's fixture N (3 ml.g5.xlarge; qs1 LEND_AND_BORROW with
in-share preemption, qs2 LEND, qs3 RESERVE; one instance each): of high (3), med (2) and low (1)
submitted to qs1, high runs on qs1's instance, med on qs2's lent one, low waits (qs3 lends
nothing).  low raised to 4 outranks med inside qs1: med is preempted (IN_SHARE_PRIORITY) back to
RUNNABLE and low runs.  Each dispatch is a training job named `AWSBatch-<job id>-<attempt>`.
The simulated executor (--speed 1000) runs a job for its `duration` tag; outcome=FAILED fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Process

pytestmark = [pytest.mark.nats, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SDK_PYTHON = ROOT / ".venv-sagemaker" / "bin" / "python"
STORY = ROOT / "tests" / "sdk" / "sagemaker_story.py"
START_CEILING_S = 120.0
STORY_CEILING_S = 300.0
SAGEMAKER = "arn:aws:sagemaker:local:000000000000:training-job/AWSBatch-"
BATCH_JOB = "arn:aws:batch:local:000000000000:job/"


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    if not SDK_PYTHON.exists():
        pytest.skip("no .venv-sagemaker: `make test` builds it (uv, tests/sdk/requirements.txt)")
    tmp = tmp_path_factory.mktemp("sagemaker-sdk")
    env = {**os.environ, "QUOTASCHED_TICK_INTERVAL_S": "0.5"}
    up = Process(["up", "--data-dir", str(tmp / "data"), "--executor", "simulated",
                  "--speed", "1000", "--no-projector"], env, tmp / "up.log")  # fmt: skip
    try:
        deadline = time.monotonic() + START_CEILING_S
        while not (lines := [line for line in up.output().splitlines()
                             if line.startswith("AWS_ENDPOINT_URL_BATCH=")]):  # fmt: skip
            if up.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`up` printed no AWS endpoint:\n{up.output()}")
            time.sleep(0.1)
        user = {key: value for key, value in os.environ.items()
                if not key.startswith(("AWS_", "QUOTASCHED_", "VIRTUAL_ENV", "PYTHON"))}  # fmt: skip
        user.update({"AWS_ENDPOINT_URL_BATCH": lines[0].split("=", 1)[1],
                     "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy",
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": "/dev/null",
                     "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                     "SAGEMAKER_VALIDATE_ROLE": "false"})  # fmt: skip
        done = subprocess.run([str(SDK_PYTHON), str(STORY), "q-sdk"], env=user, text=True,
                              capture_output=True, timeout=STORY_CEILING_S)  # fmt: skip
        assert done.returncode == 0, f"{done.stderr[-4000:]}\n`up`:\n{up.output()[-4000:]}"
        yield json.loads(done.stdout.splitlines()[-1])
    finally:
        assert up.stop() == 0, up.output()


def test_submit_with_priority_and_quota_share_then_list(observed):
    assert all(arn.startswith(BATCH_JOB) for arn in observed["arns"].values())
    assert observed["running"] == ["high", "med"]  # qs1's own instance, qs2's lent one
    assert observed["runnable_in_qs1"] == ["low"]  # list_jobs_by_share
    assert observed["by_name"] == observed["arns"]["med"]  # get_job(name)
    assert observed["low"] == {"status": "RUNNABLE", "schedulingPriority": 1,
                               "quotaShareName": "qs1", "tags": {"duration": "1000000"},
                               "serviceJobType": "SAGEMAKER_TRAINING"}  # fmt: skip


def test_the_payload_is_the_model_trainers_create_training_job_request(observed):
    payload = observed["low_payload"]
    assert payload["ResourceConfig"] == {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1,
                                         "VolumeSizeInGB": 30}  # fmt: skip
    assert payload["RoleArn"] == "arn:aws:iam::123456789012:role/SageMakerTrainingRole"
    assert payload["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] == (
        "s3://notebook-bucket/data")


def test_a_priority_update_preempts_inside_the_share(observed):
    assert observed["update"] == ["ResponseMetadata", "jobArn", "jobId", "jobName"]
    assert observed["running_after"] == ["high", "low"]
    med_id = observed["arns"]["med"].removeprefix(BATCH_JOB)
    low_id = observed["arns"]["low"].removeprefix(BATCH_JOB)
    [attempt] = observed["med_attempts"]
    assert attempt["serviceResourceId"] == {"name": "TrainingJobArn",
                                            "value": f"{SAGEMAKER}{med_id}-1"}  # fmt: skip
    assert attempt["statusReason"] == f"Preempted by job {low_id} (IN_SHARE_PRIORITY)"
    assert attempt["stoppedAt"] >= attempt["startedAt"]
    assert observed["med_preemption"] == {"preemptedAttemptCount": 1,
                                          "recentPreemptedAttempts": [attempt]}  # fmt: skip
    # waiting again: the SDK says so without calling SageMaker
    assert observed["med_trainer"].startswith("NoTrainingJob:")


def test_describe_shows_the_running_attempt(observed):
    high_id = observed["arns"]["high"].removeprefix(BATCH_JOB)
    assert observed["high_latest_attempt"] == {"serviceResourceId": {
        "name": "TrainingJobArn", "value": f"{SAGEMAKER}{high_id}-1"}}  # fmt: skip
    assert observed["high_started"]


def test_terminate_wait_and_result(observed):
    assert observed["med_ended"] == ["FAILED", "not needed", True]
    assert (observed["quick_wait"], observed["quick_result"]) == ("SUCCEEDED", "SUCCEEDED")
    assert observed["broken_result"] == "RuntimeError: Simulated failure (tag outcome=FAILED)"
    assert observed["mapped"] == ["map-a", "map-b"]
