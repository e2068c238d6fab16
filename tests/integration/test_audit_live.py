"""`quotasched audit verify --nats-url` and `quotasched explain --nats-url` against a real
nats-server and a real `quotasched scheduler`.

The scheduler runs with the fixture's 0.5 s Ticks: each one is a command in QM_COMMANDS
without `at`, stamped by the scheduler with the stream's timestamp, and most decide nothing.
The verifier re-runs all of them with the same stamps, so it must reproduce every fact of the
log, through a scheduler restart too, and it must catch a fact that the scheduler never wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.events.subjects import command_subject, fact_subject
from quotasched.services.client import Bus
from tests.integration.helpers import (
    NOTEBOOK,
    api_ready,
    eventually,
    last_fact,
    logged,
    read_facts,
    wait_decided,
)

pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


def quotasched(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("QUOTASCHED_NATS_URL", None)
    return subprocess.run([QUOTASCHED, *args, "--nats-url", url], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)  # fmt: skip


def notebook_items() -> list[tuple[str, tuple[str, str] | None]]:
    """The notebook's lines with explicit routes for the job commands (no request needed)."""
    routes: dict[str, tuple[str, str]] = {}
    items = []
    for line in NOTEBOOK.read_text().splitlines():
        command = json.loads(line)
        if command["kind"] == "SubmitServiceJob":
            routes[command["jobId"]] = (command["jobQueue"], command["quotaShareName"])
        items.append((line, routes.get(command.get("jobId")) if command["kind"] == "UpdateServiceJob" else None))
    return items


async def wait_leading(process, timeout: float = 20.0):
    async def leading():
        return logged(process, "leading")

    await eventually(leading, timeout, what="the scheduler leading")


async def ticks_decided(bus, count: int, scheduler) -> None:
    """`count` idle Ticks through the command stream, decided (they decide nothing, so no
    fact says so: a refused marker after them does).  The scheduler publishes a Tick only
    when a timer is due, so these are published here."""
    for _ in range(count):
        await bus.publish({"kind": "Tick"})
    marker = await bus.js.publish(command_subject("SubmitServiceJob", "q", "qs1"),
                                  b'{"kind": "AfterTheTicks"}', stream="QM_COMMANDS")  # fmt: skip
    await wait_decided(bus.js, marker.seq, processes=[scheduler])


async def test_verify_and_explain_the_live_log(nats_server, spawn):
    url = nats_server.url
    scheduler = spawn("scheduler")
    async with Bus(url) as bus:
        await wait_leading(scheduler)
        await api_ready(bus)
        seqs = [await bus.publish(line, route=route) for line, route in notebook_items()]
        # Refused commands are part of the record too: one that is not a command at all, and
        # one published on another share's subject (the scheduler checks routes).
        await bus.js.publish(command_subject("SubmitServiceJob", "q", "qs1"), b'{"kind": "Nope"}',
                             stream="QM_COMMANDS")  # fmt: skip
        misrouted = await bus.publish({"kind": "UpdateServiceJob", "jobId": "med",
                                       "schedulingPriority": 7}, route=("q", "qs2"))  # fmt: skip
        await wait_decided(bus.js, misrouted, processes=[scheduler])
        await ticks_decided(bus, 3, scheduler)

    result = quotasched(url, "audit", "verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "audit verify: OK" in result.stdout

    report = json.loads(quotasched(url, "audit", "verify", "--output", "json").stdout)
    assert report["ok"] is True
    assert report["facts"] >= 17 + 2  # the notebook's facts and the two refusals
    assert report["rejected"] >= 2
    assert report["silent"] >= 3  # idle Ticks: re-run, nothing recorded, nothing produced
    assert report["first_seq"] == 1 and report["commands"] >= seqs[-1]

    story = quotasched(url, "explain", "med")
    assert story.returncode == 0, story.stderr
    assert "CROSS_SHARE_RECLAIM" in story.stdout and "b1" in story.stdout
    assert "qs1 (LEND_AND_BORROW) uses 2 of its limit 1 (borrowing 1)" in story.stdout
    assert f"command {misrouted}" in story.stdout  # the refused update is part of its story

    # -- a restart: the successor recovers from the log and goes on; still all reproducible ---
    assert scheduler.stop() == 0
    successor = spawn("scheduler")
    async with Bus(url) as bus:
        await wait_leading(successor)
        await api_ready(bus)
        late = await bus.publish({"kind": "SubmitServiceJob", "jobId": "late", "jobName": "late",
                                  "jobQueue": "q", "quotaShareName": "qs3",
                                  "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]})  # fmt: skip
        await wait_decided(bus.js, late, processes=[successor])
        await ticks_decided(bus, 2, successor)
    result = quotasched(url, "audit", "verify")
    assert result.returncode == 0, result.stdout + result.stderr

    # -- a fact the scheduler never decided: the audit finds it --------------------------------
    assert successor.stop() == 0
    async with Bus(url) as bus:
        last = await last_fact(bus.js)
        forged = {**last, "at": last["at"] + 1}
        subject = fact_subject(forged["kind"], forged.get("jobQueue"), forged.get("quotaShareName"))
        await bus.js.publish(subject, json.dumps(forged, separators=(",", ":")).encode(),
                             stream="QM_FACTS")  # fmt: skip
        recorded = await read_facts(bus.js)
    result = quotasched(url, "audit", "verify")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGENCE" in result.stdout
    assert f"QM_FACTS sequence {recorded[-1]['_seq']}" in result.stdout
    assert "recomputed: (none)" in result.stdout


async def test_verify_reports_an_unreachable_server():
    result = await asyncio.to_thread(quotasched, "nats://127.0.0.1:9", "audit", "verify")
    assert result.returncode == 2
    assert "cannot reach the NATS server" in result.stderr
