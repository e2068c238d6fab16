"""Options beyond AWS on the ITP trace (issue 22 section 3): does a minimum runtime before
preemption, a preemption budget or partial lending cut the work lost to preemption without
costing wait?

    .venv/bin/python benchmarks/options_bench.py                  # the table of docs/simulate.md
    .venv/bin/python benchmarks/options_bench.py --pool 1715      # one pool size
    .venv/bin/python benchmarks/options_bench.py --baseline mix   # the mix instead
    .venv/bin/python benchmarks/options_bench.py --jobs 1         # one process
    .venv/bin/python benchmarks/options_bench.py --variant "lend at most half"  # with the baseline

The baseline under AWS's semantics: every share LEND_AND_BORROW with unlimited borrowing (the
most preemption of the examples at 60 % of peak); `--baseline mix` takes the mix (3 big teams
borrow 100 % with in-share preemption) instead or as well.  Each variant sets the same options on every share (options act on the share
whose jobs would be victims, so on RESERVE and LEND shares they change nothing); the example
configs examples/simulate/itp-all-borrow-*.yaml are the all-borrow variants at 1,715 GPUs.
"lend at most half" is per share: each share's lendingLimits maxCapacity is half its quota,
rounded down, where the quota is the limit the run uses (weights split the pool, then
raise_to_largest_job), so the bench computes it from `plan` at each pool size
(itp-all-borrow-lend-half.yaml holds the values at 1,715 GPUs only).  Unlike the other
options it acts on the lender, so under `--baseline mix` it also caps the LEND shares.
Per run: utilization over the trace's submit span (the window common to every run), time to
first start p50 / p95, total time queued p95, preemptions, jobs preempted, the most
preemptions of one job, GPU-hours lost, and lost GPU-hours and first-start p95 against the
baseline at the same pool.  Then per team: first-start p95 for every run at the tightest pool.
Runs go to --jobs processes (default: every core); a run takes 5-20 s of CPU with the
compiled core (`make native`), 2-3x that interpreted, the 40 % pool the slowest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from quotasched.events.values import QuotaShareOptions  # noqa: E402
from quotasched.services.simulate import load_config, read_trace, simulate, submit_span, summarize  # noqa: E402
from quotasched.services.simulate.cluster import plan  # noqa: E402

PEAK_GPUS = 2859  # the ITP trace's peak offered demand
POOLS = (1144, 1715, 2287, 2859)  # 40 % (the mean demand: a stress point), 60, 80, 100 % of peak
BASELINES = {"all borrow": "itp-all-borrow.yaml", "mix": "itp-lend-and-borrow.yaml"}
HOUR, DAY = 3600, 86400
LEND_HALF = "lend half"  # per share: computed from the planned limits, see lend_half
VARIANTS: dict[str, dict | str | None] = {
    "AWS (baseline)": None,
    "min runtime 10 min": {"minRuntimeBeforePreemptionSeconds": 600},
    "min runtime 1 h": {"minRuntimeBeforePreemptionSeconds": HOUR},
    "min runtime 4 h": {"minRuntimeBeforePreemptionSeconds": 4 * HOUR},
    "budget 2 / day": {"preemptionBudget": {"maxPreemptions": 2, "windowSeconds": DAY}},
    "budget 1 / day": {"preemptionBudget": {"maxPreemptions": 1, "windowSeconds": DAY}},
    "min 1 h + budget 2 / day": {"minRuntimeBeforePreemptionSeconds": HOUR,
                                 "preemptionBudget": {"maxPreemptions": 2, "windowSeconds": DAY}},
    "lend at most half": LEND_HALF,
}  # fmt: skip


def lend_half(config, trace):
    """`config` with each share lending at most half its quota (the limit the run uses at this
    pool, after raise_to_largest_job), rounded down."""
    limits = plan(trace, config).limits
    unit = config.environment.instance_type
    return config.model_copy(update={"shares": [share.model_copy(update={
        "options": QuotaShareOptions.model_validate(
            {"lendingLimits": [{"capacityUnit": unit, "maxCapacity": limits[share.name] // 2}]})})
        for share in config.shares]})  # fmt: skip


class Result(NamedTuple):
    baseline: str
    variant: str
    pool: int
    utilization: float
    useful: float
    first_p50_h: float
    first_p95_h: float
    queued_p95_h: float
    waiting: int
    preemptions: int
    preempted_jobs: int
    most_of_one_job: int
    lost_gpu_h: float
    team_first_p95_h: dict[str, float]
    cpu_s: float


_trace = None


def run_one(baseline: str, variant: str, pool: int, trace_path: str) -> Result:
    global _trace
    if _trace is None:
        _trace = read_trace(trace_path)
    started = time.process_time()
    config = load_config(os.path.join(ROOT, "examples", "simulate", BASELINES[baseline]))
    options = VARIANTS[variant]
    config = config.with_pool(pool)
    if options == LEND_HALF:
        config = lend_half(config, _trace)
    elif options is not None:
        checked = QuotaShareOptions.model_validate(options)
        config = config.model_copy(update={
            "shares": [share.model_copy(update={"options": checked}) for share in config.shares]})
    run = simulate(_trace, config)
    summary = summarize(run, submit_span(_trace))
    waits = summary.waits
    return Result(
        baseline, variant, pool, summary.utilization, summary.useful_utilization,
        waits.first_start_p50.seconds / HOUR, waits.first_start_p95.seconds / HOUR,
        waits.queued_p95.seconds / HOUR, summary.still_waiting, summary.preemptions,
        summary.preempted_jobs, max(run.preemptions), summary.lost_gpu_h,
        {team: w.first_start_p95.seconds / HOUR for team, w in sorted(summary.teams.items())},
        time.process_time() - started,
    )  # fmt: skip


def hours(value: float) -> str:
    return "0" if value < 0.05 else f"{value:.1f} h" if value < 10 else f"{value:,.0f} h"


def ratio(value: float, base: float) -> str:
    if base == 0:
        return "–" if value == 0 else "new"
    return f"{value / base:.2f}x"


def table(results: list[Result]) -> None:
    base = {(r.baseline, r.pool): r for r in results if VARIANTS[r.variant] is None}
    print("| pool | baseline | options | util | useful | first start p50 / p95 | queued p95 "
          "| preemptions (jobs, most of one) | GPU-h lost | lost vs AWS | first p95 vs AWS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b = base[(r.baseline, r.pool)]
        waiting = f" ({r.waiting} waiting)" if r.waiting else ""
        print(f"| {r.pool:,} ({100 * r.pool / PEAK_GPUS:.0f} %) | {r.baseline} | {r.variant} "
              f"| {100 * r.utilization:.1f} % | {100 * r.useful:.1f} % "
              f"| {hours(r.first_p50_h)} / {hours(r.first_p95_h)}{waiting} | {hours(r.queued_p95_h)} "
              f"| {r.preemptions:,} ({r.preempted_jobs:,}, {r.most_of_one_job}) | {r.lost_gpu_h:,.0f} "
              f"| {ratio(r.lost_gpu_h, b.lost_gpu_h)} | {ratio(r.first_p95_h, b.first_p95_h)} |")  # fmt: skip


def team_table(results: list[Result], pool: int) -> None:
    rows = [r for r in results if r.pool == pool]
    if not rows:
        return
    teams = list(rows[0].team_first_p95_h)
    print(f"\nfirst-start p95 per team at {pool:,} GPUs")
    print("| baseline | options | " + " | ".join(teams) + " |")
    print("|---|---|" + "---|" * len(teams))
    for r in rows:
        print(f"| {r.baseline} | {r.variant} | "
              + " | ".join(hours(r.team_first_p95_h[t]) for t in teams) + " |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=os.path.join(ROOT, "traces", "itp_2021_jobs.csv"))
    parser.add_argument("--pool", type=int, action="append", help="GPUs (repeat; default: 40-100 %% of peak)")
    parser.add_argument("--baseline", action="append", choices=sorted(BASELINES))
    parser.add_argument("--variant", action="append", choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    pools = args.pool or POOLS
    variants = args.variant or list(VARIANTS)
    if "AWS (baseline)" not in variants:
        variants.insert(0, "AWS (baseline)")
    grid = [(b, v, p) for p in pools for b in (args.baseline or ["all borrow"]) for v in variants]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, *cell, args.trace) for cell in grid]
        results = [future.result() for future in futures]
    cpu = sum(r.cpu_s for r in results)
    print(f"{len(results)} runs in {time.perf_counter() - started:.0f} s wall, {cpu:.0f} s CPU "
          f"(slowest {max(r.cpu_s for r in results):.1f} s); utilization over the trace's submit span\n")
    table(results)
    team_table(results, min(pools))


if __name__ == "__main__":
    main()
