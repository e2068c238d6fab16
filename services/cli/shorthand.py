"""The AWS CLI's parameter syntax: shorthand, JSON and `file://`, typed by the API's shapes.

    --capacity-limits capacityUnit=ml.g5.xlarge,maxCapacity=3      shorthand, one structure
    --capacity-limits a=1,b=2 a=3,b=4                              a list: one value per item
    --filters name=JOB_NAME,values=train-1,train-2                 `values` becomes a list
    --filters '[{"name": "QUOTA_SHARE_NAME", "values": ["qs1"]}]'  JSON, taken as written
    --service-request-payload file://payload.json                  the file's text, then as above

Shorthand carries only strings; the shape of the parameter (from the AWS API model) says which
members are integers, lists, nested structures, so `maxCapacity=3` becomes `3` and an unknown
key is refused by name.  JSON is never converted: it means what it says, like in the AWS CLI.

Pure: no I/O except reading `file://` paths, and every problem is a `ShorthandError` whose
message names the parameter and shows where the text went wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union


class ShorthandError(ValueError):
    """A parameter that can't be read; the CLI prints the message and exits 2."""


# -- shapes (the parts of the AWS Batch API model our options use) --------------------------


@dataclass(frozen=True)
class Scalar:
    kind: str  # "string", "integer" or "boolean"


@dataclass(frozen=True)
class Structure:
    members: dict[str, Shape]


@dataclass(frozen=True)
class ListOf:
    member: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape = field(default_factory=lambda: STRING)


Shape = Union[Scalar, Structure, ListOf, MapOf]

STRING, INTEGER, BOOLEAN = Scalar("string"), Scalar("integer"), Scalar("boolean")

CAPACITY_LIMITS = ListOf(Structure({"capacityUnit": STRING, "maxCapacity": INTEGER}))
CAPACITY_USAGE = ListOf(Structure({"capacityUnit": STRING, "quantity": INTEGER}))
SHAPES: dict[str, Shape] = {
    "capacityLimits": CAPACITY_LIMITS,
    "capacityUsage": CAPACITY_USAGE,
    "quotaSharePolicy": Structure({"idleResourceAssignmentStrategy": STRING}),
    "serviceEnvironmentOrder": ListOf(Structure({"order": INTEGER, "serviceEnvironment": STRING})),
    "jobStateTimeLimitActions": ListOf(Structure({
        "reason": STRING, "state": STRING, "maxTimeSeconds": INTEGER, "action": STRING,
    })),  # fmt: skip
    "resourceSharingConfiguration": Structure({"strategy": STRING, "borrowLimit": INTEGER}),
    "sharePreemptionConfiguration": Structure({"inSharePreemption": STRING}),
    "jobPreemptionConfiguration": Structure({"preemptionRetriesBeforeTermination": INTEGER}),
    "retryStrategy": Structure({
        "attempts": INTEGER,
        "evaluateOnExit": ListOf(Structure({"action": STRING, "onStatusReason": STRING})),
    }),  # fmt: skip
    "timeoutConfig": Structure({"attemptDurationSeconds": INTEGER}),
    "tags": MapOf(STRING),
    "filters": ListOf(Structure({"name": STRING, "values": ListOf(STRING)})),
}


# -- entry points ----------------------------------------------------------------------------


def parse_param(option: str, text: str, shape: Shape,
                read_file: Callable[[str], str] | None = None) -> Any:  # fmt: skip
    """One option value: `file://` first, then JSON (text starting with `[` or `{`), else
    shorthand converted by `shape`.  A list shape given one shorthand structure gets a list of
    one; a JSON object given to a list shape is taken as one item."""
    text = load_file(option, text, read_file)
    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            value = json.loads(stripped)
        except ValueError as error:
            raise ShorthandError(f"Error parsing parameter '{option}': Invalid JSON: {error}\n"
                                 f"JSON received: {stripped}") from None  # fmt: skip
        if isinstance(shape, ListOf) and isinstance(value, dict):
            return [value]
        return value
    if isinstance(shape, Scalar):
        return _convert(option, text, shape, option)
    if isinstance(shape, ListOf) and isinstance(shape.member, Scalar):
        return _convert(option, _Parser(option, stripped).csv_values(), shape, option)
    parsed = parse_shorthand(option, stripped)
    if isinstance(shape, ListOf):
        return [_convert(option, parsed, shape.member, option)]
    return _convert(option, parsed, shape, option)


