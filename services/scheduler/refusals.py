"""Commands the fact log refuses to record: the writer's last line of defence.

The decision core refuses what it can see is wrong, in replayable terms.  What it cannot see
is the bus itself: a server started with a smaller `max_payload` than the core assumes, or a
server that refuses a message for a reason of its own (its size, its headers).  Such a command
would otherwise be decided, fail to land, and be decided again forever, holding up every
command behind it.  Instead the writer records it as refused: one `CommandRejected` whose
reason begins with `LOG_REFUSAL`, made by the core's own `reject` (so it changes nothing,
the clock included), and moves on.

The audit re-runs the core over the command stream; for a command the log records as refused
this way it runs the same refusal (services/audit/sides.py), and counts it, so the log and
the re-run still agree and the report says how many commands were refused by the log.
"""

from __future__ import annotations

from quotasched.events.codec import DecodeError, decode_command, decode_fact
from quotasched.events.facts import Fact
from quotasched.events.subjects import parse_command_subject
from quotasched.services.scheduler.core import State, reject

# The distinct start of the reason of a command the fact log refused (never a core reason).
LOG_REFUSAL = "Not recorded: the fact log refused this command's facts"
_REJECTED = b'{"kind":"CommandRejected"'


def refuse_message(state: State, subject: str, data: bytes, seq: int, cause: str) -> list[Fact]:
    """The facts of a command the log refused: one CommandRejected naming `cause`."""
    kind, job_id = parse_command_subject(subject)[2], None
    try:
        command = decode_command(data)
        kind, job_id = command.kind, getattr(command, "job_id", None)
    except DecodeError:  # the core refuses undecodable commands itself; kept for safety
        pass
    return reject(state, kind, f"{LOG_REFUSAL} ({cause}); it was not decided", seq, job_id=job_id)


def is_log_refusal(text: str | bytes) -> bool:
    """Is this encoded fact a CommandRejected the writer recorded because the log refused?"""
    raw = text.encode() if isinstance(text, str) else text
    return raw.startswith(_REJECTED) and LOG_REFUSAL.encode() in raw


def refusal_cause_of(text: str) -> str:
    """The cause recorded in a log refusal's reason (what `refuse_message` was given)."""
    reason = decode_fact(text).status_reason
    start = reason.find("(", len(LOG_REFUSAL))
    end = reason.rfind("); it was not decided")
    return reason[start + 1:end] if start >= 0 and end > start else reason
