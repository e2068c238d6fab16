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

`RefusalLog` is the writer's log line of every refusal, bounded: a flooding tenant's refused
commands are each recorded as a CommandRejected fact, but a log line each would cost the
writer more than the decision (issue 29).  Per (job queue, quota share), the first
`REFUSAL_LINES` refusals of each `REFUSAL_WINDOW_S` window are logged in full ("command
rejected"); the rest are counted, and the window is summed up in one line ("commands
rejected": how many, how many logged in full, per reason class) once it has closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from quotasched.events.codec import DecodeError, decode_command, decode_fact
from quotasched.events.facts import Fact
from quotasched.events.labels import job_label
from quotasched.events.subjects import parse_command_subject
from quotasched.services.logs import Held, LineBudget
from quotasched.services.scheduler.core import State, reject

# The distinct start of the reason of a command the fact log refused (never a core reason).
LOG_REFUSAL = "Not recorded: the fact log refused this command's facts"
_REJECTED = b'{"kind":"CommandRejected"'

REFUSAL_LINES = 5  # "command rejected" lines in full per (job queue, quota share) and window
REFUSAL_WINDOW_S = 10.0
REASON_CLASS_CHARS = 60  # a reason naming no limit is classed by its start
OTHER_SHARES = ("*", "*")  # the key refusals count under beyond LineBudget.max_keys shares
STORY_LINES = 20  # "dispatched" / "preempted" lines in full per (job queue, quota share) and window
STORY_WINDOW_S = 10.0


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


def reason_class(reason: str) -> str:
    """What a refusal is counted under in a summary line: the admission limit its reason
    names (`maxQueuedJobs`, ...), "the fact log refused", or the reason's first characters."""
    at = reason.find("limit max")
    if at >= 0:
        end = reason.find(" ", at + 6)
        return reason[at + 6:end if end >= 0 else len(reason)].rstrip(".,;:")
    if reason.startswith(LOG_REFUSAL):
        return "the fact log refused"
    return reason if len(reason) <= REASON_CLASS_CHARS else reason[:REASON_CLASS_CHARS] + "..."


class BudgetedLines:
    """Lines of one family, bounded per (job queue, quota share) by a `LineBudget`: the held
    back ones are summed up in one line per window (`_summary`), told on the share's next
    event after the window, on a timer when it closes, and at `close` (the end of a term)."""

    def __init__(self, log, lines: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.log = log
        self.budget = LineBudget(lines, window_s, clock, overflow_key=OTHER_SHARES)
        self._timer: asyncio.TimerHandle | None = None

    def admit(self, queue: str | None, share: str | None, kind: str, seq: int) -> bool:
        """Count one event; True: log it in full now."""
        told, closed = self.budget.admit((queue, share), kind, seq)
        if closed is not None:
            self._summary(closed)
        if not told and self._timer is None:
            self._arm()
        return told

    def due(self) -> None:
        """Log the summaries of the windows closed by now."""
        for held in self.budget.due():
            self._summary(held)

    def close(self) -> None:
        """Log every summary held, closed or not (the term ends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for held in self.budget.flush():
            self._summary(held)

    def _arm(self) -> None:
        when = self.budget.next_close()
        if when is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: `due` and `close` tell the summaries
            return
        self._timer = loop.call_later(max(0.0, when - self.budget.clock()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.due()
        self._arm()

    # The summary line: its event, and the names its count and its kinds go by.
    SUMMARY, COUNTED, KINDS = "", "", ""

    def _summary(self, held: Held) -> None:
        queue, share = held.key
        self.log.info(self.SUMMARY, job_queue=queue, quota_share=share,
                      **{self.COUNTED: held.count, self.KINDS: dict(held.kinds)},
                      logged=held.told, held_back=held.held_back, first_stream_seq=held.first,
                      last_stream_seq=held.last, window_s=self.budget.window_s)  # fmt: skip


class RefusalLog(BudgetedLines):
    """The writer's lines about refused commands, at most `lines` in full per (job queue,
    quota share) and `window_s`, then one summary line per window that held some back.
    Every refusal is still a CommandRejected fact: only lines are saved, never facts."""

    SUMMARY, COUNTED, KINDS = "commands rejected", "refused", "reasons"

    def __init__(self, log, lines: int = REFUSAL_LINES, window_s: float = REFUSAL_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__(log, lines, window_s, clock)

    def rejected(self, seq: int, subject: str, queue: str | None, share: str | None,
                 fact: Fact) -> None:  # fmt: skip
        """Command `seq`, published on `subject` (of `queue` and `share`), got `fact`, its
        CommandRejected."""
        reason = fact.status_reason
        if self.admit(queue, share, reason_class(reason), seq):
            self.log.info("command rejected", stream_seq=seq, job_queue=queue,
                          quota_share=share, job_id=getattr(fact, "job_id", None),
                          subject=subject, reason=reason)  # fmt: skip


class StoryLog(BudgetedLines):
    """The writer's line for each dispatch and preemption ("dispatched", "preempted"), so a
    person watching `up` sees the story as it is decided; at most `lines` in full per (job
    queue, quota share) and `window_s`, the rest summed up in one "decisions not logged in
    full" line per window.  Logged after the facts are decided, from the facts themselves."""

    SUMMARY, COUNTED, KINDS = "decisions not logged in full", "decisions", "kinds"

    def __init__(self, log, lines: int = STORY_LINES, window_s: float = STORY_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        super().__init__(log, lines, window_s, clock)

    def decided(self, seq: int, facts: list[Fact], jobs: Mapping[str, Any] | None = None) -> None:
        """`jobs`: the state's jobs, to name each job as a person reads it (`events.labels`)."""
        known = jobs or {}

        def who(job_id: str) -> str:
            job = known.get(job_id)
            return job_label(job_id, job.job_name) if job is not None else job_id

        for fact in facts:
            kind = fact.kind
            if kind != "JobDispatched" and kind != "JobPreempted":
                continue
            if not self.admit(fact.job_queue, fact.quota_share_name, kind, seq):
                continue
            if kind == "JobDispatched":
                self.log.info("dispatched", job=who(fact.job_id), job_id=fact.job_id,
                              attempt=fact.attempt,
                              job_queue=fact.job_queue, quota_share=fact.quota_share_name,
                              borrowed=_units(fact.borrowed) or None,
                              after_preemption_of=[who(victim) for victim in fact.after_preemption_of]
                              or None,
                              stream_seq=seq)  # fmt: skip
            else:
                self.log.info("preempted", job=who(fact.job_id), job_id=fact.job_id,
                              attempt=fact.attempt, job_queue=fact.job_queue,
                              quota_share=fact.quota_share_name, by=who(fact.preemptor_job_id),
                              by_job_id=fact.preemptor_job_id, reason=fact.reason.value,
                              outcome=fact.outcome.value, stream_seq=seq)  # fmt: skip


def _units(items) -> str:
    return ", ".join(f"{item.quantity} x {item.capacity_unit}" for item in items)
