"""Options beyond AWS on the ITP trace (issue 22 section 3): does a minimum runtime before
preemption, a preemption budget, partial lending, fair-share idle assignment or share groups
cut the work lost to preemption without costing wait?

    .venv/bin/python benchmarks/options_bench.py                  # the table of docs/simulate.md
    .venv/bin/python benchmarks/options_bench.py --pool 1715      # one pool size
    .venv/bin/python benchmarks/options_bench.py --baseline mix   # the mix instead
    .venv/bin/python benchmarks/options_bench.py --jobs 1         # one process
    .venv/bin/python benchmarks/options_bench.py --variant "lend at most half"  # with the baseline
    .venv/bin/python benchmarks/options_bench.py --smoke          # seconds: that it runs (make test)
    .venv/bin/python benchmarks/options_bench.py --checkpoint-interval 1h --checkpoint-overhead 5m
    .venv/bin/python benchmarks/options_bench.py --trace traces/other.csv   # any trace CSV

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
GPU-hours lost are given twice: counting each preempted attempt whole ("no ckpt", the figure
before checkpoints), and with the run's checkpoints (`--checkpoint-interval`, repeatable, and
`--checkpoint-overhead`, in `quotasched simulate`'s syntax: 1h, team=NAME:30m, job_type=NAME:2h,
gpus>=8:4h; services/simulate/checkpoints.py), each against the baseline's same figure; both
are of the same run, so the "no ckpt" figure of a checkpointed run is its schedule's, not that
of a run without checkpoints (run the bench without the options for that).  Without checkpoint
options the two are equal.
`--trace` takes any trace CSV of traces/README.md's schema.  When its teams are the ITP
examples' teams the example configurations are used as they are; otherwise the bench derives
them the same way from the trace: one share per team (the 19 largest and one "others" share
past 20 teams) weighted by the team's mean offered demand over the submit span, the mix's
roles by that demand (3 largest LEND_AND_BORROW with in-share preemption, 3 next LEND, the rest
RESERVE), departments by it too (the largest fifth, the next 30 %, the rest), and pools at 40,
60, 80 and 100 % of the trace's peak offered demand.
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
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from quotasched.events.base import NAME_PATTERN  # noqa: E402
from quotasched.events.values import QuotaShareOptions  # noqa: E402
from quotasched.services.simulate import (  # noqa: E402
    ConfigError, TraceError, load_config, parse_config, read_trace, simulate, submit_span,
    summarize)  # fmt: skip
from quotasched.services.simulate.checkpoints import (  # noqa: E402
    CheckpointError, CheckpointOptions, describe, job_intervals, parse_options)  # fmt: skip
from quotasched.services.simulate.cluster import plan  # noqa: E402
from quotasched.services.simulate.config import MAX_SHARES  # noqa: E402

PEAK_GPUS = 2859  # the ITP trace's peak offered demand (peak_demand computes it for any trace)
FRACTIONS = (0.4, 0.6, 0.8, 1.0)  # of the peak: 40 % (ITP's mean demand: a stress point) ...
POOLS = (1144, 1715, 2287, 2859)  # ... 60, 80, 100 %: ITP's pools
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


def queue_options(variant: Queue, config, trace, departments: dict) -> dict:
    """The variant's `queue_options`, in wire names; group caps come from the quotas the run
    uses at this pool (after raise_to_largest_job), rounded down."""
    options: dict = {}
    if variant.half_life is not None:
        fair: dict = {"halfLifeSeconds": variant.half_life}
        if variant.quota_weights:
            fair["weights"] = [{"quotaShareName": share.name,
                                "weight": min(max(round(share.weight), 1), 1000)}
                               for share in config.shares]  # fmt: skip
        options.update(idleResourceAssignmentStrategy="FAIR_SHARE", fairShare=fair)
    if variant.groups:
        limits = plan(trace, config).limits if variant.cap is not None else {}
        unit = config.environment.instance_type
        groups = [{"name": name, "quotaShareNames": list(members)}
                  for name, members in departments.items()]  # fmt: skip
        if variant.cap is not None:
            for group in groups:
                cap = int(variant.cap * sum(limits[m] for m in group["quotaShareNames"]))
                group["maxCapacity"] = [{"capacityUnit": unit, "maxCapacity": cap}]
        options["shareGroups"] = groups
    return options


def with_queue(config, variant: Queue, trace, departments: dict):
    """`config` with the variant's options, the queue's checked as a config file's are."""
    data = with_options(config, variant.share_options).model_dump(mode="json", by_alias=True,
                                                                   exclude_none=True)  # fmt: skip
    options = queue_options(variant, config, trace, departments)
    return parse_config({**data, "queue_options": options}, f"{config.name} ({variant})")


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


    lost_whole_gpu_h: float = 0.0  # the same preempted attempts counted whole (no checkpoints)


# -- the set-up from the trace: ITP's examples, or the same rules applied to another trace --