def parse_list_param(option: str, values: list[str] | None, shape: ListOf,
                     read_file: Callable[[str], str] | None = None) -> list[Any] | None:
    """A list option given once or more (`--x a=1 --x a=2`, or `--x a=1 a=2` once the CLI has
    expanded it): the items of every value, in order.  None when never given."""
    if not values:
        return None
    items: list[Any] = []
    for text in values:
        value = parse_param(option, text, shape, read_file)
        items.extend(value if isinstance(value, list) else [value])
    return items


def load_file(option: str, text: str, read_file: Callable[[str], str] | None = None) -> str:
    """The text of `file://path` (a path relative to the working directory), else `text`."""
    if not text.startswith("file://"):
        return text
    path = text[len("file://"):]
    try:
        return (read_file or _read_text)(path)
    except OSError as error:
        reason = error.strerror or str(error)
        raise ShorthandError(f"Error parsing parameter '{option}': Unable to load paramfile "
                             f"{text}: {reason}") from None  # fmt: skip


def _read_text(path: str) -> str:
    return Path(path).expanduser().read_text(encoding="utf-8")


def expand_multi_value_args(args: list[str], options: set[str]) -> list[str]:
    """`--opt a b c` becomes `--opt a --opt b --opt c` for the list options in `options`, the
    way the AWS CLI takes a list of structures (space separated).  Values end at the next
    token that looks like an option (`-x`, `--x`, but not a negative number) or at `--`."""
    out: list[str] = []
    current: str | None = None  # the list option whose values are being read
    awaiting_first = False  # `current` was just written and its first value is next
    for index, token in enumerate(args):
        if token == "--":
            return out + args[index:]
        if token.startswith("-") and not _is_number(token):
            name = token.split("=", 1)[0]
            current = name if name in options else None
            awaiting_first = current is not None and "=" not in token
            out.append(token)
            continue
        if current is not None and not awaiting_first:
            out.append(current)
        awaiting_first = False
        out.append(token)
    return out


def _is_number(token: str) -> bool:
    return re.fullmatch(r"-\d+(\.\d+)?", token) is not None


# -- the shorthand grammar (awscli/shorthand.py, reduced to what the Batch shapes need) -------
#
#   parameter = keyval *("," keyval)
#   keyval    = key "=" [values]
#   values    = csv-list / "[" [value *("," value)] "]" / "{" keyval *("," keyval) "}"
#   csv-list  = value *("," value)      (a value that isn't the start of the next `key=`)
#   value     = 'single quoted' / "double quoted" / unquoted text up to `,` (or the closer)

_KEY = re.compile(r"\s*([A-Za-z0-9_.:/@-]+)\s*")
_NEXT_KEY = re.compile(r"\s*[A-Za-z0-9_.:/@-]+\s*=")


def parse_shorthand(option: str, text: str) -> dict[str, Any]:
    """`key=value,...` into a dict of strings, lists and dicts (no type conversion)."""
    parser = _Parser(option, text)
    result = parser.keyvals(closer=None)
    parser.expect_end()
    return result


