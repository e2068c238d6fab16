"""The independent checker (tests/checker.py) under the queue options beyond AWS
(SetJobQueueOptions): rule 6 orders borrowers by (group rank, D(now) / weight, acceptance),
rule 10 holds a borrowing dispatch to its share group's maxCapacity.

Every expectation is worked out by hand from the rules (the brief's formulas: D(t) = C[k] +
C[k-1]/2 + ..., periods of H seconds from time 0).  Two kinds of test: the core's decisions
pass the checker (the Cluster runs it after every command), and logs that break a rule are
refused, whether written by hand or by the real core with one rule patched out (run in a
subprocess on the pure-Python core: a compiled core's calls cannot be patched).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.builders import Cluster, dispatched_ids
from tests.checker import RuleBroken, check_log
from tests.scenarios.test_independent_checker import Log

ROOT = Path(__file__).resolve().parents[2]

# a and b own one instance each and may borrow the lender l's
SHARES = """
c.environment(g5={environment})
c.queue()
c.share("a", "LEND_AND_BORROW", g5=1)
c.share("b", "LEND_AND_BORROW", g5=1)
c.share("l", "LEND", g5={lent})
"""

# a borrowed one instance for 50 s, b nothing: under FAIR_SHARE b2 goes before a3, which
# FIFO would serve first (a3 was accepted at 10, b2 at 11)
FAIR_STORY = SHARES.format(environment=4, lent=2) + """
c.queue_options(idleResourceAssignmentStrategy="FAIR_SHARE", fairShare={"halfLifeSeconds": 100})
c.submit("a1", "a", at=0); c.submit("a2", "a", at=0); c.submit("b1", "b", at=0)
c.submit("l1", "l", at=5)
c.submit("a3", "a", at=10); c.submit("b2", "b", at=11)
c.at = 50
c.finish("a2")
"""

# group g = {a, b} may hold 3 g5 when a member borrows: a1 + a2 (borrowed) + b1 (b's own) fill
# it, so b2, which would borrow l's idle instance, waits until a2 ends
CAP_STORY = SHARES.format(environment=8, lent=4) + """
c.queue_options(shareGroups=[{"name": "g", "quotaShareNames": ["a", "b"],
                              "maxCapacity": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}]}])
