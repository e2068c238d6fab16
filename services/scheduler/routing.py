"""From a bus message to facts: decode, stamp the time, check the route, then the core.

Pure like the core (the audit re-runs it over the recorded command stream): the subject a
command arrived on is part of its input.  A job command must arrive on its job's own
`qm.cmd.<queue>.<share>.<Kind>` subject, so a credential confined to one share cannot update,
terminate or report on another share's job.
"""

from __future__ import annotations

from events.codec import DecodeError, decode_command
from events.facts import Fact
from events.subjects import JOB_ID_COMMANDS, parse_command_subject, subject_for_command
from services.scheduler.core import State, reject, reject_undecodable, step


def decide_message(state: State, subject: str, data: bytes, seq: int, stamp: float) -> list[Fact]:
    """Facts for one command message; `stamp` (the stream's timestamp) is used when the
    command carries no `at`.  Folds the facts into `state`, like `step`."""
    try:
        command = decode_command(data)
    except DecodeError as error:
        return reject_undecodable(state, error, seq, stamp)
    queue, share, kind = parse_command_subject(subject)
    problem = _misrouted(state, command, subject, queue, share, kind)
    if problem is not None:
        job_id = getattr(command, "job_id", None)
        at = command.at if command.at is not None else stamp
        return reject(state, command.kind, problem, seq, at, job_id=job_id)
    return step(state, command, seq, stamp)


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
    if subject != expected:
        return f"A {command.kind} command must be published on {expected}, not {subject}"
    return None
