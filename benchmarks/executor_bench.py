"""Dispatch-to-start latency of each executor, beside the scheduler's own decision latency.

    .venv/bin/python benchmarks/executor_bench.py                 # 100 jobs per executor at
                                                                  # 20/s: ~1.5-2 min on 2 cores
    .venv/bin/python benchmarks/executor_bench.py --jobs 50 --executors simulated,process
    .venv/bin/python benchmarks/executor_bench.py --smoke         # 10 jobs per executor: ~30 s

Each executor kind gets its own fresh stack, started here and stopped at the end of its run:
an embedded nats-server (live_bench.Server: the real binary, a temporary store), `quotasched
scheduler` as a subprocess, and the executor as a subprocess, as deployed:

- simulated: `quotasched executor --kind simulated`; each job has the tag `duration`
  (--job-seconds);
- process: `quotasched executor --kind process`; each job's `command` tag is
  `sh -c 'date +%s%N > <stamps>/$QUOTASCHED_JOB_ID.$QUOTASCHED_ATTEMPT; sleep <job-seconds>'`,
  so the moment the job's own process ran is in a file (wall clock, ns);
- sagemaker: `quotasched executor --kind sagemaker` against moto's SageMaker server
  (`python -m moto.server`, started here once, on loopback; boto3 reaches it through
  AWS_ENDPOINT_URL_SAGEMAKER with dummy credentials).  Each job's payload is a
  CreateTrainingJob request for one ml.g5.xlarge.  moto completes a training job at once and
  never shows it InProgress, so there is no RUNNING report (see
  tests/integration/test_sagemaker_executor.py); the executor reports STARTING once
  CreateTrainingJob returned and SUCCEEDED at its first DescribeTrainingJob, after
  QUOTASCHED_SAGEMAKER_POLL_S (default 1 s; the variable reaches the executor).  moto loads
  its SageMaker backend on its first CreateTrainingJob (~0.4 s alone, 1.5 s when the first
  creates come at once, which then delays every dispatch queued behind them): this script
  makes that first call itself, then 20 more, one at a time, as the floor row (what moto
  takes per create);
- agent: `quotasched agent --gpus 0,1,2,3` (fake GPUs: nothing looks at them but
  CUDA_VISIBLE_DEVICES), one host; the agent sets the service environment's capacity to its 4
  GPUs, so jobs of one GPU each run at most 4 at a time, in waves.  The job's command is the
  process executor's.

A kind whose dependency is missing (moto's server) is reported as skipped, with the reason.

Set-up: live_bench's (one service environment, a FIFO scheduling policy, one job queue, five
quota shares), capacity 100,000 ml.g5.xlarge (every job fits at once, except under the
agent); every job goes to the first share (RESERVE).
Once the scheduler has decided the set-up and the executor's durable consumer exists (for the
agent: once the capacity is its 4 GPUs), --jobs SubmitServiceJob commands (one ml.g5.xlarge
each) are published at a paced --rate per second (0: all at once), and the run waits until
every job has ended.  Everything is then read back from the streams, with each message's
stream timestamp (the time nats-server stored it; same machine, same wall clock as the stamp
files):

- scheduler, decision: the command that caused the JobDispatched (its `commandSeq` in
  QM_COMMANDS: the job's SubmitServiceJob when it fit at once, else the report or tick that
  freed the capacity) stored -> the JobDispatched fact stored;
- scheduler, submit -> dispatch: the SubmitServiceJob stored -> JobDispatched stored, queueing
  for capacity included (printed when it differs: under the agent's 4 GPUs);
- executor, dispatch -> STARTING report stored: the JobDispatched fact stored -> the
  executor's ReportJobStatus STARTING command stored in QM_COMMANDS (the executor's own part:
  delivery of the fact, placing, its report);
- dispatch -> STARTING fact, dispatch -> RUNNING fact: -> the JobStatusChanged fact stored
  (adds the scheduler deciding the report);
- dispatch -> process started (process, agent): -> the time the job's own process wrote to its
  stamp file.  The local spawn row is the floor of that: the same `sh -c 'date ...'` started
  by this script with asyncio.create_subprocess_exec (what the process executor calls), from
  the call to the stamp, one at a time;
- dispatch -> ended: -> the SUCCEEDED/FAILED fact (includes the job's own length).

Printed: the machine (CPU count, load average), one table per stage with n, p50, p90, p99 and
max in ms and, for the executor stages, p50 / the scheduler's decision p50 of the same run;
then a summary with one row per executor.  Nothing is asserted.  On a small shared machine
nats-server, the scheduler, the executor, its jobs and this script compete for the same
cores: figures move between runs, compare the ratios and orders of magnitude.

--smoke: every executor with 10 jobs (unless --jobs), in about 25-35 s: that the bench runs
(`make test`); with 10 samples its percentiles are too rough to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from live_bench import (  # benchmarks/ is this script's sys.path[0]
    ENVIRONMENT,
    QUEUE,
    ROOT,
    SHARES,
    UNIT,
    SchedulerProcess,
    Server,
    command,
    connect,
    ensure_streams,
    load,
    machine_info,
    scheduler_env,
    setup_commands,
    watch_ack_floor,
)
from nats.js.api import ConsumerConfig, DeliverPolicy

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM

KINDS = ("simulated", "process", "sagemaker", "agent")
SHARE = SHARES[0]  # RESERVE; live_bench's set-up also creates four more shares, unused here
CAPACITY = 100_000
GPUS = "0,1,2,3"
HOST = "xb-host"
READY_TIMEOUT_S = 60.0
SMOKE_JOBS = 10  # --smoke: jobs per executor
DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
             "AWS_SHARED_CREDENTIALS_FILE": os.devnull}  # fmt: skip
TRAINING = {
    "AlgorithmSpecification": {"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/"
                                                "pytorch-training:2.5-gpu-py311",
                               "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTrainingRole",
    "OutputDataConfig": {"S3OutputPath": "s3://bench-bucket/output"},
    "ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}  # fmt: skip


# -- child processes ---------------------------------------------------------------------------


class Child(SchedulerProcess):
    """A `quotasched ...` (or moto) subprocess in its own session, its output in a log file;
    stopped (SIGTERM, then SIGKILL) and read as live_bench's scheduler subprocess is."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.profiler = False
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.popen = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                      start_new_session=True, cwd=str(ROOT))  # fmt: skip


