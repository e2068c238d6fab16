"""Soak: a flooding tenant beside honest ones (issue 29, "Done when").  Not run by CI.

    .venv/bin/python benchmarks/flooding_soak.py            # 2 phases of 30 s, about 3 minutes
    .venv/bin/python benchmarks/flooding_soak.py --smoke    # 2 phases of 4 s: what the test runs

Options: --seconds S (per phase), --rate R (the honest team's submissions/s), --backlog N
(jobs queued in qs3, for the reads to chew on), --readers K (NATS readers), --endpoint-readers
E, --slow-sockets C, --reconnect-delay D (s), --header-timeout T (s: QUOTASCHED_HTTP_HEADER_TIMEOUT_S
for `up`; default the server's own), --direct, --keep.

The teams publish where `quotasched auth generate` lets a team publish: the admission gate's
subjects, `qm.in.q.<share>.SubmitServiceJob` (services/gate; `up` runs a gate).  `--direct`
publishes straight into the command stream instead (`qm.cmd...`), as anyone may where the server
has no per-role credentials: how the service fared before the gate.

The real stack, as an operator starts it: `quotasched up --data-dir DIR --port N --aws-port M
--executor simulated` (embedded nats-server, scheduler, projector, simulated executor and the
AWS Batch endpoint, in one process tree), configured with `quotasched config apply` of a file
written here: one job queue `q` with three quota shares, all RESERVE:

  - qs1, the honest team: room for every submission (each is dispatched at once, runs 1 s);
  - qs2, the flooding tenant: 2 instances and low admission limits (`options:` maxQueuedJobs
    --flood-max-queued, maxSubmissionsPerSecond --flood-max-per-second);
  - qs3, a backlog team: N jobs queued behind 1 instance, so that listings are heavy.

Two phases of equal length on the same stack:

1. honest alone: qs1 submits at a paced R/s over NATS (`qm.in.q.qs1.SubmitServiceJob`); each
   job's latency is the time from the publish call to the arrival of its first decision fact
   (JobSubmitted, or CommandRejected) on an ordered consumer of qs1's facts;
2. the same honest load while the flooding tenant, in a process of its own (its work must not
   delay this process's clock on the honest facts; it still shares the cores), does all three
   at once: volume (qs2 submissions published as fast as the bus acknowledges them, refused or
   not), heavy reads (K NATS connections asking `qm.api.q.qs2.list-service-jobs` back to back
   with maxResults 1000 and 100 JOB_NAME values, and E endpoint connections asking
   ListServiceJobs likewise), and slow connections (C sockets to the endpoint's port on
   loopback, each sending a request line and one header line every 2 s, never finishing its
   headers; a socket the server closes is opened again after D s).

All along, an honest probe asks the endpoint DescribeServiceJob (boto3, 4/s): whether idle
sockets keep an honest HTTP client out.  At the end it prints the honest p50/p99 of each phase
and their ratio, the flooding submissions accepted and refused (by the limit the refusal
names), the reads answered, the sockets shed, and whether every honest job was decided.
Exit status 0 when every honest job was decided, none was refused, and `up` is still running
(no crash); latency is reported, never judged.  The machine is small and shared: compare
ratios, not last digits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: E402

from benchmarks.live_bench import (  # noqa: E402
    _patch_publish_async,
    connect,
    machine_info,
    paced,
    publish_all,
    watch_ack_floor,
)
from benchmarks.read_pressure_bench import next_token, pct  # noqa: E402
from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM  # noqa: E402
from quotasched.services.nats.embedded import free_port  # noqa: E402
from quotasched.services.settings import HttpOptions  # noqa: E402
from tests.integration.conftest import QUOTASCHED, Process  # noqa: E402

QUEUE, HONEST, FLOOD, BACKLOG = "q", "qs1", "qs2", "qs3"
UNIT = "ml.g5.xlarge"
DURABLE = "scheduler-main"  # the scheduler's command consumer (partition "main")
MAX_RESULTS, MAX_VALUES = 1000, 100  # the read API's bounds (services/scheduler/api.py)
LIMITS = ("maxQueuedJobs", "maxSubmissionsPerSecond", "maxSubmissionBytesPerWindow")
START_CEILING_S = 120.0


def config_yaml(max_queued: int, max_per_second: int) -> str:
    share = ("  - quotaShareName: {name}\n    jobQueue: q\n"
             "    capacityLimits:\n      - {{capacityUnit: " + UNIT + ", maxCapacity: {limit}}}\n"
             "    resourceSharingConfiguration: {{strategy: RESERVE}}\n"
             "    preemptionConfiguration: {{inSharePreemption: DISABLED}}\n")  # fmt: skip
    return (
        "serviceEnvironments:\n  - serviceEnvironmentName: se\n    capacityLimits:\n"
        f"      - {{capacityUnit: {UNIT}, maxCapacity: 1000000}}\n"
        "schedulingPolicies:\n  - name: sp\n    quotaSharePolicy: {idleResourceAssignmentStrategy: FIFO}\n"
        "jobQueues:\n  - jobQueueName: q\n    schedulingPolicy: sp\n    serviceEnvironmentOrder:\n"
        "      - {order: 1, serviceEnvironment: se}\n"
        "quotaShares:\n"
        + share.format(name=HONEST, limit=900_000)
        + share.format(name=FLOOD, limit=2)
        + f"    options: {{maxQueuedJobs: {max_queued}, maxSubmissionsPerSecond: {max_per_second}}}\n"
        + share.format(name=BACKLOG, limit=1)
    )  # fmt: skip


def submission(share: str, job_id: str, duration_s: float, gate: bool = False) -> tuple[str, bytes]:
    """A submission and its subject: the gate's (`gate`, where a team's credentials allow it
    to publish) or the command stream's (set-up, as the admin)."""
    body = {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": UNIT, "quantity": 1}],
            "tags": {"duration": f"{duration_s:g}"}}  # fmt: skip
    prefix = "qm.in" if gate else "qm.cmd"
    return f"{prefix}.{QUEUE}.{share}.SubmitServiceJob", json.dumps(body, separators=(",", ":")).encode()


