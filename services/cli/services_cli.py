"""The service commands of `quotasched`: `up`, `scheduler`, `executor`, `projector` and `gate`.

Each one runs long-lived processes against NATS (an embedded server for `up`); this module owns
their options (the shared `--nats-url` and `--metrics-port`), the `Settings` they build and the
exit status each one reports.  Imports of the runtime stay inside the commands, so the offline
commands start fast.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from quotasched.events.base import NAME_PATTERN, NAME_RULE


def register(app: typer.Typer) -> None:
    """Add `up`, `scheduler`, `executor`, `projector` and `gate` to the `quotasched` app, in that
    order."""
    app.command()(up)
    app.command()(scheduler)
    app.command("executor")(executor_command)
    app.command("projector")(projector_command)
    app.command("gate")(gate_command)


UP_EXECUTORS = ("simulated", "process", "sagemaker", "agent", "none")  # `up --executor`
EXECUTOR_KINDS = ("simulated", "process", "sagemaker")  # `executor --kind`


def offer(*values: str):
    """Shell completion for an option that takes one of `values` (`--install-completion`)."""

    def complete(incomplete: str) -> list[str]:
        return [value for value in values if value.startswith(incomplete)]

    return complete


NatsUrl = Annotated[
    Optional[str],
    typer.Option("--nats-url", envvar="QUOTASCHED_NATS_URL",
                 help="NATS server or cluster to use (default: start an embedded one)."),
]


MetricsPort = Annotated[
    Optional[int],
    typer.Option("--metrics-port", envvar="QUOTASCHED_METRICS_PORT", min=0, max=65535,
                 help="Serve GET /metrics (Prometheus) and /healthz on this port (0: any free "
                      "port; default: off; host: QUOTASCHED_METRICS_HOST, 127.0.0.1)."),
]


PassEnv = Annotated[Optional[list[str]], typer.Option(
    "--pass-env", help="An environment variable of this process that every job also gets "
                       "(repeat it, or NAME,NAME; default: QUOTASCHED_PASS_ENV). A job's "
                       "environment is otherwise only PATH, HOME, LANG, LC_*, TZ, TERM, TMPDIR, "
                       "USER, its payload's Environment and QUOTASCHED_JOB_ID/ATTEMPT; "
                       "QUOTASCHED_*, AWS_*, NATS_* and *CREDS*/*CREDENTIAL* are refused.",
    show_default=False)]


def pass_env_names(verb: str, given: Optional[list[str]]) -> tuple[str, ...]:
    """`--pass-env` (else QUOTASCHED_PASS_ENV), checked before anything starts: a name no job
    may have (a credential) is one line and exit status 2 (services/executors/jobenv.py)."""
    import os

    from quotasched.services.executors.jobenv import JobEnvError, check_pass_env, split_names

    text = ",".join(given) if given else os.environ.get("QUOTASCHED_PASS_ENV", "")
    try:
        return check_pass_env(split_names(text), os.environ)
    except JobEnvError as error:
        typer.echo(f"quotasched {verb}: --pass-env: {error}", err=True)
        raise typer.Exit(2) from None


def _settings(nats_url: Optional[str], **values) -> "Settings":
    """The settings, or one line per refused value and exit status 2 (not a traceback)."""
    from pydantic import ValidationError

    from quotasched.services.settings import Settings

    try:
        return Settings(nats_url=nats_url, **{k: v for k, v in values.items() if v is not None})
    except ValidationError as error:
        for problem in error.errors():
            typer.echo(f"quotasched: {problem['msg'].removeprefix('Value error, ')}", err=True)
        raise typer.Exit(2) from None


RunAs = Annotated[Optional[str], typer.Option(
    "--run-as", envvar="QUOTASCHED_RUN_AS",
    help="Run every job as this user (name or uid; not root), in a working directory of its "
         "own that is also its HOME, so that a job cannot read or write the executor's files "
         "(its ledger, logs, credentials). The executor must run as root. Default: jobs run "
         "as the executor's own user.", show_default=False)]
WorkDir = Annotated[Optional[Path], typer.Option(
    "--work-dir", envvar="QUOTASCHED_JOB_WORK_DIR",
    help="With --run-as: where each attempt's working directory goes, <dir>/<job>/<attempt> "
         "(default: <state-dir>/work).", show_default=False)]


def job_user_of(verb: str, run_as: Optional[str], work_dir: Optional[Path],
                state_dir: Path) -> tuple[Optional[str], Optional[str]]:  # fmt: skip
    """`--run-as` checked before anything starts (one line and exit status 2 where it cannot
    be honoured), and one line on who the jobs run as; the (user, work dir) settings."""
    from quotasched.services.executors.jobuser import JobUser, JobUserError, describe_default

    if run_as is None:
        typer.echo(describe_default(), err=True)
        return None, None
    where = str(work_dir or state_dir / "work")
    try:
        typer.echo(JobUser.resolve(run_as, where).describe(), err=True)
    except JobUserError as error:
        typer.echo(f"quotasched {verb}: {error}", err=True)
        raise typer.Exit(2) from None
    return run_as, where


RequireContainment = Annotated[bool, typer.Option(
    "--require-containment", help="Refuse to start (exit 2) unless each attempt can get a cgroup "
                                  "v2 of its own, killed whole when the attempt ends (Linux >= "
                                  "5.14, root or a delegated cgroup); without it, a fallback "
                                  "that a job clearing its environment can escape.")]


def say_containment(verb: str, owner: str, required: bool) -> None:
    """One line on how the attempts are contained (services/executors/contain.py); with
    `required`, no cgroup is a refusal instead, in one line, exit status 2."""
    from quotasched.services.executors.contain import check

    support = check(owner)
    if required and support.parent is None:
        typer.echo(f"quotasched {verb}: --require-containment: no cgroup v2 for the attempts "
                   f"here ({support.reason})", err=True)  # fmt: skip
        raise typer.Exit(2)
    typer.echo(support.describe(), err=True)


def check_attempt_file(verb: str, path: Path) -> None:
    """Open an executor's attempt file before starting, so that a damaged one stops the start
    with its path (exit 2), not in a traceback from inside the running stack."""
    from quotasched.services.executors.ledger import Ledger, LedgerError

    try:
        Ledger(str(path))
    except LedgerError as error:
        typer.echo(f"quotasched {verb}: {error}", err=True)
        raise typer.Exit(2) from None


StopJobs = Annotated[bool, typer.Option(
    "--stop-jobs", help="On a shutdown, stop the jobs this executor runs and report them FAILED. "
                        "Default: every executor leaves them running, and the next one "
                        "started on the same state follows them to their end.")]


def up(
    nats_url: NatsUrl = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Where the embedded server keeps its streams.")] = Path(".quotasched"),
    port: Annotated[Optional[int], typer.Option("--port", help="Port of the embedded server (default: a free one).")] = None,
    executor: Annotated[str, typer.Option("--executor", autocompletion=offer(*UP_EXECUTORS), help="simulated, process, sagemaker, agent (this host's GPUs: --gpus, --capacity-unit, --service-environment) or none")] = "simulated",
    speed: Annotated[float, typer.Option("--speed", help="Simulated executor: time speed-up factor.")] = 1.0,
    db: Annotated[Optional[Path], typer.Option("--db", help="The projector's DuckDB file (default: <data-dir>/quotasched.duckdb).")] = None,
    no_projector: Annotated[bool, typer.Option("--no-projector", help="Do not run the projector.")] = False,
    metrics_port: MetricsPort = None,
    aws_port: Annotated[Optional[str], typer.Option(
        "--aws-port", help="Serve the AWS Batch API (rest-json, for `aws batch --endpoint-url` "
                           "and boto3) on 127.0.0.1 at this port (default: a free one; 0 or "
                           "off: not at all).", show_default=False)] = None,
    web_port: Annotated[Optional[str], typer.Option(
        "--web-port", help="Serve the live web view (read-only) on 127.0.0.1 at this port "
                           "(default: a free one; 0 or off: not at all).",
        show_default=False)] = None,
    gpus: Annotated[Optional[str], typer.Option("--gpus", help="--executor agent: the GPUs to hand out (0,1,2; default: NVML's).", show_default=False)] = None,
    capacity_unit: Annotated[Optional[str], typer.Option("--capacity-unit", help="--executor agent: the unit one GPU is.", show_default=False)] = None,
    service_environment: Annotated[Optional[str], typer.Option("--service-environment", help="--executor agent: the service environment whose capacity the GPUs are.", show_default=False)] = None,
    pass_env: PassEnv = None,
    run_as: RunAs = None,
    stop_jobs: StopJobs = False,
) -> None:
    """Start everything: nats-server (unless --nats-url), the scheduler, the admission gate,
    the projector and an executor.

    The first line printed is the NATS URL to point the CLI and clients at; the second,
    `AWS_ENDPOINT_URL_BATCH=http://127.0.0.1:PORT`, the AWS Batch endpoint for the real AWS CLI
    and boto3 (unless --aws-port off); the third, `WEB=http://127.0.0.1:PORT`, the live web view
    (unless --web-port off).  Ctrl-C stops it
    all cleanly, except the running jobs, which run on
    (--stop-jobs stops them too); starting again on the same --data-dir resumes where it
    stopped and follows those jobs to their end.  The projector
    keeps --db up to date with the fact log and answers queries over NATS (qm.proj.*); while it
    runs, no other process can open that file.  The admission gate, which teams'
    job commands pass (qm.in.*), runs as a child process, started again if it ends.

    One --data-dir, one `up`: a second one on the same directory is refused (exit 2).  The
    embedded server stops with `up`, however `up` stops.  Exit status 2: the data directory or
    the port cannot be used, or the projector cannot start.
    """
    import asyncio

    from quotasched.services import logs
    from quotasched.services.datadir import DataDirError, lock
    from quotasched.services.nats.embedded import ServerStartError
    from quotasched.services.endpoint.server import EndpointError
    from quotasched.services.web import WebError

    if executor not in UP_EXECUTORS:
        typer.echo("quotasched up: --executor must be simulated, process, sagemaker, agent or "
                   "none", err=True)  # fmt: skip
        raise typer.Exit(2)
    passed = pass_env_names("up", pass_env)
    user = work = None
    if executor in ("process", "agent"):  # jobs in <data-dir>/work with --run-as
        user, work = job_user_of("up", run_as, None, data_dir)
    elif run_as is not None:
        typer.echo(f"quotasched up: --run-as: the {executor} executor runs no process here",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    agent = None
    if executor == "agent":  # this host's GPU agent, its logs in <data-dir>/logs
        from quotasched.services.cli.agent_cli import agent_options

        agent = agent_options("up", gpus, capacity_unit, service_environment,
                              logs_dir=str(data_dir / "logs"))  # fmt: skip
    endpoint_port = _aws_port(aws_port)
    view_port = _aws_port(web_port, "--web-port")
    try:  # before anything touches the store: no second `up` on it, no traceback for a bad dir
        held = lock(data_dir, store=nats_url is None)
    except DataDirError as error:
        _refuse(error)
    with held:
        try:
            from quotasched.services.nats.embedded import check_port_free

            if nats_url is None and port:
                check_port_free(port)  # before the server opens the store, before any log line
            if endpoint_port:
                check_port_free(endpoint_port)  # the AWS Batch endpoint's, likewise
            if view_port:
                check_port_free(view_port)  # the web view's, likewise
            from quotasched.services.runtime import serve

            logs.configure()
            settings = _settings(nats_url, data_dir=str(data_dir), metrics_port=metrics_port,
                                 pass_env=passed, run_as=user, job_work_dir=work)  # fmt: skip
            projector_db = None if no_projector else str(db if db is not None else data_dir / "quotasched.duckdb")
            code = asyncio.run(serve(settings, port=port, executor=executor, speed=speed,
                                     announce=lambda url: print(url, flush=True),
                                     projector_db=projector_db, data_lock=held,
                                     aws_port=endpoint_port, agent=agent,
                                     web_port=view_port, stop_jobs=stop_jobs))  # fmt: skip
        except ServerStartError as error:
            _refuse(error)
        except (EndpointError, WebError) as error:
            _refuse(error)
        except Exception as error:
            _refuse_projector(error)
    raise typer.Exit(code)


def _aws_port(value: str | None, option: str = "--aws-port") -> int | None:
    """--aws-port (or --web-port): None (not given) is a free port (0 to the server); 0 or
    off, none."""
    if value is None:
        return 0
    if value.strip().lower() in ("0", "off"):
        return None
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        typer.echo(f"quotasched up: {option} must be a port (1-65535), 0 or off, not {value!r}",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    return port


def _refuse(reason: object) -> NoReturn:
    """`up` cannot start: one line, exit status 2."""
    typer.echo(f"quotasched up: {reason}", err=True)
    raise typer.Exit(2) from None


def _refuse_projector(error: Exception) -> NoReturn:
    """The projector's start-up errors, and a log the scheduler refuses to start on, are one
    line; anything else is a bug: re-raised."""
    from quotasched.projections.schema import SchemaMismatch
    from quotasched.projections.store import ProjectionError
    from quotasched.services.projector.service import ProjectorError
    from quotasched.services.scheduler.instance import InstanceLockError
    from quotasched.services.scheduler.log import LogIncomplete
    from quotasched.services.scheduler.mode import ModeConflict

    if isinstance(error, (LogIncomplete, ModeConflict, InstanceLockError)):
        _refuse(str(error))
    if not isinstance(error, (ProjectorError, ProjectionError, SchemaMismatch)):
        raise error
    _refuse(f"the projector cannot start: {error}")


def scheduler(
    nats_url: NatsUrl = None,
    partition: Annotated[str, typer.Option(help="Name of the single partition (its lease key).")] = "main",
    job_queue: Annotated[Optional[list[str]], typer.Option(
        "--job-queue", envvar="QUOTASCHED_JOB_QUEUES",
        help="Run one scheduling partition per job queue: lead (or stand by for) each queue "
             "named, plus the fleet-wide configuration. Repeat it, or give '*' for every job "
             "queue, as the queues are created. Without it, one partition decides for every "
             "queue.",
        show_default=False)] = None,
    metrics_port: MetricsPort = None,
    instance_lock: Annotated[Optional[str], typer.Option(
        "--instance-lock", envvar="QUOTASCHED_INSTANCE_LOCK",
        help="A file on a local disk that only this scheduler instance uses. Restarted after a "
             "crash with the same file, it takes its own lease back at once instead of waiting "
             "for the lease to run out.",
        show_default=False)] = None,
) -> None:
    """Run one scheduler instance against a NATS server; a second one is a hot standby."""
    import asyncio

    from quotasched.services import logs
    from quotasched.services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched scheduler: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    async def run() -> None:
        stack = Stack(_settings(nats_url, partition=partition, metrics_port=metrics_port),
                      executor="none", scheduler=False)  # fmt: skip
        async with stack:
            from quotasched.services.nats.bus import connect

            nc = await connect(nats_url, "quotasched-scheduler")
            stop_on_signals(stack.stop)
            await run_partitions(nc, stack.settings, queues, stack.expose, stack.stop,
                                 holder=None if lock is None else lock.holder)  # fmt: skip
            await nc.close()

    from quotasched.services.scheduler.process import EVERY_QUEUE, run_partitions

    queues = [name for value in job_queue or [] for name in value.replace(",", " ").split()]
    bad = [name for name in queues if name != EVERY_QUEUE and not re.match(NAME_PATTERN, name)]
    if bad:
        typer.echo(f"quotasched scheduler: job queue name {bad[0]!r} {NAME_RULE}", err=True)
        raise typer.Exit(2)
    lock = None
    if instance_lock:
        from quotasched.services.scheduler.instance import InstanceLock, InstanceLockError

        try:
            lock = InstanceLock(Path(instance_lock)).acquire()
        except InstanceLockError as error:
            typer.echo(f"quotasched scheduler: {error}", err=True)
            raise typer.Exit(2) from None
    try:
        asyncio.run(run())
    except Exception as error:
        from quotasched.services.scheduler.log import LogIncomplete
        from quotasched.services.scheduler.mode import ModeConflict

        if not isinstance(error, (ModeConflict, LogIncomplete)):
            raise
        typer.echo(f"quotasched scheduler: {error}", err=True)
        raise typer.Exit(2) from None
    finally:
        if lock is not None:
            lock.release()



def executor_command(
    nats_url: NatsUrl = None,
    kind: Annotated[str, typer.Option(
        "--kind", autocompletion=offer(*EXECUTOR_KINDS), help="simulated, process or sagemaker (a SageMaker training job per attempt; "
                       "docs/executors.md)")] = "simulated",
    speed: Annotated[float, typer.Option(help="Simulated executor: time speed-up factor.")] = 1.0,
    name: Annotated[Optional[str], typer.Option(
        "--name", help="The executor's name: its durable consumer is executor-NAME (default: "
                       "the kind, or KIND-QUEUE with --job-queue). Run one process per name.",
        show_default=False)] = None,
    job_queue: Annotated[Optional[str], typer.Option(
        "--job-queue", help="Run only this job queue's jobs (its facts); run one executor per "
                            "queue to spread the work.", show_default=False)] = None,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", envvar="QUOTASCHED_EXECUTOR_STATE_DIR",
        help="Where the executor keeps the attempts it runs (executor-NAME.json) and their "
             "exit statuses, so that the next start follows them to their end.")
    ] = Path(".quotasched"),
    require_containment: RequireContainment = False,
    pass_env: PassEnv = None,
    run_as: RunAs = None,
    work_dir: WorkDir = None,
    stop_jobs: StopJobs = False,
) -> None:
    """Run an executor: it starts dispatched jobs and reports their status.

    Stopping it does not stop its jobs: on a shutdown
    (SIGTERM, Ctrl-C) or a crash (SIGKILL) the attempts it runs keep running, and the next
    executor started with the same --name and --state-dir follows each to its end and reports
    how it ended (one that ended meanwhile, from its exit status).  With --stop-jobs a
    shutdown stops them and reports them FAILED, so the scheduler frees their capacity and
    each job's retryStrategy decides what happens next.
    """
    import asyncio

    from quotasched.services import logs
    from quotasched.services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched executor: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    if kind not in EXECUTOR_KINDS:
        typer.echo(f"quotasched executor: --kind {kind}: simulated, process or sagemaker", err=True)
        raise typer.Exit(2)
    if job_queue is not None and not re.fullmatch(NAME_PATTERN, job_queue):
        typer.echo(f"quotasched executor: --job-queue {job_queue}: {NAME_RULE}", err=True)
        raise typer.Exit(2)
    from quotasched.services.executors.base import consumer_name

    check_attempt_file("executor", state_dir / f"{consumer_name(kind, name, job_queue)}.json")
    passed = pass_env_names("executor", pass_env)
    user = work = None
    if kind == "process":  # the only kind running processes here
        say_containment("executor", consumer_name(kind, name, job_queue), require_containment)
        user, work = job_user_of("executor", run_as, work_dir, state_dir)
    elif run_as is not None:
        typer.echo(f"quotasched executor: --run-as: the {kind} executor runs no process here",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    logs.configure()

    async def run() -> None:
        async with Stack(_settings(nats_url, pass_env=passed, run_as=user, job_work_dir=work),
                         executor=kind, speed=speed,
                         scheduler=False,
                         executor_name=name, executor_state_dir=str(state_dir),
                         executor_job_queue=job_queue, stop_jobs=stop_jobs) as stack:
            stop_on_signals(stack.stop)
            await stack.stop.wait()
        return stack.failed  # its consumer lost for good (services/executors/watch.py)

    failed = asyncio.run(run())
    if failed is not None:
        typer.echo(f"quotasched executor: {failed}", err=True)
        raise typer.Exit(1)


def projector_command(
    nats_url: NatsUrl = None,
    db: Annotated[Path, typer.Option("--db", envvar="QUOTASCHED_PROJECTION_DB", help="The DuckDB file to keep up to date (created when new).")] = Path(".quotasched/quotasched.duckdb"),
    metrics_port: MetricsPort = None,
) -> None:
    """Run the projector: apply the fact log to a DuckDB file and answer queries over NATS.

    It resumes from the last fact the file applied.  It is the only process that opens the
    file: other processes ask it (qm.proj.sql, qm.proj.describe-service-job, qm.proj.position,
    ...).  Tuning: QUOTASCHED_PROJECTOR_MAX_BATCH, QUOTASCHED_PROJECTOR_MAX_WAIT_MS.

    Exit status: 0 stopped by a signal; 1 a fact could not be applied (the log says which; the
    file stops right before it); 2 NATS unreachable, the file is in use or is not a
    projection of this log.
    """
    import asyncio

    from quotasched.projections.schema import SchemaMismatch
    from quotasched.projections.store import ProjectionError
    from quotasched.services import logs
    from quotasched.services.nats.bus import Unreachable
    from quotasched.services.projector.service import ProjectorError, ProjectorHalted
    from quotasched.services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched projector: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    async def run() -> BaseException | None:
        async with Stack(_settings(nats_url, metrics_port=metrics_port), executor="none",
                         scheduler=False, projector_db=str(db),
                         projector_required=True) as stack:  # fmt: skip
            stop_on_signals(stack.stop)
            await stack.stop.wait()
        return stack.failed

    try:
        failed = asyncio.run(run())
    except (Unreachable, ProjectorError, ProjectionError, SchemaMismatch) as error:
        typer.echo(f"quotasched projector: {error}", err=True)
        raise typer.Exit(2) from None
    if failed is not None:
        typer.echo(f"quotasched projector: {failed}", err=True)
        raise typer.Exit(1 if isinstance(failed, ProjectorHalted) else 2)


def gate_command(nats_url: NatsUrl = None, metrics_port: MetricsPort = None) -> None:
    """Run an admission gate: teams' job commands (qm.in.<queue>.<share>.<Kind>) go on to the
    command stream within their share's limits; the rest are answered with the limit they
    passed, and never stored.

    Run one or more beside the scheduler (they share the work, in one queue group); `up` runs
    one itself.  The limits are the shares' admission options, read from the fact log.
    --metrics-port serves its counts (docs/metrics.md) and GET /healthz (healthy once open).

    Exit status: 0 stopped by a signal; 2 NATS unreachable.
    """
    import asyncio

    from quotasched.services import logs
    from quotasched.services.gate.service import serve
    from quotasched.services.nats.bus import Unreachable
    from quotasched.services.runtime import stop_on_signals

    if nats_url is None:
        typer.echo("quotasched gate: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    logs.configure()

    settings = _settings(nats_url, metrics_port=metrics_port)
    metrics = None if metrics_port is None else (settings.metrics_host, metrics_port)

    async def run() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        await serve(nats_url, stop, metrics)

    try:
        asyncio.run(run())
    except Unreachable as error:
        typer.echo(f"quotasched gate: {error}", err=True)
        raise typer.Exit(2) from None
