"""Quota arithmetic: who uses, borrows and lends how much of each capacity unit.

For a share s and a capacity unit t (all counts are instances):

    L[s,t]   limit: the share's own `maxCapacity` for t (0 when the share does not list t)
    U[s,t]   usage: instances held by the share's dispatched jobs (SCHEDULED/STARTING/RUNNING)
    Bor[s,t] borrowed = max(0, U - L): what the share uses beyond its own limit.  After a limit
             was lowered this counts as borrowed whatever the strategy, which is what makes it
             reclaimable (spec 3.4 rule 6).
    idle[s,t] lendable idle = max(0, L - U) for LEND and LEND_AND_BORROW shares, 0 for RESERVE;
             with a lending limit K (an option beyond AWS), min(K, max(0, L - U)).
    ceiling  how far past L a LEND_AND_BORROW share may go: L * borrowLimit / 100 rounded down,
             None (unlimited) for borrowLimit -1, 0 for RESERVE and LEND.

Per queue and unit the totals are kept incrementally: usage = sum U, borrowed = sum Bor,
idle = sum idle, and

    slack = idle - borrowed    (the free lendable pool).

Ruling 1 (borrowing is always backed) says slack >= 0 and that no decision makes it worse: a
dispatch whose slack after is negative is allowed only if it leaves slack unchanged (a RESERVE
share using its own capacity).  Ruling 2 follows: capacity that no share owns never appears in
`idle`, so nobody can borrow it.  Ruling 3: the service environment's maxCapacity caps sum U.

`Scratch` answers "would this job fit if these jobs were gone?" without touching state; the
live check is a Scratch with nothing removed.
"""

from __future__ import annotations

from quotasched.services.scheduler.core.entities import Environment, Job, Need, Queue, Share
from quotasched.services.scheduler.core.state import State


def contribution(share: Share, unit: str, used: int) -> tuple[int, int]:
    """(borrowed, lendable idle) of one share for one unit at a given usage; a lending limit
    (an option beyond AWS) caps the idle quota it lends."""
    limit = share.limits.get(unit, 0)
    if used > limit:
        return used - limit, 0
    if not share.strategy.lends:
        return 0, 0
    idle = limit - used
    if share.lending is not None:
        cap = share.lending.get(unit)
        if cap is not None and idle > cap:
            return 0, cap
    return 0, idle


def add_usage(state: State, queue: Queue, share: Share, need: Need, sign: int) -> None:
    """Dispatch (+1) or release (-1) a job's need, keeping the queue totals exact."""
    state.save(share)
    state.save(queue)
    share_usage = dict(share.usage)
    usage, borrowed, idle = dict(queue.usage), dict(queue.borrowed), dict(queue.idle)
    for unit, quantity in need:
        before = share_usage.get(unit, 0)
        after = before + sign * quantity
        bor_before, idle_before = contribution(share, unit, before)
        bor_after, idle_after = contribution(share, unit, after)
        share_usage[unit] = after
        usage[unit] = usage.get(unit, 0) + sign * quantity
        borrowed[unit] = borrowed.get(unit, 0) + bor_after - bor_before
        idle[unit] = idle.get(unit, 0) + idle_after - idle_before
    share.usage = share_usage
    queue.usage, queue.borrowed, queue.idle = usage, borrowed, idle


def recompute_totals(state: State, queue: Queue) -> None:
    """After a configuration change: rebuild the queue totals from its shares."""
    state.save(queue)
    usage: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    idle: dict[str, int] = {}
    lendable: dict[str, int] = {}
    for share in queue.shares.values():
        for unit in share.limits.keys() | share.usage.keys():
            used = share.usage.get(unit, 0)
            bor, spare = contribution(share, unit, used)
            usage[unit] = usage.get(unit, 0) + used
            borrowed[unit] = borrowed.get(unit, 0) + bor
            idle[unit] = idle.get(unit, 0) + spare
            if share.strategy.lends:
                lendable[unit] = lendable.get(unit, 0) + share.lendable(unit)
    queue.usage, queue.borrowed, queue.idle, queue.lendable = usage, borrowed, idle, lendable
    listing: dict[str, list[str]] = {}
    for share in queue.shares.values():
        for unit in share.limits:
            listing.setdefault(unit, []).append(share.name)
    queue.listing = {unit: tuple(names) for unit, names in listing.items()}


def within_own_limit(share: Share, need: Need) -> bool:
    """Would the job fit inside the share's own limits, for every unit it needs?"""
    usage, limits = share.usage, share.limits
    for unit, quantity in need:  # a loop, not all(...): called for every head in every pass
        if usage.get(unit, 0) + quantity > limits.get(unit, 0):
            return False
    return True


