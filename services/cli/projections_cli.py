"""`quotasched projections ...` and `quotasched sql`: the DuckDB projection from the command line.

    quotasched projections rebuild --db q.duckdb --facts facts.jsonl     # or --nats-url URL
    quotasched projections query get-job-queue-snapshot --db q.duckdb --job-queue q
    quotasched projections checksum --db q.duckdb
    quotasched sql 'SELECT * FROM utilization(0, 86400, 3600)' --db q.duckdb --output csv

Reads open the file read-only.  DuckDB lets one process write a file, or any number read it
while nobody writes, so a read while a projector holds the file fails with a message saying so
(exit 2); query a copy of the file, or ask the projector's process.

Exit status: 0 done; 1 the query failed (bad SQL, unknown job or queue) or the log holds a
fact that cannot be projected (the reason is on standard error); 2 bad usage, no such
database or fact file, the file is locked, or NATS is unreachable.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Optional

import typer

EXIT_FAILED, EXIT_USAGE = 1, 2
DB_ENV = "QUOTASCHED_PROJECTION_DB"

projections_app = typer.Typer(help="The DuckDB projection of the fact log: rebuild, query.",
                              no_args_is_help=True)  # fmt: skip

DbOpt = Annotated[str, typer.Option("--db", envvar=DB_ENV, help="The projection's DuckDB file.")]


class Output(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class Verb(str, Enum):
    describe_service_job = "describe-service-job"
    list_service_jobs = "list-service-jobs"
    get_job_queue_snapshot = "get-job-queue-snapshot"


def register(app: typer.Typer) -> None:
    """Add `projections ...` and `sql` to the `quotasched` app."""
    app.add_typer(projections_app, name="projections")
    app.command("sql")(sql)


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _open_read_only(db: str):
    from quotasched.projections import store

    try:
        return store.open(db, read_only=True)
    except store.ProjectionLocked:
        raise _fail(f"quotasched: {db} is held by a running projector (DuckDB allows one "
                    "writer, or readers only): ask that projector instead with --nats-url URL "
                    "(or QUOTASCHED_NATS_URL; `up` prints it as NATS_URL=...), or query a copy "
                    "of the file (cp it first)", EXIT_USAGE) from None  # fmt: skip
    except store.ProjectionError as error:
        raise _fail(f"quotasched: {error}", EXIT_USAGE) from None


@projections_app.command()
def rebuild(
    db: DbOpt,
    facts: Annotated[Optional[str], typer.Option(
        "--facts", help="A fact file (JSON Lines, as `quotasched replay` or `facts` print)."),
    ] = None,
    nats_url: Annotated[Optional[str], typer.Option(
        "--nats-url", envvar="QUOTASCHED_NATS_URL", help="Read QM_FACTS from this server.")] = None,
    progress: Annotated[bool, typer.Option(help="Draw a progress bar.")] = True,
) -> None:
    """Build a fresh projection database from the whole log, then replace --db with it."""
    from quotasched.projections import rebuild as rebuilding
    from quotasched.projections.store import FactNotApplicable, ProjectionError

    try:
        if facts is not None:
            done = rebuilding.rebuild_from_file(facts, db, progress=progress)
        elif nats_url is not None:
            done = _from_stream(nats_url, db, progress)
        else:
            raise _fail("quotasched projections rebuild: give --facts FILE or --nats-url URL",
                        EXIT_USAGE)  # fmt: skip
    except FactNotApplicable as error:
        raise _fail(f"quotasched projections rebuild: {error}", EXIT_FAILED) from None
    except ProjectionError as error:
        raise _fail(f"quotasched projections rebuild: {error}", EXIT_USAGE) from None
    typer.echo(f"rebuilt {done.path}: {done.facts} facts in {done.seconds:.2f} s "
               f"({done.rate:,.0f} facts/s)")  # fmt: skip


def _from_stream(url: str, db: str, progress: bool):
    import asyncio

    import nats
    from nats.js.errors import NotFoundError

    from quotasched.projections.rebuild import rebuild_from_stream
    from quotasched.services.nats.credentials import connect_options

    async def quiet(error: Exception) -> None:  # nats-py would print a traceback per attempt
        pass

    async def work():
        try:
            nc = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=1,
                                    reconnect_time_wait=0.2, error_cb=quiet,
                                    **connect_options())  # credentials, TLS: the environment
        except Exception as error:
            raise _fail(f"quotasched: cannot reach the NATS server at {url}: {error}",
                        EXIT_USAGE) from None  # fmt: skip
        try:
            return await rebuild_from_stream(nc.jetstream(), db, progress=progress)
        except NotFoundError:
            raise _fail(f"quotasched: no fact stream on the NATS server at {url}",
                        EXIT_USAGE) from None  # fmt: skip
        finally:
            await nc.close()

    return asyncio.run(work())


@projections_app.command()
def query(
    verb: Annotated[Verb, typer.Argument(help="The AWS Batch read verb to answer.")],
    db: DbOpt,
    job_id: Annotated[Optional[str], typer.Option("--job-id")] = None,
    job_queue: Annotated[Optional[str], typer.Option("--job-queue")] = None,
    job_status: Annotated[Optional[str], typer.Option("--job-status")] = None,
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filters", help="name=QUOTA_SHARE_NAME,values=qs1 or name=JOB_NAME,values=train-*; "
                          "repeat for several.")] = None,
    max_results: Annotated[Optional[int], typer.Option("--max-results", min=1)] = None,
) -> None:
    """Answer describe-service-job, list-service-jobs or get-job-queue-snapshot from the
    projection, in the scheduler's JSON shapes (no scheduler needed)."""
    from quotasched.projections import queries
    from quotasched.services.cli.shorthand import SHAPES, ShorthandError, parse_list_param

    needs = {Verb.describe_service_job: ("--job-id", job_id)}.get(verb, ("--job-queue", job_queue))
    if needs[1] is None:
        raise _fail(f"quotasched projections query {verb.value}: {needs[0]} is required",
                    EXIT_USAGE)  # fmt: skip
    try:
        parsed = parse_list_param("--filters", filters, SHAPES["filters"])
    except ShorthandError as error:
        raise _fail(str(error), EXIT_USAGE) from None
    request = {"jobId": job_id, "jobQueue": job_queue, "jobStatus": job_status,
               "filters": parsed, "maxResults": max_results}  # fmt: skip
    with _open_read_only(db) as store:
        answer = queries.answer(store.con, verb.value, request)
    if "error" in answer:
        raise _fail(f"An error occurred (ClientException): {answer['error']['message']}",
                    EXIT_FAILED)  # fmt: skip
    typer.echo(json.dumps(answer, indent=4, ensure_ascii=False))


