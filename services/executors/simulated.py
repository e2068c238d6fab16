"""The simulated executor: each attempt "runs" for the job's duration, scaled by a speed factor.

The duration comes from the job's tags (`duration` in seconds) or its SageMaker payload
(`StoppingCondition.MaxRuntimeInSeconds`), else `default_duration_s`.  A tag `outcome=FAILED`
makes every attempt fail, to exercise retries.  A preempted attempt stops at once.

An attempt ends at its dispatch time (the JobDispatched fact's `at`) plus its duration over
the speed factor, so its end is computed from the log: an executor restarted meanwhile
(`recover`, with the ledger) follows it and reports it at the same moment, or at once if
that moment has passed.
"""

from __future__ import annotations

import asyncio
import time

from quotasched.services.executors.base import Attempt, Executor, Publish, payload_object
from quotasched.services.executors.ledger import Ledger


def job_duration_s(spec: dict, default: float) -> float:
    tags = spec.get("tags") or {}
    if "duration" in tags:
        return float(tags["duration"])
    payload = payload_object(spec)
    if payload is not None:
        runtime = (payload.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
        if isinstance(runtime, (int, float)):
            return float(runtime)
    return default


class SimulatedExecutor(Executor):
    name = "simulated"

    def __init__(self, publish: Publish, speed: float = 1.0, default_duration_s: float = 60.0,
                 ledger: Ledger | None = None):  # fmt: skip
        super().__init__(publish, ledger)
        self.speed = speed
        self.default_duration_s = default_duration_s

    follows_across_restarts = True

    async def adopt(self, attempt: Attempt) -> bool:
        # The dispatch time, from the ledger or (an older release's entry) from the log the
        # executor caught up on; without it the end time is unknown: reported lost.
        return attempt.dispatched_at is not None

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        duration = job_duration_s(attempt.spec, self.default_duration_s) / self.speed
        began = attempt.dispatched_at if attempt.dispatched_at is not None else time.time()
        await asyncio.sleep(max(0.0, began + duration - time.time()))
        if (attempt.spec.get("tags") or {}).get("outcome") == "FAILED":
            return "FAILED", "Simulated failure (tag outcome=FAILED)"
        return "SUCCEEDED", None
