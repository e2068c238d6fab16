"""Shared pieces of the property tests: capacity units and a seeded command-file generator.

`random_command_lines(rng)` writes a self-contained replay file (JSON Lines) from a seeded
`random.Random`: one or two job queues with 2-5 quota shares of random strategies, then a
random mix of submissions, priority updates, executor reports (some for stale attempts),
terminations, share and service-environment changes, deletions, Ticks (some going backwards in
time, ruling 9) and a few lines that are not valid commands at all.  It needs no feedback from
the scheduler, so the same seed always gives the same file.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

UNITS = ("ml.g5.xlarge", "ml.m5.xlarge", "ml.p4d.24xlarge")
STRANGER = "ml.c5.large"  # a unit that no share and no service environment lists
STRATEGIES = ("RESERVE", "LEND", "LEND_AND_BORROW")
BORROW_LIMITS = (None, -1, 0, 50, 100, 200)
REASONS = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED",
    "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE",
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
)
REPORTS = ("STARTING", "RUNNING", "SUCCEEDED", "FAILED", "INSUFFICIENT_CAPACITY")


def sharing(strategy: str, borrow: int | None) -> dict[str, Any]:
    config: dict[str, Any] = {"strategy": strategy}
    if strategy == "LEND_AND_BORROW" and borrow is not None:
        config["borrowLimit"] = borrow
    return config


def limits(mapping: dict[str, int]) -> list[dict[str, Any]]:
    return [{"capacityUnit": unit, "maxCapacity": n} for unit, n in mapping.items()]


def random_command_lines(rng: random.Random, steps: int = 80) -> list[str]:
    """A random but well-formed (mostly) replay file; see the module docstring."""
    lines: list[str] = []
    now = 0.0

    def put(kind: str, **fields: Any) -> None:
        lines.append(json.dumps({"at": now, "kind": kind, **fields}))

    put("CreateSchedulingPolicy", name="sp",
        quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})  # fmt: skip
    queues: list[tuple[str, list[str], list[str]]] = []  # (name, units, shares)
    for q in range(rng.randint(1, 2)):
        units = rng.sample(UNITS, rng.randint(1, 3))
        shares: dict[str, dict[str, int]] = {}
        for s in range(rng.randint(2, 5)):
            listed = rng.sample(units, rng.randint(1, len(units)))
            shares[f"q{q}s{s}"] = {unit: rng.randint(1, 4) for unit in listed}
        capacity = {unit: rng.randint(0, sum(l.get(unit, 0) for l in shares.values()) + 3)
                    for unit in units}  # fmt: skip
        put("CreateServiceEnvironment", serviceEnvironmentName=f"se{q}",
            capacityLimits=limits(capacity))  # fmt: skip
        actions = [
            {"state": "RUNNABLE", "action": "TERMINATE", "reason": reason,
             "maxTimeSeconds": rng.choice((600, 900))}
            for reason in rng.sample(REASONS, rng.randint(0, 2))
        ]  # fmt: skip
        put("CreateJobQueue", jobQueueName=f"q{q}", schedulingPolicy="sp",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": f"se{q}"}],
            jobStateTimeLimitActions=actions)  # fmt: skip
        for name, mapping in shares.items():
            strategy = rng.choice(STRATEGIES)
            put("CreateQuotaShare", jobQueue=f"q{q}", quotaShareName=name,
                capacityLimits=limits(mapping),
                resourceSharingConfiguration=sharing(strategy, rng.choice(BORROW_LIMITS)),
                preemptionConfiguration={"inSharePreemption": rng.choice(("ENABLED", "DISABLED"))})  # fmt: skip
        queues.append((f"q{q}", units, list(shares)))

    jobs: list[str] = []
    for _ in range(steps):
        roll = rng.random()
        if rng.random() < 0.3:
            now += rng.choice((0.0, 1.0, 5.0, 50.0, 400.0, 700.0))
        queue, units, shares = rng.choice(queues)
        if roll < 0.40:
            job_id = f"j{len(jobs)}"
            jobs.append(job_id)
            unit = STRANGER if rng.random() < 0.05 else rng.choice(units)
            usage = [{"capacityUnit": unit, "quantity": rng.randint(1, 4)}]
            if rng.random() < 0.1 and len(units) > 1:
                other = rng.choice([u for u in units if u != unit])
                usage.append({"capacityUnit": other, "quantity": rng.randint(1, 2)})
            extra: dict[str, Any] = {}
            if rng.random() < 0.3:
                extra["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": rng.randint(0, 2)}
            if rng.random() < 0.3:
                extra["retryStrategy"] = {"attempts": rng.randint(1, 3)}
            if rng.random() < 0.2:
                extra["timeoutConfig"] = {"attemptDurationSeconds": rng.choice((30, 300, 1000))}
            if rng.random() < 0.2:
                extra["clientToken"] = f"tok{rng.randint(0, 5)}"
            elif rng.random() < 0.9:
                extra["jobId"] = job_id
            put("SubmitServiceJob", jobName=job_id, jobQueue=queue,
                quotaShareName=rng.choice(shares), schedulingPriority=rng.randint(0, 9),
                capacityUsage=usage, **extra)  # fmt: skip
        elif roll < 0.48 and jobs:
            put("UpdateServiceJob", jobId=rng.choice(jobs), schedulingPriority=rng.randint(0, 9))
        elif roll < 0.66 and jobs:
            report: dict[str, Any] = {"jobId": rng.choice(jobs), "status": rng.choice(REPORTS)}
            if rng.random() < 0.7:
                report["attempt"] = rng.randint(1, 3)
            put("ReportJobStatus", **report)
        elif roll < 0.71 and jobs:
            put("TerminateServiceJob", jobId=rng.choice(jobs), reason="stopped by test")
        elif roll < 0.79:
            update: dict[str, Any] = {}
            if rng.random() < 0.5:
                listed = rng.sample(units, rng.randint(1, len(units)))
                update["capacityLimits"] = limits({u: rng.randint(1, 4) for u in listed})
            if rng.random() < 0.4:
                update["resourceSharingConfiguration"] = sharing(rng.choice(STRATEGIES),
                                                                 rng.choice(BORROW_LIMITS))
            if rng.random() < 0.3:
                update["state"] = rng.choice(("ENABLED", "DISABLED"))
            if rng.random() < 0.2:
                update["preemptionConfiguration"] = {"inSharePreemption": rng.choice(("ENABLED", "DISABLED"))}
            put("UpdateQuotaShare", jobQueue=queue, quotaShareName=rng.choice(shares), **update)
        elif roll < 0.85:
            update = {}
            if rng.random() < 0.7:
                update["capacityLimits"] = limits({u: rng.randint(0, 8) for u in units})
            if rng.random() < 0.4:
                update["state"] = rng.choice(("ENABLED", "ENABLED", "DISABLED"))
            put("UpdateServiceEnvironment", serviceEnvironment=f"se{queue[1:]}", **update)
        elif roll < 0.88:
            put("DeleteQuotaShare", jobQueue=queue, quotaShareName=rng.choice(shares))
        elif roll < 0.97:
            if rng.random() < 0.2:  # a late command: time never goes backwards (ruling 9)
                lines.append(json.dumps({"at": max(0.0, now - 10.0), "kind": "Tick"}))
            else:
                put("Tick")
        elif roll < 0.985:
            lines.append(rng.choice(('{"kind": "Nope", "at": 1}', "not json at all", "{}",
                                     '{"kind": "Tick", "at": -1}')))  # fmt: skip
        else:
            put("SubmitServiceJob", jobName="dup", jobQueue=queue, quotaShareName=rng.choice(shares),
                jobId=rng.choice(jobs) if jobs else "j0",
                capacityUsage=[{"capacityUnit": rng.choice(units), "quantity": 1}])  # fmt: skip
    return lines


@pytest.fixture(scope="session")
def quotasched_exe() -> Path:
    """The `quotasched` console script of the running virtualenv."""
    exe = Path(sys.executable).parent / "quotasched"
    if not exe.exists():
        pytest.skip(f"no quotasched console script next to {sys.executable}")
    return exe
