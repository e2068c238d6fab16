"""Declaring `apply` and `facts`: the Typer app they register on, the exit codes and help
panel, and the options they share with `config`.

A module decorates each command with `register_verb`, which registers it on `cli` with its
docstring as help; `services.cli.log_cli` hands them to the `quotasched` app in a fixed order.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from quotasched.services.cli.shorthand import expand_multi_value_args

ARN = "arn:aws:batch:local:000000000000"  # as services.scheduler.api answers
EXIT_REFUSED, EXIT_USAGE, EXIT_UNDECIDED = 1, 2, 3
PANEL_LOG = "Command files and the fact log"
EPILOG = ("Exit status: 0 done; 1 refused by the scheduler (reason on stderr; the AWS CLI uses "
          "254); 2 bad syntax or parameters (nothing published) or NATS/scheduler unreachable; "
          "3 stored but undecided within --wait-timeout.")  # fmt: skip

cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


class Failure(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.message, self.code = message, code


class AwsCommand(TyperCommand):
    """Takes list options the AWS way too: `--capacity-limits a=1,b=2 a=3,b=4`."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        lists = {opt for param in self.params if getattr(param, "multiple", False)
                 for opt in getattr(param, "opts", [])}  # fmt: skip
        return super().parse_args(ctx, expand_multi_value_args(args, lists))


class Output(str, Enum):
    json = "json"
    table = "table"


NatsUrl = Annotated[Optional[str], typer.Option(
    "--nats-url", envvar="QUOTASCHED_NATS_URL", show_default=False,
    help="NATS server of the scheduler (default: nats://127.0.0.1:4222).")]  # fmt: skip
OutputOpt = Annotated[Output, typer.Option(
    "--output", envvar="QUOTASCHED_OUTPUT", case_sensitive=False,
    help="json (like the AWS CLI, indent 4) or table.")]  # fmt: skip
Wait = Annotated[bool, typer.Option(
    "--wait", help="Also wait for the scheduler's decision and print its facts; a refused "
                   "command exits 1.")]  # fmt: skip
WaitTimeout = Annotated[float, typer.Option(
    "--wait-timeout", min=0.1, help="Seconds to wait for a decision (exit 3 after).")]  # fmt: skip


def register_verb(name: str, panel: str = PANEL_LOG):
    """Registers an AWS verb, its docstring as help with each paragraph on one line (Typer
    keeps the docstring's line breaks inside paragraphs)."""

    def decorate(function):
        return cli.command(name, cls=AwsCommand, rich_help_panel=panel, epilog=EPILOG,
                           help=prose(function.__doc__))(function)  # fmt: skip

    return decorate


def prose(doc: str | None) -> str:
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def name_from_arn(value: str) -> str:
    return value.rsplit("/", 1)[-1] if value.startswith("arn:") else value
