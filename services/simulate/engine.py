"""The discrete-event loop: a trace replayed in virtual time through the real decision core.

Two kinds of events, taken in time order (a completion before a submission at the same
instant, so capacity freed at t is seen by a job submitted at t):

- the trace's submissions, in order: a `SubmitServiceJob`;
- completions of running attempts, from a heap: a `ReportJobStatus` SUCCEEDED carrying the
  attempt, as an executor sends it (the core accepts SUCCEEDED straight from SCHEDULED, so
  STARTING and RUNNING add nothing here but commands).

Each command goes through `step(state, command, seq)` of `services.scheduler.core`, and the
loop only reacts to the facts it returns, as an executor does: `JobDispatched` starts an
attempt (its completion is due after the work still to do); `JobPreempted` stops it at once
(its pending completion becomes stale, and the work since its last checkpoint is lost);
`JobStatusChanged` SUCCEEDED or FAILED ends the job.  Nothing here decides who runs.

Commands on the hot path are copies of a validated template (`model_copy(update=...)`, no
validation: 2 µs against 4.5 µs validated and 9 µs for `model_construct`); every changed field
comes from the checked trace and the validated configuration, and tests/simulate prove such a
command encodes and decides exactly like one decoded from JSON.  Facts are encoded only when
the fact log is asked for (`record=True`).
"""

from __future__ import annotations

import heapq
import json
import time as clock
from collections.abc import Callable
from dataclasses import dataclass, field

from events import commands as C
from events import facts as F
from events.codec import decode_command, encode
from events.values import CapacityUsage, JobStatus, PreemptionOutcome
from services.scheduler.core import State, step
from services.simulate.config import ConfigError, SimConfig
from services.simulate.trace import Trace

ENVIRONMENT, POLICY, QUEUE = "pool", "fifo", "sim"
PROGRESS_EVERY = 8192  # events between two progress callbacks


class SimulationError(RuntimeError):
    """The core refused part of the set-up, or the trace does not fit the configuration."""


@dataclass
class Run:
    """Everything a simulation measured; `summary.py` turns it into figures."""

    config: SimConfig
    trace: Trace
    limits: dict[str, int]
    share_of_job: list[str]
    priority: list[int]
    first_start: list[float]  # -1: never dispatched
    end: list[float]  # -1: never finished
    ran: list[float]  # seconds of all attempts together
    lost: list[float]  # seconds of work thrown away by preemptions
    preemptions: list[int]
    failed: list[bool]
    blocked: dict[str, str]  # share -> last ShareBlocked reason
    usage_times: list[float]  # step function of instances in use: from usage_times[i] on,
    usage_levels: list[int]  # usage_levels[i] instances are held
    used_area: dict[str, float]  # share -> instance-seconds used
    borrowed_area: dict[str, float]  # share -> instance-seconds beyond its own limit
    commands: int = 0
    fact_count: int = 0
    seconds: float = 0.0
    facts: list[F.Fact] | None = field(default=None, repr=False)


def setup_commands(config: SimConfig, limits: dict[str, int]) -> list[C.Command]:
    """The cluster as commands, decoded from JSON like any production input."""
    unit = config.environment.instance_type
    lines = [
        {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": ENVIRONMENT,
         "capacityLimits": [{"capacityUnit": unit, "maxCapacity": config.environment.max_instances}]},
        {"kind": "CreateSchedulingPolicy", "name": POLICY,
         "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
        {"kind": "CreateJobQueue", "jobQueueName": QUEUE, "schedulingPolicy": POLICY,
         "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": ENVIRONMENT}]},
    ]  # fmt: skip
    for share in config.shares:
        sharing: dict = {"strategy": share.strategy.value}
        if share.borrow_limit is not None:
            sharing["borrowLimit"] = share.borrow_limit
        lines.append({
            "kind": "CreateQuotaShare", "jobQueue": QUEUE, "quotaShareName": share.name,
            "capacityLimits": [{"capacityUnit": unit, "maxCapacity": limits[share.name]}],
            "resourceSharingConfiguration": sharing,
            "preemptionConfiguration": {
                "inSharePreemption": "ENABLED" if share.in_share_preemption else "DISABLED"},
        })  # fmt: skip
    return [decode_command(json.dumps({"at": 0.0, **line})) for line in lines]


