"""`quotasched report`: charts of a projection database, as one self-contained HTML file or a PNG.

    quotasched replay examples/two-teams-day.jsonl > facts.jsonl
    quotasched projections rebuild --db q.duckdb --facts facts.jsonl
    quotasched report --db q.duckdb --out report.html
    quotasched report --db q.duckdb --out training.png --job-queue training --from 28800 --to 43200

Exit status: 0 written; 1 the report could not be made (a database without facts, no Chromium
for a PNG); 2 bad usage (unknown job queue, empty window, --out neither .html nor .png), no such
database, or the file is held by a running projector.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Optional

import typer

EXIT_FAILED, EXIT_USAGE = 1, 2
DB_ENV = "QUOTASCHED_PROJECTION_DB"


def register(app: typer.Typer) -> None:
    """Add `report` to the `quotasched` app."""
    app.command("report", help=_prose(report.__doc__))(report)


def _prose(doc: str | None) -> str:
    """A docstring as help text, each paragraph on one line (Typer keeps line breaks)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def report(
    db: Annotated[str, typer.Option("--db", envvar=DB_ENV, help="The projection's DuckDB file.")],
    out: Annotated[str, typer.Option(
        "--out", help="Where to write: report.html (self-contained) or report.png (rendered by "
                      "headless Chromium).")] = "report.html",
    job_queue: Annotated[Optional[list[str]], typer.Option(
        "--job-queue", help="Only this job queue (repeat for several; default: all).")] = None,
    t_from: Annotated[Optional[float], typer.Option(
        "--from", help="Start of the window, logical seconds (the facts' `at`). Default, per "
                       "job queue: its creation, or just before its first dispatch when it "
                       "idled for the first quarter of the log.")
    ] = None,
    t_to: Annotated[Optional[float], typer.Option(
        "--to", help="End of the window, logical seconds. Default: the last fact.")] = None,
) -> None:
    """Charts of usage per quota share against its limit, borrowing and preemptions.

    One chart per job queue and capacity unit: every share's own-quota usage (solid) in its
    slot of the stacked limits, what it borrowed (hatched) drawn in the slots of the shares it
    borrowed from, the service environment's capacity, and the preemptions on the time axis;
    under each chart a table of who lent to whom, in instance-seconds.
    """
    import os

    from quotasched.services.report import ReportError, ReportUsageError, write_report

    if not os.path.exists(db):
        typer.echo(f"quotasched report: no projection database at {db} (build one with "
                   "quotasched projections rebuild --db PATH --facts FACTS)", err=True)  # fmt: skip
        raise typer.Exit(EXIT_USAGE)
    from quotasched.projections import ProjectionError, ProjectionLocked, SchemaMismatch

    try:
        made = write_report(db, out, job_queue or None, t_from, t_to)
    except ProjectionLocked:
        typer.echo(f"quotasched report: {db} is held by a running projector (DuckDB allows one "
                   "writer, or readers only): report on a copy of the file", err=True)  # fmt: skip
        raise typer.Exit(EXIT_USAGE) from None
    except (ProjectionError, SchemaMismatch) as error:  # not a projection, old schema
        typer.echo(f"quotasched report: {error}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except ReportUsageError as error:
        typer.echo(f"quotasched report: {error}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except ReportError as error:
        typer.echo(f"quotasched report: {error}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except OSError as error:
        typer.echo(f"quotasched report: cannot write {out}: {error.strerror or error}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    charts = len(made.charts)
    marked = sum(len(chart.preemptions) for chart in made.charts)
    typer.echo(f"wrote {out}: {charts} chart{'s' if charts != 1 else ''}, {marked} "
               f"preemption{'s' if marked != 1 else ''} marked", err=True)  # fmt: skip
