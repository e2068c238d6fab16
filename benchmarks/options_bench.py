"""Options beyond AWS on the ITP trace (issue 22 section 3): does a minimum runtime before
preemption, a preemption budget, partial lending, fair-share idle assignment or share groups
cut the work lost to preemption without costing wait?

    .venv/bin/python benchmarks/options_bench.py                  # the table of docs/simulate.md
    .venv/bin/python benchmarks/options_bench.py --pool 1715      # one pool size
    .venv/bin/python benchmarks/options_bench.py --baseline mix   # the mix instead
    .venv/bin/python benchmarks/options_bench.py --jobs 1         # one process
    .venv/bin/python benchmarks/options_bench.py --variant "lend at most half"  # with the baseline
    .venv/bin/python benchmarks/options_bench.py --smoke          # seconds: that it runs (make test)

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
Fair share and share groups are the job queue's options (the config's `queue_options`), so
they act on every borrower at once.  "fair share" weighs every share 1 unless it says "quota
weights": then each share weighs its configured `weight` (the team's mean demand), rounded.
"groups" puts the ten ITP teams in three departments by mean demand (DEPARTMENTS); "capped"
caps each at 1.5x its members' planned quotas, which the bench computes from `plan` at each
pool like lend half (itp-all-borrow-groups.yaml holds the caps at 1,715 GPUs only).
Per run: utilization over the trace's submit span (the window common to every run), time to
first start p50 / p95, total time queued p95, preemptions, jobs preempted, the most
preemptions of one job, GPU-hours lost, and lost GPU-hours and first-start p95 against the
baseline at the same pool.  Then per team: first-start p95 for every run at each pool where
some team waits (the tightest pool always), with the highest and the median team's, since
fair share and groups move idle capacity between teams rather than cut preemption; and per
team in full: time to first start and total time queued, p50 / p95 of each.
Runs go to --jobs processes (default: every core); a run takes 5-20 s of CPU with the
compiled core (`make native`), 2-3x that interpreted, the 40 % pool the slowest.
`--smoke` runs every variant on the trace's first 1,000 jobs at pools of 150 and 300 GPUs
(small enough that jobs wait and are preempted) and prints the same tables in about 10-25 s:
that the bench runs (`make test`).  Its figures are not the trace's (a pool's "% of peak" is
still the full trace's peak).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from quotasched.events.values import QuotaShareOptions  # noqa: E402
from quotasched.services.simulate import (  # noqa: E402
    load_config, parse_config, read_trace, simulate, submit_span, summarize)  # fmt: skip
from quotasched.services.simulate.cluster import plan  # noqa: E402

PEAK_GPUS = 2859  # the ITP trace's peak offered demand
POOLS = (1144, 1715, 2287, 2859)  # 40 % (the mean demand: a stress point), 60, 80, 100 % of peak
BASELINES = {"all borrow": "itp-all-borrow.yaml", "mix": "itp-lend-and-borrow.yaml"}
HOUR, DAY = 3600, 86400
LEND_HALF = "lend half"  # per share: computed from the planned limits, see lend_half
# The ITP teams in departments by mean offered demand (traces/README.md): the two large teams
# (491 and 255 GPUs), the three middle ones (86-140) and the five small ones (5-47).
DEPARTMENTS = {
    "large": ("cluster04", "cluster07"),
    "medium": ("cluster02", "cluster03", "cluster06"),
    "small": ("cluster01", "cluster05", "cluster08", "cluster09", "cluster10"),
}
BUDGET_1 = {"preemptionBudget": {"maxPreemptions": 1, "windowSeconds": DAY}}
GROUP_CAP = 1.5  # "capped": a department holds at most 1.5x its members' planned quotas
SMOKE_JOBS = 1000  # --smoke: the trace's first jobs ...
SMOKE_POOLS = (150, 300)  # ... on pools where they queue and are preempted


class Queue(NamedTuple):
    """A variant with the job queue's options (fair share, groups) and optionally the same
    share options on every share."""

    half_life: int | None = None  # FAIR_SHARE's half-life; None: FIFO
    quota_weights: bool = False  # fair-share weight = the share's configured weight, rounded
    groups: bool = False  # the DEPARTMENTS as share groups
    cap: float | None = None  # with groups: each capped at cap x its planned quotas
    share_options: dict | None = None


VARIANTS: dict[str, dict | str | Queue | None] = {
    "AWS (baseline)": None,
    "min runtime 10 min": {"minRuntimeBeforePreemptionSeconds": 600},
    "min runtime 1 h": {"minRuntimeBeforePreemptionSeconds": HOUR},
    "min runtime 4 h": {"minRuntimeBeforePreemptionSeconds": 4 * HOUR},
    "budget 2 / day": {"preemptionBudget": {"maxPreemptions": 2, "windowSeconds": DAY}},
    "budget 1 / day": BUDGET_1,
    "min 1 h + budget 2 / day": {"minRuntimeBeforePreemptionSeconds": HOUR,
                                 "preemptionBudget": {"maxPreemptions": 2, "windowSeconds": DAY}},
    "lend at most half": LEND_HALF,
    "fair share 1 d": Queue(half_life=DAY),
    "fair share 1 d, quota weights": Queue(half_life=DAY, quota_weights=True),
    "fair share 1 h": Queue(half_life=HOUR),
    "fair share 1 h, quota weights": Queue(half_life=HOUR, quota_weights=True),
    "groups": Queue(groups=True),
    "groups capped 1.5x": Queue(groups=True, cap=GROUP_CAP),
    "budget 1 / day + fair share 1 d": Queue(half_life=DAY, share_options=BUDGET_1),
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


def with_options(config, share_options: dict | None):
    """`config` with the same share options on every share (None: as it is)."""
    if share_options is None:
        return config
    checked = QuotaShareOptions.model_validate(share_options)
    return config.model_copy(update={
        "shares": [share.model_copy(update={"options": checked}) for share in config.shares]})


def queue_options(variant: Queue, config, trace) -> dict:
    """The variant's `queue_options`, in wire names; group caps come from the quotas the run
    uses at this pool (after raise_to_largest_job), rounded down."""
    options: dict = {}
    if variant.half_life is not None:
        fair: dict = {"halfLifeSeconds": variant.half_life}
        if variant.quota_weights:
            fair["weights"] = [{"quotaShareName": share.name, "weight": round(share.weight)}
                               for share in config.shares]  # fmt: skip
        options.update(idleResourceAssignmentStrategy="FAIR_SHARE", fairShare=fair)
    if variant.groups:
        limits = plan(trace, config).limits if variant.cap is not None else {}
        unit = config.environment.instance_type
        groups = [{"name": name, "quotaShareNames": list(members)}
                  for name, members in DEPARTMENTS.items()]  # fmt: skip
        if variant.cap is not None:
            for group in groups:
                cap = int(variant.cap * sum(limits[m] for m in group["quotaShareNames"]))
                group["maxCapacity"] = [{"capacityUnit": unit, "maxCapacity": cap}]
        options["shareGroups"] = groups
    return options


def with_queue(config, variant: Queue, trace):
    """`config` with the variant's options, the queue's checked as a config file's are."""
    data = with_options(config, variant.share_options).model_dump(mode="json", by_alias=True,
                                                                   exclude_none=True)  # fmt: skip
    return parse_config({**data, "queue_options": queue_options(variant, config, trace)},
                        f"{config.name} ({variant})")  # fmt: skip


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
    team_waits_h: dict[str, tuple[float, float, float, float]]  # first p50, p95, queued p50, p95


