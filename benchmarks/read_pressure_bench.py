"""Does one team's reading slow another team's decisions?  (issue 29 point 1)

    .venv/bin/python benchmarks/read_pressure_bench.py            # 50k queued jobs, ~1 minute
    .venv/bin/python benchmarks/read_pressure_bench.py --smoke    # tiny sizes, seconds (CI)

Options: --backlog N (jobs queued in the read queue), --rate R (the writer's submissions/s),
--seconds S (per phase), --readers K (concurrent readers), --readers-nice N (the readers'
process at niceness N: on this one machine the readers' own work, parsing answers of up to
1 MiB, takes CPU the scheduler would have; a team's readers run on its own machines, so
`--readers-nice 19` leaves what the reads cost the service itself).

One embedded nats-server (services.nats.embedded, the real binary, a fresh temporary store) and
one `quotasched scheduler` subprocess, as benchmarks/live_bench.py starts them.  One job queue
with two quota shares: `backlog` (1 instance: N jobs submitted, all but one stay RUNNABLE) and
`writer` (room for every submission: each is dispatched at once).  The writer team submits
at a paced R/s; its latency is the time from the publish call to the arrival of the job's
JobDispatched fact (an ordered consumer on the facts stream).  Two phases on the same stack:

1. quiet: the writer alone;
2. read pressure: the writer, and K readers (in a process of their own, so that their work
   does not delay this process's clock on the writer's facts) that ask `list-service-jobs` back to back, as hard
   as they can, with the most the read API allows: maxResults 1000 and 100 JOB_NAME values
   (prefixes that match every backlog job, and exact names), following nextToken, beside
   jobStatus=ALL listings of the whole queue.

It prints both p99s and their ratio, the reads answered and their latency.  The machine is
small and shared: compare ratios, not last digits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: E402

from benchmarks.live_bench import (  # noqa: E402
    DURABLE,
    ENVIRONMENT,
    POLICY,
    QUEUE,
    UNIT,
    SchedulerProcess,
    Server,
    command,
    connect,
    ensure_streams,
    machine_info,
    paced,
    publish_all,
    watch_ack_floor,
)
from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM  # noqa: E402

BACKLOG, WRITER = "backlog", "writer"
MAX_RESULTS = 1000  # the read API's bounds (services/scheduler/api.py)
MAX_VALUES = 100


def setup(backlog: int) -> list[tuple[str, bytes]]:
    out = [
        command(kind="CreateServiceEnvironment", serviceEnvironmentName=ENVIRONMENT,
                capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": 1_000_000}]),
        command(kind="CreateSchedulingPolicy", name=POLICY,
                quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}),
        command(kind="CreateJobQueue", jobQueueName=QUEUE, schedulingPolicy=POLICY, priority=10,
                serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": ENVIRONMENT}]),
    ]  # fmt: skip
    for share, limit in ((BACKLOG, 1), (WRITER, 900_000)):
        out.append(command(
            kind="CreateQuotaShare", jobQueue=QUEUE, quotaShareName=share,
            capacityLimits=[{"capacityUnit": UNIT, "maxCapacity": limit}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        ))  # fmt: skip
    for index in range(backlog):
        out.append(command(
            kind="SubmitServiceJob", jobName=f"bk-{index % 1000:03d}-{index}", jobQueue=QUEUE,
            quotaShareName=BACKLOG, jobId=f"bk-{index:08d}",
            capacityUsage=[{"capacityUnit": UNIT, "quantity": 1}],
        ))  # fmt: skip
    return out


def writer_items(count: int, phase: str) -> list[tuple[str, bytes, str]]:
    items = []
    for index in range(count):
        job_id = f"w-{phase}-{index:07d}"
        subject, payload = command(
            kind="SubmitServiceJob", jobName=job_id, jobQueue=QUEUE, quotaShareName=WRITER,
            jobId=job_id, capacityUsage=[{"capacityUnit": UNIT, "quantity": 1}],
        )  # fmt: skip
        items.append((subject, payload, job_id))
    return items


def hardest_requests() -> list[dict]:
    """The most a reader may ask: 100 JOB_NAME values (half prefixes matching every backlog
    job, half exact names) and maxResults 1000; and the whole queue, every status."""
    values = [f"bk-{index:03d}*" for index in range(MAX_VALUES // 2)]
    values += [f"bk-{index:03d}-{index}" for index in range(MAX_VALUES - len(values))]
    values[0] = "b*"  # a prefix matching every job of the queue
    return [
        {"jobQueue": QUEUE, "maxResults": MAX_RESULTS,
         "filters": [{"name": "JOB_NAME", "values": values}]},
        {"jobQueue": QUEUE, "maxResults": MAX_RESULTS, "jobStatus": "ALL"},
        {"jobQueue": QUEUE, "maxResults": MAX_RESULTS, "jobStatus": "RUNNABLE",
         "filters": [{"name": "QUOTA_SHARE_NAME", "values": [BACKLOG]}]},
    ]  # fmt: skip


async def reader(nc, stop: asyncio.Event, seconds: list[float], sizes: list[int],
                 errors: list[str]) -> None:  # fmt: skip
    subject = f"qm.api.{QUEUE}.list-service-jobs"
    requests = hardest_requests()
    turn = 0
    while not stop.is_set():
        request = dict(requests[turn % len(requests)])
        turn += 1
        token = None
        for _ in range(5):  # a few pages of each listing, then the next kind
            if token:
                request["nextToken"] = token
            started = time.perf_counter()
            try:
                reply = await nc.request(subject, json.dumps(request).encode(), timeout=30)
            except Exception as error:  # e.g. no answer: counted, and the reader goes on
                errors.append(type(error).__name__)
                break
            seconds.append(time.perf_counter() - started)
            sizes.append(len(reply.data))
            if reply.data.startswith(b'{"error"'):
                errors.append(json.loads(reply.data)["error"]["message"][:80])
                break
            token = next_token(reply.data)
            if not token or stop.is_set():
                break


def next_token(data: bytes) -> str | None:
    """The answer's nextToken, without decoding its jobs (the bench process shares the cores
    with the scheduler: it should spend as little as it can)."""
    at = data.rfind(b'"nextToken": "')
    if at < 0:
        return None
    start = at + len(b'"nextToken": "')
    return data[start : data.index(b'"', start)].decode()


async def read_hard(url: str, readers: int, duration_s: float) -> None:
    """The reading team (a process of its own): `readers` connections asking back to back for
    `duration_s`; prints what it saw as one JSON line."""
    connections = [await connect(url, f"reader-{i}") for i in range(readers)]
    stop = asyncio.Event()
    seconds: list[float] = []
    sizes: list[int] = []
    errors: list[str] = []
    tasks = [asyncio.create_task(reader(nc, stop, seconds, sizes, errors)) for nc in connections]
    await asyncio.sleep(duration_s)
    stop.set()
    await asyncio.gather(*tasks)
    for nc in connections:
        await nc.close()
    print(json.dumps({"seconds": seconds, "sizes": sizes, "errors": errors}))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered))) - 1))]


async def run(args) -> int:
    print(f"machine: {machine_info()}")
    print(f"backlog {args.backlog} jobs; writer {args.rate}/s for {args.seconds}s per phase; "
          f"{args.readers} readers at niceness {args.readers_nice}")  # fmt: skip
    with Server() as server:
        await ensure_streams(server.url)
        nc = await connect(server.url, "read-pressure-bench")
        js = nc.jetstream(publish_async_max_pending=4000)
        commands = setup(args.backlog)
        await publish_all(js, commands)
        process = SchedulerProcess(server.url, Path(server.data_dir) / "scheduler.log")
        try:
            started = time.perf_counter()
            await watch_ack_floor(js, COMMANDS_STREAM, DURABLE, len(commands), timeout=600)
            print(f"backlog decided in {time.perf_counter() - started:.1f}s")
            arrived: dict[str, float] = {}

            async def on_fact(msg) -> None:
                arrived[json.loads(msg.data)["jobId"]] = time.perf_counter()

            sub = await js.subscribe(
                f"qm.fact.{QUEUE}.*.JobDispatched", cb=on_fact, ordered_consumer=True,
                stream=FACTS_STREAM, config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
                pending_msgs_limit=200_000,
            )  # fmt: skip
            await asyncio.sleep(0.5)
            count, warmup = int(args.rate * args.seconds), int(args.rate * 0.5)
            quiet = await paced(js, writer_items(count, "quiet"), args.rate, warmup, arrived,
                                "quiet")  # fmt: skip

            # the readers in their own process: their reading must not delay this loop's
            # clock on the writer's facts (they still share the machine's cores)
            readers = subprocess.Popen(
                [sys.executable, __file__, "--read", server.url, "--readers", str(args.readers),
                 "--seconds", str(args.seconds + 1.0)],
                stdout=subprocess.PIPE, text=True, start_new_session=True,
                preexec_fn=(lambda: os.nice(args.readers_nice)) if args.readers_nice else None)  # fmt: skip
            await asyncio.sleep(1.0)  # the readers connected and at full speed first
            pressed = await paced(js, writer_items(count, "pressed"), args.rate, warmup, arrived,
                                  "under read pressure")  # fmt: skip
            out, _ = await asyncio.to_thread(readers.communicate, timeout=120)
            reads = json.loads(out.strip().splitlines()[-1])
            seconds, sizes, errors = reads["seconds"], reads["sizes"], reads["errors"]
            await sub.unsubscribe()
            log = process.log_path.read_text(errors="replace")
        finally:
            if not process.alive():
                print(process.tail(), file=sys.stderr)
            process.stop()
        await nc.close()

    q99, p99 = quiet.pct(99), pressed.pct(99)
    print(f"quiet:               submit->JobDispatched p50 {quiet.pct(50):.1f} ms  "
          f"p99 {q99:.1f} ms "
          f"({quiet.measured} measured, {quiet.missing} missing)")  # fmt: skip
    print(f"under read pressure: submit->JobDispatched p50 {pressed.pct(50):.1f} ms  "
          f"p99 {p99:.1f} ms "
          f"({pressed.measured} measured, {pressed.missing} missing)")  # fmt: skip
    print(f"p99 ratio (pressure / quiet): {p99 / q99:.2f}")
    print(f"reads answered: {len(seconds)} ({len(seconds) / (args.seconds + 1.0):.0f}/s), "
          f"latency p50 {pct(seconds, 50) * 1000:.1f} ms p99 {pct(seconds, 99) * 1000:.1f} ms, "
          f"largest answer {max(sizes, default=0)} bytes, errors {len(errors)}"
          + (f" (first: {errors[0]})" if errors else ""))  # fmt: skip
    print(f"scheduler stepped down during the run: {'yes' if 'stepped down' in log else 'no'}")
    return 0 if quiet.measured and pressed.measured else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, for CI")
    parser.add_argument("--backlog", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--readers", type=int, default=None)
    parser.add_argument("--readers-nice", type=int, default=0, choices=range(0, 20),
                        metavar="0-19", help="the readers' process niceness")
    # the readers' own process
    parser.add_argument("--read", metavar="NATS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        asyncio.run(read_hard(args.read, args.readers, args.seconds))
        return 0
    defaults = (2_000, 50.0, 2.0, 2) if args.smoke else (50_000, 200.0, 15.0, 4)
    for name, value in zip(("backlog", "rate", "seconds", "readers"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
