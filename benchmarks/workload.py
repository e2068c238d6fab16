"""Deterministic generator of realistic `quotasched replay` command files.

    python benchmarks/workload.py --commands 200000 --queued 100000 --out FILE [--seed N]
    python benchmarks/workload.py --prefill 1000000 --commands 20000 --out FILE

The workload is one service environment with three capacity units, one job queue and 20 quota
shares (a mix of RESERVE, LEND and LEND_AND_BORROW with assorted borrow limits, some with
in-share preemption), followed by a stream of job traffic:

- `SubmitServiceJob`: priorities 0-9, mostly one instance, some multi-instance, a few
  heterogeneous (two units), ~10% given as a SageMaker `serviceRequestPayload`, some with
  retry strategies, attempt timeouts, preemption retry limits, client tokens and tags; share
  popularity is skewed (Zipf-like), so a few shares hold most of the queue; very rarely a job
  too large for its share, which blocks the share until the queue's time limit terminates it;
- `UpdateServiceJob`: priority changes of live jobs (queued or running);
- `ReportJobStatus`: RUNNING / SUCCEEDED / FAILED (rarely INSUFFICIENT_CAPACITY) for jobs that
  really are dispatched;
- occasional `UpdateQuotaShare` limit changes and `Tick`s;

with non-decreasing `at` (exponential inter-arrival times, 20 commands per logical second).

To know which jobs are dispatched, the generator runs the real decision core
(`services.scheduler.core.step_raw`) over every line it writes, with the same line numbers
`quotasched replay` uses, so every report it generates targets a live attempt.  Submissions
outnumber completions under a simple controller that makes the number of queued (RUNNABLE)
jobs follow a linear ramp up to the `queued` target by the last command.

With `prefill=Q`, the queue is first filled with Q cheap submissions (no other traffic), then
`commands` mixed commands follow with the controller holding the queue near Q: that is the
fixed "window" the benchmark times at 10k, 100k and 1M queued jobs.

Same parameters and seed, byte-identical file.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quotasched.services.scheduler.core import State, step_raw  # noqa: E402

ENVIRONMENT = "bench-se"
POLICY = "bench-fifo"
QUEUE = "bench-q"
# Capacity unit -> the service environment's maxCapacity.  The shares' own limits add up to a
# little less than this (see _share_configs), so some capacity is owned by nobody.
UNITS = {"ml.g5.xlarge": 96, "ml.p4d.24xlarge": 16, "ml.m5.large": 160}
SHARE_COUNT = 20
COMMANDS_PER_SECOND = 20.0
TIME_LIMIT_SECONDS = 900

# Mixed traffic, per command (the rest is "job flow": a submission or an executor report).
P_QUOTA_UPDATE = 0.001
P_TICK = 0.004
P_PRIORITY_UPDATE = 0.08
# Job flow: probability of a submission when the queue is below / at-or-above its target.
P_SUBMIT_BELOW = 0.8
P_SUBMIT_ABOVE = 0.2


@dataclass(frozen=True)
class ShareConfig:
    name: str
    limits: dict[str, int]
    strategy: str
    borrow_limit: int | None  # None: not given (LEND_AND_BORROW then means unlimited)
    in_share_preemption: bool
    weight: float  # share of submissions

    def command(self, at: float) -> dict:
        sharing: dict = {"strategy": self.strategy}
        if self.borrow_limit is not None:
            sharing["borrowLimit"] = self.borrow_limit
        return {
            "at": at, "kind": "CreateQuotaShare", "jobQueue": QUEUE, "quotaShareName": self.name,
            "capacityLimits": [{"capacityUnit": u, "maxCapacity": n} for u, n in self.limits.items()],
            "resourceSharingConfiguration": sharing,
            "preemptionConfiguration": {
                "inSharePreemption": "ENABLED" if self.in_share_preemption else "DISABLED"
            },
        }  # fmt: skip


def _share_configs(rng: random.Random) -> list[ShareConfig]:
    """20 shares: 6 RESERVE, 7 LEND, 7 LEND_AND_BORROW, limits summing to ~90% of capacity."""
    strategies = ["RESERVE"] * 6 + ["LEND"] * 7 + ["LEND_AND_BORROW"] * 7
    rng.shuffle(strategies)
    unit_names = list(UNITS)
    # Which units each share lists: every share has g5 or m5; a third also have p4d.
    listed: list[list[str]] = []
    for index in range(SHARE_COUNT):
        units = [unit_names[0]] if index % 2 == 0 else [unit_names[2]]
        if rng.random() < 0.5:
            units.append(unit_names[2] if index % 2 == 0 else unit_names[0])
        if rng.random() < 0.35:
            units.append(unit_names[1])
        listed.append(units)
    # Split ~90% of each unit's capacity among the shares that list it, unevenly.
    limits: list[dict[str, int]] = [{} for _ in range(SHARE_COUNT)]
    for unit, capacity in UNITS.items():
        holders = [i for i, units in enumerate(listed) if unit in units]
        if not holders:
            continue
        raw = [rng.uniform(0.5, 2.0) for _ in holders]
        budget = int(capacity * 0.9)
        for i, part in zip(holders, raw):
            limits[i][unit] = max(1, int(budget * part / sum(raw)))
    configs = []
    for index in range(SHARE_COUNT):
        strategy = strategies[index]
        borrow_limit = None
        if strategy == "LEND_AND_BORROW":
            borrow_limit = rng.choice([None, -1, 50, 100, 200, 400])
        configs.append(ShareConfig(
            name=f"share-{index:02d}",
            limits={u: limits[index][u] for u in unit_names if u in limits[index]},
            strategy=strategy,
            borrow_limit=borrow_limit,
            in_share_preemption=rng.random() < 0.35,
            weight=1.0 / (index + 1) ** 0.8,  # Zipf-like popularity
        ))  # fmt: skip
    return configs


class WorkloadGenerator:
    """Writes command lines and runs them through the core to track dispatched jobs."""

    def __init__(self, seed: int = 1):
        self.rng = random.Random(seed)
        self.state = State()
        self.line_number = 0
        self.time = 0.0
        self.shares = _share_configs(self.rng)
        self._share_weights = [share.weight for share in self.shares]
        self._cum_weights = []
        total = 0.0
        for weight in self._share_weights:
            total += weight
            self._cum_weights.append(total)
        self.current_limits = {share.name: dict(share.limits) for share in self.shares}
        self.submitted = 0
        self.job_ids: list[str] = []  # every accepted job, acceptance order
        self.running: list[str] = []  # dispatched jobs (SCHEDULED/STARTING/RUNNING)
        self._running_at: dict[str, int] = {}
        self.live = 0  # jobs not yet SUCCEEDED/FAILED
        self.command_kinds: Counter[str] = Counter()
        self.fact_kinds: Counter[str] = Counter()

    # -- bookkeeping ------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return self.live - len(self.running)

    def _add_running(self, job_id: str) -> None:
        if job_id not in self._running_at:
            self._running_at[job_id] = len(self.running)
            self.running.append(job_id)

    def _remove_running(self, job_id: str) -> None:
        index = self._running_at.pop(job_id, None)
        if index is None:
            return
        last = self.running.pop()
        if last != job_id:
            self.running[index] = last
            self._running_at[last] = index

    def _track(self, facts) -> None:
        for fact in facts:
            kind = fact.kind
            self.fact_kinds[kind] += 1
            if kind == "JobSubmitted":
                self.live += 1
                self.job_ids.append(fact.job_id)
            elif kind == "JobDispatched":
                self._add_running(fact.job_id)
            elif kind == "JobPreempted":
                self._remove_running(fact.job_id)
                if fact.outcome.value == "FAILED":
                    self.live -= 1
            elif kind == "JobStatusChanged":
                status = fact.status.value
                if status in ("RUNNABLE", "SUCCEEDED", "FAILED"):
                    self._remove_running(fact.job_id)
                if status in ("SUCCEEDED", "FAILED"):
                    self.live -= 1

    def _line(self, command: dict) -> str:
        line = json.dumps(command)
        self.line_number += 1
        if self.line_number % 16384 == 0:
            gc.freeze()  # the state is long-lived: keep the cyclic collector off it
        self.command_kinds[command["kind"]] += 1
        self._track(step_raw(self.state, line, self.line_number))
        return line

    def _now(self, advance: bool = True) -> float:
        if advance:
            self.time += self.rng.expovariate(COMMANDS_PER_SECOND)
        return round(self.time, 3)

    # -- commands ---------------------------------------------------------------------------

    def setup(self) -> Iterator[str]:
        yield self._line({
            "at": 0.0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": ENVIRONMENT,
            "capacityLimits": [{"capacityUnit": u, "maxCapacity": n} for u, n in UNITS.items()],
        })  # fmt: skip
        yield self._line({
            "at": 0.0, "kind": "CreateSchedulingPolicy", "name": POLICY,
            "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"},
        })  # fmt: skip
        yield self._line({
            "at": 0.0, "kind": "CreateJobQueue", "jobQueueName": QUEUE,
            "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": ENVIRONMENT}],
            "schedulingPolicy": POLICY, "priority": 10,
            "jobStateTimeLimitActions": [{
                "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED", "state": "RUNNABLE",
                "maxTimeSeconds": TIME_LIMIT_SECONDS, "action": "TERMINATE",
            }],
        })  # fmt: skip
        for share in self.shares:
            yield self._line(share.command(0.0))

    def _pick_share(self) -> ShareConfig:
        return self.rng.choices(self.shares, cum_weights=self._cum_weights)[0]

    def submit(self, cheap: bool = False) -> str:
        rng = self.rng
        share = self._pick_share()
        limits = self.current_limits[share.name]
        units = list(limits)
        unit = rng.choice(units)
        roll = rng.random()
        quantity = 1 if roll < 0.85 else 2 if roll < 0.95 else 4 if roll < 0.99 else 8
        if share.strategy != "LEND_AND_BORROW" or share.borrow_limit not in (None, -1):
            quantity = min(quantity, limits[unit])  # keep it admissible (not blocked)
        need = {unit: quantity}
        if len(units) > 1 and rng.random() < 0.03:  # heterogeneous: two groups at once
            other = rng.choice([u for u in units if u != unit])
            need[other] = 1
        if rng.random() < 0.0002:  # a job that can never fit: blocks its share for a while
            need = {unit: limits[unit] * 8 + 1}
        self.submitted += 1
        number = self.submitted
        priority = rng.choices(range(10), weights=(10, 30, 20, 12, 8, 6, 5, 4, 3, 2))[0]
        command: dict = {
            "at": self._now(), "kind": "SubmitServiceJob",
            "jobName": f"{share.name}-train-{number}", "jobQueue": QUEUE,
            "quotaShareName": share.name,
        }  # fmt: skip
        if rng.random() < 0.95:
            command["jobId"] = f"job-{number:08d}"
        command["schedulingPriority"] = priority
        if not cheap and rng.random() < 0.10:
            groups = [{"InstanceType": u, "InstanceCount": n, "VolumeSizeInGB": 50,
                       "InstanceGroupName": f"group-{i}"} for i, (u, n) in enumerate(need.items())]  # fmt: skip
            resource = {"InstanceGroups": groups} if len(groups) > 1 else {
                k: v for k, v in groups[0].items() if k != "InstanceGroupName"}  # fmt: skip
            command["serviceRequestPayload"] = {
                "TrainingJobName": f"train-{number}",
                "AlgorithmSpecification": {
                    "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest",
                    "TrainingInputMode": "File",
                },
                "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
                "OutputDataConfig": {"S3OutputPath": f"s3://bench-bucket/{share.name}/out"},
                "ResourceConfig": resource,
                "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
            }
        else:
            command["capacityUsage"] = [{"capacityUnit": u, "quantity": n} for u, n in need.items()]
        if not cheap:
            if rng.random() < 0.10:
                command["preemptionConfiguration"] = {"preemptionRetriesBeforeTermination": 3}
            if rng.random() < 0.10:
                command["retryStrategy"] = {"attempts": rng.choice([2, 3])}
            if rng.random() < 0.05:
                command["timeoutConfig"] = {"attemptDurationSeconds": rng.randint(1800, 86400)}
            if rng.random() < 0.10:
                command["clientToken"] = f"tok-{number}"
            if rng.random() < 0.30:
                command["tags"] = {"team": share.name, "project": f"p{number % 37}"}
        return self._line(command)

    def report(self) -> str:
        rng = self.rng
        job_id = rng.choice(self.running)
        job = self.state.jobs[job_id]
        status = job.status.value
        roll = rng.random()
        if status == "SCHEDULED":
            reported = ("RUNNING" if roll < 0.6 else "SUCCEEDED" if roll < 0.95
                        else "FAILED" if roll < 0.99 else "INSUFFICIENT_CAPACITY")  # fmt: skip
        elif status == "STARTING":
            reported = "RUNNING"
        else:
            reported = "SUCCEEDED" if roll < 0.9 else "FAILED"
        command = {"at": self._now(), "kind": "ReportJobStatus", "jobId": job_id,
                   "status": reported, "attempt": job.attempt}  # fmt: skip
        if reported == "FAILED":
            command["statusReason"] = rng.choice(
                ["AlgorithmError: exit code 1", "ClientError: out of memory", "InternalServerError"]
            )
        return self._line(command)

    def update_priority(self) -> str:
        rng = self.rng
        jobs = self.state.jobs
        job_id = None
        for _ in range(8):  # prefer a live job; recent ones are likelier to be touched
            index = len(self.job_ids) - 1 - min(int(rng.expovariate(1 / 5000)), len(self.job_ids) - 1)
            candidate = self.job_ids[index]
            if not jobs[candidate].status.terminal:
                job_id = candidate
                break
        job_id = job_id or self.job_ids[-1]
        return self._line({"at": self._now(), "kind": "UpdateServiceJob", "jobId": job_id,
                           "schedulingPriority": rng.randint(0, 9)})  # fmt: skip

    def update_share(self) -> str:
        rng = self.rng
        share = rng.choice(self.shares)
        limits = self.current_limits[share.name]
        unit = rng.choice(list(limits))
        base = share.limits[unit]
        limits[unit] = max(1, base + rng.randint(-max(1, base // 4), max(1, base // 4)))
        return self._line({
            "at": self._now(), "kind": "UpdateQuotaShare", "jobQueue": QUEUE,
            "quotaShareName": share.name,
            "capacityLimits": [{"capacityUnit": u, "maxCapacity": n} for u, n in limits.items()],
        })  # fmt: skip

    def tick(self) -> str:
        return self._line({"at": self._now(), "kind": "Tick"})

    def mixed(self, target_queued: int) -> str:
        """One command of steady traffic, steering the queue towards `target_queued`."""
        roll = self.rng.random()
        if roll < P_QUOTA_UPDATE:
            return self.update_share()
        if roll < P_QUOTA_UPDATE + P_TICK:
            return self.tick()
        if roll < P_QUOTA_UPDATE + P_TICK + P_PRIORITY_UPDATE and self.job_ids:
            return self.update_priority()
        p_submit = P_SUBMIT_BELOW if self.queued < target_queued else P_SUBMIT_ABOVE
        if not self.running or self.rng.random() < p_submit:
            return self.submit()
        return self.report()


def generate(commands: int, queued: int, seed: int = 1, prefill: int = 0,
             generator: WorkloadGenerator | None = None) -> Iterator[str]:  # fmt: skip
    """Every line of a workload (no newlines).

    prefill == 0: setup, then `commands` mixed commands (setup included in the count) with the
    queue ramping linearly to `queued`.  prefill > 0: setup, `prefill` cheap submissions, then
    `commands` mixed commands holding the queue near `queued` (give queued == prefill).
    """
    gen = generator or WorkloadGenerator(seed)
    setup = list(gen.setup())
    yield from setup
    if prefill:
        for _ in range(prefill):
            yield gen.submit(cheap=True)
        for _ in range(commands):
            yield gen.mixed(queued)
        return
    mixed = max(0, commands - len(setup))
    for index in range(mixed):
        yield gen.mixed(queued * (index + 1) // mixed)


def setup_length() -> int:
    return 3 + SHARE_COUNT


def write(path: Path, lines: Iterator[str]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        buffer = []
        for line in lines:
            buffer.append(line)
            count += 1
            if len(buffer) >= 8192:
                handle.write("\n".join(buffer) + "\n")
                buffer.clear()
        if buffer:
            handle.write("\n".join(buffer) + "\n")
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=200_000,
                        help="mixed commands (including setup unless --prefill is given)")
    parser.add_argument("--queued", type=int, default=100_000,
                        help="queued (RUNNABLE) jobs to reach by the end / to hold")
    parser.add_argument("--prefill", type=int, default=0,
                        help="first fill the queue with this many cheap submissions")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    gen = WorkloadGenerator(args.seed)
    started = time.perf_counter()
    count = write(args.out, generate(args.commands, args.queued if not args.prefill else args.prefill,
                                     args.seed, args.prefill, gen))  # fmt: skip
    elapsed = time.perf_counter() - started
    print(f"wrote {count} commands to {args.out} in {elapsed:.1f}s; "
          f"{gen.queued} queued, {len(gen.running)} dispatched, {gen.live} live jobs at the end",
          file=sys.stderr)  # fmt: skip
    print("commands: " + ", ".join(f"{k} {v}" for k, v in gen.command_kinds.most_common()),
          file=sys.stderr)
    print("facts:    " + ", ".join(f"{k} {v}" for k, v in gen.fact_kinds.most_common()),
          file=sys.stderr)


if __name__ == "__main__":
    main()
