"""The gauges computed from a scheduler's state at scrape time: every share's limit, usage,
borrowed and lent instances, its configuration, its jobs by status, its waiting jobs by the
reason the core gives (`scheduler.core.waiting`), and each queue's capacity.  Pure reads of
the state; the job count can hand the event loop back between slices."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import NamedTuple

from prometheus_client.core import GaugeMetricFamily

from quotasched.events.values import JobStatus
from quotasched.services.scheduler.core.accounting import contribution
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.core.waiting import ENVIRONMENT_DISABLED, behind_code, waiting

SCAN_CHUNK = 5_000  # queued jobs checked between two turns of the writer's event loop
QUEUED_STATUSES = (JobStatus.RUNNABLE, JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING)


def share_figures(state: State) -> list[tuple[str, str, str, int, int, int, float]]:
    """(queue, share, unit, limit, usage, borrowed, lent) for every share and capacity unit it
    lists or uses.

    lent: borrowing is pooled per queue and unit (the log records how much a job borrowed,
    never from whom), so it is attributed to the lending shares in proportion to their idle
    quota, as the projections' `lent_s` and the report do:
        lent[s] = idle_s * min(1, B_q / I_q)   for a LEND or LEND_AND_BORROW share, idle_s
                                               its lendable idle (max(0, L - U), capped by a
                                               lending limit),
                = 0                                  for a RESERVE share,
    with B_q the queue's borrowed total and I_q its lendable idle total for the unit.  The lent
    amounts of a queue add up to min(B_q, I_q), which is B_q whenever borrowing is backed.
    """
    rows = []
    for queue in state.queues.values():
        for share in queue.shares.values():
            for unit in sorted(share.limits.keys() | share.usage.keys()):
                limit = share.limits.get(unit, 0)
                used = share.usage.get(unit, 0)
                idle = contribution(share, unit, used)[1]  # lending limits included
                pool_idle = queue.idle.get(unit, 0)
                pool_borrowed = queue.borrowed.get(unit, 0)
                lent = idle * min(1.0, pool_borrowed / pool_idle) if idle and pool_idle else 0.0
                rows.append((queue.name, share.name, unit, limit, used, max(0, used - limit), lent))
    return rows


class ShareJobs(NamedTuple):
    """A share's jobs per queued or dispatched status, and its RUNNABLE ones per reason code."""

    statuses: Counter
    reasons: Counter


def jobs_by_status(state: State) -> dict[tuple[str, str], ShareJobs]:
    """(queue, share) -> its `ShareJobs`.  Reads the shares' heaps and dispatched jobs, not the
    whole job table: cost follows the live jobs, not the history."""
    result: dict[tuple[str, str], ShareJobs] = {}
    for queue in state.queues.values():
        for share in queue.shares.values():
            counts = Counter(job.status for job in share.dispatched.values())
            runnable = _waiting(state.jobs, share.heap, set())
            counts[JobStatus.RUNNABLE] = len(runnable)
            result[(queue.name, share.name)] = ShareJobs(counts, _reasons(state, share, runnable))
    return result


def _reasons(state: State, share, runnable: set[str]) -> Counter:
    """The share's RUNNABLE jobs per reason code: the head's as `waiting` decides it (without
    its sentences), the others' behind it (`behind_code`)."""
    head = state.peek(share)
    if head is None:
        return Counter()
    told = waiting(state, head, words=False)
    disabled = told.code == ENVIRONMENT_DISABLED
    blocked = told.blocked is not None
    jobs = state.jobs
    counts: Counter = Counter({told.code: 1})
    for job_id in runnable:
        job = jobs.get(job_id)
        if job is not None and job is not head:
            counts[behind_code(head, job, blocked, disabled)] += 1
    return counts


