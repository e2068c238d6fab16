"""`quotasched explain` and the narration under a job queue's options beyond AWS
(SetJobQueueOptions): a borrower held back by its share group's maxCapacity is told so (group,
what it holds, its cap, what the job needs), and where borrowers compete the order is named
(a group lending inside first, fair share's decayed borrowing per weight), including when a
borrower was passed over.  Every expected value is worked out by hand in the docstrings.

The clusters run without the independent checker (tests/checker.py): its rule of first come,
first served among borrowers is what fair share changes, and these tests are about the words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from quotasched.events import facts as F
from quotasched.events.codec import decode_fact
from quotasched.services.explain.narrate import sentence
from quotasched.services.explain import explain, render, why_waiting
from tests.builders import G5, Cluster, dispatched_ids
from tests.projections.helpers import command, setup, share



def entries(cluster: Cluster, job_id: str) -> list[str]:
    return [entry.sentence for entry in explain(iter(cluster.facts), job_id)]


def shares(cluster: Cluster, *specs: tuple[str, str, int]) -> Cluster:
    for name, strategy, limit in specs:
        cluster.share(name, strategy, g5=limit)
    return cluster


# -- a share group's maxCapacity -------------------------------------------------------------


def capped_group(cap: int = 2) -> Cluster:
    """se 4; a, b LEND_AND_BORROW 1, c LEND 2; group dept (a, b) holds at most `cap` when a
    member borrows.  a1 and b1 run on their own quota (t=1)."""
    c = Cluster(independent=False)
    c.environment(g5=4)
    c.queue()
    shares(c, ("a", "LEND_AND_BORROW", 1), ("b", "LEND_AND_BORROW", 1), ("c", "LEND", 2))
    c.queue_options(shareGroups=[{"name": "dept", "quotaShareNames": ["a", "b"],
                                  "maxCapacity": [{"capacityUnit": G5, "maxCapacity": cap}]}])  # fmt: skip
    c.submit("a1", "a", at=1)
    c.submit("b1", "b", at=1)
    return c


def held_back() -> Cluster:
    """The cap 2: a2 (t=2) would borrow one of c's 2 idle instances, the environment has room
    (2 of 4) and the pool too, but dept holds 2 and a2 needs 1: 3 > 2, so it waits.  a3 (t=2)
    waits behind a2."""
    c = capped_group()
    c.submit("a2", "a", at=2)
    c.submit("a3", "a", at=2)
    return c


CAPPED = ("a is in share group dept, which may hold at most 2 ml.g5.xlarge when one of its "
          "members borrows (an option beyond AWS): its members hold 2 (a 1, b 1) and a2 needs 1")  # fmt: skip


def test_a_borrower_held_back_by_its_groups_cap_is_told_the_group_its_holding_and_cap():
    c = held_back()
    assert c.dispatched() == {"a1", "b1"}
    assert why_waiting(c.state, c.state.jobs["a2"]) == f"a2 waits (RUNNABLE): {CAPPED}."
    behind = why_waiting(c.state, c.state.jobs["a3"])
    assert f"a2 itself waits because {CAPPED}" in behind


def test_once_a_member_releases_the_group_has_room_and_the_story_ends_in_the_dispatch():
    """b1 ends at t=3: dept holds 1, and 1 + 1 <= 2, so a2 borrows c's instance then."""
    c = held_back()
    c.at = 3
    assert dispatched_ids(c.finish("b1")) == ["a2"]
    told = render(explain(iter(c.facts), "a2"), "a2")
    assert CAPPED in told
    assert "a2 was dispatched in quota share a (attempt 1), borrowing 1 x ml.g5.xlarge" in told


def test_within_its_own_quota_a_member_is_never_told_of_the_cap():
    """A cap of 1 for dept while a and b each hold 1: b2 would borrow and is held back, but
    b1 of b, within b's own quota, was dispatched and never waited."""
    c = capped_group(cap=1)
    c.submit("b2", "b", at=2)
    assert c.dispatched() == {"a1", "b1"}
    assert not any("share group" in text for text in entries(c, "b1"))
    assert ("b is in share group dept, which may hold at most 1 ml.g5.xlarge when one of its "
            "members borrows (an option beyond AWS): its members hold 2 (a 1, b 1) and b2 "
            "needs 1") in why_waiting(c.state, c.state.jobs["b2"])  # fmt: skip


# -- fair share ------------------------------------------------------------------------------


