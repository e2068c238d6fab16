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

This module is the public face and the entry points; the grammar (and `ShorthandError`) lives
in `shorthand_grammar`, the API shapes and the conversion by shape in `shorthand_shapes`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from quotasched.services.cli.shorthand_grammar import Parser, ShorthandError, parse_shorthand
from quotasched.services.cli.shorthand_shapes import (  # noqa: F401  (re-exported: the public face)
    BOOLEAN,
    CAPACITY_LIMITS,
    CAPACITY_USAGE,
    INTEGER,
    SHAPES,
    STRING,
    ListOf,
    MapOf,
    Scalar,
    Shape,
    Structure,
    convert,
)


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
        return convert(option, text, shape, option)
    if isinstance(shape, ListOf) and isinstance(shape.member, Scalar):
        return convert(option, Parser(option, stripped).csv_values(), shape, option)
    parsed = parse_shorthand(option, stripped)
    if isinstance(shape, ListOf):
        return [convert(option, parsed, shape.member, option)]
    return convert(option, parsed, shape, option)


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
