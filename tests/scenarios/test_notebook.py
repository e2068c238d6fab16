"""The official notebook (spec A1-A3) told through the builders."""

from quotasched.events import facts as F
from tests.builders import Cluster, of_kind


def test_notebook_story_borrows_reclaims_and_preempts_in_share():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)
    c.submit("low", "qs1", priority=1)
    assert c.dispatched() == {"high", "med"}
    facts = c.submit("b1", "qs2", priority=1)
    (preempted,) = of_kind(facts, F.JobPreempted)
    assert (preempted.job_id, preempted.reason.value) == ("med", "CROSS_SHARE_RECLAIM")
    facts = c.prioritize("low", 4)
    (preempted,) = of_kind(facts, F.JobPreempted)
    assert (preempted.job_id, preempted.reason.value) == ("high", "IN_SHARE_PRIORITY")
    assert c.status("med") == "RUNNABLE"
