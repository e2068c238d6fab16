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
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand

from services.cli.shorthand import (
    SHAPES,
    ShorthandError,
    expand_multi_value_args,
    load_file,
    parse_list_param,
    parse_param,
)

ARN = "arn:aws:batch:local:000000000000"  # as services.scheduler.api answers
EXIT_REFUSED, EXIT_USAGE, EXIT_UNDECIDED = 1, 2, 3
PANEL_WRITE = "AWS Batch verbs that change things (published as commands)"
PANEL_READ = "AWS Batch verbs that read (answered by the scheduler)"
PANEL_LOG = "Command files and the fact log"
EPILOG = ("Exit status: 0 done; 1 refused by the scheduler (reason on stderr; the AWS CLI uses "
          "254); 2 bad syntax or parameters (nothing published) or NATS/scheduler unreachable; "
          "3 stored but undecided within --wait-timeout.")  # fmt: skip

cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def register(app: typer.Typer) -> None:
    """Add every verb of this module to the `quotasched` app."""
    app.registered_commands.extend(cli.registered_commands)


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


def _verb(name: str, panel: str = PANEL_WRITE):
    """Registers an AWS verb, its docstring as help with each paragraph on one line (Typer
    keeps the docstring's line breaks inside paragraphs)."""

    def decorate(function):
        return cli.command(name, cls=AwsCommand, rich_help_panel=panel, epilog=EPILOG,
                           help=_prose(function.__doc__))(function)  # fmt: skip

    return decorate


def _prose(doc: str | None) -> str:
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


# -- running a verb: connection, errors, exit codes ------------------------------------------


def _run(work: Callable[[], Awaitable[int | None]]) -> None:
    from nats.errors import Error as NatsError

    try:
        code = asyncio.run(work())
    except NatsError as error:  # e.g. the server went away mid-command
        typer.echo(f"quotasched: NATS error: {error or type(error).__name__}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except Failure as failure:
        typer.echo(failure.message, err=True)
        raise typer.Exit(failure.code) from None
    except ShorthandError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `quotasched facts | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(141) from None
    if code:
        raise typer.Exit(code)


@asynccontextmanager
async def _session(url: str | None, reconnect_forever: bool = False):
    """A connected `Bus` that gives up at once when the server can't be reached (the
    services' own connection retries forever, which a command line must not)."""
    import nats

    from services.auth import connect_options
    from services.bus import error_reason
    from services.client import Bus

    bus = Bus(url, name="quotasched-cli")
    problems: list[BaseException] = []

    async def remember(error: BaseException) -> None:
        problems.append(error)

    try:
        bus.nc = await nats.connect(bus.url, name=bus.name, connect_timeout=3,
                                    max_reconnect_attempts=1, reconnect_time_wait=0.2,
                                    error_cb=remember, **connect_options())  # fmt: skip
    except Exception as error:
        cause = problems[-1] if problems else error
        raise Failure(f"quotasched: cannot reach the NATS server at {bus.url}: "
                      f"{error_reason(cause)}", EXIT_USAGE) from None  # fmt: skip
    if reconnect_forever:
        bus.nc.options["max_reconnect_attempts"] = -1
    bus.js = bus.nc.jetstream()
    try:
        yield bus
    finally:
        try:
            await asyncio.wait_for(bus.nc.close(), 5)
        except Exception:
            pass


def _aws_error(operation: str, message: str) -> str:
    return f"An error occurred (ClientException) when calling the {operation} operation: {message}"


def _no_scheduler(url: str) -> Failure:
    return Failure(f"quotasched: no scheduler answered on {url}; start one with "
                   f"`quotasched scheduler --nats-url {url}` (or `quotasched up`)", EXIT_USAGE)


def _no_streams(url: str) -> Failure:
    return Failure(f"quotasched: the NATS server at {url} has no quotasched streams yet; "
                   f"start a scheduler against it once (`quotasched scheduler --nats-url {url}`)",
                   EXIT_USAGE)  # fmt: skip


async def _ask(bus, operation: str, verb: str, **params: Any) -> dict[str, Any]:
    from nats.errors import NoRespondersError

    from services.client import ClientError

    try:
        return await bus.request(verb, **{k: v for k, v in params.items() if v is not None})
    except ClientError as error:
        raise Failure(_aws_error(operation, str(error)), EXIT_REFUSED) from None
    except (NoRespondersError, TimeoutError):
        raise _no_scheduler(bus.url) from None


def _checked(operation: str, command: dict[str, Any]) -> dict[str, Any]:
    """The command without unset fields, refused here (exit 2) when the contract would."""
    from events.codec import DecodeError, decode_command

    command = {key: value for key, value in command.items() if value is not None}
    try:
        decode_command(json.dumps(command))
    except DecodeError as error:
        raise Failure(f"Parameter validation failed for {operation}: {error.reason}",
                      EXIT_USAGE) from None  # fmt: skip
    return command


async def _publish(bus, command: dict[str, Any], route: tuple | None = None) -> int:
    from nats.js.errors import NoStreamResponseError

    try:
        return await bus.publish(command, route)
    except NoStreamResponseError:
        raise _no_streams(bus.url) from None
    except TimeoutError:
        raise Failure(f"quotasched: JetStream at {bus.url} did not acknowledge the command in "
                      f"time; it may or may not be stored (see `quotasched facts`)",
                      EXIT_UNDECIDED) from None  # fmt: skip


async def _decide(bus, operation: str, command: dict[str, Any], timeout: float,
                  route: tuple | None = None) -> list:  # fmt: skip
    """Publish and wait for the decision; a refusal is a Failure (exit 1)."""
    from nats.js.errors import NotFoundError

    from events.facts import CommandRejected

    try:
        facts = await bus.submit_and_wait(command, route, timeout=timeout)
    except NotFoundError:
        raise _no_streams(bus.url) from None
    except TimeoutError as error:
        reason = str(error) or f"no decision within {timeout:g}s"
        raise Failure(f"quotasched: {operation}: {reason}; the command "
                      f"is stored and will be decided once a scheduler runs (see `quotasched "
                      f"facts`)", EXIT_UNDECIDED) from None  # fmt: skip
    for fact in facts:
        if isinstance(fact, CommandRejected):
            raise Failure(_aws_error(operation, fact.status_reason), EXIT_REFUSED)
    return facts