async def jobs_by_status_yielding(state: State, chunk: int = SCAN_CHUNK) -> dict:
    """`jobs_by_status`, handing the event loop back every `chunk` heap entries, so a scrape of
    100k queued jobs (tens of ms) never holds up the writer for more than a few ms.  A share's
    heap is copied first (a C-level copy); jobs decided meanwhile are counted as they are when
    their entry is checked, and entries pushed meanwhile are left for the next scrape."""
    result: dict[tuple[str, str], ShareJobs] = {}
    for queue in list(state.queues.values()):
        for share in list(queue.shares.values()):
            counts = Counter(job.status for job in share.dispatched.values())
            entries = list(share.heap)
            runnable: set[str] = set()
            for start in range(0, len(entries), chunk):
                if start:
                    await asyncio.sleep(0)
                _waiting(state.jobs, entries[start:start + chunk], runnable)
            counts[JobStatus.RUNNABLE] = len(runnable)
            result[(queue.name, share.name)] = ShareJobs(counts, _reasons(state, share, runnable))
    return result


def _waiting(jobs: dict, entries: list, into: set[str]) -> set[str]:
    """Add the ids of the RUNNABLE jobs that `entries` (heap entries) stand for, skipping the
    stale entries as `State.head` does; a job with two live-looking entries counts once."""
    runnable = JobStatus.RUNNABLE  # a local: enum member lookups are slow in a 100k-job loop
    add = into.add
    for priority, seq, job_id in entries:
        job = jobs.get(job_id)
        if (job is not None and job.status is runnable and job.priority == -priority
                and job.seq == seq):  # fmt: skip
            add(job_id)
    return into


def state_families(state: State, job_counts: dict[tuple[str, str], ShareJobs] | None = None,
                   only_queue: str | None = None) -> list:  # fmt: skip
    """The gauges of a scheduler's state (see docs/metrics.md); `job_counts`: its
    `jobs_by_status`, when already counted; `only_queue`: the one queue a partition serves
    (its state knows every queue's configuration, not their shares and jobs)."""
    queues = [q for q in state.queues.values() if only_queue is None or q.name == only_queue]
    labels = ["job_queue", "quota_share", "capacity_unit"]
    limit = GaugeMetricFamily("quotasched_share_limit",
                              "The share's own limit (maxCapacity) in instances.", labels=labels)
    usage = GaugeMetricFamily("quotasched_share_usage",
                              "Instances held by the share's dispatched jobs.", labels=labels)
    borrowed = GaugeMetricFamily("quotasched_share_borrowed",
                                 "Instances the share uses beyond its own limit.", labels=labels)
    lent = GaugeMetricFamily(
        "quotasched_share_lent",
        "Instances of the share's idle quota that other shares borrow (pooled per queue and "
        "unit, attributed pro rata to idle quota).", labels=labels)  # fmt: skip
    for queue, share, unit, *values in share_figures(state):
        for family, value in zip((limit, usage, borrowed, lent), values):
            family.add_metric([queue, share, unit], value)
    info = GaugeMetricFamily("quotasched_share_info", "1 per quota share, with its configuration.",
                             labels=["job_queue", "quota_share", "strategy", "state"])  # fmt: skip
    for queue in queues:
        for share in queue.shares.values():
            info.add_metric([queue.name, share.name, share.strategy.value, share.state.value], 1)
    jobs = GaugeMetricFamily(
        "quotasched_share_jobs",
        "Jobs of the share by status: the queue depth (RUNNABLE) and the dispatched jobs.",
        labels=["job_queue", "quota_share", "status"])  # fmt: skip
    if job_counts is None:
        job_counts = jobs_by_status(state)
    reasons = GaugeMetricFamily(
        "quotasched_jobs_waiting",
        "RUNNABLE jobs of the share by why they wait, as the scheduler's core says it (the "
        "reason explain and the web view tell; codes in docs/metrics.md).",
        labels=["job_queue", "quota_share", "reason"])  # fmt: skip
    for (queue, share), counted in job_counts.items():
        for status in QUEUED_STATUSES:
            jobs.add_metric([queue, share, status.value], counted.statuses.get(status, 0))
        for code, count in sorted(counted.reasons.items()):
            reasons.add_metric([queue, share, code], count)
    capacity = GaugeMetricFamily(
        "quotasched_queue_capacity",
        "maxCapacity of the job queue's service environment, per capacity unit.",
        labels=["job_queue", "capacity_unit"])  # fmt: skip
    for queue in queues:
        environment = state.environments.get(queue.environment)
        if environment is not None:
            for unit, quantity in sorted(environment.capacity.items()):
                capacity.add_metric([queue.name, unit], quantity)
    return [limit, usage, borrowed, lent, info, jobs, reasons, capacity]
