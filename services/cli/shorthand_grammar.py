"""The AWS CLI's shorthand grammar (`key=value,...`), reduced to what the Batch shapes need,
and `ShorthandError`, the one error every part of the parameter syntax raises.

The parser yields strings, lists and dicts without any type conversion (that is the shapes'
job, in `shorthand_shapes`); an error message names the parameter and shows, with a caret,
where the text went wrong.
"""

from __future__ import annotations

import re
from typing import Any


class ShorthandError(ValueError):
    """A parameter that can't be read; the CLI prints the message and exits 2."""


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
    parser = Parser(option, text)
    result = parser.keyvals(closer=None)
    parser.expect_end()
    return result


class Parser:
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
