"""Where the report reads the projection: a DuckDB file, or the running projector over NATS.

    with open_reader(db="q.duckdb") as reader: ...                   # the file, read-only
    with open_reader(nats_url="nats://127.0.0.1:4222") as reader: ...  # qm.proj.sql
    reader.rows('SELECT ... WHERE job_queue = $q ORDER BY seq', {"q": "training"})

Both readers run the very same statements (load.py, jobs.py), given a dict of parameters of
which each statement uses some: a `DuckDBReader` binds the `$name` parameters itself; a
`ProjectorReader` writes them into the statement as SQL literals (the projector's `sql` verb
takes one statement and no parameters) and pages through a long answer: the projector
returns at most 10,000 rows a request, fewer when they would not fit in one NATS message, and
says `truncated`; the next page is the same statement with `OFFSET n`.
So every statement that can return more than one row ends with an ORDER BY over a key.

Over NATS each request is its own read transaction, so the report pins every statement to the
position it read first (`seq <= $pos`): the projection's tables are append-only, so rows up to
a position never change and the pages and statements agree even while facts arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .model import ReportError, ReportUsageError

PARAMETER = re.compile(r"\$([A-Za-z_]\w*)")
PAGE_ROWS = 10_000  # the projector's MAX_ROW_LIMIT: it answers at most this many a request


class Reader(Protocol):
    source: str  # said in the report's header

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]: ...


class DuckDBReader:
    def __init__(self, con, source: str):
        self.con, self.source = con, source

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        params = params or {}  # DuckDB refuses a parameter the statement does not name
        used = {name: params[name] for name in PARAMETER.findall(sql)}
        return self.con.execute(sql, used).fetchall()


def literal(value: Any) -> str:
    """A Python value as a DuckDB SQL literal (the `$name` parameters the report uses)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value!r}::DOUBLE"  # repr round-trips; a bare 1.5 would be a DECIMAL
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(item) for item in value) + "]"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def bind(sql: str, params: dict[str, Any] | None) -> str:
    """`sql` with every `$name` replaced by the literal of params[name]."""
    params = params or {}
    return PARAMETER.sub(lambda match: literal(params[match.group(1)]), sql)


class ProjectorReader:
    """Runs statements through `ask(statement, limit) -> answer`, the projector's `sql` verb
    (`projector`, below, asks over NATS; a test may answer from a local cursor)."""

    def __init__(self, ask: Callable[[str, int], dict[str, Any]], source: str):
        self.ask, self.source = ask, source

    def rows(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
        statement = bind(sql, params)
        found: list[tuple] = []
        while True:
            answer = self.ask(statement + (f" OFFSET {len(found)}" if found else ""), PAGE_ROWS)
            found += [tuple(row) for row in answer["rows"]]
            if not answer["truncated"]:
                return found
            if not answer["rows"]:
                raise ReportError("the projector cannot send one row of the report's query in "
                                  "a NATS message (max_payload too small)")  # fmt: skip


@contextlib.contextmanager
def projector(nats_url: str, timeout_s: float = 60.0) -> Iterator[ProjectorReader]:
    """A ProjectorReader over one NATS connection (kept for all of the report's statements)."""
    from quotasched.services.nats.bus import Unreachable, connect
    from quotasched.services.projector.client import ProjectorUnavailable, request

    with asyncio.Runner() as runner:
        try:
            nc = runner.run(connect(nats_url, "quotasched-report", timeout=10.0))
        except Unreachable as error:
            raise ProjectorUnavailable(str(error)) from None
        try:
            def ask(statement: str, limit: int) -> dict[str, Any]:
                return runner.run(request(nc, "sql", timeout=timeout_s, sql=statement,
                                          limit=limit))  # fmt: skip

            yield ProjectorReader(ask, f"the projector at {nats_url}")
        finally:
            runner.run(nc.close())


@contextlib.contextmanager
def open_reader(db: str | None = None, nats_url: str | None = None) -> Iterator[Reader]:
    """The file when `db` is given (it wins, as in `quotasched sql`), else the projector."""
    if db is not None:
        from quotasched.projections import store

        with store.open(db, read_only=True) as projection:
            yield DuckDBReader(projection.con, db)
    elif nats_url is not None:
        with projector(nats_url) as reader:
            yield reader
    else:
        raise ReportUsageError("give --db PATH (a projection file) or --nats-url URL (the "
                               "running projector)")  # fmt: skip
