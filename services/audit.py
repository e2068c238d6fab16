"""`quotasched audit verify`: re-run the decision core over the recorded commands and prove
that it reproduces every recorded fact, byte for byte, or show the first divergence.

The contract (contract.md section 3) keeps every command the scheduler decided on, verbatim
and in order, and every fact names the command that caused it (`commandSeq`).  So the audit
is a plain re-run: a fresh `State`, each command through the very function the scheduler ran
for it, and a comparison of the encoded facts with the recorded ones, in log order.

    commands  (seq, subject, raw bytes, stamp)      recorded facts  (JSON text, in order)
        │  decide_message  (bus: subject + stream timestamp)        │
        │  step_raw        (replay file: line number = seq)         │
        ▼                                                           ▼
    recomputed facts, encoded ───────────── compare ────────────── recorded facts

Two sources feed the same `verify`:
- files: a replay command file (`quotasched replay` input) and the fact log it printed (or
  `quotasched facts` printed);
- the live bus: QM_COMMANDS read in stream order with each message's sequence, subject and
  timestamp (the scheduler's own `sequence_and_time`, so a command without `at`, every Tick
  included, gets the exact stamp the scheduler used), and QM_FACTS.  The log's end is taken
  before the command stream's, so every recorded fact's command is read; commands after the
  last decided one are reported as not decided yet, and a command whose facts are still being
  appended (fewer messages than its `Qm-Facts` header says) counts as not decided yet too.

The verifier itself does no I/O: it consumes two iterables.  The bus reader runs nats-py on
its own event loop in a background thread and hands records over through bounded queues.
"""

from __future__ import annotations

import gc
import json
import queue as queue_module
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from events.codec import decode_fact, encode
from events.subjects import parse_command_subject
from services.scheduler.core import State, evolve, step_raw
from services.scheduler.partition import PER_QUEUE, Partition, partition_mode
from services.scheduler.routing import decide_message, fact_subject_of

# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandRecord:
    """One command as the scheduler saw it.  `subject` None: a replay-file line (decided with
    `step_raw`, like `quotasched replay`); otherwise a bus message (decided with
    `decide_message`, the stream timestamp `stamp` standing in for a missing `at`)."""

    seq: int
    subject: str | None
    data: bytes
    stamp: float | None = None


@dataclass(frozen=True)
class FactRecord:
    """One recorded fact: its text exactly as stored, and where it is stored (`position`: line
    number of a fact file, or the stream sequence in QM_FACTS)."""

    text: str
    position: int
    command_seq: int | None = None  # parsed from the text; None when the text is not a fact

    @staticmethod
    def of(text: str, position: int) -> FactRecord:
        return FactRecord(text, position, _command_seq(text))


def _command_seq(text: str) -> int | None:
    try:
        value = json.loads(text).get("commandSeq")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the result ----------------------------------------------------------------------------------


@dataclass
class Divergence:
    """The first place where the re-run and the log disagree."""

    command_seq: int | None  # the command whose facts differ
    fact_index: int  # 1-based position among the recorded facts (and the recomputed ones)
    position: int | None  # where the recorded fact is stored (line, stream seq); None: past the end
    what: str  # one sentence: changed, missing, extra, ...
    recorded: str | None  # the recorded fact (None: the log has no fact here)
    recomputed: str | None  # the recomputed fact (None: the core produces no fact here)
    fields: list[tuple[str, Any, Any]] = field(default_factory=list)  # (name, recorded, recomputed)
    command: str | None = None  # the command's raw text, when it is at hand
    recorded_group: list[str] = field(default_factory=list)  # every recorded fact of the command
    recomputed_group: list[str] = field(default_factory=list)  # every recomputed fact of it