def _fact_documents(facts: list) -> list[dict[str, Any]]:
    from events.codec import encode

    return [json.loads(encode(fact)) for fact in facts]


async def _write(url: str | None, operation: str, build: Callable[[], tuple[dict, dict]],
                 wait: bool, timeout: float, output: Output) -> None:  # fmt: skip
    """The shape of the configuration verbs: build (parsing shorthand), check, publish (and
    wait), print.  `build` returns the command and the AWS-shaped response."""
    command, response = build()
    command = _checked(operation, command)
    async with _session(url) as bus:
        response = await _send(bus, operation, command, response, wait, timeout)
    _emit(response, output)


async def _send(bus, operation: str, command: dict[str, Any], response: dict[str, Any],
                wait: bool, timeout: float, route: tuple | None = None) -> dict[str, Any]:
    """Publishes; the response gains `commandSeq`, and with `wait` the decision's facts."""
    if not wait:
        return {**response, "commandSeq": await _publish(bus, command, route)}
    facts = await _decide(bus, operation, command, timeout, route)
    return {**response, "commandSeq": facts[0].command_seq, "facts": _fact_documents(facts)}


def _name(value: str) -> str:
    return value.rsplit("/", 1)[-1] if value.startswith("arn:") else value


def _share_target(arn: str | None, job_queue: str | None, share: str | None) -> tuple[str, str]:
    if arn:
        _, _, rest = arn.partition(":job-queue/")
        queue, marker, name = rest.partition("/quota-share/")
        if not (queue and marker and name):
            raise Failure(f"--quota-share-arn {arn!r} is not a quota share ARN "
                          f"(arn:aws:batch:<region>:<account>:job-queue/<queue>/quota-share/"
                          f"<share>)", EXIT_USAGE)  # fmt: skip
        return queue, name
    if job_queue and share:
        return _name(job_queue), share
    raise Failure("give --quota-share-arn, or --job-queue with --quota-share-name", EXIT_USAGE)


def _share_arn(queue: str, share: str) -> str:
    return f"{ARN}:job-queue/{queue}/quota-share/{share}"


def _job_arn(job_id: str) -> str:
    return f"{ARN}:job/{job_id}"


def _one(option: str, text: str | None, shape_name: str) -> Any:
    return None if text is None else parse_param(option, text, SHAPES[shape_name])


def _many(option: str, values: list[str] | None, shape_name: str) -> list | None:
    return parse_list_param(option, values, SHAPES[shape_name])


# -- output ----------------------------------------------------------------------------------


