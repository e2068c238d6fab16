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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from events.subjects import command_subject
from services import logs

log = logs.get("quotasched.executor")

Publish = Callable[[str, bytes], Awaitable[Any]]


@dataclass
class Attempt:
    job_id: str
    attempt: int
    job_queue: str
    share: str
    spec: dict[str, Any]
    task: asyncio.Task | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


class Executor:
    """Subclasses implement `execute` (run one attempt, return (status, reason)) and may
    override `interrupt` (stop a running attempt quickly)."""

    name = "executor"

    def __init__(self, publish: Publish):
        self.publish = publish
        self.specs: dict[str, dict[str, Any]] = {}
        self.running: dict[str, Attempt] = {}
        self.started: set[tuple[str, int]] = set()

    async def on_fact(self, fact: dict[str, Any]) -> None:
        kind = fact.get("kind")
        if kind == "JobSubmitted":
            self.specs[fact["jobId"]] = {"tags": fact.get("tags") or {},
                                         "payload": fact.get("serviceRequestPayload")}  # fmt: skip
        elif kind == "JobDispatched":
            await self._dispatched(fact)
        elif kind == "JobPreempted":
            await self._stop(fact["jobId"], fact["attempt"])
        elif kind == "JobStatusChanged" and fact["status"] in ("FAILED", "RUNNABLE"):
            if fact.get("cause") != "REPORTED":
                await self._stop(fact["jobId"], fact["attempt"])

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
        attempt.task = asyncio.create_task(self._run(attempt))

    async def _run(self, attempt: Attempt) -> None:
        try:
            await self.report(attempt, "STARTING")
            await self.report(attempt, "RUNNING")
            status, reason = await self.execute(attempt)
            await self.report(attempt, status, reason)
        except asyncio.CancelledError:
            await self.interrupt(attempt)
        except Exception as error:  # the job failed in the executor itself
            log.warning("attempt failed", job_id=attempt.job_id, error=str(error))
            await self.report(attempt, "FAILED", f"Executor error: {error}")
        finally:
            attempt.stopped.set()
            if self.running.get(attempt.job_id) is attempt:
                del self.running[attempt.job_id]

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

    async def close(self) -> None:
        for attempt in list(self.running.values()):
            if attempt.task is not None:
                attempt.task.cancel()
        await asyncio.gather(*(a.task for a in self.running.values() if a.task),
                             return_exceptions=True)  # fmt: skip
