"""The executor protocol, shared by every executor.

An executor follows the fact log and runs what the scheduler decided:
- `JobSubmitted`: remember how to run the job (its payload and tags);
- `JobDispatched` (job, attempt, afterPreemptionOf): once every job in afterPreemptionOf has
  stopped here, start the attempt and report STARTING, then RUNNING, then SUCCEEDED or FAILED;
- `JobPreempted`, or a `JobStatusChanged` to FAILED (terminated, timed out, share deleted):
  stop that attempt at once.
Every report is a `ReportJobStatus` command carrying the attempt number, published on the
job's own subject.  An attempt is started at most once: the (job, attempt) pairs ever started
are remembered, so a redelivered dispatch is ignored.

With a `Ledger` (ledger.py) the attempts being run are also kept in a file, and stopping the
executor is not stopping its jobs.  An executor that can follow its attempts across a restart
(`follows_across_restarts`: every built-in one) leaves them running when it
is shut down, says how many in one line, and the next one started on the same ledger
(`recover`) follows each again: a process still running is watched to its end, one that ended
meanwhile is reported as it ended (its exit status file), and only an attempt gone without a
trace is reported FAILED.  `stop_jobs` (`--stop-jobs`) makes a shutdown stop and report them
FAILED instead.  An executor that cannot follow them reports FAILED what a shutdown
interrupts, and its next start stops what a killed one left and reports it FAILED.
A report about an attempt that had already ended is ignored by the scheduler
(JobReportIgnored), so these reports are always safe.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from quotasched.events.codec import encode_bytes
from quotasched.events.commands import ReportJobStatus
from quotasched.events.facts import (
    JobDispatched,
    JobPreempted,
    JobQueueCreated,
    JobQueueUpdated,
    JobStatusChanged,
    JobSubmitted,
)
from quotasched.events.values import JobStatus, PreemptionOutcome, ReportedStatus, StatusCause
from quotasched.events.subjects import FACTS_PREFIX, command_subject
from quotasched.services import logs
from quotasched.services.executors.ledger import Entry, Ledger

log = logs.get("quotasched.executor")

Publish = Callable[[str, bytes], Awaitable[Any]]

LOST = "Executor restarted: the attempt was lost when the previous executor stopped"
SHUT_DOWN = "Executor shut down while the attempt was running"
VANISHED = ("Executor restarted: the attempt's process had ended, leaving no exit status, "
            "while no executor followed it")
# An attempt an older release started (its ledger entry names no exit file): it is followed to
# its end, but that release's process kept no exit status anybody can read now.
UNRECORDED = ("Executor upgraded: the attempt ran to its end under the new executor, but the "
              "release that started it kept no exit status; reported FAILED (the job's "
              "retryStrategy decides)")


ExecutorFact: TypeAlias = (JobSubmitted | JobDispatched | JobPreempted | JobStatusChanged
                           | JobQueueCreated | JobQueueUpdated)  # fmt: skip
"""The facts an executor reads (the contract's models, events/facts.py; app.EXECUTOR_FACTS
names their kinds): `on_fact` and `learn` are given nothing else."""

# A JobStatusChanged to one of these not caused by a report stops the attempt (terminated,
# timed out, share deleted, ...); one to these, whatever caused it, says the attempt ended.
STOPPED = (JobStatus.FAILED, JobStatus.RUNNABLE)
ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.RUNNABLE)


def job_over(fact: ExecutorFact) -> tuple[str, int, bool] | None:
    """(job, its last attempt, whether it FAILED) when `fact` says the job is over: a status
    that ends it (SUCCEEDED, FAILED for good, terminated), or a preemption that fails it;
    None otherwise (a preemption that requeues it is not its end)."""
    if isinstance(fact, JobStatusChanged) and fact.status.terminal:
        return fact.job_id, fact.attempt, fact.status is JobStatus.FAILED
    if isinstance(fact, JobPreempted) and fact.outcome is PreemptionOutcome.FAILED:
        return fact.job_id, fact.attempt, True
    return None


def consumer_name(kind: str, name: str | None = None, job_queue: str | None = None) -> str:
    """An executor's durable consumer, which also names its ledger file (`<it>.json`)."""
    return f"executor-{name or (kind if job_queue is None else f'{kind}-{job_queue}')}"


def payload_object(spec: dict[str, Any]) -> dict[str, Any] | None:
    """A job's `serviceRequestPayload` as an object: the API carries it as a JSON string, a
    NATS-native client may send the object; None if it is neither (or absent)."""
    payload = spec.get("payload")
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            return None
    return payload if isinstance(payload, dict) else None


