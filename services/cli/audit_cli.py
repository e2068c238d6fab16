"""`quotasched audit verify` and `quotasched explain JOB_ID`: the audit tools of the fact log.

    quotasched audit verify --commands examples/notebook.jsonl --facts notebook.facts.jsonl
    quotasched audit verify --nats-url nats://127.0.0.1:4222
    quotasched explain med --facts notebook.facts.jsonl
    quotasched explain med --commands examples/notebook.jsonl      (replays, then explains)
    quotasched explain med --nats-url nats://127.0.0.1:4222 --output json

Exit status: 0 done (verify: every recorded fact reproduced); 1 verify found a divergence, or
explain found no fact about the job; 2 bad usage, unreadable file, NATS unreachable.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Annotated, Optional

import typer

EXIT_DIVERGED, EXIT_USAGE = 1, 2
PANEL = "Command files and the fact log"

audit_app = typer.Typer(
    name="audit",
    help="Audit the fact log: re-run the decision core over the recorded commands.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

NatsUrl = Annotated[Optional[str], typer.Option(
    "--nats-url", envvar="QUOTASCHED_NATS_URL", show_default=False,
    help="Read the log from this NATS server (or cluster).")]  # fmt: skip
Output = Annotated[str, typer.Option("--output", help="text or json.")]


def register(app: typer.Typer) -> None:
    """Add `audit` (with `verify`) and `explain` to the `quotasched` app."""
    app.add_typer(audit_app, name="audit", rich_help_panel=PANEL)
    app.command("explain", rich_help_panel=PANEL, help=_prose(explain.__doc__))(explain)


def _prose(doc: str | None) -> str:
    """A docstring as help text, each paragraph on one line (Typer keeps line breaks)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _check_output(output: str, command: str) -> str:
    if output not in ("text", "json"):
        raise _fail(f"quotasched {command}: --output must be text or json")
    return output


def _explicit(ctx: typer.Context, name: str) -> bool:
    """Was the option given on the command line (not taken from the environment)?"""
    source = ctx.get_parameter_source(name)
    return getattr(source, "name", None) == "COMMANDLINE"


def _readable(path: str, command: str) -> str:
    try:
        with open(path, "rb"):
            return path
    except OSError as error:
        raise _fail(f"quotasched {command}: cannot read {path}: {error.strerror}") from None


