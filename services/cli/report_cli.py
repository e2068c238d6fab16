"""`quotasched report`: charts of the projection, as one self-contained HTML file or a PNG.

    quotasched replay examples/two-teams-day.jsonl > facts.jsonl
    quotasched projections rebuild --db q.duckdb --facts facts.jsonl
    quotasched report --db q.duckdb --out report.html
    quotasched report --db q.duckdb --out training.png --job-queue training --from 28800 --to 43200
    quotasched report --nats-url nats://127.0.0.1:4222 --out live.html   # a running service

Exit status: 0 written; 1 the report could not be made (a database without facts, no Chromium
for a PNG, a query the projector refused); 2 bad usage (no --db or --nats-url, unknown job
queue, empty window, --out neither .html nor .png), no such database, the file is held by a
running projector (use --nats-url), or no projector answers.
"""

from __future__ import annotations

import inspect
from datetime import datetime, timezone
from typing import Annotated, Optional

import typer

EXIT_FAILED, EXIT_USAGE = 1, 2
DB_ENV = "QUOTASCHED_PROJECTION_DB"
NATS_ENV = "QUOTASCHED_NATS_URL"


def register(app: typer.Typer) -> None:
    """Add `report` to the `quotasched` app."""
    app.command("report", help=_prose(report.__doc__))(report)


def _prose(doc: str | None) -> str:
    """A docstring as help text, each paragraph on one line (Typer keeps line breaks)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"quotasched report: {message}", err=True)
    return typer.Exit(code)


def _moment(text: str | None, option: str) -> float | None:
    """--from / --to: the facts' `at` in seconds, or an ISO time (UTC unless it says)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise _fail(f"{option} {text}: give seconds (the facts' `at`) or an ISO time such as "
                    "2026-12-01T08:00", EXIT_USAGE) from None  # fmt: skip
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def report(
    db: Annotated[Optional[str], typer.Option(
        "--db", envvar=DB_ENV, help="The projection's DuckDB file (read-only; comes first "
                                    "when --nats-url is given too).")] = None,
    nats_url: Annotated[Optional[str], typer.Option(
        "--nats-url", envvar=NATS_ENV, help="Read through the running projector instead of "
                                            "opening its file.")] = None,
    out: Annotated[str, typer.Option(
        "--out", help="Where to write: report.html (self-contained) or report.png (rendered by "
                      "headless Chromium).")] = "report.html",
    job_queue: Annotated[Optional[list[str]], typer.Option(
        "--job-queue", help="Only this job queue (repeat for several; default: all).")] = None,
    t_from: Annotated[Optional[str], typer.Option(
        "--from", help="Start of the window: seconds as the facts' `at`, or an ISO time (UTC "
                       "unless it names a zone). Default, per job queue: its creation, or just "
                       "before its first dispatch when it idled for the first quarter of the "
                       "log.")] = None,
    t_to: Annotated[Optional[str], typer.Option(
        "--to", help="End of the window, as --from. Default: the last fact.")] = None,
) -> None:
    """Charts of usage per quota share against capacity, borrowing, waiting jobs and preemptions.

    Per job queue and capacity unit, a chart (drawn by Chart.js, inlined, so the file works
    offline) stacks each share's own-quota usage (solid) and what it borrowed beyond its limit
    (hatched), with the service environment's capacity as a line; usage above the capacity (it
    was lowered under running jobs, which are not stopped) is hatched red and explained in a note;
    preemptions are marked on the time axis. Under it, who lent to whom in instance-seconds. Per
    job queue, a chart of the jobs waiting per share (blocked ones hatched), a table of the jobs
    still waiting at the end of the window with priority, since when and why, and a table of
    every preemption.

    Times, one rule for the page: a log on a real clock (its first fact's `at` is 1e9 or more,
    as every live service's) is shown in UTC: axis ticks "08:00", header and tables in ISO
    ("2026-12-01T08:00:00Z"). A log whose times are logical seconds (a replayed example, from
    0) is shown as time elapsed since its first fact ("+1 h 30 min"), never as a clock time.

    Source: --db opens the file read-only, which fails while a projector holds it; --nats-url
    (or QUOTASCHED_NATS_URL) asks that projector instead (qm.proj.sql), so it works against a
    running service. --db, from the option or QUOTASCHED_PROJECTION_DB, comes first when both
    are given.
    """
    if db is None and nats_url is None:
        raise _fail("give --db PATH (a projection file) or --nats-url URL (a running "
                    "projector; or set QUOTASCHED_NATS_URL)", EXIT_USAGE)  # fmt: skip
    start, end = _moment(t_from, "--from"), _moment(t_to, "--to")
    made = _write(db, None if db is not None else nats_url, out, job_queue or None, start, end)
    charts = len(made.charts)
    marked = sum(len(queue.preemptions) for queue in made.queues)
    typer.echo(f"wrote {out}: {charts} chart{'s' if charts != 1 else ''}, {marked} "
               f"preemption{'s' if marked != 1 else ''}", err=True)  # fmt: skip


def _write(db, nats_url, out, job_queues, start, end):
    """write_report, its failures turned into messages and exit statuses."""
    import os

    from quotasched.projections import ProjectionError, ProjectionLocked, SchemaMismatch
    from quotasched.services.projector.client import ProjectorError, ProjectorUnavailable
    from quotasched.services.report import ReportError, ReportUsageError, write_report

    if db is not None and not os.path.exists(db):
        raise _fail(f"no projection database at {db} (build one with quotasched projections "
                    "rebuild --db PATH --facts FACTS, or read a running projector with "
                    "--nats-url URL)", EXIT_USAGE)  # fmt: skip
    try:
        return write_report(out, db, job_queues, start, end, nats_url=nats_url)
    except ProjectionLocked:
        raise _fail(f"{db} is held by a running projector (DuckDB allows one writer, or "
                    "readers only): read it through the projector with --nats-url URL (or "
                    "QUOTASCHED_NATS_URL), or report on a copy of the file", EXIT_USAGE) from None
    except (ProjectionError, SchemaMismatch, ReportUsageError) as error:
        raise _fail(str(error), EXIT_USAGE) from None  # not a projection, old schema, bad ask
    except ReportError as error:
        raise _fail(str(error), EXIT_FAILED) from None
    except ProjectorUnavailable as error:  # before ProjectorError: it is one
        raise _fail(str(error), EXIT_USAGE) from None
    except ProjectorError as error:
        raise _fail(f"the projector refused a query: {error}", EXIT_FAILED) from None
    except OSError as error:
        raise _fail(f"cannot write {out}: {error.strerror or error}", EXIT_USAGE) from None