class Setup(NamedTuple):
    """What the runs share: the baselines' configurations, the departments (share names) and
    the trace's peak offered demand, which the pools are fractions of."""

    baselines: dict  # baseline name -> SimConfig
    departments: dict[str, tuple[str, ...]]
    peak: int
    derived: bool  # False: ITP's example configurations as they are


def peak_demand(trace) -> int:
    """GPUs busy at the busiest moment if every job started at its submission (a job ending
    at t frees its GPUs before one submitted at t takes them)."""
    events = sorted([(s, g) for s, g in zip(trace.submit, trace.gpus)]
                    + [(s + d, -g) for s, d, g in zip(trace.submit, trace.duration, trace.gpus)])
    level = peak = 0
    for _, gpus in events:
        level += gpus
        peak = max(peak, level)
    return peak


def team_demand(trace) -> dict[str, float]:
    """Each team's mean offered demand in GPUs over the trace's submit span, largest first."""
    span = max(trace.submit[-1] - trace.submit[0], 1.0)
    demand: dict[str, float] = {}
    for team, duration, gpus in zip(trace.team, trace.duration, trace.gpus):
        demand[team] = demand.get(team, 0.0) + duration * gpus / span
    return dict(sorted(demand.items(), key=lambda item: (-item[1], item[0])))


def _share_names(teams: list[str]) -> dict[str, str]:
    """A valid, unique share name per team (the team's own name when it is one)."""
    names: dict[str, str] = {}
    for team in teams:
        name = team if re.match(NAME_PATTERN, team) else re.sub(r"[^A-Za-z0-9_-]", "-", team)[:120]
        while name in names.values():
            name += "_"
        names[team] = name
    return names


def derived_configs(trace, peak: int) -> tuple[dict, dict[str, tuple[str, ...]]]:
    """ITP's two baselines and departments, derived the same way from another trace's teams."""
    demand = team_demand(trace)
    teams = list(demand)
    own = teams if len(teams) <= MAX_SHARES else teams[:MAX_SHARES - 1]
    names = _share_names(own)
    groups = [([team], names[team], demand[team]) for team in own]
    rest = teams[len(own):]
    if rest:
        groups.append((rest, "others", sum(demand[team] for team in rest)))
    groups.sort(key=lambda group: -group[2])
    environment = {"instance_type": "ml.g5.xlarge", "gpus_per_instance": 1,
                   "max_instances": peak}  # fmt: skip

    def share(members, name, weight, **rest) -> dict:
        return {"name": name, "teams": members, "weight": max(round(weight, 1), 0.1), **rest}

    borrow = [share(*group, strategy="LEND_AND_BORROW", borrow_limit=-1) for group in groups]
    roles = [dict(strategy="LEND_AND_BORROW", borrow_limit=100, in_share_preemption=True)] * 3
    roles += [dict(strategy="LEND")] * 3
    mix = [share(*group, **(roles[rank] if rank < len(roles) else dict(strategy="RESERVE")))
           for rank, group in enumerate(groups)]  # fmt: skip
    priority = {"kind": "rule", "rules": [{"duration_at_most_s": 3600, "priority": 5}],
                "default": 1}  # fmt: skip
    configs = {
        "all borrow": parse_config({"name": "all-borrow", "environment": environment,
                                    "shares": borrow}, "all borrow (derived)"),
        "mix": parse_config({"name": "mix", "environment": environment, "shares": mix,
                             "priority": priority}, "mix (derived)"),
    }  # fmt: skip
    ordered = [name for _, name, _ in groups]
    large, medium = max(1, round(len(ordered) * 0.2)), max(1, round(len(ordered) * 0.3))
    cuts = {"large": ordered[:large], "medium": ordered[large:large + medium],
            "small": ordered[large + medium:]}  # fmt: skip
    return configs, {name: tuple(members) for name, members in cuts.items() if members}


def setup(trace) -> Setup:
    """ITP's example configurations when the trace's teams are theirs, else derived ones."""
    examples = {name: load_config(os.path.join(ROOT, "examples", "simulate", file))
                for name, file in BASELINES.items()}  # fmt: skip
    teams = set(trace.team)
    if all({t for share in c.shares for t in share.teams} == teams for c in examples.values()):
        return Setup(examples, DEPARTMENTS, peak_demand(trace), False)
    peak = peak_demand(trace)
    configs, departments = derived_configs(trace, peak)
    return Setup(configs, departments, peak, True)


_trace = None


def run_one(baseline: str, variant: str, pool: int, trace_path: str, head: int | None,
            config, departments: dict, checkpoints: CheckpointOptions) -> Result:  # fmt: skip
    global _trace
    if _trace is None:
        _trace = read_trace(trace_path)
        if head is not None:
            _trace = _trace.head(head)
    started = time.process_time()
    options = VARIANTS[variant]
    config = checkpoints.apply(config.with_pool(pool))
    if options == LEND_HALF:
        config = lend_half(config, _trace)
    elif isinstance(options, Queue):
        config = with_queue(config, options, _trace, departments)
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
        summary.lost_whole_gpu_h,
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