class _Parser:
    def __init__(self, option: str, text: str):
        self.option, self.text, self.pos = option, text, 0

    def fail(self, expected: str) -> ShorthandError:
        received = repr(self.text[self.pos]) if self.pos < len(self.text) else "end of input"
        return ShorthandError(
            f"Error parsing parameter '{self.option}': Expected: {expected}, received: "
            f"{received} for input:\n{self.text}\n{' ' * self.pos}^"
        )  # fmt: skip

    def peek(self) -> str:
        self.skip_spaces()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"'{char}'")
        self.pos += 1

    def expect_end(self) -> None:
        if self.peek():
            raise self.fail("',' or end of input")

    def keyvals(self, closer: str | None) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            match = _KEY.match(self.text, self.pos)
            if match is None or not match.group(1):
                raise self.fail("a key (letters, digits, -_.:/@)")
            key = match.group(1)
            self.pos = match.end()
            self.expect("=")
            if key in result:
                raise ShorthandError(f"Error parsing parameter '{self.option}': "
                                     f"key {key!r} is given twice")  # fmt: skip
            result[key] = self.values(closer)
            if self.peek() != ",":
                return result
            self.pos += 1

    def values(self, closer: str | None) -> Any:
        char = self.peek()
        if char == "[":
            return self.explicit_list()
        if char == "{":
            self.pos += 1
            value = self.keyvals(closer="}")
            self.expect("}")
            return value
        first = self.value(closer)
        items = [first]
        while self.peek() == "," and not _NEXT_KEY.match(self.text, self.pos + 1):
            after = self.text[self.pos + 1:].strip()
            if not after or (closer is not None and after[0] == closer):
                break
            self.pos += 1
            items.append(self.value(closer))
        return first if len(items) == 1 else items

    def csv_values(self) -> list[str]:
        """A bare list of scalars: `a,b,c` (the shorthand of a list of strings)."""
        items = [self.value(None)]
        while self.peek() == ",":
            self.pos += 1
            items.append(self.value(None))
        self.expect_end()
        return items

    def explicit_list(self) -> list[Any]:
        self.expect("[")
        items: list[Any] = []
        if self.peek() == "]":
            self.pos += 1
            return items
        while True:
            char = self.peek()
            if char == "{":
                self.pos += 1
                items.append(self.keyvals(closer="}"))
                self.expect("}")
            elif char == "[":
                items.append(self.explicit_list())
            else:
                items.append(self.value("]"))
            if self.peek() == "]":
                self.pos += 1
                return items
            self.expect(",")

    def value(self, closer: str | None) -> str:
        char = self.peek()
        if char in ("'", '"'):
            return self.quoted(char)
        start = self.pos
        stops = "," + (closer or "")
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            self.pos += 1
        return self.text[start:self.pos].strip()

    def quoted(self, quote: str) -> str:
        self.pos += 1
        out = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            escaped = self.text[self.pos + 1:self.pos + 2]
            if char == "\\" and escaped in (quote, "\\"):
                out.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            self.pos += 1
            if char == quote:
                return "".join(out)
            out.append(char)
        raise self.fail(f"closing {quote}")


# -- conversion by shape ---------------------------------------------------------------------


def _convert(option: str, value: Any, shape: Shape, where: str) -> Any:
    if isinstance(shape, Scalar):
        return _scalar(option, value, shape, where)
    if isinstance(shape, ListOf):
        items = value if isinstance(value, list) else [value]
        return [_convert(option, item, shape.member, where) for item in items]
    if not isinstance(value, dict):
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be a structure "
                             f"of key=value pairs, got {value!r}")  # fmt: skip
    if isinstance(shape, MapOf):
        return {key: _convert(option, item, shape.value, f"{where}.{key}")
                for key, item in value.items()}  # fmt: skip
    unknown = [key for key in value if key not in shape.members]
    if unknown:
        raise ShorthandError(
            f"Error parsing parameter '{option}': unknown key {unknown[0]!r}; "
            f"valid keys are: {', '.join(shape.members)}"
        )  # fmt: skip
    return {key: _convert(option, item, shape.members[key], key) for key, item in value.items()}


def _scalar(option: str, value: Any, shape: Scalar, where: str) -> Any:
    if isinstance(value, (list, dict)):
        raise ShorthandError(f"Error parsing parameter '{option}': {where} takes one "
                             f"{shape.kind}, got {value!r}")  # fmt: skip
    if shape is INTEGER:
        if re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be an integer, "
                             f"got {value!r}")  # fmt: skip
    if shape is BOOLEAN:
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be true or "
                             f"false, got {value!r}")  # fmt: skip
    return value
