"""The entry points of the decision core: `step`, `decide` and `step_raw`.

    step(state, command, seq)   -> facts   decides and folds the facts into `state`
    decide(state, command, seq) -> facts   the same, then undoes every change: pure
    step_raw(state, data, seq)  -> facts   from undecoded bytes: a bad message becomes a
                                           CommandRejected that keeps the raw text

Each command is handled in the same order: the logical time is fixed (the larger of its `at`
and the time so far, ruling 9); timers that came due fire; the command is validated against
the state (a refusal is a `CommandRejected` fact naming the problem, AWS ClientException style)
and applied by its handler (configure.py for resources, jobs.py for jobs); and a scheduling
pass runs (ruling 4).

No I/O, no clock, no randomness, no logging: the same commands give the same facts.
"""

from __future__ import annotations

from typing import Any

from events import commands as C
from events import facts as F
from events.codec import DecodeError, decode_command
from services.scheduler.core import configure, jobs  # noqa: F401 (they register the handlers)
from services.scheduler.core.evolve import evolve
from services.scheduler.core.passes import schedule
from services.scheduler.core.round import HANDLERS, Rejected, Round
from services.scheduler.core.state import State
from services.scheduler.core.timers import fire_due


def step(state: State, command: C.Command, seq: int, stamp: float | None = None) -> list[F.Fact]:
    """Decide `command` (the `seq`-th input) and fold its facts into `state`.

    `stamp` is the time to use when the command carries no `at` (the service passes the
    stream's timestamp); without either, the command happens at the current time.
    """
    at = command.at if command.at is not None else stamp
    at = state.time if at is None else max(at, state.time)
    round_ = Round(state, seq, at)
    # Every attempt deadline in the heap, stale entries included, is at least its top's, and
    # no blocked head's time limit runs out before `blocked_due`: while both are ahead, no
    # timer can be due.
    if (state.blocked and state.blocked_due <= at) or (state.timeouts and state.timeouts[0][0] <= at):
        fire_due(round_, at)
        round_.at = at
    try:
        HANDLERS[type(command)](round_, command)
    except Rejected as rejected:
        round_.emit(F.CommandRejected(
            at=at, command_seq=seq, command_kind=command.kind, status_reason=rejected.reason,
            **{key: value for key, value in rejected.names.items() if value is not None},
        ))  # fmt: skip
    schedule(round_)
    if at > state.time:
        # Ruling 9 counts time from the previous *command*, silent ones (an idle Tick)
        # included.  Such a command leaves no fact, so until the next fact records a time
        # the fold of the log may lag the live clock; every later fact carries the clamped
        # time, and the command stream (kept for audits) has the silent command itself.
        state.set_time(at)
    return round_.facts


def catch_up_clock(state: State, data: bytes | str, stamp: float | None = None) -> None:
    """Set the clock as deciding this (already recorded) command set it, without deciding it.

    Recovery folds the fact log and then decides again every command after the last one the
    log records.  The last recorded command itself may have moved the clock past its own facts
    (a Tick whose only fact is a timer stamped at its earlier deadline); this restores that.
    """
    try:
        command = decode_command(data)
    except DecodeError:
        return
    at = command.at if command.at is not None else stamp
    if at is not None and at > state.time:
        state.set_time(at)


def decide(state: State, command: C.Command, seq: int) -> list[F.Fact]:
    """The facts `command` would produce, leaving `state` exactly as it was."""
    with state.trial():
        return step(state, command, seq)


def step_raw(state: State, data: bytes | str, seq: int) -> list[F.Fact]:
    """Like `step`, from a message that may not even be JSON: nothing is ever lost."""
    try:
        command = decode_command(data)
    except DecodeError as error:
        return reject_undecodable(state, error, seq, state.time)
    return step(state, command, seq)


RAW_KEPT_CHARS = 64 * 1024


def reject_undecodable(state: State, error: DecodeError, seq: int, stamp: float) -> list[F.Fact]:
    """A message that is not a valid command: recorded with everything it claimed to be.

    Its text is kept up to 64 KiB (escaped into JSON, a hostile 1 MB message could grow six
    times); the command log keeps the message itself, whole.
    """
    raw, size = error.raw, None
    if len(raw) > RAW_KEPT_CHARS:
        raw, size = raw[:RAW_KEPT_CHARS], len(error.raw.encode())
    return reject(
        state, error.kind or "Unknown", error.reason, seq,
        error.at if error.at is not None else stamp, raw=raw, raw_size=size,
        raw_encoding=error.raw_encoding, job_id=error.job_id, job_queue=error.job_queue,
        quota_share_name=error.quota_share_name,
    )  # fmt: skip


def reject(state: State, kind: str, reason: str, seq: int, at: float, **names: Any) -> list[F.Fact]:
    """Refuse a command before the core could read it (undecodable, or misrouted on the bus)."""
    fact = F.CommandRejected(
        at=max(at, state.time), command_seq=seq, command_kind=kind, status_reason=reason,
        **{key: value for key, value in names.items() if value is not None},
    )  # fmt: skip
    evolve(state, fact)
    return [fact]