def may_hold(share: Share, unit: str, amount: int) -> bool:
    """May the share hold `amount` of `unit`: within its own limit, or beyond it as far as its
    strategy (it borrows) and its borrow ceiling allow?"""
    limit = share.limits.get(unit, 0)
    if amount <= limit:
        return True
    if not share.strategy.borrows:
        return False
    ceiling = share.borrow_ceiling(unit)
    return ceiling is None or amount <= limit + ceiling


def borrow_refused(share: Share, need: Need) -> bool:
    """Would `need` take the share past what it may hold at all (`may_hold`)?  Only the
    share's own usage and its configuration decide this, so nothing another share does can
    change the answer."""
    usage = share.usage
    for unit, quantity in need:
        if not may_hold(share, unit, usage.get(unit, 0) + quantity):
            return True
    return False


def borrowed_by(share: Share, need: Need) -> list[tuple[str, int]]:
    """The part of `need` that lies beyond the share's own limit if dispatched now."""
    borrowed = []
    for unit, quantity in need:
        used, limit = share.usage.get(unit, 0), share.limits.get(unit, 0)
        extra = max(0, used + quantity - limit) - max(0, used - limit)
        if extra:
            borrowed.append((unit, extra))
    return borrowed


# The rules of dispatch a job can fail (`Scratch.fits`), as `Misfit.rule` names them.
LACKS_UNIT = "environment_lacks_unit"  # the service environment has no such capacity unit
ENVIRONMENT_FULL = "environment_full"  # in_use + need > bound, the environment's maxCapacity
MAY_NOT_BORROW = "may_not_borrow"  # beyond its own limit, and its strategy does not borrow
BORROW_CEILING = "borrow_ceiling"  # used + need > bound, its limit plus its borrow ceiling
NO_IDLE_LENDABLE = "no_idle_lendable"  # it would borrow, and the free lendable pool is short
OWN_IDLE_LENT = "own_idle_lent"  # within its limit, but that idle capacity is lent out
GROUP_LIMIT = "group_limit"  # its share group holds in_use of at most bound (beyond AWS)


class Misfit:
    """One rule of dispatch a job fails for one capacity unit, with the quantities that
    decide it: `need` of `unit`, the share's `used` and `limit`, and per rule

    - ENVIRONMENT_FULL: `in_use` of the environment's `bound`;
    - BORROW_CEILING: `bound`, the most the share may hold;
    - NO_IDLE_LENDABLE, OWN_IDLE_LENT: `borrowing` (what it would borrow), `own_idle` (the
      share's own idle lendable capacity, not part of what the others lend it) and `pool`,
      the queue's free lendable pool (idle minus borrowed);
    - GROUP_LIMIT: `group` holds `in_use` of its `bound`.
    """

    __slots__ = ("rule", "unit", "need", "used", "limit", "in_use", "bound", "borrowing",
                 "own_idle", "pool", "group")  # fmt: skip

    def __init__(self, rule: str = "", unit: str = "", need: int = 0, used: int = 0,
                 limit: int = 0, in_use: int = 0, bound: int = 0, borrowing: int = 0,
                 own_idle: int = 0, pool: int = 0, group: str = ""):  # fmt: skip
        self.rule = rule
        self.unit = unit
        self.need = need
        self.used = used
        self.limit = limit
        self.in_use = in_use
        self.bound = bound
        self.borrowing = borrowing
        self.own_idle = own_idle
        self.pool = pool
        self.group = group

    def __repr__(self) -> str:
        return f"Misfit({self.rule}, {self.unit}, need={self.need})"


