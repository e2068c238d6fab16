"""Bytes <-> messages: one discriminated-union adapter per direction, one error type.

Decoding a line that is not a valid command never raises anything but `DecodeError`, whose
message reads like an AWS ClientException and names every problem found.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter, ValidationError

from events.base import NAME_PATTERN, NAME_RULE
from events.commands import COMMAND_KINDS, AnyCommand, Command
from events.facts import AnyFact, Fact

COMMANDS: TypeAdapter[Command] = TypeAdapter(AnyCommand)
FACTS: TypeAdapter[Fact] = TypeAdapter(AnyFact)


class DecodeError(ValueError):
    """A message that is not a valid command; `kind` is what it claimed to be, if anything."""

    def __init__(self, reason: str, kind: str | None, raw: str):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.raw = raw


def decode_command(data: bytes | str) -> Command:
    raw = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    try:
        return COMMANDS.validate_json(data)
    except ValidationError as error:
        kind = _claimed_kind(raw)
        raise DecodeError(_describe(error, kind), kind, raw) from None


def decode_fact(data: bytes | str) -> Fact:
    return FACTS.validate_json(data)


def encode(message: Command | Fact) -> str:
    """Canonical JSON: camelCase, fields in declaration order, no whitespace variation."""
    return message.model_dump_json(by_alias=True)


def command_schema() -> dict[str, Any]:
    return COMMANDS.json_schema(by_alias=True)


def fact_schema() -> dict[str, Any]:
    return FACTS.json_schema(by_alias=True)


def _claimed_kind(raw: str) -> str | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and isinstance(value.get("kind"), str):
        return value["kind"][:128]
    return None


def _describe(error: ValidationError, kind: str | None) -> str:
    problems = []
    for item in error.errors(include_url=False):
        if item["type"] == "union_tag_invalid":
            return (
                f"Unknown command kind {kind!r}; expected one of: " + ", ".join(COMMAND_KINDS)
            )
        if item["type"] == "union_tag_not_found":
            return "The message has no 'kind' field naming the command"
        if item["type"] in ("json_invalid", "model_type", "model_attributes_type"):
            return f"The message is not a JSON object: {item['msg']}"
        location = ".".join(str(part) for part in item["loc"][1:]) or "message"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "is not a field of this command"
        elif item["type"] == "string_pattern_mismatch" and item["ctx"]["pattern"] == NAME_PATTERN:
            message = NAME_RULE
        problems.append(f"{location}: {message}")
    return f"Invalid {kind or 'command'}: " + "; ".join(problems)
