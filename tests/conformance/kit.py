"""The executor conformance kit: the executor protocol (docs/executors.md, "The protocol") as
scenarios any executor can be run against, with a real nats-server and a real scheduler.

To test an executor, describe it with a subclass of `ExecutorUnderTest`: how to start it and
how to kill it (SIGKILL: its work may outlive it), how a job's `SubmitServiceJob` fields make
an attempt run for a while, fail or succeed (`job`), and, where it can, what it observably did
(`records`: when each attempt's work started and stopped, as the work itself or the backend
recorded it).  Then `TestMine = conformance_tests(MyExecutor)` in a test module runs every
scenario of `SCENARIOS` against it, on one `Stack` (tests/conformance/test_executors.py does it
for the four built-in executors; docs/executors.md, "Conformance kit", says more).

The stack has one service environment and its one job queue (a quota-management environment
serves one queue, and a GPU agent serves one environment).  Each scenario creates quota
shares of its own on that queue (one to three; a queue holds at most 20), submits a few jobs
whose ids start with the scenario's prefix, and looks only at those: it checks the fact log,
the command stream (the executor's reports) and the records against expectations worked out
from the protocol, by hand.  After every scenario, whatever is still running is terminated and
two checks that hold for every scenario run over what happened (`check_reports`,
`check_records`): an executor reports only about attempts that were dispatched, always naming
the attempt, never after the scheduler ended that attempt; it starts each attempt at most
once, and a started attempt that was stopped has stopped before its end is reported.

An executor that cannot take part in a scenario for a reason of its backend names it, with the
reason, in `skips` (the test shows it as skipped with that reason).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from quotasched.services.nats.embedded import EmbeddedServer
from quotasched.services.nats.log import read_messages, sequence_and_time
from tests.integration.conftest import Process, end_jobs_left_in
from tests.integration.helpers import eventually, holder_of, read_facts

UNIT = "ml.g5.xlarge"
ENVIRONMENT = "conformance-se"
QUEUE = "conformance"  # the environment's one job queue (an environment serves one queue)
KIT_REASON = "conformance kit: a late report from a slow backend"  # marks the kit's own report
LONG_S = 60.0  # a "long" attempt: runs until it is stopped (targets may shorten it: long_s)
STOP_S = 0.3  # how long the kit's job takes to stop on SIGTERM (a checkpoint)
ENDED = ("SUCCEEDED", "FAILED")
WAIT_S = 30.0  # the longest any single expectation is waited for


# -- describing the executor under test ---------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """What an attempt of a job should do: run `seconds`, then exit; the first
    `fail_attempts` attempts fail, later ones succeed."""

    seconds: float
    fail_attempts: int = 0


@dataclass(frozen=True)
class Record:
    """One thing the executor observably did: an attempt's work started or stopped, at `ns`
    (wall clock, time.time_ns; None when the backend does not say when)."""

    event: str  # "start" or "stop"
    job_id: str
    attempt: int
    ns: int | None = None


class ExecutorUnderTest:
    """Override what your executor needs; the defaults describe an executor that keeps no
    records, reports RUNNING, can fail an attempt and succeed the next, and never lacks
    capacity."""

    name = "executor"
    capacity = 3  # instances of UNIT in the stack's service environment (at least 3)
    created_capacity: int | None = None  # the environment's capacity at creation, if not it
    long_s = LONG_S  # how long a "long" attempt runs unless stopped
    reports_running = True  # the backend gets to RUNNING before a short job succeeds
    fails_only_first = True  # a job can fail its first attempt and succeed its second
    unplaceable_quantity: int | None = None  # a need it reports INSUFFICIENT_CAPACITY for
    records_stops = True  # its records say when each attempt's work stopped, not only started
    skips: dict[str, str] = {}  # scenario name -> why this executor cannot take part
    # A stopped or killed executor leaves its attempts running, and the next one started on
    # the same state follows them (a_restart_follows_the_running_attempts); False: the next
    # one ends what a killed one left (a_killed_executor_ends_what_it_left...).
    follows_restarts = False

    def start(self, stack: Stack) -> None:
        """Start the executor: with the stack (the scheduler may not lead yet, the service
        environment may not exist yet), and again after `kill`, with the same state, as after
        a crash."""
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL the executor (every process of it); the work it started may go on."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the executor gracefully (SIGTERM) and wait until it has exited, 0."""
        raise NotImplementedError

    async def ready(self, stack: Stack, bus: Bus) -> None:
        """Until the executor, started for the first time, takes attempts."""

    def job(self, stack: Stack, spec: JobSpec, quantity: int) -> dict[str, Any]:
        """The `SubmitServiceJob` fields (tags, payload, capacity) for a job doing `spec`,
        needing `quantity` instances of UNIT."""
        raise NotImplementedError

    def records(self, stack: Stack) -> list[Record] | None:
        """What the executor observably did, in any order; None: it keeps no records."""
        return None

    def daemon_job(self, stack: Stack, spec: JobSpec, quantity: int,
                   pidfile: Path) -> dict[str, Any] | None:  # fmt: skip
        """The `SubmitServiceJob` fields for a job doing `spec` that first starts a child in a
        session of its own (`setsid`: out of the job's process group), which writes its pid to
        `pidfile` and sleeps; None: the executor runs no such process (the scenario
        `nothing_of_an_ended_attempt_survives` is then skipped)."""
        return None

    def process_alive(self, pid: int) -> bool:
        """Whether process `pid` (a job's daemon) runs where the executor runs jobs; this
        default looks on this host (/proc; a zombie, dead but not reaped, does not run)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def environment_job(self, stack: Stack, spec: JobSpec, quantity: int, dump: Path,
                        asked: dict[str, str]) -> dict[str, Any] | None:  # fmt: skip
        """The `SubmitServiceJob` fields for a job doing `spec` that first writes its whole
        environment, as a JSON object, to `dump`, and whose payload's `Environment` asks for
        `asked`; None: the executor runs nothing whose environment it controls here (the
        scenario `a_jobs_environment_holds_no_credential` is then skipped)."""
        return None

    def close(self) -> None:
        """Stop the executor (SIGTERM) and whatever the target started for it."""


# -- the stack: a nats-server, a scheduler, the executor ------------------------------------------


class Stack:
    """A real nats-server and scheduler in `directory`, for one executor under test and many
    scenarios (each with shares and jobs of its own).  The executor starts with it;
    `prepare` (once) creates the service environment and its job queue."""

    def __init__(self, directory: Path, target: ExecutorUnderTest):
        self.directory = directory
        self.target = target
        self.server = EmbeddedServer(directory / "nats").start()
        self.env = {**os.environ, "QUOTASCHED_NATS_URL": self.server.url,
                    "QUOTASCHED_TICK_INTERVAL_S": "0.5", "QUOTASCHED_LEASE_TTL_S": "3",
                    "QUOTASCHED_EXECUTOR_STATE_DIR": str(directory / "executor-state"),
                    **CANARIES}  # fmt: skip
        self.processes: list[Process] = []
        self.scheduler = self.spawn("scheduler")
        target.start(self)  # meanwhile: it needs neither the scheduler nor the environment yet
        self.prepared = False
        self.scenarios = 0

    @property
    def url(self) -> str:
        return self.server.url

    def spawn(self, *args: str, **extra_env: str) -> Process:
        """`quotasched <args>` in its own process group, logging to the stack's directory."""
        log_path = self.directory / f"{args[0]}-{len(self.processes)}.log"
        process = Process(list(args), {**self.env, **extra_env}, log_path)
        self.processes.append(process)
        return process

    async def prepare(self, bus: Bus) -> None:
        """Once: the scheduler leads, the service environment and the job queue exist, the
        executor (started with the stack) is ready."""
        if self.prepared:
            return
        await eventually(lambda: _async(holder_of(self.scheduler)), WAIT_S, what="scheduler leads")
        capacity = self.target.capacity if self.target.created_capacity is None \
            else self.target.created_capacity  # fmt: skip
        await bus.publish({"kind": "CreateServiceEnvironment",
                           "serviceEnvironmentName": ENVIRONMENT,
                           "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": capacity}]})
        await bus.publish({"kind": "CreateSchedulingPolicy", "name": f"{QUEUE}-sp",
                           "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}})
        await bus.publish({"kind": "CreateJobQueue", "jobQueueName": QUEUE,
                           "schedulingPolicy": f"{QUEUE}-sp",
                           "serviceEnvironmentOrder": [{"order": 1,
                                                        "serviceEnvironment": ENVIRONMENT}]})
        await self.target.ready(self, bus)
        self.prepared = True

    def next_prefix(self, scenario: str) -> str:
        """The next scenario's prefix for its shares and job ids: s<n>-<its first words>."""
        self.scenarios += 1
        return f"s{self.scenarios}-{scenario.replace('_', '-')[:20].strip('-')}"

    def close(self) -> None:
        """SIGTERM everything at once (the executor first), then wait for each."""
        self.target.close()
        for process in reversed(self.processes):
            process.signal(signal.SIGTERM)
        for process in reversed(self.processes):
            process.stop()
        end_jobs_left_in(self.directory)
        self.server.stop()


async def _async(value):
    return value


# -- one scenario's view: its shares, its jobs, what happened ------------------------------------


class Kit:
    """A scenario's shares and jobs on the stack (all named `<prefix>-...`), and the ways to
    act and to look that scenarios use."""

    def __init__(self, stack: Stack, bus: Bus, prefix: str):
        self.stack = stack
        self.target = stack.target
        self.bus = bus
        self.prefix = prefix
        self.routes: dict[str, tuple[str, str]] = {}

    def mine(self, name: str | None) -> bool:
        return bool(name) and name.startswith(f"{self.prefix}-")

    async def setup(self, shares: list[tuple[str, int, bool]]) -> None:
        """The scenario's quota shares: (name, instances, in-share preemption), each RESERVE
        (it neither lends nor borrows, so what runs where is plain)."""
        for name, limit, preemption in shares:
            await self.bus.publish({
                "kind": "CreateQuotaShare", "jobQueue": QUEUE, "quotaShareName": self.share(name),
                "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": limit}],
                "resourceSharingConfiguration": {"strategy": "RESERVE"},
                "preemptionConfiguration": {"inSharePreemption":
                                            "ENABLED" if preemption else "DISABLED"},
            })  # fmt: skip

    def job_id(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def share(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    async def submit(self, name: str, spec: JobSpec, share: str, priority: int = 1,
                     quantity: int = 1, attempts: int | None = None) -> str:  # fmt: skip
        """Submit a job doing `spec` to the scenario's `share`; returns its id."""
        job_id, share = self.job_id(name), self.share(share)
        command = {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": name,
                   "jobQueue": QUEUE, "quotaShareName": share,
                   "schedulingPriority": priority,
                   **self.target.job(self.stack, spec, quantity)}  # fmt: skip
        if attempts is not None:
            command["retryStrategy"] = {"attempts": attempts}
        self.routes[job_id] = (QUEUE, share)
        await self.bus.publish(command)
        return job_id

    async def terminate(self, job_id: str, reason: str) -> None:
        await self.bus.publish({"kind": "TerminateServiceJob", "jobId": job_id, "reason": reason},
                               route=self.routes[job_id])  # fmt: skip

    async def report(self, job_id: str, attempt: int, status: str) -> int:
        """A report as a slow backend would send it late (marked with KIT_REASON); returns
        its command seq."""
        command = {"kind": "ReportJobStatus", "jobId": job_id, "attempt": attempt,
                   "status": status, "statusReason": KIT_REASON}  # fmt: skip
        return await self.bus.publish(command, route=self.routes[job_id])

    # -- looking --------------------------------------------------------------------------------

    async def facts(self) -> list[dict[str, Any]]:
        """The facts about this scenario's jobs, in log order (with `_seq`)."""
        return [f for f in await read_facts(self.bus.js, f"qm.fact.{QUEUE}.*.*")
                if self.mine(f.get("jobId"))]  # fmt: skip

    async def commands(self) -> list[dict[str, Any]]:
        """The commands about this scenario's jobs, in stream order, each with `_seq` and
        `_time` (the bus's wall-clock time in ns)."""
        found = []
        async for msg in read_messages(self.bus.js, f"qm.cmd.{QUEUE}.*.*", stream=COMMANDS_STREAM):
            seq, stamp = sequence_and_time(msg)
            try:
                command = json.loads(msg.data)
            except ValueError:
                continue
            if self.mine(command.get("jobId")):
                command["_seq"], command["_time"] = seq, int(stamp * 1e9)
                found.append(command)
        return found

    def records(self) -> list[Record] | None:
        """The executor's records of this scenario's jobs (None: it keeps none)."""
        records = self.target.records(self.stack)
        if records is None:
            return None
        return [r for r in records if self.mine(r.job_id)]

    async def statuses(self, job_id: str) -> list[tuple[int, str, str]]:
        """(attempt, status, cause) of each JobStatusChanged of the job."""
        return [(f["attempt"], f["status"], f["cause"]) for f in await self.facts()
                if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id]  # fmt: skip

    async def until(self, condition: Callable[[], Awaitable[Any]], what: str,
                    timeout: float = WAIT_S) -> Any:  # fmt: skip
        return await eventually(condition, timeout, what=what)

    async def until_status(self, job_id: str, attempt: int, *statuses: str) -> list[dict]:
        """Until the job's attempt has a JobStatusChanged to one of `statuses`; those facts."""

        async def found():
            return [f for f in await self.facts() if f["kind"] == "JobStatusChanged"
                    and f["jobId"] == job_id and f["attempt"] == attempt
                    and f["status"] in statuses] or None  # fmt: skip

        return await self.until(found, f"{job_id} attempt {attempt} {'/'.join(statuses)}")

    async def until_running(self, job_id: str, attempt: int = 1) -> None:
        """Until the attempt was reported RUNNING (STARTING for a target whose short jobs
        never get there) and, for a target with records, its work has started."""
        wanted = ("RUNNING",) if self.target.reports_running else ("STARTING", "RUNNING")
        await self.until_status(job_id, attempt, *wanted)
        if self.records() is not None:
            await self.until(lambda: _async(self.recorded("start", job_id, attempt)),
                             f"{job_id} attempt {attempt}'s work started")  # fmt: skip

    def recorded(self, event: str, job_id: str, attempt: int) -> Record | None:
        found = [r for r in self.records() or []
                 if (r.event, r.job_id, r.attempt) == (event, job_id, attempt)]  # fmt: skip
        return found[0] if found else None

    async def until_stopped(self, job_id: str, attempt: int) -> None:
        """Until the attempt's work has stopped (records), or, for a target whose records do
        not say, until the attempt would have ended by itself: a report about it would have
        come."""
        if self.records() is None or not self.target.records_stops:
            await asyncio.sleep(self.target.long_s + 0.5)
            return
        await self.until(lambda: _async(self.recorded("stop", job_id, attempt)),
                         f"{job_id} attempt {attempt}'s work stopped")  # fmt: skip

    # -- after the scenario ---------------------------------------------------------------------

    async def show(self) -> None:
        """Print the scenario's facts, the executor's reports and records (for a failure)."""
        for fact in await self.facts():
            print("fact", {k: v for k, v in fact.items() if v is not None and k != "_subject"})
        for command in executor_reports(await self.commands()):
            print("report", command)
        for record in self.records() or []:
            print("record", record)

    async def cleanup(self) -> None:
        """Terminate every job not over yet and wait until it is, and until every attempt's
        work has stopped, so the next scenario finds the environment's capacity free."""
        facts = await self.facts()
        over = {f["jobId"] for f in facts if _ends_job(f)}
        for job_id in [f["jobId"] for f in facts if f["kind"] == "JobSubmitted"]:
            if job_id not in over:
                await self.terminate(job_id, "conformance kit: scenario over")

        async def all_over():
            facts = await self.facts()
            jobs = {f["jobId"] for f in facts if f["kind"] == "JobSubmitted"}
            return jobs <= {f["jobId"] for f in facts if _ends_job(f)}

        await self.until(all_over, "every job of the scenario over")
        if self.records() is not None and self.target.records_stops:
            await self.until(lambda: _async(self._all_stopped()), "every attempt's work stopped")

    def _all_stopped(self) -> bool:
        records = self.records() or []
        stopped = {(r.job_id, r.attempt) for r in records if r.event == "stop"}
        return all((r.job_id, r.attempt) in stopped for r in records if r.event == "start")


def _ends_job(fact: dict[str, Any]) -> bool:
    return (fact["kind"] == "JobStatusChanged" and fact["status"] in ENDED) or (
        fact["kind"] == "JobPreempted" and fact["outcome"] == "FAILED")


# -- the checks after every scenario -----------------------------------------------------------


def executor_reports(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The executor's ReportJobStatus commands (not the kit's own late report)."""
    return [c for c in commands if c.get("kind") == "ReportJobStatus"
            and c.get("statusReason") != KIT_REASON]  # fmt: skip


def scheduler_ends(facts: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    """(job, attempt) -> the command seq whose decision ended the attempt from the scheduler's
    side (the executor stops it on these facts): a preemption, a termination, a time limit, a
    retry or a capacity bounce (the last two decided on the executor's own report, so that
    report carries the very seq)."""
    ends: dict[tuple[str, int], int] = {}
    for fact in facts:
        key = (fact.get("jobId"), fact.get("attempt"))
        if fact["kind"] == "JobPreempted" or (
                fact["kind"] == "JobStatusChanged" and fact["status"] in ("FAILED", "RUNNABLE")
                and fact["cause"] != "REPORTED"):  # fmt: skip
            ends.setdefault(key, fact["commandSeq"])
    return ends


def check_reports(facts: list[dict[str, Any]], commands: list[dict[str, Any]]) -> None:
    """Every report of the executor names an attempt (`attempt`, always sent) that had been
    dispatched before the report, and none comes after the scheduler ended that attempt: a
    preempted or terminated attempt is stopped without a word."""
    dispatched = {(f["jobId"], f["attempt"]): f["commandSeq"] for f in facts
                  if f["kind"] == "JobDispatched"}  # fmt: skip
    ends = scheduler_ends(facts)
    for report in executor_reports(commands):
        key = (report["jobId"], report.get("attempt"))
        assert isinstance(key[1], int), f"a report without its attempt: {report}"
        assert key in dispatched and dispatched[key] < report["_seq"], (
            f"a report about attempt {key}, which was not dispatched before it: {report}")
        assert key not in ends or report["_seq"] <= ends[key], (
            f"a report about attempt {key} after the scheduler ended it "
            f"(command {ends.get(key)}): {report}")


def check_records(records: list[Record] | None, facts: list[dict[str, Any]],
                  commands: list[dict[str, Any]]) -> None:  # fmt: skip
    """Each attempt's work started at most once and only if dispatched; it stopped at most
    once, after it started; a report ending it (SUCCEEDED, FAILED) came after its work had
    stopped, when both say when; an attempt reported SUCCEEDED had its work started (an
    executor reports only about work it ran)."""
    if records is None:
        return
    dispatched = {(f["jobId"], f["attempt"]) for f in facts if f["kind"] == "JobDispatched"}
    seen: dict[tuple[str, str, int], Record] = {}
    for record in records:
        key = (record.event, record.job_id, record.attempt)
        assert key not in seen, f"attempt {key[1:]} has two {record.event} records"
        seen[key] = record
        assert (record.job_id, record.attempt) in dispatched, f"{record}: never dispatched"
    for report in executor_reports(commands):
        if report["status"] == "SUCCEEDED":
            assert ("start", report["jobId"], report["attempt"]) in seen, (
                f"attempt {(report['jobId'], report['attempt'])} reported SUCCEEDED, never started")
    for (event, job_id, attempt), record in seen.items():
        if event != "stop":
            continue
        start = seen.get(("start", job_id, attempt))
        assert start is not None, f"attempt {(job_id, attempt)} stopped but never started"
        if start.ns is not None and record.ns is not None:
            assert start.ns <= record.ns, f"attempt {(job_id, attempt)} stopped before it started"
        for report in executor_reports(commands):
            if (report["jobId"], report["attempt"]) == (job_id, attempt) and \
                    report["status"] in ENDED and record.ns is not None:  # fmt: skip
                assert report["_time"] >= record.ns, (
                    f"attempt {(job_id, attempt)} reported {report['status']} before its work "
                    f"stopped")


def check_preemption_order(records: list[Record] | None, facts: list[dict[str, Any]],
                           commands: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every preempted attempt whose work started had stopped before its preemptor's work
    started, and before the preemptor's first report (its STARTING says it is starting)."""
    if records is None:
        return
    at = {(r.event, r.job_id, r.attempt): r.ns for r in records}
    for fact in facts:
        if fact["kind"] != "JobPreempted" or ("start", fact["jobId"], fact["attempt"]) not in at:
            continue
        victim = (fact["jobId"], fact["attempt"])
        [preemptor] = [f for f in facts if f["kind"] == "JobDispatched"
                       and f["jobId"] == fact["preemptorJobId"] and f["_seq"] > fact["_seq"]][:1]
        assert victim[0] in preemptor["afterPreemptionOf"]
        stopped = at.get(("stop", *victim))
        assert stopped is not None, f"the preempted attempt {victim} never stopped"
        started = at.get(("start", preemptor["jobId"], preemptor["attempt"]))
        assert started is None or stopped < started, (
            f"{preemptor['jobId']} started before its victim {victim} had stopped")
        first = [c for c in executor_reports(commands)
                 if (c["jobId"], c["attempt"]) == (preemptor["jobId"], preemptor["attempt"])]
        assert not first or stopped < first[0]["_time"], (
            f"{preemptor['jobId']} was reported {first[0]['status']} before its victim "
            f"{victim} stopped")


# -- the scenarios ------------------------------------------------------------------------------


def short(fail_attempts: int = 0) -> JobSpec:
    """Half a second, then exit (1 on the first `fail_attempts` attempts)."""
    return JobSpec(0.5, fail_attempts)


def long(target: ExecutorUnderTest) -> JobSpec:
    return JobSpec(target.long_s)


def outlasting(target: ExecutorUnderTest) -> JobSpec:
    """Longer than the kit waits for a long attempt to end by itself (`Kit.until_stopped`)."""
    return JobSpec(target.long_s * 4)


async def runs_and_reports_its_end(kit: Kit) -> None:
    """Protocol: an attempt is reported STARTING and/or RUNNING (in that order), then how it
    ended: SUCCEEDED, or FAILED with a statusReason.  Each report names the attempt.

    By hand: `ok` (share a) runs half a second and exits 0: attempt 1 STARTING, RUNNING,
    SUCCEEDED, all cause REPORTED (an executor whose short jobs never get to RUNNING: STARTING,
    SUCCEEDED).  `bad` (share b) fails: its last status is FAILED (REPORTED) with a reason,
    and, without a retryStrategy, it is never dispatched again."""
    await kit.setup([("a", 2, False), ("b", 1, False)])
    ok = await kit.submit("ok", short(), "a")
    bad = await kit.submit("bad", short(fail_attempts=99), "b")
    await kit.until_status(ok, 1, *ENDED)
    await kit.until_status(bad, 1, *ENDED)
    expected = ["STARTING", "RUNNING", "SUCCEEDED"] if kit.target.reports_running \
        else ["STARTING", "SUCCEEDED"]  # fmt: skip
    assert await kit.statuses(ok) == [(1, status, "REPORTED") for status in expected]
    facts = await kit.facts()
    [failed] = [f for f in facts if f["kind"] == "JobStatusChanged" and f["jobId"] == bad
                and f["status"] == "FAILED"]  # fmt: skip
    assert (failed["attempt"], failed["cause"]) == (1, "REPORTED") and failed["statusReason"]
    dispatched = [f["attempt"] for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == bad]
    assert dispatched == [1]
    if kit.records() is not None:
        assert kit.recorded("start", ok, 1), f"{ok}'s attempt never started"


async def preemptor_starts_after_its_victims_stopped(kit: Kit) -> None:
    """Protocol: a `JobDispatched` with `afterPreemptionOf` starts only once every job listed
    there has stopped; a preempted attempt is stopped at once, without a report.

    By hand: share a holds 2 instances with in-share preemption.  low1 and low2 (priority 1,
    one instance each) run; high (priority 9, two instances) preempts both (IN_SHARE_PRIORITY,
    REQUEUED, no preemptionConfiguration) and is dispatched with afterPreemptionOf [low1,
    low2].  Each victim's work takes STOP_S to stop; high's work starts, and high is reported,
    only after both stopped."""
    await kit.setup([("a", 2, True), ("b", 1, False)])
    victims = [await kit.submit(name, long(kit.target), "a") for name in ("low1", "low2")]
    for victim in victims:
        await kit.until_running(victim)
    high = await kit.submit("high", long(kit.target), "a", priority=9, quantity=2)
    await kit.until_running(high)
    facts = await kit.facts()
    preempted = sorted((f["jobId"], f["attempt"], f["preemptorJobId"], f["reason"], f["outcome"])
                       for f in facts if f["kind"] == "JobPreempted")  # fmt: skip
    assert preempted == [(v, 1, high, "IN_SHARE_PRIORITY", "REQUEUED") for v in victims]
    [dispatch] = [f for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == high]
    assert sorted(dispatch["afterPreemptionOf"]) == victims
    if kit.records() is not None:
        for victim in victims:
            assert kit.recorded("stop", victim, 1), f"{victim} was preempted but never stopped"
    check_preemption_order(kit.records(), facts, await kit.commands())


async def a_late_report_about_a_preempted_attempt_changes_nothing(kit: Kit) -> None:
    """Protocol: a report about an attempt that is not the job's live one is recorded as
    JobReportIgnored and changes nothing; the executor itself never reports about an attempt
    after it was preempted.

    By hand: low (two instances of share a) runs; high (priority 9, two instances) preempts
    it: low is RUNNABLE again (REQUEUED) and cannot run while high does.  The kit then sends
    what a slow backend might: low attempt 1 SUCCEEDED.  The scheduler records
    JobReportIgnored (low, attempt 1, SUCCEEDED) and no JobStatusChanged of low follows: low
    is still RUNNABLE, high still RUNNING.  Once low's work has stopped (or, without records,
    would have ended by itself), the executor has sent nothing about low after the
    preemption, and nothing about an attempt 2 of low."""
    await kit.setup([("a", 2, True), ("b", 1, False)])
    low = await kit.submit("low", long(kit.target), "a", quantity=2)
    await kit.until_running(low)
    high = await kit.submit("high", outlasting(kit.target), "a", priority=9, quantity=2)
    await kit.until_running(high)
    before = await kit.statuses(low)
    seq = await kit.report(low, 1, "SUCCEEDED")

    async def decided():
        return [f for f in await kit.facts() if f["commandSeq"] == seq] or None

    facts = await kit.until(decided, "the late report decided")
    assert [(f["kind"], f["jobId"], f["attempt"], f["status"]) for f in facts] == [
        ("JobReportIgnored", low, 1, "SUCCEEDED")]
    await kit.until_stopped(low, 1)
    assert await kit.statuses(low) == before
    described = await kit.bus.request("describe-service-job", jobId=low)
    assert described["status"] == "RUNNABLE"
    assert (await kit.bus.request("describe-service-job", jobId=high))["status"] == "RUNNING"
    reports = [(c["attempt"], c["status"]) for c in executor_reports(await kit.commands())
               if c["jobId"] == low]  # fmt: skip
    expected = [(1, "STARTING"), (1, "RUNNING")][:2 if kit.target.reports_running else 1]
    assert reports == expected, f"the executor's reports about {low}: {reports}"


async def terminate_stops_the_running_attempt(kit: Kit) -> None:
    """Protocol: a `JobStatusChanged` to FAILED with a cause other than REPORTED (here
    TerminateServiceJob) ends the attempt: the executor stops it and reports nothing more.

    By hand: `job` runs (long); TerminateServiceJob with reason R gives JobStatusChanged
    (attempt 1, FAILED, cause TERMINATED, isTerminated, statusReason R); its work stops
    within the kit's wait, and the executor sends no report about it afterwards (checked after
    the scenario by check_reports)."""
    await kit.setup([("a", 2, False), ("b", 1, False)])
    job_id = await kit.submit("job", long(kit.target), "a")
    await kit.until_running(job_id)
    await kit.terminate(job_id, "cancelled by the conformance kit")
    [ended] = await kit.until_status(job_id, 1, "FAILED")
    assert (ended["cause"], ended["isTerminated"], ended["statusReason"]) == (
        "TERMINATED", True, "cancelled by the conformance kit")
    await kit.until_stopped(job_id, 1)


async def a_failed_attempt_is_retried(kit: Kit) -> None:
    """Protocol: a FAILED report ends the attempt; retryStrategy decides.  With attempts=2,
    the scheduler dispatches attempt 2, which the executor runs as a new attempt.

    By hand: `flaky` (attempts 2) fails its first attempt: JobStatusChanged (1, RUNNABLE,
    RETRY) with the executor's reason, then JobDispatched attempt 2; attempt 2 succeeds
    (SUCCEEDED, REPORTED), or, for an executor that cannot fail only the first attempt, fails
    too (FAILED, REPORTED: no third attempt).  Each attempt's work starts once."""
    await kit.setup([("a", 2, False), ("b", 1, False)])
    flaky = await kit.submit("flaky", short(fail_attempts=1 if kit.target.fails_only_first else 99),
                             "a", attempts=2)  # fmt: skip
    [retried] = await kit.until_status(flaky, 1, "RUNNABLE")
    assert retried["cause"] == "RETRY" and retried["statusReason"]
    await kit.until_status(flaky, 2, *ENDED)
    final = "SUCCEEDED" if kit.target.fails_only_first else "FAILED"
    statuses = await kit.statuses(flaky)
    assert statuses[-1] == (2, final, "REPORTED"), statuses
    facts = await kit.facts()
    assert [f["attempt"] for f in facts if f["kind"] == "JobDispatched"] == [1, 2]
    if kit.records() is not None and kit.target.fails_only_first:
        assert kit.recorded("start", flaky, 1) and kit.recorded("start", flaky, 2)


async def a_killed_executor_ends_what_it_left_and_starts_nothing_twice(kit: Kit) -> None:
    """Protocol (idempotency): an executor SIGKILLed mid-attempt and started again never
    starts that attempt again (its JobDispatched may be delivered again) and reports how it
    ended: FAILED as lost, or as the backend says it ended meanwhile.

    By hand: `lost` (attempts 2) runs; the executor is killed before the attempt ends.
    Restarted, it stops what is left of attempt 1 and reports it: either FAILED
    (then RUNNABLE, RETRY, and attempt 2 is dispatched and reported running by the new
    executor) or, where the backend finished it meanwhile, SUCCEEDED (no attempt 2).  Exactly
    one status change ends attempt 1, and its work started once."""
    await kit.setup([("a", 2, False), ("b", 1, False)])
    lost = await kit.submit("lost", long(kit.target), "a", attempts=2)
    await kit.until_running(lost)
    kit.target.kill()
    before = await kit.statuses(lost)
    kit.target.start(kit.stack)  # before any assertion: the next scenarios need it
    assert not [s for s in before if s[1] in ENDED or s[1] == "RUNNABLE"], (
        "the attempt ended before the executor was killed: make it run longer")
    [ended] = await kit.until_status(lost, 1, "SUCCEEDED", "FAILED", "RUNNABLE")
    statuses = await kit.statuses(lost)
    assert [s for s in statuses if s[0] == 1 and s[1] in ("SUCCEEDED", "FAILED", "RUNNABLE")] == [
        (1, ended["status"], ended["cause"])]
    progress = [c["status"] for c in executor_reports(await kit.commands())
                if c["jobId"] == lost and c["attempt"] == 1 and c["status"] not in ENDED]
    assert len(progress) == len(set(progress)), f"attempt 1 was started again: {progress}"
    if ended["status"] == "RUNNABLE":
        assert ended["cause"] == "RETRY" and ended["statusReason"]
        await kit.until_running(lost, 2)
    else:
        assert ended["status"] == "SUCCEEDED", f"attempt 1 ended {ended}"
    if kit.records() is not None and kit.target.records_stops:
        await kit.until_stopped(lost, 1)  # the new executor stopped what the dead one left


async def a_restart_follows_the_running_attempts(kit: Kit) -> None:
    """Protocol (restarts cost no work): stopping an executor, gracefully or by SIGKILL, does
    not stop its attempts; the executor started again on the same state follows each one to
    its real end, reports nothing twice and starts nothing twice.

    By hand: `kept` (attempts 2) runs; the executor is stopped (SIGTERM) and started again,
    then killed (SIGKILL) and started again.  Attempt 1 is reported STARTING once and RUNNING
    once in all, no attempt 2 is dispatched, and its work started once.  Then, for a target
    with records, TerminateServiceJob: the third executor stops that very work (recorded
    once) and attempt 1 ends FAILED (TERMINATED), once; without records, attempt 1 ends
    SUCCEEDED by itself (REPORTED), once."""
    await kit.setup([("a", 2, False), ("b", 1, False)])
    kept = await kit.submit("kept", long(kit.target), "a", attempts=2)
    await kit.until_running(kept)
    kit.target.stop()
    kit.target.start(kit.stack)
    await asyncio.sleep(1.0)  # the second one has started following it
    kit.target.kill()
    kit.target.start(kit.stack)
    if kit.records() is not None:
        assert not [s for s in await kit.statuses(kept) if s[1] in ENDED or s[1] == "RUNNABLE"], (
            "the attempt ended across the restarts: make it run longer")
        await kit.terminate(kept, "terminated after two restarts")
        [ended] = await kit.until_status(kept, 1, "FAILED")
        assert ended["cause"] == "TERMINATED"
        await kit.until_stopped(kept, 1)
        stops = [r for r in kit.records() if (r.event, r.job_id) == ("stop", kept)]
        assert len(stops) <= 1, f"the work was stopped more than once: {stops}"
    else:
        [ended] = await kit.until_status(kept, 1, "SUCCEEDED")
        assert ended["cause"] == "REPORTED"
    statuses = await kit.statuses(kept)
    assert [s for s in statuses if s[1] in ENDED or s[1] == "RUNNABLE"] == [
        (1, ended["status"], ended["cause"])], statuses
    progress = [c["status"] for c in executor_reports(await kit.commands())
                if c["jobId"] == kept and c["status"] not in ENDED]  # fmt: skip
    assert sorted(progress) == ["RUNNING", "STARTING"], f"reported again or restarted: {progress}"
    if kit.records() is not None:
        starts = [r for r in kit.records() if (r.event, r.job_id) == ("start", kept)]
        assert len(starts) == 1, f"the work started more than once: {starts}"


async def an_attempt_that_cannot_be_placed_is_reported_insufficient_capacity(kit: Kit) -> None:
    """Protocol: INSUFFICIENT_CAPACITY, reported while SCHEDULED or STARTING, puts the job
    back in its queue (RUNNABLE, cause CAPACITY_BOUNCE); the scheduler dispatches it again.

    By hand: share `wide` holds the whole environment; `wide` needs `unplaceable_quantity`
    instances, which the environment has but the backend cannot give one attempt.  Attempts
    1 and 2 are each reported INSUFFICIENT_CAPACITY once, each becomes (n, RUNNABLE,
    CAPACITY_BOUNCE), the next is dispatched; no attempt's work ever starts."""
    quantity = kit.target.unplaceable_quantity
    await kit.setup([("wide", kit.target.capacity, False)])
    wide = await kit.submit("wide", short(), "wide", quantity=quantity)
    for attempt in (1, 2):
        [bounced] = await kit.until_status(wide, attempt, "RUNNABLE")
        assert bounced["cause"] == "CAPACITY_BOUNCE"
    reports = [(c["attempt"], c["status"]) for c in executor_reports(await kit.commands())]
    assert [r for r in reports if r[0] <= 2] == [(1, "INSUFFICIENT_CAPACITY"),
                                                 (2, "INSUFFICIENT_CAPACITY")], reports
    assert not kit.records(), "an attempt that could not be placed was started"


async def nothing_of_an_ended_attempt_survives(kit: Kit) -> None:
    """Protocol (containment): an attempt's end ends everything it started.  A process the job
    left behind (a `setsid` child, a daemon) is no longer alive once the attempt's end is
    reported, nor once an attempt the scheduler ended has stopped: it would hold what the
    attempt held (its GPUs) while the capacity is given to another job.

    By hand: `quits` (share a) starts a setsid child that writes its pid and sleeps, then
    exits 0 after half a second: SUCCEEDED, and that pid is not alive when the kit sees the
    fact.  `stays` (share b) does the same and runs on; TerminateServiceJob ends it (FAILED,
    TERMINATED), and its child's pid is not alive once its work has stopped (at most the
    kit's wait later)."""
    folder = kit.stack.directory
    fields = {name: kit.target.daemon_job(kit.stack, spec, 1, folder / f"{kit.prefix}-{name}.pid")
              for name, spec in (("quits", short()), ("stays", long(kit.target)))}  # fmt: skip
    if None in fields.values():
        pytest.skip(f"{kit.target.name}: it names no job that leaves a daemon (daemon_job)")
    await kit.setup([("a", 1, False), ("b", 1, False)])
    jobs = {}
    for name, share in (("quits", "a"), ("stays", "b")):
        jobs[name] = job_id = kit.job_id(name)
        kit.routes[job_id] = (QUEUE, kit.share(share))
        await kit.bus.publish({"kind": "SubmitServiceJob", "jobId": job_id, "jobName": name,
                               "jobQueue": QUEUE, "quotaShareName": kit.share(share),
                               **fields[name]})  # fmt: skip

    async def daemon(name: str) -> int | None:
        try:
            return int((folder / f"{kit.prefix}-{name}.pid").read_text())
        except (OSError, ValueError):
            return None

    try:
        [ended] = await kit.until_status(jobs["quits"], 1, *ENDED)
        assert ended["status"] == "SUCCEEDED", f"quits ended {ended}"
        pid = await kit.until(lambda: daemon("quits"), "quits's child wrote its pid")
        assert not kit.target.process_alive(pid), (
            f"quits's setsid child {pid} outlived the attempt, reported SUCCEEDED")
        await kit.until_running(jobs["stays"])
        pid = await kit.until(lambda: daemon("stays"), "stays's child wrote its pid")
        assert kit.target.process_alive(pid), "stays's child should run while stays does"
        await kit.terminate(jobs["stays"], "conformance kit: containment")
        await kit.until_status(jobs["stays"], 1, "FAILED")
        await kit.until_stopped(jobs["stays"], 1)
        await kit.until(lambda: _async(not kit.target.process_alive(pid)),
                        f"stays's setsid child {pid} gone after the attempt was terminated")
    finally:  # a failure leaves no daemon behind (on this host: the default process_alive)
        if type(kit.target).process_alive is ExecutorUnderTest.process_alive:
            for name in jobs:
                pid = await daemon(name)
                if pid is not None and kit.target.process_alive(pid):
                    os.kill(pid, signal.SIGKILL)


# Credentials every process of the stack (the executor too) has in its environment: no job
# may see them, under their names or any other (a_jobs_environment_holds_no_credential).  None
# is used by anything: the server has no users, and AWS_SECRET_ACCESS_KEY has no key id.
CANARIES = {"QUOTASCHED_NATS_PASSWORD": "kit-canary-nats-password",
            "AWS_SECRET_ACCESS_KEY": "kit-canary-aws-secret",
            "NATS_CREDS": "/kit-canary/creds/executor.creds",
            "KIT_CREDENTIALS_FILE": "/kit-canary/creds/executor.env"}  # fmt: skip
# The QUOTASCHED_* variables an attempt may have: its own id and number, its containment
# marker (services/executors/contain.py) and its checkpoint directory; none is a credential.
ATTEMPT_VARIABLES = ("QUOTASCHED_JOB_ID", "QUOTASCHED_ATTEMPT", "QUOTASCHED_ATTEMPT_TOKEN",
                     "QUOTASCHED_CHECKPOINT_DIR")  # fmt: skip


async def a_jobs_environment_holds_no_credential(kit: Kit) -> None:
    """Protocol (isolation): a job's environment is built, not inherited.  The executor holds
    the scheduler's keys (its NATS user and password, AWS keys, a credentials file); a job
    holding them could report another team's job FAILED or change the executor's consumer.

    By hand: the executor runs with CANARIES in its environment.  `dump` (share a) writes its
    environment and succeeds; its payload's Environment asks for KIT_ASKED.  The dump holds
    QUOTASCHED_JOB_ID (its id) and QUOTASCHED_ATTEMPT ("1"), and KIT_ASKED as asked; no
    other QUOTASCHED_* variable than ATTEMPT_VARIABLES, no AWS_* nor NATS_* variable, no name
    holding CREDS or CREDENTIAL, and no canary's value under any name."""
    dump = kit.stack.directory / f"{kit.prefix}-env.json"
    asked = {"KIT_ASKED": "asked-by-the-payload"}
    fields = kit.target.environment_job(kit.stack, short(), 1, dump, asked)
    if fields is None:
        pytest.skip(f"{kit.target.name}: it runs nothing whose environment it controls here "
                    "(environment_job)")  # fmt: skip
    await kit.setup([("a", 1, False)])
    job_id = kit.job_id("dump")
    kit.routes[job_id] = (QUEUE, kit.share("a"))
    await kit.bus.publish({"kind": "SubmitServiceJob", "jobId": job_id, "jobName": "dump",
                           "jobQueue": QUEUE, "quotaShareName": kit.share("a"), **fields})
    [ended] = await kit.until_status(job_id, 1, *ENDED)
    assert ended["status"] == "SUCCEEDED", f"dump ended {ended}"
    env = json.loads(dump.read_text())
    assert (env.get("QUOTASCHED_JOB_ID"), env.get("QUOTASCHED_ATTEMPT")) == (job_id, "1"), env
    assert {name: env.get(name) for name in asked} == asked
    leaked = sorted(name for name, value in env.items()
                    if (name.startswith("QUOTASCHED_") and name not in ATTEMPT_VARIABLES)
                    or name.upper().startswith(("AWS_", "NATS_"))
                    or "CREDS" in name.upper() or "CREDENTIAL" in name.upper()
                    or any(canary in value for canary in CANARIES.values()))  # fmt: skip
    assert not leaked, f"the job's environment holds the executor's variables: {leaked}"


SCENARIOS = [
    runs_and_reports_its_end,
    preemptor_starts_after_its_victims_stopped,
    a_late_report_about_a_preempted_attempt_changes_nothing,
    terminate_stops_the_running_attempt,
    a_failed_attempt_is_retried,
    a_killed_executor_ends_what_it_left_and_starts_nothing_twice,
    a_restart_follows_the_running_attempts,
    an_attempt_that_cannot_be_placed_is_reported_insufficient_capacity,
    nothing_of_an_ended_attempt_survives,
    a_jobs_environment_holds_no_credential,
]


def skip_reason(target: type[ExecutorUnderTest] | ExecutorUnderTest, scenario) -> str | None:
    """Why `target` does not take part in `scenario` (None: it does)."""
    if scenario is an_attempt_that_cannot_be_placed_is_reported_insufficient_capacity \
            and target.unplaceable_quantity is None and scenario.__name__ not in target.skips:
        return "the executor names no job it cannot place (unplaceable_quantity)"  # fmt: skip
    if scenario is a_killed_executor_ends_what_it_left_and_starts_nothing_twice \
            and target.follows_restarts:  # fmt: skip
        return "it follows what a killed executor left (a_restart_follows_the_running_attempts)"
    if scenario is a_restart_follows_the_running_attempts and not target.follows_restarts \
            and scenario.__name__ not in target.skips:  # fmt: skip
        return "a restart ends the attempts it left (a_killed_executor_ends_what_it_left...)"
    return target.skips.get(scenario.__name__)


async def run_scenario(stack: Stack, scenario) -> None:
    """Run one scenario with fresh shares on `stack`, then terminate what is left and check
    every report and record of the scenario (check_reports, check_records)."""
    async with Bus(stack.url) as bus:
        await stack.prepare(bus)
        kit = Kit(stack, bus, stack.next_prefix(scenario.__name__))
        try:
            await scenario(kit)
        except BaseException:
            await _quietly(kit.show())  # printed: pytest shows it with the failure
            await _quietly(kit.cleanup())  # for the next scenario; the failure is the news
            raise
        await kit.cleanup()
        facts, commands = await kit.facts(), await kit.commands()
        check_reports(facts, commands)
        check_records(kit.records(), facts, commands)


async def _quietly(step: Awaitable[Any]) -> None:
    try:
        await step
    except Exception:
        pass


def conformance_tests(target: type[ExecutorUnderTest]) -> type:
    """A pytest test class running every scenario against `target`, in `SCENARIOS` order, on
    one stack for the class; each scenario `target` cannot take part in is skipped with its
    reason.  Bind it to a module-level name starting with Test."""
    scenarios = [pytest.param(scenario, id=scenario.__name__,
                              marks=_skipped(skip_reason(target, scenario), target.name))
                 for scenario in SCENARIOS]  # fmt: skip

    class Conformance:
        @pytest.fixture(scope="class")
        @classmethod
        def stack(cls, tmp_path_factory):
            started = Stack(tmp_path_factory.mktemp(target.name), target())
            yield started
            started.close()

        @pytest.mark.parametrize("scenario", scenarios)
        async def test_scenario(self, stack, scenario):
            await run_scenario(stack, scenario)

    Conformance.__name__ = Conformance.__qualname__ = f"Test{target.__name__}"
    return Conformance


def _skipped(reason: str | None, name: str) -> list:
    return [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
