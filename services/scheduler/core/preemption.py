"""Victim search: the fewest dispatched jobs whose removal lets a head job fit.

Works on a `Scratch` (never on state): take candidates in ranking order until the job fits,
then give back, most recently taken first, every victim that turns out not to be needed
(Kueue's fill-back).  The result is minimal: no victim can be spared.  Finally, when several
victims were needed but one candidate of no higher rank frees enough on its own, that single
job is preempted instead (spec 3.5 rule 4: avoid preempting more than needed).

Cross-share reclaim (spec 3.4 rule 4) takes victims only from other shares that are over their
own limit in a contested unit, and stops taking from a share once it is back within its
limit; if that frees too little, one job of an over-limit share that frees enough alone is
taken even though its share ends below its limit (spec 3.5: accepted when unavoidable).
In-share preemption (rule 5) takes only strictly lower-priority jobs of the same share.
Options beyond AWS (victims.py) make some candidates ineligible: a protected job is never
taken, and a budgeted share gives at most its budget's remainder of victims to one search.

A preemptor waits for at most MAX_VICTIMS jobs: its `JobDispatched` names every victim, and
every fact must fit one message on the bus (ruling 16).  A head that would need more waits
(only fleets of thousands of one-instance jobs under one preemptor come near it).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

from quotasched.services.scheduler.core.accounting import Scratch
from quotasched.services.scheduler.core.entities import Environment, Job, Queue, Share
from quotasched.services.scheduler.core.ordering import cross_share_victim_order, in_share_victim_order
from quotasched.services.scheduler.core.victims import Allowance, options_set

EXHAUSTIVE = 12
"""Up to this many candidates, a victim set within the preemption budgets is searched
exhaustively when the greedy one is not within them (at most 4,095 subsets)."""

MAX_VICTIMS = 1000
"""The most jobs one preemption takes: 1000 job ids (at most 128 characters each) keep the
preemptor's `JobDispatched` far below a bus message's 1 MiB."""


def allowance(queue: Queue, now: float) -> Allowance | None:
    """The victim rules of a search at `now`, or None when no share of the queue has an
    option beyond AWS (every candidate is eligible: AWS's semantics, and no cost)."""
    for share in queue.shares.values():
        if options_set(share):
            return Allowance(now)
    return None


def reclaim_victims(environment: Environment, queue: Queue, share: Share, head: Job,
                    now: float = 0.0) -> list[Job]:  # fmt: skip
    units = {unit for unit, _ in head.need}
    if not any(queue.borrowed.get(unit, 0) for unit in units):
        return []  # no share is over its limit in a contested unit: nothing to reclaim
    over = {
        other.name: {unit for unit in units if other.usage.get(unit, 0) > other.limits.get(unit, 0)}
        for other in queue.shares.values() if other is not share
    }  # fmt: skip
    # Only a job holding a contested unit in which its share is over its limit holds borrowed
    # capacity; one that holds only units its share is within is never a victim (3.4 rule 4),
    # not even as the single job that would free enough alone.
    candidates = [
        job for name, units_over in over.items() if units_over
        for job in queue.shares[name].dispatched.values()
        if any(unit in units_over for unit, _ in job.need)
    ]  # fmt: skip
    rules = allowance(queue, now)
    if rules is not None:
        candidates = [job for job in candidates if rules.eligible(queue.shares[job.share], job)]
    if not candidates:
        return []
    key = cross_share_victim_order(units)

    def within_borrowed(scratch: Scratch, job: Job) -> bool:
        # Reclaim borrowed capacity only: skip a job whose share is back within its limit.
        return scratch.is_borrowing(queue.shares[job.share], {u for u, _ in job.need} & units)

    def keeps_limits(scratch: Scratch, victims: list[Job]) -> bool:
        # Several victims reclaim borrowed capacity only: each one's share keeps its limit.
        return all(scratch.used(queue.shares[job.share], unit) >= queue.shares[job.share].limit(unit)
                   for job in victims for unit in units)  # fmt: skip

    ranked = sorted(candidates, key=key)
    band = lambda job: key(job)[:2]  # noqa: E731
    victims = _search(environment, queue, share, head, ranked, key, within_borrowed, band, rules,
                      keeps_limits)  # fmt: skip
    if victims:
        return victims
    # The greedy order may have taken the job labelled as borrowing first and so brought its
    # share back to its limit, while another job of that share, over its limit as things
    # stand, frees enough alone (its share ends below its limit: accepted when unavoidable).
    single = _single_victim(environment, queue, share, head, ranked, None, band)
    return [single] if single is not None else []


def in_share_candidates(share: Share, head: Job) -> list[Job]:
    """The share's dispatched jobs in-share preemption may take for `head`: strictly lower
    priority, holding a unit it needs.  Only the share's own changes alter this list."""
    if not share.dispatched:
        return []
    units = {unit for unit, _ in head.need}
    return [
        job for job in share.dispatched.values()
        if job.priority < head.priority and any(unit in units for unit, _ in job.need)
    ]  # fmt: skip


def in_share_victims(environment: Environment, queue: Queue, share: Share, head: Job,
                     now: float = 0.0) -> list[Job]:  # fmt: skip
    candidates = in_share_candidates(share, head)
    rules = allowance(queue, now) if candidates else None
    if rules is not None:
        candidates = [job for job in candidates if rules.eligible(share, job)]
    if not candidates:
        return []
    units = {unit for unit, _ in head.need}
    key = in_share_victim_order(units)
    return _search(environment, queue, share, head, sorted(candidates, key=key), key,
                   lambda scratch, job: True, band=lambda job: key(job)[:1], rules=rules)  # fmt: skip


def _search(
    environment: Environment,
    queue: Queue,
    share: Share,
    head: Job,
    ranked: list[Job],
    key: Callable[[Job], tuple],
    eligible: Callable[[Scratch, Job], bool],
    band: Callable[[Job], tuple],
    rules: Allowance | None = None,
    admissible: Callable[[Scratch, list[Job]], bool] | None = None,
) -> list[Job]:
    """The victims for `head`: the greedy search with fill-back.  Under a preemption budget
    (victims.py) the greedy set is kept when it is within every budget; otherwise the smallest
    set within them is searched exhaustively, in rank order, over up to EXHAUSTIVE candidates
    (a greedy that counts the budgets as it takes, beyond that)."""
    victims = _greedy(environment, queue, share, head, ranked, key, eligible, band)
    if rules is None or not victims or rules.within(victims, queue.shares):
        return victims
    if len(ranked) <= EXHAUSTIVE:
        return _smallest_within(environment, queue, share, head, ranked, rules, admissible)
    return _greedy(environment, queue, share, head, ranked, key, eligible, band, rules)


def _smallest_within(environment: Environment, queue: Queue, share: Share, head: Job,
                     ranked: list[Job], rules: Allowance,
                     admissible: Callable[[Scratch, list[Job]], bool] | None) -> list[Job]:  # fmt: skip
    """The first set, by size and then rank order, that is within every budget, admissible
    (`admissible` for sets of two or more) and lets `head` fit: minimal by construction."""
    shares = queue.shares
    for size in range(1, len(ranked) + 1):
        for chosen in combinations(ranked, size):
            victims = list(chosen)
            if not rules.within(victims, shares):
                continue
            scratch = Scratch(environment, queue)
            for job in victims:
                scratch.move(job, shares[job.share], -1)
            if size > 1 and admissible is not None and not admissible(scratch, victims):
                continue
            if scratch.fits(share, head.need):
                return victims
    return []


def _greedy(
    environment: Environment,
    queue: Queue,
    share: Share,
    head: Job,
    ranked: list[Job],
    key: Callable[[Job], tuple],
    eligible: Callable[[Scratch, Job], bool],
    band: Callable[[Job], tuple],
    rules: Allowance | None = None,
) -> list[Job]:
    scratch = Scratch(environment, queue)
    shares = queue.shares
    taken: list[Job] = []
    for job in ranked:
        if scratch.fits(share, head.need):
            break
        if eligible(scratch, job) and (rules is None or rules.eligible(shares[job.share], job)):
            scratch.move(job, shares[job.share], -1)
            taken.append(job)
            if rules is not None:
                rules.take(shares[job.share])
    if not taken or not scratch.fits(share, head.need):
        return []
    # Fill back: the last victim taken was needed (without it the job did not fit); each
    # earlier one is given back if the job still fits without preempting it.  (Giving back
    # only ever lowers what a budgeted share gives: the victims stay within every budget.)
    victims = [taken[-1]]
    for job in reversed(taken[:-1]):
        scratch.move(job, shares[job.share], +1)
        if scratch.fits(share, head.need):
            if rules is not None:
                rules.give_back(shares[job.share])
            continue
        scratch.move(job, shares[job.share], -1)
        victims.append(job)
    victims.sort(key=key)
    if len(victims) > 1:
        single = _single_victim(environment, queue, share, head, ranked, victims, band)
        if single is not None:
            return [single]
    return victims if len(victims) <= MAX_VICTIMS else []


def _single_victim(
    environment: Environment,
    queue: Queue,
    share: Share,
    head: Job,
    ranked: list[Job],
    victims: list[Job] | None,
    band: Callable[[Job], tuple],
) -> Job | None:
    """The smallest candidate that frees enough alone, ranked no higher than the worst of
    `victims` (any rank when there are none)."""
    worst = max(band(job) for job in victims) if victims else None
    units = {unit for unit, _ in head.need}
    best: Job | None = None
    best_size = 0
    for job in ranked:
        if worst is not None and band(job) > worst:
            continue
        size = sum(quantity for unit, quantity in job.need if unit in units)
        if best is not None and size >= best_size:
            continue
        scratch = Scratch(environment, queue)
        scratch.move(job, queue.shares[job.share], -1)
        if scratch.fits(share, head.need):
            best, best_size = job, size
    return best