def quotasched(*args: str) -> list[str]:
    return [sys.executable, str(Path(sys.executable).parent / "quotasched"), *args]


def child_env(url: str, **extra: str) -> dict[str, str]:
    return {**scheduler_env(url), **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Moto:
    """moto's SageMaker server (`python -m moto.server`) on loopback, or why it cannot run."""

    def __init__(self, directory: Path):
        self.child: Child | None = None
        self.url = ""
        self.missing = ""
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401 (the server needs the `server` extra: flask, ...)
        except ImportError as error:
            self.missing = f"moto's server is not installed ({error}; pip install 'moto[server]')"
            return
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.child = Child([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           {**os.environ, **DUMMY_AWS}, directory / "moto.log")  # fmt: skip
        deadline = time.monotonic() + 30
        while not self._answers():
            if not self.child.alive() or time.monotonic() > deadline:
                self.missing = f"moto's server did not start: {self.child.tail(3)!r}"
                self.stop()
                return
            time.sleep(0.1)

    def create_floor(self, samples: int) -> list[float]:
        """Sequential CreateTrainingJob round trips from this script (boto3), ms: what moto
        itself takes per create.  The first call (moto loads its SageMaker backend, botocore
        its endpoint rules) is made first and left out."""
        import boto3

        client = boto3.client("sagemaker", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        out = []
        for index in range(samples + 1):
            started = time.perf_counter()
            client.create_training_job(TrainingJobName=f"xb-floor-{index}", **TRAINING)
            out.append(1000 * (time.perf_counter() - started))
        return out[1:]

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.url + "/moto-api/", timeout=1).close()
            return True
        except Exception:
            return False

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(10)
            self.child = None


# -- reading the streams, with their timestamps ------------------------------------------------


def stored_ns(msg) -> int:
    """The stream timestamp of a delivered JetStream message, ns (from its reply subject:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>`, or the v2 form
    with domain and account hash in front)."""
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9:
        return int(tokens[7])
    if len(tokens) >= 12:
        return int(tokens[9])
    return int(msg.metadata.timestamp.timestamp() * 1e9)


def stored_seq(msg) -> int:
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9:
        return int(tokens[5])
    if len(tokens) >= 12:
        return int(tokens[7])
    return msg.metadata.sequence.stream


@dataclass
class Log:
    """Every message of a stream so far: (stream seq, stored ns, decoded payload)."""

    entries: list[tuple[int, int, dict]] = field(default_factory=list)
    sub: object = None

    async def follow(self, js, stream: str, subject: str) -> Log:
        async def on_msg(msg) -> None:
            self.entries.append((stored_seq(msg), stored_ns(msg), json.loads(msg.data)))

        self.sub = await js.subscribe(subject, cb=on_msg, ordered_consumer=True, stream=stream,
                                      config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
                                      pending_msgs_limit=200_000)  # fmt: skip
        return self

    async def close(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()


# -- one executor's run ------------------------------------------------------------------------


STAGES = [
    ("decide", "scheduler: deciding command stored -> JobDispatched"),
    ("submit", "scheduler: submission stored -> JobDispatched (queue wait incl.)"),
    ("report", "executor: JobDispatched -> STARTING report stored"),
    ("starting", "JobDispatched -> STARTING fact"),
    ("running", "JobDispatched -> RUNNING fact"),
    ("process", "JobDispatched -> job's process started (stamp file)"),
    ("ended", "JobDispatched -> SUCCEEDED/FAILED fact (job length incl.)"),
]


@dataclass
class Result:
    kind: str
    jobs: int = 0
    skipped: str = ""
    error: str = ""
    stages: dict[str, list[float]] = field(default_factory=dict)  # stage -> ms
    outcomes: dict[str, int] = field(default_factory=dict)
    missing: int = 0
    queued: int = 0  # jobs dispatched by a later command than their submission
    wall_s: float = 0.0
    load_before: str = ""
    load_after: str = ""
    notes: list[str] = field(default_factory=list)


def stamp_command(stamps: Path, seconds: float) -> str:
    script = f"date +%s%N > {stamps}/$QUOTASCHED_JOB_ID.$QUOTASCHED_ATTEMPT"
    if seconds > 0:
        script += f"; sleep {seconds:g}"
    return f"sh -c '{script}'"


def submission(kind: str, job_id: str, stamps: Path, seconds: float) -> tuple[str, bytes]:
    fields = {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
              "quotaShareName": SHARE, "schedulingPriority": 1}  # fmt: skip
    if kind == "sagemaker":  # capacity: the payload's ResourceConfig
        fields["serviceJobType"] = "SAGEMAKER_TRAINING"
        fields["serviceRequestPayload"] = json.dumps(TRAINING)
    else:
        fields["capacityUsage"] = [{"capacityUnit": UNIT, "quantity": 1}]
        if kind == "simulated":
            fields["tags"] = {"duration": f"{seconds:g}"}
        else:
            fields["tags"] = {"command": stamp_command(stamps, seconds)}
    return command(**fields)


def executor_child(kind: str, url: str, tmp: Path, moto: Moto | None) -> Child:
    state = tmp / "state"
    if kind == "agent":
        args = quotasched("agent", "--nats-url", url, "--gpus", GPUS, "--capacity-unit", UNIT,
                          "--service-environment", ENVIRONMENT, "--host", HOST,
                          "--state-dir", str(state))  # fmt: skip
        return Child(args, child_env(url), tmp / "agent.log")
    extra = {}
    if kind == "sagemaker":
        extra = {**DUMMY_AWS, "AWS_ENDPOINT_URL_SAGEMAKER": moto.url}
    args = quotasched("executor", "--nats-url", url, "--kind", kind, "--state-dir", str(state))
    return Child(args, child_env(url, **extra), tmp / "executor.log")


async def wait_until(check, timeout: float, what: str, children: list[SchedulerProcess]) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{what}: {child.log_path.name} exited:\n{child.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        await asyncio.sleep(0.1)


async def consumer_exists(js, durable: str) -> bool:
    try:
        await js.consumer_info(FACTS_STREAM, durable)
        return True
    except Exception:
        return False


def fleet_capacity(facts: Log) -> int | None:
    found = None
    for _, _, fact in list(facts.entries):
        if fact.get("kind") == "ServiceEnvironmentUpdated" and fact.get("serviceEnvironment") == ENVIRONMENT:
            for limit in fact.get("capacityLimits") or []:
                if limit["capacityUnit"] == UNIT:
                    found = limit["maxCapacity"]
    return found


async def run_kind(kind: str, args, moto: Moto | None) -> Result:
    result = Result(kind, jobs=args.jobs, load_before=load())
    if kind == "sagemaker" and (moto is None or moto.missing):
        result.skipped = moto.missing if moto is not None else "moto's server was not started"
        return result
    tmp = Path(tempfile.mkdtemp(prefix=f"executor-bench-{kind}-"))
    stamps = tmp / "stamps"
    stamps.mkdir()
    started = time.perf_counter()
    children: list[SchedulerProcess] = []
    try:
        with Server() as server:
            await ensure_streams(server.url)
            nc = await connect(server.url, f"executor-bench-{kind}")
            js = nc.jetstream()
            facts = await Log().follow(js, FACTS_STREAM, "qm.fact.>")
            commands = await Log().follow(js, COMMANDS_STREAM, "qm.cmd.>")
            try:
                children.append(SchedulerProcess(server.url, tmp / "scheduler.log"))
                setup = setup_commands(1 if kind == "agent" else CAPACITY, CAPACITY)
                for subject, payload in setup:
                    await js.publish(subject, payload)
                await watch_ack_floor(js, COMMANDS_STREAM, "scheduler-main", len(setup), timeout=READY_TIMEOUT_S)
                children.append(executor_child(kind, server.url, tmp, moto))
                if kind == "agent":
                    async def ready() -> bool:
                        return fleet_capacity(facts) == len(GPUS.split(","))
                else:
                    async def ready() -> bool:
                        return await consumer_exists(js, f"executor-{kind}")
                await wait_until(ready, READY_TIMEOUT_S, f"{kind} executor ready", children)
                await asyncio.sleep(0.5)  # let it settle (its first fetch, heartbeats)

                job_ids = [f"xb-{kind[:3]}-{index:05d}" for index in range(args.jobs)]
                begin = time.perf_counter()
                for index, job_id in enumerate(job_ids):
                    if args.rate > 0:
                        delay = begin + index / args.rate - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    await js.publish(*submission(kind, job_id, stamps, args.job_seconds))

                def ended() -> set[str]:
                    return {f["jobId"] for _, _, f in list(facts.entries)
                            if f.get("kind") == "JobStatusChanged" and f.get("status") in ("SUCCEEDED", "FAILED")}  # fmt: skip

                async def all_ended() -> bool:
                    return len(ended() & set(job_ids)) == len(job_ids)

                try:
                    await wait_until(all_ended, args.timeout, f"{kind}: every job ended", children)
                except TimeoutError as error:
                    result.notes.append(str(error))
                await asyncio.sleep(0.3)  # the last messages reach the ordered consumers
            finally:
                for child in reversed(children):
                    child.stop()
                await facts.close()
                await commands.close()
                await nc.close()
        measure(result, job_ids, facts, commands, stamps)
        if kind == "agent":
            result.notes.append(f"{GPUS.count(',') + 1} fake GPUs, one per job: jobs ran "
                                f"at most {GPUS.count(',') + 1} at a time")  # fmt: skip
    except Exception as error:  # noqa: BLE001 (one executor's failure does not end the others)
        result.error = f"{type(error).__name__}: {error}"
        for child in children:
            if child.log_path.exists():
                result.notes.append(f"{child.log_path.name}: {child.tail(5)}")
    finally:
        result.wall_s = time.perf_counter() - started
        result.load_after = load()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def measure(result: Result, job_ids: list[str], facts: Log, commands: Log, stamps: Path) -> None:
    ours = set(job_ids)
    command_at = {seq: ns for seq, ns, _ in commands.entries}
    submitted: dict[str, tuple[int, int]] = {}  # job -> (command seq, stored ns)
    reported: dict[tuple[str, int, str], int] = {}  # (job, attempt, status) -> first stored ns
    for seq, ns, cmd in commands.entries:
        if cmd.get("kind") == "SubmitServiceJob" and cmd.get("jobId") in ours:
            submitted.setdefault(cmd["jobId"], (seq, ns))
        elif cmd.get("kind") == "ReportJobStatus" and cmd.get("jobId") in ours:
            reported.setdefault((cmd["jobId"], cmd.get("attempt"), cmd["status"]), ns)
    dispatched: dict[tuple[str, int], int] = {}
    status_at: dict[tuple[str, int, str], int] = {}
    stages: dict[str, list[float]] = {name: [] for name, _ in STAGES}
    for _, ns, fact in facts.entries:
        job_id = fact.get("jobId")
        if job_id not in ours:
            continue
        if fact["kind"] == "JobDispatched":
            key = (job_id, fact["attempt"])
            dispatched[key] = ns
            if fact.get("commandSeq") in command_at:
                stages["decide"].append((ns - command_at[fact["commandSeq"]]) / 1e6)
            if job_id in submitted and fact["attempt"] == 1:
                stages["submit"].append((ns - submitted[job_id][1]) / 1e6)
                if fact.get("commandSeq") != submitted[job_id][0]:
                    result.queued += 1  # dispatched by a later command (capacity freed)
        elif fact["kind"] == "JobStatusChanged":
            status = "ended" if fact["status"] in ("SUCCEEDED", "FAILED") else fact["status"]
            status_at.setdefault((job_id, fact.get("attempt"), status), ns)
            if status == "ended":
                result.outcomes[fact["status"]] = result.outcomes.get(fact["status"], 0) + 1
    for (job_id, attempt), ns in dispatched.items():
        for stage, key in (("starting", "STARTING"), ("running", "RUNNING"), ("ended", "ended")):
            if (job_id, attempt, key) in status_at:
                stages[stage].append((status_at[(job_id, attempt, key)] - ns) / 1e6)
        if (job_id, attempt, "STARTING") in reported:
            stages["report"].append((reported[(job_id, attempt, "STARTING")] - ns) / 1e6)
        stamp = stamps / f"{job_id}.{attempt}"
        if stamp.exists():
            text = stamp.read_text().strip()
            if text.isdigit():
                stages["process"].append((int(text) - ns) / 1e6)
    result.missing = len(ours) - len({job for job, _ in dispatched})
    if not result.queued:
        stages["submit"] = []  # every job was dispatched by its own submission: as "decide"
    result.stages = {name: values for name, values in stages.items() if values}


async def spawn_floor(samples: int) -> list[float]:
    """From the asyncio.create_subprocess_exec call (as the process executor makes it) to the
    stamp its `sh -c 'date ...'` wrote, ms, one at a time."""
    tmp = Path(tempfile.mkdtemp(prefix="executor-bench-spawn-"))
    out = []
    try:
        for index in range(samples):
            path = tmp / str(index)
            before = time.time_ns()
            process = await asyncio.create_subprocess_exec(
                "sh", "-c", f"date +%s%N > {path}", start_new_session=True,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                env={**os.environ, "QUOTASCHED_JOB_ID": str(index), "QUOTASCHED_ATTEMPT": "1"},
            )  # fmt: skip
            await process.wait()
            out.append((int(path.read_text()) - before) / 1e6)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- report ------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def fmt(ms: float) -> str:
    return f"{ms:,.1f}" if abs(ms) >= 10 else f"{ms:.2f}"


def times(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


def report(results: list[Result], floors: dict[str, list[float]], args) -> None:
    print(f"\n== latency per executor and stage (ms, stream timestamps; {args.jobs} jobs per "
          f"executor at {'once' if args.rate <= 0 else f'{args.rate:g}/s'}; ratio: the stage's p50 / "
          f"the same run's scheduler decision p50) ==")  # fmt: skip
    print(f"{'executor':<11}{'stage':<64}{'n':>5}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}{'ratio':>9}")
    for result in results:
        if result.skipped:
            print(f"{result.kind:<11}skipped: {result.skipped}")
            continue
        if result.error:
            print(f"{result.kind:<11}failed: {result.error}")
            continue
        base = result.stages.get("decide")
        for name, title in STAGES:
            values = result.stages.get(name)
            if not values:
                continue
            ratio = ""
            if base and name not in ("decide", "submit"):
                ratio = times(pct(values, 50) / pct(base, 50))
            print(f"{result.kind:<11}{title:<64}{len(values):>5}{fmt(pct(values, 50)):>9}"
                  f"{fmt(pct(values, 90)):>9}{fmt(pct(values, 99)):>9}{fmt(max(values)):>9}{ratio:>9}")  # fmt: skip
        print()
    for name, title in (("spawn", "local spawn: create_subprocess_exec -> sh/date stamp"),
                        ("moto", "moto: one CreateTrainingJob round trip (boto3)")):  # fmt: skip
        floor = floors.get(name)
        if floor:
            print(f"{'(floor)':<11}{title:<64}{len(floor):>5}{fmt(pct(floor, 50)):>9}"
                  f"{fmt(pct(floor, 90)):>9}{fmt(pct(floor, 99)):>9}{fmt(max(floor)):>9}")  # fmt: skip

    print("\n== summary (p50 ms; ratio to the scheduler's decision p50 of the same run) ==")
    print(f"{'executor':<11}{'jobs ok':>9}{'missing':>9}{'sched decide':>14}{'-> STARTING':>13}"
          f"{'ratio':>8}{'-> RUNNING':>12}{'ratio':>8}{'-> process':>12}{'ratio':>8}{'run s':>7}  load (before -> after)")  # fmt: skip
    for result in results:
        if result.skipped or result.error:
            print(f"{result.kind:<11}{'skipped' if result.skipped else 'failed'}")
            continue
        base = result.stages.get("decide")
        cells = []
        for name in ("starting", "running", "process"):
            values = result.stages.get(name)
            if values and base:
                cells += [f"{fmt(pct(values, 50)):>12}", f"{times(pct(values, 50) / pct(base, 50)):>8}"]
            else:
                cells += [f"{'-':>12}", f"{'':>8}"]
        print(f"{result.kind:<11}{result.outcomes.get('SUCCEEDED', 0):>9}{result.missing:>9}"
              f"{fmt(pct(base, 50)) if base else '-':>14}{cells[0]:>13}{cells[1]}{cells[2]}{cells[3]}"
              f"{cells[4]}{cells[5]}{result.wall_s:>7.1f}  {result.load_before.removeprefix('load ')} -> "
              f"{result.load_after.removeprefix('load ')}")  # fmt: skip
    for result in results:
        failed = result.outcomes.get("FAILED", 0)
        if failed:
            print(f"{result.kind}: {failed} job(s) FAILED")
        for note in result.notes:
            print(f"{result.kind}: {note}")
    print("(STARTING/RUNNING: the JobStatusChanged fact stored; process: the job's own `date` "
          "ran; sagemaker on moto has no RUNNING: moto never shows a job InProgress)")  # fmt: skip


async def main_async(args) -> int:
    from quotasched.services import logs

    logs.configure("WARNING")
    kinds = [kind.strip() for kind in args.executors.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        print(f"unknown executor kind(s) {', '.join(unknown)}: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    print(f"executor_bench: {args.jobs} jobs per executor, submitted at "
          f"{'once' if args.rate <= 0 else f'{args.rate:g}/s'}, jobs of {args.job_seconds:g} s; "
          f"executors: {', '.join(kinds)}")  # fmt: skip
    print(f"machine: {machine_info()}")
    print(f"CPU count {os.cpu_count()}; the machine may be shared: figures move between runs, "
          "compare ratios and orders of magnitude\n")  # fmt: skip
    moto = None
    floors: dict[str, list[float]] = {}
    if "sagemaker" in kinds:
        tmp = Path(tempfile.mkdtemp(prefix="executor-bench-moto-"))
        moto = await asyncio.to_thread(Moto, tmp)
        if not moto.missing:
            # moto loads its SageMaker backend on the first create (~0.4 s, seconds when
            # several come at once): done here, so the executor's figures do not carry it
            floors["moto"] = await asyncio.to_thread(moto.create_floor, 20)
            print(f"moto's SageMaker server at {moto.url} (warmed up)")
    results = []
    try:
        for kind in kinds:
            print(f"[{kind}] ... ({load()})", flush=True)
            result = await run_kind(kind, args, moto)
            results.append(result)
            state = (f"skipped: {result.skipped}" if result.skipped else f"failed: {result.error}"
                     if result.error else f"{result.outcomes} in {result.wall_s:.1f} s")  # fmt: skip
            print(f"    {state}; {load()}", flush=True)
    finally:
        if moto is not None:
            moto.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if any(kind in ("process", "agent") for kind in kinds):
        floors["spawn"] = await spawn_floor(max(20, args.jobs // 2))
    report(results, floors, args)
    return 1 if any(result.error for result in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs per executor (default 100, smoke {SMOKE_JOBS})")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_JOBS} jobs per executor: that it runs (make test)")
    parser.add_argument("--executors", default=",".join(KINDS),
                        help="comma-separated kinds (default: simulated,process,sagemaker,agent)")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="submissions per second (default 20; 0: all at once)")
    parser.add_argument("--job-seconds", type=float, default=0.2,
                        help="how long each job runs (simulated duration, sleep after the stamp)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds to wait for every job to end after the last submission")
    args = parser.parse_args()
    if args.jobs is None:
        args.jobs = SMOKE_JOBS if args.smoke else 100
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
