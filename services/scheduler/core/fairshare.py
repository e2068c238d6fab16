"""A job queue's options beyond AWS (SetJobQueueOptions): fair-share idle assignment and share
groups.  With neither set the queue assigns idle capacity FIFO, exactly as AWS Batch does,
and nothing here changes a decision.

Fair share (`idleResourceAssignmentStrategy` FAIR_SHARE, half-life H seconds).  A share's
*charge* is what it borrowed over time: the integral of B(t) = sum over units of
max(0, U - L), in instance-seconds.  Time is cut into periods of H seconds from time 0
(period k is [kH, (k+1)H)), and the charge decays by half at every period boundary:

    D(t) = C[k] + C[k-1] / 2 + C[k-2] / 4 + ...        (k the period of t)

where C[j] is the charge accrued in period j (up to t for the current one).  Halving and the
sums are exact or correctly rounded IEEE operations, so a replay anywhere computes the same
D.  Among borrowers (pass step (b)) the head whose share has the least D / weight goes
first; ties go FIFO (acceptance order), then by share name.  A share's charge starts at 0
when FAIR_SHARE is turned on or its half-life changes, and when the share is created.

Share groups.  A borrower whose group's other members have, for every unit it would borrow,
at least that much idle lendable capacity comes before every other borrower (the group lends
inside itself first); fair share or FIFO orders within each of the two ranks.  A group's
`maxCapacity` caps, per unit, what its members hold together after any dispatch that borrows
that unit (accounting.Scratch.fits); dispatches within a share's own quota are never refused
for it.
"""

from __future__ import annotations

import math

from quotasched.services.scheduler.core.accounting import borrowed_by, contribution
from quotasched.services.scheduler.core.entities import Job, Queue, Share
from quotasched.services.scheduler.core.state import State

MAX_PERIODS = 2200
"""More halvings than any finite float charge needs to reach its fixed point (an exponent of
at most 1024, then 1074 more to go through the subnormals to 0)."""


def borrowed_total(share: Share) -> int:
    """B: instances the share holds beyond its own limits, over all units."""
    limits = share.limits
    return sum(max(0, used - limits.get(unit, 0)) for unit, used in share.usage.items())


def fresh(at: float, half_life: int) -> tuple:
    """A charge of 0 starting at `at`."""
    return (int(at // half_life), 0.0, 0.0, at)


def advance(charge: tuple, half_life: int, borrowed: int, to: float) -> tuple:
    """The charge at `to`, the share having borrowed `borrowed` instances since it was
    accrued."""
    period, current, past, since = charge
    if to <= since:
        return charge
    now = int(to // half_life)
    if now == period:
        return (period, current + borrowed * (to - since), past, to)
    past = (past + current + borrowed * ((period + 1) * half_life - since)) * 0.5
    gap = min(now - period - 1, MAX_PERIODS)
    if borrowed == 0:  # only halvings: exact in one step
        return (now, 0.0, math.ldexp(past, -gap), to)
    whole = float(borrowed * half_life)
    for _ in range(gap):  # converges (the gap to the fixed point halves each time)
        halved = (past + whole) * 0.5
        if halved == past:
            break
        past = halved
    return (now, borrowed * (to - now * half_life), past, to)


def accrue(state: State, queue: Queue, share: Share, at: float) -> None:
    """Bring the share's charge up to `at` (before its borrowing changes); nothing under FIFO."""
    half_life = queue.half_life
    if half_life is not None and share.charge:
        state.save(share)
        share.charge = advance(share.charge, half_life, borrowed_total(share), at)


def decayed(queue: Queue, share: Share, now: float) -> float:
    """D(now): the share's decayed past borrowing."""
    half_life = queue.half_life
    if half_life is None or not share.charge:
        return 0.0
    _, current, past, _ = advance(share.charge, half_life, borrowed_total(share), now)
    return current + past


def fair_value(queue: Queue, share: Share, now: float) -> float:
    """D(now) / weight: the lower, the sooner the share's borrower is served."""
    return decayed(queue, share, now) / queue.weights.get(share.name, 1)


def lent_inside(queue: Queue, share: Share, head: Job) -> bool:
    """Would the share's group lend all `head` borrows now (its other members' idle lendable
    capacity covers it, unit by unit)?"""
    group = queue.group_of.get(share.name)
    if group is None:
        return False
    members = [queue.shares[name] for name in queue.groups[group]
               if name != share.name and name in queue.shares]  # fmt: skip
    for unit, quantity in borrowed_by(share, head.need):
        idle = sum(contribution(member, unit, member.used(unit))[1] for member in members)
        if idle < quantity:
            return False
    return True

