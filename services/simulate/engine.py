"""The discrete-event loop: a trace replayed in virtual time through the real decision core.

Two kinds of events, taken in time order (a completion before a submission at the same
instant, so capacity freed at t is seen by a job submitted at t):

- the trace's submissions, in order: a `SubmitServiceJob`;
- completions of running attempts, from a heap: a `ReportJobStatus` SUCCEEDED carrying the
  attempt, as an executor sends it (the core accepts SUCCEEDED straight from SCHEDULED, so
  STARTING and RUNNING add nothing here but commands);
- the core's own timers (`earliest_due`): a `Tick` at that time when it comes before both,
  as the live service publishes one, so that an option beyond AWS lapsing between two trace
  events (a victim's protection, a budget's window) is acted on when it lapses, not at the
  next event.  Without options nothing is ever due and no Tick is sent.

Each command goes through `step(state, command, seq)` of `services.scheduler.core`, and the
loop only reacts to the facts it returns, as an executor does: `JobDispatched` starts an
attempt (its completion is due after the work still to do); `JobPreempted` stops it at once
(its pending completion becomes stale, and the work since its last checkpoint is lost, plus
the restart overhead its next attempt will pay: checkpoints.py);
`JobStatusChanged` SUCCEEDED or FAILED ends the job.  Nothing here decides who runs.

Commands on the hot path are copies of a validated template (`model_copy(update=...)`, no
validation: 2 µs against 4.5 µs validated and 9 µs for `model_construct`); every changed field
comes from the checked trace and the validated configuration, and tests/simulate prove such a
command encodes and decides exactly like one decoded from JSON.  Facts are encoded only when
the fact log is asked for (`record=True`).
"""

from __future__ import annotations

import heapq
import time as clock
from collections.abc import Callable
from dataclasses import dataclass, field

from quotasched.events import commands as C
from quotasched.events import facts as F
from quotasched.events.codec import decode_command, encode
from quotasched.events.values import CapacityUsage, JobStatus, PreemptionOutcome
from quotasched.services.scheduler.core import State, step
from quotasched.services.scheduler.core.timers import earliest_due
from quotasched.services.simulate.checkpoints import job_intervals
from quotasched.services.simulate.cluster import QUEUE, plan, setup_commands, templates, tick_template
from quotasched.services.simulate.config import SimConfig
from quotasched.services.simulate.trace import Trace

PROGRESS_EVERY = 8192  # events between two progress callbacks


class SimulationError(RuntimeError):
    """The core refused part of the set-up, or the trace does not fit the configuration."""


@dataclass
class Run:
    """Everything a simulation measured; `summary.py` turns it into figures."""

    config: SimConfig
    trace: Trace
    limits: dict[str, int]  # as the run used them, after raise_to_largest_job
    largest_job: dict[str, int]  # share -> its largest job in instances
    share_of_job: list[str]
    priority: list[int]
    horizon: float  # the time of the last event that changed anything: the run ends there
    first_start: list[float]  # -1: never dispatched
    end: list[float]  # -1: never finished
    queued: list[float]  # seconds in the queue, each wait after a requeue too, up to the horizon
    waiting_at_end: list[bool]  # in the queue at the horizon (so `queued` is a lower bound)
    ran: list[float]  # seconds of all attempts together
    lost: list[float]  # seconds of work thrown away by preemptions (checkpoints.py)
    lost_whole: list[float]  # seconds of preempted attempts, counted whole (no checkpoints)
    preemptions: list[int]
    failed: list[bool]
    kept: list[tuple[int, float, float]]  # (job, from, to): attempt time whose work was kept
    blocked: dict[str, str]  # share -> last ShareBlocked reason
    usage_times: list[float]  # step function of instances in use: from usage_times[i] on,
    usage_levels: list[int]  # usage_levels[i] instances are held
    capacity_times: list[float]  # step function of the pool's instances, likewise
    capacity_levels: list[int]
    used_area: dict[str, float]  # share -> instance-seconds used
    borrowed_area: dict[str, float]  # share -> instance-seconds beyond its own limit
    lent_area: float = 0.0  # instance-seconds of lenders' idle capacity that borrowers held
    commands: int = 0
    fact_count: int = 0
    seconds: float = 0.0
    facts: list[F.Fact] | None = field(default=None, repr=False)