class Scratch:
    """Usage of one queue as if some dispatched jobs were gone.

    Until the first removal it reads the queue's own totals (the live check allocates nothing
    but itself); the first `move` copies the three small per-unit totals and starts a
    per-share overlay, so the state is never touched.
    """

    __slots__ = ("environment", "queue", "usage", "total", "borrowed", "idle")

    def __init__(self, environment: Environment, queue: Queue):
        self.environment = environment
        self.queue = queue
        self.usage: dict[tuple[str, str], int] | None = None  # (share, unit) -> used, once moved
        self.total: dict[str, int] = queue.usage
        self.borrowed: dict[str, int] = queue.borrowed
        self.idle: dict[str, int] = queue.idle

    def used(self, share: Share, unit: str) -> int:
        if self.usage is None:
            return share.usage.get(unit, 0)
        return self.usage.get((share.name, unit), share.usage.get(unit, 0))

    def is_borrowing(self, share: Share, units: set[str]) -> bool:
        return any(self.used(share, unit) > share.limits.get(unit, 0) for unit in units)

    def move(self, job: Job, share: Share, sign: int) -> None:
        """Remove (-1) or restore (+1) a dispatched job."""
        if self.usage is None:
            self.usage = {}
            self.total, self.borrowed, self.idle = dict(self.total), dict(self.borrowed), dict(self.idle)
        for unit, quantity in job.need:
            before = self.used(share, unit)
            after = before + sign * quantity
            bor_before, idle_before = contribution(share, unit, before)
            bor_after, idle_after = contribution(share, unit, after)
            self.usage[(share.name, unit)] = after
            self.total[unit] = self.total.get(unit, 0) + sign * quantity
            self.borrowed[unit] = self.borrowed.get(unit, 0) + bor_after - bor_before
            self.idle[unit] = self.idle.get(unit, 0) + idle_after - idle_before

    def fits(self, share: Share, need: Need, into: list[Misfit] | None = None) -> bool:
        """Can `share` dispatch a job needing `need` now?  Every rule of dispatch, per unit:

        1. the service environment has room (sum U + n <= maxCapacity);
        2. any part beyond the share's limit is allowed: the share borrows, and stays within
           L + ceiling;
        3. the free lendable pool does not get worse than it is (ruling 1), counting both what
           the job borrows and the share's own idle capacity it stops lending;
        4. (`_group_fits`) a borrowing share's group stays within the group's limit.

        The passes ask with `into` None: the answer comes at the first rule failed, and
        nothing is allocated.  Given a list, every rule failed is appended to it as a
        `Misfit` (a unit the environment lacks, or a share that may not hold the amount,
        stops the checks of that unit): this is how explain learns why a job waits."""
        capacity = self.environment.capacity
        total, overlay = self.total, self.usage
        fit = True
        for unit, quantity in need:
            cap = capacity.get(unit)
            in_use = total.get(unit, 0)
            if cap is None or in_use + quantity > cap:
                if into is None:
                    return False
                fit = False
                if cap is None:
                    into.append(Misfit(LACKS_UNIT, unit, quantity))
                    continue
                into.append(Misfit(ENVIRONMENT_FULL, unit, quantity, in_use=in_use, bound=cap))
            used = share.usage.get(unit, 0) if overlay is None else self.used(share, unit)
            bor_before, idle_before = contribution(share, unit, used)
            bor_after, idle_after = contribution(share, unit, used + quantity)
            borrowing = bor_after - bor_before
            if borrowing and not may_hold(share, unit, used + quantity):
                if into is None:
                    return False
                fit = False
                limit = share.limits.get(unit, 0)
                if share.strategy.borrows:
                    ceiling = share.borrow_ceiling(unit)
                    into.append(Misfit(BORROW_CEILING, unit, quantity, used, limit,
                                       bound=limit + (ceiling or 0)))  # fmt: skip
                else:
                    into.append(Misfit(MAY_NOT_BORROW, unit, quantity, used, limit))
                continue
            slack = self.idle.get(unit, 0) - self.borrowed.get(unit, 0)
            slack_after = slack - borrowing - (idle_before - idle_after)
            if slack_after < 0 and slack_after < slack:
                if into is None:
                    return False
                fit = False
                into.append(Misfit(NO_IDLE_LENDABLE if borrowing else OWN_IDLE_LENT, unit,
                                   quantity, used, share.limits.get(unit, 0), borrowing=borrowing,
                                   own_idle=idle_before, pool=slack))  # fmt: skip
            if borrowing and self.queue.group_limits and not self._group_fits(share, unit,
                                                                              quantity, into):
                if into is None:
                    return False
                fit = False
        return fit

    def misfits(self, share: Share, need: Need) -> list[Misfit]:
        """Every rule of dispatch a job needing `need` fails now (`fits`); [] when it fits."""
        found: list[Misfit] = []
        self.fits(share, need, found)
        return found

    def _group_fits(self, share: Share, unit: str, quantity: int,
                    into: list[Misfit] | None) -> bool:  # fmt: skip
        """4. when it borrows, its share group (an option beyond AWS) stays within its limit;
        a `Misfit` is made only for a caller that asks why (`into`)."""
        queue = self.queue
        capped = queue.group_cap(share.name, unit)
        if capped is None:
            return True
        group, cap = capped
        shares = queue.shares
        held = sum(self.used(shares[name], unit) for name in queue.groups[group] if name in shares)
        if held + quantity <= cap:
            return True
        if into is not None:
            into.append(Misfit(GROUP_LIMIT, unit, quantity, in_use=held, bound=cap, group=group))
        return False
