"""Which dispatched jobs may be victims now, under a share's options beyond AWS.

With no option set (AWS Batch's own semantics) every candidate the victim search finds is
eligible, and nothing here changes a decision.  The options (SetQuotaShareOptions, set per
share, on the share whose jobs would be the victims):

- `minRuntimeBeforePreemptionSeconds` T: a job dispatched at d is not a victim before d + T,
  for cross-share reclaim and in-share preemption alike (measured from the dispatch, the one
  start time the core knows; an executor's start follows it);
- `preemptionBudget` (N, W): a preemption at time p counts against the share during [p, p + W);
  a search takes at most N minus the count at `now` victims from the share (0 left: none).
  When the usual (greedy) victim set would take more, the smallest set within the budgets is
  searched exhaustively (preemption.py).
  The count starts when the budget is set (the share keeps its preemption times only while
  budgeted, the latest MAX_BUDGET of them).

Both only ever remove candidates, so the victim search stays the same search over fewer jobs:
its results are minimal among the eligible ones.  When a head cannot be placed because of an
option, evolve has already put the time the option lapses on `State.wakes` (a dispatch of a
protected share, a preemption of a budgeted one); the timers look at the queue's waiting heads
again then (timers.py).
"""

from __future__ import annotations

from quotasched.services.scheduler.core.entities import Job, Share

MAX_BUDGET = 1000
"""A budgeted share keeps its latest MAX_BUDGET preemption times (PreemptionBudget's largest
`maxPreemptions`), enough for any budget's count, even one raised later."""


def protected(share: Share, job: Job, now: float) -> bool:
    """Is `job` still within its share's minimum runtime before preemption?"""
    seconds = share.min_runtime_s
    return seconds is not None and job.dispatched_at is not None and now < job.dispatched_at + seconds


def budget_left(share: Share, now: float) -> int | None:
    """How many more of the share's jobs may be preempted at `now` (None: no budget)."""
    if share.budget is None:
        return None
    most, window = share.budget
    return most - sum(1 for at in share.preempted_at if at > now - window)


class Allowance:
    """The budgets of one victim search: what each budgeted share allows at `now` (counted
    once per share), and how many of its jobs the search has taken so far."""

    __slots__ = ("now", "start", "taken")

    def __init__(self, now: float):
        self.now = now
        self.start: dict[str, int] = {}
        self.taken: dict[str, int] = {}

    def _allowed(self, share: Share) -> int:
        allowed = self.start.get(share.name)
        if allowed is None:
            left = budget_left(share, self.now)
            assert left is not None
            allowed = self.start[share.name] = left
        return allowed

    def eligible(self, share: Share, job: Job) -> bool:
        """May `job` (of `share`) be taken as one more victim?"""
        if protected(share, job, self.now):
            return False
        return share.budget is None or self.taken.get(share.name, 0) < self._allowed(share)

    def within(self, victims: list[Job], shares: dict[str, Share]) -> bool:
        """Do `victims` together stay within every budget (from what it allows now)?"""
        counts: dict[str, int] = {}
        for job in victims:
            counts[job.share] = counts.get(job.share, 0) + 1
        return all(shares[name].budget is None or count <= self._allowed(shares[name])
                   for name, count in counts.items())  # fmt: skip

    def take(self, share: Share) -> None:
        if share.budget is not None:
            self.taken[share.name] = self.taken.get(share.name, 0) + 1

    def give_back(self, share: Share) -> None:
        if share.name in self.taken:
            self.taken[share.name] -= 1


def options_set(share: Share) -> bool:
    """Does any option beyond AWS restrict the share's jobs as victims?"""
    return share.min_runtime_s is not None or share.budget is not None