@projections_app.command()
def checksum(db: DbOpt) -> None:
    """Rows and an order-independent hash of every table and view (equal for equal logs)."""
    from quotasched.projections import queries

    with _open_read_only(db) as store:
        sums = queries.checksum(store.con)
        position = store.position()
    typer.echo(json.dumps({"position": position,
                           "tables": {name: {"rows": n, "hash": str(h)}
                                      for name, (n, h) in sums.items()}}, indent=2))  # fmt: skip


def sql(
    statement: Annotated[str, typer.Argument(metavar="SQL", help="One SQL statement.")],
    db: Annotated[Optional[str], typer.Option("--db", envvar=DB_ENV, help="The projection's DuckDB file.")] = None,
    nats_url: Annotated[Optional[str], typer.Option("--nats-url", envvar="QUOTASCHED_NATS_URL", help="Ask the running projector instead of opening a file (--db, when given, comes first).")] = None,
    output: Annotated[Output, typer.Option("--output", help="table, json or csv.")] = Output.table,
    limit: Annotated[int, typer.Option("--limit", help="With --nats-url: most rows returned.")] = 1000,
) -> None:
    """Run SQL against a projection (read-only) and print the result.

    With --db the file is opened read-only (not possible while a projector writes it); with
    --nats-url the running projector answers (qm.proj.sql), so the live file is never opened
    by anyone else.  Tables and views: facts, jobs, allocations, attempts, preemptions,
    share_usage, queue_usage, quota_shares; macros utilization(t0, t1, bucket_s),
    queue_utilization(t0, t1, bucket_s) and lending(t0, t1) (who lent to whom).  Quote the columns "at" and "limit" (SQL keywords).
    """
    import duckdb

    from quotasched.projections import queries

    if nats_url is not None and db is None:  # QUOTASCHED_NATS_URL, like every other command
        from quotasched.services.projector.client import ProjectorError, ProjectorUnavailable, query

        try:
            answer = query(nats_url, "sql", sql=statement, limit=limit)
        except ProjectorUnavailable as error:
            raise _fail(f"quotasched sql: {error}", 2) from None
        except ProjectorError as error:
            raise _fail(f"quotasched sql: {error}", EXIT_FAILED) from None
        _print(answer["columns"], [tuple(row) for row in answer["rows"]], output)
        return
    if db is None:
        raise _fail("quotasched sql: give --db PATH or --nats-url URL", 2)
    with _open_read_only(db) as store:
        try:
            columns, rows = queries.run_sql(store.con, statement)
        except duckdb.Error as error:
            raise _fail(f"quotasched sql: {error}", EXIT_FAILED) from None
    _print(columns, rows, output)


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _print(columns: list[str], rows: list[tuple], output: Output) -> None:
    if output is Output.json:
        documents = [dict(zip(columns, (_plain(value) for value in row))) for row in rows]
        typer.echo(json.dumps(documents, indent=2, ensure_ascii=False, default=str))
    elif output is Output.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([json.dumps(_plain(v), default=str) if isinstance(v, (list, dict))
                             else v for v in row])  # fmt: skip
    else:
        _print_table(columns, rows)


def _print_table(columns: list[str], rows: list[tuple]) -> None:
    """A table when it fits the terminal's width; otherwise one block a row, `column  value`
    per line (psql's expanded display), so no value is cut or wrapped into a column of dots.
    Numbers are rounded to 3 decimals (an integral float prints as an integer)."""
    from rich import box
    from rich.console import Console
    from rich.rule import Rule
    from rich.table import Table

    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    console = Console(width=wide)
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    if sum(widths) + 3 * len(columns) + 1 <= console.width:
        table = Table(*columns)
        for row in cells:
            table.add_row(*row)
        console.print(table)
        return
    for number, row in enumerate(cells, start=1):
        console.print(Rule(f"row {number}", align="left"))
        block = Table(box=None, show_header=False, padding=(0, 1, 0, 0))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")
        for name, value in zip(columns, row):
            block.add_row(name, value)
        console.print(block)
    if not cells:
        console.print(f"(no rows; columns: {', '.join(columns)})")


def _cell(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)