def verify(
    ctx: typer.Context,
    commands: Annotated[Optional[str], typer.Option(
        "--commands", show_default=False,
        help="A replay command file (JSON Lines; line number = commandSeq).")] = None,  # fmt: skip
    facts: Annotated[Optional[str], typer.Option(
        "--facts", show_default=False,
        help="The fact log recorded for it (as `quotasched replay` or `facts` print it).")] = None,  # fmt: skip
    nats_url: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Prove the decision core reproduces every recorded fact, byte for byte.

    Re-runs a fresh core over every recorded command, accepted or refused, in order (from
    --commands, or from the live command stream QM_COMMANDS with each message's sequence,
    subject and timestamp) and compares each fact it produces with the recorded one (from
    --facts, or QM_FACTS).  Prints a summary and exits 0 when everything matches; prints the
    first divergence (the command, the recorded fact and the recomputed one, and every fact
    of that command side by side) and exits 1 otherwise.  On the bus, commands the scheduler
    has not decided yet are reported as such, not as a divergence.
    """
    _check_output(output, "audit verify")
    if (commands is None) != (facts is None):
        raise _fail("quotasched audit verify: --commands and --facts go together")
    if commands is not None and nats_url is not None and _explicit(ctx, "nats_url"):
        raise _fail("quotasched audit verify: give either --commands/--facts or --nats-url")
    source, results = _audit_results(commands, facts, nats_url)
    if not _echo_results(results, source, output):
        raise typer.Exit(EXIT_DIVERGED)


def _audit_results(commands: str | None, facts: str | None, nats_url: str | None) -> tuple:
    """(the source in words, the results): one from files, one per partition from the bus."""
    from quotasched.services import audit

    if commands is not None:
        source = f"files: commands {commands}, facts {facts}"
        try:
            result = audit.verify_files(_readable(commands, "audit verify"),
                                        _readable(facts, "audit verify"))  # fmt: skip
        except OSError as error:
            raise _fail(f"quotasched audit verify: {error}") from None
        return source, [result]
    if nats_url is not None:
        source = f"bus: {nats_url}"
        try:
            results = audit.verify_bus(nats_url)
        except audit.BusUnavailable as error:
            raise _fail(f"quotasched audit verify: {error}") from None
        except Exception as error:  # e.g. the server went away mid-read
            raise _fail(f"quotasched audit verify: reading the log from {nats_url} failed: "
                        f"{error or type(error).__name__}") from None
        return source, results
    raise _fail("quotasched audit verify: give --commands FILE --facts FILE, or --nats-url "
                "URL (or set QUOTASCHED_NATS_URL)")  # fmt: skip


def _echo_results(results: list, source: str, output: str) -> bool:
    """Print the report (text or JSON); True when every result is OK."""
    from quotasched.services.audit import render

    if len(results) == 1:
        result = results[0]
        if output == "json":
            typer.echo(json.dumps({"source": source, **result.document()}, indent=2))
        else:
            typer.echo(render(result, source))
        return result.ok
    # a log written by a scheduling partition per job queue: each audited on its own
    ok = all(result.ok for result in results)
    if output == "json":
        typer.echo(json.dumps({"source": source, "ok": ok,
                               "partitions": [r.document() for r in results]}, indent=2))  # fmt: skip
    else:
        typer.echo("\n\n".join(render(r, f"{source}, partition {r.partition}")
                               for r in results))  # fmt: skip
    return ok


def explain(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job to explain.", show_default=False)],
    facts: Annotated[Optional[str], typer.Option(
        "--facts", show_default=False,
        help="A fact log (JSON Lines, as `quotasched replay` or `facts` print it).")] = None,  # fmt: skip
    commands: Annotated[Optional[str], typer.Option(
        "--commands", show_default=False,
        help="A replay command file: replayed first, then explained.")] = None,  # fmt: skip
    nats_url: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Tell why a job waited, ran, was preempted and ended, in sentences backed by the facts.

    Folds the fact log with the core's own evolve, command by command: what happened to the
    job (submitted, dispatched and what it borrowed, preempted by whom under which rule with
    every share's usage and limit right before and why it was the victim, requeued, failed,
    finished) and, whenever the reason changes, why it waited (behind a higher-priority or
    earlier job or a blocked head, its share at its limit or borrow ceiling, no idle lendable
    capacity in the other shares, the service environment full or disabled).  Each sentence
    cites the commandSeq and `at` of its facts; --output json gives them as a list of
    {at, commandSeq, kind, sentence}.
    """
    from quotasched.services import audit
    from quotasched.services.explain import (
        InconsistentLog, UnreadableFact, ids_named, render, story_of,
    )  # fmt: skip
    from quotasched.services.explain import explain as tell

    _check_output(output, "explain")
    given = [name for name, value in (("--facts", facts), ("--commands", commands)) if value]
    if nats_url is not None and _explicit(ctx, "nats_url"):
        given.append("--nats-url")
    if len(given) > 1:
        raise _fail(f"quotasched explain: give one of --facts, --commands, --nats-url "
                    f"(got {', '.join(given)})")  # fmt: skip
    if facts is None and commands is None and nats_url is None:
        raise _fail("quotasched explain: give --facts FILE, --commands FILE or --nats-url "
                    "URL (or set QUOTASCHED_NATS_URL)")  # fmt: skip

    def job_story(job: str) -> list:
        from quotasched.services.cli.progress import reading

        if facts is not None:
            with reading(_readable(facts, "explain"), f"reading {facts}") as handle:
                return story_of(job, handle, numbered=True)
        if commands is not None:
            from quotasched.services.replay import replay_lines

            with reading(_readable(commands, "explain"), f"replaying {commands}") as handle:
                return tell(replay_lines(handle), job)
        with audit.BusReader(nats_url, commands=False) as bus:
            return story_of(job, (record.text for record in bus.facts()))

    def jobs_named(name: str) -> list[str]:
        if facts is not None:
            with open(_readable(facts, "explain"), "rb") as handle:
                return ids_named(name, handle)
        if commands is not None:
            from quotasched.events.codec import encode
            from quotasched.services.replay import replay_lines

            with open(_readable(commands, "explain"), "rb") as handle:
                return ids_named(name, (encode(fact) for fact in replay_lines(handle)))
        with audit.BusReader(nats_url, commands=False) as bus:
            return ids_named(name, (record.text for record in bus.facts()))

    try:
        entries = job_story(job_id)
        if not entries:  # not a job id: perhaps a job name (which may name several jobs)
            named = jobs_named(job_id)
            if len(named) > 1:
                raise _fail(f"quotasched explain: job name {job_id} names {len(named)} jobs: "
                            f"{', '.join(named)}; give one job id", EXIT_DIVERGED)  # fmt: skip
            if named:
                typer.echo(f"(job name {job_id} is job {named[0]})", err=True)
                job_id, entries = named[0], job_story(named[0])
    except (audit.BusUnavailable, UnreadableFact, InconsistentLog) as error:
        raise _fail(f"quotasched explain: {error}") from None
    except OSError as error:
        raise _fail(f"quotasched explain: {error}") from None
    if not entries:
        raise _fail(f"quotasched explain: no fact names job {job_id}", EXIT_DIVERGED)
    if output == "json":
        typer.echo(json.dumps([entry.document() for entry in entries], indent=2))
    else:
        typer.echo(render(entries, job_id))
    sys.stdout.flush()


audit_app.command("verify", help=_prose(verify.__doc__))(verify)
