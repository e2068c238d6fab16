"""Ids and names that become subject tokens, KV keys and path components (issue 28, point 5).

A job id chosen at submission is 1-128 characters of `[A-Za-z0-9_-]`: it stands as one token
in the fleet's claim keys (`claim.<job>.<attempt>`) and as one directory in the agent's logs
(`<logs>/<job>/<attempt>.log`), so it can hold no dot (an empty token, `.`, `..`, an extra
token), no wildcard, no colon (not a KV key character) and no slash.  Names (queues, shares,
environments, policies) already follow `[A-Za-z0-9_-]`: they are checked here too, as is the
client's reading of a queue name into a read subject.  Ids a log older than the rule may hold
are encoded in keys (`fleet.job_key`), one to one, so they can never break the agent.  The
same through the real scheduler: tests/integration/test_hostile_names_live.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js.kv import _is_key_valid

from quotasched.events.base import JOB_ID_RULE, NAME_RULE, is_path_component
from quotasched.events.codec import DecodeError, decode_command
from quotasched.services.client.reads import queue_of
from quotasched.services.executors.fleet import claim_key, job_key

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")
SUBMIT = {"kind": "SubmitServiceJob", "jobName": "j", "jobQueue": "q", "quotaShareName": "s",
          "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}  # fmt: skip

REFUSED_IDS = [
    ("a lone dot", "."),
    ("two dots", ".."),
    ("a trailing dot", "bad."),
    ("a leading dot", ".bad"),
    ("an empty token inside", "a..b"),
    ("a dot between tokens", "a.b"),
    ("the one-token wildcard", "*"),
    ("the tail wildcard", ">"),
    ("a colon", "a:b"),
    ("a slash", "a/b"),
    ("a space", "a b"),
    ("a trailing newline", "a\n"),
    ("a letter beyond ASCII", "é"),
]


@pytest.mark.parametrize("scenario, job_id", REFUSED_IDS, ids=[case[0] for case in REFUSED_IDS])
def test_a_job_id_that_is_not_one_subject_token_and_one_path_component_is_refused(scenario, job_id):
    with pytest.raises(DecodeError) as refused:
        decode_command(json.dumps({**SUBMIT, "jobId": job_id}))
    assert refused.value.reason == f"Invalid SubmitServiceJob: jobId: {JOB_ID_RULE}"


@pytest.mark.parametrize("job_id", ["-_Az09_-", "-", "_", "x" * 128, "train-7"])
def test_a_job_id_of_the_rule_is_accepted_even_with_its_edge_characters(job_id):
    assert decode_command(json.dumps({**SUBMIT, "jobId": job_id})).job_id == job_id


@pytest.mark.parametrize("field, kind, extra", [
    ("jobQueueName", "CreateJobQueue",
     {"serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}], "schedulingPolicy": "sp"}),
    ("quotaShareName", "SubmitServiceJob", {k: v for k, v in SUBMIT.items() if k != "quotaShareName"}),
    ("serviceEnvironmentName", "CreateServiceEnvironment",
     {"capacityLimits": [{"capacityUnit": "u", "maxCapacity": 1}]}),
])  # fmt: skip
@pytest.mark.parametrize("name", [".", "..", "a.b", "*", ">", "a b", "a\n", "a\t", "~", ""])
def test_a_name_that_would_break_a_subject_token_is_refused(field, kind, extra, name):
    message = {**extra, "kind": kind, field: name}
    with pytest.raises(DecodeError) as refused:
        decode_command(json.dumps(message))
    assert f"{field}: {NAME_RULE}" in refused.value.reason or f"{field}: String should" in refused.value.reason


@pytest.mark.parametrize("value", ["q\n", "q.x", "q*", "q >", "arn:aws:batch:r:1:job-queue/q\n"])
def test_the_client_never_makes_a_read_subject_token_of_what_is_not_a_name(value):
    assert queue_of(value) is None
    assert queue_of("arn:aws:batch:r:1:job-queue/q") == "q"


# -- keys and paths for ids a log older than the rule may hold ---------------------------------


@settings(max_examples=500, deadline=None)
@given(first=st.text(min_size=1, max_size=40), second=st.text(min_size=1, max_size=40),
       attempt=st.integers(1, 100))  # fmt: skip
def test_every_job_id_makes_a_valid_claim_key_and_no_two_the_same(first, second, attempt):
    assert _is_key_valid(claim_key(first, attempt)), claim_key(first, attempt)
    if first != second:
        assert claim_key(first, attempt) != claim_key(second, attempt)


@pytest.mark.parametrize("job_id", ["-_Az09_-", "train-7", "a.b"])
def test_an_id_that_is_already_a_key_stands_as_it_is(job_id):
    assert job_key(job_id) == job_id  # the keys agents wrote before the rule are the same


@pytest.mark.parametrize("job_id, encoded", [("..", "=Li4"), ("bad.", "=YmFkLg"), ("a:b", "=YTpi")])
def test_an_id_that_is_no_key_is_written_in_base64url_after_an_equals_sign(job_id, encoded):
    assert job_key(job_id) == encoded and claim_key(job_id, 2) == f"claim.{encoded}.2"


@pytest.mark.parametrize("text, ok", [("a", True), ("bad.", True), ("a:b", True), (".", False),
                                      ("..", False), ("", False), ("a/b", False)])  # fmt: skip
def test_a_path_component_is_never_dot_dot_dot_or_a_path(text, ok):
    assert is_path_component(text) is ok


def test_quotasched_logs_refuses_an_id_that_would_leave_the_logs_directory(tmp_path):
    """`quotasched logs ..` would read the logs of the folder above (here a `7.log` beside the
    logs directory); it is refused, exit status 2."""
    logs = tmp_path / "state" / "logs"
    (logs / "job").mkdir(parents=True)
    (tmp_path / "state" / "7.log").write_text("not a job's log\n")
    done = subprocess.run([QUOTASCHED, "logs", "--logs-dir", str(logs), ".."], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "not a job's log" not in done.stdout
    assert "'..' is not a job id" in done.stderr
