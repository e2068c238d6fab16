"""Hostile images and ids, submitted to a live scheduler on a real nats-server (issue 28,
points 2 and 5): each is decided into exactly one `CommandRejected` naming the field and the
problem, and the valid ones beside them are accepted; the AWS Batch endpoint answers the same
refusal as a ClientException.  The rules themselves: tests/unit/test_image_references.py and
tests/unit/test_subject_safe_ids.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from quotasched.events.subjects import COMMANDS_STREAM, command_subject
from quotasched.services.client import Bus
from quotasched.services.endpoint.server import Endpoint
from tests.integration.helpers import NOTEBOOK, api_ready, read_facts, wait_decided

pytestmark = [pytest.mark.nats, pytest.mark.slow]

G5 = "ml.g5.xlarge"
SUBMIT = command_subject("SubmitServiceJob", "q", "qs1")
DIGEST = "sha256:" + "ab" * 32
TRAINING = "serviceRequestPayload AlgorithmSpecification.TrainingImage"


def submit(job_id: str, **fields) -> dict:
    command = {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": "j", "jobQueue": "q",
               "quotaShareName": "qs1", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip
    command.update(fields)
    return command


def with_image(job_id: str, image: str) -> dict:
    return submit(job_id, tags={"image": image})


def in_payload(job_id: str, image: str) -> dict:
    payload = {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
               "AlgorithmSpecification": {"TrainingImage": image}}  # fmt: skip
    return submit(job_id, capacityUsage=None, serviceRequestPayload=json.dumps(payload))


# (scenario, command, words its CommandRejected's statusReason must contain)
REFUSED = [
    ("a privileged flag as the image is refused",
     with_image("i1", "--privileged"), ["tags.image", "'--privileged'", "begins with '-'"]),
    ("a host mount as the image is refused",
     with_image("i2", "--volume=/:/host"), ["tags.image", "'--volume=/:/host'", "begins with '-'"]),
    ("the host's pid namespace as the image is refused",
     with_image("i3", "--pid=host"), ["tags.image", "'--pid=host'", "begins with '-'"]),
    ("a short flag as the image is refused", with_image("i4", "-v"), ["tags.image", "'-v'"]),
    ("an uppercase path is refused", with_image("i5", "Busybox"), ["tags.image", "lowercase"]),
    ("an empty image is refused", with_image("i6", ""), ["tags.image is empty"]),
    ("an image with spaces is refused",
     with_image("i7", "busybox --privileged"), ["tags.image", "whitespace"]),
    ("a payload image too long is refused", in_payload("i8", "a" * 300), [TRAINING, "longer than 255"]),
    ("a privileged flag as the payload's image is refused",
     in_payload("i9", "--privileged"), [TRAINING, "begins with '-'"]),
    ("a job id of one dot is refused", submit("."), ["jobId", "no dots"]),
    ("a job id of two dots is refused", submit(".."), ["jobId", "no dots"]),
    ("a job id with a trailing dot is refused", submit("bad."), ["jobId", "no dots"]),
    ("a job id with a leading dot is refused", submit(".bad"), ["jobId", "no dots"]),
    ("a job id with an empty token is refused", submit("a..b"), ["jobId", "no dots"]),
    ("a job id with a dot is refused", submit("a.b"), ["jobId", "no dots"]),
    ("a job id of a wildcard is refused", submit("*"), ["jobId", "wildcards"]),
    ("a job id of the tail wildcard is refused", submit(">"), ["jobId", "wildcards"]),
    ("a job id with a colon is refused", submit("a:b"), ["jobId", "colons"]),
]

ACCEPTED = [
    ("a bare image name is accepted", with_image("ok-1", "busybox")),
    ("a registry, a path and a tag are accepted", with_image("ok-2", "docker.io/library/busybox:1.36")),
    ("a registry with a port and a digest are accepted", with_image("ok-3", f"localhost:5000/a/b@{DIGEST}")),
    ("a dotted registry and a dotted tag are accepted",
     in_payload("ok-4", "registry.example.com/team/img:v1.2")),
    ("a job id with the rule's characters at its edges is accepted", submit("-_Az09_-")),
]


async def setup(bus) -> None:
    """The notebook's environment, policy, queue q and shares qs1-qs3."""
    lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
    last = 0
    for line in lines:
        last = await bus.publish(line)
    await wait_decided(bus.js, last)