def templates(config: SimConfig, limits: dict[str, int],
              share_of_job: list[str]) -> tuple[C.SubmitServiceJob, C.ReportJobStatus]:  # fmt: skip
    """Validated commands whose copies carry each job: a submission and a SUCCEEDED report."""
    unit = config.environment.instance_type
    share = share_of_job[0] if share_of_job else config.shares[0].name
    submit = decode_command(json.dumps({
        "kind": "SubmitServiceJob", "at": 0.0, "jobName": "template", "jobId": "template",
        "jobQueue": QUEUE, "quotaShareName": share, "schedulingPriority": 0,
        "capacityUsage": [{"capacityUnit": unit, "quantity": 1}],
    }))  # fmt: skip
    report = decode_command(json.dumps({
        "kind": "ReportJobStatus", "at": 0.0, "jobId": "template", "status": "SUCCEEDED",
        "attempt": 1,
    }))  # fmt: skip
    return submit, report


def plan(trace: Trace, config: SimConfig) -> tuple[list[str], dict[str, int]]:
    """Each job's share, and each share's limit; a team without a share is an error."""
    owner = config.share_of_team()
    default = config.default_share
    unmapped = sorted({team for team in trace.team if team not in owner}) if default is None else []
    if unmapped:
        raise ConfigError(f"{config.name}: trace teams without a share: {', '.join(unmapped)} "
                          "(list them under a share's teams, or set default_share)")  # fmt: skip
    share_of_job = [owner.get(team, default) for team in trace.team]
    largest: dict[str, int] = {}
    for share, gpus in zip(share_of_job, trace.gpus):
        need = config.instances(gpus)
        if need > largest.get(share, 0):
            largest[share] = need
    return share_of_job, config.limits(largest)


