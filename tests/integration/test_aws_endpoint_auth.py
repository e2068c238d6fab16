"""The AWS Batch endpoint with authentication on: `quotasched endpoint --keys`, the keys that
`quotasched auth generate` writes, a real nats-server started with the generated permissions
and a real scheduler logged in as its role; the real AWS CLI (a subprocess, its environment
from a role's credentials file, as `set -a; . creds/<role>.env` gives it) and boto3.

A key acts as its role on NATS, so what it may do is what the role's NATS permissions allow:
the admin's key configures; a team's key (pipeline-q-qs1) submits to its own share and reads
its own job queue, and is refused AccessDeniedException for another share, a quota share, or
the fleet-wide reads.  Signatures are checked as AWS checks them: a wrong secret, an unknown
key, no signature, a signature over another body, a request signed 16 minutes ago.

awscli here is v1 (the PyPI package): it exits 255 on every error (v2 exits 254 on a service
error), and prints `An error occurred (<Code>) when calling the <Op> operation: <message>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from quotasched.services.config.auth import read_credentials
from quotasched.services.nats.embedded import EmbeddedServer
from tests.integration.conftest import QUOTASCHED, Process, wait_until
from tests.integration.helpers import NO_TICKS, holder_of
from tests.reliability.test_permissions import generated  # noqa: F401  (auth generate, once)

pytestmark = [pytest.mark.nats]

AWS = str(Path(sys.executable).parent / "aws")
REGION = "eu-west-1"  # any region: the signature's scope names it, the endpoint follows it
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}})
TEAM = "pipeline-q-qs1"
START_CEILING_S = 30.0
MISMATCH = ("The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method. Consult the service "
            "documentation for details.")  # fmt: skip


def creds(auth_dir: Path, role: str) -> dict[str, str]:
    return read_credentials(auth_dir / "creds" / f"{role}.env")


def first_line(process: Process, prefix: str) -> str:
    """The value of the process's `PREFIX=value` line, once it printed it."""

    def printed():
        if process.popen.poll() is not None:
            pytest.fail(f"{process.args} exited:\n{process.output()}")
        lines = [line for line in process.output().splitlines() if line.startswith(prefix)]
        return lines[0].removeprefix(prefix) if lines else None

    return wait_until(printed, START_CEILING_S)


@contextlib.contextmanager
def secured_endpoint(generated, tmp: Path, **endpoint_env: str):
    """nats-server with the generated permissions, the scheduler as `scheduler`, a gate, and
    `quotasched endpoint --keys endpoint-keys.json` (its extra variables `endpoint_env`), the
    scheduler leading: (server, endpoint process, endpoint URL); all stopped at the end."""
    server = EmbeddedServer(tmp / "nats", extra_args=["-c", str(generated / "nats-server.conf")])
    server.start()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("QUOTASCHED_", "AWS_"))}  # fmt: skip
    scheduler = Process(["scheduler", "--nats-url", server.url],
                        {**env, **NO_TICKS, **creds(generated, "scheduler")},
                        tmp / "scheduler.log")  # fmt: skip
    gate = Process(["gate", "--nats-url", server.url], {**env, **creds(generated, "gate")},
                   tmp / "gate.log")  # a team's commands pass through it  # fmt: skip
    endpoint = Process(
        ["endpoint", "--nats-url", server.url, "--keys", str(generated / "endpoint-keys.json")],
        {**env, **endpoint_env}, tmp / "endpoint.log")  # fmt: skip
    try:
        wait_until(lambda: holder_of(scheduler), START_CEILING_S)
        wait_until(lambda: "gate open" in gate.output(), START_CEILING_S)
        yield server, endpoint, first_line(endpoint, "AWS_ENDPOINT_URL_BATCH=")
    finally:
        endpoint.stop()
        gate.stop()
        scheduler.stop()
        server.stop()


