"""Figures of one simulation: utilization, waits per team, preemptions, lost and borrowed work.

Definitions (all over the simulated window, from the first submission to the last end):

- **utilization**: instance-seconds held by dispatched attempts / (pool instances x window);
  **useful utilization** counts only the work that was kept (the trace's own GPU-seconds of
  the jobs that finished), so the gap between the two is work lost to preemption (and GPUs
  of an instance a smaller job left unused);
- **wait**: from submission to the first dispatch;
- **GPU-hours lost**: work since the last checkpoint of each preempted attempt, x its GPUs;
- **GPU-hours borrowed**: instance-time a share held beyond its own limit, x GPUs per
  instance; **GPU-hours lent**: instance-time of lending shares' idle capacity that covered
  borrowers, measured apart (`_Meter`); ruling 1 makes them equal, a borrower on capacity no
  lender had idle would make "lent" fall short (the projection's `utilization()` splits it
  per lender);
- **makespan**: last end - first submission.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quotasched.services.simulate.engine import Run

HOUR = 3600.0


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class ShareFigures:
    name: str
    teams: list[str]
    strategy: str
    limit: int
    jobs: int
    finished: int
    wait_p50_h: float
    wait_p95_h: float
    preempted_jobs: int
    lost_gpu_h: float
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
    never_finished: int
    window_start: float
    window_end: float
    utilization: float
    useful_utilization: float
    wait_p50_h: float
    wait_p95_h: float
    preemptions: int
    preempted_jobs: int
    lost_gpu_h: float
    borrowed_gpu_h: float
    lent_gpu_h: float
    makespan_h: float
    trace_gpu_h: float
    run_gpu_h: float
    commands: int
    facts: int
    seconds: float
    blocked: dict[str, str] = field(default_factory=dict)
    shares: list[ShareFigures] = field(default_factory=list)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def summarize(run: Run) -> Summary:
    config, trace = run.config, run.trace
    per_instance = config.environment.gpus_per_instance
    pool = config.environment.max_instances
    submit, gpus, duration = trace.submit, trace.gpus, trace.duration
    n = len(trace)
    start = min(submit) if n else 0.0
    finish = max([e for e in run.end if e >= 0], default=start)
    window = max(finish - start, 0.0)
    waits = [run.first_start[i] - submit[i] for i in range(n) if run.first_start[i] >= 0]
    ok = [i for i in range(n) if run.end[i] >= 0 and not run.failed[i]]
    kept_gpu_s = sum(duration[i] * gpus[i] for i in ok)
    held = sum(run.used_area.values())
    capacity = pool * window
    members_of: dict[str, list[int]] = {share.name: [] for share in config.shares}
    for i, name in enumerate(run.share_of_job):
        members_of[name].append(i)
    shares = []
    for share in config.shares:
        members = members_of[share.name]
        shares.append(ShareFigures(
            name=share.name, teams=list(share.teams), strategy=share.strategy.value,
            limit=run.limits[share.name], jobs=len(members),
            finished=sum(1 for i in members if run.end[i] >= 0 and not run.failed[i]),
            wait_p50_h=percentile([run.first_start[i] - submit[i] for i in members
                                   if run.first_start[i] >= 0], 50) / HOUR,
            wait_p95_h=percentile([run.first_start[i] - submit[i] for i in members
                                   if run.first_start[i] >= 0], 95) / HOUR,
            preempted_jobs=sum(1 for i in members if run.preemptions[i]),
            lost_gpu_h=sum(run.lost[i] * gpus[i] for i in members) / HOUR,
            used_gpu_h=run.used_area[share.name] * per_instance / HOUR,
            borrowed_gpu_h=run.borrowed_area[share.name] * per_instance / HOUR,
        ))  # fmt: skip
    borrowed = sum(run.borrowed_area.values()) * per_instance / HOUR
    return Summary(
        name=config.name, pool_instances=pool, pool_gpus=pool * per_instance, jobs=n,
        finished=len(ok), failed=sum(run.failed), never_finished=sum(1 for e in run.end if e < 0),
        window_start=start, window_end=finish,
        utilization=held / capacity if capacity else 0.0,
        useful_utilization=kept_gpu_s / (capacity * per_instance) if capacity else 0.0,
        wait_p50_h=percentile(waits, 50) / HOUR, wait_p95_h=percentile(waits, 95) / HOUR,
        preemptions=sum(run.preemptions), preempted_jobs=sum(1 for p in run.preemptions if p),
        lost_gpu_h=sum(run.lost[i] * gpus[i] for i in range(n)) / HOUR,
        borrowed_gpu_h=borrowed, lent_gpu_h=run.lent_area * per_instance / HOUR,
        makespan_h=window / HOUR,
        trace_gpu_h=trace.gpu_seconds() / HOUR,
        run_gpu_h=sum(run.ran[i] * gpus[i] for i in range(n)) / HOUR,
        commands=run.commands, facts=run.fact_count, seconds=run.seconds,
        blocked=dict(run.blocked), shares=shares,
    )  # fmt: skip


@dataclass
class Series:
    """Utilization and wait over time in equal buckets, for the chart."""

    name: str
    edges: list[float]  # bucket starts, seconds; the last bucket ends at `end`
    end: float
    utilization: list[float]  # fraction of the pool held, time-weighted over the bucket
    wait_p95_h: list[float | None]  # p95 wait of the jobs submitted in the bucket


def series(run: Run, start: float, end: float, buckets: int = 120) -> Series:
    width = (end - start) / buckets if end > start else 1.0
    edges = [start + k * width for k in range(buckets)]
    held = [0.0] * buckets
    times, levels = run.usage_times, run.usage_levels
    for k in range(len(times)):
        lo = max(times[k], start)
        hi = min(times[k + 1] if k + 1 < len(times) else end, end)
        level = levels[k]
        while level and lo < hi:
            bucket = min(int((lo - start) / width), buckets - 1)
            cut = min(hi, start + (bucket + 1) * width)
            held[bucket] += level * (cut - lo)
            lo = cut if cut > lo else hi
    pool = run.config.environment.max_instances
    waits: list[list[float]] = [[] for _ in range(buckets)]
    for i, submitted in enumerate(run.trace.submit):
        if run.first_start[i] >= 0 and start <= submitted < end:
            waits[min(int((submitted - start) / width), buckets - 1)].append(
                run.first_start[i] - submitted)
    return Series(
        name=run.config.name, edges=edges, end=end,
        utilization=[h / (pool * width) for h in held],
        wait_p95_h=[percentile(w, 95) / HOUR if w else None for w in waits],
    )  # fmt: skip