def simulate(trace: Trace, config: SimConfig, *, record: bool = False,
             progress: Callable[[float], None] | None = None, validate: bool = False) -> Run:  # fmt: skip
    """Run `trace` under `config` to the end: every job finished, or waiting for good.

    `validate=True` (for tests) sends every command through its JSON encoding and
    `decode_command` instead, the path production input takes: a run must not change.
    """
    started = clock.perf_counter()
    share_of_job, limits = plan(trace, config)
    priority = config.priorities(trace.job_type, trace.gpus, trace.duration)
    checkpoint = config.checkpoint_interval_s
    unit = config.environment.instance_type
    per_instance = config.environment.gpus_per_instance

    state = State()
    seq = 0
    log: list[F.Fact] | None = [] if record else None
    for command in setup_commands(config, limits):
        seq += 1
        facts = step(state, command, seq)
        for fact in facts:
            if type(fact) is F.CommandRejected:
                raise SimulationError(f"{config.name}: the core refused {command.kind}: "
                                      f"{fact.status_reason}")  # fmt: skip
        if log is not None:
            log.extend(facts)
    queue = state.queues[QUEUE]
    shares = queue.shares

    n = len(trace)
    ids, submit, duration, gpus = trace.job_ids, trace.submit, trace.duration, trace.gpus
    index = {job_id: i for i, job_id in enumerate(ids)}
    usage_of: dict[int, list[CapacityUsage]] = {}
    remaining = list(duration)
    attempt_of = [0] * n
    start_of = [0.0] * n
    first_start = [-1.0] * n
    end = [-1.0] * n
    ran = [0.0] * n
    lost = [0.0] * n
    preemptions = [0] * n
    failed = [False] * n
    blocked: dict[str, str] = {}
    used_area = dict.fromkeys(shares, 0.0)
    borrowed_area = dict.fromkeys(shares, 0.0)
    share_level = {name: (0, 0) for name in shares}  # (used, borrowed) since share_since
    share_since = dict.fromkeys(shares, 0.0)
    usage_times: list[float] = [0.0]
    usage_levels: list[int] = [0]
    level = 0

    submit_template, report_template = templates(config, limits, share_of_job)
    copy_submit, copy_report = submit_template.model_copy, report_template.model_copy
    Dispatched, Preempted, StatusChanged = F.JobDispatched, F.JobPreempted, F.JobStatusChanged
    Blocked, Rejected = F.ShareBlocked, F.CommandRejected
    requeued, done_ok, done_failed = PreemptionOutcome.REQUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED
    heap: list[tuple[float, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    next_submit = 0
    events = 0
    fact_count = 0

    while True:
        if heap and (next_submit >= n or heap[0][0] <= submit[next_submit]):
            now, i, attempt = pop(heap)
            if attempt_of[i] != attempt or end[i] >= 0:
                continue  # the attempt was preempted: its completion never comes
            command = copy_report(update={"at": now, "job_id": ids[i], "attempt": attempt})
        elif next_submit < n:
            i = next_submit
            next_submit += 1
            now = submit[i]
            need = -(-gpus[i] // per_instance)
            usage = usage_of.get(need)
            if usage is None:
                usage = usage_of[need] = [CapacityUsage(capacity_unit=unit, quantity=need)]
            command = copy_submit(update={
                "at": now, "job_name": ids[i], "job_id": ids[i],
                "quota_share_name": share_of_job[i], "capacity_usage": usage,
                "scheduling_priority": priority[i],
            })  # fmt: skip
        else:
            break
        if validate:
            command = decode_command(encode(command))
        seq += 1
        facts = step(state, command, seq)
        fact_count += len(facts)
        touched: set[str] | None = None
        for fact in facts:
            kind = type(fact)
            if kind is Dispatched:
                j = index[fact.job_id]
                attempt_of[j] = fact.attempt
                start_of[j] = now
                if first_start[j] < 0:
                    first_start[j] = now
                push(heap, (now + remaining[j], j, fact.attempt))
            elif kind is Preempted:
                j = index[fact.job_id]
                done = now - start_of[j]
                saved = (done // checkpoint) * checkpoint if checkpoint else 0.0
                remaining[j] -= saved
                ran[j] += done
                lost[j] += done - saved
                preemptions[j] += 1
                attempt_of[j] = 0
                if fact.outcome is not requeued:
                    failed[j] = True
                    end[j] = now
            elif kind is StatusChanged:
                status = fact.status
                if status is done_ok or status is done_failed:
                    j = index[fact.job_id]
                    if attempt_of[j]:
                        ran[j] += now - start_of[j]
                        attempt_of[j] = 0
                    end[j] = now
                    failed[j] = status is done_failed
                    if touched is None:
                        touched = set()
                    touched.add(share_of_job[j])
                continue
            elif kind is Blocked:
                blocked[fact.quota_share_name] = fact.status_reason
                continue
            elif kind is Rejected:
                raise SimulationError(f"{config.name}: the core refused {fact.command_kind} "
                                      f"at t={now}: {fact.status_reason}")  # fmt: skip
            else:
                continue
            if touched is None:
                touched = set()
            touched.add(fact.quota_share_name)
        if log is not None:
            log.extend(facts)
        if touched is not None:
            for name in touched:
                used, over = share_level[name]
                span = now - share_since[name]
                used_area[name] += used * span
                borrowed_area[name] += over * span
                share = shares[name]
                held = share.usage.get(unit, 0)
                share_level[name] = (held, max(0, held - limits[name]))
                share_since[name] = now
            held = queue.usage.get(unit, 0)
            if held != level:
                level = held
                usage_times.append(now)
                usage_levels.append(held)
        events += 1
        if progress is not None and events % PROGRESS_EVERY == 0:
            progress(now)

    return Run(
        config=config, trace=trace, limits=limits, share_of_job=share_of_job, priority=priority,
        first_start=first_start, end=end, ran=ran, lost=lost, preemptions=preemptions,
        failed=failed, blocked=blocked, usage_times=usage_times, usage_levels=usage_levels,
        used_area=used_area, borrowed_area=borrowed_area, commands=seq, fact_count=fact_count,
        seconds=clock.perf_counter() - started, facts=log,
    )  # fmt: skip
