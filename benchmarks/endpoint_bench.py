"""Requests/s through the AWS Batch endpoint, beside the same requests sent directly on NATS.

    .venv/bin/python benchmarks/endpoint_bench.py              # 500 requests a run, 1 and 8 at
                                                               # once: ~25-45 s on 2 cores
    .venv/bin/python benchmarks/endpoint_bench.py --jobs 2000 --threads 1,4,16
    .venv/bin/python benchmarks/endpoint_bench.py --smoke      # 40 requests a run (make test)

One real stack, started here and stopped at the end: `quotasched up --data-dir <tmp>
--executor none --no-projector` as a subprocess (embedded nats-server, scheduler and the AWS
Batch endpoint, as deployed; its endpoint URL is the second line `up` prints).  QUOTASCHED_*
variables reach it (QUOTASCHED_NATS_URL is removed: the stack always has its own server).
The set-up goes through the endpoint with boto3: a FIFO scheduling policy, a service
environment and one job queue with one quota share, all large enough that every submission is
dispatched at once (no executor: dispatched jobs stay SCHEDULED; nothing else runs).

For each concurrency C of --threads, each path gets --jobs requests, C in flight at a time:

- write, endpoint: `SubmitServiceJob` with real boto3 (`boto3.client("batch",
  endpoint_url=...)`), C threads of this process, each with its own client; each call returns
  when the scheduler has decided the job, as the endpoint waits for the decision;
- write, direct: the same command (`{"kind": "SubmitServiceJob", **the boto3 parameters}`)
  through the project's client, `services.client.Bus.submit_and_wait` on one connection, C
  coroutines at once (asyncio.gather; C = 1 awaits one at a time);
- read, endpoint: `DescribeServiceJob` of the jobs submitted above, with boto3;
- read, direct: `Bus.request("describe-service-job", jobId=...)`, what the endpoint asks.

Both paths run their client in this process and the stack in the `up` process.  The endpoint
path adds botocore on the client (serialising, SigV4 signing, parsing), HTTP on loopback, and
in the `up` process aiohttp, botocore's parameter validation and the command's decoding before
the same `Bus.submit_and_wait` / `Bus.request` the direct path calls.  Reported per run:
requests/s (requests / wall time of the run), p50 and p99 latency of single calls, the ratio
endpoint / direct (requests/s, and p50), and the CPU time per request of this process (the
clients) and of `up` with its nats-server (from /proc).  Failed calls are counted and left out
of the latencies; boto3 retries are off, so a failure is not hidden by a retry.

Before the timed runs, every client warms up (excluded): boto3 loads its model and opens its
connection, the direct path makes a few round trips.  Writes run before reads, and within a
concurrency the direct path before the endpoint's.  Nothing is asserted: the figures are
printed.  On a small shared machine the client threads, the stack and nats-server compete for
the same cores, so figures move 10-25 % between runs; compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from live_bench import ROOT, load, machine_info  # benchmarks/ is this script's sys.path[0]
from quotasched.services.client import Bus
from quotasched.services.client.commands import raise_if_rejected

POLICY = "eb-fifo"
ENVIRONMENT = "eb-se"
QUEUE = "eb-q"
SHARE = "eb-share"
UNIT = "ml.g5.xlarge"
CAPACITY = 1_000_000  # the most a service environment may have; far more than the jobs submitted
PAYLOAD = json.dumps({"ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 1}})
START_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 60.0
WARMUP = 5  # untimed requests per client and path
SMOKE_JOBS = 40  # --smoke: requests per run


# -- the stack: `quotasched up` ----------------------------------------------------------------


class Up:
    """`quotasched up` in its own session, on a fresh data directory; `nats_url` and
    `endpoint_url` from the two lines it prints."""

    def __init__(self, tmp: Path):
        env = {key: value for key, value in os.environ.items() if key != "QUOTASCHED_NATS_URL"}
        args = [sys.executable, str(Path(sys.executable).parent / "quotasched"), "up",
                "--data-dir", str(tmp / "data"), "--executor", "none", "--no-projector"]  # fmt: skip
        self.log_path = tmp / "up.log"
        with open(self.log_path, "ab") as log:  # its log lines; the child keeps its own fd
            self.popen = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=log,
                                          start_new_session=True, cwd=str(ROOT), text=True)  # fmt: skip
        self.nats_url = self.endpoint_url = ""

    async def started(self) -> Self:
        lines = []
        for _ in range(2):
            line = await asyncio.wait_for(
                asyncio.to_thread(self.popen.stdout.readline), START_TIMEOUT_S
            )
            if not line:
                raise RuntimeError(f"`quotasched up` ended before it was ready:\n{self.tail()}")
            lines.append(line.strip())
        self.nats_url = lines[0]
        self.endpoint_url = lines[1].removeprefix("AWS_ENDPOINT_URL_BATCH=")
        return self

    def pids(self) -> list[int]:
        """`up` and its children (the embedded nats-server)."""
        pids = [self.popen.pid]
        for task in Path(f"/proc/{self.popen.pid}/task").glob("*/children"):
            try:
                pids += [int(pid) for pid in task.read_text().split()]
            except OSError:
                pass
        return pids

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (utime and stime of /proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


# -- clients -------------------------------------------------------------------------------------


def boto3_client(url: str):
    import boto3
    from botocore.config import Config

    return boto3.client("batch", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="y",
                        config=Config(retries={"total_max_attempts": 1},
                                      read_timeout=CALL_TIMEOUT_S))  # fmt: skip


def set_up(batch) -> None:
    """The queue with its quota share, through the endpoint."""
    policy = batch.create_scheduling_policy(
        name=POLICY, quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
    )
    batch.create_service_environment(
        serviceEnvironmentName=ENVIRONMENT,
        serviceEnvironmentType="SAGEMAKER_TRAINING",
        capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": CAPACITY}],
    )
    batch.create_job_queue(
        jobQueueName=QUEUE,
        priority=1,
        schedulingPolicyArn=policy["arn"],
        jobQueueType="SAGEMAKER_TRAINING",
        serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": ENVIRONMENT}],
    )
    batch.create_quota_share(
        jobQueue=QUEUE, quotaShareName=SHARE,
        capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": CAPACITY}],
        resourceSharingConfiguration={"strategy": "RESERVE"},
        preemptionConfiguration={"inSharePreemption": "DISABLED"})  # fmt: skip


def submission(name: str) -> dict:
    """SubmitServiceJob's parameters, as boto3 takes them (and the command's fields)."""
    return {"jobName": name, "jobQueue": QUEUE, "quotaShareName": SHARE, "schedulingPriority": 1,
            "serviceJobType": "SAGEMAKER_TRAINING", "serviceRequestPayload": PAYLOAD}  # fmt: skip


async def direct_submit(bus: Bus, name: str) -> str:
    facts = await bus.submit_and_wait({"kind": "SubmitServiceJob", **submission(name)},
                                      timeout=CALL_TIMEOUT_S)  # fmt: skip
    raise_if_rejected(facts)
    return next(fact.job_id for fact in facts if fact.kind == "JobSubmitted")


async def direct_describe(bus: Bus, job_id: str) -> str:
    return (await bus.request("describe-service-job", jobId=job_id))["jobId"]


def endpoint_submit(batch, name: str) -> str:
    return batch.submit_service_job(**submission(name))["jobId"]


def endpoint_describe(batch, job_id: str) -> str:
    return batch.describe_service_job(jobId=job_id)["jobId"]


# -- runs ----------------------------------------------------------------------------------------


@dataclass
class Run:
    op: str  # write | read
    path: str  # endpoint | direct
    clients: int
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # job ids
    errors: list[str] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def done(self) -> int:
        return len(self.latencies_ms)

    @property
    def rate(self) -> float:
        return self.done / self.wall_s if self.wall_s else 0.0

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    def cpu_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.done if self.done else float("nan")


class Meter:
    """Wall time and CPU time (this process, and `up` with nats-server) around a run."""

    def __init__(self, run: Run, up: Up):
        self.run, self.up = run, up

    def __enter__(self) -> Self:
        self.pids = self.up.pids()
        self.cpu, self.server = time.process_time(), cpu_seconds(self.pids)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        self.run.wall_s = time.perf_counter() - self.started
        self.run.client_cpu_s = time.process_time() - self.cpu
        self.run.server_cpu_s = cpu_seconds(self.pids) - self.server


def record(run: Run, call, item) -> None:
    """One timed synchronous call (a boto3 thread)."""
    started = time.perf_counter()
    try:
        answer = call(item)
    except Exception as error:  # noqa: BLE001 (counted, not fatal: the table says how many)
        run.errors.append(f"{type(error).__name__}: {error}")
        return
    run.latencies_ms.append(1000 * (time.perf_counter() - started))
    run.answers.append(answer)


async def arecord(run: Run, call, item) -> None:
    """One timed awaited call (the direct path)."""
    started = time.perf_counter()
    try:
        answer = await call(item)
    except Exception as error:  # noqa: BLE001 (as above)
        run.errors.append(f"{type(error).__name__}: {error}")
        return
    run.latencies_ms.append(1000 * (time.perf_counter() - started))
    run.answers.append(answer)


def endpoint_run(run: Run, up: Up, clients: list, call, items: list) -> Run:
    """`items` through `len(clients)` threads, one boto3 client each, next item as each is free."""
    taken = iter(items)
    lock = threading.Lock()
    start = threading.Barrier(len(clients) + 1)

    def worker(batch) -> None:
        start.wait()
        while True:
            with lock:
                item = next(taken, None)
            if item is None:
                return
            record(run, lambda value: call(batch, value), item)

    threads = [threading.Thread(target=worker, args=(batch,), daemon=True) for batch in clients]
    for thread in threads:
        thread.start()
    with Meter(run, up):
        start.wait()
        for thread in threads:
            thread.join()
    return run


async def direct_run(run: Run, up: Up, bus: Bus, call, items: list) -> Run:
    """`items` through `run.clients` coroutines on one connection (asyncio.gather)."""
    taken = iter(items)

    async def worker() -> None:
        for item in taken:
            await arecord(run, lambda value: call(bus, value), item)

    with Meter(run, up):
        await asyncio.gather(*(worker() for _ in range(run.clients)))
    return run


# -- report --------------------------------------------------------------------------------------


def report(runs: list[Run]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="AWS Batch endpoint (boto3) vs direct NATS (Bus), same stack, same run")
    for index, header in enumerate(["operation", "path", "clients", "requests", "errors", "req/s",
                                    "p50 ms", "p99 ms", "endpoint/direct req/s", "endpoint/direct p50",
                                    "client CPU ms/req", "up+nats CPU ms/req"]):  # fmt: skip
        table.add_column(header, justify="left" if index < 2 else "right")
    direct = {(run.op, run.clients): run for run in runs if run.path == "direct"}
    for run in runs:
        base = direct.get((run.op, run.clients))
        ratio = p50 = ""
        if run.path == "endpoint" and base is not None and base.rate:
            ratio = f"{run.rate / base.rate:.2f}x"
            p50 = f"{run.pct(50) / base.pct(50):.1f}x"
        op = {"write": "SubmitServiceJob", "read": "DescribeServiceJob"}[run.op]
        table.add_row(op, run.path, str(run.clients), f"{run.done:,}", str(len(run.errors)),
                      f"{run.rate:,.0f}", f"{run.pct(50):.2f}", f"{run.pct(99):.2f}", ratio, p50,
                      f"{run.cpu_ms(run.client_cpu_s):.2f}", f"{run.cpu_ms(run.server_cpu_s):.2f}",
                      end_section=run.path == "endpoint")  # fmt: skip
    Console(width=200).print(table)
    print("(clients: boto3 threads of this process, each with its own client, or coroutines "
          "on one Bus; req/s: requests / the run's wall time; endpoint/direct: the endpoint's "
          "req/s over the direct path's, and the same for p50; CPU per request: "
          "this process, and `up` with its nats-server)")  # fmt: skip
    for run in runs:
        if run.errors:
            print(
                f"{run.op} {run.path} x{run.clients}: {len(run.errors)} failed, first: {run.errors[0]}"
            )


# -- main ----------------------------------------------------------------------------------------


async def main_async(args) -> int:
    import boto3
    import botocore
    from quotasched.services.scheduler.core import COMPILED

    levels = [int(value) for value in args.threads.split(",")]
    print(f"endpoint_bench: {args.jobs:,} requests per run, concurrency {', '.join(map(str, levels))}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    print(f"machine: {machine_info()}")
    print(f"CPU count: {os.cpu_count()} | boto3 {boto3.__version__}, botocore {botocore.__version__} "
          f"| decision core {'compiled' if COMPILED else 'interpreted'}")  # fmt: skip
    print("NOTE: the client threads, `up` and nats-server share these cores; figures move "
          "10-25 % between runs. Compare ratios, not last digits.\n", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="endpoint-bench-") as tmp:
        up = Up(Path(tmp))
        try:
            await up.started()
            print(f"up: NATS {up.nats_url}, AWS_ENDPOINT_URL_BATCH={up.endpoint_url}", flush=True)
            runs = await measure(args, levels, up)
        except BaseException:
            if up.popen.poll() is not None:
                print(f"`quotasched up` stopped (exit {up.popen.returncode}):\n{up.tail()}")
            raise
        finally:
            code = up.stop()
    print(f"done; {load()}; `up` exited {code}\n")
    report(runs)
    return 0


async def measure(args, levels: list[int], up: Up) -> list[Run]:
    most = max(levels)
    clients = await asyncio.to_thread(lambda: [boto3_client(up.endpoint_url) for _ in range(most)])
    await asyncio.to_thread(set_up, clients[0])
    runs: list[Run] = []
    async with Bus(up.nats_url, name="endpoint-bench") as bus:
        # warm-up (untimed): every boto3 client's first calls, and the direct path's
        names = [f"warm-{index}" for index in range(WARMUP * most)]
        warm = await asyncio.to_thread(endpoint_run, Run("write", "endpoint", most), up, clients,
                                       endpoint_submit, names)  # fmt: skip
        await direct_run(Run("write", "direct", most), up, bus, direct_submit,
                         [f"warm-d-{index}" for index in range(WARMUP * most)])  # fmt: skip
        await asyncio.to_thread(endpoint_run, Run("read", "endpoint", most), up, clients,
                                endpoint_describe, warm.answers)  # fmt: skip
        await direct_run(Run("read", "direct", most), up, bus, direct_describe, warm.answers)
        if warm.errors:
            raise RuntimeError(f"the warm-up failed: {warm.errors[0]}")

        job_ids: list[str] = []
        for count in levels:
            print(
                f"SubmitServiceJob x{args.jobs:,}, {count} at once: direct ...", end=" ", flush=True
            )
            names = [f"d{count}-{index}" for index in range(args.jobs)]
            run = await direct_run(Run("write", "direct", count), up, bus, direct_submit, names)
            print(f"{run.rate:,.0f}/s; endpoint ...", end=" ", flush=True)
            runs.append(run)
            names = [f"e{count}-{index}" for index in range(args.jobs)]
            run = await asyncio.to_thread(endpoint_run, Run("write", "endpoint", count), up,
                                          clients[:count], endpoint_submit, names)  # fmt: skip
            print(f"{run.rate:,.0f}/s; {load()}", flush=True)
            runs.append(run)
            job_ids += [job for run in runs[-2:] for job in run.answers]
        reads = list(itertools.islice(itertools.cycle(job_ids or warm.answers), args.jobs))
        for count in levels:
            print(
                f"DescribeServiceJob x{args.jobs:,}, {count} at once: direct ...",
                end=" ",
                flush=True,
            )
            run = await direct_run(Run("read", "direct", count), up, bus, direct_describe, reads)
            print(f"{run.rate:,.0f}/s; endpoint ...", end=" ", flush=True)
            runs.append(run)
            run = await asyncio.to_thread(endpoint_run, Run("read", "endpoint", count), up,
                                          clients[:count], endpoint_describe, reads)  # fmt: skip
            print(f"{run.rate:,.0f}/s; {load()}", flush=True)
            runs.append(run)
    statuses = statistics.mode(
        clients[0].describe_service_job(jobId=job)["status"]
        for job in job_ids[:20] or warm.answers[:1]
    )
    print(f"(the submitted jobs are {statuses}, as expected with no executor)", flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"requests per run (each path, each concurrency; default 500, smoke {SMOKE_JOBS})",
    )
    parser.add_argument("--threads", default="1,8",
                        help="concurrencies, comma-separated: boto3 threads, and as many "
                             "coroutines on the direct path (default 1,8)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_JOBS} requests a run unless --jobs: seconds, that it runs "
                             "(make test)")  # fmt: skip
    args = parser.parse_args()
    if args.jobs is None:
        args.jobs = SMOKE_JOBS if args.smoke else 500
    if args.jobs < 1 or any(int(value) < 1 for value in args.threads.split(",")):
        parser.error("--jobs and every --threads value must be at least 1")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
