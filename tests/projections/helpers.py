"""Builders for projection tests: command dicts -> facts (through the real decision core) ->
a projection, plus a small deterministic random workload."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from quotasched.events.codec import encode
from quotasched.projections import store
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import State, step_raw

G5 = "ml.g5.xlarge"
P4 = "ml.p4d.24xlarge"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def command(kind: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "at": at, **fields}


def setup(capacity: dict[str, int], shares: list[dict[str, Any]], queue: str = "q") -> list[dict]:
    """A service environment, a FIFO policy, one queue and its shares, all at t=0."""
    commands = [
        command("CreateServiceEnvironment", 0, serviceEnvironmentName="se", capacityLimits=[
            {"capacityUnit": u, "maxCapacity": n} for u, n in capacity.items()]),
        command("CreateSchedulingPolicy", 0, name="sp",
                quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}),
        command("CreateJobQueue", 0, jobQueueName=queue, schedulingPolicy="sp",
                serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}]),
    ]  # fmt: skip
    for share in shares:
        commands.append(command("CreateQuotaShare", 0, jobQueue=queue, **share))
    return commands


def share(name: str, limit: int, strategy: str, borrow_limit: int | None = None,
          in_share: bool = False, extra_units: dict[str, int] | None = None) -> dict:
    sharing = {"strategy": strategy}
    if borrow_limit is not None:
        sharing["borrowLimit"] = borrow_limit
    limits = {G5: limit, **(extra_units or {})}
    return {"quotaShareName": name,
            "capacityLimits": [{"capacityUnit": u, "maxCapacity": n} for u, n in limits.items()],
            "resourceSharingConfiguration": sharing,
            "preemptionConfiguration": {
                "inSharePreemption": "ENABLED" if in_share else "DISABLED"}}


def submit(at: float, job_id: str, share_name: str, priority: int = 1, quantity: int = 1,
           queue: str = "q", **extra: Any) -> dict[str, Any]:  # fmt: skip
    return command("SubmitServiceJob", at, jobId=job_id, jobName=job_id, jobQueue=queue,
                   quotaShareName=share_name, schedulingPriority=priority,
                   capacityUsage=[{"capacityUnit": G5, "quantity": quantity}], **extra)  # fmt: skip


def report(at: float, job_id: str, status: str, **extra: Any) -> dict[str, Any]:
    return command("ReportJobStatus", at, jobId=job_id, status=status, **extra)


def facts_of(commands: list[dict] | list[str]) -> list[str]:
    """The facts (canonical JSON) the decision core records for these commands."""
    lines = [c if isinstance(c, str) else json.dumps(c) for c in commands]
    return [encode(fact) for fact in replay_lines(lines, State())]


def example_facts(name: str) -> list[str]:
    with open(EXAMPLES / name, "rb") as handle:
        return [encode(fact) for fact in replay_lines(handle, State())]


def project(facts: list[str], path: str = ":memory:",
            batch: int | None = None) -> store.ProjectionStore:
    projection = store.open(path)
    size = batch or len(facts) or 1
    numbered = list(enumerate(facts, start=1))
    for start in range(0, len(numbered), size):
        projection.apply(numbered[start:start + size])
    return projection


def write_facts(path: Path, facts: list[str]) -> Path:
    path.write_text("".join(fact + "\n" for fact in facts))
    return path


def rows(con, sql: str, params: Any = None) -> list[tuple]:
    return con.execute(sql, params).fetchall() if params else con.execute(sql).fetchall()


def by_key(con, sql: str, params: Any = None) -> dict:
    """{first column: rest of the row} (one value when the rest is one column)."""
    result = {}
    for row in rows(con, sql, params):
        result[row[0]] = row[1] if len(row) == 2 else tuple(row[1:])
    return result


def random_workload(seed: int, commands: int = 1500) -> list[str]:
    """A deterministic random command file that keeps the core busy: submissions (priorities,
    two units, retries, timeouts, preemption limits), reports for jobs that really are
    dispatched (read from the core's state as the file is written), priority updates,
    terminations, share limit and capacity changes, ticks, a share deleted, junk lines."""
    rng = random.Random(seed)
    shares = [share("lend", 3, "LEND", extra_units={P4: 1}),
              share("borrow", 2, "LEND_AND_BORROW", in_share=True, extra_units={P4: 1}),
              share("open", 1, "LEND_AND_BORROW", borrow_limit=-1), share("keep", 2, "RESERVE"),
              share("gone", 1, "LEND")]  # fmt: skip
    lines = [json.dumps(c) for c in setup({G5: 10, P4: 2}, shares)]
    state, at, jobs = State(), 0.0, []
    for number, line in enumerate(lines, start=1):
        step_raw(state, line, number)
    for i in range(commands):
        at += rng.choice((0.0, 0.5, 1.0, 2.5, 7.0))
        line = json.dumps(_random_command(rng, state, at, i, jobs))
        lines.append(line)
        step_raw(state, line, len(lines))
    lines.append(json.dumps(command("UpdateQuotaShare", at + 1, jobQueue="q",
                                    quotaShareName="gone", state="DISABLED")))  # fmt: skip
    lines.append(json.dumps(command("DeleteQuotaShare", at + 2, jobQueue="q",
                                    quotaShareName="gone")))
    lines.append(json.dumps(command("Tick", at + 1000)))
    return lines


def _random_command(rng: random.Random, state: State, at: float, i: int, jobs: list[str]) -> Any:
    live = [job for job in state.jobs.values() if job.status.dispatched]
    roll = rng.random()
    if roll < 0.40 or not jobs:
        job_id = f"j{i}"
        jobs.append(job_id)
        extra: dict[str, Any] = {}
        if rng.random() < 0.2:
            extra["retryStrategy"] = {"attempts": rng.choice((2, 3))}
        if rng.random() < 0.1:
            extra["timeoutConfig"] = {"attemptDurationSeconds": rng.choice((5, 30))}
        if rng.random() < 0.1:
            extra["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": 1}
        target = rng.choice(("lend", "borrow", "open", "keep", "gone"))
        usage = [{"capacityUnit": G5, "quantity": rng.choice((1, 1, 1, 2))}]
        if target == "borrow" and rng.random() < 0.2:  # heterogeneous: borrows p4d from "lend"
            usage.append({"capacityUnit": P4, "quantity": rng.choice((1, 2))})
        return command("SubmitServiceJob", at, jobId=job_id, jobName=f"n{i % 7}", jobQueue="q",
                       quotaShareName=target, schedulingPriority=rng.randrange(5),
                       capacityUsage=usage, **extra)  # fmt: skip
    if roll < 0.75 and live:
        job = rng.choice(live)
        status = rng.choice(("RUNNING", "SUCCEEDED", "SUCCEEDED", "FAILED",
                             "INSUFFICIENT_CAPACITY"))
        return report(at, job.job_id, status, attempt=job.attempt)
    if roll < 0.85:
        return command("UpdateServiceJob", at, jobId=rng.choice(jobs),
                       schedulingPriority=rng.randrange(6))  # fmt: skip
    if roll < 0.90:
        return command("TerminateServiceJob", at, jobId=rng.choice(jobs), reason="test")
    if roll < 0.93:
        name = rng.choice(("lend", "open"))
        limits = [{"capacityUnit": G5, "maxCapacity": rng.randrange(1, 4)}]
        if name == "lend" and rng.random() < 0.7:  # now and then the p4d limit goes away
            limits.append({"capacityUnit": P4, "maxCapacity": 1})
        return command("UpdateQuotaShare", at, jobQueue="q", quotaShareName=name,
                       capacityLimits=limits)
    if roll < 0.95:
        return command("UpdateServiceEnvironment", at, serviceEnvironment="se",
                       capacityLimits=[{"capacityUnit": G5, "maxCapacity": rng.randrange(6, 12)},
                                       {"capacityUnit": P4, "maxCapacity": 2}])  # fmt: skip
    if roll < 0.98:
        return command("Tick", at)
    return "not a command"