@dataclass
class Result:
    commands: int = 0  # commands re-run
    silent: int = 0  # of which produced no fact (idle Ticks, mostly)
    facts: int = 0  # facts reproduced byte for byte
    rejected: int = 0  # of which CommandRejected
    first_seq: int | None = None
    last_seq: int | None = None  # last command re-run
    last_decided: int | None = None  # commandSeq of the last recorded fact
    pending: int = 0  # commands after the last decided one (bus only): not decided yet
    partial: tuple[int, int, int] | None = None  # (command seq, facts logged, facts announced)
    folded: int = 0  # facts folded as recorded because their commands are gone (trimmed stream)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # missing command seq ranges
    divergence: Divergence | None = None
    partition: str | None = None  # the partition audited, when the log has one per job queue

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def document(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        if self.divergence is not None:
            out["divergence"]["fields"] = [
                {"field": name, "recorded": rec, "recomputed": new}
                for name, rec, new in self.divergence.fields
            ]
        return out


# -- the verifier --------------------------------------------------------------------------------


class _Produced:
    """The recomputed facts, one at a time, running commands only as far as needed."""

    def __init__(self, commands: Iterable[CommandRecord], state: State, result: Result,
                 scope: Partition | None = None):  # fmt: skip
        self.commands = iter(commands)
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

    def rest_of_group(self, seq: int | None, limit: int = 200) -> list[str]:
        out, k = [], 0
        while len(out) < limit:
            fact = self.peek(k)
            if fact is None or fact.command_seq != seq:
                break
            out.append(fact.text)
            k += 1
        return out


def verify(
    commands: Iterable[CommandRecord],
    facts: Iterable[FactRecord],
    *,
    pending_allowed: bool = False,
    partial: tuple[int, int, int] | None = None,
    scope: Partition | None = None,
) -> Result:
    """Re-run `commands` on a fresh state and compare the facts with `facts`, in order.

    `pending_allowed` (the live bus): commands after the last recorded decision are not a
    divergence but "not decided yet" (the scheduler may still be working, or be stopped).
    `partial`, from the bus reader: a trailing command whose facts were still being appended,
    already left out of `facts`.  `scope`: the log was written by a partition per job queue,
    and `facts` are one partition's; its commands are picked out of `commands`, and only
    its own part of their facts is compared.
    """
    result = Result(partial=partial, partition=scope.name if scope is not None else None)
    state = State()
    produced = _Produced(commands, state, result, scope)
    recorded = _Recorded(facts)
    first = produced.start()
    if first is not None and first.seq > 1 and produced.scope is None:
        # The command stream was trimmed (allowed up to the last snapshot): the facts of the
        # commands that are gone are folded as recorded, and the audit starts from there.
        while (fact := recorded.peek()) is not None and fact.command_seq is not None \
                and fact.command_seq < first.seq:
            try:
                folded = decode_fact(fact.text)
            except ValueError:  # not a fact: the comparison below reports it
                break
            recorded.pop()
            evolve(state, folded)
            result.folded += 1
            result.last_decided = fact.command_seq
    index = 0
    while True:
        want = produced.peek()
        got = recorded.peek()
        if want is None and got is None:
            return result
        if got is None:
            last = result.last_decided
            if pending_allowed and (last is None or want[0] > last):
                # The command that produced `want` ran last: it is pending, not verified.
                result.commands -= 1
                result.last_seq = produced.before_last
                if result.gaps and result.gaps[-1][1] == want[0] - 1:
                    result.gaps.pop()
                if result.commands == 0:
                    result.first_seq = None
                result.pending = 1 + produced.remaining()
                return result
        if got is not None and want is not None and got.text == want[1]:
            produced.pop()
            recorded.pop()
            index += 1
            result.facts += 1
            result.last_decided = got.command_seq
            if got.text.startswith('{"kind":"CommandRejected"'):
                result.rejected += 1
            continue
        result.divergence = _divergence(index, want, got, produced, recorded)
        return result


def _divergence(index: int, want: tuple[int, str] | None, got: FactRecord | None,
                produced: _Produced, recorded: _Recorded) -> Divergence:  # fmt: skip
    want_seq = want[0] if want is not None else None
    got_seq = got.command_seq if got is not None else None
    changed = False
    if want is None:
        seq = got_seq
        what = ("the log records a fact the re-run does not produce: no command left to "
                "cause it" + ("" if got_seq is not None else " (and it is not a readable fact)"))
    elif got is None:
        seq = want_seq
        what = "the log ends here, but the re-run produces this fact (missing from the log)"
    elif got_seq is None:
        seq = want_seq
        what = "the recorded fact is not a readable fact (no integer commandSeq)"
    elif got_seq > want_seq:
        seq = want_seq
        what = (f"the log has no (more) facts for command {want_seq}; its next fact is for "
                f"command {got_seq}: the re-run's fact is missing from the log")
    elif got_seq < want_seq:
        seq = got_seq
        what = (f"the log has a fact for command {got_seq} that the re-run does not produce "
                f"(the re-run is at command {want_seq}): an extra fact")
    else:
        seq = want_seq
        after_want = produced.peek2()
        after_got = recorded.peek(1)
        if after_got is not None and after_got.text == want[1]:
            what = "the log has an extra fact here (the next recorded fact is the re-run's)"
        elif after_want is not None and after_want[1] == got.text:
            what = "a fact is missing from the log here (the recorded fact is the re-run's next)"
        else:
            changed = True
            what = "the recorded fact differs from the recomputed one"
            if _canonical(got.text) == want[1]:
                what += " only in its encoding (same fact, other bytes)"
    matched = recorded.group if recorded.group_seq == seq else []
    return Divergence(
        command_seq=seq, fact_index=index + 1, position=got.position if got else None, what=what,
        recorded=got.text if got else None, recomputed=want[1] if want else None,
        fields=_field_differences(got.text, want[1]) if changed else [],
        command=produced.command_text(seq), recorded_group=matched + recorded.rest_of_group(seq),
        recomputed_group=produced.group(seq),
    )  # fmt: skip


def _canonical(text: str) -> str | None:
    try:
        return encode(decode_fact(text))
    except Exception:  # a tampered line may be anything
        return None


def _field_differences(recorded: str | None, recomputed: str | None) -> list[tuple[str, Any, Any]]:
    try:
        left = json.loads(recorded) if recorded is not None else None
        right = json.loads(recomputed) if recomputed is not None else None
    except ValueError:
        return []
    if not isinstance(left, dict) or not isinstance(right, dict):
        return []
    absent = "(absent)"
    out = []
    for name in [*left, *(key for key in right if key not in left)]:
        a, b = left.get(name, absent), right.get(name, absent)
        if a != b or (name in left) != (name in right):
            out.append((name, a, b))
    return out


# -- rendering -----------------------------------------------------------------------------------


def render(result: Result, source: str) -> str:
    """The report as plain text: a summary, or the first divergence with both versions."""
    lines = []
    span = (f"commands {result.first_seq}..{result.last_seq}"
            if result.first_seq is not None else "no commands")  # fmt: skip
    if result.ok:
        lines.append("audit verify: OK: the decision core reproduces every recorded fact "
                     f"({source})")  # fmt: skip
    else:
        lines.append(f"audit verify: DIVERGENCE: the re-run disagrees with the log ({source})")
    lines.append(f"  commands re-run:   {result.commands} ({span}; "
                 f"{result.silent} produced no fact)")  # fmt: skip
    lines.append(f"  facts reproduced:  {result.facts} byte for byte "
                 f"({result.rejected} CommandRejected)")  # fmt: skip
    if result.folded:
        lines.append(f"  facts folded unverified: {result.folded} (their commands are no longer in "
                     f"the command stream, which starts at {result.first_seq})")  # fmt: skip
    if result.gaps:
        shown = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in result.gaps[:5])
        lines.append(f"  note: the command stream has gaps (deleted messages): {shown}"
                     + (" ..." if len(result.gaps) > 5 else ""))  # fmt: skip
    if result.pending:
        lines.append(f"  not decided yet:   {result.pending} command(s) after command "
                     f"{result.last_decided} (the scheduler has not recorded them yet)")  # fmt: skip
    if result.partial:
        seq, got, want = result.partial
        lines.append(f"  command {seq} is being recorded ({got} of its {want} facts are in the "
                     "log); it counts as not decided yet")  # fmt: skip
    divergence = result.divergence
    if divergence is None:
        return "\n".join(lines)
    lines.append("")
    if divergence.position is None:
        where = "past the log's end"
    elif source.startswith("files"):
        where = f"line {divergence.position}"
    else:
        where = f"QM_FACTS sequence {divergence.position}"
    lines.append(f"First divergence: command {divergence.command_seq}, "
                 f"fact #{divergence.fact_index} of the log ({where})")  # fmt: skip
    lines.append(f"  {divergence.what}")
    if divergence.command is not None:
        lines.append(f"  command   : {divergence.command}")
    none = "(none)"
    lines.append(f"  recorded  : {divergence.recorded if divergence.recorded is not None else none}")
    lines.append(f"  recomputed: "
                 f"{divergence.recomputed if divergence.recomputed is not None else none}")
    if divergence.fields:
        lines.append("  fields that differ (recorded -> recomputed):")
        for name, old, new in divergence.fields:
            lines.append(f"    {name}: {json.dumps(old)} -> {json.dumps(new)}")
    rec, new = divergence.recorded_group, divergence.recomputed_group
    if rec or new:
        lines.append(f"  all facts of command {divergence.command_seq}, side by side "
                     f"(recorded {len(rec)}, recomputed {len(new)}):")  # fmt: skip
        for k in range(max(len(rec), len(new))):
            a = rec[k] if k < len(rec) else None
            b = new[k] if k < len(new) else None
            mark = "==" if a == b else "!="
            lines.append(f"    {k + 1:>3} {mark} recorded  : {a if a is not None else '(none)'}")
            lines.append(f"           recomputed: {b if b is not None else '(none)'}")
    return "\n".join(lines)


