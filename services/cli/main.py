"""The `quotasched` command line (Typer: typed options, help text and completion for free)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from events.base import NAME_PATTERN, NAME_RULE
from events.codec import command_schema, decode_fact, fact_schema
from services.replay import replay_lines
from services.scheduler.core import State, state_document

app = typer.Typer(
    name="quotasched",
    help="AWS Batch quota management as an event-sourced scheduler.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _open_lines(path: str):
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as error:
        typer.echo(f"quotasched replay: cannot read {path}: {error.strerror}", err=True)
        raise typer.Exit(2) from None


@app.command()
def replay(
    file: Annotated[str, typer.Argument(help="Command file, JSON Lines ('-' for standard input).")],
    state_out: Annotated[
        Optional[Path], typer.Option("--state-out", help="Write the final state as JSON here.")
    ] = None,
) -> None:
    """Run a command file through the decision core; print every fact as JSON Lines.

    Exits 0 once the file was read to the end, whatever the commands said: a line that is not a
    valid command becomes a CommandRejected fact.  The output is byte-identical on every run.
    """
    state = State()
    handle = _open_lines(file)
    out = sys.stdout
    try:
        with handle:
            buffer: list[str] = []
            for fact in replay_lines(handle, state):
                buffer.append(fact.model_dump_json(by_alias=True))
                if len(buffer) >= 4096:
                    out.write("\n".join(buffer) + "\n")
                    buffer.clear()
            if buffer:
                out.write("\n".join(buffer) + "\n")
    except OSError as error:
        typer.echo(f"quotasched replay: cannot read {file}: {error}", err=True)
        raise typer.Exit(2) from None
    out.flush()
    if state_out is not None:
        state_out.write_text(json.dumps(state_document(state), indent=2) + "\n")


@app.command()
def schema(
    which: Annotated[
        str, typer.Option("--which", help="commands, facts or all", show_default=True)
    ] = "all",
) -> None:
    """Print the JSON Schema of the messages (the public contract)."""
    schemas = {"commands": command_schema, "facts": fact_schema}
    if which not in (*schemas, "all"):
        typer.echo("quotasched schema: --which must be commands, facts or all", err=True)
        raise typer.Exit(2)
    chosen = schemas if which == "all" else {which: schemas[which]}
    typer.echo(json.dumps({name: build() for name, build in chosen.items()}, indent=2))


@app.command()
def demo(
    offline: Annotated[bool, typer.Option("--offline", help="Narrate a replay instead of running the live stack.")] = False,
    file: Annotated[
        Optional[Path], typer.Option(help="With --offline: command file to narrate (default: the notebook story).")
    ] = None,
) -> None:
    """The official notebook's story, live: borrow, cross-share reclaim, in-share preemption.

    Starts an embedded nats-server, the scheduler and the simulated executor in a temporary
    directory, submits through the Python client and narrates the fact log as it grows.
    """
    console = Console()
    if not offline:
        import asyncio
        import logging

        from services import logs
        from services.demo import run_demo

        logs.configure("WARNING")
        logging.getLogger("faststream").setLevel(logging.WARNING)
        asyncio.run(run_demo(console))
        return
    from services.cli.narrate import sentence

    path = file or EXAMPLES / "notebook.jsonl"
    state = State()
    with _open_lines(str(path)) as handle:
        facts = list(replay_lines(handle, state))
    table = Table(title=f"Decisions for {path.name}", show_lines=False)
    table.add_column("at", justify="right")
    table.add_column("fact")
    table.add_column("what happened")
    for fact in facts:
        if fact.kind.endswith("Created") and fact.kind != "QuotaShareCreated":
            continue
        table.add_row(f"{fact.at:g}", fact.kind, sentence(fact))
    console.print(table)
    _print_usage(console, state)


def _print_usage(console: Console, state: State) -> None:
    document = state_document(state)
    for queue_name, queue in document["queues"].items():
        table = Table(title=f"Usage in job queue {queue_name}")
        table.add_column("quota share")
        table.add_column("strategy")
        table.add_column("limit")
        table.add_column("in use")
        table.add_column("jobs")
        shares = state.queues[queue_name].shares
        for name, usage in queue["quotaShares"].items():
            share = shares[name]
            jobs = ", ".join(f"{job_id} {job['status']}" for job_id, job in document["jobs"].items()
                             if job["quotaShareName"] == name)  # fmt: skip
            table.add_row(
                name, share.strategy.value,
                ", ".join(f"{n} {u}" for u, n in share.limits.items()),
                ", ".join(f"{n} {u}" for u, n in usage.items()), jobs,
            )  # fmt: skip
        total = ", ".join(f"{n} {u}" for u, n in queue["totalCapacityUsage"].items())
        console.print(table)
        console.print(f"Total in use: {total}")


NatsUrl = Annotated[
    Optional[str],
    typer.Option("--nats-url", envvar="QUOTASCHED_NATS_URL",
                 help="NATS server or cluster to use (default: start an embedded one)."),
]


MetricsPort = Annotated[
    Optional[int],
    typer.Option("--metrics-port", envvar="QUOTASCHED_METRICS_PORT", min=0, max=65535,
                 help="Serve GET /metrics (Prometheus) and /healthz on this port (0: any free "
                      "port; default: off; host: QUOTASCHED_METRICS_HOST, 127.0.0.1)."),
]


def _settings(nats_url: Optional[str], **values) -> "Settings":
    from services.settings import Settings

    return Settings(nats_url=nats_url, **{k: v for k, v in values.items() if v is not None})


@app.command()
def up(
    nats_url: NatsUrl = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the embedded server keeps its streams.")] = Path(".quotasched"),
    port: Annotated[Optional[int], typer.Option("--port", help="Port of the embedded server (default: a free one).")] = None,
    executor: Annotated[str, typer.Option("--executor", help="simulated, process or none")] = "simulated",
    speed: Annotated[float, typer.Option("--speed", help="Simulated executor: time speed-up factor.")] = 1.0,
    db: Annotated[Optional[Path], typer.Option("--db", help="The projector's DuckDB file (default: <data-dir>/quotasched.duckdb).")] = None,
    no_projector: Annotated[bool, typer.Option("--no-projector", help="Do not run the projector.")] = False,
    metrics_port: MetricsPort = None,
) -> None:
    """Start everything: nats-server (unless --nats-url), the scheduler, the projector and an
    executor.

    The first line printed is the NATS URL to point the CLI and clients at.  Ctrl-C stops it
    all cleanly; starting again on the same --data-dir resumes where it stopped.  The projector
    keeps --db up to date with the fact log and answers queries over NATS (qm.proj.*); while it
    runs, no other process can open that file.
    """
    import asyncio

    from services import logs
    from services.runtime import serve

    if executor not in ("simulated", "process", "none"):
        typer.echo("quotasched up: --executor must be simulated, process or none", err=True)
        raise typer.Exit(2)
    logs.configure()
    settings = _settings(nats_url, data_dir=str(data_dir), metrics_port=metrics_port)
    projector_db = None if no_projector else str(db if db is not None else data_dir / "quotasched.duckdb")
    try:
        code = asyncio.run(serve(settings, port=port, executor=executor, speed=speed,
                                 announce=lambda url: print(url, flush=True),
                                 projector_db=projector_db))  # fmt: skip
    except Exception as error:
        from projections.schema import SchemaMismatch
        from projections.store import ProjectionError
        from services.projector.service import ProjectorError

        if not isinstance(error, (ProjectorError, ProjectionError, SchemaMismatch)):
            raise
        typer.echo(f"quotasched up: the projector cannot start: {error}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def scheduler(
    nats_url: NatsUrl = None,
    partition: Annotated[str, typer.Option(help="Name of the single partition (its lease key).")] = "main",
    job_queue: Annotated[Optional[list[str]], typer.Option(
        "--job-queue", envvar="QUOTASCHED_JOB_QUEUES",
        help="Run one scheduling partition per job queue: lead (or stand by for) each queue "
             "named, plus the fleet-wide configuration. Repeat it, or give '*' for every job "
             "queue, as the queues are created. Without it, one partition decides for every "
             "queue.",
        show_default=False)] = None,
    metrics_port: MetricsPort = None,
) -> None:
    """Run one scheduler instance against a NATS server; a second one is a hot standby."""
    import asyncio

    from services import logs
    from services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched scheduler: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    async def run() -> None:
        stack = Stack(_settings(nats_url, partition=partition, metrics_port=metrics_port),
                      executor="none", scheduler=False)  # fmt: skip
        async with stack:
            from services.bus import connect

            nc = await connect(nats_url, "quotasched-scheduler")
            stop_on_signals(stack.stop)
            await run_partitions(nc, stack.settings, queues, stack.expose, stack.stop)
            await nc.close()

    from services.scheduler.process import EVERY_QUEUE, run_partitions

    queues = [name for value in job_queue or [] for name in value.replace(",", " ").split()]
    bad = [name for name in queues if name != EVERY_QUEUE and not re.match(NAME_PATTERN, name)]
    if bad:
        typer.echo(f"quotasched scheduler: job queue name {bad[0]!r} {NAME_RULE}", err=True)
        raise typer.Exit(2)
    try:
        asyncio.run(run())
    except Exception as error:
        from services.scheduler.mode import ModeConflict

        if not isinstance(error, ModeConflict):
            raise
        typer.echo(f"quotasched scheduler: {error}", err=True)
        raise typer.Exit(2) from None



@app.command("executor")
def executor_command(
    nats_url: NatsUrl = None,
    kind: Annotated[str, typer.Option("--kind", help="simulated or process")] = "simulated",
    speed: Annotated[float, typer.Option(help="Simulated executor: time speed-up factor.")] = 1.0,
    name: Annotated[Optional[str], typer.Option(
        "--name", help="The executor's name: its durable consumer is executor-NAME (default: "
                       "the kind). Run one process per name.", show_default=False)] = None,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", envvar="QUOTASCHED_EXECUTOR_STATE_DIR",
        help="Where the executor keeps the attempts it runs (executor-NAME.json), so that "
             "after a crash the next start stops their processes and reports them FAILED.")
    ] = Path(".quotasched"),
) -> None:
    """Run an executor: it starts dispatched jobs and reports their status.

    On a shutdown (SIGTERM, Ctrl-C) it stops the attempts it runs and reports them FAILED, so
    the scheduler frees their capacity and each job's retryStrategy decides what happens next.
    After a crash (SIGKILL, a lost host) the next executor started with the same --name and
    --state-dir does the same for the attempts the crashed one was running.
    """
    import asyncio

    from services import logs
    from services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched executor: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    async def run() -> None:
        async with Stack(_settings(nats_url), executor=kind, speed=speed, scheduler=False,
                         executor_name=name, executor_state_dir=str(state_dir)) as stack:
            stop_on_signals(stack.stop)
            await stack.stop.wait()

    asyncio.run(run())


@app.command("projector")
def projector_command(
    nats_url: NatsUrl = None,
    db: Annotated[Path, typer.Option("--db", envvar="QUOTASCHED_PROJECTION_DB", help="The DuckDB file to keep up to date (created when new).")] = Path(".quotasched/quotasched.duckdb"),
    metrics_port: MetricsPort = None,
) -> None:
    """Run the projector: apply the fact log to a DuckDB file and answer queries over NATS.

    It resumes from the last fact the file applied.  It is the only process that opens the
    file: other processes ask it (qm.proj.sql, qm.proj.describe-service-job, qm.proj.position,
    ...).  Tuning: QUOTASCHED_PROJECTOR_MAX_BATCH, QUOTASCHED_PROJECTOR_MAX_WAIT_MS.

    Exit status: 0 stopped by a signal; 1 a fact could not be applied (the log says which; the
    file stops right before it); 2 NATS unreachable, the file is in use or is not a
    projection of this log.
    """
    import asyncio

    from projections.schema import SchemaMismatch
    from projections.store import ProjectionError
    from services import logs
    from services.bus import Unreachable
    from services.projector.service import ProjectorError, ProjectorHalted
    from services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched projector: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    async def run() -> BaseException | None:
        async with Stack(_settings(nats_url, metrics_port=metrics_port), executor="none",
                         scheduler=False, projector_db=str(db),
                         projector_required=True) as stack:  # fmt: skip
            stop_on_signals(stack.stop)
            await stack.stop.wait()
        return stack.failed

    try:
        failed = asyncio.run(run())
    except (Unreachable, ProjectorError, ProjectionError, SchemaMismatch) as error:
        typer.echo(f"quotasched projector: {error}", err=True)
        raise typer.Exit(2) from None
    if failed is not None:
        typer.echo(f"quotasched projector: {failed}", err=True)
        raise typer.Exit(1 if isinstance(failed, ProjectorHalted) else 2)


@app.command()
def asyncapi(
    fmt: Annotated[str, typer.Option("--format", help="yaml or json")] = "yaml",
    out: Annotated[Optional[Path], typer.Option("--out", help="Write here instead of standard output.")] = None,
    check: Annotated[bool, typer.Option("--check", help="With --out: exit 1 if the file is not up to date (writes nothing).")] = False,
) -> None:
    """Print the AsyncAPI 3.0 document of every subject and message, generated from the code.

    The committed copy is docs/asyncapi.yaml: `quotasched asyncapi --out docs/asyncapi.yaml`.
    """
    from services.asyncapi import render

    if fmt not in ("yaml", "json"):
        typer.echo("quotasched asyncapi: --format must be yaml or json", err=True)
        raise typer.Exit(2)
    text = render(fmt)
    if out is None:
        if check:
            typer.echo("quotasched asyncapi: --check needs --out FILE", err=True)
            raise typer.Exit(2)
        sys.stdout.write(text)
    elif check:
        current = out.read_text() if out.exists() else None
        if current != text:
            typer.echo(f"quotasched asyncapi: {out} is out of date; regenerate it with "
                       f"`quotasched asyncapi --format {fmt} --out {out}`", err=True)  # fmt: skip
            raise typer.Exit(1)
    else:
        out.write_text(text)


@app.command("facts-check", hidden=True)
def facts_check(file: Path) -> None:
    """Validate a fact log (JSON Lines) against the fact schema."""
    for number, line in enumerate(file.read_bytes().splitlines(), start=1):
        if line.strip():
            decode_fact(line)
    typer.echo("ok")


from services.cli.aws import register; register(app)  # noqa: E402,E702  (aws verbs, apply, facts)
from services.cli.projections_cli import register as register_projections; register_projections(app)  # noqa: E402,E702
from services.cli.audit_cli import register as _audit; _audit(app)  # noqa: E402,E702  (audit verify, explain)
from services.cli.report_cli import register as _report; _report(app)  # noqa: E402,E702  (report: charts)
from services.cli.auth_cli import register as _auth; _auth(app)  # noqa: E402,E702  (auth generate)
from services.cli.simulate_cli import register as _simulate; _simulate(app)  # noqa: E402,E702  (simulate, synth-trace)
from services.cli.config_cli import register as _config; _config(app)  # noqa: E402,E702  (config apply, export)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