_trace = None


def run_one(baseline: str, variant: str, pool: int, trace_path: str,
            head: int | None = None) -> Result:  # fmt: skip
    global _trace
    if _trace is None:
        _trace = read_trace(trace_path)
        if head is not None:
            _trace = _trace.head(head)
    started = time.process_time()
    config = load_config(os.path.join(ROOT, "examples", "simulate", BASELINES[baseline]))
    options = VARIANTS[variant]
    config = config.with_pool(pool)
    if options == LEND_HALF:
        config = lend_half(config, _trace)
    elif isinstance(options, Queue):
        config = with_queue(config, options, _trace)
    else:
        config = with_options(config, options)
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
        {team: (w.first_start_p50.seconds / HOUR, w.first_start_p95.seconds / HOUR,
                w.queued_p50.seconds / HOUR, w.queued_p95.seconds / HOUR)
         for team, w in sorted(summary.teams.items())},
    )  # fmt: skip


def hours(value: float) -> str:
    return "0" if value < 0.05 else f"{value:.1f} h" if value < 10 else f"{value:,.0f} h"


def ratio(value: float, base: float) -> str:
    if base == 0:
        return "–" if value == 0 else "new"
    return f"{value / base:.2f}x"


def labels(results: list[Result]) -> tuple[str, str, Callable[[Result], str]]:
    """The header cells, the separator and each row's cells naming its run: the baseline is
    named only when several were run, so a one-baseline table goes into the docs as printed."""
    if len({r.baseline for r in results}) > 1:
        return "baseline | options", "---|---", lambda r: f"{r.baseline} | {r.variant}"
    return "options", "---", lambda r: r.variant


