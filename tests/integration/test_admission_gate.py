"""The admission gate (services/gate) live: a real nats-server, `quotasched scheduler` and
`quotasched gate`.  A team's job commands enter the command stream through the gate only
within their share's limits; what the gate refuses is answered at once and never stored, so a
flooding share cannot make another share's commands wait behind its refusals (issue 29).

Expectations come from the rule and the wall clock, not from the gate's code: in any whole
second (the gate runs on this machine's clock, as the test does) at most
`maxSubmissionsPerSecond` of a share's submissions get past it, so over a burst that spans S
distinct seconds at most S times the limit are stored, and at least the limit."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from nats.aio.client import Client
from nats.js.errors import APIError

from quotasched.events.subjects import COMMANDS_STREAM, GATE_PING, command_subject, gate_subject
from quotasched.services.client import Bus, GateRefused
from tests.integration.helpers import (
    G5,
    NO_TICKS,
    eventually,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
    wait_gate_open,
)
from tests.integration.test_aws_endpoint_auth import first_line
from tests.integration.test_failover import wait_leading

pytestmark = pytest.mark.nats

QUEUE = "gq"
SHARES = [("qs1", 2, "RESERVE", "DISABLED"), ("qs2", 2, "RESERVE", "DISABLED")]
PER_SECOND = 5
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}})


def submit(job_id: str, share: str, **more) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
            **more}  # fmt: skip


def limits(share: str, **options: int) -> dict:
    return {"kind": "SetQuotaShareOptions", "jobQueue": QUEUE, "quotaShareName": share,
            "options": options}


def gate_of(share: str, kind: str = "SubmitServiceJob") -> str:
    return gate_subject(command_subject(kind, QUEUE, share))


async def stored_on(js, subject: str) -> list:
    """The command stream's messages on `subject`, in order."""
    info = await js.stream_info(COMMANDS_STREAM)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        message = await js.get_msg(COMMANDS_STREAM, seq)
        if message.subject == subject:
            found.append(message)
    return found


def seconds_spanned(start: float, end: float) -> int:
    return math.floor(end) - math.floor(start) + 1


@pytest.fixture
async def gated(nats_server, spawn):
    """A scheduler, a gate, queue gq with shares qs1 and qs2 (qs2: 5 submissions a second),
    the limits applied; yields a Bus (the admin's, no credentials: the server has none)."""
    scheduler = spawn("scheduler", **NO_TICKS)
    gate = spawn("gate")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=4))
        seq = await bus.publish(limits("qs2", maxSubmissionsPerSecond=PER_SECOND))
        await wait_decided(bus.js, seq, processes=[scheduler])
        await wait_gate_open(gate)
        bus.scheduler, bus.gate = scheduler, gate
        yield bus


async def test_a_team_command_passes_the_gate_unchanged_and_the_stream_acknowledges_it(gated):
    bus = gated
    data = json.dumps(submit("plain", "qs1")).encode()
    first = await bus.js.publish(gate_of("qs1"), data, stream=COMMANDS_STREAM,
                                 headers={"Nats-Msg-Id": "plain-1"})  # fmt: skip
    again = await bus.js.publish(gate_of("qs1"), data, stream=COMMANDS_STREAM,
                                 headers={"Nats-Msg-Id": "plain-1"})  # fmt: skip
    assert first.stream == COMMANDS_STREAM and not first.duplicate
    assert again.seq == first.seq and again.duplicate  # its headers reached JetStream
    stored = await bus.js.get_msg(COMMANDS_STREAM, first.seq)
    assert stored.subject == command_subject("SubmitServiceJob", QUEUE, "qs1")
    assert stored.data == data
    assert stored.headers["Nats-Msg-Id"] == "plain-1"
    assert stored.headers["Nats-Expected-Stream"] == COMMANDS_STREAM
    fact = await wait_decided(bus.js, first.seq, processes=[bus.scheduler])  # its last fact
    assert (fact["kind"], fact["jobId"]) == ("JobDispatched", "plain")