@dataclass
class Attempt:
    job_id: str
    attempt: int
    job_queue: str
    share: str
    spec: dict[str, Any]
    task: asyncio.Task | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    shutdown: bool = False  # interrupted by the executor's own shutdown, not by the scheduler
    detached: bool = False  # left running by a shutdown, for the next start to follow
    stopping: bool = False  # the scheduler ended it and it is being stopped (`_stop`)
    dispatched_at: float | None = None  # the JobDispatched fact's `at`
    adopted: Entry | None = None  # what a previous executor left of it (`recover`)


class Executor:
    """Subclasses implement `execute` (run one attempt, return (status, reason)) and may
    override `interrupt` (stop a running attempt quickly)."""

    name = "executor"
    # False: the attempt counts as STARTING then RUNNING as soon as `execute` is called (a
    # simulation).  True: `execute` reports them itself, when its backend says so (a local
    # process is RUNNING once spawned; a SageMaker training job once it trains).
    reports_progress = False
    # True: a shutdown leaves the attempts running (unless `stop_jobs`) and the next start
    # follows them (`adopt`).  False: a shutdown stops them and reports them FAILED.
    follows_across_restarts = False

    def __init__(self, publish: Publish, ledger: Ledger | None = None):
        self.publish = publish
        self.ledger = ledger
        self.specs: dict[str, dict[str, Any]] = {}
        self.consumer = consumer_name(self.name)  # its durable consumer (app.build_executor)
        self.fact_filter = f"{FACTS_PREFIX}.>"  # what it reads: the log, or one job queue's
        self.running: dict[str, Attempt] = {}
        self.watch: Any = None  # the watch on its consumer (watch.ConsumerWatch), once started
        self.handled_seq = 0  # the stream sequence of the last fact it handled (app.on_fact)
        self.started: set[tuple[str, int]] = set()
        self.stop_jobs = False  # `--stop-jobs`: a shutdown stops the attempts (set at start)
        # Left running by the previous executor: never started again (a dispatch it had not
        # acked is delivered again), followed or reported FAILED by `recover`.
        self.lost: list[Entry] = list(ledger.entries.values()) if ledger is not None else []
        self.started.update((entry.job_id, entry.attempt) for entry in self.lost)
        # Until `recover` has taken each over: a stop the scheduler sends meanwhile (a
        # preemption while no executor ran) is kept for it, a preemptor waits for it.
        self.pending: set[tuple[str, int]] = {(e.job_id, e.attempt) for e in self.lost}
        self.stop_requested: set[tuple[str, int]] = set()
        # When each of those was dispatched, from the log (app.catch_up), for a ledger entry of
        # an older release that does not say (the simulated executor's end time needs it).
        self.dispatch_times: dict[tuple[str, int], float | None] = {}
        self.recovered = asyncio.Event()
        if not self.pending:
            self.recovered.set()

    async def on_fact(self, fact: ExecutorFact) -> None:
        self.learn(fact)
        if isinstance(fact, JobDispatched):
            await self._dispatched(fact)
        elif isinstance(fact, JobPreempted):
            await self._stop(fact.job_id, fact.attempt)
        elif isinstance(fact, JobStatusChanged) and fact.status in STOPPED:
            if fact.cause is not StatusCause.REPORTED:
                await self._stop(fact.job_id, fact.attempt)

    def learn(self, fact: ExecutorFact) -> None:
        """Keep how to run each job from its submission until it ends (then forget it).  Also
        fed the log an earlier executor of this name already consumed (app.catch_up), so a
        job submitted before a restart still runs when it is dispatched after it."""
        if isinstance(fact, (JobPreempted, JobStatusChanged)) and self.pending:
            self._ended_meanwhile(fact)
        elif isinstance(fact, JobDispatched) and (fact.job_id, fact.attempt) in self.pending:
            self.dispatch_times[(fact.job_id, fact.attempt)] = fact.at
        if isinstance(fact, JobSubmitted):
            self.specs[fact.job_id] = {"tags": fact.tags or {},
                                       "payload": fact.service_request_payload}  # fmt: skip
        elif job_over(fact) is not None:
            self.specs.pop(fact.job_id, None)  # the job is over

    def _ended_meanwhile(self, fact: JobPreempted | JobStatusChanged) -> None:
        """An attempt the previous executor left whose end the log already holds (preempted,
        terminated, or its end reported) is not followed: `recover` stops what is left of it
        and reports nothing.  The previous executor may have died in the middle of that stop,
        with the fact delivered and not acked: it comes again only after the ack wait."""
        ended = isinstance(fact, JobPreempted) or fact.status in ENDED
        key = (fact.job_id, fact.attempt)
        if ended and key in self.pending:
            self.stop_requested.add(key)

    async def _dispatched(self, fact: JobDispatched) -> None:
        key = (fact.job_id, fact.attempt)
        if key in self.started:
            return
        self.started.add(key)
        for victim in fact.after_preemption_of:
            if any(job_id == victim for job_id, _ in self.pending):
                await self.recovered.wait()  # a victim a previous executor left: followed first
            running = self.running.get(victim)
            if running is not None:
                await running.stopped.wait()
        attempt = Attempt(fact.job_id, fact.attempt, fact.job_queue, fact.quota_share_name,
                          self.specs.get(fact.job_id, {"tags": {}, "payload": None}),
                          dispatched_at=fact.at)  # fmt: skip
        self.running[attempt.job_id] = attempt
        self.note(attempt)
        attempt.task = asyncio.create_task(self._run(attempt))

    async def _run(self, attempt: Attempt) -> None:
        ended = False  # the scheduler knows (or decided) how this attempt ended
        try:
            if not self.reports_progress:
                if attempt.adopted is None:
                    await self.report(attempt, "STARTING")
                # an older release's entry (no dispatch time) does not say: it had reported
                if attempt.adopted is None or (not attempt.adopted.running
                                               and attempt.adopted.dispatched_at is not None):
                    await self.report(attempt, "RUNNING")
                    self.noted_running(attempt)
            status, reason = await self.execute(attempt)
            await self.report(attempt, status, reason)
            ended = True
        except asyncio.CancelledError:
            if not attempt.detached:  # left running by a shutdown: the next start follows it
                await self.interrupt(attempt)
            ended = not attempt.shutdown  # a shutdown reports it (close), or the next start
        except Exception as error:  # the job failed in the executor itself
            log.warning("attempt failed", job_id=attempt.job_id, error=str(error))
            await self.report(attempt, "FAILED", f"Executor error: {error}")
            ended = True
        finally:
            attempt.stopped.set()
            if self.running.get(attempt.job_id) is attempt:
                del self.running[attempt.job_id]
            if ended:
                self._forget(attempt)

    async def _stop(self, job_id: str, attempt_number: int) -> None:
        if (job_id, attempt_number) in self.pending:  # not taken over yet: `recover` stops it
            self.stop_requested.add((job_id, attempt_number))
            # The fact is acked only once this returns: an executor killed before `recover`
            # gets it again.  If `recover` had followed it already, it is stopped below.
            await self.recovered.wait()
        attempt = self.running.get(job_id)
        if attempt is None or attempt.attempt != attempt_number or attempt.task is None:
            return
        attempt.stopping = True  # a shutdown meanwhile lets the stop finish
        attempt.task.cancel()
        # a task cancelled before its first step never runs its `finally` (a termination right
        # after the dispatch): wait for the task itself, then mark the attempt stopped here
        await asyncio.gather(attempt.task, return_exceptions=True)
        attempt.stopped.set()
        if self.running.get(job_id) is attempt:
            del self.running[job_id]
        self._forget(attempt)  # the scheduler ended it

    async def report(self, attempt: Attempt, status: str, reason: str | None = None) -> None:
        """ReportJobStatus about the attempt, built as the contract's own command."""
        command = ReportJobStatus(job_id=attempt.job_id, status=ReportedStatus(status),
                                  attempt=attempt.attempt,
                                  status_reason=reason[:1024] if reason else None)  # fmt: skip
        subject = command_subject("ReportJobStatus", attempt.job_queue, attempt.share)
        await self.publish(subject, encode_bytes(command))

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        raise NotImplementedError

    async def interrupt(self, attempt: Attempt) -> None:
        """Called when an attempt is stopped by the scheduler; nothing to report."""

    async def end_lost(self, entry: Entry) -> tuple[str, str | None] | None:
        """Stop what is left of an attempt the previous executor was running (its process).
        Returns None (the attempt is reported lost), or the (status, reason) its backend says
        it ended with, when the backend knows (a training job that completed meanwhile)."""
        return None

    def note(self, attempt: Attempt, pid: int | None = None, pid_started: str | None = None) -> None:
        """Write the running attempt (and its process, once there is one) to the ledger."""
        if self.ledger is not None:
            self.ledger.record(Entry(attempt.job_id, attempt.attempt, attempt.job_queue,
                                     attempt.share, pid, pid_started,
                                     dispatched_at=attempt.dispatched_at))  # fmt: skip

    def noted_running(self, attempt: Attempt) -> None:
        """RUNNING is reported: the ledger says so (a restart does not report it again)."""
        key = (attempt.job_id, attempt.attempt)
        entry = self.ledger.entries.get(key) if self.ledger is not None else None
        if entry is not None and not entry.running:
            self.ledger.record(replace(entry, running=True))

    async def adopt(self, attempt: Attempt) -> bool:
        """Whether this executor can follow `attempt`, which a previous one left in the
        ledger (`attempt.adopted`): then `execute` follows it (or reports how it ended)."""
        return False

    async def follow(self, attempt: Attempt) -> None:
        """The task of an adopted attempt (the GPU agent also gives its GPUs back after)."""
        await self._run(attempt)

    def _forget(self, attempt: Attempt) -> None:
        if self.ledger is not None:
            self.ledger.forget(attempt.job_id, attempt.attempt)

    async def recover(self) -> int:
        """Take over every attempt the previous executor left running (from the ledger):
        follow it again where this executor can (`adopt`), else stop what is left of it and
        report it FAILED (or how it ended, when `end_lost` knows); returns how many.  Call
        once the broker can publish."""
        lost, self.lost = self.lost, []
        followed = 0
        for entry in lost:
            key = (entry.job_id, entry.attempt)
            attempt = Attempt(entry.job_id, entry.attempt, entry.job_queue, entry.share,
                              self.specs.get(entry.job_id, {"tags": {}, "payload": None}),
                              dispatched_at=entry.dispatched_at if entry.dispatched_at is not None
                              else self.dispatch_times.get(key), adopted=entry)  # fmt: skip
            if key not in self.stop_requested and self.follows_across_restarts \
                    and await self.adopt(attempt):  # fmt: skip
                self.running[attempt.job_id] = attempt
                attempt.task = asyncio.create_task(self.follow(attempt))
                await asyncio.sleep(0)  # its first step runs: a stop from now on reaches it
                self.pending.discard(key)
                followed += 1
                continue
            self.pending.discard(key)
            if key in self.stop_requested:  # the scheduler ended it meanwhile (or `adopt`
                await self.end_lost(entry)  # found it reported already): stop, no report
                self._forget(attempt)
                continue
            status, reason = await self.end_lost(entry) or ("FAILED", LOST)
            await self.report(attempt, status, reason)
            self._forget(attempt)
            log.warning("lost attempt reported", job_id=entry.job_id, attempt=entry.attempt)
        self.recovered.set()
        if followed:
            log.info(f"following {followed} attempts a previous executor left running",
                     consumer=self.consumer)  # fmt: skip
        return len(lost)

    async def close(self) -> None:
        """Leave the running attempts running for the next start to follow, and say so in one
        line, where this executor can (`follows_across_restarts`, a ledger, not `stop_jobs`);
        else stop every running attempt and report each FAILED while the bus is still there
        (an attempt whose report cannot be sent stays in the ledger for the next start)."""
        if self.watch is not None:
            await self.watch.stop()  # its consumer is about to go quiet on purpose
        # An attempt the scheduler ended is being stopped (`_stop`): that stop finishes (within
        # its grace period), it is neither left running nor reported.
        stopping = [a.task for a in self.running.values() if a.stopping and a.task is not None]
        attempts = [a for a in self.running.values() if not a.stopping]
        detach = self.follows_across_restarts and self.ledger is not None and not self.stop_jobs
        for attempt in attempts:
            attempt.shutdown = True
            attempt.detached = detach
            if attempt.task is not None:
                attempt.task.cancel()
        await asyncio.gather(*(a.task for a in attempts if a.task), *stopping,
                             return_exceptions=True)  # fmt: skip
        if detach:
            if attempts:
                log.info(f"{len(attempts)} attempts keep running; start again to follow them "
                         "(--stop-jobs stops them instead)", consumer=self.consumer,
                         ledger=self.ledger.path)  # fmt: skip
            return
        for attempt in attempts:
            try:
                await self.report(attempt, "FAILED", SHUT_DOWN)
            except Exception as error:  # the bus is gone: the next start reports it
                log.warning("shutdown report not sent", job_id=attempt.job_id, error=str(error))
                continue
            self._forget(attempt)
