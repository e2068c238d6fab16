"""The two sides of the audit's comparison, read one fact at a time: `_Produced` re-runs the
recorded commands through the very function the scheduler ran for each (only as far as the
comparison needs), `_Recorded` reads the fact log ahead.  Both keep the recent command's
facts at hand for the divergence report."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable

from quotasched.events.codec import encode
from quotasched.events.subjects import parse_command_subject
from quotasched.services.audit.records import CommandRecord, FactRecord, Result
from quotasched.services.scheduler.core import State, step_raw
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.refusals import is_log_refusal, refusal_cause_of, refuse_message
from quotasched.services.scheduler.routing import decide_message, fact_subject_of


class _Produced:
    """The recomputed facts, one at a time, running commands only as far as needed."""

    def __init__(self, commands: Iterable[CommandRecord], state: State, result: Result,
                 scope: Partition | None = None, recorded: _Recorded | None = None):  # fmt: skip
        self.commands = iter(commands)
        # the log's side, asked whether it records a command as refused by the log itself
        # (services/scheduler/refusals.py): such a command is re-run as that same refusal
        self.recorded = recorded
        self.state = state
        self.result = result
        # one partition of several (see services/scheduler/partition.py): only its commands,
        # only its own part of their facts
        self.scope = scope if scope is not None and scope.token is not None else None
        self.buffer: deque[tuple[int, str]] = deque()  # (command seq, encoded fact)
        self.groups: deque[tuple[int, list[str]]] = deque(maxlen=64)  # recent commands' facts
        self.recent: deque[CommandRecord] = deque(maxlen=64)  # for the divergence report
        self.exhausted = False
        self.before_last: int | None = None  # last_seq before the latest command ran
        self.first: CommandRecord | None = None
        self._started = False

    def start(self) -> CommandRecord | None:
        """The first command, read but not run (to see where the command log begins)."""
        if not self._started:
            self._started = True
            self.first = next(self.commands, None)
        return self.first

    def _next_record(self) -> CommandRecord | None:
        self.start()
        if self.first is not None:
            record, self.first = self.first, None
            return record
        return next(self.commands, None)

    def peek(self) -> tuple[int, str] | None:
        while not self.buffer and not self.exhausted:
            record = self._next_record()
            if record is None:
                self.exhausted = True
                break
            self._run(record)
        return self.buffer[0] if self.buffer else None

    def peek2(self) -> tuple[int, str] | None:
        """The fact after the next one (for telling a missing fact from a changed one)."""
        if self.peek() is None:
            return None
        while len(self.buffer) < 2 and not self.exhausted:
            record = self._next_record()
            if record is None:
                self.exhausted = True
                break
            self._run(record)
        return self.buffer[1] if len(self.buffer) > 1 else None

    def pop(self) -> None:
        self.buffer.popleft()

    def _run(self, record: CommandRecord) -> None:
        result = self.result
        scope = self.scope
        if scope is not None and not scope.hears(record.subject or ""):
            return  # another job queue's command: its partition is audited on its own
        previous = self.before_last = result.last_seq
        if previous is not None and record.seq > previous + 1 and scope is None:
            result.gaps.append((previous + 1, record.seq - 1))
        result.commands += 1
        result.first_seq = record.seq if result.first_seq is None else result.first_seq
        result.last_seq = record.seq
        if result.commands % 16384 == 0:
            gc.freeze()  # as `replay_lines` does: the state is many long-lived objects
        self.recent.append(record)
        if record.subject is None:
            facts = step_raw(self.state, record.data, record.seq)
        else:
            stamp = record.stamp if record.stamp is not None else self.state.time
            cause = self.recorded.log_refusal(record.seq) if self.recorded is not None else None
            if cause is not None:
                result.log_refused += 1
                facts = refuse_message(self.state, record.subject, record.data, record.seq, cause)
            else:
                facts = decide_message(self.state, record.subject, record.data, record.seq, stamp)
            if scope is not None:
                route = parse_command_subject(record.subject)[:2]
                facts = [f for f in facts if scope.owns(fact_subject_of(self.state, f, route))]
        if not facts:
            result.silent += 1
            return
        encoded = [encode(fact) for fact in facts]
        self.groups.append((record.seq, encoded))
        self.buffer.extend((record.seq, text) for text in encoded)

    def group(self, seq: int | None) -> list[str]:
        for group_seq, encoded in self.groups:
            if group_seq == seq:
                return list(encoded)
        return []

    def command_text(self, seq: int | None) -> str | None:
        for record in self.recent:
            if record.seq == seq:
                return record.data.decode("utf-8", errors="replace")
        return None

    def remaining(self) -> int:
        """Count (without running) the commands not read yet."""
        count = 0
        while self._next_record() is not None:
            count += 1
        self.exhausted = True
        return count


class _Recorded:
    def __init__(self, facts: Iterable[FactRecord]):
        self.facts = iter(facts)
        self.ahead: deque[FactRecord] = deque()
        self.group: list[str] = []  # recorded facts already matched for `group_seq`
        self.group_seq: int | None = None

    def peek(self, k: int = 0) -> FactRecord | None:
        while len(self.ahead) <= k:
            fact = next(self.facts, None)
            if fact is None:
                return None
            self.ahead.append(fact)
        return self.ahead[k]

    def pop(self) -> FactRecord:
        fact = self.ahead.popleft()
        if fact.command_seq != self.group_seq:
            self.group, self.group_seq = [], fact.command_seq
        self.group.append(fact.text)
        return fact

    def log_refusal(self, seq: int) -> str | None:
        """The cause, when the log records command `seq` as refused by the log itself (one
        CommandRejected with the writer's LOG_REFUSAL reason); looks ahead only as far as
        that command's facts."""
        k = 0
        while (fact := self.peek(k)) is not None and fact.command_seq is not None \
                and fact.command_seq <= seq:
            if fact.command_seq == seq:
                return refusal_cause_of(fact.text) if is_log_refusal(fact.text) else None
            k += 1
        return None

    def rest_of_group(self, seq: int | None, limit: int = 200) -> list[str]:
        out, k = [], 0
        while len(out) < limit:
            fact = self.peek(k)
            if fact is None or fact.command_seq != seq:
                break
            out.append(fact.text)
            k += 1
        return out
