"""From a bus message to facts: decode, stamp the time, check the route, then the core.

Pure like the core (the audit re-runs it over the recorded command stream): the subject a
command arrived on is part of its input.  A job command must arrive on its job's own
`qm.cmd.<queue>.<share>.<Kind>` subject, so a credential confined to one share cannot update,
terminate or report on another share's job.
"""

from __future__ import annotations

from quotasched.events.codec import DecodeError, decode_command
from quotasched.events.facts import Fact
from quotasched.events.subjects import (
    JOB_ID_COMMANDS,
    fact_subject,
    parse_command_subject,
    subject_for_command,
)
from quotasched.services.scheduler.core import State, reject, reject_undecodable, step


def decide_message(state: State, subject: str, data: bytes, seq: int, stamp: float,
                   parsed: tuple[str | None, str | None, str] | None = None) -> list[Fact]:  # fmt: skip
    """Facts for one command message; `stamp`, the stream's timestamp, is its time: on the bus
    the scheduler owns the clock and a client's `at` is ignored (ruling 15).  Folds the facts
    into `state`, like `step`.  `parsed`: `parse_command_subject(subject)`, when the caller
    has it already."""
    try:
        command = decode_command(data)
    except DecodeError as error:
        return reject_undecodable(state, error, seq)
    queue, share, kind = parsed if parsed is not None else parse_command_subject(subject)
    problem = _misrouted(state, command, subject, queue, share, kind)
    if problem is not None:
        return reject(state, command.kind, problem, seq, job_id=getattr(command, "job_id", None))
    return step(state, command, seq, clock=stamp, size=len(data))


def _misrouted(state: State, command, subject: str, queue, share, kind: str) -> str | None:
    if kind != command.kind:
        return f"A {command.kind} command was published on {subject}, the subject of {kind}"
    if command.kind in JOB_ID_COMMANDS:
        job = state.jobs.get(command.job_id)
        if job is None:
            return None  # the core answers "does not exist"
        if (job.queue, job.share) != (queue, share):
            return (
                f"Job {job.job_id} belongs to quota share {job.share} of job queue {job.queue}; "
                f"it can't be addressed through {subject}"
            )
        return None
    expected = subject_for_command(command)
    if command.kind == "Tick" and share is None:
        return None  # a partition's own ticks travel on qm.cmd.<its queue>.~.Tick
    if subject != expected:
        return f"A {command.kind} command must be published on {expected}, not {subject}"
    return None


def fact_subject_of(state: State, fact: Fact, route: tuple[str | None, str | None]) -> str:
    """The subject a fact is recorded under, which also says which partition writes it.

    `route` is the (queue, share) of the command's subject, from `parse_command_subject`.
    A refusal goes under the command's own subject tokens: it belongs to whoever published
    the command, whatever job or share it names.  Any other fact about a job goes under the
    job's queue and share; the rest under the command's queue, or under `~` when the command
    was fleet-wide (the configuration facts of service environments, scheduling policies
    and job queue creation).
    """
    queue, share = route
    if fact.kind == "CommandRejected":
        return fact_subject(fact.kind, queue, share)
    job_id = getattr(fact, "job_id", None)
    job = state.jobs.get(job_id) if job_id is not None else None
    if job is not None:
        return fact_subject(fact.kind, job.queue, job.share)
    if fact.kind == "JobExpired":  # the job has just left the state: the fact names its place
        return fact_subject(fact.kind, fact.job_queue, fact.quota_share_name)
    if queue is None:
        return fact_subject(fact.kind)
    return fact_subject(fact.kind, queue, getattr(fact, "quota_share_name", None) or share)


def decide_partition(scope, commands) -> list[Fact]:
    """What the core gives one scheduling partition (`partition.Partition`) over recorded
    commands `(seq, subject, data, stamp)` in stream order: it decides the commands it hears,
    from a fresh state, and keeps its own part of their facts.  The log a partition writes must
    be exactly this (the partition tests and benchmark check it)."""
    state, out = State(), []
    for seq, subject, data, stamp in commands:
        if not scope.hears(subject):
            continue
        route = parse_command_subject(subject)[:2]
        out.extend(fact for fact in decide_message(state, subject, data, seq, stamp)
                   if scope.owns(fact_subject_of(state, fact, route)))  # fmt: skip
    return out