# -- files ---------------------------------------------------------------------------------------


def command_file_records(path: str) -> Iterator[CommandRecord]:
    """A replay file's lines as commands: line number = seq, every line (blank ones too),
    line ends removed exactly as `replay_lines` does."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            yield CommandRecord(number, None, line.rstrip(b"\r\n"))


def fact_file_records(path: str) -> Iterator[FactRecord]:
    """A fact log (JSON Lines, as `quotasched replay` or `quotasched facts` print it); blank
    lines are not facts and are skipped."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
            if text.strip():
                yield FactRecord.of(text, number)


def verify_files(commands_path: str, facts_path: str) -> Result:
    return verify(command_file_records(commands_path), fact_file_records(facts_path))


# -- the live bus --------------------------------------------------------------------------------


class BusUnavailable(Exception):
    """The NATS server can't be reached, or it has no quotasched streams."""


_END = object()


class BusReader:
    """Reads QM_FACTS (and QM_COMMANDS) on a private event loop in a background thread.

        with BusReader(url) as bus:
            result = verify(bus.commands(), bus.facts(), pending_allowed=True, ...)

    The fact log's last sequence is taken first, then the command stream's, so every fact
    read names a command that is read too.  Records cross to the caller's thread in batches
    through bounded queues, so neither stream is held in memory whole.
    """

    BATCH = 512

    def __init__(self, url: str, commands: bool = True, connect_timeout: float = 3.0,
                 facts_filter: str = "qm.fact.>"):  # fmt: skip
        self.url = url
        self.facts_filter = facts_filter  # one partition's facts, when there is one per queue
        self.want_commands = commands
        self.connect_timeout = connect_timeout
        self.partial: tuple[int, int, int] | None = None
        self._facts: queue_module.Queue = queue_module.Queue(maxsize=64)
        self._commands: queue_module.Queue = queue_module.Queue(maxsize=64)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="audit-bus-reader", daemon=True)

    def __enter__(self) -> BusReader:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        for channel in (self._facts, self._commands):  # unblock a waiting producer
            try:
                while True:
                    channel.get_nowait()
            except queue_module.Empty:
                pass
        self._thread.join(timeout=10)

    def facts(self) -> Iterator[FactRecord]:
        yield from self._drain(self._facts)

    def commands(self) -> Iterator[CommandRecord]:
        yield from self._drain(self._commands)

    def fact_messages(self) -> Iterator[bytes]:
        """Just the payloads of the fact log (for `explain`)."""
        for record in self.facts():
            yield record.text

    def _drain(self, channel: queue_module.Queue) -> Iterator:
        while True:
            batch = channel.get()
            if batch is _END:
                return
            if isinstance(batch, BaseException):
                raise batch
            yield from batch

    # -- the background thread -------------------------------------------------------------

    def _main(self) -> None:
        import asyncio

        try:
            asyncio.run(self._read())
        except BaseException as error:  # handed to the caller, never lost in the thread
            if not self._ready.is_set():
                self._error = error
                self._ready.set()
            else:
                for channel in (self._facts, self._commands):
                    self._put_blocking(channel, error)

    def _put_blocking(self, channel: queue_module.Queue, item: Any) -> None:
        while not self._stop.is_set():
            try:
                channel.put(item, timeout=0.1)
                return
            except queue_module.Full:
                continue

    async def _put(self, channel: queue_module.Queue, item: Any) -> bool:
        import asyncio

        while not self._stop.is_set():
            try:
                channel.put_nowait(item)
                return True
            except queue_module.Full:
                await asyncio.sleep(0.005)
        return False

    async def _read(self) -> None:
        import asyncio

        import nats
        from nats.js.errors import NotFoundError

        from events.subjects import COMMANDS_STREAM, FACTS_STREAM
        from services.auth import connect_options
        from services.bus import error_reason, last_sequence

        problems: list[BaseException] = []

        async def remember(error: BaseException) -> None:
            problems.append(error)

        try:
            nc = await nats.connect(self.url, name="quotasched-audit",
                                    connect_timeout=self.connect_timeout,
                                    max_reconnect_attempts=1, reconnect_time_wait=0.2,
                                    error_cb=remember, **connect_options())  # fmt: skip
        except Exception as error:
            cause = problems[-1] if problems else error
            raise BusUnavailable(f"cannot reach the NATS server at {self.url}: "
                                 f"{error_reason(cause)}") from None  # fmt: skip
        try:
            js = nc.jetstream()
            try:
                # The log's end first: every fact up to it names a command stored before it.
                await js.stream_info(FACTS_STREAM)
                facts_end = await last_sequence(js, self.facts_filter)
                commands_end = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
            except NotFoundError:
                raise BusUnavailable(f"the NATS server at {self.url} has no quotasched streams "
                                     "(QM_COMMANDS, QM_FACTS)") from None  # fmt: skip
            self._ready.set()
            tasks = [asyncio.create_task(self._read_facts(js, facts_end))]
            if self.want_commands:
                tasks.append(asyncio.create_task(self._read_commands(js, commands_end)))
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            try:
                await asyncio.wait_for(nc.close(), 5)
            except Exception:
                pass

    async def _read_facts(self, js, end: int) -> None:
        """Fact messages in log order; a trailing command whose facts are not all in yet
        (its messages' `Qm-Facts` count says how many there will be) is held back."""
        from contextlib import aclosing

        from services.scheduler.log import read_messages, stream_seq

        batch: list[FactRecord] = []
        held: list[FactRecord] = []  # the current command's facts until its last one arrives
        announced = 0
        if end > 0:
            async with aclosing(read_messages(js, self.facts_filter, 1, until_seq=end)) as messages:
                async for msg in messages:
                    if self._stop.is_set():
                        return
                    record = FactRecord.of(msg.data.decode("utf-8", errors="replace"),
                                           stream_seq(msg))  # fmt: skip
                    headers = msg.headers or {}
                    index, count = _position_in_command(headers)
                    if count is None:  # not written by the scheduler: pass it on as it is
                        batch.extend(held)
                        held = []
                        batch.append(record)
                    else:
                        if index == 0 and held:
                            batch.extend(held)  # an earlier group ended short: let verify see it
                            held = []
                        held.append(record)
                        announced = count
                        if index + 1 >= count:
                            batch.extend(held)
                            held = []
                    if len(batch) >= self.BATCH:
                        if not await self._put(self._facts, batch):
                            return
                        batch = []
        if held:
            self.partial = (held[0].command_seq or 0, len(held), announced)
        if batch:
            await self._put(self._facts, batch)
        await self._put(self._facts, _END)

    async def _read_commands(self, js, end: int) -> None:
        import asyncio

        from nats.js.api import ConsumerConfig, DeliverPolicy

        from events.subjects import COMMANDS_PREFIX, COMMANDS_STREAM
        from services.scheduler.service import sequence_and_time

        if end == 0:
            await self._put(self._commands, _END)
            return
        inbox: asyncio.Queue = asyncio.Queue(maxsize=20_000)

        async def deliver(msg) -> None:
            await inbox.put(msg)

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1)
        sub = await js.subscribe(f"{COMMANDS_PREFIX}.>", cb=deliver, ordered_consumer=True,
                                 config=config, stream=COMMANDS_STREAM,
                                 pending_msgs_limit=200_000)  # fmt: skip
        batch: list[CommandRecord] = []
        try:
            while not self._stop.is_set():
                msg = await inbox.get()
                # The very function the scheduler stamps commands with (sequence and time
                # from the ack subject, at nanosecond precision, or from the metadata).
                seq, stamp = sequence_and_time(msg)
                if seq > end:
                    break
                batch.append(CommandRecord(seq, msg.subject, msg.data, stamp))
                if len(batch) >= self.BATCH:
                    if not await self._put(self._commands, batch):
                        return
                    batch = []
                if seq >= end or _pending(msg) == 0:
                    break
        finally:
            await sub.unsubscribe()
        if batch:
            await self._put(self._commands, batch)
        await self._put(self._commands, _END)