def backlog_name(index: int) -> str:
    return f"bk-{index % 1000:03d}-{index}"


# -- the stack ---------------------------------------------------------------------------------


class Stack:
    """`quotasched up` on free ports in `root`, configured with the three shares."""

    def __init__(self, root: Path, header_timeout_s: float | None):
        self.root = root
        self.port, self.aws_port = free_port(), free_port()
        self.env = {key: value for key, value in os.environ.items()
                    if key != "QUOTASCHED_NATS_URL"}  # fmt: skip
        if header_timeout_s is not None:
            self.env["QUOTASCHED_HTTP_HEADER_TIMEOUT_S"] = f"{header_timeout_s:g}"
        self.up = Process(["up", "--data-dir", str(root / "data"), "--port", str(self.port),
                           "--aws-port", str(self.aws_port), "--web-port", "off",
                           "--executor", "simulated"], self.env, root / "up.log")  # fmt: skip
        self.url = f"nats://127.0.0.1:{self.port}"
        self.endpoint = ""

    async def started(self) -> None:
        deadline = time.monotonic() + START_CEILING_S
        while not self.endpoint:
            for line in self.up.output().splitlines():
                if line.startswith("AWS_ENDPOINT_URL_BATCH="):
                    self.endpoint = line.split("=", 1)[1].strip()
            if self.up.popen.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"`up` printed no AWS endpoint:\n{self.up.output()[-3000:]}")
            await asyncio.sleep(0.1)

    def apply(self, max_queued: int, max_per_second: int) -> None:
        path = self.root / "shares.yaml"
        path.write_text(config_yaml(max_queued, max_per_second))
        done = subprocess.run([QUOTASCHED, "config", "apply", str(path)], capture_output=True,
                              text=True, timeout=120,
                              env={**self.env, "QUOTASCHED_NATS_URL": self.url})  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"config apply failed: {done.stdout}{done.stderr}")

    def crashes(self) -> list[str]:
        """The log's error lines and tracebacks (the endpoint's and aiohttp's included)."""
        return [line for line in self.up.output().splitlines()
                if "Traceback" in line or '"level": "error"' in line
                or '"level": "critical"' in line]  # fmt: skip

    def warnings(self) -> Counter:
        """The log's warning and error events, counted by event."""
        events: Counter = Counter()
        for line in self.up.output().splitlines():
            if '"level": "warning"' in line or '"level": "error"' in line:
                try:
                    entry = json.loads(line)
                    detail = entry.get("error") or entry.get("reason") or ""
                    events[f"{entry['level']}: {str(entry.get('event'))[:60]}"
                           + (f" ({str(detail)[:100]})" if detail else "")] += 1
                except (ValueError, KeyError):
                    events[line[:100]] += 1
        return events