def table(results: list[Result]) -> None:
    base = {(r.baseline, r.pool): r for r in results if VARIANTS[r.variant] is None}
    head, rule, name = labels(results)
    print(f"| pool | {head} | util | useful | first start p50 / p95 | queued p95 "
          "| preemptions (jobs, most of one) | GPU-h lost | lost vs AWS | first p95 vs AWS |")
    print(f"|---|{rule}|---|---|---|---|---|---|---|---|")
    for r in results:
        b = base[(r.baseline, r.pool)]
        waiting = f" ({r.waiting} waiting)" if r.waiting else ""
        print(f"| {r.pool:,} ({100 * r.pool / PEAK_GPUS:.0f} %) | {name(r)} "
              f"| {100 * r.utilization:.1f} % | {100 * r.useful:.1f} % "
              f"| {hours(r.first_p50_h)} / {hours(r.first_p95_h)}{waiting} | {hours(r.queued_p95_h)} "
              f"| {r.preemptions:,} ({r.preempted_jobs:,}, {r.most_of_one_job}) | {r.lost_gpu_h:,.0f} "
              f"| {ratio(r.lost_gpu_h, b.lost_gpu_h)} | {ratio(r.first_p95_h, b.first_p95_h)} |")  # fmt: skip


def per_team(results: list[Result], pool: int, title: str, columns: list[str], cells) -> None:
    """One row per run at `pool`, one column per team (then `columns`); `cells(run, teams)`
    gives a row's cells."""
    rows = [r for r in results if r.pool == pool]
    if not rows:
        return
    teams = list(rows[0].team_first_p95_h)
    head, rule, name = labels(results)
    print(f"\n{title} at {pool:,} GPUs")
    print(f"| {head} | " + " | ".join(teams + columns) + " |")
    print(f"|{rule}|" + "---|" * (len(teams) + len(columns)))
    for r in rows:
        print(f"| {name(r)} | " + " | ".join(cells(r, teams)) + " |")


def team_table(results: list[Result], pool: int) -> None:
    """First-start p95 per team, with the highest and the median team's: who waits, since
    fair share and groups decide which team gets idle capacity."""

    def cells(r: Result, teams: list[str]) -> list[str]:
        p95 = sorted(r.team_first_p95_h.values())
        median = (p95[(len(p95) - 1) // 2] + p95[len(p95) // 2]) / 2
        return [hours(r.team_first_p95_h[t]) for t in teams] + [f"{hours(p95[-1])} / {hours(median)}"]

    per_team(results, pool, "first-start p95 per team", ["highest / median"], cells)


def team_wait_table(results: list[Result], pool: int) -> None:
    """Per team, time to first start and total time queued, p50 / p95 of each (the issue's
    per-team waits in full; `team_table` is its first-start p95 column with the spread)."""

    def cells(r: Result, teams: list[str]) -> list[str]:
        return ["{} / {}; {} / {}".format(*(hours(h) for h in r.team_waits_h[t])) for t in teams]

    per_team(results, pool, "per team, first start p50 / p95, then total queued p50 / p95,", [], cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=os.path.join(ROOT, "traces", "itp_2021_jobs.csv"))
    parser.add_argument("--pool", type=int, action="append", help="GPUs (repeat; default: 40-100 %% of peak)")
    parser.add_argument("--baseline", action="append", choices=sorted(BASELINES))
    parser.add_argument("--variant", action="append", choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true",
                        help=f"the trace's first {SMOKE_JOBS:,} jobs, pools of "
                             f"{' and '.join(map(str, SMOKE_POOLS))} GPUs unless --pool: seconds, "
                             "that it runs (make test)")  # fmt: skip
    args = parser.parse_args()
    head = SMOKE_JOBS if args.smoke else None
    pools = args.pool or (SMOKE_POOLS if args.smoke else POOLS)
    variants = args.variant or list(VARIANTS)
    if "AWS (baseline)" not in variants:
        variants.insert(0, "AWS (baseline)")
    grid = [(b, v, p) for p in pools for b in (args.baseline or ["all borrow"]) for v in variants]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, *cell, args.trace, head) for cell in grid]
        results = [future.result() for future in futures]
    cpu = sum(r.cpu_s for r in results)
    if args.smoke:
        print(f"smoke: the trace's first {SMOKE_JOBS:,} jobs; that it runs, no figures to quote")
    print(f"{len(results)} runs in {time.perf_counter() - started:.0f} s wall, {cpu:.0f} s CPU "
          f"(slowest {max(r.cpu_s for r in results):.1f} s); utilization over the trace's submit span\n")
    table(results)
    for size in sorted(pools):
        if size == min(pools) or any(hours(h) != "0" for r in results if r.pool == size
                                     for h in r.team_first_p95_h.values()):  # fmt: skip
            team_table(results, size)
            team_wait_table(results, size)


if __name__ == "__main__":
    main()
