"""Running an `aws batch` verb against the scheduler: the NATS connection, asking, local checks,
publishing and waiting for decisions, and turning every failure into the verbs' exit status
(1 refused, 2 nothing reached the scheduler, 3 stored but undecided; see `services.cli.log_cli`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import typer

from quotasched.services.cli.verbs import EXIT_REFUSED, EXIT_UNDECIDED, EXIT_USAGE, Failure, Output
from quotasched.services.cli.output import emit
from quotasched.services.cli.shorthand import ShorthandError


def run(work: Callable[[], Awaitable[int | None]]) -> None:
    from nats.errors import Error as NatsError

    try:
        code = asyncio.run(work())
    except NatsError as error:  # e.g. the server went away mid-command
        typer.echo(f"quotasched: NATS error: {error or type(error).__name__}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except Failure as failure:
        typer.echo(failure.message, err=True)
        raise typer.Exit(failure.code) from None
    except ShorthandError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `quotasched facts | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None
    if code:
        raise typer.Exit(code)


@asynccontextmanager
async def session(url: str | None, reconnect_forever: bool = False):
    """A connected `Bus` that gives up at once when the server can't be reached (the
    services' own connection retries forever, which a command line must not)."""
    import nats

    from quotasched.services.nats.credentials import connect_options
    from quotasched.services.nats.bus import error_reason
    from quotasched.services.client import Bus

    bus = Bus(url, name="quotasched-cli")
    problems: list[BaseException] = []

    async def remember(error: BaseException) -> None:
        problems.append(error)

    try:
        bus.nc = await nats.connect(bus.url, name=bus.name, connect_timeout=3,
                                    max_reconnect_attempts=1, reconnect_time_wait=0.2,
                                    error_cb=remember, **connect_options())  # fmt: skip
    except Exception as error:
        cause = problems[-1] if problems else error
        raise Failure(f"quotasched: cannot reach the NATS server at {bus.url}: "
                      f"{error_reason(cause)}", EXIT_USAGE) from None  # fmt: skip
    if reconnect_forever:
        bus.nc.options["max_reconnect_attempts"] = -1
    bus.js = bus.nc.jetstream()
    try:
        yield bus
    finally:
        try:
            await asyncio.wait_for(bus.nc.close(), 5)
        except Exception:
            pass


def _aws_error(operation: str, message: str) -> str:
    return f"An error occurred (ClientException) when calling the {operation} operation: {message}"


def no_scheduler(url: str) -> Failure:
    return Failure(f"quotasched: no scheduler answered on {url}; start one with "
                   f"`quotasched scheduler --nats-url {url}` (or `quotasched up`)", EXIT_USAGE)


def no_streams(url: str) -> Failure:
    return Failure(f"quotasched: the NATS server at {url} has no quotasched streams yet; "
                   f"start a scheduler against it once (`quotasched scheduler --nats-url {url}`)",
                   EXIT_USAGE)  # fmt: skip


async def ask(bus, operation: str, verb: str, **params: Any) -> dict[str, Any]:
    from nats.errors import NoRespondersError

    from quotasched.services.client import ClientError

    try:
        return await bus.request(verb, **{k: v for k, v in params.items() if v is not None})
    except ClientError as error:
        raise Failure(_aws_error(operation, str(error)), EXIT_REFUSED) from None
    except (NoRespondersError, TimeoutError):
        raise no_scheduler(bus.url) from None


def checked(operation: str, command: dict[str, Any]) -> dict[str, Any]:
    """The command without unset fields, refused here (exit 2) when the contract would."""
    from quotasched.events.codec import DecodeError, decode_command

    command = {key: value for key, value in command.items() if value is not None}
    try:
        decode_command(json.dumps(command))
    except DecodeError as error:
        raise Failure(f"Parameter validation failed for {operation}: {error.reason}",
                      EXIT_USAGE) from None  # fmt: skip
    return command