def _position_in_command(headers: dict) -> tuple[int | None, int | None]:
    """(index of the fact within its command, facts the command produced) from the
    scheduler's headers: `Nats-Msg-Id` `<partition>:<command seq>:<index>` and `Qm-Facts`."""
    try:
        count = int(headers["Qm-Facts"])
        index = int(headers.get("Nats-Msg-Id", "").rsplit(":", 1)[1])
    except (KeyError, ValueError, IndexError):
        return None, None
    return index, count


def _pending(msg) -> int | None:
    try:
        return msg.metadata.num_pending
    except Exception:
        return None


def verify_bus(url: str) -> list[Result]:
    """Audit the live log: one result, or one per partition when the log was written by a
    scheduling partition per job queue (each re-run over its own commands, see
    services/scheduler/partition.py)."""
    scopes = partitions_on_bus(url)
    return [_verify_partition(url, scope) for scope in scopes]


def _verify_partition(url: str, scope: Partition | None) -> Result:
    facts_filter = scope.fact_filter if scope is not None else "qm.fact.>"
    with BusReader(url, facts_filter=facts_filter) as bus:
        commands, facts = bus.commands(), bus.facts()
        result = verify(commands, facts, pending_allowed=True, scope=scope)
        if result.ok:
            for _ in facts:  # make sure the reader finished (it sets `partial` at the end)
                pass
        result.partial = bus.partial
    return result


