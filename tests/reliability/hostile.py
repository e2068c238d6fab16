"""Hostile command messages: (subject, payload bytes).

`hostile_message`, a Hypothesis strategy: anything at all, refused or applied.  `refused_message`:
what a hostile team may publish on its own subjects that the spec refuses by construction (for
tests and the soak that require the hostile messages to have had no effect on anyone).

The strategy:

Wrong types, huge and negative numbers, unicode, huge and empty names, deep JSON, raw bytes,
duplicate job ids, unknown queues and shares, out-of-order and stale attempt reports, and
commands on the wrong subject.  Most messages look like real commands with one or two fields
made hostile, so they get past the JSON decoding and exercise validation, routing and the
decision core; job ids come from a small pool so that duplicates and reports about real jobs
are common.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import strategies as st

from quotasched.events.subjects import command_subject

G5 = "ml.g5.xlarge"
QUEUES = ("q", "nope", "ünï")
SHARES = ("qs1", "qs2", "qs3", "ghost")
JOB_IDS = tuple(f"dup-{n}" for n in range(6))
KINDS = ("SubmitServiceJob", "UpdateServiceJob", "TerminateServiceJob", "ReportJobStatus",
         "CreateQuotaShare", "UpdateQuotaShare", "DeleteQuotaShare", "UpdateServiceEnvironment",
         "CreateJobQueue", "UpdateJobQueue", "CreateSchedulingPolicy", "Tick")  # fmt: skip
STATUSES = ("STARTING", "RUNNING", "SUCCEEDED", "FAILED", "RUNNABLE", "SCHEDULED", "bogus", "")

huge_ints = st.sampled_from([2**63, -(2**63) - 1, 10**30, -1, 0, 10**6, 2**31])
names = st.one_of(
    st.sampled_from(("q", "qs1", "qs2", "ghost", "", "~", "a.b", "*", ">", "x" * 129)),
    st.text(max_size=40),  # any unicode, surrogates included
    st.text(alphabet="训练🚀üñ\u202e\x00\n", min_size=1, max_size=300),
)
scalars = st.one_of(st.none(), st.booleans(), huge_ints, st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True), names)  # fmt: skip
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)  # fmt: skip


def _limits(max_capacity: int) -> list[dict[str, Any]]:
    return [{"capacityUnit": G5, "maxCapacity": max_capacity}]


def _usage(quantity: Any = 1) -> list[dict[str, Any]]:
    return [{"capacityUnit": G5, "quantity": quantity}]


@st.composite
def plausible(draw) -> dict[str, Any]:
    """A command of some kind with mostly sensible fields."""
    kind = draw(st.sampled_from(KINDS))
    queue, share = draw(st.sampled_from(QUEUES)), draw(st.sampled_from(SHARES))
    job_id = draw(st.sampled_from(JOB_IDS))
    command: dict[str, Any] = {"kind": kind}
    if kind == "SubmitServiceJob":
        command.update(jobId=job_id, jobName=job_id, jobQueue=queue, quotaShareName=share,
                       schedulingPriority=draw(st.integers(0, 20)),
                       capacityUsage=_usage(draw(st.integers(1, 4))))  # fmt: skip
        if draw(st.booleans()):
            command["clientToken"] = draw(st.sampled_from(("t1", "t2")))
    elif kind == "UpdateServiceJob":
        command.update(jobId=job_id, schedulingPriority=draw(st.integers(-5, 10_005)))
    elif kind == "TerminateServiceJob":
        command.update(jobId=job_id, reason=draw(names))
    elif kind == "ReportJobStatus":  # out of order, stale, future attempts
        command.update(jobId=job_id, status=draw(st.sampled_from(STATUSES)),
                       attempt=draw(st.one_of(st.integers(-1, 4), huge_ints)))  # fmt: skip
    elif kind in ("CreateQuotaShare", "UpdateQuotaShare"):
        command.update(jobQueue=queue, quotaShareName=share,
                       capacityLimits=_limits(draw(st.integers(-1, 5))),
                       resourceSharingConfiguration={"strategy": draw(st.sampled_from(
                           ("RESERVE", "LEND", "LEND_AND_BORROW", "SHARE")))})  # fmt: skip
        if kind == "CreateQuotaShare":
            command["preemptionConfiguration"] = {"inSharePreemption": "ENABLED"}
    elif kind == "DeleteQuotaShare":
        command.update(jobQueue=queue, quotaShareName=share)
    elif kind == "UpdateServiceEnvironment":
        command.update(serviceEnvironment=draw(st.sampled_from(("se", "nope"))),
                       capacityLimits=_limits(draw(st.integers(0, 6))))
    elif kind in ("CreateJobQueue", "UpdateJobQueue"):
        command.update(jobQueueName=queue, jobQueue=queue, schedulingPolicy="sp",
                       serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}])
    elif kind == "CreateSchedulingPolicy":
        command.update(name=draw(names),
                       quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})
    if draw(st.booleans()):
        command["at"] = draw(st.one_of(st.floats(0, 1e6), huge_ints, st.just(-5)))
    return command


@st.composite
def mutated(draw) -> dict[str, Any]:
    """A plausible command with one to three fields set to hostile values (or added)."""
    command = draw(plausible())
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(sorted(command)), st.sampled_from(
            ("tags", "retryStrategy", "timeout", "serviceRequestPayload", "gpuCount", "kind"))))
        command[key] = draw(json_values)
    return command


def _token(token: str | None) -> str:
    """A name as a subject token when it can be one (UTF-8 allowed), else "bad"."""
    if token and not any(c.isspace() or c in ".*>" or not c.isprintable() for c in token):
        return token
    return "bad"


def _subject(command: Any, draw) -> str:
    """Mostly the subject the command belongs on, sometimes another one."""
    if isinstance(command, dict) and draw(st.integers(0, 4)) > 0:
        kind = command.get("kind") if isinstance(command.get("kind"), str) else "X"
        queue = command.get("jobQueue") if isinstance(command.get("jobQueue"), str) else None
        share = command.get("quotaShareName")
        share = share if isinstance(share, str) else None
        if kind in ("UpdateServiceJob", "TerminateServiceJob", "ReportJobStatus"):
            queue, share = "q", draw(st.sampled_from(SHARES))
        if kind in ("CreateServiceEnvironment", "UpdateServiceEnvironment",
                    "CreateSchedulingPolicy", "Tick"):  # fmt: skip
            queue = share = None
        kind, queue_token, share_token = (_token(token) for token in (kind, queue, share))
        if queue is None:
            return command_subject(kind)
        return command_subject(kind, queue_token, share_token if share else None)
    return command_subject(draw(st.sampled_from(KINDS)), draw(st.sampled_from(QUEUES[:2])),
                           draw(st.sampled_from(SHARES)))  # fmt: skip


@st.composite
def hostile_message(draw, big: bool = True) -> tuple[str, bytes]:
    choice = draw(st.integers(0, 99))
    if choice < 55:
        command = draw(st.one_of(plausible(), mutated()))
        return _subject(command, draw), json.dumps(command).encode()
    if choice < 70:
        value = draw(json_values)
        return _subject(value, draw), json.dumps(value).encode()
    if choice < 80:
        return _subject(None, draw), draw(st.binary(max_size=200))
    if choice < 90:  # deep nesting, in an array or in objects, inside a plausible command
        depth = draw(st.sampled_from((50, 1_000, 20_000, 100_000)))
        nested = ("[" * depth + "]" * depth) if draw(st.booleans()) else \
            ('{"a":' * depth + "1" + "}" * depth)  # fmt: skip
        command = draw(plausible())
        return (_subject(command, draw),
                json.dumps(command).encode()[:-1] + b', "tags": ' + nested.encode() + b"}")
    if not big:
        return _subject(None, draw), json.dumps(draw(mutated())).encode()
    size = draw(st.sampled_from((70_000, 300_000, 900_000)))  # under the 1 MiB message limit
    command = draw(plausible())
    command[draw(st.sampled_from(("jobName", "serviceRequestPayload", "reason", "tags")))] = \
        draw(st.sampled_from(("x", "é", "\x01"))) * size  # fmt: skip
    payload = json.dumps(command).encode()
    return _subject(command, draw), payload[: 1024 * 1024 - 1024]


SETUP = [
    {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 3}]},
    {"kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
    *({"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": share,
       "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
       "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
       "preemptionConfiguration": {"inSharePreemption": "ENABLED"}}
      for share in ("qs1", "qs2", "qs3")),
]  # fmt: skip


def setup_messages() -> list[tuple[str, bytes]]:
    out = []
    for command in SETUP:
        queue = command.get("jobQueue") or command.get("jobQueueName")
        share = command.get("quotaShareName")
        out.append((command_subject(command["kind"], queue, share), json.dumps(command).encode()))
    return out


# -- refused by construction ------------------------------------------------------------------

NEAR_LIMIT = 1024 * 1024 - 2048  # the server's max_payload is 1 MiB
OUT_OF_BOUNDS = [
    {"schedulingPriority": 10_000}, {"schedulingPriority": -1},
    {"capacityUsage": [{"capacityUnit": G5, "quantity": 0}]},
    {"capacityUsage": [{"capacityUnit": G5, "quantity": 1.5}]},
    {"capacityUsage": [{"capacityUnit": G5, "quantity": 2**63}]},
    {"capacityUsage": [{"capacityUnit": G5, "quantity": 1_000_001}]},
    {"jobName": "a.b"}, {"jobName": "x" * 129}, {"gpuCount": 8},
    {"tags": {"k" * 129: "v"}}, {"tags": {"k": "v" * 257}},
    {"tags": {f"k{i}": "v" for i in range(51)}}, {"clientToken": "t" * 65},
    {"timeoutConfig": {"attemptDurationSeconds": 0}}, {"retryStrategy": {"attempts": 11}},
    {"shareIdentifier": "s"}, {"capacityUsage": None},
    {"serviceRequestPayload": {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 2**63}},
     "capacityUsage": None},
]  # fmt: skip
"""One field out of the spec's bounds each (section 1.6, ruling 16)."""


