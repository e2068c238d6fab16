"""Rebuild throughput of the DuckDB projection, beside the raw JSON decode rate of the same file.

    .venv/bin/python benchmarks/projections_bench.py            # ~1M facts (850k commands)
    .venv/bin/python benchmarks/projections_bench.py --quick    # ~120k facts
    .venv/bin/python benchmarks/projections_bench.py --facts FILE.jsonl
    .venv/bin/python benchmarks/projections_bench.py --stream     # also from QM_FACTS
    .venv/bin/python benchmarks/projections_bench.py --smoke      # ~10k facts, with --stream (make test)

The fact file is made once and cached in benchmarks/out/: `benchmarks/workload.py` writes a
command file, `quotasched replay` turns it into facts.  Then, best of --reps:

- decode floor: every line through orjson (json when orjson is missing), nothing kept;
  pydantic (`events.codec.decode_fact`) on a 50k-line sample, to show why it is kept out of
  the rebuild (the projection parses JSON in DuckDB: projections/rows.py);
- rebuild: `projections.rebuild.rebuild_from_file` into a fresh file, with the time per step;
- incremental: `ProjectionStore.apply` in batches of 1000 and 5000 facts on top of the rest
  of the log (the live projector's path), as ms per batch, and 1000-fact batches on top of
  the first tenth of the log, to show how a batch's cost grows with the file;
- reads over the result: a few queries, and the three read verbs as the projector answers
  them (projections.queries);
- with --stream: the facts published into QM_FACTS of an embedded nats-server, then the
  stream's read floor (every fact read in chunks, nothing kept) and
  `rebuild.rebuild_from_stream` (read, spooled, projected per run of sequences).

Target (from the issue): rebuild >= 500k facts/s, printed as PASS / MISS.  Wall-clock times on
a shared machine: the load average is printed with the figures.

--smoke: every step above, --stream included, on ~10k facts (8k commands) with one repetition
and incremental batches of 100 and 500 facts (the 8 batches of 5000 would not fit), in about
10-20 s: that the bench runs (`make test`); its figures are too small to quote.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quotasched.projections import rebuild, store  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
TARGET = 500_000


def fact_file(commands: int, queued: int) -> Path:
    facts = OUT / f"projection_facts_c{commands}_q{queued}.jsonl"
    if facts.exists():
        return facts
    OUT.mkdir(parents=True, exist_ok=True)
    command_file = OUT / f"projection_commands_c{commands}_q{queued}.jsonl"
    print(f"generating {command_file.name} and its facts (once; cached in benchmarks/out/)")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workload.py"),
                    "--commands", str(commands), "--queued", str(queued),
                    "--out", str(command_file)], check=True)  # fmt: skip
    quotasched = Path(sys.executable).parent / "quotasched"
    with open(facts.with_suffix(".tmp"), "wb") as out:
        subprocess.run([str(quotasched), "replay", str(command_file)], stdout=out, check=True)
    facts.with_suffix(".tmp").rename(facts)
    return facts


def decode_floor(lines: list[bytes]) -> tuple[str, float]:
    try:
        import orjson

        loads, name = orjson.loads, "orjson"
    except ImportError:  # not a project dependency
        import json

        loads, name = json.loads, "json"
    started = time.perf_counter()
    for line in lines:
        loads(line)
    return name, len(lines) / (time.perf_counter() - started)


def pydantic_rate(lines: list[bytes]) -> float:
    from quotasched.events.codec import decode_fact

    sample = lines[:50_000]
    started = time.perf_counter()
    for line in sample:
        decode_fact(line)
    return len(sample) / (time.perf_counter() - started)


def timed_rebuild(facts: Path, directory: str) -> tuple[float, int, dict[str, float]]:
    target = os.path.join(directory, "bench.duckdb")
    steps: dict[str, float] = {}
    marks: list[tuple[str, float]] = []
    original = store.ProjectionStore.apply_file

    def apply_file(self, path, on_step=None):
        return original(self, path, lambda name: marks.append((name, time.perf_counter())))

    store.ProjectionStore.apply_file = apply_file
    try:
        done = rebuild.rebuild_from_file(str(facts), target)
    finally:
        store.ProjectionStore.apply_file = original
    ends = [t for _, t in marks[1:]] + [marks[0][1] + done.seconds]
    for (name, start), end in zip(marks, ends):
        steps[name] = steps.get(name, 0.0) + max(0.0, end - start)
    return done.seconds, done.facts, steps


def incremental(lines: list[bytes], directory: str, batch: int, batches: int = 8,
                head: int | None = None) -> float:  # fmt: skip
    """ms per batch, applied on top of a projection of the first `head` facts (default: all
    but the last batches)."""
    head = len(lines) - batch * batches if head is None else head
    path = os.path.join(directory, f"inc{batch}_{head}.duckdb")
    prefix = os.path.join(directory, "prefix.jsonl")
    with open(prefix, "wb") as out:
        out.write(b"\n".join(lines[:head]) + b"\n")
    with store.open(path) as projection:
        projection.apply_file(prefix)
        started = time.perf_counter()
        for k in range(batches):
            first = head + k * batch
            projection.apply([(first + 1 + i, lines[first + i]) for i in range(batch)])
        return (time.perf_counter() - started) / batches * 1000


def reads(directory: str) -> list[tuple[str, float]]:
    from quotasched.projections import queries as verbs

    queries = [
        ("jobs: status counts", "SELECT status, count(*) FROM jobs GROUP BY ALL"),
        ("share_usage: rows", "SELECT count(*) FROM share_usage"),
        ("queue_usage: rows", "SELECT count(*) FROM queue_usage"),
        ("utilization, hourly", "SELECT count(*), sum(lent_s) FROM utilization(0, "
                                "(SELECT last_at FROM projection_state), 3600)"),
        ("facts: last job's facts", "SELECT count(*) FROM facts WHERE job_id = "
                                    "(SELECT max(job_id) FROM job_submitted)"),
    ]  # fmt: skip
    timings = []
    with store.open(os.path.join(directory, "bench.duckdb"), read_only=True) as projection:
        con = projection.con
        for label, sql in queries:
            started = time.perf_counter()
            con.execute(sql).fetchall()
            timings.append((label, time.perf_counter() - started))
        # The scheduler's read verbs, answered from the projection (as the projector does).
        job_id, queue = con.execute("SELECT job_id, job_queue FROM job_submitted "
                                    "ORDER BY seq DESC LIMIT 1").fetchone()  # fmt: skip
        for verb, request in (("describe-service-job", {"jobId": job_id}),
                              ("list-service-jobs", {"jobQueue": queue, "jobStatus": "RUNNING"}),
                              ("get-job-queue-snapshot", {"jobQueue": queue})):  # fmt: skip
            started = time.perf_counter()
            verbs.answer(con, verb, request)
            timings.append((verb, time.perf_counter() - started))
    return timings


def stream_rebuilds(lines: list[bytes], reps: int) -> tuple[float, float, list[float]]:
    """The same facts published into QM_FACTS of a fresh embedded nats-server, then (best of
    `reps`) the read floor, every fact read in chunks and nothing kept, and
    `rebuild_from_stream`: (facts/s read, facts/s rebuilt, seconds per rebuild)."""
    import asyncio
    import json

    from quotasched.events.subjects import fact_subject
    from quotasched.services.nats.bus import connect, ensure_streams
    from quotasched.services.nats.embedded import EmbeddedServer
    from quotasched.services.nats.log import read_log_chunks
    from quotasched.services.settings import Settings

    async def run(directory: str) -> tuple[float, float, list[float]]:
        server = EmbeddedServer(os.path.join(directory, "nats")).start()
        try:
            nc = await connect(server.url, "projections-bench")
            js = nc.jetstream(publish_async_max_pending=20_000)
            await ensure_streams(js, Settings())
            started = time.perf_counter()
            for line in lines:
                document = json.loads(line)
                subject = fact_subject(document["kind"], document.get("jobQueue"),
                                       document.get("quotaShareName"))  # fmt: skip
                await js.publish_async(subject, line)
            await js.publish_async_completed()
            print(f"published {len(lines):,} facts into QM_FACTS in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
            reads, rebuilds = [], []
            for _ in range(reps):
                started = time.perf_counter()
                count = 0
                async for chunk in read_log_chunks(js):
                    count += len(chunk)
                reads.append(count / (time.perf_counter() - started))
                done = await rebuild.rebuild_from_stream(js, os.path.join(directory, "s.duckdb"))
                rebuilds.append(done.seconds)
            await nc.close()
            return max(reads), len(lines) / min(rebuilds), rebuilds
        finally:
            server.stop()

    with tempfile.TemporaryDirectory(dir=OUT if OUT.exists() else None) as directory:
        return asyncio.run(run(directory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~120k facts, 2 repetitions")
    parser.add_argument("--smoke", action="store_true",
                        help="~10k facts, 1 repetition, with --stream: that it runs (make test)")
    parser.add_argument("--facts", type=Path, help="a fact file to use instead of the workload")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--stream", action="store_true",
                        help="also rebuild from the stream: publish the facts into an embedded "
                             "nats-server, then `rebuild_from_stream` beside the read floor")
    args = parser.parse_args()
    reps = args.reps or (1 if args.smoke else 2 if args.quick else 3)
    sizes = ((8_000, 4_000) if args.smoke else (100_000, 50_000) if args.quick
             else (850_000, 400_000))  # fmt: skip
    args.stream = args.stream or args.smoke
    facts = args.facts or fact_file(*sizes)
    lines = [line for line in facts.read_bytes().splitlines() if line.strip()]
    size_mb = facts.stat().st_size / 1e6
    print(f"{facts.name}: {len(lines):,} facts, {size_mb:,.0f} MB; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")  # fmt: skip
    name, floor = max((decode_floor(lines) for _ in range(reps)), key=lambda r: r[1])
    print(f"decode floor ({name}, nothing kept):    {floor:>12,.0f} facts/s")
    print(f"pydantic decode_fact (50k sample):       {pydantic_rate(lines):>12,.0f} facts/s")
    with tempfile.TemporaryDirectory(dir=OUT if OUT.exists() else None) as directory:
        runs = [timed_rebuild(facts, directory) for _ in range(reps)]
        seconds, count, steps = min(runs, key=lambda r: r[0])
        rate = count / seconds
        print(f"rebuild (best of {reps}):                  {rate:>12,.0f} facts/s "
              f"({seconds:.2f} s; runs: {', '.join(f'{r[0]:.2f}' for r in runs)} s)")
        for step, spent in steps.items():
            print(f"    {step:<22} {spent:6.2f} s")
        size = os.path.getsize(os.path.join(directory, "bench.duckdb")) / 1e6
        print(f"    file size {size:,.0f} MB")
        for label, spent in reads(directory):
            print(f"read: {label:<30} {spent * 1000:8.0f} ms")
        per_batches = {}
        small_batch, large_batch = (100, 500) if args.smoke else (1000, 5000)
        for batch in (small_batch, large_batch):
            per_batch = per_batches[batch] = incremental(lines, directory, batch)
            print(f"incremental apply, {batch:>5} facts/batch: {per_batch:8.0f} ms/batch "
                  f"({batch / per_batch * 1000:,.0f} facts/s)")
        # A batch's cost grows with the file: its lookups (was the job submitted, is the
        # attempt running) are hash joins that read the key columns of the whole job and
        # allocation tables (an ART index does not speed up a join of 1000 keys in DuckDB).
        small = len(lines) // 10
        per_batch_small = incremental(lines, directory, small_batch, head=small)
        rest = len(lines) - 8 * small_batch
        print(f"incremental apply, {small_batch} facts/batch on {small:,} facts: "
              f"{per_batch_small:.0f} ms/batch; on {rest:,}: {per_batches[small_batch]:.0f} "
              f"ms/batch ({per_batches[small_batch] / per_batch_small:.1f}x for "
              f"{rest / small:.0f}x the facts)")  # fmt: skip
    if args.stream:
        read_rate, stream_rate, runs = stream_rebuilds(lines, reps)
        print(f"stream read floor (read_log_chunks, nothing kept): {read_rate:>10,.0f} facts/s")
        print(f"rebuild from the stream (best of {reps}):  {stream_rate:>12,.0f} facts/s "
              f"(runs: {', '.join(f'{r:.2f}' for r in runs)} s; {stream_rate / read_rate:.0%} "
              f"of the read floor, {stream_rate / rate:.0%} of the file rebuild)")
    verdict = "PASS" if rate >= TARGET else "MISS"
    print(f"target: rebuild >= {TARGET:,} facts/s: {verdict} ({rate / TARGET:.0%} of target; "
          f"{rate / floor:.0%} of the {name} decode floor)")


if __name__ == "__main__":
    main()