async def test_hostile_images_and_ids_are_refused_at_submission_and_valid_ones_accepted(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        await setup(bus)
        seqs = {}
        for scenario, command, *_ in [*REFUSED, *ACCEPTED]:
            command = {key: value for key, value in command.items() if value is not None}
            ack = await bus.js.publish(SUBMIT, json.dumps(command).encode(), stream=COMMANDS_STREAM)
            seqs[scenario] = ack.seq
        await wait_decided(bus.js, max(seqs.values()), processes=[scheduler])
        by_seq: dict[int, list[dict]] = {}
        for fact in await read_facts(bus.js):
            by_seq.setdefault(fact["commandSeq"], []).append(fact)

    problems = []
    for scenario, _, words in REFUSED:
        got = by_seq.get(seqs[scenario], [])
        if [fact["kind"] for fact in got] != ["CommandRejected"]:
            problems.append(f"{scenario}: facts {[fact['kind'] for fact in got]}")
            continue
        reason = got[0]["statusReason"]
        missing = [word for word in words if word not in reason]
        if missing or not reason.startswith("Invalid SubmitServiceJob: "):
            problems.append(f"{scenario}: statusReason {reason!r} lacks {missing}")
    for scenario, command in ACCEPTED:
        got = by_seq.get(seqs[scenario], [])
        if [fact["kind"] for fact in got][:1] != ["JobSubmitted"] or got[0]["jobId"] != command["jobId"]:
            problems.append(f"{scenario}: facts {[(f['kind'], f.get('statusReason')) for f in got]}")
    assert not problems, "\n".join(problems)


async def test_the_aws_endpoint_answers_a_hostile_image_with_a_client_exception(nats_server, spawn):
    import boto3
    from botocore.exceptions import ClientError

    spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        await setup(bus)
        endpoint = await Endpoint(bus).start()
        try:
            batch = boto3.client("batch", endpoint_url=endpoint.url, region_name="us-east-1",
                                 aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy")

            def submit_job(name: str, image: str) -> dict:
                payload = {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
                           "AlgorithmSpecification": {"TrainingImage": image}}  # fmt: skip
                return batch.submit_service_job(
                    jobName=name, jobQueue="q", quotaShareName="qs1",
                    serviceJobType="SAGEMAKER_TRAINING", serviceRequestPayload=json.dumps(payload))

            with pytest.raises(ClientError) as refused:
                await asyncio.to_thread(submit_job, "hostile", "--privileged")
            error = refused.value.response["Error"]
            assert error["Code"] == "ClientException"
            assert error["Message"] == (f"Invalid SubmitServiceJob: {TRAINING} '--privileged' begins "
                                        "with '-': it would be read as a container runtime option")
            assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
            with pytest.raises(ClientError, match="tags.image 'Busybox' is not an image reference"):
                await asyncio.to_thread(lambda: batch.submit_service_job(
                    jobName="upper", jobQueue="q", quotaShareName="qs1",
                    serviceJobType="SAGEMAKER_TRAINING", tags={"image": "Busybox"},
                    serviceRequestPayload=json.dumps({"ResourceConfig": {
                        "InstanceType": G5, "InstanceCount": 1}})))  # fmt: skip
            accepted = await asyncio.to_thread(submit_job, "fine", "registry.example.com/team/img:v1.2")
            assert accepted["jobName"] == "fine" and accepted["jobId"]
        finally:
            await endpoint.close()
