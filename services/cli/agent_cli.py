"""`quotasched agent` (one per GPU host of an on-prem fleet) and `quotasched logs` (an
attempt's output, read from the logs directory on the host that ran it).

The agent is services/executors/agent.py; its fleet (heartbeats, placements, the capacity it
publishes) is services/executors/fleet.py.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

from quotasched.services.cli.services_cli import (PassEnv, RequireContainment, RunAs, StopJobs,
                                                  WorkDir, _settings, check_attempt_file,
                                                  job_user_of, pass_env_names,
                                                  say_containment)  # fmt: skip

# The agent joins a fleet: unlike `up`, it never starts a server of its own.
FleetNatsUrl = Annotated[Optional[str], typer.Option(
    "--nats-url", envvar="QUOTASCHED_NATS_URL", show_default=False,
    help="The NATS server or cluster the scheduler and the fleet share (required).")]
LogsNatsUrl = Annotated[Optional[str], typer.Option(
    "--nats-url", envvar="QUOTASCHED_NATS_URL", show_default=False,
    help="Also ask the fleet which host placed the job when no log is here (optional).")]


def register(app: typer.Typer) -> None:
    app.command("agent")(agent_command)
    app.command("logs")(logs_command)


def agent_options(command: str, gpus: Optional[str], capacity_unit: Optional[str],
                  service_environment: Optional[str], **more):  # fmt: skip
    """The agent's options from the command line, or one line and exit status 2."""
    from quotasched.services.executors.agent import AgentOptions, GpuError, discover_gpus, parse_gpus

    def refuse(reason: str) -> NoReturn:
        typer.echo(f"quotasched {command}: {reason}", err=True)
        raise typer.Exit(2)

    if not capacity_unit:
        refuse("--capacity-unit is required: the unit one GPU of this host is (ml.g5.xlarge...)")
    if not service_environment:
        refuse("--service-environment is required: the fleet's service environment")
    try:
        found = parse_gpus(gpus) if gpus else discover_gpus()
    except (ValueError, GpuError) as error:
        refuse(str(error))
    if not found:
        refuse("this host has no GPUs (NVML counts none); name them with --gpus")
    options = AgentOptions(gpus=found, capacity_unit=capacity_unit,
                           service_environment=service_environment,
                           **{k: v for k, v in more.items() if v is not None})  # fmt: skip
    try:
        options.check()
    except ValueError as error:
        refuse(str(error))
    return options


Gpus = Annotated[Optional[str], typer.Option(
    "--gpus", help="The GPUs to hand out, as CUDA_VISIBLE_DEVICES names them (0,1,2,3); "
                   "default: every GPU NVML finds (needs the gpu extra, nvidia-ml-py, and a driver).",
    show_default=False)]
CapacityUnit = Annotated[Optional[str], typer.Option(
    "--capacity-unit", help="The capacity unit this host advertises: one GPU is one instance "
                            "of it (ml.g5.xlarge, ...).", show_default=False)]
ServiceEnvironment = Annotated[Optional[str], typer.Option(
    "--service-environment", help="The fleet's service environment: the agents keep its "
                                  "capacity equal to the live hosts' GPUs.", show_default=False)]