THROTTLED_FIRST_WAIT_S, THROTTLED_MOST_WAIT_S = 0.1, 1.0  # sending again after a gate's 429


async def publish(bus, command: dict[str, Any], route: tuple | None = None,
                  decisions=None, throttled_wait: float = 0.0) -> int:  # fmt: skip
    """Publishes (`decisions`: following its facts from before, `services.client.Bus.publish`).
    `throttled_wait`: for that many seconds, a command the admission gate refuses for its
    share's rate is sent again (after 0.1 s, doubling to 1 s), as the AWS SDKs retry a 429."""
    from nats.js.errors import NoStreamResponseError, NotFoundError

    from quotasched.services.client import ClientError, GateRefused

    loop = asyncio.get_running_loop()
    end, pause = loop.time() + throttled_wait, THROTTLED_FIRST_WAIT_S
    try:
        while True:
            try:
                return await bus.publish(command, route, decisions)
            except GateRefused as error:
                if not error.throttled or loop.time() + pause > end:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, THROTTLED_MOST_WAIT_S)
    except GateRefused as error:  # over its share's limits: nothing stored
        raise Failure(f"quotasched: refused at the admission gate: {error}", EXIT_REFUSED) from None
    except ClientError as error:  # a pipeline's credentials could not follow its facts
        raise Failure(f"quotasched: {error}", EXIT_USAGE) from None
    except (NoStreamResponseError, NotFoundError):
        raise no_streams(bus.url) from None
    except TimeoutError:
        raise Failure(f"quotasched: JetStream at {bus.url} did not acknowledge the command in "
                      f"time; it may or may not be stored (see `quotasched facts`)",
                      EXIT_UNDECIDED) from None  # fmt: skip


async def decide(bus, operation: str, command: dict[str, Any], timeout: float,
                 route: tuple | None = None) -> list:  # fmt: skip
    """Publish and wait for the decision; a refusal is a Failure (exit 1)."""
    from nats.js.errors import NotFoundError

    from quotasched.events.facts import CommandRejected
    from quotasched.services.client import ClientError

    try:
        facts = await bus.submit_and_wait(command, route, timeout=timeout)
    except NotFoundError:
        raise no_streams(bus.url) from None
    except ClientError as error:  # a pipeline's credentials could not follow its facts
        raise Failure(f"quotasched: {operation}: {error}", EXIT_USAGE) from None
    except TimeoutError as error:
        reason = str(error) or f"no decision within {timeout:g}s"
        raise Failure(f"quotasched: {operation}: {reason}; the command "
                      f"is stored and will be decided once a scheduler runs (see `quotasched "
                      f"facts`)", EXIT_UNDECIDED) from None  # fmt: skip
    for fact in facts:
        if isinstance(fact, CommandRejected):
            raise Failure(_aws_error(operation, fact.status_reason), EXIT_REFUSED)
    return facts


def fact_documents(facts: list) -> list[dict[str, Any]]:
    from quotasched.events.codec import encode

    return [json.loads(encode(fact)) for fact in facts]


async def write(url: str | None, operation: str, build: Callable[[], tuple[dict, dict]],
                wait: bool, timeout: float, output: Output) -> None:  # fmt: skip
    """The shape of the configuration verbs: build (parsing shorthand), check, publish (and
    wait), print.  `build` returns the command and the AWS-shaped response."""
    command, response = build()
    command = checked(operation, command)
    async with session(url) as bus:
        response = await send(bus, operation, command, response, wait, timeout)
    emit(response, output)


async def send(bus, operation: str, command: dict[str, Any], response: dict[str, Any],
               wait: bool, timeout: float, route: tuple | None = None) -> dict[str, Any]:
    """Publishes; the response gains `commandSeq`, and with `wait` the decision's facts."""
    if not wait:
        return {**response, "commandSeq": await publish(bus, command, route)}
    facts = await decide(bus, operation, command, timeout, route)
    return {**response, "commandSeq": facts[0].command_seq, "facts": fact_documents(facts)}