def simulate(trace: Trace, config: SimConfig, *, record: bool = False,
             progress: Callable[[float], None] | None = None, validate: bool = False) -> Run:  # fmt: skip
    """Run `trace` under `config` to the end: every job finished, or waiting for good.

    `validate=True` (for tests) sends every command through its JSON encoding and
    `decode_command` instead, the path production input takes: a run must not change.
    """
    started = clock.perf_counter()
    share_of_job, limits, largest_job = plan(trace, config)
    priority = config.priorities(trace.job_type, trace.gpus, trace.duration)
    intervals = job_intervals(config, trace)
    state = State()
    log: list[F.Fact] | None = [] if record else None
    seq = _set_up_cluster(state, config, limits, log)
    replay = _Replay(state, seq, trace, config, share_of_job, limits, priority, intervals, log)
    horizon = replay.run(validate, progress)
    jobs, meter = replay.jobs, replay.meter
    waiting = jobs.close_queues(horizon)
    return Run(
        config=config, trace=trace, limits=limits, largest_job=largest_job,
        share_of_job=share_of_job, priority=priority, horizon=horizon,
        first_start=jobs.first_start, end=jobs.end, queued=jobs.queued, waiting_at_end=waiting,
        ran=jobs.ran, lost=jobs.lost, lost_whole=jobs.lost_whole,
        preemptions=jobs.preemptions, failed=jobs.failed,
        kept=jobs.kept, blocked=replay.blocked,
        usage_times=meter.usage_times, usage_levels=meter.usage_levels,
        # the core holds the pool at its configured size: nothing in a run resizes it
        capacity_times=[0.0], capacity_levels=[config.environment.max_instances],
        used_area=meter.used_area, borrowed_area=meter.borrowed_area,
        lent_area=meter.lent_area, commands=replay.seq,
        fact_count=replay.fact_count, seconds=clock.perf_counter() - started, facts=log,
    )  # fmt: skip


def _set_up_cluster(state: State, config: SimConfig, limits: dict[str, int],
                     log: list[F.Fact] | None) -> int:  # fmt: skip
    """Decide the cluster's set-up commands into `state`; the last sequence number used."""
    seq = 0
    for command in setup_commands(config, limits):
        seq += 1
        facts = step(state, command, seq)
        for fact in facts:
            if type(fact) is F.CommandRejected:
                raise SimulationError(f"{config.name}: the core refused {command.kind}: "
                                      f"{fact.status_reason}")  # fmt: skip
        if log is not None:
            log.extend(facts)
    return seq


class _Jobs:
    """Each job's progress and measurements, indexed like the trace, and the completions due."""

    def __init__(self, submit: list[float], duration: list[float], interval: list[float],
                 overhead: float):  # fmt: skip
        n = len(duration)
        self.remaining = list(duration)  # seconds the next attempt runs: reload + work left
        self.interval = interval  # checkpoint interval of each job (0: none)
        self.overhead = overhead  # what a restart of a checkpointing job redoes
        self.reload = [0.0] * n  # overhead the running (or next) attempt starts with
        self.attempt_of = [0] * n  # the running attempt; 0: none runs
        self.start_of = [0.0] * n  # when the running attempt started
        self.queued_since = list(submit)  # when the job last entered the queue
        self.queued = [0.0] * n  # seconds in the queue before its dispatches so far
        self.first_start = [-1.0] * n
        self.end = [-1.0] * n
        self.ran = [0.0] * n
        self.lost = [0.0] * n
        self.lost_whole = [0.0] * n
        self.preemptions = [0] * n
        self.failed = [False] * n
        self.kept: list[tuple[int, float, float]] = []
        self.due: list[tuple[float, int, int]] = []  # heap of (completion time, job, attempt)

    def close_queues(self, horizon: float) -> list[bool]:
        """Which jobs are in the queue at the horizon; their queued time runs up to it."""
        waiting = [end < 0 and not attempt for end, attempt in zip(self.end, self.attempt_of)]
        for j, still in enumerate(waiting):
            if still:
                self.queued[j] += horizon - self.queued_since[j]
        return waiting


