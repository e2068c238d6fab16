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

With a `Ledger` (ledger.py) the attempts being run are also kept in a file.  A shutdown reports
the attempts it interrupts FAILED; whatever an executor that stopped without reporting (killed)
left in the file, the next one reports FAILED when it starts (`recover`), after stopping the
attempt's process if it outlived the executor.  A report about an attempt that had already
ended is ignored by the scheduler (JobReportIgnored), so these reports are always safe.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from quotasched.events.subjects import FACTS_PREFIX, command_subject
from quotasched.services import logs
from quotasched.services.executors.ledger import Entry, Ledger

log = logs.get("quotasched.executor")

Publish = Callable[[str, bytes], Awaitable[Any]]

LOST = "Executor restarted: the attempt was lost when the previous executor stopped"
SHUT_DOWN = "Executor shut down while the attempt was running"


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


class Executor:
    """Subclasses implement `execute` (run one attempt, return (status, reason)) and may
    override `interrupt` (stop a running attempt quickly)."""

    name = "executor"
    # False: the attempt counts as STARTING then RUNNING as soon as `execute` is called (a
    # simulation).  True: `execute` reports them itself, when its backend says so (a local
    # process is RUNNING once spawned; a SageMaker training job once it trains).
    reports_progress = False

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
        # Left running by the previous executor: never started again (a dispatch it had not
        # acked is delivered again), reported FAILED by `recover`.
        self.lost: list[Entry] = list(ledger.entries.values()) if ledger is not None else []
        self.started.update((entry.job_id, entry.attempt) for entry in self.lost)

    async def on_fact(self, fact: dict[str, Any]) -> None:
        kind = fact.get("kind")
        self.learn(fact)
        if kind == "JobDispatched":
            await self._dispatched(fact)
        elif kind == "JobPreempted":
            await self._stop(fact["jobId"], fact["attempt"])
        elif kind == "JobStatusChanged" and fact["status"] in ("FAILED", "RUNNABLE"):
            if fact.get("cause") != "REPORTED":
                await self._stop(fact["jobId"], fact["attempt"])

    def learn(self, fact: dict[str, Any]) -> None:
        """Keep how to run each job from its submission until it ends (then forget it).  Also
        fed the log an earlier executor of this name already consumed (app.catch_up), so a
        job submitted before a restart still runs when it is dispatched after it."""
        kind = fact.get("kind")
        if kind == "JobSubmitted":
            self.specs[fact["jobId"]] = {"tags": fact.get("tags") or {},
                                         "payload": fact.get("serviceRequestPayload")}  # fmt: skip
        elif (kind == "JobStatusChanged" and fact.get("status") in ("SUCCEEDED", "FAILED")) or (
                kind == "JobPreempted" and fact.get("outcome") == "FAILED"):  # fmt: skip
            self.specs.pop(fact.get("jobId"), None)  # the job is over

    async def _dispatched(self, fact: dict[str, Any]) -> None:
        key = (fact["jobId"], fact["attempt"])
        if key in self.started:
            return
        self.started.add(key)
        for victim in fact.get("afterPreemptionOf") or []:
            running = self.running.get(victim)
            if running is not None:
                await running.stopped.wait()
        attempt = Attempt(fact["jobId"], fact["attempt"], fact["jobQueue"], fact["quotaShareName"],
                          self.specs.get(fact["jobId"], {"tags": {}, "payload": None}))  # fmt: skip
        self.running[attempt.job_id] = attempt
        self.note(attempt)
        attempt.task = asyncio.create_task(self._run(attempt))

    async def _run(self, attempt: Attempt) -> None:
        ended = False  # the scheduler knows (or decided) how this attempt ended
        try:
            if not self.reports_progress:
                await self.report(attempt, "STARTING")
                await self.report(attempt, "RUNNING")
            status, reason = await self.execute(attempt)
            await self.report(attempt, status, reason)
            ended = True
        except asyncio.CancelledError:
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
        attempt = self.running.get(job_id)
        if attempt is None or attempt.attempt != attempt_number or attempt.task is None:
            return
        attempt.task.cancel()
        # a task cancelled before its first step never runs its `finally` (a termination right
        # after the dispatch): wait for the task itself, then mark the attempt stopped here
        await asyncio.gather(attempt.task, return_exceptions=True)
        attempt.stopped.set()
        if self.running.get(job_id) is attempt:
            del self.running[job_id]
        self._forget(attempt)  # the scheduler ended it

    async def report(self, attempt: Attempt, status: str, reason: str | None = None) -> None:
        command = {"kind": "ReportJobStatus", "jobId": attempt.job_id, "status": status,
                   "attempt": attempt.attempt}  # fmt: skip
        if reason:
            command["statusReason"] = reason[:1024]
        subject = command_subject("ReportJobStatus", attempt.job_queue, attempt.share)
        await self.publish(subject, json.dumps(command).encode())

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
                                     attempt.share, pid, pid_started))  # fmt: skip

    def _forget(self, attempt: Attempt) -> None:
        if self.ledger is not None:
            self.ledger.forget(attempt.job_id, attempt.attempt)

    async def recover(self) -> int:
        """Report FAILED every attempt the previous executor left running (from the ledger),
        after stopping its process (or how it ended, when `end_lost` knows); returns how
        many.  Call once the broker can publish."""
        lost, self.lost = self.lost, []
        for entry in lost:
            status, reason = await self.end_lost(entry) or ("FAILED", LOST)
            attempt = Attempt(entry.job_id, entry.attempt, entry.job_queue, entry.share, {})
            await self.report(attempt, status, reason)
            self._forget(attempt)
            log.warning("lost attempt reported", job_id=entry.job_id, attempt=entry.attempt)
        return len(lost)

    async def close(self) -> None:
        """Stop every running attempt and report each FAILED while the bus is still there; an
        attempt whose report cannot be sent stays in the ledger for the next start."""
        if self.watch is not None:
            await self.watch.stop()  # its consumer is about to go quiet on purpose
        attempts = list(self.running.values())
        for attempt in attempts:
            attempt.shutdown = True
            if attempt.task is not None:
                attempt.task.cancel()
        await asyncio.gather(*(a.task for a in attempts if a.task), return_exceptions=True)
        for attempt in attempts:
            try:
                await self.report(attempt, "FAILED", SHUT_DOWN)
            except Exception as error:  # the bus is gone: the next start reports it
                log.warning("shutdown report not sent", job_id=attempt.job_id, error=str(error))
                continue
            self._forget(attempt)
