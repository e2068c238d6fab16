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
follows DuckDB's own per-statement progress (`query_progress`); the stream is projected in
batches as it arrives, so its bar counts facts against the stream's last sequence.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from projections import store as store_module

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
        with store_module.open(building) as store:
            if progress:
                with _StepBar(store, f"rebuilding {db_path}") as bar:
                    facts = store.apply_file(facts_path, on_step=bar.step)
            else:
                facts = store.apply_file(facts_path)
    except BaseException:
        discard(building)
        raise
    _publish(building, db_path)
    return Rebuilt(db_path, facts, time.perf_counter() - started)


async def rebuild_from_stream(js, db_path: str, batch_size: int = 10_000,
                              progress: bool = False) -> Rebuilt:  # fmt: skip
    """A fresh projection of every fact in QM_FACTS, read with the ordered consumer of
    services.scheduler.log, applied `batch_size` facts per transaction."""
    from services.bus import last_sequence
    from services.scheduler.log import ALL_FACTS, read_log

    building = _fresh(db_path)
    started = time.perf_counter()
    total = await last_sequence(js, ALL_FACTS)
    facts = 0
    try:
        with store_module.open(building) as store, _FactBar(total, progress, db_path) as bar:
            batch: list[tuple[int, bytes]] = []
            async for seq, payload, _subject in read_log(js, ALL_FACTS, 1, until_seq=total):
                batch.append((seq, payload))
                if len(batch) >= batch_size:
                    facts += store.apply(batch)
                    bar.advance(seq)
                    batch = []
            if batch:
                facts += store.apply(batch)
                bar.advance(batch[-1][0])
            store.con.execute("CHECKPOINT")
    except BaseException:
        discard(building)
        raise
    _publish(building, db_path)
    return Rebuilt(db_path, facts, time.perf_counter() - started)


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
            self.task = self.progress.add_task(f"rebuilding {self.title}", total=self.total)
            self.progress.start()
        return self

    def advance(self, seq: int) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=seq)

    def __exit__(self, *exc_info) -> None:
        if self.enabled:
            self.progress.stop()

