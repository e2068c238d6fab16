"""A hostile tenant beside honest ones, on a nats-server secured with the roles of
`quotasched auth generate` (issue 17's "tests that can fail").

Honest commands (a seeded workload on queue q: submissions, priority updates, executor reports,
terminations over shares qs1-qs3, published with the admin's credentials) are interleaved with
a hostile team's messages, sent with the credentials of share qs1's pipeline on the subjects
that team may publish to (its gate subjects: within its limits the gate passes them on):
undecodable bytes, commands with a field out of the spec's bounds, valid-looking messages just under the 1 MiB message limit, clock attacks (an `at` of 1e15 or
1.7e308, a Tick on the team's subject), and commands about other teams' jobs.  Every so often
the team also tries the JetStream API verbs its role must not use (deleting or purging the
streams, deleting the scheduler's and the executor's consumers, forging a fact, a Tick, a
status report, a share).

The expectation does not come from the scheduler's code run over the same messages: the facts
of the honest commands must equal `quotasched replay` of the honest commands *alone* (each at
the time the stream stamped it, ruling 15), so the hostile messages had no effect on anyone;
each hostile message that reached the command stream got exactly one `CommandRejected`; every
forbidden verb was refused by the server; the clock never passed the last stream timestamp;
the scheduler kept leading, still answers reads and decides a canary; its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from collections import Counter

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from quotasched.events.codec import decode_command
from quotasched.events.subjects import (
    COMMANDS_STREAM,
    FACTS_STREAM,
    command_subject,
    gate_subject,
    subject_for_command,
)
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import (
    NO_TICKS,
    assert_decided_once,
    generate_workload,
    logged,
    read_facts,
    stream_times,
    wait_decided,
    wait_gate_open,
)
from tests.integration.test_failover import wait_leading
from tests.reliability.hostile import refused_message
from tests.reliability.test_permissions import Client, generated, secured, without_url  # noqa: F401

pytestmark = [pytest.mark.nats, pytest.mark.slow]

HONEST = 600
HOSTILE_EVERY = 2  # on average one hostile message per this many honest commands
SHARES = [("qs1", 1, "LEND_AND_BORROW", "ENABLED"), ("qs2", 2, "LEND_AND_BORROW", "DISABLED"),
          ("qs3", 1, "LEND", "ENABLED")]  # fmt: skip
G5 = "ml.g5.xlarge"
TEAM = ("q", "qs1")


def team_subject(kind: str) -> str:
    return command_subject(kind, *TEAM)


async def forbidden_verbs(team: Client) -> list[str]:
    """Every JetStream verb a team must not use, tried; returns those the server allowed."""
    js, nc = team.js, team.nc
    fact = json.dumps({"kind": "JobDispatched", "at": 1.0, "commandSeq": 1, "jobId": "x"})
    attempts = {
        "delete the command stream": js.delete_stream(COMMANDS_STREAM),
        "delete the fact log": js.delete_stream(FACTS_STREAM),
        "purge the fact log": js.purge_stream(FACTS_STREAM),
        "delete the scheduler's consumer": js.delete_consumer(COMMANDS_STREAM, "scheduler-main"),
        "delete the executor's consumer": js.delete_consumer(FACTS_STREAM, "executor-simulated"),
        "forge a fact": js.publish("qm.fact.q.qs1.JobDispatched", fact.encode(), timeout=1),
        "forge a status report": js.publish(team_subject("ReportJobStatus"), json.dumps(
            {"kind": "ReportJobStatus", "jobId": "x", "status": "FAILED"}).encode(), timeout=1),
        "publish a Tick": js.publish(command_subject("Tick", "q"), b'{"kind": "Tick"}', timeout=1),
        "configure a share": js.publish(team_subject("UpdateQuotaShare"), json.dumps(
            {"kind": "UpdateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
             "state": "DISABLED"}).encode(), timeout=1),
        "read every queue": nc.request("qm.api.~.list-service-jobs", b"{}", timeout=1),
        "raw stream delete": nc.request(f"$JS.API.STREAM.DELETE.{FACTS_STREAM}", b"", timeout=1),
    }  # fmt: skip
    allowed = []
    for name, attempt in attempts.items():
        try:
            answer = await asyncio.wait_for(attempt, 2)
        except Exception:
            continue  # refused: a permissions violation, an error answer or no answer at all
        if isinstance(answer, nats.aio.msg.Msg) and b'"error"' in answer.data:
            continue
        allowed.append(name)
    return allowed


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def replay_alone(tmp_path, honest: list[dict], times: list[float]) -> list[dict]:
    """`quotasched replay` of the honest commands alone, each at its stream timestamp."""
    path = tmp_path / "honest.jsonl"
    path.write_text("".join(json.dumps({**command, "at": at}) + "\n"
                            for command, at in zip(honest, times)))  # fmt: skip
    done = subprocess.run([QUOTASCHED, "replay", str(path)], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_a_hostile_tenant_has_no_effect_on_anyone_and_the_scheduler_keeps_deciding(
        secured, spawn, tmp_path):  # fmt: skip
    server, creds = secured
    anonymous = {"QUOTASCHED_NATS_URL": server.url}
    scheduler = spawn("scheduler", **anonymous, **NO_TICKS, **without_url(creds["scheduler"]))
    await wait_leading(scheduler)
    await wait_gate_open(spawn("gate", **anonymous, **without_url(creds["gate"])))
    rng = random.Random(20261201)
    items = generate_workload(seed=20261201, count=HONEST, queue="q", shares=SHARES)
    honest_seqs: list[int] = []
    hostile: dict[int, str] = {}  # stream seq -> class
    refused_verbs: list[str] = []
    allowed_verbs: list[str] = []
    rss: list[int] = []
    async with Client(creds["admin"]) as admin, Client(creds["pipeline-q-qs1"]) as team:
        # the executor's durable consumer, as `quotasched executor` creates it: a target
        await admin.js.add_consumer(FACTS_STREAM, ConsumerConfig(
            durable_name="executor-simulated", ack_policy=AckPolicy.EXPLICIT))  # fmt: skip
        for index, (command, route) in enumerate(items):
            subject = subject_for_command(decode_command(json.dumps(command)), route)
            ack = await admin.js.publish(subject, json.dumps(command).encode(),
                                         stream=COMMANDS_STREAM)  # fmt: skip
            honest_seqs.append(ack.seq)
            if index < 10:
                continue  # the configuration first
            if rng.random() < 1 / HOSTILE_EVERY:
                jobs = [c["jobId"] for c, _ in items[:index] if c["kind"] == "SubmitServiceJob"
                        and c["quotaShareName"] != TEAM[1]]  # other teams' jobs only
                kind, hostile_subject, payload = refused_message(rng, TEAM, "qs2", jobs)
                ack = await team.js.publish(gate_subject(hostile_subject), payload,
                                            stream=COMMANDS_STREAM)  # the team's only way in
                hostile[ack.seq] = kind
            if index % (HONEST // 3) == 0:
                allowed_verbs += await forbidden_verbs(team)
                refused_verbs.append(f"round at {index}")
                await wait_decided(admin.js, honest_seqs[-1], timeout=60, processes=[scheduler])
                rss.append(rss_kib(scheduler.popen.pid))
        canary = await admin.js.publish(command_subject("SubmitServiceJob", "q", "qs3"), json.dumps(
            {"kind": "SubmitServiceJob", "jobId": "canary", "jobName": "canary", "jobQueue": "q",
             "quotaShareName": "qs3", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}
        ).encode(), stream=COMMANDS_STREAM)  # fmt: skip
        await wait_decided(admin.js, canary.seq, timeout=120, processes=[scheduler])
        rss.append(rss_kib(scheduler.popen.pid))
        answer = await admin.nc.request("qm.api.q.describe-service-job",
                                        json.dumps({"jobId": "canary"}).encode(), timeout=10)
        for stream, consumer in ((FACTS_STREAM, "executor-simulated"),
                                 (COMMANDS_STREAM, "scheduler-main")):  # both still there
            await admin.js.consumer_info(stream, consumer)
        facts = await read_facts(admin.js)
        times = await stream_times(admin.js, honest_seqs)
        last_stamp = (await stream_times(admin.js, [canary.seq]))[0]

    assert allowed_verbs == [], f"the team was allowed: {allowed_verbs}"
    assert len(logged(scheduler, "leading")) == 1, "the scheduler stopped leading"
    assert json.loads(answer.data).get("jobId") == "canary", answer.data[:300]
    assert_decided_once(facts)

    # the honest commands' facts are exactly what they give alone
    expected = replay_alone(tmp_path, [command for command, _ in items], times)
    for fact in expected:
        fact["commandSeq"] = honest_seqs[fact["commandSeq"] - 1]
    honest = set(honest_seqs)
    got = [{k: v for k, v in fact.items() if not k.startswith("_")}
           for fact in facts if fact["commandSeq"] in honest]  # fmt: skip
    assert len(got) == len(expected) and got == expected, _first_difference(got, expected)

    # each hostile message: exactly one refusal, with a reason; counted per class
    by_seq: dict[int, list[dict]] = {}
    for fact in facts:
        by_seq.setdefault(fact["commandSeq"], []).append(fact)
    wrong = {seq: [f["kind"] for f in by_seq.get(seq, [])] for seq in hostile
             if [f["kind"] for f in by_seq.get(seq, [])] != ["CommandRejected"]}  # fmt: skip
    assert not wrong, f"hostile messages not refused alone: {dict(list(wrong.items())[:5])}"
    assert all(0 < len(by_seq[seq][0]["statusReason"]) <= 2048 for seq in hostile)
    assert set(by_seq) <= honest | set(hostile) | {canary.seq}
    classes = Counter(hostile.values())
    print(f"honest {len(honest_seqs)}, hostile {len(hostile)} {dict(classes)}, forbidden verb "
          f"rounds {len(refused_verbs)} x 11 refused, RSS {rss} KiB")  # fmt: skip
    assert len(classes) == 5 and min(classes.values()) >= 5, classes

    # the clock: never past the last stream timestamp (nothing a client wrote moved it)
    assert max(fact["at"] for fact in facts) <= last_stamp
    growth_mib = (max(rss[1:]) - rss[0]) / 1024
    assert growth_mib < 64, f"RSS grew {growth_mib:.0f} MiB after the first round: {rss} KiB"


def _first_difference(got: list[dict], expected: list[dict]) -> str:
    index = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                 min(len(got), len(expected)))  # fmt: skip
    return (f"{len(got)} facts vs {len(expected)} replayed; first difference at {index}: "
            f"got {got[index] if index < len(got) else None} "
            f"expected {expected[index] if index < len(expected) else None}")
