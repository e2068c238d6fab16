"""The `quotasched` command line (Typer: typed options, help text and completion for free)."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from quotasched import examples_dir
from quotasched.events.codec import command_schema, decode_fact, fact_schema, write_json_lines
from quotasched.services.cli import services_cli
from quotasched.services.replay import ExpiredJobs, replay_lines
from quotasched.services.scheduler.core import State, state_document

app = typer.Typer(
    name="quotasched",
    help="AWS Batch quota management as an event-sourced scheduler.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from quotasched import __version__

        typer.echo(f"quotasched {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the installed version and exit.")] = False,
) -> None:
    """AWS Batch quota management as an event-sourced scheduler."""

EXAMPLES = examples_dir()


def _open_lines(path: str):
    if path == "-":
        return sys.stdin.buffer
    from quotasched.services.cli.progress import reading

    try:
        return reading(path, f"replaying {Path(path).name}")
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
    forgotten = ExpiredJobs()  # --state-out lists every job, those retention forgot too
    handle = _open_lines(file)
    sys.stdout.flush()
    out = sys.stdout.buffer  # bytes straight from pydantic-core: no str round trip per fact
    try:
        with handle as lines:  # a progress reader on a terminal (services/cli/progress.py)
            facts = replay_lines(lines, state)
            write_json_lines(facts if state_out is None else forgotten.noting(facts), out)
    except OSError as error:
        typer.echo(f"quotasched replay: cannot read {file}: {error}", err=True)
        raise typer.Exit(2) from None
    out.flush()
    if state_out is not None:
        state_out.write_text(json.dumps(forgotten.complete(state_document(state)), indent=2) + "\n")


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
    serve: Annotated[bool, typer.Option("--serve", help="After the story, keep the stack and its AWS Batch endpoint up until Ctrl-C.")] = False,
    executor: Annotated[str, typer.Option("--executor", autocompletion=services_cli.offer("simulated", "agent"), help="simulated, or agent: the GPU-host agent on fake GPUs 0,1,2, each job a real process on its own GPU.")] = "simulated",
) -> None:
    """The official notebook's story, live: borrow, cross-share reclaim, in-share preemption.

    Starts an embedded nats-server, the scheduler, the projector, the simulated executor and
    the AWS Batch endpoint (its URL printed as AWS_ENDPOINT_URL_BATCH=...) in a temporary
    directory, submits through the Python client and narrates the fact log as it grows.  --serve keeps it all up
    afterwards, for the real AWS CLI, boto3 or the SageMaker SDK.
    """
    console = Console()
    if executor not in ("simulated", "agent"):
        typer.echo("quotasched demo: --executor must be simulated or agent", err=True)
        raise typer.Exit(2)
    if not offline:
        import asyncio
        import logging

        from quotasched.services import logs
        from quotasched.services.demo import run_demo

        logs.configure("WARNING")
        logging.getLogger("faststream").setLevel(logging.WARNING)
        try:
            asyncio.run(run_demo(console, serve=serve, executor=executor))
        except KeyboardInterrupt:
            pass
        return
    from quotasched.services.explain.narrate import Names, sentence

    path = file or EXAMPLES / "notebook.jsonl"
    state = State()
    with _open_lines(str(path)) as handle:
        facts = list(replay_lines(handle, state))
    table = Table(title=f"Decisions for {path.name}", show_lines=False)
    table.add_column("at", justify="right")
    table.add_column("fact")
    table.add_column("what happened")
    names = Names()
    for fact in facts:
        names.see(fact)
        if fact.kind.endswith("Created") and fact.kind != "QuotaShareCreated":
            continue
        table.add_row(f"{fact.at:g}", fact.kind, sentence(fact, names))
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


# Here, not at the end: --help lists commands in the order they were added.
services_cli.register(app)  # up, scheduler, executor, projector


@app.command()
def asyncapi(
    fmt: Annotated[str, typer.Option("--format", help="yaml or json")] = "yaml",
    out: Annotated[Optional[Path], typer.Option("--out", help="Write here instead of standard output.")] = None,
    check: Annotated[bool, typer.Option("--check", help="With --out: exit 1 if the file is not up to date (writes nothing).")] = False,
) -> None:
    """Print the AsyncAPI 3.0 document of every subject and message, generated from the code.

    The committed copy is docs/asyncapi.yaml: `quotasched asyncapi --out docs/asyncapi.yaml`.
    """
    from quotasched.services.asyncapi import render

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


from quotasched.services.cli.log_cli import register; register(app)  # noqa: E402,E702  (aws verbs, apply, facts)
from quotasched.services.cli.projections_cli import register as register_projections; register_projections(app)  # noqa: E402,E702
from quotasched.services.cli.audit_cli import register as _audit; _audit(app)  # noqa: E402,E702  (audit verify, explain)
from quotasched.services.cli.report_cli import register as _report; _report(app)  # noqa: E402,E702  (report: charts)
from quotasched.services.cli.auth_cli import register as _auth; _auth(app)  # noqa: E402,E702  (auth generate)
from quotasched.services.cli.endpoint_cli import register as _endpoint; _endpoint(app)  # noqa: E402,E702  (endpoint: the AWS Batch API process)
from quotasched.services.cli.simulate_cli import register as _simulate; _simulate(app)  # noqa: E402,E702  (simulate, synth-trace)
from quotasched.services.cli.config_cli import register as _config; _config(app)  # noqa: E402,E702  (config apply, export)
from quotasched.services.cli.agent_cli import register as _agent; _agent(app)  # noqa: E402,E702  (agent: a GPU host; logs)


_ITEM = re.compile(r"^\s*(?:[-*]|\d+[.)]) ")


def reflowed(doc):
    """A docstring as help text: each paragraph's lines joined into one (rich wraps them to
    the terminal), list items and indented lines kept on lines of their own.  Without this a
    help text breaks where the source line did ("Ctrl-C stops it / all cleanly").  Anything
    but a string (None, Typer's default placeholder) is left as it is."""
    if not isinstance(doc, str):
        return doc
    paragraphs = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if not lines or _ITEM.match(line) or line.startswith("    "):
                lines.append(line.rstrip())
            else:
                lines[-1] += " " + line.strip()
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _reflow_all(typer_app: typer.Typer) -> None:
    for command in typer_app.registered_commands:
        command.help = reflowed(command.help or (command.callback.__doc__ if command.callback else None))
    for group in typer_app.registered_groups:
        group.help = reflowed(group.help)
        if group.typer_instance is not None:
            group.typer_instance.info.help = reflowed(group.typer_instance.info.help)
            _reflow_all(group.typer_instance)


_reflow_all(app)

# Below this many columns Rich's three-column option table leaves help too narrow a column
# and cuts long words (a default, an env var's name) with "…": Click's own layout wraps them.
PLAIN_HELP_BELOW = 100


def _plain_help_if_narrow(typer_app: typer.Typer) -> None:
    if shutil.get_terminal_size(fallback=(80, 24)).columns >= PLAIN_HELP_BELOW:
        return
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _plain_help_if_narrow(group.typer_instance)


def main() -> None:
    from quotasched.services.logs import LogSettingError

    dump_stacks_on_sigusr1()
    _plain_help_if_narrow(app)
    try:
        app()
    except LogSettingError as error:  # a bad QUOTASCHED_LOG_LEVEL / _FORMAT: one line, exit 2
        typer.echo(f"quotasched: {error}", err=True)
        raise SystemExit(2) from None


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` writes every thread's stack to stderr: how a stuck process (a stop
    that does not end, a loop that no longer decides) is diagnosed without stopping it."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


if __name__ == "__main__":
    main()