class _Meter:
    """Instances held over time: per share (used and borrowed area), and by the whole queue.

    `lent_area` is measured apart from the borrowed area: at every moment, the idle capacity of
    LEND and LEND_AND_BORROW shares that covered what shares held beyond their limits,
    min(borrowed, lendable idle).  Ruling 1 makes the two areas equal; a borrower running on
    capacity no lender had idle (a RESERVE share's, or nobody's) makes `lent_area` fall short.
    """

    def __init__(self, queue, limits: dict[str, int], unit: str, lenders: set[str]):
        shares = queue.shares
        self.lenders = lenders  # from the configuration, not from the core's reading of it
        self.queue, self.shares, self.limits, self.unit = queue, shares, limits, unit
        self.used_area = dict.fromkeys(shares, 0.0)
        self.borrowed_area = dict.fromkeys(shares, 0.0)
        self.share_level = {name: (0, 0) for name in shares}  # (used, borrowed) since share_since
        self.share_since = dict.fromkeys(shares, 0.0)
        self.lent_area = 0.0
        self.borrowed_now = 0  # instances held beyond limits, all shares together
        self.idle_now = 0  # idle instances of lending shares, all together
        self.totals_since = 0.0
        for share in shares.values():
            self.idle_now += self._idle(share, 0)
        self.usage_times: list[float] = [0.0]
        self.usage_levels: list[int] = [0]
        self.level = 0

    def observe(self, touched: set[str], now: float) -> None:
        """Close the areas of the shares whose usage may have changed at `now`, and step the
        queue's level if it moved."""
        unit, limits, shares = self.unit, self.limits, self.shares
        share_level, share_since = self.share_level, self.share_since
        used_area, borrowed_area = self.used_area, self.borrowed_area
        self.lent_area += min(self.borrowed_now, self.idle_now) * (now - self.totals_since)
        self.totals_since = now
        for name in touched:
            used, over = share_level[name]
            span = now - share_since[name]
            used_area[name] += used * span
            borrowed_area[name] += over * span
            share = shares[name]
            held = share.usage.get(unit, 0)
            self.borrowed_now += max(0, held - limits[name]) - over
            self.idle_now += self._idle(share, held) - self._idle(share, used)
            share_level[name] = (held, max(0, held - limits[name]))
            share_since[name] = now
        held = self.queue.usage.get(unit, 0)
        if held != self.level:  # (the queue's level)
            self.level = held
            self.usage_times.append(now)
            self.usage_levels.append(held)


    def _idle(self, share, held: int) -> int:
        """What `share` could lend while holding `held` instances (0 for RESERVE)."""
        return max(0, self.limits[share.name] - held) if share.name in self.lenders else 0


_Dispatched, _Preempted, _StatusChanged = F.JobDispatched, F.JobPreempted, F.JobStatusChanged
_Blocked, _Rejected = F.ShareBlocked, F.CommandRejected
_REQUEUED = PreemptionOutcome.REQUEUED
_DONE_OK, _DONE_FAILED = JobStatus.SUCCEEDED, JobStatus.FAILED
_NEVER = float("inf")


