"""Small builders for scenario tests: a `Cluster` drives the real core command by command.

Every command goes through the same path as production input (JSON -> `decode_command` ->
`step`), and after every command the cluster checks all invariants: `check_state`, the
`DecisionAuditor` over the emitted facts, `check_stable`, `decide` purity (the pure
`decide` gives the same facts and leaves the state untouched), and the independent checker of
tests/checker.py over the command's facts alone (its own model and arithmetic, nothing of the
core's).

    c = Cluster.notebook()            # fixture N of the spec
    c.submit("high", "qs1", priority=3)
    assert c.status("high") == "SCHEDULED"
"""

from __future__ import annotations

import json
from typing import Any

from quotasched.events import facts as F
from quotasched.events.codec import decode_command, encode
from quotasched.services.scheduler.core import State, decide, step, state_document
from quotasched.services.scheduler.core.invariants import DecisionAuditor, check_stable, check_state
from tests.checker import IndependentChecker

G5 = "ml.g5.xlarge"
M5 = "ml.m5.xlarge"
M5L = "ml.m5.large"


class InvariantBroken(AssertionError):
    pass


class Cluster:
    def __init__(self, *, check_purity: bool = True, independent: bool = True) -> None:
        self.state = State()
        self.seq = 0
        self.at = 0.0
        self.facts: list[F.Fact] = []
        self.auditor = DecisionAuditor()
        self.check_purity = check_purity
        # The rules checked again over the facts alone, by code that shares nothing with the
        # core (tests/checker.py); off only for a caller that feeds its own checker.
        self.independent = IndependentChecker() if independent else None

    # -- raw commands ------------------------------------------------------------------------

    def command(self, kind: str, **fields: Any) -> list[F.Fact]:
        fields.setdefault("at", self.at)
        self.at = fields["at"]
        return self.send(json.dumps({"kind": kind, **fields}))

    def send(self, line: str) -> list[F.Fact]:
        self.seq += 1
        command = decode_command(line)
        if self.check_purity:
            before = json.dumps(state_document(self.state), sort_keys=True)
            expected = [encode(fact) for fact in decide(self.state, command, self.seq)]
            after = json.dumps(state_document(self.state), sort_keys=True)
            if before != after:
                raise InvariantBroken(f"decide() changed the state on {line}")
        facts = step(self.state, command, self.seq)
        if self.check_purity and [encode(fact) for fact in facts] != expected:
            raise InvariantBroken(f"decide() and step() disagree on {line}")
        self.facts.extend(facts)
        for fact in facts:
            self.auditor.feed(fact)
        problems = check_state(self.state) + self.auditor.problems
        leftover = check_stable(self.state)
        if leftover:
            problems.append(f"pass stopped early; a full pass would emit {leftover}")
        if self.independent is not None:
            wire = [fact.model_dump(by_alias=True, mode="json") for fact in facts]
            problems += self.independent.feed_command(wire)
        if problems:
            raise InvariantBroken("; ".join(problems))
        return facts

    # -- configuration -----------------------------------------------------------------------

    def environment(self, name: str = "se", **capacity: int) -> list[F.Fact]:
        return self.command(
            "CreateServiceEnvironment", serviceEnvironmentName=name,
            capacityLimits=[{"capacityUnit": _unit(u), "maxCapacity": n} for u, n in capacity.items()],
        )  # fmt: skip

    def queue(self, name: str = "q", environment: str = "se", **extra: Any) -> list[F.Fact]:
        if "sp" not in self.state.policies:
            self.command("CreateSchedulingPolicy", name="sp",
                         quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"})  # fmt: skip
        return self.command(
            "CreateJobQueue", jobQueueName=name, schedulingPolicy="sp",
            serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": environment}], **extra,
        )  # fmt: skip

    def share(self, name: str, strategy: str = "RESERVE", *, borrow: int | None = None,
              in_share: bool = False, queue: str = "q", **limits: int) -> list[F.Fact]:  # fmt: skip
        sharing: dict[str, Any] = {"strategy": strategy}
        if borrow is not None:
            sharing["borrowLimit"] = borrow
        return self.command(
            "CreateQuotaShare", jobQueue=queue, quotaShareName=name,
            capacityLimits=[{"capacityUnit": _unit(u), "maxCapacity": n} for u, n in limits.items()],
            resourceSharingConfiguration=sharing,
            preemptionConfiguration={"inSharePreemption": "ENABLED" if in_share else "DISABLED"},
        )  # fmt: skip

    def update_share(self, name: str, queue: str = "q", **fields: Any) -> list[F.Fact]:
        return self.command("UpdateQuotaShare", jobQueue=queue, quotaShareName=name, **fields)

    def options(self, name: str, queue: str = "q", at: float | None = None,
                **options: Any) -> list[F.Fact]:  # fmt: skip
        """SetQuotaShareOptions (beyond AWS): options as wire names, e.g.
        minRuntimeBeforePreemptionSeconds=600, preemptionBudget={...}; none: all off."""
        return self.command("SetQuotaShareOptions", jobQueue=queue, quotaShareName=name,
                            options=options, at=self.at if at is None else at)  # fmt: skip

    def queue_options(self, queue: str = "q", at: float | None = None,
                      **options: Any) -> list[F.Fact]:  # fmt: skip
        """SetJobQueueOptions (beyond AWS): options as wire names, e.g.
        idleResourceAssignmentStrategy="FAIR_SHARE", fairShare={...}; none: all off."""
        return self.command("SetJobQueueOptions", jobQueue=queue, options=options,
                            at=self.at if at is None else at)  # fmt: skip

    @classmethod
    def notebook(cls) -> Cluster:
        """Fixture N: SE of 3 ml.g5.xlarge; qs1 LEND_AND_BORROW 1 (borrow 200 %, in-share on),
        qs2 LEND 1, qs3 RESERVE 1."""
        cluster = cls()
        cluster.environment(g5=3)
        cluster.queue()
        cluster.share("qs1", "LEND_AND_BORROW", borrow=200, in_share=True, g5=1)
        cluster.share("qs2", "LEND", g5=1)
        cluster.share("qs3", "RESERVE", g5=1)
        return cluster

    # -- jobs --------------------------------------------------------------------------------

    def submit(self, job_id: str, share: str, priority: int = 0, n: int = 1, unit: str = "g5",
               queue: str = "q", **extra: Any) -> list[F.Fact]:  # fmt: skip
        return self.command(
            "SubmitServiceJob", jobId=job_id, jobName=job_id, jobQueue=queue,
            quotaShareName=share, schedulingPriority=priority,
            capacityUsage=[{"capacityUnit": _unit(unit), "quantity": n}], **extra,
        )  # fmt: skip

    def report(self, job_id: str, status: str, **extra: Any) -> list[F.Fact]:
        return self.command("ReportJobStatus", jobId=job_id, status=status, **extra)

    def finish(self, job_id: str, status: str = "SUCCEEDED") -> list[F.Fact]:
        return self.report(job_id, status, attempt=self.state.jobs[job_id].attempt)

    def prioritize(self, job_id: str, priority: int) -> list[F.Fact]:
        return self.command("UpdateServiceJob", jobId=job_id, schedulingPriority=priority)

    def terminate(self, job_id: str, reason: str = "stopped by test") -> list[F.Fact]:
        return self.command("TerminateServiceJob", jobId=job_id, reason=reason)

    def tick(self, at: float) -> list[F.Fact]:
        return self.command("Tick", at=at)

    # -- reads -------------------------------------------------------------------------------

    def status(self, job_id: str) -> str:
        return self.state.jobs[job_id].status.value

    def job(self, job_id: str) -> dict[str, Any]:
        return state_document(self.state)["jobs"][job_id]

    def usage(self, share: str, unit: str = "g5", queue: str = "q") -> int:
        return self.state.queues[queue].shares[share].usage.get(_unit(unit), 0)

    def total(self, unit: str = "g5", queue: str = "q") -> int:
        return self.state.queues[queue].usage.get(_unit(unit), 0)

    def dispatched(self) -> set[str]:
        return {job_id for job_id, job in self.state.jobs.items() if job.status.dispatched}


def kinds(facts: list[F.Fact]) -> list[str]:
    return [fact.kind for fact in facts]


def of_kind(facts: list[F.Fact], kind: type) -> list:
    return [fact for fact in facts if isinstance(fact, kind)]


# -- small readers over facts ----------------------------------------------------------------


def only(facts: list[F.Fact], kind: type):
    found = of_kind(facts, kind)
    assert len(found) == 1, f"expected exactly one {kind.__name__}, got {kinds(facts)}"
    return found[0]


def dispatch_of(facts: list[F.Fact], job_id: str) -> F.JobDispatched:
    found = [fact for fact in of_kind(facts, F.JobDispatched) if fact.job_id == job_id]
    assert len(found) == 1, f"expected one dispatch of {job_id}, got {kinds(facts)}"
    return found[0]


def dispatched_ids(facts: list[F.Fact]) -> list[str]:
    return [fact.job_id for fact in of_kind(facts, F.JobDispatched)]


def preempted_ids(facts: list[F.Fact]) -> list[str]:
    return [fact.job_id for fact in of_kind(facts, F.JobPreempted)]


def borrowed(fact: F.JobDispatched) -> dict[str, int]:
    return {item.capacity_unit: item.quantity for item in fact.borrowed}


def changes_of(facts: list[F.Fact], job_id: str) -> list[F.JobStatusChanged]:
    return [fact for fact in of_kind(facts, F.JobStatusChanged) if fact.job_id == job_id]


_UNITS = {"g5": G5, "m5": M5, "m5l": M5L}


def _unit(alias: str) -> str:
    return _UNITS.get(alias, alias)
