"""The DuckDB sink: stage a batch of facts, project it, advance the position, one transaction.

    store = projections.store.open("quotasched.duckdb")   # creates the schema when new
    store.position()                                       # last applied fact seq, 0 if none
    store.apply([(seq, payload), ...])                     # payload: bytes, str or a Fact
    store.close()

Exactly once: a batch's rows and the new position commit together, so after a crash the
file holds whole batches only and the projector resumes from `position() + 1`.  Facts at or
below the position are skipped (a redelivery after a restart); a batch must otherwise be in
strictly increasing seq order.  There is no in-memory projector state to rebuild on restart:
every row is derived in SQL from the batch and from rows already in the file (rows.py).

A fact that cannot be projected (unknown kind, a required field missing, a job that was never
submitted, an attempt that is not running ...) raises `FactNotApplicable` and the whole batch
is rolled back: nothing of it is written and the position does not move.

Staging: rows go into a TEMP table through the DuckDB Appender (`executemany` is ~270x
slower), used as a context manager so it is always flushed: an Appender collected without a
flush silently drops its rows.  A facts file is read by DuckDB's own NDJSON reader instead
(rows.file_lines).

One process owns a DuckDB file: a second writer, or a reader while a writer holds it, fails
on the file lock; `open` turns that into `ProjectionLocked`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import duckdb

from quotasched.projections import checks, rows, schema
from quotasched.projections.errors import (FactNotApplicable, FileNotReadable, ProjectionError,
                                ProjectionLocked)


def connect(path: str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as error:
        if "lock" in str(error).lower():
            raise ProjectionLocked(
                f"{path} is in use by another process (DuckDB allows one writer, or any number "
                f"of readers without a writer): {error}"
            ) from None
        raise ProjectionError(f"cannot open {path}: {error}") from None
    except duckdb.Error as error:  # not a DuckDB file, or one from another DuckDB version
        raise ProjectionError(f"cannot open {path}: {error}") from None


def open(path: str, read_only: bool = False) -> ProjectionStore:  # noqa: A001 (the brief's name)
    """Open (and when new, create) a projection file."""
    if read_only and path != ":memory:" and not os.path.exists(path):
        raise ProjectionError(f"no projection database at {path}")
    con = connect(path, read_only=read_only)
    try:
        if schema.is_empty(con):
            if read_only:
                raise ProjectionError(f"{path} is not a quotasched projection database")
            schema.create(con)
        schema.check(con, path)
    except BaseException:
        con.close()
        raise
    return ProjectionStore(con, path, read_only)


class ProjectionStore:
    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, read_only: bool) -> None:
        self.con = con
        self.path = path
        self.read_only = read_only
        # DuckDB draws its own progress bar on long statements; rebuild.py draws ours.
        con.execute("SET enable_progress_bar_print = false")
        if not read_only:
            con.execute(rows.SESSION_DDL)

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def position(self) -> int:
        return self.con.execute("SELECT position FROM projection_state").fetchone()[0]

    def apply(self, batch: Iterable[tuple[int, Any]]) -> int:
        """Project facts (seq, payload) in one transaction; returns how many were new."""
        position = self.position()
        staged: list[tuple[int, str]] = []
        last = position
        for seq, payload in batch:
            if seq <= position:
                continue  # applied before: a redelivery
            if seq <= last:
                raise ProjectionError(f"facts out of order: seq {seq} after seq {last}")
            staged.append((seq, _text(payload)))
            last = seq
        if not staged:
            return 0
        self.con.execute("DELETE FROM staged")
        with self.con.appender("staged") as appender:  # `with`: always flushed
            appender.append_rows(staged)
        try:
            return self._project(position, rows.FROM_STAGED, last)
        finally:
            self.con.execute("DELETE FROM staged")

    def apply_file(self, path: str, on_step: Callable[[str], None] | None = None,
                   first_seq: int = 1, expect_lines: int | None = None) -> int:  # fmt: skip
        """Project a JSON Lines fact file in one transaction (seq = position in the file,
        blank lines skipped, counted from `first_seq`); lines at or below the position are
        skipped, so running it again after a crash resumes.  DuckDB reads the file itself
        (rows.file_lines), and its lines then take the same path as `apply`.  `on_step(name)`
        is called before each step.  Raises FileNotReadable when DuckDB's reader refuses the
        file, or reads another number of lines than `expect_lines`."""
        if not os.path.exists(path):
            raise ProjectionError(f"no such fact file: {path}")
        position = self.position()
        step = on_step or (lambda name: None)
        step("reading file")
        try:
            self.con.execute(rows.file_lines(path))
        except duckdb.Error as error:  # DuckDB names the line that is not JSON
            raise FileNotReadable([], f"{path}: {error}") from None
        try:
            lines = self.con.execute("SELECT count(*) FROM file_lines").fetchone()[0]
            if expect_lines is not None and lines != expect_lines:
                raise FileNotReadable([], f"{path}: {lines} lines read, {expect_lines} expected")
            last = first_seq - 1 + lines
            if last <= position:
                return 0
            applied = self._project(position, rows.from_file(first_seq), last, on_step)
        finally:
            self.con.execute("DROP TABLE IF EXISTS file_lines")
        step("checkpoint")
        self.con.execute("CHECKPOINT")
        return applied

    def _project(self, lo: int, source: str, hi: int | None,
                 on_step: Callable[[str], None] | None = None) -> int:  # fmt: skip
        """Load (lo, hi] from `source` into fact_log, derive every table, move the position."""
        con = self.con
        step = on_step or (lambda name: None)
        con.execute("BEGIN TRANSACTION")
        try:
            step("parsing facts")
            load = rows.FACT_LOG_INSERT.replace("{source}", source)
            con.execute(load, _params(load, lo, hi))
            count, last = con.execute(
                "SELECT count(*), max(seq) FROM fact_log WHERE seq > $lo", {"lo": lo}
            ).fetchone()
            if not count:
                con.execute("ROLLBACK")
                return 0
            con.execute(rows.batch_view(lo, last))
            step("checking facts")
            self._raise_problems(checks.BATCH_PROBLEMS, lo, last)
            kinds = {kind for (kind,) in con.execute("SELECT DISTINCT kind FROM batch").fetchall()}
            for name, statement in rows.STATEMENTS.items():
                step(name)
                if kinds.isdisjoint(rows.READS[name]):
                    continue
                try:
                    con.execute(statement, _params(statement, lo, last))
                except duckdb.ConstraintException as error:
                    raise FactNotApplicable([], f"{name}: {error}") from None
            step("checking history")
            history = checks.history_problems(kinds)
            if history is not None:
                self._raise_problems(history, lo, last)
            con.execute("DROP TABLE IF EXISTS attempt_starts")  # per batch (rows.py)
            con.execute("DROP TABLE IF EXISTS attempt_ends")
            con.execute(
                "UPDATE projection_state SET position = $hi, facts_applied = facts_applied + "
                "$count, last_at = greatest(coalesce(last_at, 0), (SELECT max(\"at\") FROM batch))",
                {"hi": last, "count": count},
            )
            step("committing")
            con.execute("COMMIT")
            return count
        except duckdb.InvalidInputException as error:
            con.execute("ROLLBACK")
            raise self._invalid_json(lo, error) from None
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _raise_problems(self, query: str, lo: int, hi: int) -> None:
        problems = self.con.execute(query, _params(query, lo, hi)).fetchall()
        if problems:
            raise FactNotApplicable(problems)

    def _invalid_json(self, lo: int, error: Exception) -> ProjectionError:
        """Name the first fact that is not JSON (staged batches; a file names the line)."""
        bad = self.con.execute(
            "SELECT seq FROM staged WHERE seq > $lo AND NOT json_valid(body) ORDER BY seq LIMIT 1",
            {"lo": lo},
        ).fetchone()
        if bad is None:
            return FactNotApplicable([], str(error))
        return FactNotApplicable([(bad[0], "?", f"not valid JSON: {error}")])


def _params(statement: str, lo: int, hi: int | None) -> dict[str, int]:
    return {name: value for name, value in (("lo", lo), ("hi", hi)) if f"${name}" in statement}


def _text(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload).decode("utf-8")
    from quotasched.events.codec import encode  # a Fact model: its canonical wire form

    return encode(payload)