def agent_command(
    nats_url: FleetNatsUrl = None,
    gpus: Gpus = None,
    capacity_unit: CapacityUnit = None,
    service_environment: ServiceEnvironment = None,
    host: Annotated[Optional[str], typer.Option("--host", help="This host's name in the fleet (default: the hostname).", show_default=False)] = None,
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", envvar="QUOTASCHED_EXECUTOR_STATE_DIR",
        help="The attempts this agent runs (its ledger) and its records.")] = Path(".quotasched"),
    logs_dir: Annotated[Optional[Path], typer.Option("--logs-dir", help="Where each attempt's output goes, <job>/<attempt>.log (default: <state-dir>/logs).", show_default=False)] = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL when an attempt is stopped (a job's tag `grace` sets its own, at most QUOTASCHED_PREEMPT_GRACE_MAX_S).")] = 10.0,
    place_timeout: Annotated[float, typer.Option("--place-timeout", help="Seconds an attempt may wait for a host with enough free GPUs before it is reported INSUFFICIENT_CAPACITY.")] = 10.0,
    victim_timeout: Annotated[float, typer.Option("--victim-timeout", help="Seconds a preemptor waits at most for its victims to stop.")] = 60.0,
    heartbeat: Annotated[float, typer.Option("--heartbeat", help="Seconds between heartbeats.")] = 2.0,
    host_timeout: Annotated[float, typer.Option("--host-timeout", help="Seconds without a heartbeat after which a host is lost.")] = 10.0,
    container_runtime: Annotated[Optional[str], typer.Option("--container-runtime", help="docker or podman: a job that names an image (tag image, or the payload's TrainingImage) runs in a container of it; other jobs run as processes.", show_default=False)] = None,
    require_containment: RequireContainment = False,
    pass_env: PassEnv = None,
    run_as: RunAs = None,
    work_dir: WorkDir = None,
    stop_jobs: StopJobs = False,
) -> None:
    """Run a GPU host's agent: it places dispatched attempts on its own GPUs and runs them.

    Several agents (one per host) serve one service environment: its capacity follows the
    live hosts' GPUs, each attempt runs on exactly one host with CUDA_VISIBLE_DEVICES set to
    the GPUs it was given, an attempt no host can place whole is reported
    INSUFFICIENT_CAPACITY, and the attempts of a host that stops beating are reported FAILED.
    Stopping the agent (SIGTERM or SIGKILL) does not stop its jobs: started again on the same
    --host and --state-dir within --host-timeout, it follows them to their end.
    """
    import asyncio

    from quotasched.services import logs
    from quotasched.services.runtime import Stack, stop_on_signals

    if nats_url is None:
        typer.echo("quotasched agent: --nats-url (or QUOTASCHED_NATS_URL) is required", err=True)
        raise typer.Exit(2)
    options = agent_options(
        "agent", gpus, capacity_unit, service_environment, host=host or socket.gethostname(),
        logs_dir=str(logs_dir) if logs_dir else str(state_dir / "logs"), grace_s=grace,
        place_timeout_s=place_timeout, victim_timeout_s=victim_timeout,
        heartbeat_s=heartbeat, host_timeout_s=host_timeout, container_runtime=container_runtime,
        container_devices=gpus is None)  # fmt: skip
    check_attempt_file("agent", state_dir / f"{options.durable}.json")
    passed = pass_env_names("agent", pass_env)
    say_containment("agent", options.durable, require_containment)
    user, work = job_user_of("agent", run_as, work_dir, state_dir)
    logs.configure()

    async def run():
        settings = _settings(nats_url, pass_env=passed, run_as=user, job_work_dir=work)
        async with Stack(settings, executor="agent", scheduler=False,
                         executor_state_dir=str(state_dir), agent=options,
                         stop_jobs=stop_jobs) as stack:  # fmt: skip
            stop_on_signals(stack.stop)
            await stack.stop.wait()
        return stack.failed

    failed = asyncio.run(run())
    if failed is not None:
        typer.echo(f"quotasched agent: {failed}", err=True)
        raise typer.Exit(1)


