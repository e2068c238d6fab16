"""`quotasched facts`: print the fact log as JSON Lines, byte for byte as `quotasched replay`
prints facts, optionally only one queue's (or share's) and following new ones."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Optional

import typer

from quotasched.services.cli.verbs import EXIT_USAGE, PANEL_LOG, NatsUrl, name_from_arn, register_verb
from quotasched.services.cli.session import no_streams, run, session


@register_verb("facts", PANEL_LOG)
def facts(
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new facts as they are recorded.")] = False,
    job_queue: Annotated[Optional[str], typer.Option(
        "--job-queue", help="Only the facts about this job queue (its shares and jobs).",
        show_default=False)] = None,  # fmt: skip
    quota_share_name: Annotated[Optional[str], typer.Option(
        "--quota-share-name", help="With --job-queue: only this share's facts.",
        show_default=False)] = None,  # fmt: skip
    nats_url: NatsUrl = None,
) -> None:
    """Print the fact log as JSON Lines, in log order, as `quotasched replay` prints facts.

    Same encoding byte for byte, so `diff` against a replay works once the bus-specific
    `at` (stamped from the stream clock) and `commandSeq` (the command stream's sequence,
    not a line number) are set aside.  Stops at the log's end unless --follow.
    """
    if quota_share_name and not job_queue:
        typer.echo("quotasched facts: --quota-share-name goes with --job-queue", err=True)
        raise typer.Exit(EXIT_USAGE)
    run(lambda: _print_facts(nats_url, follow, job_queue, quota_share_name))


async def _print_facts(url: str | None, follow: bool, job_queue: str | None,
                       share: str | None) -> int | None:  # fmt: skip
    """Copies the log to stdout; Ctrl-C (or SIGTERM) ends a --follow cleanly, exit 130."""
    import signal

    from quotasched.events.subjects import facts_filter

    subject = facts_filter(name_from_arn(job_queue) if job_queue else None, share)
    async with session(url, reconnect_forever=follow) as bus:
        reader = asyncio.create_task(_copy_facts(bus, subject, follow))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, reader.cancel)
        try:
            await reader
        except asyncio.CancelledError:
            return 130
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            sys.stdout.flush()
    return None


async def _copy_facts(bus, subject: str, follow: bool) -> None:
    from contextlib import aclosing

    from nats.js.errors import NotFoundError

    from quotasched.services.nats.log import read_log

    out = sys.stdout
    try:
        # aclosing: the consumer is removed here, while the connection is still open
        async with aclosing(read_log(bus.js, subject, follow=follow)) as log:
            async for _, data, _ in log:
                out.write(_canonical(data) + "\n")
                if follow:
                    out.flush()
    except NotFoundError:
        raise no_streams(bus.url) from None


def _canonical(data: bytes) -> str:
    """The fact as replay prints it (decode, then the one encoder); a fact this version can't
    read is printed as stored, with a warning."""
    from pydantic import ValidationError

    from quotasched.events.codec import decode_fact, encode

    try:
        return encode(decode_fact(data))
    except ValidationError as error:
        typer.echo(f"quotasched facts: a fact this version can't read: {error}", err=True)
        return data.decode("utf-8", errors="replace")
