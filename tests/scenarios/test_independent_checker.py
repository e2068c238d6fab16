"""The independent checker (tests/checker.py) fails when a rule is broken, and a scenario
that only it guards.

Every scenario already runs the checker after each command (tests/builders.py); these tests
show it refusing logs that break one rule each, as a broken scheduler could write them (a
borrow ceiling rounded up, a RESERVE share lending, a wrong `borrowed`, a job left waiting
that fits, a later borrower served first, a requeued job losing its place, a victim set that
is not minimal, a finished job dispatched again), and drive the core through a victim search
whose fill-back matters (ruling 10), which only a minimality check catches when it is skipped.
"""

from __future__ import annotations

import pytest

from tests.builders import G5, Cluster, dispatch_of, preempted_ids
from tests.checker import IndependentChecker, RuleBroken


def test_ruling10_in_share_preemption_gives_back_a_victim_it_turns_out_not_to_need():
    c = Cluster()
    c.environment(g5=5)
    c.queue()
    c.share("S", "RESERVE", in_share=True, g5=5)
    c.submit("x", "S", priority=1, n=1)
    c.submit("y", "S", priority=2, n=2)
    c.submit("z", "S", priority=3, n=2)
    # h needs 4: taking x (1), y (2) and z (2) in rank order frees 5; without x, y and z free
    # 4, enough, so x is given back.  No single job frees 4, so two victims remain.
    facts = c.submit("h", "S", priority=9, n=4)
    assert preempted_ids(facts) == ["y", "z"]
    assert dispatch_of(facts, "h").after_preemption_of == ["y", "z"]
    assert c.dispatched() == {"x", "h"}


# -- hand-written logs that break one rule each ------------------------------------------------
#
# Each log is the facts a broken scheduler could have written; the checker must name the rule.


