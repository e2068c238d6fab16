"""How long jobs waited, without leaving out the jobs that waited longest.

Two waits per job:

- **time to first start**: from submission to the first dispatch;
- **time queued**: every second the job spent in the queue: from submission to its first
  dispatch, plus, after each preemption that requeued it, until its next dispatch.

A run ends at its horizon, the time of its last event (the last completion or submission);
a job still in the queue then would wait for good (nothing else happens).  It is not
dropped: it counts as "still waiting at the end", and its waits are censored at the
horizon: known only to be at least horizon - submission (time to first start, when it never
started) and at least the queued time up to the horizon.

Percentiles interpolate linearly between the closest ranks (numpy's default, Hyndman and
Fan's type 7).  Censored waits are ranked at their lower bounds, after equal exact ones.  A
percentile is exact when every censored wait ranks above the ranks it is interpolated from
(their true values, higher still, stay above); otherwise it is a lower bound, shown "≥ X"
(`Quantile.at_least`): the true waits can only be longer.
"""

from __future__ import annotations

from dataclasses import dataclass

from quotasched.services.simulate.engine import Run


@dataclass(frozen=True)
class Quantile:
    seconds: float  # nan: nobody in the group
    at_least: bool = False  # censored waits reach it: the true percentile is >= seconds


@dataclass(frozen=True)
class Waits:
    jobs: int
    still_waiting: int  # in the queue at the horizon: their waits are censored
    first_start_p50: Quantile
    first_start_p95: Quantile
    queued_p50: Quantile
    queued_p95: Quantile


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    return quantiles(values, [False] * len(values), (p,))[0].seconds


def quantile(values: list[float], censored: list[bool], p: float) -> Quantile:
    """The p-th percentile of `values`, where `censored[i]` marks values[i] as a lower bound."""
    return quantiles(values, censored, (p,))[0]


def quantiles(values: list[float], censored: list[bool], ps: tuple[float, ...]) -> list[Quantile]:
    """`quantile` for each of `ps`, sorting once."""
    if not values:
        return [Quantile(float("nan")) for _ in ps]
    if any(censored):
        pairs = sorted(zip(values, censored))  # False < True: exact values first at a tie
        ordered = [value for value, _ in pairs]
        first_censored = next(rank for rank, (_, flag) in enumerate(pairs) if flag)
    else:
        ordered, first_censored = sorted(values), len(values)
    out = []
    for p in ps:
        position = (len(ordered) - 1) * p / 100.0
        low = int(position)
        high = min(low + 1, len(ordered) - 1) if position > low else low
        value = ordered[low] + (ordered[high] - ordered[low]) * (position - low)
        out.append(Quantile(value, first_censored <= high))
    return out


@dataclass(frozen=True)
class JobWaits:
    """Both waits of every job, indexed like the trace, censored at the horizon."""

    first_start: list[float]
    never_started: list[bool]  # so first_start is a lower bound
    queued: list[float]
    still_waiting: list[bool]  # so queued is a lower bound

    @classmethod
    def of(cls, run: Run) -> JobWaits:
        horizon, starts = run.horizon, run.first_start
        return cls(
            first_start=[(start if start >= 0 else horizon) - submit
                         for start, submit in zip(starts, run.trace.submit)],
            never_started=[start < 0 for start in starts],
            queued=run.queued, still_waiting=run.waiting_at_end,
        )  # fmt: skip

    def of_jobs(self, members: list[int] | None = None) -> Waits:
        """The percentiles of the jobs `members` (indices into the trace; None: every job)."""
        lists = (self.first_start, self.never_started, self.queued, self.still_waiting)
        if members is not None:
            lists = tuple([column[i] for i in members] for column in lists)  # type: ignore[assignment]
        first, never, queued, waiting = lists
        first_p50, first_p95 = quantiles(first, never, (50, 95))
        queued_p50, queued_p95 = quantiles(queued, waiting, (50, 95))
        return Waits(jobs=len(first), still_waiting=sum(waiting), first_start_p50=first_p50,
                     first_start_p95=first_p95, queued_p50=queued_p50, queued_p95=queued_p95)  # fmt: skip
