"""Printing an answer: JSON indented by 4 like the AWS CLI, or `--output table` rendered with
rich (its fields and the decision's facts)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from quotasched.services.cli.verbs import Output


def emit(document: dict[str, Any], output: Output,
         render: Callable[[Console, dict], None] | None = None) -> None:  # fmt: skip
    if output is Output.json:
        typer.echo(json.dumps(document, indent=4, ensure_ascii=False))
        return
    # A table piped to a file or a pager is still read by a person: don't squeeze it to 80.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    (render or _render_fields)(Console(width=wide), document)


def _table(*headers: str, title: str | None = None, show_header: bool = True) -> Table:
    table = Table(title=title, show_header=show_header)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _render_fields(console: Console, document: dict[str, Any], title: str | None = None) -> None:
    facts = document.get("facts")
    table = _table("field", "value", title=title, show_header=False)
    for key, value in document.items():
        if key != "facts":
            table.add_row(key, _cell(key, value))
    console.print(table)
    if facts:
        _render_facts(console, facts)


def _render_facts(console: Console, facts: list[dict[str, Any]]) -> None:
    table = _table("seq", "kind", "jobId", "details", title="Decision")
    for fact in facts:
        rest = {k: v for k, v in fact.items() if k not in ("kind", "at", "commandSeq", "jobId")}
        table.add_row(str(fact["commandSeq"]), fact["kind"], fact.get("jobId") or "",
                      _cell("", {k: v for k, v in rest.items() if v not in (None, [], {})}))
    console.print(table)


def _cell(key: str, value: Any) -> str:
    """One value, readably: `1 ml.g5.xlarge` for capacities, `k=v` for structures."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and (key.endswith("At") or key == "earliestTimeAtPosition"):
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc).isoformat(timespec="seconds")
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, list):
        if value and all(isinstance(item, dict) and "capacityUnit" in item for item in value):
            return ", ".join(f"{_cell('', item.get('quantity', item.get('maxCapacity')))} "
                             f"{item['capacityUnit']}" for item in value)  # fmt: skip
        return ", ".join(_cell(key, item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(k, v)}" for k, v in value.items() if v is not None)
    return str(value)
