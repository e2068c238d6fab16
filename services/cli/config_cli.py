"""`quotasched config apply|export`: configuration as code against the live scheduler.

`apply FILE` reads the declared configuration (services/config/as_code.py), reads the live one
with the scheduler's read verbs over NATS, prints the difference and publishes only the
commands that close it, one at a time, each waited for until the scheduler decided it: the
first refusal stops the run with the scheduler's reason (exit 1), so nothing is published on
top of a change that did not happen.  `export` writes the live configuration as such a file.

Exit status as for every verb: 0 done (or nothing to do); 1 the scheduler refused a command;
2 the file is invalid, the change is impossible under the contract (nothing was published),
or NATS / the scheduler cannot be reached; 3 a command is stored but undecided in time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from quotasched.services.config import as_code as cac
from quotasched.services.cli.verbs import EXIT_REFUSED, EXIT_UNDECIDED, EXIT_USAGE, Failure, NatsUrl, prose
from quotasched.services.cli.session import ask, publish, run, session

config_app = typer.Typer(
    help="Configuration as code: declare service environments, scheduling policies, job "
         "queues and quota shares in a YAML file; apply it, or export the live one.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)  # fmt: skip

UNFINISHED = ("SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")


def _command(name: str):
    """Registers a subcommand, its docstring as help with each paragraph on one line."""

    def decorate(function):
        return config_app.command(name, help=prose(function.__doc__))(function)

    return decorate


@_command("apply")
def apply(
    file: Annotated[Path, typer.Argument(
        help="The declared configuration (YAML; see examples/shares.yaml).")],
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only print the difference; publish nothing.")] = False,
    terminate_jobs: Annotated[bool, typer.Option(
        "--terminate-jobs", help="Allow deleting quota shares that still have unfinished "
                                 "jobs (the scheduler terminates them).")] = False,
    wait_timeout: Annotated[float, typer.Option(
        "--wait-timeout", min=0.1,
        help="Seconds to wait for each command's decision (exit 3 after).")] = 30.0,
    nats_url: NatsUrl = None,
) -> None:
    """Make the live configuration match FILE, publishing only the commands needed.

    Prints one line per resource to create (+), update (~, with each changed field as
    live -> declared) or delete (-); live resources the file does not declare and the contract
    cannot delete are listed (=) and kept.  Quota shares of the job queues the file declares
    that it does not declare are deleted (DISABLED first).  Creates run parent first (service
    environments, scheduling policies, job queues, quota shares, then options beyond AWS: a
    queue's after its shares).  Applying the same file twice publishes nothing the second time.
    """
    try:
        desired = cac.load(file)
    except cac.ConfigError as error:
        for problem in error.problems:
            typer.echo(f"{error.source}: {problem}", err=True)
        typer.echo(f"quotasched config apply: {len(error.problems)} problem(s) in {file}; "
                   f"nothing was published", err=True)  # fmt: skip
        raise typer.Exit(EXIT_USAGE)
    run(lambda: _apply(str(file), desired, dry_run, terminate_jobs, wait_timeout, nats_url))


async def _apply(path: str, desired: cac.Configuration, dry_run: bool, terminate_jobs: bool,
                 timeout: float, url: str | None) -> int:  # fmt: skip
    async with session(url) as bus:
        live = await read_live(bus)
        unfinished = await _unfinished_jobs(bus, cac.doomed_shares(desired, live))
        plan = cac.plan(desired, live, unfinished, allow_termination=terminate_jobs)
        for line in cac.render(plan):
            typer.echo(line)
        typer.echo(f"plan for {bus.url}: {cac.summary(plan)}")
        if plan.errors:
            raise Failure(f"quotasched config apply: {len(plan.errors)} problem(s) (marked !); "
                          f"nothing was published", EXIT_USAGE)
        if dry_run or not plan.changes:
            if dry_run and plan.changes:
                typer.echo("dry run: nothing was published")
            return 0
        from quotasched.services.client.commands import Decisions

        decisions = Decisions()
        await decisions.start(bus)
        published: list[int] = []
        for change in plan.changes:
            for command in change.commands:
                seq = await publish(bus, command)
                published.append(seq)
                if await decisions.wait([seq], timeout):
                    raise Failure(f"quotasched config apply: {command.kind} for "
                                  f"{change.resource} {change.name} (command seq {seq}) is "
                                  f"stored but not decided within {timeout:g}s; it will be "
                                  f"decided once a scheduler runs, the rest was not published",
                                  EXIT_UNDECIDED)  # fmt: skip
                refused = [fact for fact in decisions.facts[seq] if fact.kind == "CommandRejected"]
                if refused:
                    done = len(published) - 1
                    raise Failure(f"quotasched config apply: {command.kind} for "
                                  f"{change.resource} {change.name} refused: "
                                  f"{refused[0].status_reason}\nquotasched config apply: "
                                  f"{done} earlier command(s) were applied"
                                  f"{_seqs(published[:-1])}, the rest were not published",
                                  EXIT_REFUSED)  # fmt: skip
    typer.echo(f"applied: {cac.summary(plan)}{_seqs(published)}")
    return 0


def _seqs(seqs: list[int]) -> str:
    if not seqs:
        return ""
    return f" (command seq {seqs[0]})" if len(seqs) == 1 else f" (command seq {seqs[0]}-{seqs[-1]})"


async def read_live(bus) -> cac.Configuration:
    """The live configuration, from the leading scheduler's read answers."""
    environments = await ask(bus, "DescribeServiceEnvironments", "describe-service-environments")
    policies = await ask(bus, "DescribeSchedulingPolicies", "describe-scheduling-policies")
    queues = await ask(bus, "DescribeJobQueues", "describe-job-queues")
    shares = []
    for queue in queues["jobQueues"]:
        answer = await ask(bus, "ListQuotaShares", "list-quota-shares",
                           jobQueue=queue["jobQueueName"])  # fmt: skip
        shares.extend(answer["quotaShares"])
    try:
        return cac.from_live(environments, policies, queues, shares)
    except cac.ConfigError as error:  # a scheduler of another version
        raise Failure(f"quotasched config: the live configuration cannot be read: {error}",
                      EXIT_USAGE) from None  # fmt: skip


async def _unfinished_jobs(bus, keys: list[cac.ShareKey]) -> dict[cac.ShareKey, int]:
    counts = {}
    for queue, share in keys:
        count = 0
        for status in UNFINISHED:
            answer = await ask(bus, "ListServiceJobs", "list-service-jobs", jobQueue=queue,
                               jobStatus=status, maxResults=10_000,
                               filters=[{"name": "QUOTA_SHARE_NAME", "values": [share]}])
            count += len(answer["jobSummaryList"])
        counts[(queue, share)] = count
    return counts


@_command("export")
def export(
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="Write the file here (default: standard output).",
        show_default=False)] = None,  # fmt: skip
    nats_url: NatsUrl = None,
) -> None:
    """Write the live configuration as a file `config apply` takes (applying it changes
    nothing)."""

    async def work() -> int:
        async with session(nats_url) as bus:
            live = await read_live(bus)
            header = (f"The live configuration of {bus.url}, written by `quotasched config "
                      f"export`.\nApply with `quotasched config apply FILE`.")  # fmt: skip
        text = cac.dump_yaml(live, header)
        if out is None:
            typer.echo(text, nl=False)
            return 0
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as error:
            raise Failure(f"quotasched config export: cannot write {out}: {error.strerror}",
                          EXIT_USAGE) from None  # fmt: skip
        typer.echo(f"exported {len(live.environments)} service environment(s), "
                   f"{len(live.policies)} scheduling policy(ies), {len(live.queues)} job "
                   f"queue(s) and {len(live.shares)} quota share(s) to {out}", err=True)
        return 0

    run(work)
