"""What the admission gate costs (services/gate): per refused command, and per command it lets
through, against publishing straight into the command stream in the same run.

    .venv/bin/python benchmarks/gate_bench.py            # 100k refusals, 3,000 round trips
    .venv/bin/python benchmarks/gate_bench.py --smoke    # tiny sizes, seconds (CI)

One embedded nats-server (the real binary, a fresh temporary store), the streams, one job
queue with shares `open` (the default limits) and `shut` (maxSubmissionsPerSecond 1), their
options recorded in the fact log as the scheduler would record them (no scheduler runs: the
gate reads the log, and what it lets through is only stored), and one `quotasched gate`
subprocess.

1. Refusals: N submissions to `shut` published without waiting for answers (requests whose
   answers are counted as they come): the gate's CPU time (utime + stime from /proc) over N is
   its cost per refusal; the throughput is N over the time until the last answer came back.
2. Round trips, one at a time: a JetStream publish of a submission to `open` through the gate
   (`qm.in...`: gate, stream, acknowledgement) against the same publish straight to
   `qm.cmd...`, alternating, M of each: p50 and p99, and their ratio.

The machine is small and shared: compare ratios, not last digits.
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

from benchmarks.live_bench import Server, connect, ensure_streams, machine_info  # noqa: E402
from benchmarks.read_pressure_bench import pct  # noqa: E402
from quotasched.events.subjects import COMMANDS_STREAM, GATE_PING, fact_subject  # noqa: E402

QUEUE, OPEN, SHUT = "gq", "open", "shut"
UNIT = "ml.g5.xlarge"


def submission(share: str, index: int, gate: bool) -> tuple[str, bytes]:
    body = {"kind": "SubmitServiceJob", "jobName": f"g-{index}", "jobQueue": QUEUE,
            "quotaShareName": share, "capacityUsage": [{"capacityUnit": UNIT, "quantity": 1}]}
    prefix = "qm.in" if gate else "qm.cmd"
    return f"{prefix}.{QUEUE}.{share}.SubmitServiceJob", json.dumps(body).encode()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def record_limits(js) -> None:
    """The fact that sets `shut`'s limit, as the scheduler records a SetQuotaShareOptions."""
    fact = {"kind": "QuotaShareOptionsSet", "at": 0.0, "commandSeq": 1, "jobQueue": QUEUE,
            "quotaShareName": SHUT, "optionsVersion": 1,
            "options": {"maxSubmissionsPerSecond": 1}}  # fmt: skip
    await js.publish(fact_subject("QuotaShareOptionsSet", QUEUE, SHUT), json.dumps(fact).encode())


async def gate_open(nc, gate: subprocess.Popen) -> None:
    for _ in range(300):
        if gate.poll() is not None:
            raise RuntimeError(f"the gate exited with {gate.returncode}")
        try:
            await nc.request(GATE_PING, b"", timeout=0.5)
            return
        except Exception:  # noqa: BLE001 - not open yet
            await asyncio.sleep(0.1)
    raise RuntimeError("the gate did not open")


async def refusals(nc, gate_pid: int, count: int) -> tuple[float, float, int]:
    """(µs of gate CPU per refusal, refusals per second, answers that were refusals)."""
    inbox = nc.new_inbox()
    answered = 0
    refused = 0
    done = asyncio.Event()

    async def on_answer(msg) -> None:
        nonlocal answered, refused
        answered += 1
        refused += b'"code": 429' in msg.data
        if answered >= count:
            done.set()

    sub = await nc.subscribe(inbox + ".*", cb=on_answer, pending_msgs_limit=count + 10)
    messages = [submission(SHUT, index, gate=True) for index in range(count)]
    cpu_before = cpu_seconds(gate_pid)
    began = time.perf_counter()
    for index, (subject, payload) in enumerate(messages):
        await nc.publish(subject, payload, reply=f"{inbox}.{index}")
        if index % 2000 == 1999:
            await nc.flush()
    await nc.flush()
    await asyncio.wait_for(done.wait(), 120)
    took = time.perf_counter() - began
    cpu = cpu_seconds(gate_pid) - cpu_before
    await sub.unsubscribe()
    return cpu / count * 1e6, count / took, refused


async def round_trips(js, count: int) -> tuple[list[float], list[float]]:
    through, straight = [], []
    for index in range(count):
        for gate, into in ((True, through), (False, straight)):
            subject, payload = submission(OPEN, index, gate)
            began = time.perf_counter()
            await js.publish(subject, payload, stream=COMMANDS_STREAM)
            into.append((time.perf_counter() - began) * 1000)
    return through, straight


async def bench(args) -> int:
    print(f"machine: {machine_info()}", flush=True)
    with Server() as server:
        await ensure_streams(server.url)
        nc = await connect(server.url, "gate-bench")
        js = nc.jetstream()
        await record_limits(js)
        gate = subprocess.Popen(
            [sys.executable, str(Path(sys.executable).parent / "quotasched"), "gate",
             "--nats-url", server.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "QUOTASCHED_LOG_LEVEL": "WARNING"})  # fmt: skip
        try:
            await gate_open(nc, gate)
            stored_before = (await js.stream_info(COMMANDS_STREAM)).state.messages
            per_refusal, rate, refused = await refusals(nc, gate.pid, args.refusals)
            stored = (await js.stream_info(COMMANDS_STREAM)).state.messages - stored_before
            print(f"refusals: {args.refusals:,} submissions to a share over its limit, "
                  f"{refused:,} refused, {stored:,} stored; gate CPU {per_refusal:.1f} us a "
                  f"refusal; {rate:,.0f} answered a second")  # fmt: skip
            through, straight = await round_trips(js, args.round_trips)
            p50g, p99g, p50d, p99d = (pct(through, 50), pct(through, 99), pct(straight, 50),
                                      pct(straight, 99))  # fmt: skip
            print(f"round trips ({args.round_trips:,} each, one at a time): through the gate "
                  f"p50 {p50g:.3f} ms p99 {p99g:.3f} ms; straight into the stream p50 "
                  f"{p50d:.3f} ms p99 {p99d:.3f} ms; ratio p50 {p50g / p50d:.2f}x "
                  f"p99 {p99g / p99d:.2f}x")  # fmt: skip
        finally:
            gate.terminate()
            gate.wait(10)
            await nc.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: for the test")
    parser.add_argument("--refusals", type=int, default=None)
    parser.add_argument("--round-trips", type=int, default=None)
    args = parser.parse_args()
    if args.refusals is None:
        args.refusals = 2_000 if args.smoke else 100_000
    if args.round_trips is None:
        args.round_trips = 100 if args.smoke else 3_000
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())