# -- the honest team ---------------------------------------------------------------------------


def honest_items(count: int, phase: str, gate: bool) -> list[tuple[str, bytes, str]]:
    items = []
    for index in range(count):
        job_id = f"h-{phase}-{index:06d}"
        items.append((*submission(HONEST, job_id, 1.0, gate), job_id))
    return items


class Probe:
    """The honest team's HTTP client: DescribeServiceJob through the endpoint, 4/s, in a thread
    (boto3 is synchronous), as a dashboard or a pipeline polling a job does."""

    def __init__(self, endpoint: str, job_id: str):
        import boto3
        from botocore.config import Config

        self.batch = boto3.client("batch", endpoint_url=endpoint, region_name="us-east-1",
                                  aws_access_key_id="honest", aws_secret_access_key="honest",
                                  config=Config(connect_timeout=5, read_timeout=30,
                                                retries={"mode": "standard", "max_attempts": 3}))  # fmt: skip
        self.job_id = job_id
        self.phase = "quiet"
        self.seconds: dict[str, list[float]] = {}
        self.errors: dict[str, Counter] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            started = time.perf_counter()
            try:
                self.batch.describe_service_job(jobId=self.job_id)
                self.seconds.setdefault(phase, []).append(time.perf_counter() - started)
            except Exception as error:  # counted, and the probe goes on
                self.errors.setdefault(phase, Counter())[type(error).__name__] += 1
            self.stop.wait(0.25)

    def line(self, phase: str) -> str:
        seconds, errors = self.seconds.get(phase, []), self.errors.get(phase, Counter())
        return (f"{len(seconds)} answered, p50 {pct(seconds, 50) * 1000:.1f} ms p99 "
                f"{pct(seconds, 99) * 1000:.1f} ms, {sum(errors.values())} failed"
                + (f" ({', '.join(f'{n} {kind}' for kind, n in errors.items())})" if errors else ""))


# -- the flooding tenant (its own process: --flood) ----------------------------------------------