def _emit(document: dict[str, Any], output: Output,
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


def _render_items(console: Console, items: list[dict[str, Any]], title: str,
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


def _render_snapshot(console: Console, snapshot: dict[str, Any]) -> None:
    usage = snapshot["queueUtilization"]
    table = _table("quota share", "in use", title="Queue utilization")
    table.add_row("(total)", _cell("", usage["totalCapacityUsage"]) or "-")
    for item in usage["quotaShareUtilization"]["topCapacityUtilization"]:
        table.add_row(item["quotaShareName"], _cell("", item["capacityUsage"]))
    console.print(table)
    fronts = _table("quota share", "first RUNNABLE job", "since", title="Front of quota shares")
    for share, jobs in snapshot["frontOfQuotaShares"]["quotaShares"].items():
        head = jobs[0] if jobs else {}
        fronts.add_row(share, _name(head.get("jobArn", "")) or "-",
                       _cell("earliestTimeAtPosition", head.get("earliestTimeAtPosition")))
    console.print(fronts)
    queue = _table("#", "job", "since", title="Front of queue")
    for position, job in enumerate(snapshot["frontOfQueue"]["jobs"], start=1):
        queue.add_row(str(position), _name(job["jobArn"]),
                      _cell("earliestTimeAtPosition", job["earliestTimeAtPosition"]))  # fmt: skip
    console.print(queue)



# -- configuration verbs ---------------------------------------------------------------------

CapacityLimits = Annotated[list[str], typer.Option(
    "--capacity-limits", show_default=False,
    help="capacityUnit=ml.g5.xlarge,maxCapacity=3; several limits space-separated or "
         "repeated, or a JSON list.")]  # fmt: skip
OptionalCapacityLimits = Annotated[Optional[list[str]], typer.Option(
    "--capacity-limits", show_default=False,
    help="capacityUnit=ml.g5.xlarge,maxCapacity=3; several limits space-separated or "
         "repeated, or a JSON list; replaces the current limits.")]  # fmt: skip
StateOpt = Annotated[Optional[str], typer.Option("--state", help="ENABLED or DISABLED.",
                                                 show_default=False)]  # fmt: skip
Tags = Annotated[Optional[str], typer.Option("--tags", help="key=value,key=value or JSON.",
                                             show_default=False)]  # fmt: skip


@_verb("create-service-environment")
def create_service_environment(
    service_environment_name: Annotated[str, typer.Option("--service-environment-name")],
    capacity_limits: CapacityLimits,
    state: StateOpt = None,
    service_environment_type: Annotated[Optional[str], typer.Option(
        "--service-environment-type", help="SAGEMAKER_TRAINING (the only type).",
        show_default=False)] = None,  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a service environment: per instance type, how many instances may run at once."""

    def build():
        return ({"kind": "CreateServiceEnvironment",
                 "serviceEnvironmentName": service_environment_name,
                 "capacityLimits": _many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "state": state, "serviceEnvironmentType": service_environment_type,
                 "tags": _one("--tags", tags, "tags")},
                {"serviceEnvironmentName": service_environment_name,
                 "serviceEnvironmentArn": f"{ARN}:service-environment/{service_environment_name}"})

    _run(lambda: _write(nats_url, "CreateServiceEnvironment", build, wait, wait_timeout, output))


@_verb("update-service-environment")
def update_service_environment(
    service_environment: Annotated[str, typer.Option(
        "--service-environment", help="Name or ARN.")],  # fmt: skip
    capacity_limits: OptionalCapacityLimits = None,
    state: StateOpt = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a service environment's capacity or state (the capacity event)."""
    name = _name(service_environment)

    def build():
        return ({"kind": "UpdateServiceEnvironment", "serviceEnvironment": service_environment,
                 "capacityLimits": _many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "state": state},
                {"serviceEnvironmentName": name,
                 "serviceEnvironmentArn": f"{ARN}:service-environment/{name}"})  # fmt: skip

    _run(lambda: _write(nats_url, "UpdateServiceEnvironment", build, wait, wait_timeout, output))


@_verb("create-scheduling-policy")
def create_scheduling_policy(
    name: Annotated[str, typer.Option("--name")],
    quota_share_policy: Annotated[str, typer.Option(
        "--quota-share-policy", help="idleResourceAssignmentStrategy=FIFO")],  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a scheduling policy with a quota-share policy (what quota-share queues need)."""

    def build():
        return ({"kind": "CreateSchedulingPolicy", "name": name,
                 "quotaSharePolicy": _one("--quota-share-policy", quota_share_policy,
                                          "quotaSharePolicy"),
                 "tags": _one("--tags", tags, "tags")},
                {"name": name, "arn": f"{ARN}:scheduling-policy/{name}"})  # fmt: skip

    _run(lambda: _write(nats_url, "CreateSchedulingPolicy", build, wait, wait_timeout, output))


TimeLimitActions = Annotated[Optional[list[str]], typer.Option(
    "--job-state-time-limit-actions", show_default=False,
    help="reason=CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY,state=RUNNABLE,maxTimeSeconds=600,"
         "action=TERMINATE (several space-separated, or JSON).")]  # fmt: skip
PriorityOpt = Annotated[Optional[int], typer.Option(
    "--priority", help="0-1000 (no effect on quota-share queues).", show_default=False)]


@_verb("create-job-queue")
def create_job_queue(
    job_queue_name: Annotated[str, typer.Option("--job-queue-name")],
    service_environment_order: Annotated[list[str], typer.Option(
        "--service-environment-order", help="order=1,serviceEnvironment=<name>")],  # fmt: skip
    scheduling_policy_arn: Annotated[str, typer.Option(
        "--scheduling-policy-arn", help="The scheduling policy's name or ARN.")],  # fmt: skip
    priority: PriorityOpt = None,
    state: StateOpt = None,
    job_state_time_limit_actions: TimeLimitActions = None,
    job_queue_type: Annotated[Optional[str], typer.Option(
        "--job-queue-type", help="SAGEMAKER_TRAINING (the only type).",
        show_default=False)] = None,  # fmt: skip
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a job queue on one service environment, under a quota-share scheduling policy."""

    def build():
        return ({"kind": "CreateJobQueue", "jobQueueName": job_queue_name,
                 "serviceEnvironmentOrder": _many("--service-environment-order",
                                                  service_environment_order,
                                                  "serviceEnvironmentOrder"),
                 "schedulingPolicy": scheduling_policy_arn, "priority": priority, "state": state,
                 "jobStateTimeLimitActions": _many("--job-state-time-limit-actions",
                                                   job_state_time_limit_actions,
                                                   "jobStateTimeLimitActions"),
                 "jobQueueType": job_queue_type, "tags": _one("--tags", tags, "tags")},
                {"jobQueueName": job_queue_name,
                 "jobQueueArn": f"{ARN}:job-queue/{job_queue_name}"})  # fmt: skip

    _run(lambda: _write(nats_url, "CreateJobQueue", build, wait, wait_timeout, output))


@_verb("update-job-queue")
def update_job_queue(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    state: StateOpt = None,
    priority: PriorityOpt = None,
    job_state_time_limit_actions: TimeLimitActions = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a job queue's state, priority or job-state time limits."""
    name = _name(job_queue)

    def build():
        return ({"kind": "UpdateJobQueue", "jobQueue": job_queue, "state": state,
                 "priority": priority,
                 "jobStateTimeLimitActions": _many("--job-state-time-limit-actions",
                                                   job_state_time_limit_actions,
                                                   "jobStateTimeLimitActions")},
                {"jobQueueName": name, "jobQueueArn": f"{ARN}:job-queue/{name}"})  # fmt: skip

    _run(lambda: _write(nats_url, "UpdateJobQueue", build, wait, wait_timeout, output))


# -- quota shares ----------------------------------------------------------------------------

ShareArn = Annotated[Optional[str], typer.Option(
    "--quota-share-arn", show_default=False,
    help="arn:aws:batch:<region>:<account>:job-queue/<queue>/quota-share/<share>; or give "
         "--job-queue and --quota-share-name.")]  # fmt: skip
ShareQueue = Annotated[Optional[str], typer.Option(
    "--job-queue", help="Name or ARN (with --quota-share-name).", show_default=False)]  # fmt: skip
ShareName = Annotated[Optional[str], typer.Option(
    "--quota-share-name", help="With --job-queue.", show_default=False)]  # fmt: skip
Sharing = Annotated[Optional[str], typer.Option(
    "--resource-sharing-configuration", show_default=False,
    help="strategy=RESERVE|LEND|LEND_AND_BORROW[,borrowLimit=<percent, -1 unlimited>]")]
SharePreemption = Annotated[Optional[str], typer.Option(
    "--preemption-configuration", show_default=False,
    help="inSharePreemption=ENABLED|DISABLED")]  # fmt: skip


@_verb("create-quota-share")
def create_quota_share(
    quota_share_name: Annotated[str, typer.Option("--quota-share-name")],
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    capacity_limits: CapacityLimits,
    resource_sharing_configuration: Sharing = None,
    preemption_configuration: SharePreemption = None,
    state: StateOpt = None,
    tags: Tags = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Create a quota share: capacity a team may use without borrowing, and how it shares."""
    queue = _name(job_queue)

    def build():
        return ({"kind": "CreateQuotaShare", "quotaShareName": quota_share_name,
                 "jobQueue": job_queue,
                 "capacityLimits": _many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "resourceSharingConfiguration": _one(
                     "--resource-sharing-configuration", resource_sharing_configuration,
                     "resourceSharingConfiguration"),
                 "preemptionConfiguration": _one("--preemption-configuration",
                                                 preemption_configuration,
                                                 "sharePreemptionConfiguration"),
                 "state": state, "tags": _one("--tags", tags, "tags")},
                {"quotaShareName": quota_share_name,
                 "quotaShareArn": _share_arn(queue, quota_share_name)})  # fmt: skip

    _run(lambda: _write(nats_url, "CreateQuotaShare", build, wait, wait_timeout, output))


@_verb("update-quota-share")
def update_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    capacity_limits: OptionalCapacityLimits = None,
    resource_sharing_configuration: Sharing = None,
    preemption_configuration: SharePreemption = None,
    state: StateOpt = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a quota share's limits, sharing strategy, in-share preemption or state."""

    def build():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        return ({"kind": "UpdateQuotaShare", "jobQueue": queue, "quotaShareName": share,
                 "capacityLimits": _many("--capacity-limits", capacity_limits, "capacityLimits"),
                 "resourceSharingConfiguration": _one(
                     "--resource-sharing-configuration", resource_sharing_configuration,
                     "resourceSharingConfiguration"),
                 "preemptionConfiguration": _one("--preemption-configuration",
                                                 preemption_configuration,
                                                 "sharePreemptionConfiguration"),
                 "state": state},
                {"quotaShareName": share, "quotaShareArn": _share_arn(queue, share)})  # fmt: skip

    _run(lambda: _write(nats_url, "UpdateQuotaShare", build, wait, wait_timeout, output))


@_verb("delete-quota-share")
def delete_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Delete a quota share (set it DISABLED first); its unfinished jobs are terminated."""

    def build():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        return {"kind": "DeleteQuotaShare", "jobQueue": queue, "quotaShareName": share}, {}

    _run(lambda: _write(nats_url, "DeleteQuotaShare", build, wait, wait_timeout, output))


@_verb("list-quota-shares", PANEL_READ)
def list_quota_shares(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    max_results: Annotated[Optional[int], typer.Option("--max-results", min=1, max=100,
                                                       show_default=False)] = None,  # fmt: skip
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """List a job queue's quota shares with their configuration and current usage."""

    async def work():
        async with _session(nats_url) as bus:
            answer = await _ask(bus, "ListQuotaShares", "list-quota-shares", jobQueue=job_queue)
        if max_results is not None:
            answer["quotaShares"] = answer["quotaShares"][:max_results]
        _emit(answer, output, lambda console, doc: _render_items(
            console, doc["quotaShares"], f"Quota shares of {_name(job_queue)}", SHARE_COLUMNS))

    _run(work)


@_verb("describe-quota-share", PANEL_READ)
def describe_quota_share(
    quota_share_arn: ShareArn = None,
    job_queue: ShareQueue = None,
    quota_share_name: ShareName = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe one quota share: configuration, state, status and usage."""

    async def work():
        queue, share = _share_target(quota_share_arn, job_queue, quota_share_name)
        async with _session(nats_url) as bus:
            answer = await _ask(bus, "DescribeQuotaShare", "describe-quota-share",
                                jobQueue=queue, quotaShareName=share)  # fmt: skip
        _emit(answer, output)

    _run(work)


@_verb("describe-service-environments", PANEL_READ)
def describe_service_environments(
    service_environments: Annotated[Optional[list[str]], typer.Option(
        "--service-environments", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the service environments."""
    _describe_filtered(nats_url, output, "DescribeServiceEnvironments",
                       "describe-service-environments", "serviceEnvironments",
                       "serviceEnvironmentName", service_environments, "Service environments")  # fmt: skip


@_verb("describe-job-queues", PANEL_READ)
def describe_job_queues(
    job_queues: Annotated[Optional[list[str]], typer.Option(
        "--job-queues", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the job queues."""
    _describe_filtered(nats_url, output, "DescribeJobQueues", "describe-job-queues",
                       "jobQueues", "jobQueueName", job_queues, "Job queues")  # fmt: skip


@_verb("describe-scheduling-policies", PANEL_READ)
def describe_scheduling_policies(
    arns: Annotated[Optional[list[str]], typer.Option(
        "--arns", help="Only these (names or ARNs).", show_default=False)] = None,
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Describe the scheduling policies."""
    _describe_filtered(nats_url, output, "DescribeSchedulingPolicies",
                       "describe-scheduling-policies", "schedulingPolicies", "name", arns,
                       "Scheduling policies")  # fmt: skip


def _describe_filtered(nats_url, output, operation: str, verb: str, key: str, name_field: str,
                       names: list[str] | None, title: str) -> None:  # fmt: skip
    """A describe-* read, kept to the items named (by name or ARN) when any are."""
    wanted = {_name(item) for item in names or []}

    async def work():
        async with _session(nats_url) as bus:
            answer = await _ask(bus, operation, verb)
        answer[key] = [item for item in answer[key] if not wanted or item[name_field] in wanted]
        _emit(answer, output, lambda console, doc: _render_items(console, doc[key], title))

    _run(work)


# -- service jobs ----------------------------------------------------------------------------


@_verb("submit-service-job")
def submit_service_job(
    job_name: Annotated[str, typer.Option("--job-name")],
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    quota_share_name: Annotated[str, typer.Option("--quota-share-name")],
    service_request_payload: Annotated[Optional[str], typer.Option(
        "--service-request-payload", show_default=False,
        help="The SageMaker CreateTrainingJob request (JSON text or file://path); its "
             "ResourceConfig gives the instances needed.")] = None,  # fmt: skip
    instance_type: Annotated[Optional[str], typer.Option(
        "--instance-type", show_default=False,
        help="Shortcut instead of a payload: the instance type needed...")] = None,  # fmt: skip
    instance_count: Annotated[Optional[int], typer.Option(
        "--instance-count", min=1, show_default=False,
        help="...and how many of them (default 1).")] = None,  # fmt: skip
    capacity_usage: Annotated[Optional[list[str]], typer.Option(
        "--capacity-usage", show_default=False,
        help="Or the need itself: capacityUnit=ml.g5.xlarge,quantity=2 (several "
             "space-separated).")] = None,  # fmt: skip
    scheduling_priority: Annotated[Optional[int], typer.Option(
        "--scheduling-priority", help="0-9999, higher first (default 0).",
        show_default=False)] = None,  # fmt: skip
    preemption_configuration: Annotated[Optional[str], typer.Option(
        "--preemption-configuration", help="preemptionRetriesBeforeTermination=N",
        show_default=False)] = None,  # fmt: skip
    retry_strategy: Annotated[Optional[str], typer.Option(
        "--retry-strategy", help="attempts=N (1-10)", show_default=False)] = None,  # fmt: skip
    timeout_config: Annotated[Optional[str], typer.Option(
        "--timeout-config", help="attemptDurationSeconds=N", show_default=False)] = None,
    tags: Tags = None,
    client_token: Annotated[Optional[str], typer.Option(
        "--client-token", help="Idempotency token: a repeat returns the same job.",
        show_default=False)] = None,  # fmt: skip
    job_id: Annotated[Optional[str], typer.Option(
        "--job-id", help="Choose the job id (else the scheduler derives one).",
        show_default=False)] = None,  # fmt: skip
    service_job_type: Annotated[Optional[str], typer.Option(
        "--service-job-type", help="SAGEMAKER_TRAINING (the only type).",
        show_default=False)] = None,  # fmt: skip
    share_identifier: Annotated[Optional[str], typer.Option(
        "--share-identifier", help="Fair-share queues only: refused here.", hidden=True)] = None,
    wait: Annotated[Optional[bool], typer.Option(
        "--wait/--no-wait", show_default=False,
        help="--wait: also print the decision's facts.  --no-wait: return once the command "
             "is stored (needs --job-id).  Neither: wait for the decision, print the id.")] = None,
    wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Submit a training job to a quota share; prints jobArn, jobName and jobId like AWS.

    Like `aws batch submit-service-job`, this answers with the job's id and fails at once
    (exit 1, reason on stderr) when the submission is refused.  The id is the scheduler's to
    derive unless you choose it, so by default the command waits for the scheduler's
    decision (normally milliseconds).  --wait also prints the decision's facts (dispatched?
    borrowing? preempting whom?).  --no-wait returns as soon as JetStream stored the command,
    like the other write verbs; it needs --job-id, and a refusal then shows only in
    `quotasched facts`.
    """

    def build() -> dict[str, Any]:
        if wait is False and not job_id:
            raise Failure("submit-service-job: --no-wait needs --job-id (without it the job id "
                          "is known only once the scheduler decided)", EXIT_USAGE)  # fmt: skip
        need = _need(service_request_payload, instance_type, instance_count, capacity_usage)
        return _checked("SubmitServiceJob", {
            "kind": "SubmitServiceJob", "jobName": job_name, "jobQueue": job_queue,
            "quotaShareName": quota_share_name, **need, "jobId": job_id,
            "schedulingPriority": scheduling_priority, "shareIdentifier": share_identifier,
            "preemptionConfiguration": _one("--preemption-configuration",
                                            preemption_configuration,
                                            "jobPreemptionConfiguration"),
            "retryStrategy": _one("--retry-strategy", retry_strategy, "retryStrategy"),
            "timeoutConfig": _one("--timeout-config", timeout_config, "timeoutConfig"),
            "tags": _one("--tags", tags, "tags"), "clientToken": client_token,
            "serviceJobType": service_job_type,
        })  # fmt: skip

    async def work():
        command = build()
        async with _session(nats_url) as bus:
            if wait is False:
                decided_id, seq, facts = job_id, await _publish(bus, command), None
            else:
                facts = await _decide(bus, "SubmitServiceJob", command, wait_timeout)
                submitted = next(f for f in facts if f.kind in ("JobSubmitted",
                                                                "SubmissionDeduplicated"))
                decided_id, seq = submitted.job_id, submitted.command_seq
        response = {"jobArn": _job_arn(decided_id), "jobName": job_name, "jobId": decided_id,
                    "commandSeq": seq}  # fmt: skip
        if wait:
            response["facts"] = _fact_documents(facts)
        _emit(response, output)

    _run(work)


def _need(payload: str | None, instance_type: str | None, instance_count: int | None,
          capacity_usage: list[str] | None) -> dict[str, Any]:  # fmt: skip
    given = [name for name, value in (("--service-request-payload", payload),
                                      ("--instance-type", instance_type),
                                      ("--capacity-usage", capacity_usage)) if value]  # fmt: skip
    if instance_count is not None and not instance_type:
        raise Failure("submit-service-job: --instance-count goes with --instance-type", EXIT_USAGE)
    if len(given) != 1:
        raise Failure("submit-service-job: give the capacity the job needs with exactly one of "
                      "--service-request-payload, --instance-type [--instance-count] or "
                      f"--capacity-usage (got {', '.join(given) or 'none'})", EXIT_USAGE)
    if payload:
        return {"serviceRequestPayload": load_file("--service-request-payload", payload)}
    if instance_type:
        return {"capacityUsage": [{"capacityUnit": instance_type,
                                   "quantity": instance_count or 1}]}  # fmt: skip
    return {"capacityUsage": _many("--capacity-usage", capacity_usage, "capacityUsage")}


async def _job_write(url: str | None, operation: str, command: dict[str, Any],
                     respond: Callable[[dict], dict], wait: bool, timeout: float,
                     output: Output) -> None:  # fmt: skip
    """A command about one job: its route is the job's (queue, share), asked of the
    scheduler, and an unknown job fails like AWS's ClientException (exit 1)."""
    command = _checked(operation, command)
    async with _session(url) as bus:
        job = await _ask(bus, operation, "describe-service-job", jobId=command["jobId"])
        route = (job["jobQueue"], job["quotaShareName"])
        command = {**command, "jobId": job["jobId"]}
        response = await _send(bus, operation, command, respond(job), wait, timeout, route)
    _emit(response, output)


JobIdOpt = Annotated[str, typer.Option("--job-id", help="Job id or job ARN.")]


@_verb("update-service-job")
def update_service_job(
    job_id: JobIdOpt,
    scheduling_priority: Annotated[int, typer.Option("--scheduling-priority", help="0-9999.")],
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Change a job's scheduling priority (may preempt within its share, or make it a victim)."""
    command = {"kind": "UpdateServiceJob", "jobId": job_id,
               "schedulingPriority": scheduling_priority}  # fmt: skip
    _run(lambda: _job_write(nats_url, "UpdateServiceJob", command, lambda job: {
        "jobArn": job["jobArn"], "jobName": job["jobName"], "jobId": job["jobId"],
    }, wait, wait_timeout, output))  # fmt: skip


@_verb("terminate-service-job")
def terminate_service_job(
    job_id: JobIdOpt,
    reason: Annotated[str, typer.Option("--reason", help="Recorded as the statusReason.")],
    wait: Wait = False, wait_timeout: WaitTimeout = 30.0, output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """Terminate a job; it ends FAILED with isTerminated."""
    command = {"kind": "TerminateServiceJob", "jobId": job_id, "reason": reason}
    _run(lambda: _job_write(nats_url, "TerminateServiceJob", command, lambda job: {},
                            wait, wait_timeout, output))  # fmt: skip


@_verb("describe-service-job", PANEL_READ)
def describe_service_job(
    job_id: JobIdOpt, output: OutputOpt = Output.json, nats_url: NatsUrl = None,
) -> None:
    """Describe one job: status, share, priority, capacity, preemptions, attempts."""

    async def work():
        async with _session(nats_url) as bus:
            answer = await _ask(bus, "DescribeServiceJob", "describe-service-job", jobId=job_id)
        _emit(answer, output)

    _run(work)


FILTER_NAMES = ("JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT", "SHARE_IDENTIFIER",
                "QUOTA_SHARE_NAME")  # fmt: skip


@_verb("list-service-jobs", PANEL_READ)
def list_service_jobs(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    job_status: Annotated[Optional[str], typer.Option(
        "--job-status", show_default=False,
        help="RUNNABLE, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED (or ALL) "
             "(default RUNNING, as AWS).")] = None,  # fmt: skip
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filters", show_default=False,
        help="name=QUOTA_SHARE_NAME,values=qs1 (kept with --job-status) or "
             "name=JOB_NAME,values=train-* (ignores --job-status); several "
             "space-separated.")] = None,
    max_results: Annotated[Optional[int], typer.Option("--max-results", min=1, max=100,
                                                       show_default=False)] = None,  # fmt: skip
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """List a queue's jobs, newest first, like AWS (default status filter: RUNNING)."""

    async def work():
        parsed = _many("--filters", filters, "filters")
        for item in parsed or []:
            if not isinstance(item, dict) or item.get("name") not in FILTER_NAMES:
                raise Failure(f"Error parsing parameter '--filters': each filter needs a name, "
                              f"one of {', '.join(FILTER_NAMES)}; got {item!r}", EXIT_USAGE)
        async with _session(nats_url) as bus:
            answer = await _ask(bus, "ListServiceJobs", "list-service-jobs", jobQueue=job_queue,
                                jobStatus=job_status, filters=parsed, maxResults=max_results)
        _emit(answer, output, lambda console, doc: _render_items(
            console, doc["jobSummaryList"], f"Jobs in {_name(job_queue)}", JOB_COLUMNS))

    _run(work)


@_verb("get-job-queue-snapshot", PANEL_READ)
def get_job_queue_snapshot(
    job_queue: Annotated[str, typer.Option("--job-queue", help="Name or ARN.")],
    output: OutputOpt = Output.json,
    nats_url: NatsUrl = None,
) -> None:
    """The queue's front (next RUNNABLE jobs, per share and overall) and capacity usage."""

    async def work():
        async with _session(nats_url) as bus:
            answer = await _ask(bus, "GetJobQueueSnapshot", "get-job-queue-snapshot",
                                jobQueue=job_queue)  # fmt: skip
        _emit(answer, output, _render_snapshot)

    _run(work)


# -- command files and the fact log ----------------------------------------------------------


class _Decisions:
    """The facts recorded for the commands this process publishes, by command seq (the
    scheduler writes them all at once, and each carries the count in its `Qm-Facts` header)."""

    def __init__(self) -> None:
        self.facts: dict[int, list] = {}
        self.expected: dict[int, int] = {}
        self.routes: dict[str, tuple[str, str]] = {}  # jobId -> (queue, share), as decided
        self.changed = asyncio.Event()

    async def start(self, bus) -> None:
        from nats.js.api import ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        from events.subjects import FACTS_STREAM

        try:
            await bus.js.subscribe("qm.fact.>", cb=self._on_fact, ordered_consumer=True,
                                   stream=FACTS_STREAM,
                                   config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW))
        except NotFoundError:
            raise _no_streams(bus.url) from None

    async def _on_fact(self, msg) -> None:
        from events.codec import decode_fact

        fact = decode_fact(msg.data)
        self.facts.setdefault(fact.command_seq, []).append(fact)
        self.expected[fact.command_seq] = int((msg.headers or {}).get("Qm-Facts", "1"))
        if fact.kind == "JobSubmitted":
            self.routes[fact.job_id] = (fact.job_queue, fact.quota_share_name)
        self.changed.set()

    def decided(self, seq: int) -> bool:
        return seq in self.facts and len(self.facts[seq]) >= self.expected[seq]

    async def wait(self, seqs: list[int], timeout: float) -> list[int]:
        """Waits until every one of `seqs` is decided; returns those still undecided."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pending = [seq for seq in seqs if not self.decided(seq)]
            remaining = deadline - loop.time()
            if not pending or remaining <= 0:
                return pending
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                pass


class _Line:
    """One non-blank line of a command file, decoded (or with the reason it can't be)."""

    def __init__(self, number: int, raw: bytes):
        from events.codec import DecodeError, decode_command

        self.number, self.raw = number, raw
        self.command, self.problem, self.kind = None, None, None
        try:
            self.command = decode_command(raw)
            self.kind = self.command.kind
        except DecodeError as error:
            self.problem, self.kind = error.reason, error.kind


def _read_lines(path: str) -> list[_Line]:
    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except OSError as error:
        raise Failure(f"quotasched apply: cannot read {path}: {error.strerror}",
                      EXIT_USAGE) from None
    return [_Line(number, line.rstrip(b"\r")) for number, line in
            enumerate(data.split(b"\n"), start=1) if line.strip()]  # fmt: skip


@_verb("apply", PANEL_LOG)
def apply(
    file: Annotated[str, typer.Argument(
        help="Command file: JSON Lines, the format `quotasched replay` reads ('-': stdin).")],
    wait: Annotated[bool, typer.Option(
        "--wait", help="Wait for every decision; exit 1 if any command was refused.")] = False,
    wait_timeout: Annotated[float, typer.Option(
        "--wait-timeout", min=0.1,
        help="Seconds to wait for all decisions (exit 3 after).")] = 60.0,
    keep_invalid: Annotated[bool, typer.Option(
        "--keep-invalid", help="Publish lines that are not valid commands too; the scheduler "
                               "records each as a CommandRejected, as replay does.")] = False,
    nats_url: NatsUrl = None,
) -> None:
    """Publish a command file, line by line in order, as the scheduler's input.

    Lines keep their `at`; lines without one are stamped by the scheduler.  UpdateServiceJob,
    TerminateServiceJob and ReportJobStatus lines go to their job's subject: known from a
    submission earlier in the file, else asked of the scheduler (a job it does not know is
    published anyway, and refused).  Prints one summary line.  A line that is not a valid
    command stops everything before anything is published (exit 2), unless --keep-invalid.
    --wait waits for the decisions of every line (Tick lines excepted: they decide nothing
    unless a timer fires), lists the refused ones on stderr and exits 1 if there are any.
    """
    lines = _read_lines(file)
    invalid = [line for line in lines if line.command is None]
    if invalid and not keep_invalid:
        for line in invalid:
            typer.echo(f"{file}:{line.number}: {line.problem}", err=True)
        typer.echo(f"quotasched apply: {len(invalid)} invalid line(s); nothing was published "
                   f"(--keep-invalid publishes them to be recorded as refused)", err=True)
        raise typer.Exit(EXIT_USAGE)
    _run(lambda: _apply(file, lines, wait, wait_timeout, nats_url))


async def _apply(path: str, lines: list[_Line], wait: bool, timeout: float,
                 url: str | None) -> int:  # fmt: skip
    async with _session(url) as bus:
        decisions = _Decisions()
        await decisions.start(bus)
        file_routes: dict[str, tuple[str, str]] = {}
        derived: list[int] = []  # seqs of submissions whose job id the scheduler derives
        published: list[tuple[_Line, int]] = []
        for line in lines:
            try:
                seq = await _publish_line(bus, line, file_routes, derived, decisions, timeout)
            except Failure as failure:
                raise Failure(f"{failure.message}\nquotasched apply: stopped at {path}:"
                              f"{line.number}; {len(published)} earlier line(s) were published"
                              f"{_seq_range(published)}, this one and the rest were not",
                              failure.code) from None  # fmt: skip
            published.append((line, seq))
            command = line.command
            if command is not None and command.kind == "SubmitServiceJob":
                if command.job_id:
                    file_routes[command.job_id] = (command.job_queue, command.quota_share_name)
                else:
                    derived.append(seq)
        count = len(published)
        summary = (f"applied {count} command{'' if count == 1 else 's'} from {path} to "
                   f"{bus.url}{_seq_range(published)}")  # fmt: skip
        if not wait:
            typer.echo(summary)
            return 0
        awaited = [seq for line, seq in published if line.kind != "Tick"]
        undecided = await decisions.wait(awaited, timeout)
    return _report(path, published, awaited, undecided, decisions, summary, timeout)


def _seq_range(published: list[tuple[_Line, int]]) -> str:
    if not published:
        return ""
    first, last = published[0][1], published[-1][1]
    return f" (command seq {first})" if first == last else f" (command seq {first}-{last})"


def _report(path: str, published: list[tuple[_Line, int]], awaited: list[int],
            undecided: list[int], decisions: _Decisions, summary: str, timeout: float) -> int:
    refused = [(line, fact) for line, seq in published for fact in decisions.facts.get(seq, [])
               if fact.kind == "CommandRejected"]  # fmt: skip
    for line, fact in refused:
        typer.echo(f"{path}:{line.number}: {fact.command_kind} refused: {fact.status_reason}",
                   err=True)  # fmt: skip
    decided = len(awaited) - len(undecided)
    typer.echo(f"{summary}; {decided} decided: {decided - len(refused)} accepted, "
               f"{len(refused)} refused")  # fmt: skip
    if undecided:
        raise Failure(f"quotasched apply: {len(undecided)} command(s) not decided within "
                      f"{timeout:g}s (first: command seq {undecided[0]}); they are stored and "
                      f"will be decided once a scheduler runs", EXIT_UNDECIDED)  # fmt: skip
    return EXIT_REFUSED if refused else 0


async def _publish_line(bus, line: _Line, file_routes: dict, derived: list[int],
                        decisions: _Decisions, timeout: float) -> int:  # fmt: skip
    import re

    from events.subjects import COMMANDS_STREAM, JOB_ID_COMMANDS, command_subject

    command = line.command
    if command is None:  # --keep-invalid: the scheduler records it as refused
        token_ok = line.kind and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", line.kind)
        kind = line.kind if token_ok else "Unknown"
        ack = await bus.js.publish(command_subject(kind), line.raw, stream=COMMANDS_STREAM)
        return ack.seq
    route = None
    if command.kind in JOB_ID_COMMANDS:
        route = file_routes.get(command.job_id) or decisions.routes.get(command.job_id)
        if route is None:
            route = await _route_of(bus, command.job_id, derived, decisions, timeout)
    return await _publish(bus, line.raw, route)


async def _route_of(bus, job_id: str, derived: list[int], decisions: _Decisions,
                    timeout: float) -> tuple:  # fmt: skip
    """The (queue, share) of a job the file did not name: maybe one of the file's own
    submissions with a derived id (wait for those decisions), else what the scheduler knows."""
    from nats.errors import NoRespondersError

    from services.client import ClientError

    if derived:
        await decisions.wait(derived, timeout)
        if job_id in decisions.routes:
            return decisions.routes[job_id]
    try:
        return await bus.route(job_id)
    except ClientError:
        return (None, None)  # unknown job: published anyway, so the refusal is on record
    except (NoRespondersError, TimeoutError):
        raise _no_scheduler(bus.url) from None


@_verb("facts", PANEL_LOG)
def facts(
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new facts as they are recorded.")] = False,
    job_queue: Annotated[Optional[str], typer.Option(
        "--job-queue", help="Only the facts about this job queue (its shares and jobs).",
        show_default=False)] = None,  # fmt: skip
    quota_share_name: Annotated[Optional[str], typer.Option(
        "--quota-share-name", help="With --job-queue: only this share's facts.",
        show_default=False)] = None,  # fmt: skip
    nats_url: NatsUrl = None,
) -> None:
    """Print the fact log as JSON Lines, in log order, as `quotasched replay` prints facts.

    Same encoding byte for byte, so `diff` against a replay works once the bus-specific
    `at` (stamped from the stream clock) and `commandSeq` (the command stream's sequence,
    not a line number) are set aside.  Stops at the log's end unless --follow.
    """
    if quota_share_name and not job_queue:
        typer.echo("quotasched facts: --quota-share-name goes with --job-queue", err=True)
        raise typer.Exit(EXIT_USAGE)
    _run(lambda: _print_facts(nats_url, follow, job_queue, quota_share_name))


async def _print_facts(url: str | None, follow: bool, job_queue: str | None,
                       share: str | None) -> int | None:  # fmt: skip
    """Copies the log to stdout; Ctrl-C (or SIGTERM) ends a --follow cleanly, exit 130."""
    import signal

    from events.subjects import facts_filter

    subject = facts_filter(_name(job_queue) if job_queue else None, share)
    async with _session(url, reconnect_forever=follow) as bus:
        reader = asyncio.create_task(_copy_facts(bus, subject, follow))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, reader.cancel)
        try:
            await reader
        except asyncio.CancelledError:
            return 130
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            sys.stdout.flush()
    return None


async def _copy_facts(bus, subject: str, follow: bool) -> None:
    from contextlib import aclosing

    from nats.js.errors import NotFoundError

    from services.scheduler.log import read_log

    out = sys.stdout
    try:
        # aclosing: the consumer is removed here, while the connection is still open
        async with aclosing(read_log(bus.js, subject, follow=follow)) as log:
            async for _, data, _ in log:
                out.write(_canonical(data) + "\n")
                if follow:
                    out.flush()
    except NotFoundError:
        raise _no_streams(bus.url) from None


def _canonical(data: bytes) -> str:
    """The fact as replay prints it (decode, then the one encoder); a fact this version can't
    read is printed as stored, with a warning."""
    from pydantic import ValidationError

    from events.codec import decode_fact, encode

    try:
        return encode(decode_fact(data))
    except ValidationError as error:
        typer.echo(f"quotasched facts: a fact this version can't read: {error}", err=True)
        return data.decode("utf-8", errors="replace")
