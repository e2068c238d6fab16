"""A job queue's options beyond AWS (SetJobQueueOptions) in the projection: the
JobQueueOptionsSet fact is kept in `facts` like every fact, every check accepts it (whatever
the batch boundaries, from a file too), and the tables hold the decisions it led to.  Expected
values by hand.

se holds 3 ml.g5.xlarge; a and b (LEND_AND_BORROW 1 each) and c (LEND 1).  At t=0 the queue
turns on FAIR_SHARE (half-life 1000 s) and puts b and c in group dept (at most 3 instances).
a1 and b1 run on their own quota from t=0; a2 borrows c's idle instance from t=10.  a3 (t=20)
and b2 (t=21) wait to borrow: the environment is full.  a2 ends at t=50: a has borrowed 40
instance-s, b none, and b's group member c has the idle instance b2 would borrow, so both
rules put b2 first (first come, first served would have taken a3): b2 runs from t=50,
borrowing 1, and a3 still waits.  At t=60 the options are turned off ({}).
"""

from __future__ import annotations

import json

import pytest

from quotasched.projections.store import FactNotApplicable
from tests.projections.helpers import (
    G5,
    command,
    facts_of,
    project,
    report,
    rows,
    setup,
    share,
    submit,
    write_facts,
)

OPTIONS = {"idleResourceAssignmentStrategy": "FAIR_SHARE",
           "fairShare": {"halfLifeSeconds": 1000, "weights": [{"quotaShareName": "a", "weight": 1}]},
           "shareGroups": [{"name": "dept", "quotaShareNames": ["b", "c"],
                            "maxCapacity": [{"capacityUnit": G5, "maxCapacity": 3}]}]}  # fmt: skip


def commands() -> list[dict]:
    shares = [share("a", 1, "LEND_AND_BORROW"), share("b", 1, "LEND_AND_BORROW"), share("c", 1, "LEND")]
    return [
        *setup({G5: 3}, shares),
        command("SetJobQueueOptions", 0, jobQueue="q", optionsVersion=1, options=OPTIONS),
        submit(0, "a1", "a"), submit(0, "b1", "b"), submit(10, "a2", "a"),
        submit(20, "a3", "a"), submit(21, "b2", "b"),
        report(50, "a2", "SUCCEEDED", attempt=1),
        command("SetJobQueueOptions", 60, jobQueue="q", options={}),
    ]


@pytest.fixture(scope="module")
def facts(tmp_path_factory) -> list[str]:
    """The facts of the command file, replayed through the decision core."""
    path = tmp_path_factory.mktemp("queue-options") / "commands.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in commands()))
    with open(path) as handle:
        return facts_of(list(handle))


@pytest.mark.parametrize("batch", [1, 4, None])
def test_every_check_accepts_the_queue_options_at_any_batch_boundary(facts, batch):
    projection = project(facts, batch=batch)
    try:
        assert projection.position() == len(facts)
        stored = rows(projection.con, """SELECT "at", job_queue, quota_share, body FROM facts
                                         WHERE kind = 'JobQueueOptionsSet' ORDER BY seq""")
    finally:
        projection.close()
    assert [(at, queue, share) for at, queue, share, _ in stored] == [(0.0, "q", None), (60.0, "q", None)]
    first, last = (json.loads(body) for *_, body in stored)
    assert first["optionsVersion"] == 1 and first["options"]["fairShare"]["halfLifeSeconds"] == 1000
    assert first["options"]["shareGroups"][0]["quotaShareNames"] == ["b", "c"]
    assert last["options"]["idleResourceAssignmentStrategy"] == "FIFO"
    assert last["options"]["fairShare"] is None and last["options"]["shareGroups"] is None


def test_a_fact_file_with_queue_options_projects(facts, tmp_path):
    projection = project([])
    try:
        projection.apply_file(str(write_facts(tmp_path / "facts.jsonl", facts)))
        assert projection.position() == len(facts)
        kinds = rows(projection.con, "SELECT count(*) FROM facts WHERE kind = 'JobQueueOptionsSet'")
    finally:
        projection.close()
    assert kinds == [(2,)]


def test_the_tables_hold_the_fair_share_decision(facts):
    projection = project(facts)
    try:
        con = projection.con
        started = rows(con, """SELECT job_id, start_at, borrowed FROM allocations
                               WHERE job_id IN ('a2', 'b2') ORDER BY start_at""")
        waiting = rows(con, "SELECT status FROM jobs WHERE job_id = 'a3'")
        b_usage = rows(con, """SELECT "at", in_use, borrowed FROM share_usage
                               WHERE quota_share = 'b' AND "at" >= 50 ORDER BY seq""")
    finally:
        projection.close()
    assert started == [("a2", 10.0, 1), ("b2", 50.0, 1)]
    assert waiting == [("RUNNABLE",)]
    assert b_usage[0] == (50.0, 2, 1)


def test_a_queue_options_fact_without_its_job_queue_is_refused(facts):
    index = next(i for i, fact in enumerate(facts) if json.loads(fact)["kind"] == "JobQueueOptionsSet")
    broken = json.loads(facts[index])
    del broken["jobQueue"]
    projection = project(facts[:index])
    try:
        with pytest.raises(FactNotApplicable, match=r"JobQueueOptionsSet\): lacks jobQueue"):
            projection.apply([(index + 1, json.dumps(broken))])
        assert projection.position() == index
    finally:
        projection.close()