def logs_command(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    attempt: Annotated[Optional[int], typer.Option("--attempt", help="Which attempt (default: the latest with a log here).", show_default=False)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing as the attempt writes, until it ends.")] = False,
    logs_dir: Annotated[Optional[Path], typer.Option("--logs-dir", envvar="QUOTASCHED_AGENT_LOGS_DIR", help="The agent's --logs-dir.", show_default=False)] = None,
    data_dir: Annotated[Optional[Path], typer.Option("--data-dir", help="Or the `up --data-dir` whose agent (`up --executor agent`) ran it: its logs are in <data-dir>/logs.", show_default=False)] = None,
    nats_url: LogsNatsUrl = None,
) -> None:
    """Print an attempt's output (stdout and stderr), as the GPU agent that ran it wrote it.

    JOB_ID is the job's id, or its name with --nats-url (the scheduler says which job has
    it). Reads the agent's logs directory (--logs-dir, or <--data-dir>/logs, default
    .quotasched/logs: `up`'s own), so run it on the host that ran the attempt (or where that
    directory is shared). Exit status 1: no log for that job (or attempt) here; with
    --nats-url (or QUOTASCHED_NATS_URL) it then says which host placed each of the job's
    attempts, from the fleet's claims.
    """
    from quotasched.events.base import is_path_component
    from quotasched.services.executors.agent import attempt_log, exit_path

    if not is_path_component(job_id):  # `..` would read the folder above the logs
        typer.echo(f"quotasched logs: {job_id!r} is not a job id (no job's log directory is "
                   "empty, '.', '..' or holds '/')", err=True)  # fmt: skip
        raise typer.Exit(2)
    if logs_dir is not None and data_dir is not None:
        typer.echo("quotasched logs: give --logs-dir or --data-dir, not both", err=True)
        raise typer.Exit(2)
    logs_dir = logs_dir or (data_dir or Path(".quotasched")) / "logs"
    if not (logs_dir / job_id).is_dir() and nats_url is not None:
        job_id = _named(nats_url, job_id)
    folder = logs_dir / job_id
    if attempt is None:
        numbers = sorted(int(p.stem) for p in folder.glob("*.log") if p.stem.isdigit()) if folder.is_dir() else []
        if not numbers:
            typer.echo(f"quotasched logs: no log of job {job_id} in {logs_dir}{_placed(nats_url, job_id)}", err=True)
            raise typer.Exit(1)
        attempt = numbers[-1]
    path = Path(attempt_log(str(logs_dir), job_id, attempt))
    if not path.exists() and not follow:
        typer.echo(f"quotasched logs: no log of job {job_id} attempt {attempt} in {logs_dir}"
                   f"{_placed(nats_url, job_id)}", err=True)  # fmt: skip
        raise typer.Exit(1)
    _print(path, Path(exit_path(str(path))), follow)


def _named(nats_url: str, name: str) -> str:
    """The id of the one job named `name` (the scheduler's answer), or `name` itself when no
    job has that name (it is then taken as an id); several jobs of that name: exit 2, naming
    their ids."""
    import asyncio

    from quotasched.services.client import Bus

    async def ask() -> list[str]:
        ids = []
        async with Bus(nats_url, name="quotasched-logs") as bus:
            queues = (await bus.request("describe-job-queues"))["jobQueues"]
            for queue in queues:  # a JOB_NAME filter lists every status
                answer = await bus.request("list-service-jobs", jobQueue=queue["jobQueueName"],
                                           maxResults=100, filters=[
                                               {"name": "JOB_NAME", "values": [name]}])  # fmt: skip
                ids += [job["jobId"] for job in answer["jobSummaryList"] if job["jobName"] == name]
        return ids

    try:
        ids = asyncio.run(ask())
    except Exception as error:  # noqa: BLE001 (a refusal, no server, a timeout: one line)
        typer.echo(f"quotasched logs: the scheduler could not say which job is named {name}: "
                   f"{error}", err=True)  # fmt: skip
        raise typer.Exit(1) from None
    if len(ids) > 1:
        typer.echo(f"quotasched logs: {len(ids)} jobs are named {name}: {', '.join(ids)}; "
                   "give one of their ids", err=True)  # fmt: skip
        raise typer.Exit(2)
    return ids[0] if ids else name


def _placed(nats_url: str | None, job_id: str) -> str:
    """"; attempt 1 ran on host h2 (GPUs 0,1), ..." from the fleet's claims, when a server is
    named and answers; "" otherwise (the log is then simply not here)."""
    if nats_url is None:
        return ""
    import asyncio

    from quotasched.services.executors.fleet import claims_of

    try:
        claims = asyncio.run(claims_of(nats_url, job_id))
    except Exception as error:  # noqa: BLE001 (a hint only: the answer stays "not here")
        return f" (the fleet could not be asked: {error})"
    if not claims:
        return f"; no agent of the fleet at {nats_url} placed it"
    said = [f"attempt {number} " + (f"ran on host {claim['host']} (GPUs {','.join(claim['gpus'])})"
                                    if claim.get("gpus") else "was placed by no host")
            for number, claim in claims]  # fmt: skip
    return "; " + "; ".join(said) + ": run `quotasched logs` there"


def _print(path: Path, ended: Path, follow: bool) -> None:
    """Copy the log to standard output; with `follow`, until the agent has written that the
    attempt's process exited (then whatever it wrote last)."""
    out = sys.stdout.buffer
    offset = 0
    try:
        while True:
            done = ended.exists()  # before the read: nothing is written after the exit file
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                offset += len(chunk)
                out.write(chunk)
                out.flush()
            if not follow or done:
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        return
