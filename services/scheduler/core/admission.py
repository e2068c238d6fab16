"""Static admissibility: can a share's head job *ever* fit as things are configured?

A head that can never fit blocks its share (strict head-of-line order), keeps RUNNABLE with
one of the reasons below, and may be terminated by a `jobStateTimeLimitActions` entry.  The
checks depend on configuration only, never on usage.  The service environment is checked
before the share (spec A9: when both fail, the SE reason wins).
"""

from __future__ import annotations

from quotasched.events.values import BlockedReason
from quotasched.services.scheduler.core.entities import Environment, Need, Queue, Share

SE_MAX_RESOURCE = (
    "MISCONFIGURATION:SERVICE_ENVIRONMENT_MAX_RESOURCE - Service environment(s) associated with "
    "the job queue cannot meet the capacity requirement of the job."
)
LIMIT_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requirements exceed quota share capacity limits."
)
LIMIT_AND_BORROW_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requirements exceed quota share capacity limits and borrow limits."
)
BORROWABLE_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requires borrowing that exceeds all configured borrowable capacity."
)
GROUP_EXCEEDED = (
    "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED - "
    "Job requires borrowing beyond its share group's capacity limits."
)  # quotasched's share groups, an option beyond AWS (fairshare.py)
CAPACITY_BOUNCED = (
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Unable to provision requested compute resources"
)

Blocked = tuple[BlockedReason, str]


def blocked_reason(environment: Environment, queue: Queue, share: Share, need: Need) -> Blocked | None:
    for unit, quantity in need:
        capacity = environment.capacity.get(unit)
        if capacity is None or quantity > capacity:
            return BlockedReason.SERVICE_ENVIRONMENT_MAX_RESOURCE, SE_MAX_RESOURCE
    for unit, quantity in need:
        limit = share.limits.get(unit, 0)
        if not share.strategy.borrows:
            if quantity > limit:
                return BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED, LIMIT_EXCEEDED
            continue
        ceiling = share.borrow_ceiling(unit)
        # A unit the share does not list has limit 0; even an unlimited ceiling does not make
        # it borrowable (spec 3.7).
        if unit not in share.limits or (ceiling is not None and quantity > limit + ceiling):
            return BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED, LIMIT_AND_BORROW_EXCEEDED
        # The borrowable pool is the other lending shares' configured limits (spec 3.2 row 4),
        # each capped by its lending limit; a LEND_AND_BORROW share is itself a lender, so
        # what it lends is taken out.
        others = queue.lendable.get(unit, 0) - share.lendable(unit)
        if quantity - limit > others:
            return BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED, BORROWABLE_EXCEEDED
        # A job that borrows whenever it runs (more than the share's limit) must fit its
        # share group's cap (an option beyond AWS), however little the other members hold.
        capped = queue.group_cap(share.name, unit) if quantity > limit else None
        if capped is not None and quantity > capped[1]:
            return BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED, GROUP_EXCEEDED
    return None
