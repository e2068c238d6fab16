"""Printing the verbs' answers: JSON indented by 4 like the AWS CLI, or `--output table`
rendered with rich (fields, items, the decision's facts, a queue snapshot)."""

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

from quotasched.services.cli.aws_options import Output, name_from_arn


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


def render_items(console: Console, items: list[dict[str, Any]], title: str,
                 columns: list[tuple[str, str]] | None = None) -> None:  # fmt: skip
    if columns is None:
        keys = list(dict.fromkeys(key for item in items for key in item))
        columns = [(key, key) for key in keys]
    table = _table(*(header for header, _ in columns), title=title)
    for item in items:
        table.add_row(*(_cell(key, item.get(key)) for _, key in columns))
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


JOB_COLUMNS = [("jobId", "jobId"), ("jobName", "jobName"), ("quota share", "quotaShareName"),
               ("priority", "schedulingPriority"), ("status", "status"),
               ("capacity", "capacityUsage"), ("created", "createdAt"),
               ("statusReason", "statusReason")]  # fmt: skip
SHARE_COLUMNS = [("quota share", "quotaShareName"), ("state", "state"),
                 ("sharing", "resourceSharingConfiguration"), ("limits", "capacityLimits"),
                 ("preemption", "preemptionConfiguration"), ("in use", "usage")]  # fmt: skip


def render_snapshot(console: Console, snapshot: dict[str, Any]) -> None:
    usage = snapshot["queueUtilization"]
    table = _table("quota share", "in use", title="Queue utilization")
    table.add_row("(total)", _cell("", usage["totalCapacityUsage"]) or "-")
    for item in usage["quotaShareUtilization"]["topCapacityUtilization"]:
        table.add_row(item["quotaShareName"], _cell("", item["capacityUsage"]))
    console.print(table)
    fronts = _table("quota share", "first RUNNABLE job", "since", title="Front of quota shares")
    for share, jobs in snapshot["frontOfQuotaShares"]["quotaShares"].items():
        head = jobs[0] if jobs else {}
        fronts.add_row(share, name_from_arn(head.get("jobArn", "")) or "-",
                       _cell("earliestTimeAtPosition", head.get("earliestTimeAtPosition")))
    console.print(fronts)
    queue = _table("#", "job", "since", title="Front of queue")
    for position, job in enumerate(snapshot["frontOfQueue"]["jobs"], start=1):
        queue.add_row(str(position), name_from_arn(job["jobArn"]),
                      _cell("earliestTimeAtPosition", job["earliestTimeAtPosition"]))  # fmt: skip
    console.print(queue)