async def test_a_burst_beyond_the_limit_is_refused_at_the_gate_and_never_stored(gated):
    bus = gated
    began = time.time()
    outcomes = await asyncio.gather(
        *(bus.publish(submit(f"burst-{index}", "qs2")) for index in range(60)),
        bus.publish(submit("other-team", "qs1")), return_exceptions=True)  # fmt: skip
    ended = time.time()
    *burst, other = outcomes
    assert isinstance(other, int)  # the other share's submission went through
    refused = [outcome for outcome in burst if isinstance(outcome, Exception)]
    assert all(isinstance(error, GateRefused) and error.throttled for error in refused), refused
    reasons = {str(error) for error in refused}
    assert reasons == {f"Quota share qs2 already had {PER_SECOND} submissions in this second, "
                       f"its limit maxSubmissionsPerSecond of {PER_SECOND}"}  # fmt: skip
    passed = [outcome for outcome in burst if isinstance(outcome, int)]
    assert PER_SECOND <= len(passed) <= PER_SECOND * seconds_spanned(began, ended)
    stored = await stored_on(bus.js, command_subject("SubmitServiceJob", QUEUE, "qs2"))
    assert sorted(message.seq for message in stored) == sorted(passed)  # nothing refused stored
    for seq in passed + [other]:
        fact = await wait_decided(bus.js, seq, processes=[bus.scheduler])
        assert fact["kind"] in ("JobSubmitted", "JobDispatched", "CommandRejected")
    assert "command refused at the gate" in bus.gate.output()


async def test_messages_without_a_reply_subject_are_held_to_the_limit_too(gated, nats_server):
    bus = gated
    nc = Client()
    await nc.connect(nats_server.url)
    try:
        began = time.time()
        for index in range(200):
            await nc.publish(gate_of("qs2"), json.dumps(submit(f"bare-{index}", "qs2")).encode())
        await nc.flush()
        ended = time.time()
    finally:
        await nc.close()

    async def settled():
        first = await stored_on(bus.js, command_subject("SubmitServiceJob", QUEUE, "qs2"))
        await asyncio.sleep(0.5)
        second = await stored_on(bus.js, command_subject("SubmitServiceJob", QUEUE, "qs2"))
        return second if second and len(first) == len(second) else None

    stored = await eventually(settled, 20, what="the stored submissions settled")
    assert PER_SECOND <= len(stored) <= PER_SECOND * seconds_spanned(began, ended)


async def test_limits_set_while_the_gate_runs_apply_at_once_and_updates_are_bounded(gated):
    bus = gated
    seq = await bus.publish(limits("qs1", maxSubmissionsPerSecond=2))
    await wait_decided(bus.js, seq, processes=[bus.scheduler])

    async def limited():
        try:
            await asyncio.gather(*(bus.publish(submit(f"late-{time.time_ns()}-{i}", "qs1"))
                                   for i in range(10)))  # fmt: skip
        except GateRefused as error:
            return str(error)
        return None

    reason = await eventually(limited, 10, what="qs1's new limit applied by the gate")
    assert reason.endswith("its limit maxSubmissionsPerSecond of 2")
    # UpdateServiceJob: the same per-second limit, counted apart from submissions
    job = submit("updated", "qs1")
    await asyncio.sleep(1.0)
    await bus.publish(job)
    updates = await asyncio.gather(*(bus.publish(
        {"kind": "UpdateServiceJob", "jobId": "updated", "schedulingPriority": i},
        route=(QUEUE, "qs1")) for i in range(10)), return_exceptions=True)  # fmt: skip
    refused = [str(u) for u in updates if isinstance(u, GateRefused)]
    assert refused and all(text.startswith("Quota share qs1 already had 2 UpdateServiceJob "
                                           "commands in this second") for text in refused)
    assert sum(isinstance(u, int) for u in updates) <= 2 * 2  # 10 published within 2 seconds


