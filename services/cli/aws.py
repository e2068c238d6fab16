"""`quotasched <verb>`: the `aws batch` verbs, live against a scheduler on NATS JetStream.

The verbs, option names and shorthand syntax are those of the AWS CLI (spec section 5.1), so
`aws batch create-quota-share --quota-share-name qs1 --job-queue q --capacity-limits
maxCapacity=1,capacityUnit=ml.g5.xlarge ...` works by swapping `aws batch` for `quotasched`.

* Write verbs build the JSON command of the contract, check it locally (nothing invalid is
  published) and publish it with `Bus`; they return once JetStream stored it and print the
  AWS-shaped response plus `commandSeq`, the command's position in the command stream (every
  fact the scheduler records for it carries the same `commandSeq`).  `--wait` also waits for
  the scheduler's decision and adds its facts under `facts`.
* `submit-service-job` always waits for the decision unless told `--no-wait` (see its help):
  like `aws batch submit-service-job` it answers with the job id, and a refused submission
  fails right there.
* Read verbs ask the scheduler over NATS request/reply; JSON output is indented by 4 like the
  AWS CLI's; `--output table` renders the same answer with rich.
* `apply FILE` publishes a replay-format command file; `facts` prints the fact log exactly as
  `quotasched replay` prints facts.

Exit status (one rule for every verb; the AWS CLI uses 254 where we use 1):
  0  done;
  1  the scheduler said no: the command was refused (CommandRejected) or a read failed with a
     ClientException; the reason is on standard error;
  2  nothing reached the scheduler: bad syntax or invalid parameters (checked locally, nothing
     was published), or the NATS server / the scheduler could not be reached;
  3  the outcome is not known yet: the command is stored but no decision arrived within
     --wait-timeout (it will still be decided, in order, once a scheduler runs: see
     `quotasched facts`), or JetStream did not acknowledge it in time.

The verbs live beside this module, one concept each: `aws_setup_verbs` (service environments,
scheduling policies, job queues), `aws_share_verbs` (quota shares), `aws_job_verbs` (service
jobs), `aws_apply` and `aws_facts` (command files and the fact log); what they share is in
`aws_options` (declaring verbs, common options, parsing values), `aws_session` (NATS, exit
codes) and `aws_output` (JSON and tables).  This module hands them to the `quotasched` app,
in the order `--help` lists them.
"""

from __future__ import annotations

import typer

# Importing the verb modules registers their verbs on `cli`.
from quotasched.services.cli import aws_apply, aws_facts, aws_job_verbs  # noqa: F401
from quotasched.services.cli import aws_setup_verbs, aws_share_verbs  # noqa: F401
from quotasched.services.cli.aws_options import PANEL_READ, PANEL_WRITE, cli  # noqa: F401 (test_docs)

# The order `quotasched --help` lists the verbs in, within each panel (Typer keeps the order
# of registration, and the verb modules register by concept): writes, reads, then the log.
# A verb missing here is listed after these.
VERBS = (
    "create-service-environment", "update-service-environment", "create-scheduling-policy",
    "create-job-queue", "update-job-queue", "create-quota-share", "update-quota-share",
    "delete-quota-share", "list-quota-shares", "describe-quota-share",
    "describe-service-environments", "describe-job-queues", "describe-scheduling-policies",
    "submit-service-job", "update-service-job", "terminate-service-job", "describe-service-job",
    "list-service-jobs", "get-job-queue-snapshot", "apply", "facts",
)  # fmt: skip
cli.registered_commands.sort(
    key=lambda command: VERBS.index(command.name) if command.name in VERBS else len(VERBS))


def register(app: typer.Typer) -> None:
    """Add every verb of this module to the `quotasched` app."""
    app.registered_commands.extend(cli.registered_commands)
