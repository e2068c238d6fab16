"""Bytes <-> messages: one discriminated-union adapter per direction, one error type.

Decoding a line that is not a valid command never raises anything but `DecodeError`, whose
message reads like an AWS ClientException and names every problem found.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable
from typing import Any, BinaryIO

from pydantic import TypeAdapter, ValidationError

from quotasched.events.base import JOB_ID_PATTERN, JOB_ID_RULE, NAME_PATTERN, NAME_RULE
from quotasched.events.commands import (
    BOUNDED_MESSAGE_BYTES,
    COMMAND_KINDS,
    SIZE_BOUNDED,
    AnyCommand,
    Command,
)
from quotasched.events.facts import AnyFact, Fact

COMMANDS: TypeAdapter[Command] = TypeAdapter(AnyCommand)
FACTS: TypeAdapter[Fact] = TypeAdapter(AnyFact)
# The adapters' pydantic-core validators, called directly: the Python wrapper around one costs
# as much per command as validating a small one's fields, and 0.3 us of the 1.5 a small fact
# takes to decode (what a restart's fold of the tail does for every fact).
_VALIDATE_COMMAND = COMMANDS.validator.validate_json
_VALIDATE_FACT = FACTS.validator.validate_json


class DecodeError(ValueError):
    """A message that is not a valid command.

    Besides the reason it carries what the message claimed, as far as it could be read (its
    `kind`, `at` and the job, queue and share it named), and the raw text: base64 when the
    bytes are not UTF-8, so the record keeps them exactly.
    """

    def __init__(self, reason: str, raw: bytes | str):
        super().__init__(reason)
        self.reason = reason
        if isinstance(raw, bytes):
            try:
                self.raw, self.raw_encoding = raw.decode("utf-8"), None
            except UnicodeDecodeError:
                self.raw, self.raw_encoding = base64.b64encode(raw).decode(), "base64"
        else:
            self.raw, self.raw_encoding = raw, None
        claimed = _claimed(self.raw) if self.raw_encoding is None else {}
        self.kind: str | None = _text(claimed.get("kind"))
        self.job_id = _text(claimed.get("jobId"))
        self.job_queue = _text(claimed.get("jobQueue"))
        self.quota_share_name = _text(claimed.get("quotaShareName"))
        at = claimed.get("at")
        self.at = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) \
            and math.isfinite(at) and at >= 0 else None


def decode_command(data: bytes | str) -> Command:
    """Validate one wire message.  Only the camelCase names are accepted on the wire."""
    try:
        size = len(data) if isinstance(data, bytes) else 4 * len(data)  # a character: 1-4 bytes
        bounded = SIZE_BOUNDED if size <= BOUNDED_MESSAGE_BYTES else None
        return _VALIDATE_COMMAND(data, by_alias=True, by_name=False, context=bounded)
    except ValidationError as error:
        failure = DecodeError("", data)
        failure.reason = _describe(error, failure.kind, failure.raw)
        failure.args = (failure.reason,)
        raise failure from None


def decode_fact(data: bytes | str) -> Fact:
    return _VALIDATE_FACT(data)


def encode(message: Command | Fact) -> str:
    """Canonical JSON: camelCase, fields in declaration order, no whitespace variation."""
    return message.model_dump_json(by_alias=True)


def encode_bytes(message: Command | Fact) -> bytes:
    """`encode` as UTF-8 bytes, straight from pydantic-core (the writer's hot path)."""
    return message.__pydantic_serializer__.to_json(message, by_alias=True)


def write_json_lines(messages: Iterable[Command | Fact], out: BinaryIO, chunk: int = 4096) -> None:
    """Each message's canonical JSON on its own line, written `chunk` lines at a time (one
    write per chunk, not per line: `quotasched replay` and the simulator's fact log)."""
    lines: list[bytes] = []
    for message in messages:
        lines.append(encode_bytes(message))
        if len(lines) >= chunk:
            out.write(b"\n".join(lines) + b"\n")
            lines.clear()
    if lines:
        out.write(b"\n".join(lines) + b"\n")


def command_schema() -> dict[str, Any]:
    return COMMANDS.json_schema(by_alias=True)


def fact_schema() -> dict[str, Any]:
    return FACTS.json_schema(by_alias=True)


def _claimed(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value[:256] if isinstance(value, str) else None


def _describe(error: ValidationError, kind: str | None, raw: str) -> str:
    if not raw.strip():
        return "The line is empty; a command is one JSON object"
    problems = []
    for item in error.errors(include_url=False):
        if item["type"] == "union_tag_invalid":
            claimed = kind if kind is not None else item.get("ctx", {}).get("tag", "?")
            return (
                f"Unknown command kind {claimed!r}; expected one of: " + ", ".join(COMMAND_KINDS)
            )
        if item["type"] == "union_tag_not_found":
            return "The message has no 'kind' field naming the command"
        if item["type"] in ("json_invalid", "model_type", "model_attributes_type"):
            return f"The message is not a JSON object: {item['msg']}"
        location = ".".join(_short(str(part)) for part in item["loc"][1:])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "is not a field of this command"
        elif item["type"] == "string_pattern_mismatch" and item["ctx"]["pattern"] in _RULES:
            message = _RULES[item["ctx"]["pattern"]]
        problems.append(f"{location}: {message}" if location else message)
    return _short(f"Invalid {kind or 'command'}: " + "; ".join(problems), REASON_MAX_CHARS)


_RULES = {NAME_PATTERN: NAME_RULE, JOB_ID_PATTERN: JOB_ID_RULE}
"""The rule behind each pattern, said instead of pydantic's "should match pattern"."""

REASON_MAX_CHARS = 2048
"""A refusal's reason never grows with its input: a path part (a tag key, say) is cut to 40
characters and the whole reason to this, so every refusal fits one message on the bus."""


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