class Log:
    """Writes facts command by command (one commandSeq each), as the wire spells them."""

    def __init__(self, se: int) -> None:
        self.seq = 0
        self.commands: list[list[dict]] = []
        self.command({"kind": "ServiceEnvironmentCreated", "serviceEnvironment": "se",
                      "capacityLimits": [{"capacityUnit": G5, "maxCapacity": se}], "state": "ENABLED"},
                     {"kind": "JobQueueCreated", "jobQueue": "q", "serviceEnvironment": "se",
                      "schedulingPolicy": "sp", "priority": 1, "state": "ENABLED",
                      "jobStateTimeLimitActions": []})  # fmt: skip

    def command(self, *facts: dict) -> None:
        self.seq += 1
        self.commands.append([{"at": float(self.seq), "commandSeq": self.seq, **f} for f in facts])

    def share(self, name: str, strategy: str, limit: int, borrow: int | None = None, in_share=False) -> None:
        self.command({"kind": "QuotaShareCreated", "jobQueue": "q", "quotaShareName": name,
                      "capacityLimits": [{"capacityUnit": G5, "maxCapacity": limit}],
                      "resourceSharingConfiguration": {"strategy": strategy, "borrowLimit": borrow},
                      "preemptionConfiguration": {"inSharePreemption": "ENABLED" if in_share else "DISABLED"},
                      "state": "ENABLED"})  # fmt: skip

    @staticmethod
    def submitted(job: str, share: str, priority: int = 0) -> dict:
        return {"kind": "JobSubmitted", "jobId": job, "jobName": job, "jobQueue": "q",
                "quotaShareName": share, "schedulingPriority": priority,
                "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip

    @staticmethod
    def dispatched(job: str, share: str, borrowed: int = 0, attempt: int = 1, victims=()) -> dict:
        return {"kind": "JobDispatched", "jobId": job, "attempt": attempt, "jobQueue": "q",
                "quotaShareName": share, "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
                "borrowed": [{"capacityUnit": G5, "quantity": borrowed}] if borrowed else [],
                "afterPreemptionOf": list(victims)}  # fmt: skip

    @staticmethod
    def preempted(job: str, share: str, by: str) -> dict:
        return {"kind": "JobPreempted", "jobId": job, "attempt": 1, "jobQueue": "q",
                "quotaShareName": share, "preemptorJobId": by, "reason": "IN_SHARE_PRIORITY",
                "outcome": "REQUEUED", "preemptedAttemptCount": 1}  # fmt: skip

    @staticmethod
    def finished(job: str, attempt: int = 1) -> dict:
        return {"kind": "JobStatusChanged", "jobId": job, "attempt": attempt, "status": "SUCCEEDED",
                "statusReason": None, "cause": "REPORTED", "isTerminated": False}  # fmt: skip

    def broken(self) -> str:
        """The checker's complaint about the last command (every earlier one must pass)."""
        checker = IndependentChecker()
        for facts in self.commands[:-1]:
            checker.check_command(facts)
        with pytest.raises(RuleBroken) as caught:
            checker.check_command(self.commands[-1])
        return str(caught.value)


def test_checker_catches_a_borrow_ceiling_rounded_up():
    log = Log(se=6)
    log.share("A", "LEND_AND_BORROW", 3, borrow=50)  # 1.5 rounds down: at most 3 + 1
    log.share("B", "LEND", 3)
    for index in range(4):
        job = f"a{index}"
        log.command(log.submitted(job, "A"), log.dispatched(job, "A", borrowed=int(index == 3)))
    log.command(log.submitted("a4", "A"), log.dispatched("a4", "A", borrowed=1))
    assert "borrow ceiling 1" in log.broken()


@pytest.mark.parametrize("lender, recorded, complaint", [
    ("RESERVE", 1, "unbacked"),  # a RESERVE share's idle instance is never lent (ruling 2)
    ("LEND", 0, "records borrowed"),  # backed by a LEND share, but the dispatch hides it
])  # fmt: skip
def test_checker_catches_a_reserve_share_lending_and_a_wrong_borrowed_amount(lender, recorded, complaint):
    log = Log(se=2)
    log.share("A", "LEND_AND_BORROW", 1)
    log.share("L", lender, 1)
    log.command(log.submitted("a1", "A"), log.dispatched("a1", "A"))
    log.command(log.submitted("a2", "A"), log.dispatched("a2", "A", borrowed=recorded))
    assert complaint in log.broken()


def test_checker_catches_a_job_left_waiting_that_fits():
    log = Log(se=2)
    log.share("A", "RESERVE", 2)
    log.command(log.submitted("a1", "A"))
    assert "left waiting" in log.broken()


def test_checker_catches_a_later_borrower_served_first():
    log = Log(se=4)
    log.share("A", "LEND_AND_BORROW", 1)
    log.share("C", "LEND_AND_BORROW", 1)
    log.share("B", "LEND", 2)
    for job, share in (("a1", "A"), ("c1", "C"), ("b1", "B"), ("b2", "B")):
        log.command(log.submitted(job, share), log.dispatched(job, share))
    log.command(log.submitted("a2", "A"))  # a borrower, no idle lendable capacity: waits
    log.command(log.submitted("c2", "C"))  # a later borrower: waits
    log.command(log.finished("b1"), log.dispatched("c2", "C", borrowed=1))  # a2 came first
    assert "FIFO" in log.broken()


def test_checker_catches_a_requeued_job_losing_its_place():
    log = Log(se=1)
    log.share("S", "RESERVE", 1, in_share=True)
    log.command(log.submitted("a", "S", priority=1), log.dispatched("a", "S"))
    log.command(log.submitted("b", "S", priority=1))
    log.command(log.submitted("h", "S", priority=5), log.preempted("a", "S", by="h"),
                log.dispatched("h", "S", victims=["a"]))  # fmt: skip
    log.command(log.finished("h"), log.dispatched("b", "S"))  # a was accepted before b
    assert "ahead of its share's head a" in log.broken()


def test_checker_catches_a_victim_set_that_is_not_minimal():
    log = Log(se=2)
    log.share("S", "RESERVE", 2, in_share=True)
    log.command(log.submitted("x", "S", priority=1), log.dispatched("x", "S"))
    log.command(log.submitted("y", "S", priority=2), log.dispatched("y", "S"))
    log.command(log.submitted("h", "S", priority=9), log.preempted("x", "S", by="h"),
                log.preempted("y", "S", by="h"), log.dispatched("h", "S", victims=["x", "y"]))  # fmt: skip
    assert "not minimal" in log.broken()


def test_checker_catches_a_finished_job_dispatched_again():
    log = Log(se=1)
    log.share("S", "RESERVE", 1)
    log.command(log.submitted("a", "S"), log.dispatched("a", "S"))
    log.command(log.finished("a"), log.dispatched("a", "S", attempt=2))
    assert "dispatched while SUCCEEDED" in log.broken()