def fair_share(**options) -> Cluster:
    """se 3; a, b LEND_AND_BORROW 1, c LEND 1; FAIR_SHARE with half-life 1000 s and a's weight
    4 from t=0 (the charges start at 0 then).  a1 and b1 run on their own quota from t=0, a2
    borrows c's instance from t=10.  a3 (t=20) then b2 (t=21) wait to borrow: 3 of 3 in use.
    At t=21 a has borrowed 1 instance for 11 s: 11 instance-s, / weight 4 = 2.75; b 0 / 1 = 0:
    b2 comes first, though a3 was submitted first."""
    c = Cluster(independent=False)
    c.environment(g5=3)
    c.queue()
    shares(c, ("a", "LEND_AND_BORROW", 1), ("b", "LEND_AND_BORROW", 1), ("c", "LEND", 1))
    c.queue_options(at=0, **(options or {
        "idleResourceAssignmentStrategy": "FAIR_SHARE",
        "fairShare": {"halfLifeSeconds": 1000, "weights": [{"quotaShareName": "a", "weight": 4}]},
    }))  # fmt: skip
    c.submit("a1", "a", at=0)
    c.submit("b1", "b", at=0)
    c.submit("a2", "a", at=10)
    c.submit("a3", "a", at=20)
    c.submit("b2", "b", at=21)
    return c


ORDER_AT_21 = ("borrowers are served in the order of the queue's options beyond AWS: b2 of b, "
               "then a3 of a; idle capacity goes by fair share (half-life 1000 s), the least "
               "decayed borrowing per weight first: share b's decayed borrowing 0 instance-s / "
               "weight 1 = 0, share a's decayed borrowing 11 instance-s / weight 4 = 2.75")  # fmt: skip
# a2 ends at t=50: a borrowed 1 instance from 10 to 50, 40 instance-s, / 4 = 10.
ORDER_AT_50 = ORDER_AT_21.replace("11 instance-s / weight 4 = 2.75", "40 instance-s / weight 4 = 10")


def test_borrowers_waiting_together_are_told_the_fair_share_order():
    c = fair_share()
    assert c.dispatched() == {"a1", "b1", "a2"}
    for job_id in ("a3", "b2"):
        told = why_waiting(c.state, c.state.jobs[job_id])
        assert told.startswith(f"{job_id} waits (RUNNABLE): service environment se is full")
        assert told.endswith(f"; {ORDER_AT_21}.")


def test_the_borrower_passed_over_is_told_who_went_first_and_why():
    """a2 ends at t=50; the freed instance of c goes to b2 (fair share), a3 waits on."""
    c = fair_share()
    c.at = 50
    assert dispatched_ids(c.finish("a2")) == ["b2"]
    told = [entry for entry in explain(iter(c.facts), "a3") if entry.at == 50]
    assert [entry.kind for entry in told] == ["JobDispatched", "Waiting"]
    assert told[0].sentence == (
        "a3 waits (RUNNABLE): b2 of b, also waiting to borrow, was dispatched ahead of it (first "
        f"come, first served would have served it first); {ORDER_AT_50}.")
    assert told[1].sentence.startswith("a3 waits (RUNNABLE): service environment se is full")
    [chosen] = [entry for entry in explain(iter(c.facts), "b2") if entry.at == 50]
    assert chosen.kind == "JobDispatched"
    assert chosen.sentence.endswith(
        "; it went before a3, which also waited to borrow (first come, first served would have "
        f"served a3 first); {ORDER_AT_50}.")


def test_the_order_tells_decayed_borrowing_halved_at_each_half_life():
    """After t=50 b borrows c's instance (b2) and a borrows nothing.  b3 at t=1500 (period 1
    of 1000 s) waits to borrow with a3.  a: 40 instance-s in period 0, halved once: 20, / 4
    = 5.  b: 1 instance from 50 to 1000 (950, halved: 475) and from 1000 to 1500 (500): 975.
    a3 now comes first."""
    c = fair_share()
    c.at = 50
    c.finish("a2")
    c.submit("b3", "b", at=1500)
    assert why_waiting(c.state, c.state.jobs["b3"]).endswith(
        "; borrowers are served in the order of the queue's options beyond AWS: a3 of a, then "
        "b3 of b; idle capacity goes by fair share (half-life 1000 s), the least decayed "
        "borrowing per weight first: share a's decayed borrowing 20 instance-s / weight 4 = 5, "
        "share b's decayed borrowing 975 instance-s / weight 1 = 975.")


