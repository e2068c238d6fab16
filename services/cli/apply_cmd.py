"""`quotasched apply FILE`: publish a replay-format command file in order, route each job
command to its job's subject, and optionally wait for (and report) every decision."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from quotasched.services.cli.verbs import (
    EXIT_REFUSED,
    EXIT_UNDECIDED,
    EXIT_USAGE,
    PANEL_LOG,
    Failure,
    NatsUrl,
    register_verb,
)
from quotasched.services.cli.session import no_scheduler, no_streams, publish, run, session
if TYPE_CHECKING:  # imported where used: `quotasched replay` and other offline verbs load no NATS client
    from quotasched.services.client.commands import Decisions

__all__ = ["apply"]


class _Line:
    """One non-blank line of a command file, decoded (or with the reason it can't be)."""

    def __init__(self, number: int, raw: bytes):
        from quotasched.events.codec import DecodeError, decode_command

        self.number, self.raw = number, raw
        self.command, self.problem, self.kind = None, None, None
        try:
            self.command = decode_command(raw)
            self.kind = self.command.kind
        except DecodeError as error:
            self.problem, self.kind = error.reason, error.kind


def _read_lines(path: str) -> list[_Line]:
    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except OSError as error:
        raise Failure(f"quotasched apply: cannot read {path}: {error.strerror}",
                      EXIT_USAGE) from None
    return [_Line(number, line.rstrip(b"\r")) for number, line in
            enumerate(data.split(b"\n"), start=1) if line.strip()]  # fmt: skip


@register_verb("apply", PANEL_LOG)
def apply(
    file: Annotated[str, typer.Argument(
        help="Command file: JSON Lines, the format `quotasched replay` reads ('-': stdin).")],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Wait for every decision; exit 1 if any command was refused.")] = False,
    wait_timeout: Annotated[float, typer.Option(
        "--wait-timeout", min=0.1,
        help="Seconds to wait for all decisions (exit 3 after).")] = 60.0,
    keep_invalid: Annotated[bool, typer.Option(
        "--keep-invalid", help="Publish lines that are not valid commands too; the scheduler "
                               "records each as a CommandRejected, as replay does.")] = False,
    nats_url: NatsUrl = None,
) -> None:
    """Publish a command file, line by line in order, as the scheduler's input.

    Lines keep their `at`; lines without one are stamped by the scheduler.  UpdateServiceJob,
    TerminateServiceJob and ReportJobStatus lines go to their job's subject: known from a
    submission earlier in the file, else asked of the scheduler (a job it does not know is
    published anyway, and refused).  Prints one summary line.  A line that is not a valid
    command stops everything before anything is published (exit 2), unless --keep-invalid.
    --wait waits for the decisions of every line (Tick lines excepted: they decide nothing
    unless a timer fires), lists the refused ones on stderr and exits 1 if there are any.
    A line the admission gate refuses for its share's rate (a team's file over
    maxSubmissionsPerSecond) is sent again, for up to --wait-timeout, then exit 1.
    """
    try:
        lines = _read_lines(file)
    except Failure as failure:  # an unreadable file: nothing was published
        typer.echo(failure.message, err=True)
        raise typer.Exit(failure.code) from None
    invalid = [line for line in lines if line.command is None]
    if invalid and not keep_invalid:
        for line in invalid:
            typer.echo(f"{file}:{line.number}: {line.problem}", err=True)
        typer.echo(f"quotasched apply: {len(invalid)} invalid line(s); nothing was published "
                   f"(--keep-invalid publishes them to be recorded as refused)", err=True)
        raise typer.Exit(EXIT_USAGE)
    run(lambda: _apply(file, lines, wait, wait_timeout, nats_url))


async def _apply(path: str, lines: list[_Line], wait: bool, timeout: float,
                 url: str | None) -> int:  # fmt: skip
    from nats.js.errors import NotFoundError

    from quotasched.services.client.commands import Decisions

    async with session(url) as bus:
        decisions = Decisions()
        try:
            await decisions.start(bus)
        except NotFoundError:
            raise no_streams(bus.url) from None
        try:
            return await _apply_lines(bus, path, lines, wait, timeout, decisions)
        finally:
            await decisions.close()  # a pipeline's consumer on the fact log


async def _apply_lines(bus, path: str, lines: list[_Line], wait: bool, timeout: float,
                       decisions: Decisions) -> int:  # fmt: skip
    file_routes: dict[str, tuple[str, str]] = {}
    derived: list[int] = []  # seqs of submissions whose job id the scheduler derives
    published: list[tuple[_Line, int]] = []
    for line in lines:
        try:
            seq = await _publish_line(bus, line, file_routes, derived, decisions, timeout)
        except Failure as failure:
            raise Failure(f"{failure.message}\nquotasched apply: stopped at {path}:"
                          f"{line.number}; {len(published)} earlier line(s) were published"
                          f"{_seq_range(published)}, this one and the rest were not",
                          failure.code) from None  # fmt: skip
        published.append((line, seq))
        command = line.command
        if command is not None and command.kind == "SubmitServiceJob":
            if command.job_id:
                file_routes[command.job_id] = (command.job_queue, command.quota_share_name)
            else:
                derived.append(seq)
    count = len(published)
    summary = (f"applied {count} command{'' if count == 1 else 's'} from {path} to "
               f"{bus.url}{_seq_range(published)}")  # fmt: skip
    if not wait:
        typer.echo(summary)
        return 0
    awaited = [seq for line, seq in published if line.kind != "Tick"]
    undecided = await decisions.wait(awaited, timeout)
    return _report(path, published, awaited, undecided, decisions, summary, timeout)


def _seq_range(published: list[tuple[_Line, int]]) -> str:
    if not published:
        return ""
    first, last = published[0][1], published[-1][1]
    return f" (command seq {first})" if first == last else f" (command seq {first}-{last})"


def _report(path: str, published: list[tuple[_Line, int]], awaited: list[int],
            undecided: list[int], decisions: Decisions, summary: str, timeout: float) -> int:
    refused = [(line, fact) for line, seq in published for fact in decisions.facts.get(seq, [])
               if fact.kind == "CommandRejected"]  # fmt: skip
    for line, fact in refused:
        typer.echo(f"{path}:{line.number}: {fact.command_kind} refused: {fact.status_reason}",
                   err=True)  # fmt: skip
    decided = len(awaited) - len(undecided)
    typer.echo(f"{summary}; {decided} decided: {decided - len(refused)} accepted, "
               f"{len(refused)} refused")  # fmt: skip
    if undecided:
        raise Failure(f"quotasched apply: {len(undecided)} command(s) not decided within "
                      f"{timeout:g}s (first: command seq {undecided[0]}); they are stored and "
                      f"will be decided once a scheduler runs", EXIT_UNDECIDED)  # fmt: skip
    return EXIT_REFUSED if refused else 0


async def _publish_line(bus, line: _Line, file_routes: dict, derived: list[int],
                        decisions: Decisions, timeout: float) -> int:  # fmt: skip
    import re

    from quotasched.events.subjects import COMMANDS_STREAM, JOB_ID_COMMANDS, command_subject

    command = line.command
    if command is None:  # --keep-invalid: the scheduler records it as refused
        token_ok = line.kind and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", line.kind)
        kind = line.kind if token_ok else "Unknown"
        ack = await bus.js.publish(command_subject(kind), line.raw, stream=COMMANDS_STREAM)
        return ack.seq
    route = None
    if command.kind in JOB_ID_COMMANDS:
        route = file_routes.get(command.job_id) or decisions.routes.get(command.job_id)
        if route is None:
            route = await _route_of(bus, command.job_id, derived, decisions, timeout)
    return await publish(bus, line.raw, route, decisions, throttled_wait=timeout)


async def _route_of(bus, job_id: str, derived: list[int], decisions: Decisions,
                    timeout: float) -> tuple:  # fmt: skip
    """The (queue, share) of a job the file did not name: maybe one of the file's own
    submissions with a derived id (wait for those decisions), else what the scheduler knows."""
    from nats.errors import NoRespondersError

    from quotasched.services.client import ClientError

    if derived:
        await decisions.wait(derived, timeout)
        if job_id in decisions.routes:
            return decisions.routes[job_id]
    try:
        return await bus.route(job_id)
    except ClientError:
        return (None, None)  # unknown job: published anyway, so the refusal is on record
    except (NoRespondersError, TimeoutError):
        raise no_scheduler(bus.url) from None
