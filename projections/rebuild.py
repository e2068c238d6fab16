"""Rebuild a projection database from the log: a JSON Lines fact file or the NATS stream.

    rebuild_from_file("facts.jsonl", "q.duckdb")                 # seq = line in the file
    await rebuild_from_stream(js, "q.duckdb")                     # seq = stream sequence

A rebuild always starts from an empty database, built beside the target (`PATH.rebuild`) and
moved over it only when complete and checkpointed, so a reader never sees half a rebuild and
a failed rebuild leaves the old file as it was.  Projections are disposable (DESIGN principle
4): two rebuilds of the same log give identical tables, and so does the incremental projector
(`queries.checksum` compares them).

Progress: rich draws it (the well-kept library for terminal progress, already a dependency of
the CLI).  A file is read and projected by DuckDB in a few large statements, so the bar
follows DuckDB's own per-statement progress (`query_progress`); reading the stream, the bar
counts facts against the stream's last sequence, then it follows the projection's steps.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass

import duckdb

from quotasched.projections import store as store_module
from quotasched.projections.errors import SpoolFailed

STEPS = ("reading file", "parsing facts", "checking facts", "allocation_starts",
         "attempt_starts", "attempt_ends", "allocation_ends", "attempt_ends_added",
         "preemptions", "environment_config", "queue_config", "share_config", "share_changes",
         "capacity_changes", "checking history", "committing", "checkpoint")  # fmt: skip


@dataclass
class Rebuilt:
    path: str
    facts: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.facts / self.seconds if self.seconds else 0.0


def _fresh(path: str) -> str:
    """The temporary file to build into, after checking nobody holds the target."""
    if path == ":memory:":
        raise store_module.ProjectionError("rebuild needs a file path, not :memory:")
    if os.path.exists(path):
        store_module.connect(path).close()  # raises ProjectionLocked if a projector has it
    building = path + ".rebuild"
    discard(building)
    return building


def discard(path: str) -> None:
    """Remove a projection file (e.g. a partial rebuild) and its write-ahead log."""
    for leftover in (path, path + ".wal"):
        if os.path.exists(leftover):
            os.remove(leftover)


def _publish(building: str, path: str) -> None:
    # A stale write-ahead log beside the target would be replayed onto the new file.
    if os.path.exists(path + ".wal"):
        os.remove(path + ".wal")
    os.replace(building, path)


def rebuild_from_file(facts_path: str, db_path: str, progress: bool = False) -> Rebuilt:
    """A fresh projection of a fact file (as `quotasched replay` or `quotasched facts` print)."""
    if not os.path.exists(facts_path):
        raise store_module.ProjectionError(f"no such fact file: {facts_path}")
    building = _fresh(db_path)
    started = time.perf_counter()
    try:
        facts = _build(building, f"rebuilding {db_path}", progress,
                       lambda store, on_step: store.apply_file(facts_path, on_step=on_step))
    except BaseException:
        discard(building)
        raise
    _publish(building, db_path)
    return Rebuilt(db_path, facts, time.perf_counter() - started)


async def rebuild_from_stream(js, db_path: str, progress: bool = False,
                              chunk_size: int = 20_000) -> Rebuilt:  # fmt: skip
    """A fresh projection of every fact in QM_FACTS (as of the call), seq = stream sequence.

    The log is read with an ordered consumer in chunks (services.scheduler.log.read_log_chunks)
    and spooled to files beside the target, one per run of consecutive sequences, which are
    then projected like a fact file (`apply_file` with the run's first sequence): one pass of
    DuckDB's own reader and one transaction per run, instead of a transaction per few thousand
    facts whose lookups grow with the file.  A message the file reader could not number
    exactly (a line break inside it, anything around its JSON object) is applied on its own,
    as the live projector would apply it, and so is a run the reader refuses: the error then
    names the stream sequence of the fact."""
    from quotasched.services.nats.bus import last_sequence
    from quotasched.services.nats.log import ALL_FACTS, read_log_chunks

    building = _fresh(db_path)
    started = time.perf_counter()
    total = await last_sequence(js, ALL_FACTS)
    spool = Spool(building)
    try:
        with _FactBar(total, progress, f"reading QM_FACTS for {db_path}") as bar:
            async for chunk in read_log_chunks(js, ALL_FACTS, 1, until_seq=total,
                                               chunk_size=chunk_size):  # fmt: skip
                spool.add(chunk)
                bar.advance(chunk[-1][0])
        spool.close()
        facts = _build(building, f"projecting {spool.facts:,} facts", progress, spool.apply)
    except BaseException:
        discard(building)
        raise
    finally:
        spool.remove()
    _publish(building, db_path)
    return Rebuilt(db_path, facts, time.perf_counter() - started)


@dataclass
class _Part:
    """A spool file: a JSON Lines `run` of consecutive sequences from `first`, or `messages`
    (any sequences), each record a (seq, length) header and the payload as it arrived."""

    kind: str  # "run" | "messages"
    path: str
    first: int
    count: int = 0


class Spool:
    """The facts read from the stream, in files `<base>.spool<n>` (beside the rebuild, or in
    the projector's catch-up directory): JSON Lines runs that DuckDB's reader numbers exactly,
    and the odd messages it could not (a line break inside, anything around the JSON object:
    the live projector stores those as they are, so this must too), kept apart; `apply`
    projects the parts in sequence order."""

    HEADER = struct.Struct("<QI")  # seq, payload length
    MESSAGES_PER_BATCH = 10_000

    def __init__(self, base: str):
        self.prefix = base + ".spool"
        self.parts: list[_Part] = []
        self.handle = None
        self.facts = 0  # added
        self.applied = 0  # projected by `apply`
        self.refused = 0  # runs DuckDB's reader refused, applied message by message instead

    @staticmethod
    def is_line(payload: bytes) -> bool:
        """Read back by read_ndjson_objects as exactly this one row, byte for byte."""
        return (payload[:1] == b"{" and payload[-1:] == b"}" and b"\n" not in payload
                and b"\r" not in payload)  # fmt: skip

    def add(self, chunk: list[tuple[int, bytes]]) -> None:
        """Write `chunk` (consecutive messages of the log, in order) to the spool."""
        try:
            self._add(chunk)
        except OSError as error:
            raise self._failed(error) from None

    def _add(self, chunk: list[tuple[int, bytes]]) -> None:
        self.facts += len(chunk)
        payloads = [payload for _, payload in chunk]
        if chunk[-1][0] - chunk[0][0] == len(chunk) - 1 and all(map(self.is_line, payloads)):
            self._part("run", chunk[0][0]).write(b"\n".join(payloads) + b"\n")
            self.parts[-1].count += len(chunk)
            return
        for seq, payload in chunk:  # a gap or an odd message: one at a time
            if self.is_line(payload):
                self._part("run", seq).write(payload + b"\n")
            else:
                self._part("messages", seq).write(self.HEADER.pack(seq, len(payload)) + payload)
            self.parts[-1].count += 1

    def _part(self, kind: str, seq: int):
        """The open file that `seq` continues, or a new one."""
        last = self.parts[-1] if self.parts else None
        continues = self.handle is not None and last.kind == kind and (
            kind == "messages" or seq == last.first + last.count)
        if not continues:
            self.close()
            self.parts.append(_Part(kind, f"{self.prefix}{len(self.parts)}", seq))
            self.handle = open(self.parts[-1].path, "wb")
        return self.handle

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                handle.close()  # flushes: a full disk may show only now
            except OSError as error:
                raise self._failed(error) from None

    def _failed(self, error: OSError) -> SpoolFailed:
        return SpoolFailed(f"cannot write the spool {self.prefix}*: {error}")

    def apply(self, store, on_step=None) -> int:
        """Project the parts in order, a transaction per run (per 10k odd messages); returns
        how many facts were new.  On FactNotApplicable the parts before the failing one stay
        committed, and `applied` counts their facts."""
        self.applied = self.refused = 0
        for part in self.parts:
            if part.kind == "messages":
                for batch in self._messages(part):
                    self.applied += store.apply(batch)
                continue
            try:
                self.applied += store.apply_file(part.path, on_step, first_seq=part.first,
                                                 expect_lines=part.count)  # fmt: skip
            except store_module.FileNotReadable:  # let the store name the fact's sequence
                self.refused += 1
                with open(part.path, "rb") as lines:
                    batch = lines.read().split(b"\n")[: part.count]
                self.applied += store.apply(enumerate(batch, part.first))
        store.con.execute("CHECKPOINT")
        return self.applied

    def _messages(self, part: _Part):
        with open(part.path, "rb") as records:
            batch: list[tuple[int, bytes]] = []
            for _ in range(part.count):
                seq, length = self.HEADER.unpack(records.read(self.HEADER.size))
                batch.append((seq, records.read(length)))
                if len(batch) == self.MESSAGES_PER_BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch

    def remove(self) -> None:
        try:
            self.close()
        except SpoolFailed:
            pass  # it is being thrown away
        for part in self.parts:
            discard(part.path)


def _build(building: str, title: str, progress: bool, apply) -> int:
    """`apply(store, on_step)` on the file being built, under a bar of its steps if asked."""
    try:
        with store_module.open(building) as store:
            if not progress:
                return apply(store, None)
            with _StepBar(store, title) as bar:
                return apply(store, bar.step)
    except duckdb.IOException as error:  # a full or read-only disk
        raise store_module.ProjectionError(f"cannot write {building}: {error}") from None


class _StepBar:
    """One bar over the file rebuild's steps; within a step, DuckDB's own progress."""

    def __init__(self, store, title: str):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.store = store
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                 transient=False)  # fmt: skip
        self.task = self.progress.add_task(title, total=len(STEPS))
        self.index = 0
        self.done = threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> _StepBar:
        self.store.con.execute("SET enable_progress_bar = true")
        self.store.con.execute("SET enable_progress_bar_print = false")
        self.progress.start()
        self.poller.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.done.set()
        self.poller.join()
        if exc_info[0] is None:
            self.progress.update(self.task, completed=len(STEPS), description="done")
        self.progress.stop()

    def step(self, name: str) -> None:
        self.index = STEPS.index(name) if name in STEPS else self.index
        self.progress.update(self.task, completed=self.index, description=name)

    def _poll(self) -> None:
        while not self.done.wait(0.2):
            try:
                within = self.store.con.query_progress()
            except Exception:  # no query running right now
                continue
            if within >= 0:
                self.progress.update(self.task, completed=self.index + min(within, 100) / 100)


class _FactBar:
    def __init__(self, total: int, enabled: bool, title: str):
        self.enabled = enabled
        self.total = total
        self.title = title

    def __enter__(self) -> _FactBar:
        if self.enabled:
            from rich.progress import Progress

            self.progress = Progress()
            self.task = self.progress.add_task(self.title, total=self.total)
            self.progress.start()
        return self

    def advance(self, seq: int) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=seq)

    def __exit__(self, *exc_info) -> None:
        if self.enabled:
            self.progress.stop()

