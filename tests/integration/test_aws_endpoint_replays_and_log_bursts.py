"""The AWS Batch endpoint with authentication on (`quotasched endpoint --keys`, as in
test_aws_endpoint_auth.py): a signed request replayed within its 15 minutes is refused and
performs nothing twice, and a burst of identical refusals is one log line, the rest counted."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.integration.conftest import Process
from tests.integration.test_aws_endpoint_auth import (PAYLOAD, TEAM, batch,  # noqa: F401
                                                      configured, creds, jobs, post,
                                                      secured_endpoint, signed_headers)
from tests.reliability.test_permissions import generated  # noqa: F401  (auth generate, once)

pytestmark = [pytest.mark.nats]

BURST = 30
ENDPOINT: dict[str, Process] = {}


@pytest.fixture(scope="module")
def deployment(generated, tmp_path_factory):  # noqa: F811
    """test_aws_endpoint_auth's deployment, its endpoint's log kept (ENDPOINT["process"]),
    every error kind told once an hour."""
    with secured_endpoint(generated, tmp_path_factory.mktemp("endpoint-replays"),
                          QUOTASCHED_HTTP_ERROR_LOG_INTERVAL_S="3600") as (_, endpoint, url):
        ENDPOINT["process"] = endpoint
        yield url, generated


def logged(event: str) -> list[dict]:
    lines = []
    for line in ENDPOINT["process"].output().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            lines.append(record)
    return lines


def test_a_replayed_signed_submission_is_refused_and_submits_once(configured):
    url, auth_dir = configured
    keys = creds(auth_dir, TEAM)
    body = json.dumps({"jobName": "replayed", "jobQueue": "q", "quotaShareName": "qs1",
                       "serviceJobType": "SAGEMAKER_TRAINING",
                       "serviceRequestPayload": PAYLOAD}).encode()  # no clientToken  # fmt: skip
    target = f"{url}/v1/submitservicejob"
    headers = signed_headers(target, body, keys["AWS_ACCESS_KEY_ID"],
                             keys["AWS_SECRET_ACCESS_KEY"], datetime.now(UTC))  # fmt: skip
    status, _, answer = post(target, body, headers)
    assert status == 200, answer
    status, answered, refused = post(target, body, headers)  # the very same bytes again
    assert (status, answered["x-amzn-ErrorType"]) == (403, "InvalidSignatureException"), refused
    assert "already received" in refused["message"]
    assert jobs(configured).count("replayed") == 1


def test_a_signed_read_may_be_repeated(configured):
    """A poll twice within a second is the same signature from an honest client; a read
    changes nothing, so it is answered again."""
    url, auth_dir = configured
    keys = creds(auth_dir, TEAM)
    body, target = b'{"jobQueue": "q"}', f"{url}/v1/listservicejobs"
    headers = signed_headers(target, body, keys["AWS_ACCESS_KEY_ID"],
                             keys["AWS_SECRET_ACCESS_KEY"], datetime.now(UTC))  # fmt: skip
    assert [post(target, body, headers)[0] for _ in range(2)] == [200, 200]


def test_a_burst_of_identical_refusals_is_one_log_line(configured):
    url, _ = configured
    before = len(logged("refused an unauthenticated request"))
    for _ in range(BURST):
        status, _, _ = post(f"{url}/v1/listquotashares", b'{"jobQueue": "q"}',
                            {"Content-Type": "application/json"})  # fmt: skip
        assert status == 403
    lines = logged("refused an unauthenticated request")
    assert len(lines) - before <= 1, lines[before:]  # at most the first of its kind
    assert lines and lines[-1]["reason"] == "MissingAuthenticationTokenException"


def test_the_refusals_held_back_are_counted_when_the_endpoint_stops(configured):
    """Last in this module: it stops the endpoint, which tells what the interval held back."""
    url, _ = configured
    before = len(logged("refused an unauthenticated request"))
    for _ in range(BURST):
        assert post(f"{url}/v1/listquotashares", b"{}", {"Content-Type": "application/json"})[0] == 403
    assert ENDPOINT["process"].stop() == 0
    told = [line for line in logged("refused an unauthenticated request")[before:]
            if line.get("kind") == "MissingAuthenticationTokenException"]  # fmt: skip
    assert len(told) == 1, told
    assert told[0]["held_back"] >= BURST  # this burst, and the previous test's but its first
