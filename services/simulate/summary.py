"""Figures of one simulation: utilization, waits per team, preemptions, lost and borrowed work.

Definitions:

- **utilization**: instance-seconds held by dispatched attempts inside the window / the pool's
  capacity instance-seconds inside it; the window is common to every run compared on the
  trace (`window.py`: by default the trace's submit span); **useful utilization** counts
  only the work that was kept (the attempt time of finished jobs that no preemption threw
  away, x their GPUs, inside the window), so the gap between the two is work lost to
  preemption (and GPUs of an instance a smaller job left unused);
- **waits** (`waits.py`): time to first start and total time queued, p50 and p95, with the
  jobs still waiting at the end counted and censored at the horizon, not dropped;
- **GPU-hours lost**: work since the last checkpoint of each preempted attempt plus the restart
  overhead it causes, x its GPUs (`checkpoints.py`), and beside it **without checkpoints**: the
  same run's preempted attempts counted whole, x their GPUs (the two are equal when no job
  checkpoints);
- **GPU-hours borrowed**: instance-time a share held beyond its own limit, x GPUs per
  instance; **GPU-hours lent**: instance-time of lending shares' idle capacity that covered
  borrowers, measured apart (`_Meter`); ruling 1 makes them equal, a borrower on capacity no
  lender had idle would make "lent" fall short (the projection's `utilization()` splits it
  per lender); both over the whole run;
- **makespan**: last end - first submission: how soon the trace finishes, not how busy the
  pool was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quotasched.services.simulate.checkpoints import describe
from quotasched.services.simulate.engine import Run
from quotasched.services.simulate.waits import JobWaits, Waits, percentile
from quotasched.services.simulate.window import Window, step_area, submit_span

HOUR = 3600.0


@dataclass
class ShareFigures:
    name: str
    teams: list[str]
    strategy: str
    limit: int
    jobs: int
    finished: int
    waits: Waits
    preempted_jobs: int
    lost_gpu_h: float
    lost_whole_gpu_h: float  # the same preempted attempts counted whole: no checkpoints
    used_gpu_h: float
    borrowed_gpu_h: float


@dataclass
class Summary:
    name: str
    pool_instances: int
    pool_gpus: int
    jobs: int
    finished: int
    failed: int
    still_waiting: int
    first_submit: float
    last_end: float
    horizon: float
    window: Window
    utilization: float  # over `window`; nan when the window is empty
    useful_utilization: float
    waits: Waits
    preemptions: int
    preempted_jobs: int
    lost_gpu_h: float
    lost_whole_gpu_h: float  # the same preempted attempts counted whole: no checkpoints
    borrowed_gpu_h: float
    lent_gpu_h: float
    makespan_h: float
    trace_gpu_h: float
    run_gpu_h: float
    commands: int
    facts: int
    seconds: float
    checkpoints: str = "none"  # who checkpoints how often, and the restart overhead
    blocked: dict[str, str] = field(default_factory=dict)
    shares: list[ShareFigures] = field(default_factory=list)
    teams: dict[str, Waits] = field(default_factory=dict)  # by team, in name order

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def utilization(run: Run, window: Window) -> tuple[float, float]:
    """(utilization, useful utilization) of the pool over `window`; nan when it is empty."""
    start, end = window.start, window.end
    capacity = step_area(run.capacity_times, run.capacity_levels, start, end)
    if capacity <= 0:
        return float("nan"), float("nan")
    held = step_area(run.usage_times, run.usage_levels, start, end)
    gpus, end_of, failed = run.trace.gpus, run.end, run.failed
    kept_gpu_s = 0.0
    for j, lo, hi in run.kept:  # the work of finished jobs, clipped to the window
        if hi > start and lo < end and end_of[j] >= 0 and not failed[j]:
            kept_gpu_s += gpus[j] * (min(hi, end) - max(lo, start))
    return held / capacity, kept_gpu_s / (capacity * run.config.environment.gpus_per_instance)


def summarize(run: Run, window: Window | None = None) -> Summary:
    """The run's figures; utilization over `window` (default: the trace's submit span)."""
    config, trace = run.config, run.trace
    window = window or submit_span(trace)
    per_instance = config.environment.gpus_per_instance
    pool = config.environment.max_instances
    gpus, n = trace.gpus, len(trace)
    start = trace.submit[0] if n else 0.0
    finish = max([e for e in run.end if e >= 0], default=start)
    ok = [i for i in range(n) if run.end[i] >= 0 and not run.failed[i]]
    waits = JobWaits.of(run)
    members_of: dict[str, list[int]] = {share.name: [] for share in config.shares}
    team_members: dict[str, list[int]] = {team: [] for team in trace.teams()}
    for i, name in enumerate(run.share_of_job):
        members_of[name].append(i)
        team_members[trace.team[i]].append(i)
    shares = []
    for share in config.shares:
        members = members_of[share.name]
        shares.append(ShareFigures(
            name=share.name, teams=list(share.teams), strategy=share.strategy.value,
            limit=run.limits[share.name], jobs=len(members),
            finished=sum(1 for i in members if run.end[i] >= 0 and not run.failed[i]),
            waits=waits.of_jobs(members),
            preempted_jobs=sum(1 for i in members if run.preemptions[i]),
            lost_gpu_h=sum(run.lost[i] * gpus[i] for i in members) / HOUR,
            lost_whole_gpu_h=sum(run.lost_whole[i] * gpus[i] for i in members) / HOUR,
            used_gpu_h=run.used_area[share.name] * per_instance / HOUR,
            borrowed_gpu_h=run.borrowed_area[share.name] * per_instance / HOUR,
        ))  # fmt: skip
    held, useful = utilization(run, window)
    borrowed = sum(run.borrowed_area.values()) * per_instance / HOUR
    return Summary(
        name=config.name, pool_instances=pool, pool_gpus=pool * per_instance, jobs=n,
        finished=len(ok), failed=sum(run.failed), still_waiting=sum(run.waiting_at_end),
        first_submit=start, last_end=finish, horizon=run.horizon, window=window,
        utilization=held, useful_utilization=useful, waits=waits.of_jobs(),
        preemptions=sum(run.preemptions), preempted_jobs=sum(1 for p in run.preemptions if p),
        lost_gpu_h=sum(run.lost[i] * gpus[i] for i in range(n)) / HOUR,
        lost_whole_gpu_h=sum(run.lost_whole[i] * gpus[i] for i in range(n)) / HOUR,
        borrowed_gpu_h=borrowed, lent_gpu_h=run.lent_area * per_instance / HOUR,
        makespan_h=max(finish - start, 0.0) / HOUR,
        trace_gpu_h=trace.gpu_seconds() / HOUR,
        run_gpu_h=sum(run.ran[i] * gpus[i] for i in range(n)) / HOUR,
        commands=run.commands, facts=run.fact_count, seconds=run.seconds,
        checkpoints=describe(config), blocked=dict(run.blocked), shares=shares,
        teams={team: waits.of_jobs(members) for team, members in team_members.items()},
    )  # fmt: skip


@dataclass
class Series:
    """Utilization and wait over time in equal buckets, for the chart."""

    name: str
    edges: list[float]  # bucket starts, seconds; the last bucket ends at `end`
    end: float
    utilization: list[float]  # fraction of the pool held, time-weighted over the bucket
    wait_p95_h: list[float | None]  # p95 time to first start of the jobs submitted in the
    # bucket; a job never started counts until the horizon (so a lower bound)


def series(run: Run, start: float, end: float, buckets: int = 120) -> Series:
    width = (end - start) / buckets if end > start else 1.0
    edges = [start + k * width for k in range(buckets)]
    held = _bucket_areas(run.usage_times, run.usage_levels, start, width, buckets)
    capacity = _bucket_areas(run.capacity_times, run.capacity_levels, start, width, buckets)
    waits: list[list[float]] = [[] for _ in range(buckets)]
    for i, submitted in enumerate(run.trace.submit):
        if start <= submitted < end:
            started = run.first_start[i] if run.first_start[i] >= 0 else run.horizon
            waits[min(int((submitted - start) / width), buckets - 1)].append(started - submitted)
    return Series(
        name=run.config.name, edges=edges, end=end,
        utilization=[h / c if c else 0.0 for h, c in zip(held, capacity)],
        wait_p95_h=[percentile(w, 95) / HOUR if w else None for w in waits],
    )  # fmt: skip


def _bucket_areas(times: list[float], levels: list[int], start: float, width: float,
                  buckets: int) -> list[float]:  # fmt: skip
    """The step function's integral over each of `buckets` equal buckets from `start`: one
    sweep, where `step_area` per bucket would read every step once per bucket."""
    end = start + buckets * width
    areas = [0.0] * buckets
    for k in range(len(times)):
        lo = max(times[k], start)
        hi = min(times[k + 1] if k + 1 < len(times) else end, end)
        level = levels[k]
        while level and lo < hi:
            bucket = min(int((lo - start) / width), buckets - 1)
            cut = min(hi, start + (bucket + 1) * width)
            areas[bucket] += level * (cut - lo)
            lo = cut if cut > lo else hi
    return areas
