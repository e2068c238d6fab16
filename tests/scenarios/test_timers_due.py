"""`earliest_due`: when the service next needs a Tick (issue 21: no Ticks from a quiet
service).  Expectations by hand from fixture N (3 ml.g5.xlarge; qs1, qs2 LEND, qs3 RESERVE)."""

from __future__ import annotations

from quotasched.services.scheduler.core.timers import earliest_due
from tests.builders import Cluster


def test_nothing_pending_means_no_tick_is_ever_needed():
    c = Cluster.notebook()
    c.at = 5.0
    c.submit("a", "qs3")  # runs, no attempt timeout
    assert earliest_due(c.state) is None


def test_an_attempt_timeout_is_due_at_dispatch_plus_its_duration():
    c = Cluster.notebook()
    c.at = 10.0
    c.submit("a", "qs3", timeoutConfig={"attemptDurationSeconds": 100})
    assert earliest_due(c.state) == 110.0
    c.at = 20.0
    c.finish("a")  # its entry may stay on the heap: a lower bound, never later than the truth
    due = earliest_due(c.state)
    assert due is None or due == 110.0
    c.tick(120.0)  # the Tick finds nothing to fire and drops the stale entry
    # what is left: forgetting `a` once its queue's retention (7 days by default) has passed
    assert earliest_due(c.state) == 20.0 + 7 * 86400
