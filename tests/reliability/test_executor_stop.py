"""The executor protocol (services/executors/base.py) when a stop arrives before the attempt it
stops has taken its first step: a termination decided right after the dispatch, both read in
one go from the fact log.  The executor must stop the attempt and go on with the next facts; it
used to wait forever for the attempt's `finally` (a task cancelled before it ever ran never
runs it), which blocked its fact handler and so every job after it."""

from __future__ import annotations

import asyncio
import json

from quotasched.services.executors.simulated import SimulatedExecutor
from tests.executor_facts import dispatched, status_changed, submitted


async def test_a_termination_right_after_the_dispatch_does_not_block_the_executor():
    reports: list[tuple[str, bytes]] = []

    async def publish(subject: str, data: bytes) -> None:
        reports.append((subject, data))

    executor = SimulatedExecutor(publish, speed=1000.0)
    try:
        for job_id in ("first", "second"):
            await executor.on_fact(submitted(job_id, {"duration": "1"}))
        async def dispatch_then_terminate() -> None:  # one handler after the other, no step between
            await executor.on_fact(dispatched("first"))
            await executor.on_fact(status_changed("first", 1, status="FAILED", cause="TERMINATED"))

        await asyncio.wait_for(dispatch_then_terminate(), 10.0)  # the handler is free again
        assert "first" not in executor.running
        await executor.on_fact(dispatched("second"))
        await asyncio.wait_for(executor.running["second"].stopped.wait(), 10.0)
    finally:
        await executor.close()
    statuses = [(json.loads(data)["jobId"], json.loads(data)["status"]) for _, data in reports]
    assert ("first", "STARTING") not in statuses, "a terminated attempt was started"
    assert statuses == [("second", "STARTING"), ("second", "RUNNING"), ("second", "SUCCEEDED")]