def table(results: list[Result], peak: int) -> None:
    """One row per run; GPU-hours lost counting preempted attempts whole (no ckpt), then with
    the run's checkpoints, each against the baseline's (the two are equal without
    checkpoints); the last two columns are the ones the targets are read from."""
    base = {(r.baseline, r.pool): r for r in results if VARIANTS[r.variant] is None}
    head, rule, name = labels(results)
    print(f"| pool | {head} | util | useful | first start p50 / p95 | queued p95 "
          "| preemptions (jobs, most of one) | GPU-h lost, no ckpt | vs AWS, no ckpt "
          "| GPU-h lost | lost vs AWS | first p95 vs AWS |")
    print(f"|---|{rule}|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b = base[(r.baseline, r.pool)]
        waiting = f" ({r.waiting} waiting)" if r.waiting else ""
        print(f"| {r.pool:,} ({100 * r.pool / peak:.0f} %) | {name(r)} "
              f"| {100 * r.utilization:.1f} % | {100 * r.useful:.1f} % "
              f"| {hours(r.first_p50_h)} / {hours(r.first_p95_h)}{waiting} | {hours(r.queued_p95_h)} "
              f"| {r.preemptions:,} ({r.preempted_jobs:,}, {r.most_of_one_job}) "
              f"| {r.lost_whole_gpu_h:,.0f} | {ratio(r.lost_whole_gpu_h, b.lost_whole_gpu_h)} "
              f"| {r.lost_gpu_h:,.0f} "
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
    parser.add_argument("--trace", default=os.path.join(ROOT, "traces", "itp_2021_jobs.csv"),
                        help="a trace CSV (traces/README.md's schema; default: ITP)")  # fmt: skip
    parser.add_argument("--pool", type=int, action="append", help="GPUs (repeat; default: 40-100 %% of peak)")
    parser.add_argument("--checkpoint-interval", action="append", metavar="SPEC",
                        help="as quotasched simulate's: 1h, team=NAME:30m, job_type=NAME:2h, "
                             "gpus>=8:4h (repeat); 0: none")  # fmt: skip
    parser.add_argument("--checkpoint-overhead", metavar="DURATION",
                        help="work a checkpointing job redoes at every restart, e.g. 5m")
    parser.add_argument("--baseline", action="append", choices=sorted(BASELINES))
    parser.add_argument("--variant", action="append", choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--smoke", action="store_true",
                        help=f"the trace's first {SMOKE_JOBS:,} jobs, pools of "
                             f"{' and '.join(map(str, SMOKE_POOLS))} GPUs unless --pool: seconds, "
                             "that it runs (make test)")  # fmt: skip
    args = parser.parse_args()
    head = SMOKE_JOBS if args.smoke else None
    try:
        checkpoints = parse_options(args.checkpoint_interval, args.checkpoint_overhead)
        trace = read_trace(args.trace)
        found = setup(trace)
        if head is not None:
            trace = trace.head(head)
        for config in found.baselines.values():  # a class naming an absent team: say so now
            job_intervals(checkpoints.apply(config), trace)
    except (CheckpointError, ConfigError, TraceError) as error:
        parser.error(str(error))
    peak = found.peak
    pools = args.pool or (SMOKE_POOLS if args.smoke else
                          tuple(round(fraction * peak) for fraction in FRACTIONS))  # fmt: skip
    variants = args.variant or list(VARIANTS)
    if "AWS (baseline)" not in variants:
        variants.insert(0, "AWS (baseline)")
    grid = [(b, v, p) for p in pools for b in (args.baseline or ["all borrow"]) for v in variants]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, *cell, args.trace, head, found.baselines[cell[0]],
                               found.departments, checkpoints) for cell in grid]  # fmt: skip
        results = [future.result() for future in futures]
    cpu = sum(r.cpu_s for r in results)
    if args.smoke:
        print(f"smoke: the trace's first {SMOKE_JOBS:,} jobs; that it runs, no figures to quote")
    if found.derived:
        print(f"{args.trace}: configurations derived from its {len(set(trace.team))} teams "
              f"(peak offered demand {peak:,} GPUs); departments: "
              + "; ".join(f"{k} {', '.join(v)}" for k, v in found.departments.items()))
    said = describe(checkpoints.apply(found.baselines[grid[0][0]]))
    print(f"checkpoints: {said}")
    print(f"{len(results)} runs in {time.perf_counter() - started:.0f} s wall, {cpu:.0f} s CPU "
          f"(slowest {max(r.cpu_s for r in results):.1f} s); utilization over the trace's submit span\n")
    table(results, peak)
    for size in sorted(pools):
        if size == min(pools) or any(hours(h) != "0" for r in results if r.pool == size
                                     for h in r.team_first_p95_h.values()):  # fmt: skip
            team_table(results, size)
            team_wait_table(results, size)


if __name__ == "__main__":
    main()