async def test_submission_bytes_over_the_window_are_refused_at_the_gate(gated):
    bus = gated
    tags = {f"k{i:03d}" + "k" * 124: "v" * 256 for i in range(50)}  # AWS's most: 50 tags
    big = len(json.dumps(submit("big-0000000000000000000-0", "qs1", tags=tags)))
    assert big > 16 * 1024  # so its bytes count
    seq = await bus.publish(limits("qs1", maxSubmissionBytesPerWindow=2 * big + 100,
                                   submissionBytesWindowSeconds=3600))  # fmt: skip
    await wait_decided(bus.js, seq, processes=[bus.scheduler])

    async def refused_for_bytes():
        try:
            for index in range(3):
                await bus.publish(submit(f"big-{time.time_ns()}-{index}", "qs1", tags=tags))
        except GateRefused as error:
            return str(error)
        return None

    reason = await eventually(refused_for_bytes, 10, what="the byte window applied")
    assert "submission bytes in this 3600-second window, over its limit " \
           f"maxSubmissionBytesPerWindow of {2 * big + 100}" in reason


async def test_anything_but_a_shares_job_command_is_refused_by_the_gate(gated):
    bus = gated
    before = (await bus.js.stream_info(COMMANDS_STREAM)).state.last_seq
    for subject, payload in (
        (gate_of("qs1", "CreateQuotaShare"), b'{"kind":"CreateQuotaShare"}'),
        (gate_of("qs1", "ReportJobStatus"), b"{}"),
        (gate_subject(command_subject("SubmitServiceJob")), b"{}"),
        ("qm.in.gq.qs1.SubmitServiceJob.extra", b"{}"),
        ("qm.in.gq", b"{}"),
    ):  # fmt: skip
        with pytest.raises(APIError) as refused:
            await bus.js.publish(subject, payload, stream=COMMANDS_STREAM)
        assert refused.value.code == 400 and refused.value.err_code == 400, subject
    assert (await bus.js.stream_info(COMMANDS_STREAM)).state.last_seq == before
    assert (await bus.nc.request(GATE_PING, b"", timeout=5)).data == b"{}"


async def test_over_the_limit_through_the_aws_endpoint_is_too_many_requests(
        gated, spawn, nats_server):  # fmt: skip
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    bus = gated
    seq = await bus.publish(limits("qs1", maxSubmissionsPerSecond=1))
    await wait_decided(bus.js, seq, processes=[bus.scheduler])
    await asyncio.sleep(1.0)  # the gate has read the new limit
    endpoint = spawn("endpoint", "--nats-url", nats_server.url)
    url = await asyncio.to_thread(first_line, endpoint, "AWS_ENDPOINT_URL_BATCH=")
    batch = boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                         aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="dummy",
                         config=Config(retries={"max_attempts": 1}))  # no retry: see the 429

    def submit_until_refused() -> tuple[int, float, float, dict]:
        began, accepted = time.time(), 0
        for index in range(20):
            try:
                batch.submit_service_job(jobName=f"aws-{index}", jobQueue=QUEUE,
                                         quotaShareName="qs1", serviceJobType="SAGEMAKER_TRAINING",
                                         serviceRequestPayload=PAYLOAD)  # fmt: skip
                accepted += 1
            except ClientError as error:
                return accepted, began, time.time(), error.response
        raise AssertionError("20 submissions at 1 a second all accepted")

    accepted, began, ended, response = await asyncio.to_thread(submit_until_refused)
    assert 1 <= accepted <= seconds_spanned(began, ended)
    assert response["Error"]["Code"] == "TooManyRequestsException"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert response["Error"]["Message"] == ("Quota share qs1 already had 1 submissions in this "
                                            "second, its limit maxSubmissionsPerSecond of 1")
    facts = await read_facts(bus.js)
    assert sum(f["kind"] == "JobSubmitted" and f["jobName"].startswith("aws-") for f in facts) \
        <= accepted


