"""Every stream, subject and bucket name, in one place.

Commands:  qm.cmd.<jobQueue>.<quotaShare>.<Kind>
Facts:     qm.fact.<jobQueue>.<quotaShare>.<Kind>
Gate:      qm.in.<jobQueue>.<quotaShare>.<Kind> (a team's job commands, through the admission
           gate, services/gate: within its share's limits, forwarded to qm.cmd unchanged)
API:       qm.api.<jobQueue>.<verb>, or qm.api.~.<verb> (request/reply, answered by the
           leading scheduler); a team asks on qm.api.<jobQueue>.<quotaShare>.<verb>, the only
           read subject its credentials allow, and is shown the payload and tags of its own
           share's jobs only (`api_subject`, `parse_api_subject`)

`~` stands for "not about one queue / one share": fleet-wide configuration (service
environments, scheduling policies, the creation of job queues, which claims a service
environment) and ticks; a share token `~` marks queue-level commands and facts.  Resource names can never contain `~` or `.`, so a subject
token is always either a real name or `~`, and NATS permissions can confine a team's
credentials to `qm.cmd.<its queue>.<its share>.SubmitServiceJob` and friends.
"""

from __future__ import annotations

from typing import Any

COMMANDS_STREAM = "QM_COMMANDS"
FACTS_STREAM = "QM_FACTS"
LEASES_BUCKET = "QM_LEASES"
SNAPSHOTS_BUCKET = "QM_SNAPSHOTS"
FLEET_BUCKET = "QM_FLEET"  # the GPU agents' heartbeats, placements and capacity (executors/fleet.py)

COMMANDS_PREFIX = "qm.cmd"
FACTS_PREFIX = "qm.fact"
API_PREFIX = "qm.api"
GATE_PREFIX = "qm.in"
GATE_PING = f"{GATE_PREFIX}.ping"  # every open gate answers it (how `up` knows one is)
ANY = "~"

JOB_ID_COMMANDS = frozenset({"UpdateServiceJob", "TerminateServiceJob", "ReportJobStatus"})
GLOBAL_COMMANDS = frozenset({
    "CreateServiceEnvironment", "UpdateServiceEnvironment", "CreateSchedulingPolicy",
    "CreateJobQueue", "Tick",
})  # fmt: skip


def command_subject(kind: str, job_queue: str | None = None, share: str | None = None) -> str:
    return f"{COMMANDS_PREFIX}.{job_queue or ANY}.{share or ANY}.{kind}"


def subject_for_command(command: Any, route: tuple[str, str] | None = None) -> str:
    """Where a client publishes `command`.  Commands that name only a jobId need the job's
    (queue, share) as `route`: the scheduler checks it, so a team cannot touch another
    team's job by publishing on its own subject."""
    kind = command.kind
    if kind in GLOBAL_COMMANDS:
        return command_subject(kind)
    if kind in JOB_ID_COMMANDS:
        queue, share = route if route is not None else (None, None)
        return command_subject(kind, queue, share)
    queue = getattr(command, "job_queue", None) or getattr(command, "job_queue_name", None)
    share = getattr(command, "quota_share_name", None) if kind == "SubmitServiceJob" else None
    if kind in ("CreateQuotaShare", "UpdateQuotaShare", "DeleteQuotaShare", "SetQuotaShareOptions"):
        share = command.quota_share_name
    return command_subject(kind, queue, share)


GATED_COMMANDS = ("SubmitServiceJob", "UpdateServiceJob", "TerminateServiceJob")
"""The commands a team sends: through the gate (`gate_subject`), which bounds each share's rate
before anything reaches the command stream (issue 29)."""


def gate_subject(subject: str) -> str:
    """Where a team's command for `subject` (`qm.cmd.<queue>.<share>.<Kind>`) enters the gate."""
    return GATE_PREFIX + subject[len(COMMANDS_PREFIX):]


def parse_command_subject(subject: str) -> tuple[str | None, str | None, str]:
    """(queue or None, share or None, kind) of a command subject."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:2]) != COMMANDS_PREFIX:
        return None, None, parts[-1] if parts else ""
    queue, share, kind = parts[2], parts[3], parts[4]
    return (None if queue == ANY else queue), (None if share == ANY else share), kind


def api_subject(verb: str, job_queue: str | None = None, share: str | None = None) -> str:
    """Where a read request goes: `qm.api.<queue or ~>.<verb>`, or with a team's share
    `qm.api.<queue>.<share>.<verb>` (the scheduler then knows, from the subject alone that the
    team's permissions pin, whose payloads and tags it may show)."""
    if share is not None:
        return f"{API_PREFIX}.{job_queue or ANY}.{share}.{verb}"
    return f"{API_PREFIX}.{job_queue or ANY}.{verb}"


def parse_api_subject(subject: str) -> tuple[str | None, str | None, str]:
    """(queue or None, share or None, verb) of a read request's subject: `qm.api.<verb>`,
    `qm.api.<queue or ~>.<verb>` or `qm.api.<queue>.<share>.<verb>`.  Longer subjects count
    as a share's (fail closed: never read as the unscoped form)."""
    tokens = subject.split(".")
    verb = tokens[-1]
    queue = tokens[2] if len(tokens) >= 4 else ANY
    share = tokens[3] if len(tokens) >= 5 else ANY
    return (None if queue == ANY else queue), (None if share == ANY else share), verb


def fact_subject(kind: str, job_queue: str | None = None, share: str | None = None) -> str:
    return f"{FACTS_PREFIX}.{job_queue or ANY}.{share or ANY}.{kind}"


def facts_filter(job_queue: str | None = None, share: str | None = None) -> str:
    if job_queue is None:
        return f"{FACTS_PREFIX}.>"
    return f"{FACTS_PREFIX}.{job_queue}.{share or '*'}.*"