class _Replay:
    """One run after its set-up: the events fed to the core in time order, and the facts it
    returns acted on as an executor would."""

    def __init__(self, state: State, seq: int, trace: Trace, config: SimConfig,
                 share_of_job: list[str], limits: dict[str, int], priority: list[int],
                 intervals: list[float], log: list[F.Fact] | None):  # fmt: skip
        unit = config.environment.instance_type
        queue = state.queues[QUEUE]
        self.state, self.seq, self.fact_count, self.log = state, seq, 0, log
        self.name = config.name
        self.unit, self.per_instance = unit, config.environment.gpus_per_instance
        self.share_of_job, self.priority = share_of_job, priority
        self.n = len(trace)
        self.ids, self.submit, self.gpus = trace.job_ids, trace.submit, trace.gpus
        self.index = {job_id: i for i, job_id in enumerate(self.ids)}
        self.usage_of: dict[int, list[CapacityUsage]] = {}
        self.jobs = _Jobs(trace.submit, trace.duration, intervals, config.checkpoint_overhead_s)
        self.blocked: dict[str, str] = {}
        lenders = {share.name for share in config.shares if share.strategy.value != "RESERVE"}
        self.meter = _Meter(queue, limits, unit, lenders)
        submit_template, report_template = templates(config, limits, share_of_job)
        self.copy_submit, self.copy_report = submit_template.model_copy, report_template.model_copy
        self.copy_tick = tick_template().model_copy
        self.next_submit = 0

    def run(self, validate: bool, progress: Callable[[float], None] | None) -> float:
        """Every event to the end, each command decided by `step`; the time of the last."""
        state, log, seq, fact_count = self.state, self.log, self.seq, 0
        next_command, react, observe = self._next_command, self._react, self.meter.observe
        events, now, last = 0, 0.0, 0.0
        while (event := next_command()) is not None:
            now, command = event
            if validate:
                command = decode_command(encode(command))
            seq += 1
            facts = step(state, command, seq)
            fact_count += len(facts)
            if facts or command.kind != "Tick":  # a Tick that changed nothing does not end a run
                last = now
            touched = react(facts, now)
            if log is not None:
                log.extend(facts)
            if touched is not None:
                observe(touched, now)
            events += 1
            if progress is not None and events % PROGRESS_EVERY == 0:
                progress(now)
        self.seq, self.fact_count = seq, fact_count
        return last

    def _next_command(self) -> tuple[float, C.Command] | None:
        """The next event as a command: a core timer due before anything else, else a due
        completion (first at equal times), else the next submission; None when none is left."""
        jobs, submit, n = self.jobs, self.submit, self.n
        due, attempt_of, end = jobs.due, jobs.attempt_of, jobs.end
        while due and (attempt_of[due[0][1]] != due[0][2] or end[due[0][1]] >= 0):
            heapq.heappop(due)  # the attempt was preempted: its completion never comes
        timer = earliest_due(self.state, expiries=False)  # retention decides nothing
        if timer is not None and timer > self.state.time:
            following = min(due[0][0] if due else _NEVER,
                            submit[self.next_submit] if self.next_submit < n else _NEVER)  # fmt: skip
            if timer < following:
                return timer, self.copy_tick(update={"at": timer})
        if due and (self.next_submit >= n or due[0][0] <= submit[self.next_submit]):
            now, i, attempt = heapq.heappop(due)
            update = {"at": now, "job_id": self.ids[i], "attempt": attempt}
            return now, self.copy_report(update=update)
        if self.next_submit >= n:
            return None
        i = self.next_submit
        self.next_submit += 1
        now = submit[i]
        need = -(-self.gpus[i] // self.per_instance)
        usage = self.usage_of.get(need)
        if usage is None:
            usage = self.usage_of[need] = [CapacityUsage(capacity_unit=self.unit, quantity=need)]
        ids = self.ids
        return now, self.copy_submit(update={
            "at": now, "job_name": ids[i], "job_id": ids[i],
            "quota_share_name": self.share_of_job[i], "capacity_usage": usage,
            "scheduling_priority": self.priority[i],
        })  # fmt: skip

    def _react(self, facts: list[F.Fact], now: float) -> set[str] | None:
        """Act on a command's facts as an executor does; the shares whose usage they change."""
        jobs, index = self.jobs, self.index
        touched: set[str] | None = None
        for fact in facts:
            kind = type(fact)
            if kind is _Dispatched:
                j = index[fact.job_id]
                jobs.attempt_of[j] = fact.attempt
                jobs.start_of[j] = now
                jobs.queued[j] += now - jobs.queued_since[j]
                if jobs.first_start[j] < 0:
                    jobs.first_start[j] = now
                heapq.heappush(jobs.due, (now + jobs.remaining[j], j, fact.attempt))
            elif kind is _Preempted:
                self._stop(index[fact.job_id], now, fact.outcome)
            elif kind is _StatusChanged:
                status = fact.status
                if status is _DONE_OK or status is _DONE_FAILED:
                    j = index[fact.job_id]
                    if jobs.attempt_of[j]:
                        jobs.ran[j] += now - jobs.start_of[j]
                        jobs.kept.append((j, jobs.start_of[j] + jobs.reload[j], now))
                        jobs.attempt_of[j] = 0
                    jobs.end[j] = now
                    jobs.failed[j] = status is _DONE_FAILED
                    if touched is None:
                        touched = set()
                    touched.add(self.share_of_job[j])
                continue
            elif kind is _Blocked:
                self.blocked[fact.quota_share_name] = fact.status_reason
                continue
            elif kind is _Rejected:
                raise SimulationError(f"{self.name}: the core refused {fact.command_kind} "
                                      f"at t={now}: {fact.status_reason}")  # fmt: skip
            else:
                continue
            if touched is None:
                touched = set()
            touched.add(fact.quota_share_name)
        return touched

    def _stop(self, j: int, now: float, outcome: PreemptionOutcome) -> None:
        """Job `j` preempted at `now`: the work since its last checkpoint is lost, and the
        overhead its next attempt will pay (checkpoints.py); requeued, it waits in the queue
        from `now`."""
        jobs = self.jobs
        start = jobs.start_of[j]
        done = now - start
        interval = jobs.interval[j]
        jobs.queued_since[j] = now
        jobs.ran[j] += done
        jobs.lost_whole[j] += done
        if interval:
            reload = jobs.reload[j]  # charged as lost when the previous attempt was preempted
            saved = max(0.0, (done // interval) * interval - reload)
            nxt = jobs.overhead if outcome is _REQUEUED else 0.0
            if saved:
                jobs.kept.append((j, start + reload, start + reload + saved))
            jobs.remaining[j] -= saved + reload - nxt
            jobs.lost[j] += done - saved - reload + nxt
            jobs.reload[j] = nxt
        else:
            jobs.lost[j] += done
        jobs.preemptions[j] += 1
        jobs.attempt_of[j] = 0
        if outcome is not _REQUEUED:
            jobs.failed[j] = True
            jobs.end[j] = now