async def test_a_command_the_gate_fails_on_is_refused_and_the_gate_goes_on(nats_server, spawn):
    """An error in the gate's handler (here its clock, once) must not reach nats-py's read
    loop, which would stop the connection reading: that command is refused, the next passes."""
    from quotasched.services.gate.service import AdmissionGate

    scheduler = spawn("scheduler", **NO_TICKS)
    calls = []

    def clock() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a clock that fails once")
        return time.time()

    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=4))
        gate = await AdmissionGate(bus.nc, clock=clock).start()
        try:
            with pytest.raises(GateRefused, match="the gate could not read this command"):
                await bus.publish(submit("first", "qs1"))
            seq = await bus.publish(submit("second", "qs1"))
            fact = await wait_decided(bus.js, seq, processes=[scheduler])
            assert fact["jobId"] == "second"
            assert gate.errors == 1 and gate.admitted == 1
        finally:
            await gate.stop()


async def test_the_gates_metrics_count_what_it_passed_and_refused_per_share(nats_server, spawn):
    """`quotasched gate --metrics-port 0`: healthy once open; its counters equal what this test
    saw happen (each publish's outcome), per share and per limit named."""
    from tests.integration.test_metrics import endpoint_of, health, key, scrape

    scheduler = spawn("scheduler", **NO_TICKS)
    gate = spawn("gate", "--metrics-port", "0")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(QUEUE, shares=SHARES, capacity=4))
        seq = await bus.publish(limits("qs2", maxSubmissionsPerSecond=2))
        await wait_decided(bus.js, seq, processes=[scheduler])
        await wait_gate_open(gate)
        base = await endpoint_of(gate)
        status, document = await health(base)
        assert status == 200 and document["gate"]["state"] == "open", document

        async def shares_read():
            metrics = await scrape(base)
            return metrics.get(key("quotasched_gate_shares_with_limits")) == 1

        await eventually(shares_read, 10, what="qs2's limits read by the gate")
        outcomes = await asyncio.gather(*(bus.publish(submit(f"m-{i}", "qs2")) for i in range(12)),
                                        *(bus.publish(submit(f"n-{i}", "qs1")) for i in range(3)),
                                        return_exceptions=True)  # fmt: skip
        with pytest.raises(APIError):
            await bus.js.publish(gate_of("qs1", "Tick"), b"{}")
        metrics = await scrape(base)
    flood, other = outcomes[:12], outcomes[12:]
    assert all(isinstance(outcome, int) for outcome in other)
    passed = sum(isinstance(outcome, int) for outcome in flood)
    assert metrics[key("quotasched_gate_commands_admitted_total", job_queue=QUEUE,
                       quota_share="qs2")] == passed  # fmt: skip
    assert metrics[key("quotasched_gate_commands_admitted_total", job_queue=QUEUE,
                       quota_share="qs1")] == 3  # fmt: skip
    assert metrics[key("quotasched_gate_commands_refused_total", job_queue=QUEUE, quota_share="qs2",
                       reason="maxSubmissionsPerSecond")] == 12 - passed  # fmt: skip
    assert metrics[key("quotasched_gate_commands_refused_total", job_queue=QUEUE, quota_share="qs1",
                       reason="not a job command of one share")] == 1  # fmt: skip
    assert metrics[key("quotasched_gate_failures_total")] == 0


