"""Hostile input, published raw on the command subjects of a live scheduler (real nats-server).

Every message must be decided into exactly one `CommandRejected` fact naming the problem; when
the message could not be decoded into a command, the fact keeps it verbatim (`raw`), so nothing
is lost.  The scheduler never crashes: the same process keeps leading and decides a valid
command sent afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from quotasched.events.subjects import COMMANDS_STREAM, command_subject
from quotasched.services.client import Bus
from tests.integration.helpers import (
    NOTEBOOK,
    api_ready,
    assert_alive,
    describe_process,
    logged,
    read_facts,
    wait_decided,
)

pytestmark = pytest.mark.nats

G5 = "ml.g5.xlarge"
SUBMIT = command_subject("SubmitServiceJob", "q", "qs1")


def submit(**fields) -> dict:
    command = {"kind": "SubmitServiceJob", "jobName": "j", "jobQueue": "q", "quotaShareName": "qs1",
               "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip
    command.update(fields)
    return command


def raw(value) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


# (name, subject, payload, undecodable (raw kept), words the statusReason must contain)
CASES = [
    ("invalid JSON", SUBMIT, b'{"kind": "SubmitServiceJob", "jobName": ', True, ["JSON"]),
    ("empty message", SUBMIT, b"", True, ["JSON"]),
    ("JSON array", SUBMIT, b"[1, 2, 3]", True, ["object"]),
    ("JSON string", SUBMIT, b'"SubmitServiceJob"', True, ["object"]),
    ("not UTF-8", SUBMIT, b"\xff\xfe\x00\x9f binary", True, ["JSON"]),
    ("no kind", SUBMIT, raw({"jobName": "j", "jobQueue": "q"}), True, ["kind"]),
    ("kind is a number", SUBMIT, raw({"kind": 7}), True, ["kind"]),
    ("unknown kind", command_subject("LaunchMissiles"), raw({"kind": "LaunchMissiles"}), True,
     ["Unknown command kind", "LaunchMissiles"]),
    ("priority as a string", SUBMIT, raw(submit(schedulingPriority="3")), True,
     ["schedulingPriority"]),
    ("priority out of range", SUBMIT, raw(submit(schedulingPriority=10_000)), True,
     ["schedulingPriority"]),
    ("fractional quantity", SUBMIT,
     raw(submit(capacityUsage=[{"capacityUnit": G5, "quantity": 1.5}])), True, ["quantity"]),
    ("capacityUsage as an object", SUBMIT, raw(submit(capacityUsage={"capacityUnit": G5})), True,
     ["capacityUsage"]),
    ("null required field", SUBMIT, raw(submit(jobName=None)), True, ["jobName"]),
    ("unknown field", SUBMIT, raw(submit(gpuCount=8)), True, ["gpuCount", "not a field"]),
    ("huge job name", SUBMIT, raw(submit(jobName="n" * 100_000)), True,
     ["jobName", "1-128 characters"]),
    ("huge job id", SUBMIT, raw(submit(jobId="i" * 50_000)), True, ["jobId"]),
    ("unicode job name", SUBMIT, raw(submit(jobName="训练-🚀-ü")), True, ["jobName"]),
    ("lone surrogate", SUBMIT, b'{"kind": "SubmitServiceJob", "jobName": "\\ud800"}', True, []),
    ("500 KB payload", SUBMIT,
     raw(submit(serviceRequestPayload="p" * 500_000, capacityUsage=None)), True,
     ["serviceRequestPayload"]),
    ("deeply nested array", SUBMIT,
     b'{"kind": "SubmitServiceJob", "tags": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", True, []),
    ("deeply nested objects", SUBMIT,
     raw(submit(capacityUsage=None)).replace(
         b'"capacityUsage": null', b'"serviceRequestPayload": ' + b'{"a": ' * 5_000 + b"1"
         + b"}" * 5_000), True, []),  # fmt: skip
    ("NaN priority", SUBMIT, raw(submit()).replace(b'"kind"', b'"schedulingPriority": NaN, "kind"'),
     True, []),
    ("shareIdentifier", SUBMIT, raw(submit(shareIdentifier="qs1")), True, ["shareIdentifier"]),
    # decodable commands, refused on their route (the command stream keeps them verbatim)
    ("submission on another share's subject", command_subject("SubmitServiceJob", "q", "qs2"),
     raw(submit(jobId="smuggled")), False, ["qm.cmd.q.qs1.SubmitServiceJob"]),
    ("a kind on another kind's subject", SUBMIT,
     raw({"kind": "CreateSchedulingPolicy", "name": "evil",
          "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}), False,
     ["CreateSchedulingPolicy", "SubmitServiceJob"]),  # fmt: skip
    ("extra subject token", SUBMIT + ".extra", raw(submit(jobId="extra-token")), False,
     ["SubmitServiceJob"]),
    ("priority update of another share's job", command_subject("UpdateServiceJob", "q", "qs2"),
     raw({"kind": "UpdateServiceJob", "jobId": "victim", "schedulingPriority": 9999}), False,
     ["victim", "qs1"]),  # fmt: skip
    ("termination of another share's job", command_subject("TerminateServiceJob", "q", "qs2"),
     raw({"kind": "TerminateServiceJob", "jobId": "victim", "reason": "mine now"}), False,
     ["victim", "qs1"]),  # fmt: skip
    ("report on another share's job", command_subject("ReportJobStatus", "q", "qs2"),
     raw({"kind": "ReportJobStatus", "jobId": "victim", "status": "FAILED", "attempt": 1}), False,
     ["victim", "qs1"]),  # fmt: skip
]


def kept_bytes(fact: dict) -> bytes | None:
    """The message a CommandRejected fact kept, as bytes (base64 when it was not UTF-8)."""
    if fact.get("raw") is None:
        return None
    if fact.get("rawEncoding") == "base64":
        return base64.b64decode(fact["raw"])
    return fact["raw"].encode("utf-8")


async def setup(bus) -> int:
    """The notebook's environment, policy, queue q and shares qs1-qs3, and job `victim` in
    qs1, which fills the environment (3 instances) so it stays RUNNABLE or SCHEDULED alike."""
    lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
    for line in lines:
        await bus.publish(line)
    return await bus.publish(submit(jobId="victim", jobName="victim", schedulingPriority=1))


async def test_every_hostile_message_is_rejected_and_the_service_keeps_running(nats_server, spawn):
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        last_setup = await setup(bus)
        await wait_decided(bus.js, last_setup)
        victim_before = await bus.request("describe-service-job", jobId="victim")

        seqs = {}
        for name, subject, payload, _, _ in CASES:
            ack = await bus.js.publish(subject, payload, stream=COMMANDS_STREAM)
            seqs[name] = ack.seq
        valid = await bus.publish(submit(jobId="after-all", jobName="after-all",
                                         tags={"team": "研究 🚀", "note": "ünïcödé"}))  # fmt: skip
        await wait_decided(bus.js, valid, timeout=30, processes=[scheduler])
        facts = await read_facts(bus.js)
        assert_alive(scheduler)
        assert len(logged(scheduler, "leading")) == 1, describe_process(scheduler)

        by_seq: dict[int, list[dict]] = {}
        for fact in facts:
            by_seq.setdefault(fact["commandSeq"], []).append(fact)
        problems = []
        for name, subject, payload, undecodable, words in CASES:
            got = by_seq.get(seqs[name], [])
            if [fact["kind"] for fact in got] != ["CommandRejected"]:
                problems.append(f"{name}: facts {[fact['kind'] for fact in got]}")
                continue
            fact = got[0]
            reason = fact["statusReason"]
            missing = [word for word in words if word not in reason]
            if missing:
                problems.append(f"{name}: statusReason {reason[:200]!r} lacks {missing}")
            kept = kept_bytes(fact)
            if undecodable and fact.get("rawSize") is None and kept != payload:
                problems.append(f"{name}: raw payload not kept ({str(fact.get('raw'))[:80]!r})")
            if undecodable and fact.get("rawSize") is not None and (
                fact["rawSize"] != len(payload) or not payload.startswith(kept)
                or not 0 < len(kept) <= 256
                or fact.get("rawSha256") != hashlib.sha256(payload).hexdigest()
            ):  # a long message: its first 256 bytes, size and digest; the command log has it
                problems.append(f"{name}: cut raw payload wrong ({fact['rawSize']} bytes)")
            if len(reason) > 4096:
                problems.append(f"{name}: statusReason of {len(reason)} characters")
        assert not problems, "\n".join(problems)

        # the rejected misroutes changed nothing
        assert await bus.request("describe-service-job", jobId="victim") == victim_before
        for job_id in ("smuggled", "extra-token"):
            with pytest.raises(Exception, match="does not exist"):
                await bus.request("describe-service-job", jobId=job_id)
        # and the valid command after all of it was decided as usual
        submitted = by_seq[valid][0]
        assert submitted["kind"] == "JobSubmitted"
        assert submitted["tags"] == {"team": "研究 🚀", "note": "ünïcödé"}
        after_all = await bus.request("describe-service-job", jobId="after-all")
        assert after_all["jobName"] == "after-all"


async def test_undecodable_500_kb_whose_rejection_outgrows_the_message_limit(nats_server, spawn):
    """500 KB of control characters: well within the command stream's 1 MiB message limit, but
    kept verbatim in the rejection fact every byte becomes a six-character JSON escape.  The
    scheduler must still record a rejection (and keep running), not crash on the append."""
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        ack = await bus.js.publish(SUBMIT, b"\x01" * 500_000, stream=COMMANDS_STREAM)
        valid = await bus.publish({"kind": "CreateSchedulingPolicy", "name": "still-here",
                                   "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}})
        await wait_decided(bus.js, valid, timeout=15, processes=[scheduler])
        facts = await read_facts(bus.js)
        assert_alive(scheduler)
    rejected = [fact for fact in facts if fact["commandSeq"] == ack.seq]
    assert [fact["kind"] for fact in rejected] == ["CommandRejected"]
    decided = [fact["kind"] for fact in facts if fact["commandSeq"] == valid]
    assert decided == ["SchedulingPolicyCreated"]


async def test_a_valid_looking_submission_just_under_the_message_limit_cannot_stop_scheduling(
        nats_server, spawn):  # fmt: skip
    """Issue 17, break 1: one tag whose key is ~1 MB fits the 1 MiB message limit, and its
    `JobSubmitted` fact would not; the old scheduler accepted it, could never append the fact,
    and stepped down and retried forever, so no team's command was decided again.  Every field
    now has a bound (AWS's tag limits here): the message is refused naming the limit, and the
    next team's command is decided as usual."""
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        await wait_decided(bus.js, await setup(bus))
        wedge = raw(submit(jobId="wedge", tags={"k" * 1_000_000: "v"}))
        assert len(wedge) < 1024 * 1024  # the server takes it: the command stream has it
        ack = await bus.js.publish(SUBMIT, wedge, stream=COMMANDS_STREAM)
        huge = await bus.js.publish(SUBMIT, raw(submit(jobId="huge", capacityUsage=[
            {"capacityUnit": G5, "quantity": 2**63}])), stream=COMMANDS_STREAM)  # fmt: skip
        canary = await bus.publish(other_share_submit("canary", "qs2"))
        await wait_decided(bus.js, canary, timeout=30, processes=[scheduler])
        facts = await read_facts(bus.js)
        assert_alive(scheduler)
    by_seq: dict[int, dict] = {}
    for fact in facts:
        by_seq.setdefault(fact["commandSeq"], fact)  # each command's first fact
    assert by_seq[ack.seq]["kind"] == "CommandRejected"
    assert "tags" in by_seq[ack.seq]["statusReason"]
    assert "128" in by_seq[ack.seq]["statusReason"]
    assert by_seq[huge.seq]["kind"] == "CommandRejected"
    assert "1000000" in by_seq[huge.seq]["statusReason"]
    assert by_seq[canary]["kind"] == "JobSubmitted"
    assert max(len(json.dumps(fact)) for fact in facts) < 256 * 1024


def other_share_submit(job_id: str, share: str) -> dict:
    return submit(jobId=job_id, jobName=job_id, quotaShareName=share)


async def test_a_clients_at_never_moves_the_clock_nor_fails_another_teams_job(nats_server, spawn):
    """Issue 17, break 2 (spec ruling 15): `{"at": 1e15}` on a team's own subject was refused,
    but the refusal moved the clock to 1e15 and the next Tick failed another team's running job
    with ATTEMPT_TIMEOUT; `"at": 1.7e308` broke every read ("cannot convert float infinity to
    integer").  On the bus the stream's timestamp is a command's time: a refused message changes
    nothing, and even an accepted command's `at` is ignored."""
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await api_ready(bus)
        await wait_decided(bus.js, await setup(bus))
        runner = await bus.publish(submit(jobId="other-team", jobName="other-team",
                                          quotaShareName="qs3",
                                          timeoutConfig={"attemptDurationSeconds": 3600}))
        await wait_decided(bus.js, runner)
        attacks = [await bus.js.publish(SUBMIT, payload, stream=COMMANDS_STREAM) for payload in (
            raw({"at": 1e15}), raw({"at": 1.7e308}), raw(submit(jobId="late", at=5e9)),
            raw(submit(jobId="far", at=1.7e308)), raw({"kind": "Tick", "at": 1e15}),
        )]  # fmt: skip
        # Timers fire before the next command of any kind (ruling 13): had the attacks moved
        # the clock, the canary's decision would fire other-team's 3600 s timeout first.
        canary = await bus.publish(other_share_submit("canary", "qs2"))
        await wait_decided(bus.js, canary, timeout=30, processes=[scheduler])
        other = await bus.request("describe-service-job", jobId="other-team")
        listed = await bus.request("list-service-jobs", jobQueue="q", jobStatus="ALL")
        facts = await read_facts(bus.js)
        assert_alive(scheduler)
    assert other["status"] in ("SCHEDULED", "STARTING", "RUNNING"), other
    assert {job["jobId"] for job in listed["jobSummaryList"]} >= {"victim", "other-team"}
    now = max(fact["at"] for fact in facts)
    assert now < 1e10, f"the clock moved to {now}"
    assert not [fact for fact in facts if fact.get("cause") == "ATTEMPT_TIMEOUT"]
    by_seq = {}
    for fact in facts:
        by_seq.setdefault(fact["commandSeq"], []).append(fact)
    late = by_seq.get(attacks[2].seq, [])
    assert late and late[0]["kind"] == "JobSubmitted" and late[0]["at"] < 4e9  # `at` ignored
    for attack in (0, 1, 3, 4):
        assert [fact["kind"] for fact in by_seq[attacks[attack].seq]] == ["CommandRejected"]
