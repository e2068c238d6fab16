"""Showing a plan: a diff-like listing (+ create, ~ update, - delete, = kept, ! error) and a
one-line summary of its counts."""

from __future__ import annotations

from quotasched.services.config.plan import Plan


SIGNS = {"create": "+", "update": "~", "delete": "-"}


def render(result: Plan) -> list[str]:
    """The plan as a diff-like listing, one resource per line and one line per field."""
    lines = []
    for change in result.changes:
        note = f"  ({change.note})" if change.note else ""
        lines.append(f"{SIGNS[change.action]} {change.action} {change.resource} "
                     f"{change.name}{note}")  # fmt: skip
        for name, before, after in change.fields:
            if change.action == "create":
                lines.append(f"      {name}: {after}")
            elif change.action == "update":
                lines.append(f"      {name}: {before} -> {after}")
    for kept in result.kept:
        lines.append(f"= {kept}")
    for error in result.errors:
        lines.append(f"! {error}")
    return lines


def summary(result: Plan) -> str:
    if not result.changes:
        return "no changes: the live configuration matches the file"
    commands = len(result.commands)
    return (f"{result.count('create')} to create, {result.count('update')} to update, "
            f"{result.count('delete')} to delete ({commands} command"
            f"{'' if commands == 1 else 's'})")  # fmt: skip
