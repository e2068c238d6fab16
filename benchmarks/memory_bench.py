"""Memory of the decision core's state per job: queued jobs and ended jobs (issue 29, point 3).

    .venv/bin/python benchmarks/memory_bench.py           # N = 1k, 10k, 100k; a few minutes
    .venv/bin/python benchmarks/memory_bench.py --full    # also N = 1M (where memory allows)
    .venv/bin/python benchmarks/memory_bench.py --smoke   # N = 200; seconds

Pure and in process, no NATS: commands are built as JSON lines (the set-up from
tests/integration/helpers.py `setup_commands`) and decided by `services.replay.replay_lines`,
the loop behind `quotasched replay`.  Four series, each in its own child process (so one
series' heap cannot inflate the next one's RSS):

- queued, small / max tags: N SubmitServiceJob into a share of limit 1; one job runs, the
  other N-1 wait (RUNNABLE), none ends;
- ended, small / max tags: N times SubmitServiceJob then ReportJobStatus SUCCEEDED of that
  job, so at most one job is live and N have ended; the queue's retention is the default
  (7 days), longer than the series' logical time (0.05 s a job), so none is forgotten: the
  baseline;
- expiring, small / max tags: the same with the queue's `endedJobRetentionSeconds` set to a
  quarter of the smallest series' logical time, so retention forgets ended jobs (JobExpired)
  as the series goes on and the state holds only the recent ones.

Small tags: 2 short tags.  Max tags: AWS's limit, 50 tags of 128-character keys and
256-character values, the values distinct per job.  Commands are generated lazily, so what
is held between checkpoints is the state (and the interpreter).  At each checkpoint N,
after `gc.collect()`, the child records:

- traced: `tracemalloc`'s current traced bytes, minus the same after the set-up; in a child
  of its own, as tracing slows the fold and adds its own bookkeeping to RSS;
- RSS: `/proc/self/statm` resident pages, minus the same after the set-up, in a child without
  tracemalloc.

Bytes per job = growth / N.  The "largest / smallest" ratio compares the *total* bytes at
the largest N with the smallest N: flat total is ~1, linear growth is ~N_max/N_min.
A series whose estimated RSS would exceed half of MemAvailable is skipped and its estimate
printed (the max-tag jobs cost ~tens of KiB each).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

G5 = "ml.g5.xlarge"
QUEUE = "mq"
SHARE = "team"
SIZES_DEFAULT = (1_000, 10_000, 100_000)
SIZES_FULL = (1_000, 10_000, 100_000, 1_000_000)
SIZES_SMOKE = (50, 200)
MAX_TAGS, MAX_KEY_CHARS, MAX_VALUE_CHARS = 50, 128, 256
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
RETENTION_SIZES: list[int] = []  # the sizes the expiring series' retention is computed from


# -- the commands ----------------------------------------------------------------------------


def _tags(job: int, size: str) -> dict[str, str]:
    if size == "small":
        return {"team": "vision", "run": f"r{job}"}
    return {f"k{index:02d}".ljust(MAX_KEY_CHARS, "k"): f"{job}-{index}".ljust(MAX_VALUE_CHARS, "v")
            for index in range(MAX_TAGS)}  # fmt: skip


def _submit(job: int, size: str) -> str:
    return json.dumps({
        "kind": "SubmitServiceJob", "at": job * 0.05, "jobId": f"job-{job:07d}",
        "jobName": f"job-{job}", "jobQueue": QUEUE, "quotaShareName": SHARE,
        "schedulingPriority": 0, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
        "tags": _tags(job, size),
    })  # fmt: skip


def _succeeded(job: int) -> str:
    return json.dumps({"kind": "ReportJobStatus", "at": job * 0.05 + 0.01,
                       "jobId": f"job-{job:07d}", "status": "SUCCEEDED", "attempt": 1})  # fmt: skip


def retention_s(sizes: list[int]) -> float:
    """The expiring series' retention: a quarter of its smallest checkpoint's logical time."""
    return max(1, int(min(sizes) * 0.05 / 4))


def setup_lines(mode: str, sizes: list[int]) -> list[str]:
    """One environment of 1 ml.g5.xlarge, a FIFO queue, one RESERVE share of limit 1."""
    from tests.integration.helpers import setup_commands

    items = setup_commands(QUEUE, [(SHARE, 1, "RESERVE", "DISABLED")], capacity=1)
    lines = [json.dumps(command) for command, _route in items]
    # 1M queued jobs: above the default admission limit of 100k queued jobs per share
    lines.append(json.dumps({"kind": "SetQuotaShareOptions", "jobQueue": QUEUE, "quotaShareName": SHARE,
                             "options": {"maxQueuedJobs": 1_000_000}}))  # fmt: skip
    if mode == "expiring":
        lines.append(json.dumps({"kind": "SetJobQueueOptions", "jobQueue": QUEUE,
                                 "options": {"endedJobRetentionSeconds": retention_s(sizes)}}))  # fmt: skip
    return lines


def job_lines(mode: str, size: str, count: int) -> Iterator[tuple[int, str]]:
    """(jobs submitted so far, line) for `count` jobs."""
    for job in range(count):
        yield job + 1, _submit(job, size)
        if mode != "queued":
            yield job + 1, _succeeded(job)


# -- child process: one series ---------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE_BYTES


def _sample(traced: bool) -> int:
    gc.collect()
    if traced:
        import tracemalloc

        return tracemalloc.get_traced_memory()[0]
    return _rss_bytes()


def run_series(mode: str, size: str, sizes: list[int], traced: bool) -> None:
    """Print one JSON line per checkpoint: {"n", "bytes"} (growth since the set-up)."""
    from quotasched.services.replay import replay_lines
    from quotasched.services.scheduler.core import State

    if traced:
        import tracemalloc

        tracemalloc.start()
    state = State()
    for _fact in replay_lines(setup_lines(mode, RETENTION_SIZES or sizes), state):
        pass
    checkpoints = sorted(sizes)
    base = _sample(traced)
    started = time.perf_counter()

    def feed() -> Iterator[str]:
        for submitted, line in job_lines(mode, size, checkpoints[-1]):
            yield line
            # Measure once the last line of job `submitted` has been decided: here, before
            # the next line is produced.
            last = mode == "queued" or line.startswith('{"kind": "ReportJobStatus"')
            if last and checkpoints and submitted == checkpoints[0]:
                checkpoints.pop(0)
                print(json.dumps({"n": submitted, "bytes": _sample(traced) - base,
                                  "jobs": len(state.jobs),
                                  "seconds": round(time.perf_counter() - started, 1)}),
                      flush=True)  # fmt: skip

    rejected = 0
    for fact in replay_lines(feed(), state):
        rejected += type(fact).__name__ == "CommandRejected"
    if rejected:
        raise SystemExit(f"{rejected} commands rejected: the benchmark's commands are wrong")


def child(mode: str, size: str, sizes: list[int], traced: bool) -> list[dict]:
    command = [sys.executable, __file__, "--child", mode, size, ",".join(map(str, sizes)),
               "--retention-sizes", ",".join(map(str, RETENTION_SIZES or sizes))]
    done = subprocess.run(command + (["--traced"] if traced else []), capture_output=True,
                          text=True, cwd=ROOT)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"child {mode} {size} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


# -- parent: the table -----------------------------------------------------------------------


def _available_bytes() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="N = 50, 200: seconds")
    parser.add_argument("--full", action="store_true", help="add N = 1M (where memory allows)")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "TAGS", "SIZES"), help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--retention-sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, size, sizes = args.child
        RETENTION_SIZES[:] = [int(n) for n in args.retention_sizes.split(",")]
        run_series(mode, size, [int(n) for n in sizes.split(",")], args.traced)
        return

    sizes = list(SIZES_SMOKE if args.smoke else SIZES_FULL if args.full else SIZES_DEFAULT)
    RETENTION_SIZES[:] = sizes
    budget = _available_bytes() // 2
    print(f"memory_bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"MemAvailable {_mib(_available_bytes())} MiB, sizes {sizes}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    from quotasched.services.scheduler.core import decision

    print(f"decision core: {'compiled' if decision.__file__.endswith(('.so', '.pyd')) else 'interpreted'}")
    results: dict[tuple[str, str], dict[int, dict]] = {}
    print(f"expiring series: endedJobRetentionSeconds {retention_s(sizes)} "
          f"(about {retention_s(sizes) / 0.05:,.0f} jobs' time)")
    for size in ("small", "max"):
        for mode in ("queued", "ended", "expiring"):
            # Probe the smallest size first (RSS, no tracing) to skip sizes that cannot fit.
            probe = child(mode, size, [sizes[0]], traced=False)[0]
            per_job = max(probe["bytes"], 1) / sizes[0]
            if mode == "expiring":  # bounded by retention: the probe's total, not per job
                per_job = max(probe["bytes"], 1) / max(sizes)
            fits = [n for n in sizes if n * per_job <= budget]
            for n in sizes:
                if n not in fits:
                    print(f"  skipped {mode} {size} tags N={n:,}: estimated "
                          f"{_mib(n * per_job)} MiB RSS growth > half of MemAvailable")  # fmt: skip
            rss = {row["n"]: row for row in child(mode, size, fits, traced=False)}
            traced = {row["n"]: row for row in child(mode, size, fits, traced=True)}
            results[(mode, size)] = {n: {"rss": rss[n]["bytes"], "traced": traced[n]["bytes"],
                                         "jobs": rss[n]["jobs"], "seconds": rss[n]["seconds"]}
                                     for n in fits}  # fmt: skip
            print(f"  measured {mode} {size} tags: N = {fits} "
                  f"({rss[fits[-1]]['seconds']} s untraced, {traced[fits[-1]]['seconds']} s traced)",
                  flush=True)  # fmt: skip

    print()
    print("| tags | N | traced B/queued job | RSS B/queued job | traced B/ended job "
          "| RSS B/ended job | RSS growth queued / ended MiB | jobs kept (ended) |")
    print("|---|---|---|---|---|---|---|---|")
    for size in ("small", "max"):
        queued, ended = results[("queued", size)], results[("ended", size)]
        for n in sizes:
            q, e = queued.get(n), ended.get(n)

            def cell(row, key):
                return f"{row[key] / n:,.0f}" if row else "skipped"

            print(f"| {size} | {n:,} | {cell(q, 'traced')} | {cell(q, 'rss')} | {cell(e, 'traced')} "
                  f"| {cell(e, 'rss')} | {_mib(q['rss']) if q else '-'} / {_mib(e['rss']) if e else '-'} "
                  f"| {e['jobs'] if e else '-'} |")  # fmt: skip
    print()
    print("| tags | N | traced B/job, retention | RSS B/job, retention | RSS growth MiB | jobs kept |")
    print("|---|---|---|---|---|---|")
    for size in ("small", "max"):
        expiring = results[("expiring", size)]
        for n in sizes:
            x = expiring.get(n)
            if x is None:
                print(f"| {size} | {n:,} | skipped | skipped | - | - |")
                continue
            print(f"| {size} | {n:,} | {x['traced'] / n:,.0f} | {x['rss'] / n:,.0f} "
                  f"| {_mib(x['rss'])} | {x['jobs']:,} |")  # fmt: skip
    print()
    for size in ("small", "max"):
        expiring = results[("expiring", size)]
        small, large = min(expiring), max(expiring)
        ratio = expiring[large]["traced"] / max(expiring[small]["traced"], 1)
        baseline = results[("ended", size)]
        base = baseline.get(large) or baseline[max(baseline)]
        print(f"expiring {size} tags: total bytes N={large:,} / N={small:,} = {ratio:.1f} "
              f"(flat is ~1; linear {large / small:.0f}); {expiring[large]['jobs']:,} jobs kept at "
              f"N={large:,}; the baseline without retention kept {base['jobs']:,} and "
              f"{_mib(base['traced'])} MiB traced at N={max(baseline):,}")  # fmt: skip
    print()
    for size in ("small", "max"):
        ended = results[("ended", size)]
        small, large = min(ended), max(ended)
        ratio = ended[large]["traced"] / max(ended[small]["traced"], 1)
        slope = (ended[large]["traced"] - ended[small]["traced"]) / max(large - small, 1)
        print(f"ended {size} tags: total ended-job bytes N={large:,} / N={small:,} = {ratio:.1f} "
              f"(flat would be ~1; linear is {large / small:.0f}); slope {slope:,.0f} B per ended "
              f"job (traced); jobs kept in state at N={large:,}: {ended[large]['jobs']:,}")  # fmt: skip
        for n in sorted({*sizes, *SIZES_FULL}):
            if n not in ended and n == SIZES_FULL[-1]:
                print(f"  estimate {size} tags N={n:,} (not run): {_mib(n * slope)} MiB traced "
                      f"for the ended jobs alone, from the slope")  # fmt: skip
        if ended[large]["jobs"] >= large:
            print(f"  without retention (this series' queue keeps ended jobs 7 days) State.jobs "
                  f"holds all {large:,} jobs: memory grows linearly with jobs ever submitted")  # fmt: skip


if __name__ == "__main__":
    main()
