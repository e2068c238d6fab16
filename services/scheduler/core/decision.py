"""The entry points of the decision core: `step`, `decide` and `step_raw`.

    step(state, command, seq)   -> facts   decides and folds the facts into `state`
    decide(state, command, seq) -> facts   the same, then undoes every change: pure
    step_raw(state, data, seq)  -> facts   from undecoded bytes: a bad message becomes a
                                           CommandRejected that keeps the raw text

Each command is handled in the same order: the logical time is fixed (the larger of its `at`
and the time so far, ruling 9; on the bus the stream's timestamp, which a client's `at` never
overrides, ruling 15); timers that came due fire; the command is validated against the state
and applied by its handler (configure.py for resources, jobs.py for jobs); and a scheduling
pass runs (ruling 4).

A refused command changes nothing, time included (ruling 15): its `CommandRejected` fact
(naming the problem, AWS ClientException style) is recorded at the clock as it stands, and any
timer its time would have fired waits for the next accepted command, which fires it stamped at
its deadline exactly as if the refused command had never arrived.  So a hostile message can
neither move the clock nor change which command a timer's facts belong to.

Every fact fits the bus (ruling 16): fields are bounded (events/), and a message large enough
that one of its facts could pass `FACT_BYTES_LIMIT` is decided under a savepoint and refused,
naming the limit, if one does.

No I/O, no clock, no randomness, no logging: the same commands give the same facts.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from quotasched.events import commands as C
from quotasched.events import facts as F
from quotasched.events.codec import DecodeError, decode_command, encode_bytes
from quotasched.services.scheduler.core import configure, jobs  # noqa: F401 (they register the handlers)
from quotasched.services.scheduler.core.evolve import evolve
from quotasched.services.scheduler.core.passes import schedule
from quotasched.services.scheduler.core.round import HANDLERS, Rejected, Round
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.core.timers import fire_due


FACT_BYTES_LIMIT = 1024 * 1024 - 4 * 1024
"""The largest encoded fact the core emits: NATS's default max_payload (1 MiB), less room for
the headers the writer adds.  A deterministic constant, so replay and the audit agree."""

CHECKED_ABOVE_BYTES = 256 * 1024
"""Messages up to this size cannot give a fact over the limit: a fact repeats at most its
command's fields (and bounded derived ones), and a refusal keeps at most 64 KiB of raw text
(escaped, at most 6x).  Larger messages have their facts measured (only hostile or padded
ones are this large: every field is bounded far below it)."""


def step(state: State, command: C.Command, seq: int, stamp: float | None = None, *,
         clock: float | None = None, size: int = 0) -> list[F.Fact]:  # fmt: skip
    """Decide `command` (the `seq`-th input) and fold its facts into `state`.

    `clock` is the time on the bus (the stream's timestamp): it wins over the command's own
    `at` (ruling 15).  Otherwise `stamp` is used when the command carries no `at`; without
    either, the command happens at the current time.  `size`: the message's size in bytes,
    when it came as bytes (a large one has its facts measured, ruling 16).
    """
    at = clock if clock is not None else command.at if command.at is not None else stamp
    at = state.time if at is None else max(at, state.time)
    round_ = Round(state, seq, at, size)
    # Every attempt deadline in the heap, stale entries included, is at least its top's, and
    # no blocked head's time limit runs out before `blocked_due`, no ended job is forgotten
    # before `expiry_due`: while all are ahead, no timer can be due.
    due = ((state.blocked and state.blocked_due <= at) or (state.timeouts and state.timeouts[0][0] <= at)
           or (state.wakes and state.wakes[0][0] <= at) or state.expiry_due <= at)  # fmt: skip
    checked = size > CHECKED_ABOVE_BYTES
    mark = state.savepoint() if due or checked else None
    try:
        if due:
            fire_due(round_, at)
            round_.at = at
        HANDLERS[type(command)](round_, command)
        schedule(round_)
        if checked:
            problem = oversize(round_.facts)
            if problem is not None:
                raise Rejected(problem, **_names(command))
    except Rejected as rejected:
        if mark is not None:
            mark.undo()
        return reject(state, command.kind, rejected.reason, seq, **rejected.names)
    except BaseException:
        if mark is not None:
            mark.keep()  # a bug: close the journal and let the error through, state as it is
        raise
    if mark is not None:
        mark.keep()
    if at > state.time:
        # Ruling 9 counts time from the previous *command*, silent ones (an idle Tick)
        # included.  Such a command leaves no fact, so until the next fact records a time
        # the fold of the log may lag the live clock; every later fact carries the clamped
        # time, and the command stream (kept for audits) has the silent command itself.
        state.set_time(at)
    return round_.facts


def oversize(facts: list[F.Fact], limit: int = FACT_BYTES_LIMIT) -> str | None:
    """Why these facts could not be appended, if one of them is larger than `limit`."""
    for fact in facts:
        size = len(encode_bytes(fact))
        if size > limit:
            return (f"The {fact.kind} fact of this command would be {size} bytes, over the "
                    f"{limit}-byte limit of one message on the bus")
    return None


def _names(command: C.Command) -> dict[str, Any]:
    """The job and share a refusal names, as far as the command names them."""
    return {"job_id": getattr(command, "job_id", None),
            "quota_share_name": getattr(command, "quota_share_name", None)}  # fmt: skip


def catch_up_clock(state: State, data: bytes | str, stamp: float | None = None, *,
                   refused: bool = False, bus: bool = False) -> None:  # fmt: skip
    """Set the clock as deciding this (already recorded) command set it, without deciding it.

    Recovery folds the fact log and then decides again every command after the last one the
    log records.  The last recorded command itself may have moved the clock past its own facts
    (a Tick whose only fact is a timer stamped at its earlier deadline); this restores that.
    A `refused` command moved nothing (ruling 15).  `bus`: the command came from the stream,
    whose timestamp `stamp` is its time whatever its `at` says.
    """
    if refused:
        return
    if bus:
        at = stamp
    else:
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
        return reject_undecodable(state, error, seq)
    return step(state, command, seq, size=len(data))


RAW_KEPT_BYTES = 256


def reject_undecodable(state: State, error: DecodeError, seq: int) -> list[F.Fact]:
    """A message that is not a valid command: recorded with everything it claimed to be.

    Up to 256 bytes it is kept whole; a longer one keeps its first 256 bytes (for people),
    its size and its sha256 (for the audit), never its body: the command stream keeps the
    message itself, whole, and a record that copied refused bodies would fill the store
    twice as fast (issue 29).
    """
    raw, size, digest = error.raw, None, None
    data = base64.b64decode(raw) if error.raw_encoding == "base64" else raw.encode("utf-8")
    if len(data) > RAW_KEPT_BYTES:
        size, digest = len(data), hashlib.sha256(data).hexdigest()
        head = data[:RAW_KEPT_BYTES]
        raw = base64.b64encode(head).decode() if error.raw_encoding == "base64" \
            else head.decode("utf-8", "ignore")  # a character cut in two is left out
    return reject(
        state, error.kind or "Unknown", error.reason, seq, raw=raw, raw_size=size,
        raw_sha256=digest, raw_encoding=error.raw_encoding, job_id=error.job_id,
        job_queue=error.job_queue, quota_share_name=error.quota_share_name,
    )  # fmt: skip


def reject(state: State, kind: str, reason: str, seq: int, **names: Any) -> list[F.Fact]:
    """Refuse a command: one `CommandRejected` fact, recorded at the clock as it stands,
    which a refusal never moves (ruling 15)."""
    fact = F.CommandRejected(
        at=state.time, command_seq=seq, command_kind=kind, status_reason=reason,
        **{key: value for key, value in names.items() if value is not None},
    )  # fmt: skip
    evolve(state, fact)
    return [fact]