async def test_frames_beyond_the_unsent_bound_are_shed_not_kept(nats_server):
    """Memory stays bounded when the gate writes slower than commands arrive: frames queued
    within one turn of the loop (before its writer runs) beyond 32 MiB are dropped and
    counted, and what was kept is then written."""
    from quotasched.services.gate.service import MAX_UNSENT_BYTES, AdmissionGate

    nc = Client()
    await nc.connect(nats_server.url)
    try:
        gate = AdmissionGate(nc)
        frame = b"PUB nowhere.at.all 1048576\r\n" + b"x" * (1 << 20) + b"\r\n"
        count = MAX_UNSENT_BYTES // len(frame) + 5
        for _ in range(count):
            gate._send(frame, 1 << 20)
        assert gate.shed == count - MAX_UNSENT_BYTES // len(frame)
        assert gate._unsent <= MAX_UNSENT_BYTES
        await eventually(lambda: asyncio.sleep(0, gate._flushing is None), 10, what="written")
        assert gate._unsent == 0
        gate._send(frame, 1 << 20)  # room again
        assert gate.shed == 5
    finally:
        await nc.close()


async def test_a_share_deleted_and_created_again_starts_from_the_default_limits(gated):
    """qs2 had 5 submissions a second.  Deleted and created again under the same name it has
    no options, so the core applies the defaults (10,000 a second): the gate must too, not the
    deleted share's 5."""
    bus = gated
    share = next(command for command, _ in setup_commands(QUEUE, shares=SHARES, capacity=4)
                 if command.get("quotaShareName") == "qs2")  # fmt: skip
    for command in ({"kind": "UpdateQuotaShare", "jobQueue": QUEUE, "quotaShareName": "qs2",
                     "state": "DISABLED"},
                    {"kind": "DeleteQuotaShare", "jobQueue": QUEUE, "quotaShareName": "qs2"},
                    {key: value for key, value in share.items() if key != "at"}):  # fmt: skip
        seq = await bus.publish(command)
        fact = await wait_decided(bus.js, seq, processes=[bus.scheduler])
        assert fact["kind"] != "CommandRejected", fact

    async def defaults_again():
        outcomes = await asyncio.gather(*(bus.publish(submit(f"again-{time.time_ns()}-{i}", "qs2"))
                                          for i in range(3 * PER_SECOND)),
                                        return_exceptions=True)  # fmt: skip
        return all(isinstance(outcome, int) for outcome in outcomes)

    await eventually(defaults_again, 10, what="qs2 back to the default limits at the gate")


async def test_apply_sends_a_line_the_gate_throttles_again_and_every_line_is_accepted(
        gated, nats_server, tmp_path):  # fmt: skip
    """`quotasched apply` of 12 submissions to qs2 (5 a second) at once: the gate refuses what
    is over the rate, apply sends it again, and all 12 are accepted, in the file's order."""
    import subprocess

    from tests.integration.conftest import QUOTASCHED

    bus = gated
    path = tmp_path / "burst.jsonl"
    path.write_text("".join(json.dumps(submit(f"file-{i:02d}", "qs2")) + "\n" for i in range(12)))
    done = await asyncio.to_thread(
        subprocess.run, [QUOTASCHED, "apply", str(path), "--wait", "--nats-url", nats_server.url],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 decided: 12 accepted, 0 refused" in done.stdout, done.stdout
    facts = await read_facts(bus.js)
    submitted = [f["jobId"] for f in facts if f["kind"] == "JobSubmitted"
                 and f["jobId"].startswith("file-")]  # fmt: skip
    assert submitted == [f"file-{i:02d}" for i in range(12)]
    assert "command refused at the gate" in bus.gate.output()  # it was throttled on the way


async def test_apply_without_time_left_exits_1_naming_the_limit(gated, nats_server, tmp_path):
    import subprocess

    from tests.integration.conftest import QUOTASCHED

    path = tmp_path / "burst.jsonl"
    path.write_text("".join(json.dumps(submit(f"late-{i:02d}", "qs2")) + "\n" for i in range(40)))
    done = await asyncio.to_thread(
        subprocess.run, [QUOTASCHED, "apply", str(path), "--wait-timeout", "0.1",
                         "--nats-url", nats_server.url],
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("quotasched: refused at the admission gate: Quota share qs2 already had 5 submissions "
            "in this second, its limit maxSubmissionsPerSecond of 5") in done.stderr, done.stderr