def refused_message(rng: random.Random, team: tuple[str, str], other_share: str,
                    others_jobs: list[str], near_limit: float = 0.05) -> tuple[str, str, bytes]:
    """(class, subject, payload): a message the team (queue, share) may publish on its own
    subjects, which the spec refuses: undecodable bytes, a field out of bounds, a valid-looking
    message just under the 1 MiB limit (`near_limit` of them), a clock attack, or a command
    about another team's job (`others_jobs`) or share (`other_share`)."""
    queue, share = team

    def subject(kind: str) -> str:
        return command_subject(kind, queue, share)

    def submission(**fields: Any) -> dict[str, Any]:
        return {"kind": "SubmitServiceJob", "jobName": "h", "jobQueue": queue,
                "quotaShareName": share, "capacityUsage": _usage(), **fields}  # fmt: skip

    tag = rng.randrange(10**9)
    roll = rng.random()
    if roll < 0.15:
        payload = rng.choice([b"", b"\xff\xfe\x00 binary", b"[1, 2]", b'"Submit"', b"{",
                              b"[" * 5000 + b"]" * 5000, rng.randbytes(64)])
        return "undecodable", subject("SubmitServiceJob"), payload
    if roll < 0.40:
        return "out of bounds", subject("SubmitServiceJob"), json.dumps(
            submission(jobId=f"oob-{tag}", **rng.choice(OUT_OF_BOUNDS))).encode()
    if roll < 0.40 + near_limit:
        field = rng.choice(["tags", "jobName", "serviceRequestPayload"])
        filler = "k" * (NEAR_LIMIT - 400)
        extra = {"capacityUsage": None} if field == "serviceRequestPayload" else {}
        value = {filler: "v"} if field == "tags" else filler
        payload = json.dumps(submission(jobId=f"big-{tag}", **{field: value, **extra})).encode()
        return "near the limit", subject("SubmitServiceJob"), payload
    if roll < 0.55 + near_limit:
        payload = rng.choice([
            {"at": 1e15}, {"at": 1.7e308, "kind": "Tick"}, {"kind": "Tick", "at": 1e15},
            submission(jobId=f"late-{tag}", at=1.7e308), submission(jobId=f"neg-{tag}", at=-5),
        ])  # fmt: skip
        return "clock attack", subject("SubmitServiceJob"), json.dumps(payload).encode()
    job = rng.choice(others_jobs) if others_jobs else "nobody"
    kind, command = rng.choice([
        ("UpdateServiceJob", {"kind": "UpdateServiceJob", "jobId": job,
                              "schedulingPriority": 9999}),
        ("TerminateServiceJob", {"kind": "TerminateServiceJob", "jobId": job, "reason": "mine"}),
        ("SubmitServiceJob", submission(jobId=f"smuggled-{tag}", quotaShareName=other_share)),
        ("UpdateServiceJob", {"kind": "UpdateServiceJob", "jobId": f"ghost-{tag}",
                              "schedulingPriority": 1}),
    ])  # fmt: skip
    return "other teams' jobs", subject(kind), json.dumps(command).encode()