def test_the_order_is_told_again_only_when_it_changes():
    """Between t=21 and t=50 the values grow but the order stays: a command in the queue (a
    priority change of a1, a running job) tells a3's wait no new time."""
    c = fair_share()
    c.at = 30
    c.prioritize("a1", 5)
    waits = [entry for entry in explain(iter(c.facts), "a3") if entry.kind == "Waiting"]
    assert [entry.at for entry in waits] == [20, 21]


def test_without_queue_options_nothing_is_said_about_an_order():
    """The same story under AWS's FIFO: a3, submitted first, gets c's instance at t=50."""
    c = fair_share(idleResourceAssignmentStrategy="FIFO")
    c.at = 50
    assert dispatched_ids(c.finish("a2")) == ["a3"]
    for job_id in ("a3", "b2"):
        assert not any("borrowers are served" in text or "ahead of it" in text
                       for text in entries(c, job_id))  # fmt: skip


# -- a share group lends inside first ---------------------------------------------------------


def test_a_group_lending_inside_first_is_named_as_the_reason_of_the_order():
    """se 3; a, b LEND_AND_BORROW 1, c and d LEND 1; group dept (a, c).  a1, b1 run on their own
    quota, b2 borrows (t=1): 3 of 3.  b3 (t=2) then a2 (t=3) wait to borrow.  c, a's group
    member, has 1 idle instance, all a2 would borrow: dept lends inside first, a2 before b3.
    b1 ends at t=10 and a2 gets the instance."""
    c = Cluster(independent=False)
    c.environment(g5=3)
    c.queue()
    shares(c, ("a", "LEND_AND_BORROW", 1), ("b", "LEND_AND_BORROW", 1), ("c", "LEND", 1),
           ("d", "LEND", 1))  # fmt: skip
    c.queue_options(shareGroups=[{"name": "dept", "quotaShareNames": ["a", "c"]}])
    c.submit("a1", "a")
    c.submit("b1", "b")
    c.submit("b2", "b", at=1)
    c.submit("b3", "b", at=2)
    c.submit("a2", "a", at=3)
    order = ("borrowers are served in the order of the queue's options beyond AWS: a2 of a, "
             "then b3 of b; group dept lends inside first: its other members' idle lendable "
             "capacity covers all a2 would borrow")  # fmt: skip
    assert why_waiting(c.state, c.state.jobs["b3"]).endswith(f"; {order}.")
    c.at = 10
    assert dispatched_ids(c.finish("b1")) == ["a2"]
    passed = [entry.sentence for entry in explain(iter(c.facts), "b3") if entry.at == 10][0]
    assert passed == ("b3 waits (RUNNABLE): a2 of a, also waiting to borrow, was dispatched "
                      "ahead of it (first come, first served would have served it first); "
                      f"{order}.")  # fmt: skip


# -- narration -------------------------------------------------------------------------------


def options_set(**options) -> F.Fact:
    """The fact as the log holds it (JSON), decoded the way every reader decodes it."""
    return decode_fact(json.dumps({"kind": "JobQueueOptionsSet", "at": 0, "commandSeq": 7,
                                   "jobQueue": "q", "optionsVersion": 1, "options": options}))


def test_narration_says_the_queue_options_in_a_few_words():
    """summary(): the fair share's half-life, each group with its shares and caps."""
    fact = options_set(idleResourceAssignmentStrategy="FAIR_SHARE",
                       fairShare={"halfLifeSeconds": 86400},
                       shareGroups=[{"name": "dept", "quotaShareNames": ["a", "b"],
                                     "maxCapacity": [{"capacityUnit": G5, "maxCapacity": 2}]}])
    assert sentence(fact) == ("job queue q options: fair share (half-life 86400 s), group dept "
                              "(a, b, at most 2 ml.g5.xlarge)")  # fmt: skip
    assert sentence(options_set()) == "job queue q options: all off"


def test_the_offline_narration_of_a_command_file_tells_the_queue_options(tmp_path: Path):
    fair = {"idleResourceAssignmentStrategy": "FAIR_SHARE", "fairShare": {"halfLifeSeconds": 1000}}
    commands = [*setup({G5: 3}, [share("a", 1, "LEND_AND_BORROW")]),
                command("SetJobQueueOptions", 0, jobQueue="q", optionsVersion=1, options=fair)]
    path = tmp_path / "fair.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in commands))
    quotasched = Path(sys.executable).parent / "quotasched"
    done = subprocess.run([str(quotasched), "demo", "--offline", "--file", str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "JobQueueOptionsSet" in done.stdout
    assert "job queue q options: fair share (half-life 1000 s)" in done.stdout
