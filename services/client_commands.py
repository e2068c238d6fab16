"""The client's commands: turning what the caller gave into a command, waiting for the facts
the scheduler decided for it, and refusals as `ClientError`.

A command is given as a model, a dict or JSON text; it is decoded (so a bad one fails before
it is published) and published as the bytes given.  Its decision is the facts whose
`command_seq` is the command's stream sequence; the first carries a `Qm-Facts` header saying
how many there are.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from events.codec import decode_command, decode_fact
from events.facts import CommandRejected, Fact


class ClientError(Exception):
    """The scheduler refused a command or a request (AWS's ClientException)."""


def as_command(command: Any):
    if isinstance(command, (str, bytes)):
        data = command.encode() if isinstance(command, str) else command
    elif isinstance(command, dict):
        data = json.dumps(command).encode()
    else:
        data = command.model_dump_json(by_alias=True, exclude_none=True).encode()
    return decode_command(data), data


def raise_if_rejected(facts: list[Fact]) -> list[Fact]:
    for fact in facts:
        if isinstance(fact, CommandRejected):
            raise ClientError(fact.status_reason)
    return facts


async def await_decision(facts: asyncio.Queue, seq: int, timeout: float) -> list[Fact]:
    """The facts recorded for command `seq`, read from `facts` (the fact stream's messages,
    subscribed to before the command was published), within `timeout` seconds from now."""
    decided: list[Fact] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"no decision for command {seq} within {timeout}s")
        try:
            msg = await asyncio.wait_for(facts.get(), remaining)
        except (asyncio.TimeoutError, TimeoutError):
            raise TimeoutError(
                f"command {seq} was stored but no decision arrived within {timeout}s; "
                "is a scheduler running?"
            ) from None
        fact = decode_fact(msg.data)
        if fact.command_seq != seq:
            if decided:
                return decided
            continue
        decided.append(fact)
        count = int((msg.headers or {}).get("Qm-Facts", "1"))
        if len(decided) >= count:
            return decided
