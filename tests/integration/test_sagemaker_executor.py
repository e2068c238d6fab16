"""`quotasched executor --kind sagemaker` against moto's SageMaker server, a real nats-server
and a real scheduler.

moto's server is a real HTTP server speaking SageMaker's JSON protocol: the executor's boto3
client reaches it through AWS_ENDPOINT_URL_SAGEMAKER with dummy credentials, and the tests
read the training jobs back with boto3.  Its request recorder (MOTO_ENABLE_RECORDING) lists
every call the executor made, which is how "created once" is checked.

What moto 5.2.5 does: CreateTrainingJob (no name or field validation of its own; botocore
validates the request), DescribeTrainingJob (a job is `Completed` from its creation, with one
`Starting` transition), ListTrainingJobs and ListTags.  What it lacks: StopTrainingJob,
DeleteTrainingJob and UpdateTrainingJob answer HTTP 500 (not implemented); a second
CreateTrainingJob with the same name replaces the job instead of failing with ResourceInUse;
no job is ever InProgress, Stopping, Stopped or Failed, and none has a FailureReason.  So the
follow-and-report path here is "created, STARTING, Completed, SUCCEEDED"; the rest of the
mapping, capacity detection, back-off and stop confirmation are unit-tested
(tests/unit/test_sagemaker_executor.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import boto3
import pytest

from quotasched.services.client import Bus
from quotasched.services.executors.sagemaker import ATTEMPT_TAG, JOB_ID_TAG
from quotasched.services.scheduler.api import training_job_name
from tests.integration.helpers import NOTEBOOK, eventually, read_facts
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats]

DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_REGION": "us-east-1"}  # fmt: skip

PAYLOAD = {
    "AlgorithmSpecification": {"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                                                "pytorch-training:2.5-gpu-py311",
                               "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTrainingRole",
    "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": "s3://notebook-bucket/data",
        "S3DataDistributionType": "FullyReplicated"}}}],
    "OutputDataConfig": {"S3OutputPath": "s3://notebook-bucket/output"},
    "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "CheckpointConfig": {"S3Uri": "s3://notebook-bucket/checkpoints/train",
                         "LocalPath": "/opt/ml/checkpoints"},
    "HyperParameters": {"epochs": "3"},
    "Tags": [{"Key": "team", "Value": "vision"}],
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Moto:
    """moto's server in its own process, with its request recorder on."""

    def __init__(self, directory):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.recording = directory / "moto-recording.jsonl"
        self.log = open(directory / "moto.log", "ab")
        env = {**os.environ, **DUMMY_AWS, "MOTO_ENABLE_RECORDING": "1",
               "MOTO_RECORDER_FILEPATH": str(self.recording)}  # fmt: skip
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        self.client = boto3.client("sagemaker", endpoint_url=self.url, region_name="us-east-1",
                                   aws_access_key_id="testing",
                                   aws_secret_access_key="testing")  # fmt: skip
        deadline = time.monotonic() + 30
        while not self._answers():
            assert self.popen.poll() is None, "moto's server exited"
            assert time.monotonic() < deadline, "moto's server did not answer in 30 s"
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            self.client.list_training_jobs()
            return True
        except Exception:
            return False

    def reset(self) -> None:
        """Forget every training job and every recorded request (a fresh SageMaker)."""
        for path in ("/moto-api/reset", "/moto-api/recorder/reset-recording"):
            urllib.request.urlopen(urllib.request.Request(self.url + path, method="POST")).close()

    def calls(self, operation: str) -> list[dict]:
        """The request bodies of every `operation` call made so far, in order."""
        if not self.recording.exists():
            return []
        found = []
        for line in self.recording.read_text().splitlines():
            entry = json.loads(line)
            target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
            if target == f"SageMaker.{operation}":
                body = entry["body"]
                found.append(json.loads(base64.b64decode(body) if entry["body_encoded"] else body))
        return found

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory):
    server = Moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def sagemaker(moto_server):
    moto_server.reset()
    return moto_server


def executor_env(sagemaker: Moto, poll_s: float = 0.1) -> dict[str, str]:
    """The executor's environment: boto3's usual variables, pointed at moto, and a short poll."""
    return {**DUMMY_AWS, "AWS_ENDPOINT_URL_SAGEMAKER": sagemaker.url,
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "QUOTASCHED_SAGEMAKER_POLL_S": str(poll_s),
            "QUOTASCHED_SAGEMAKER_POLL_MAX_S": str(max(poll_s, 0.5))}  # fmt: skip


async def _notebook_setup(bus: Bus) -> None:
    """The notebook's service environment, policy, queue `q` and shares qs1, qs2, qs3."""
    for line in NOTEBOOK.read_text().splitlines():
        command = json.loads(line)
        if command["kind"].startswith("Create"):
            await bus.publish(command)


async def _submit(bus: Bus, job_id: str, share: str, payload: dict | str, **extra) -> None:
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "q",
        "quotaShareName": share, "serviceJobType": "SAGEMAKER_TRAINING",
        "serviceRequestPayload": payload if isinstance(payload, str) else json.dumps(payload),
        **extra,
    })  # fmt: skip (capacity: the payload's ResourceConfig, one ml.g5.xlarge)


def _reports(facts: list[dict], job_id: str) -> list[tuple[int, str]]:
    return [(f["attempt"], f["status"]) for f in facts
            if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id]  # fmt: skip


async def _ended(bus: Bus, job_id: str) -> list[dict] | None:
    facts = await read_facts(bus.js)
    done = [f for f in facts if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id
            and f["status"] in ("SUCCEEDED", "FAILED")]  # fmt: skip
    return facts if done else None


