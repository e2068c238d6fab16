"""`quotasched apply` and `quotasched facts`: command files in, the fact log out, live on NATS.

The `aws batch`-shaped verbs that once lived beside these are gone: `quotasched up` (and
`quotasched endpoint`) serve AWS Batch's own API, so the real AWS CLI, boto3 and the SageMaker
SDK do that job unchanged (docs/service.md, "The AWS Batch endpoint").  What remains is what the AWS
CLI cannot do:

* `apply FILE` publishes a replay-format command file (JSON Lines, the contract's own
  messages, `ReportJobStatus` and `Tick` included) and, with `--wait`, reports each decision;
* `facts` prints the fact log exactly as `quotasched replay` prints facts, and follows it.

Exit status: 0 done; 1 the scheduler refused something (CommandRejected); 2 nothing reached
the scheduler (bad input, checked locally, or no NATS server / scheduler); 3 the outcome is not
known yet (stored, not decided within --wait-timeout).

They live in `apply_cmd` and `facts_cmd`; what they share with `config` is in `verbs`
(declaring a command, common options, values), `session` (NATS, exit codes) and `output` (JSON
and tables).
"""

from __future__ import annotations

import typer

# Importing the modules registers their commands on `cli`.
from quotasched.services.cli import apply_cmd, facts_cmd  # noqa: F401
from quotasched.services.cli.verbs import cli

# The order `quotasched --help` lists them in (Typer keeps the order of registration).
VERBS = ("apply", "facts")
cli.registered_commands.sort(
    key=lambda command: VERBS.index(command.name) if command.name in VERBS else len(VERBS))


def register(app: typer.Typer) -> None:
    """Add every verb of this module to the `quotasched` app."""
    app.registered_commands.extend(cli.registered_commands)