def partitions_on_bus(url: str) -> list[Partition | None]:
    """[None] for a log written by one partition; else the fleet and every job queue with
    facts of its own.  Told apart by the partition names the writers put in their message
    ids (`<partition>:<command seq>:<index>`), in the log's first message."""
    import asyncio

    import nats

    from events.subjects import FACTS_STREAM
    from services.auth import connect_options
    from services.scheduler.log import first_writer

    async def look() -> list[Partition | None]:
        nc = await nats.connect(url, name="quotasched-audit", connect_timeout=3,
                                max_reconnect_attempts=1, **connect_options())  # fmt: skip
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(FACTS_STREAM, subjects_filter="qm.fact.>")
            except Exception:  # no stream: the reader says so, in its words
                return [None]
            subjects = (info.state.subjects or {}) if info.state.messages else {}
            queues = sorted({subject.split(".")[2] for subject in subjects} - {"~"})
            writer = await first_writer(js)  # the mode guard's own reading of the log
            if writer is None or partition_mode(writer) != PER_QUEUE:
                return [None]
            return [Partition.fleet(), *(Partition.for_queue(q) for q in queues)]
        finally:
            await nc.close()

    try:
        return asyncio.run(look())
    except Exception:  # unreachable: the reader reports it with its own message
        return [None]