def hardest_requests() -> list[dict]:
    """The most a reader may ask: 100 JOB_NAME values (prefixes matching every backlog job, and
    exact names) and maxResults 1000; and the whole queue, every status."""
    values = ["b*"] + [f"bk-{index:03d}*" for index in range(1, MAX_VALUES // 2)]
    values += [backlog_name(index) for index in range(MAX_VALUES - len(values))]
    return [
        {"jobQueue": QUEUE, "maxResults": MAX_RESULTS,
         "filters": [{"name": "JOB_NAME", "values": values}]},
        {"jobQueue": QUEUE, "maxResults": MAX_RESULTS, "jobStatus": "ALL"},
    ]  # fmt: skip


def outcome(future) -> str:
    """What became of one flooding publish: stored, refused at the gate, or refused otherwise."""
    error = future.exception()
    if error is None:
        return "published"
    return "refused at the gate" if getattr(error, "err_code", None) == 429 else "publish errors"


async def flood_volume(js, stop: asyncio.Event, seen: Counter, gate: bool) -> None:
    """qs2 submissions as fast as the bus answers them, 1000 answers awaited at most."""
    futures: list = []
    index = 0
    while not stop.is_set():
        subject, payload = submission(FLOOD, f"f-{index:08d}", 1.0, gate)
        index += 1
        futures.append(await js.publish_async(subject, payload))
        if len(futures) >= 1000:
            done, _ = await asyncio.wait(futures, timeout=30)
            for future in done:
                seen[outcome(future)] += 1
            seen["publish timeouts"] += len(futures) - len(done)
            futures = []
    done, _ = await asyncio.wait(futures, timeout=30) if futures else (set(), set())
    for future in done:
        seen[outcome(future)] += 1


async def nats_reader(nc, stop: asyncio.Event, seconds: list[float], errors: Counter) -> None:
    subject = f"qm.api.{QUEUE}.{FLOOD}.list-service-jobs"  # the team's own read subject
    requests = hardest_requests()
    turn = 0
    while not stop.is_set():
        request, token = dict(requests[turn % len(requests)]), None
        turn += 1
        for _ in range(5):  # a few pages of each listing, then the next kind
            if token:
                request["nextToken"] = token
            started = time.perf_counter()
            try:
                reply = await nc.request(subject, json.dumps(request).encode(), timeout=30)
            except Exception as error:
                errors[type(error).__name__] += 1
                break
            seconds.append(time.perf_counter() - started)
            if reply.data.startswith(b'{"error"'):
                errors[json.loads(reply.data)["error"]["message"][:80]] += 1
                break
            token = next_token(reply.data)
            if not token or stop.is_set():
                break


async def endpoint_reader(endpoint: str, stop: asyncio.Event, seconds: list[float],
                          errors: Counter) -> None:  # fmt: skip
    """ListServiceJobs, the hardest form, over one keep-alive HTTP connection (unsigned: the
    loopback endpoint without keys checks no signature)."""
    import aiohttp

    # AWS's ListServiceJobs has no jobStatus ALL (the NATS read API's own extension)
    requests = [r for r in hardest_requests() if r.get("jobStatus") != "ALL"]
    requests.append({"jobQueue": QUEUE, "maxResults": MAX_RESULTS, "jobStatus": "RUNNABLE",
                     "filters": [{"name": "QUOTA_SHARE_NAME", "values": [BACKLOG]}]})
    turn = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            request = requests[turn % len(requests)]
            turn += 1
            started = time.perf_counter()
            try:
                async with session.post(f"{endpoint}/v1/listservicejobs", json=request) as reply:
                    body = await reply.read()
                    if reply.status != 200:
                        errors[f"HTTP {reply.status} {body[:160].decode(errors='replace')}"] += 1
                        continue
            except Exception as error:
                errors[type(error).__name__] += 1
                await asyncio.sleep(0.1)
                continue
            seconds.append(time.perf_counter() - started)


async def slow_socket(host: str, port: int, stop: asyncio.Event, delay_s: float,
                      seen: Counter, lifetimes: list[float]) -> None:  # fmt: skip
    """Slowloris: a request line and one header line every 2 s, headers never finished; when the
    server closes the socket, wait `delay_s` and open another."""
    start = f"POST /v1/listservicejobs HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as error:
            seen[f"connect failed ({type(error).__name__})"] += 1
            await asyncio.sleep(delay_s)
            continue
        seen["opened"] += 1
        opened = time.monotonic()
        shed = None
        try:
            writer.write(start)
            while not stop.is_set() and shed is None:
                try:
                    data = await asyncio.wait_for(reader.read(256), 2.0)
                except asyncio.TimeoutError:
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
                    continue
                shed = "refused 503 (every connection busy)" if b" 503 " in data else "closed"
        except (ConnectionError, OSError):
            shed = "closed"
        finally:
            writer.close()
        if shed is not None:
            seen[shed] += 1
            lifetimes.append(time.monotonic() - opened)
            await asyncio.sleep(delay_s)


async def flood(args) -> None:
    """The flooding tenant: volume, heavy reads and slow connections at once, for
    args.seconds; prints what it saw as one JSON line."""
    _patch_publish_async()
    stop = asyncio.Event()
    volume_nc = await connect(args.flood, "flood-volume")
    readers = [await connect(args.flood, f"flood-reader-{i}") for i in range(args.readers)]
    host, port = args.endpoint.removeprefix("http://").rsplit(":", 1)
    seen: Counter = Counter()
    sockets: Counter = Counter()
    lifetimes: list[float] = []
    nats_s, endpoint_s = [], []
    nats_errors, endpoint_errors = Counter(), Counter()
    tasks = [asyncio.create_task(flood_volume(volume_nc.jetstream(publish_async_max_pending=2000),
                                              stop, seen, not args.direct))]  # fmt: skip
    tasks += [asyncio.create_task(nats_reader(nc, stop, nats_s, nats_errors)) for nc in readers]
    tasks += [asyncio.create_task(endpoint_reader(args.endpoint, stop, endpoint_s, endpoint_errors))
              for _ in range(args.endpoint_readers)]  # fmt: skip
    tasks += [asyncio.create_task(slow_socket(host, int(port), stop, args.reconnect_delay, sockets,
                                              lifetimes)) for _ in range(args.slow_sockets)]  # fmt: skip
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.wait(tasks, timeout=40)
    for nc in (volume_nc, *readers):
        await nc.close()
    print(json.dumps({"volume": seen, "nats_reads": nats_s, "nats_errors": nats_errors,
                      "endpoint_reads": endpoint_s, "endpoint_errors": endpoint_errors,
                      "sockets": sockets, "lifetimes": lifetimes}))  # fmt: skip


# -- the soak ----------------------------------------------------------------------------------


async def flood_facts(js) -> tuple[int, Counter, list[str]]:
    """(qs2 submissions accepted, refusals per limit named, a few refusals naming none)."""
    accepted, refused, unnamed = 0, Counter(), []
    sub = await js.subscribe(f"qm.fact.{QUEUE}.{FLOOD}.>", ordered_consumer=True,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
                             pending_msgs_limit=500_000, pending_bytes_limit=1 << 30)  # fmt: skip
    last = (await js.stream_info(FACTS_STREAM)).state.last_seq
    while True:
        try:
            msg = await sub.next_msg(timeout=5)
        except Exception:
            break
        kind = msg.subject.rsplit(".", 1)[1]
        if kind == "JobSubmitted":
            accepted += 1
        elif kind == "CommandRejected":
            limit = next((name for name in LIMITS if name.encode() in msg.data), None)
            refused[limit or "naming no limit"] += 1
            if limit is None and len(unnamed) < 3:
                unnamed.append(json.loads(msg.data).get("statusReason", "")[:160])
        if msg.metadata.sequence.stream >= last:
            break
    await sub.unsubscribe()
    return accepted, refused, unnamed


async def load_backlog(js, count: int) -> None:
    messages = [submission(BACKLOG, backlog_name(index), 3600.0) for index in range(count)]
    await publish_all(js, messages)
    target = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
    await watch_ack_floor(js, COMMANDS_STREAM, DURABLE, target, timeout=600, interval=0.2)


async def soak(args, root: Path) -> int:
    began = time.monotonic()
    print(f"machine: {machine_info()}", flush=True)
    stack = Stack(root, args.header_timeout)
    try:
        return await run_phases(args, stack, began)
    finally:
        code = stack.up.stop(30)
        print(f"`up` stopped with exit status {code}")


async def run_phases(args, stack: Stack, began: float) -> int:
    _patch_publish_async()
    await stack.started()
    await asyncio.to_thread(stack.apply, args.flood_max_queued, args.flood_max_per_second)
    nc = await connect(stack.url, "flooding-soak")
    js = nc.jetstream(publish_async_max_pending=4000)
    await load_backlog(js, args.backlog)
    print(f"stack up, configured, {args.backlog} backlog jobs queued in {BACKLOG} "
          f"({time.monotonic() - began:.0f} s); {args.seconds:g} s per phase", flush=True)
    decided: dict[str, float] = {}
    honest_refusals: list[str] = []
    failed: dict[str, str] = {}  # honest jobs an attempt of which FAILED: the reason

    async def on_fact(msg) -> None:
        fact = json.loads(msg.data)
        job = fact.get("jobId")
        if fact["kind"] == "JobStatusChanged" and fact.get("status") == "FAILED":
            failed[job] = str(fact.get("statusReason"))
        if job and fact["kind"] in ("JobSubmitted", "CommandRejected") and job not in decided:
            decided[job] = time.perf_counter()
            if fact["kind"] == "CommandRejected":
                honest_refusals.append(fact.get("statusReason", ""))

    sub = await js.subscribe(f"qm.fact.{QUEUE}.{HONEST}.>", cb=on_fact, ordered_consumer=True,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
                             pending_msgs_limit=200_000)  # fmt: skip
    await asyncio.sleep(0.5)
    count, warmup = int(args.rate * args.seconds), int(args.rate * 0.5)
    quiet_items = honest_items(count, "quiet", not args.direct)
    probe = Probe(stack.endpoint, backlog_name(0))  # a job that exists throughout
    probe.thread.start()
    quiet = await paced(js, quiet_items, args.rate, warmup, decided, "honest alone", drain_s=60)
    flooder = subprocess.Popen(
        [sys.executable, __file__, "--flood", stack.url, "--endpoint", stack.endpoint,
         "--seconds", str(args.seconds + 1.0), "--readers", str(args.readers),
         "--endpoint-readers", str(args.endpoint_readers), "--slow-sockets", str(args.slow_sockets),
         "--reconnect-delay", str(args.reconnect_delay), *(["--direct"] if args.direct else [])],
        stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    flood_end = time.perf_counter() + args.seconds + 1.0
    await asyncio.sleep(1.0)  # the flood at full strength first
    probe.phase = "flood"
    flooded_items = honest_items(count, "flooded", not args.direct)
    flooded = await paced(js, flooded_items, args.rate, warmup, decided, "beside the flood",
                          drain_s=900)  # every honest job's latency, however late  # fmt: skip
    probe.phase = "after"
    out, _ = await asyncio.to_thread(flooder.communicate, timeout=180)
    target = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
    await watch_ack_floor(js, COMMANDS_STREAM, DURABLE, target, timeout=900, interval=0.2)
    print(f"every command decided {time.perf_counter() - flood_end:.1f} s after the flood "
          f"stopped ({target} commands in the stream)", flush=True)  # fmt: skip
    probe.stop.set()
    await asyncio.to_thread(probe.thread.join, 40)
    await sub.unsubscribe()
    seen = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    accepted, refused, unnamed = await flood_facts(js)
    await nc.close()
    alive = stack.up.popen.poll() is None
    crashes = stack.crashes()
    keys = [key for *_, key in quiet_items + flooded_items]
    undecided = [key for key in keys if key not in decided]
    report(args, quiet, flooded, seen, accepted, refused, unnamed, probe)
    print(f"honest jobs decided: {len(keys) - len(undecided)} of {len(keys)}"
          f"{' (every one)' if not undecided else f', first undecided {undecided[0]}'}; "
          f"honest jobs refused: {len(honest_refusals)}"
          + (f" (first: {honest_refusals[0][:120]})" if honest_refusals else ""))  # fmt: skip
    print(f"honest jobs FAILED: {len(failed)}"
          + (f" (first: {next(iter(failed))}: {next(iter(failed.values()))[:160]})" if failed else ""))
    print(f"`up` still running: {'yes' if alive else 'NO'}; error lines in its log: {len(crashes)}"
          + (f" (first: {crashes[0][:200]})" if crashes else ""))  # fmt: skip
    warnings = stack.warnings()
    print(f"scheduler stepped down during the run: "
          f"{'yes' if 'stepped down' in stack.up.output() else 'no'}; warnings and errors logged: "
          + (", ".join(f"{n} x {event}" for event, n in warnings.most_common(6)) or "none"))  # fmt: skip
    print(f"flooder exit status {flooder.returncode}; {time.monotonic() - began:.0f} s")
    ok = not undecided and not honest_refusals and alive and flooder.returncode == 0
    return 0 if ok else 1


def report(args, quiet, flooded, seen, accepted, refused, unnamed, probe: Probe) -> None:
    q99, f99 = quiet.pct(99), flooded.pct(99)
    for latency in (quiet, flooded):
        print(f"{latency.name + ':':<18} submit->decision p50 {latency.pct(50):.1f} ms  p99 "
              f"{latency.pct(99):.1f} ms ({latency.measured} measured, {latency.missing} "
              f"undecided, {latency.achieved_rate:.0f}/s sent)")  # fmt: skip
    print(f"p99 ratio (flood / alone): {f99 / q99:.2f}")
    volume = seen.get("volume", {})
    print(f"teams publish: {'straight into the command stream (--direct)' if args.direct else 'through the admission gate'}")
    print(f"flooding submissions: {volume.get('published', 0)} stored, "
          f"{volume.get('refused at the gate', 0)} refused at the gate, "
          f"{volume.get('publish errors', 0)} refused by the bus, {volume.get('publish timeouts', 0)} "
          f"unacknowledged; of those stored {accepted} accepted, refused {sum(refused.values())} "
          f"({', '.join(f'{n} naming {name}' for name, n in refused.items()) or 'none'})")  # fmt: skip
    for text in unnamed:
        print(f"  a refusal naming no limit: {text}")
    for name in ("nats", "endpoint"):
        reads, errors = seen.get(f"{name}_reads", []), seen.get(f"{name}_errors", {})
        print(f"flooding reads ({name}): {len(reads)} answered ({len(reads) / (args.seconds + 1):.0f}/s), "
              f"p50 {pct(reads, 50) * 1000:.0f} ms p99 {pct(reads, 99) * 1000:.0f} ms, "
              f"{sum(errors.values())} errors"
              + (f" ({', '.join(f'{n} {kind}' for kind, n in errors.items())})" if errors else ""))  # fmt: skip
    sockets, lifetimes = seen.get("sockets", {}), seen.get("lifetimes", [])
    shed = {kind: n for kind, n in sockets.items() if kind != "opened"}
    timeout_s = args.header_timeout or HttpOptions().header_timeout_s
    early = sum(1 for seconds in lifetimes if seconds < 0.8 * timeout_s)
    print(f"slow sockets: {args.slow_sockets} at once, {sockets.get('opened', 0)} opened, "
          f"{sum(shed.values())} shed ({', '.join(f'{n} {kind}' for kind, n in shed.items()) or 'none'}), "
          f"{early} of them before the header timeout ({timeout_s:g} s: evicted by the cap), "
          f"open for p50 {pct(lifetimes, 50):.1f} s max {max(lifetimes, default=0):.1f} s")  # fmt: skip
    print(f"honest endpoint probe, alone: {probe.line('quiet')}")
    print(f"honest endpoint probe, beside the flood: {probe.line('flood')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="4 s phases, small sizes: for the test")
    parser.add_argument("--seconds", type=float, default=None, help="per phase")
    parser.add_argument("--rate", type=float, default=None, help="honest submissions/s")
    parser.add_argument("--backlog", type=int, default=None, help="jobs queued in qs3")
    parser.add_argument("--readers", type=int, default=None, help="flooding NATS readers")
    parser.add_argument("--endpoint-readers", type=int, default=None)
    parser.add_argument("--slow-sockets", type=int, default=None)
    parser.add_argument("--reconnect-delay", type=float, default=1.0,
                        help="s before a shed slow socket is opened again")
    parser.add_argument("--header-timeout", type=float, default=None,
                        help="QUOTASCHED_HTTP_HEADER_TIMEOUT_S for `up` (default: its own)")
    parser.add_argument("--flood-max-queued", type=int, default=200, help="qs2's maxQueuedJobs")
    parser.add_argument("--flood-max-per-second", type=int, default=20,
                        help="qs2's maxSubmissionsPerSecond")
    parser.add_argument("--direct", action="store_true",
                        help="teams publish straight into the command stream, not through the gate")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--flood", metavar="NATS_URL", help=argparse.SUPPRESS)  # the flooder
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    defaults = ((4.0, 50.0, 300, 2, 1, 150) if args.smoke else (30.0, 50.0, 5000, 4, 2, 200))
    names = ("seconds", "rate", "backlog", "readers", "endpoint_readers", "slow_sockets")
    for name, value in zip(names, defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.flood:
        asyncio.run(flood(args))
        return 0
    if args.smoke and args.header_timeout is None:
        args.header_timeout = 2.0  # so that 4 s phases see sockets timed out, not only evicted
    root = Path(tempfile.mkdtemp(prefix="quotasched-flooding-soak-"))
    code = asyncio.run(soak(args, root))
    if args.keep or code != 0:
        print(f"logs and stores kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