@pytest.fixture(scope="module")
def deployment(generated, tmp_path_factory):  # noqa: F811
    """(endpoint URL, the auth directory): nats-server with the generated permissions, the
    scheduler as `scheduler`, and `quotasched endpoint --keys endpoint-keys.json`."""
    tmp = tmp_path_factory.mktemp("endpoint-auth")
    with secured_endpoint(generated, tmp) as (_, endpoint, url):
        assert endpoint.output().startswith(f"AWS_ENDPOINT_URL_BATCH={url}\n")
        yield url, generated
        assert endpoint.stop() == 0, endpoint.output()  # its role connections closed cleanly


def batch(deployment, role: str, secret: str | None = None):
    """boto3's batch client with a role's key pair (`secret`: another secret)."""
    import boto3

    url, auth_dir = deployment
    keys = creds(auth_dir, role)
    return boto3.client("batch", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=secret or keys["AWS_SECRET_ACCESS_KEY"])  # fmt: skip


@pytest.fixture(scope="module")
def configured(deployment):
    """The notebook's fleet, created with the admin's key: service environment se (3 units),
    policy sp, queue q, shares qs1-qs3 (those of examples/shares.yaml, whose teams have keys)."""
    admin = batch(deployment, "admin")
    policy = admin.create_scheduling_policy(
        name="sp", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
    )
    admin.create_service_environment(
        serviceEnvironmentName="se",
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}],
    )
    admin.create_job_queue(
        jobQueueName="q",
        priority=1,
        schedulingPolicyArn=policy["arn"],
        jobQueueType="SAGEMAKER_TRAINING",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}],
    )
    for share in ("qs1", "qs2", "qs3"):
        admin.create_quota_share(
            jobQueue="q",
            quotaShareName=share,
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}],
            resourceSharingConfiguration={"strategy": "LEND"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
    return deployment


def aws(deployment, environment: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The real AWS CLI with exactly `environment`'s AWS variables (a credentials file's)."""
    url, _ = deployment
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update(environment, AWS_DEFAULT_REGION=REGION, AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null")  # fmt: skip
    return subprocess.run([AWS, "batch", "--endpoint-url", url, *args], text=True,
                          capture_output=True, env=env, check=False)  # fmt: skip


def submit_args(name: str, share: str) -> list[str]:
    return ["submit-service-job", "--job-name", name, "--job-queue", "q", "--quota-share-name",
            share, "--service-job-type", "SAGEMAKER_TRAINING",
            "--service-request-payload", PAYLOAD]  # fmt: skip


def jobs(deployment) -> list[str]:
    """The names of every job of queue q, as the admin sees them (a JOB_NAME filter lists
    them whatever their status)."""
    listed = batch(deployment, "admin").list_service_jobs(
        jobQueue="q", filters=[{"name": "JOB_NAME", "values": ["*"]}]
    )
    return sorted(job["jobName"] for job in listed["jobSummaryList"])


def cli_error(operation: str, code: str, message: str) -> str:
    return f"An error occurred ({code}) when calling the {operation} operation: {message}"


# -- what a key may do is what its role may do on NATS ---------------------------------------


def test_the_admins_key_configured_the_queue_and_its_shares(configured):
    _, auth_dir = configured
    listed = aws(configured, creds(auth_dir, "admin"), "list-quota-shares", "--job-queue", "q",
                 "--query", "quotaShares[].quotaShareName", "--output", "text")  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["qs1", "qs2", "qs3"]


def test_a_teams_key_submits_to_its_own_share_and_is_denied_another(configured):
    """The team's credentials file, as is, makes the AWS CLI act as the team."""
    _, auth_dir = configured
    team = creds(auth_dir, TEAM)
    mine = aws(configured, team, *submit_args("mine", "qs1"))
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["jobName"] == "mine"

    theirs = aws(configured, team, *submit_args("smuggled", "qs2"))
    assert theirs.returncode == 255, theirs.stderr
    prefix = cli_error("SubmitServiceJob", "AccessDeniedException",
                       f"User: {TEAM} is not authorized to perform: batch:SubmitServiceJob "
                       "(the NATS server refused publish to ")  # fmt: skip
    assert theirs.stderr.strip().startswith(prefix), theirs.stderr
    assert "q.qs2" in theirs.stderr  # the refused subject names the other team's share
    assert "smuggled" not in jobs(configured)  # it never reached the scheduler
    assert "mine" in jobs(configured)


def test_a_teams_key_manages_its_own_jobs_by_id_and_no_other_teams(configured):
    """AWS names a job by its id alone; a team may ask about its own job queue only, so the
    endpoint asks there for it (a job elsewhere does not exist for the team)."""
    from botocore.exceptions import ClientError

    team, other = batch(configured, TEAM), batch(configured, "pipeline-q-qs2")
    job_id = team.submit_service_job(jobName="own", jobQueue="q", quotaShareName="qs1",
                                     serviceJobType="SAGEMAKER_TRAINING",
                                     serviceRequestPayload=PAYLOAD)["jobId"]  # fmt: skip
    team.update_service_job(jobId=job_id, schedulingPriority=7)
    assert team.describe_service_job(jobId=job_id)["schedulingPriority"] == 7
    with pytest.raises(ClientError) as refused:
        other.terminate_service_job(jobId=job_id, reason="not mine")
    assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "pipeline-q-qs2 is not authorized to perform: batch:TerminateServiceJob" in (
        refused.value.response["Error"]["Message"])  # fmt: skip
    team.terminate_service_job(jobId=job_id, reason="done")
    ended = team.describe_service_job(jobId=job_id)
    assert (ended["status"], ended["statusReason"]) == ("FAILED", "done")


def test_a_teams_key_cannot_configure_nor_read_the_whole_fleet(configured):
    from botocore.exceptions import ClientError

    team = batch(configured, TEAM)
    with pytest.raises(ClientError) as create:
        team.create_quota_share(
            jobQueue="q",
            quotaShareName="qs1",  # not even its own share's name
            capacityLimits=[{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
    assert create.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert create.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "qm.cmd.q.qs1.CreateQuotaShare" in create.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as fleet:
        team.describe_job_queues()
    assert fleet.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "qm.api.~.describe-job-queues" in fleet.value.response["Error"]["Message"]
    # what it may read, it reads: its own job queue
    shares = team.list_quota_shares(jobQueue="q")["quotaShares"]
    assert [share["capacityLimits"][0]["maxCapacity"] for share in shares] == [1, 1, 1]


# -- signatures, checked as AWS checks them --------------------------------------------------


def test_a_wrong_secret_is_an_invalid_signature(configured):
    _, auth_dir = configured
    forged = {**creds(auth_dir, TEAM), "AWS_SECRET_ACCESS_KEY": "x" * 40}
    done = aws(configured, forged, "list-quota-shares", "--job-queue", "q")
    assert done.returncode == 255
    assert done.stderr.strip() == cli_error(
        "ListQuotaShares", "InvalidSignatureException", MISMATCH
    )


def test_an_unknown_key_is_an_unrecognized_client(configured):
    unknown = {"AWS_ACCESS_KEY_ID": "QSAKUNKNOWNUNKNOWN00", "AWS_SECRET_ACCESS_KEY": "y" * 40}
    done = aws(configured, unknown, "list-quota-shares", "--job-queue", "q")
    assert done.returncode == 255
    assert done.stderr.strip() == cli_error("ListQuotaShares", "UnrecognizedClientException",
                                            "The security token included in the request is "
                                            "invalid.")  # fmt: skip


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a raw POST."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def signed_headers(url: str, body: bytes, key_id: str, secret: str, at: datetime) -> dict:
    """botocore's SigV4 headers for a POST of `body` to `url`, signed at time `at` (its signer's
    own steps, with the time given instead of now)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method="POST", url=url, data=body,
                         headers={"Content-Type": "application/json"})  # fmt: skip
    signer = SigV4Auth(Credentials(key_id, secret), "batch", REGION)
    request.context["timestamp"] = at.strftime("%Y%m%dT%H%M%SZ")
    signer._modify_request_before_signing(request)
    signature = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)),
                                 request)  # fmt: skip
    signer._inject_signature_to_request(request, signature)
    return dict(request.headers.items())


def test_an_unsigned_request_is_missing_its_token(configured):
    url, _ = configured
    status, headers, body = post(f"{url}/v1/listquotashares", b'{"jobQueue": "q"}',
                                 {"Content-Type": "application/json"})  # fmt: skip
    assert status == 403
    assert headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    assert body == {"__type": "MissingAuthenticationTokenException",
                    "message": "Missing Authentication Token"}  # fmt: skip


def test_a_signature_is_good_for_its_body_and_15_minutes_only(configured):
    url, auth_dir = configured
    keys = creds(auth_dir, TEAM)
    key_id, secret = keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]
    target, body = f"{url}/v1/listquotashares", b'{"jobQueue": "q"}'
    now = datetime.now(UTC)
    status, _, answer = post(target, body, signed_headers(target, body, key_id, secret, now))
    assert status == 200, answer  # the same signer, on time: accepted
    assert len(answer["quotaShares"]) == 3

    tampered = signed_headers(target, body, key_id, secret, now)
    status, _, answer = post(target, b'{"jobQueue": "r"}', tampered)
    assert (status, answer["__type"], answer["message"]) == (403, "InvalidSignatureException",
                                                             MISMATCH)  # fmt: skip

    old = now - timedelta(minutes=16)
    status, headers, answer = post(target, body, signed_headers(target, body, key_id, secret, old))
    assert status == 403
    assert headers["x-amzn-ErrorType"] == "InvalidSignatureException"
    assert answer["message"].startswith(
        f"Signature expired: {old.strftime('%Y%m%dT%H%M%SZ')} is now earlier than "
    )


# -- the process ------------------------------------------------------------------------------


def endpoint_refusal(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([QUOTASCHED, "endpoint", *args], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done


def test_the_endpoint_process_refuses_what_it_cannot_serve_safely(deployment, tmp_path):
    url, auth_dir = deployment
    nats = "nats://127.0.0.1:4222"  # never reached: each refusal comes first
    exposed = endpoint_refusal("--nats-url", nats, "--host", "0.0.0.0")
    assert "without --keys" in exposed.stderr and "0.0.0.0" in exposed.stderr
    broken = tmp_path / "keys.json"
    broken.write_text('{"QSAKX": {"role": "admin"}}')
    assert "secretAccessKey" in endpoint_refusal("--nats-url", nats, "--keys", str(broken)).stderr
    port = url.rsplit(":", 1)[1]  # the running endpoint's
    taken = endpoint_refusal("--nats-url", nats, "--keys", str(auth_dir / "endpoint-keys.json"),
                             "--port", port)  # fmt: skip
    assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr


def test_generate_writes_a_key_pair_per_role_and_the_endpoints_keys_file(generated):  # noqa: F811
    keys = json.loads((generated / "endpoint-keys.json").read_text())
    assert (generated / "endpoint-keys.json").stat().st_mode & 0o077 == 0
    by_role = {entry["role"]: (key_id, entry) for key_id, entry in keys.items()}
    assert set(by_role) == {path.name.removesuffix(".env")
                            for path in (generated / "creds").iterdir()}  # fmt: skip
    for role, (key_id, entry) in by_role.items():
        file = creds(generated, role)
        assert (file["AWS_ACCESS_KEY_ID"], file["AWS_SECRET_ACCESS_KEY"]) == (
            key_id, entry["secretAccessKey"])  # fmt: skip
        assert len(key_id) == 20 and key_id.startswith("QSAK") and key_id.isupper()
        assert key_id.isalnum() and len(entry["secretAccessKey"]) == 40
        assert entry["nats"] == {name: value for name, value in file.items()
                                 if name.startswith(("QUOTASCHED_NATS_", "QUOTASCHED_TEAM_"))}
        assert entry.get("jobQueue") == ("q" if role.startswith("pipeline-") else None)
        assert entry.get("quotaShare") == (role.rsplit("-", 1)[1] if role.startswith("pipeline-")
                                           else None)  # fmt: skip
    assert len({entry["secretAccessKey"] for entry in keys.values()}) == len(keys)