c.submit("a1", "a"); c.submit("a2", "a"); c.submit("b1", "b"); c.submit("b2", "b")
c.at = 20
c.finish("a2")
"""


def _run(story: str) -> Cluster:
    """Play a story on the real core; the Cluster checks every command (checker included)."""
    c = Cluster()
    exec(story, {"c": c})  # noqa: S102 - the stories above, nothing else
    return c


def _patched_core_log(patch: str, story: str) -> list[dict]:
    """The wire facts of `story` decided by the pure-Python core with `patch` applied (no
    checker inside: the test feeds the log to one)."""
    script = textwrap.dedent(patch) + textwrap.dedent("""
        from tests.builders import Cluster
        c = Cluster(check_purity=False, independent=False)
    """) + story + textwrap.dedent("""
        import json
        for fact in c.facts:
            print(json.dumps(fact.model_dump(by_alias=True, mode="json")))
    """)  # fmt: skip
    env = {**os.environ, "QUOTASCHED_PURE_PYTHON": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _dispatched(log: list[dict]) -> list[tuple[str, float]]:
    return [(fact["jobId"], fact["at"]) for fact in log if fact["kind"] == "JobDispatched"]


# -- the core's decisions pass --------------------------------------------------------------------


def test_fair_share_serves_the_share_that_borrowed_less_first():
    c = _run(FAIR_STORY.replace('c.finish("a2")', ""))
    assert c.status("a3") == c.status("b2") == "RUNNABLE"
    # a's charge: 1 instance beyond its limit from 0 to 50 = 50; b's: 0.  D/weight 0 < 50.
    assert dispatched_ids(c.finish("a2")) == ["b2"]


def test_a_borrower_held_back_by_its_group_cap_waits_and_is_not_left_waiting():
    c = _run(CAP_STORY.replace('c.finish("a2")', ""))
    assert c.status("b2") == "RUNNABLE"  # fits but for the cap: rules 7 and 10 agree
    assert dispatched_ids(c.finish("a2")) == ["b2"]  # the group holds a1, b1, b2: 3


# -- the real core, with one rule patched out, is caught ------------------------------------------


def test_checker_refuses_a_core_that_serves_borrowers_fifo_under_fair_share():
    log = _patched_core_log("""
        from quotasched.services.scheduler.core import passes
        passes.borrower_key = lambda queue, now: lambda pair: (pair[1].seq, pair[0].name)
    """, FAIR_STORY)  # fmt: skip
    assert ("a3", 50.0) in _dispatched(log)  # the patch took: FIFO chose a3
    with pytest.raises(RuleBroken) as caught:
        check_log(log)
    message = str(caught.value)
    assert "rule 6 (borrower order): borrower a3 of a" in message and "b2 of b" in message
    assert "decayed borrowing per weight is lower, 0 < 50 (FAIR_SHARE)" in message


def test_checker_refuses_a_core_that_ignores_the_group_cap():
    log = _patched_core_log("""
        from quotasched.services.scheduler.core.accounting import Scratch
        Scratch._group_fits = lambda self, share, unit, quantity, into: True
    """, CAP_STORY)  # fmt: skip
    assert ("b2", 0.0) in _dispatched(log)  # the patch took: b2 went past the cap at once
    with pytest.raises(RuleBroken) as caught:
        check_log(log)
    assert "rule 10 (group cap): b2 of b borrows ml.g5.xlarge and takes group g to 4" in str(caught.value)


# -- hand-written logs ----------------------------------------------------------------------------


def _at(log: Log, t: float, *facts: dict) -> None:
    log.command(*({**fact, "at": float(t)} for fact in facts))


def _options(**options) -> dict:
    return {"kind": "JobQueueOptionsSet", "jobQueue": "q", "optionsVersion": 1, "options": options}


def _fair(weights: dict[str, int] | None = None) -> dict:
    fair: dict = {"halfLifeSeconds": 100}
    if weights:
        fair["weights"] = [{"quotaShareName": name, "weight": w} for name, w in weights.items()]
    return _options(idleResourceAssignmentStrategy="FAIR_SHARE", fairShare=fair)


def _two_borrowers(options: dict, history: bool) -> Log:
    """a, b LEND_AND_BORROW 1 and l LEND 1 (SE 10; a1, b1 fill a's and b's own limits).
    With `history`: a borrows l's instance over [10, 60) (C_a[0] = 50), b over [210, 225)
    (C_b[2] = 15).  l1 takes l's instance at 240; b3 (accepted first) and a3 wait as
    borrowers; l1 ends at 260 (period 2), freeing one instance for one of them: the log's
    last command, still without its dispatch."""
    log = Log(se=10)
    for name, strategy in (("a", "LEND_AND_BORROW"), ("b", "LEND_AND_BORROW"), ("l", "LEND")):
        log.share(name, strategy, 1)
    _at(log, 10, options, log.submitted("a1", "a"), log.dispatched("a1", "a"),
        log.submitted("b1", "b"), log.dispatched("b1", "b"))  # fmt: skip
    if history:
        _at(log, 10, log.submitted("a2", "a"), log.dispatched("a2", "a", borrowed=1))
        _at(log, 60, log.finished("a2"))
        _at(log, 210, log.submitted("b2", "b"), log.dispatched("b2", "b", borrowed=1))
        _at(log, 225, log.finished("b2"))
    _at(log, 240, log.submitted("l1", "l"), log.dispatched("l1", "l"))
    _at(log, 250, log.submitted("b3", "b"))
    _at(log, 251, log.submitted("a3", "a"))
    return log


def _serve(log: Log, job: str) -> Log:
    _at(log, 260, log.finished("l1"), log.dispatched(job, job[0], borrowed=1))
    return log


def _passes(log: Log) -> None:
    check_log([fact for facts in log.commands for fact in facts])


@pytest.mark.parametrize("weights, right, wrong, values", [
    # D(260) in period 2: a 50 / 4 = 12.5 (halved twice), b 15: a3 first, though b3 came first
    # and b borrowed less in all (without halving b would go first)
    (None, "a3", "b3", "12.5 < 15"),
    # b weighs 2: 15 / 2 = 7.5 < 12.5
    ({"b": 2}, "b3", "a3", "7.5 < 12.5"),
])  # fmt: skip
def test_checker_orders_borrowers_by_decayed_charge_per_weight(weights, right, wrong, values):
    _passes(_serve(_two_borrowers(_fair(weights), history=True), right))
    message = _serve(_two_borrowers(_fair(weights), history=True), wrong).broken()
    assert f"rule 6 (borrower order): borrower {wrong}" in message
    assert f"{values} (FAIR_SHARE)" in message


def test_checker_keeps_fifo_between_shares_that_never_borrowed_under_fair_share():
    _passes(_serve(_two_borrowers(_fair(), history=False), "b3"))
    message = _serve(_two_borrowers(_fair(), history=False), "a3").broken()
    assert "FIFO, it was accepted first and the charges are equal" in message


def test_checker_serves_first_a_borrower_its_own_group_lends_to():
    # g = {a, l}: l's idle instance covers all a3 borrows, so a3 (rank 0) goes before b3
    group = _options(shareGroups=[{"name": "g", "quotaShareNames": ["a", "l"]}])
    _passes(_serve(_two_borrowers(group, history=False), "a3"))
    message = _serve(_two_borrowers(group, history=False), "b3").broken()
    assert "rule 6 (borrower order): borrower b3" in message
    assert "its group g lends all it borrows (group rank)" in message


def test_checker_holds_a_borrowing_dispatch_to_the_group_cap():
    # g = {a, b} may hold 2 when a member borrows: a1 + b1 fill it, so when l1 ends nobody may
    # borrow l's instance; leaving b3 and a3 waiting is right (not "left waiting", rule 7)
    cap = _options(shareGroups=[{"name": "g", "quotaShareNames": ["a", "b"],
                                 "maxCapacity": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 2}]}])  # fmt: skip
    log = _two_borrowers(cap, history=False)
    _at(log, 260, log.finished("l1"))
    _passes(log)
    message = _serve(_two_borrowers(cap, history=False), "b3").broken()
    assert "rule 10 (group cap): b3 of b borrows ml.g5.xlarge and takes group g to 3" in message
    assert "over its maxCapacity 2" in message