async def test_each_attempt_is_a_training_job_under_its_describe_service_job_name(
        nats_server, spawn, sagemaker):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await _notebook_setup(bus)
        spawn("executor", "--kind", "sagemaker", **executor_env(sagemaker))
        await _submit(bus, "train-7", "qs1", PAYLOAD)
        broken = {k: v for k, v in PAYLOAD.items() if k != "RoleArn"}  # botocore refuses it
        await _submit(bus, "broken", "qs2", broken)
        facts = await eventually(lambda: _ended(bus, "train-7"), 30, what="train-7 ended")
        facts = await eventually(lambda: _ended(bus, "broken"), 30, what="broken ended")
        described = await bus.request("describe-service-job", jobId="train-7")

    name = training_job_name("train-7", 1)
    assert described["latestAttempt"]["serviceResourceId"]["value"].endswith(f"/{name}")
    assert _reports(facts, "train-7") == [(1, "STARTING"), (1, "SUCCEEDED")]
    job = sagemaker.client.describe_training_job(TrainingJobName=name)
    for field in ("RoleArn", "InputDataConfig", "OutputDataConfig", "ResourceConfig",
                  "StoppingCondition", "CheckpointConfig", "HyperParameters"):  # fmt: skip
        assert job[field] == PAYLOAD[field], field
    tags = sagemaker.client.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags} == {"team": "vision", JOB_ID_TAG: "train-7",
                                                    ATTEMPT_TAG: "1"}  # fmt: skip
    assert [c["TrainingJobName"] for c in sagemaker.calls("CreateTrainingJob")] == [name]

    [failed] = [f for f in facts if f["kind"] == "JobStatusChanged" and f["jobId"] == "broken"
                and f["status"] == "FAILED"]  # fmt: skip
    assert failed["statusReason"].startswith("CreateTrainingJob: invalid request:")
    assert "RoleArn" in failed["statusReason"]


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_a_killed_executors_training_job_is_never_created_twice(
        nats_server, spawn, sagemaker, how):  # fmt: skip
    """The first executor creates the training job, reports STARTING and is killed (SIGKILL)
    or stopped (SIGTERM: it leaves the training job running) before it first looks at the job (its first poll is 10 minutes away).  The next one, on the same
    state directory, finds the attempt in the ledger and follows that training job by its
    name: it never stops it, reads how it ended (Completed) and reports it SUCCEEDED.  The job
    had two attempts to spare: none is used, and CreateTrainingJob was called once."""
    scheduler = spawn("scheduler")
    name = training_job_name("long", 1)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await _notebook_setup(bus)
        first = spawn("executor", "--kind", "sagemaker", **executor_env(sagemaker, poll_s=600))
        await _submit(bus, "long", "qs3", PAYLOAD, retryStrategy={"attempts": 3})

        async def starting() -> bool:
            return (1, "STARTING") in _reports(await read_facts(bus.js), "long")

        await eventually(starting, 30, what="attempt 1 STARTING")
        assert [c["TrainingJobName"] for c in sagemaker.calls("CreateTrainingJob")] == [name]
        if how == "sigkill":
            first.kill()
        else:
            assert first.stop() == 0
            assert "1 attempts keep running; start again to follow them" in first.output()

        spawn("executor", "--kind", "sagemaker", **executor_env(sagemaker))
        facts = await eventually(lambda: _ended(bus, "long"), 30, what="long ended")
        await asyncio.sleep(1.0)  # a second create, if any, would come now
        facts = await read_facts(bus.js)

    assert _reports(facts, "long") == [(1, "STARTING"), (1, "SUCCEEDED")]
    assert [c["TrainingJobName"] for c in sagemaker.calls("CreateTrainingJob")] == [name]
    assert not sagemaker.calls("StopTrainingJob"), "a restart stopped the training job"
    assert {c["TrainingJobName"] for c in sagemaker.calls("DescribeTrainingJob")} == {name}
    assert [f["attempt"] for f in facts if f["kind"] == "JobDispatched"] == [1]


async def test_checkpoint_config_passes_through_to_create_training_job_unchanged(
        nats_server, spawn, sagemaker):  # fmt: skip
    """Issue 33: checkpoints on SageMaker are SageMaker's (it syncs LocalPath with S3Uri
    around every training job), so the executor sends the payload's CheckpointConfig exactly
    as given: no LocalPath added where there is none (SageMaker's default applies), none
    changed, for each job's CreateTrainingJob request as recorded on the wire."""
    configs = {"with-path": {"S3Uri": "s3://notebook-bucket/ckpt/run 7/",
                             "LocalPath": "/opt/ml/checkpoints/run-7/"},
               "default-path": {"S3Uri": "https://notebook-bucket.s3.amazonaws.com/ckpt"}}
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await _notebook_setup(bus)
        spawn("executor", "--kind", "sagemaker", **executor_env(sagemaker))
        for job_id, config in configs.items():
            # (with the agent's tag `grace`: quotasched's own, never sent to SageMaker)
            await _submit(bus, job_id, "qs1", {**PAYLOAD, "CheckpointConfig": config},
                          tags={"grace": "30"})  # fmt: skip
        for job_id in configs:
            await eventually(lambda: _ended(bus, job_id), 30, what=f"{job_id} ended")

    sent = {call["TrainingJobName"]: call for call in sagemaker.calls("CreateTrainingJob")}
    for job_id, config in configs.items():
        request = sent[training_job_name(job_id, 1)]
        assert request["CheckpointConfig"] == config, job_id
        assert "grace" not in json.dumps(request), request
