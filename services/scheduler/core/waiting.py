"""Why a RUNNABLE job is not dispatched, as the state stands after a scheduling pass: one
value, from the same evaluation the passes make, that every reader shows (`quotasched
explain`, the web view, `get-job-queue-snapshot`, the `quotasched_jobs_waiting` metric).

`waiting(state, job)` answers with a `Waiting`: a `code` (a stable name, the metric's
`reason` label), what decides it (the share's head and how many jobs are ahead of it, a
blocked head's AWS reason, the rules of dispatch the head fails as `accounting.Misfit`s), and
`text`, the reason in sentences.  The codes, most decisive first:

    share_missing           its quota share no longer exists
    environment_disabled    its service environment is DISABLED: nothing is dispatched
    blocked                 it heads its share and can never fit as configured (AWS's reason)
    behind_blocked_head     it is behind its share's head, which can never fit as configured
    behind_higher_priority  it is behind its share's head, of a higher priority
    behind_earlier          it is behind its share's head, of its priority, submitted earlier
    <a Misfit rule>         it heads its share and fails that rule of dispatch (the first of
                            `misfits`: environment_full, no_idle_lendable, own_idle_lent,
                            may_not_borrow, borrow_ceiling, group_limit, environment_lacks_unit)
    dispatchable            nothing keeps it waiting: the next pass dispatches it

A head that fails a rule is told, too, why preemption does not make room (no share over its
limit, no lower-priority job of its own, the options beyond AWS protecting victims, and until
when), and, waiting to borrow beside other borrowers under the queue's options, the order they
are served in (`ordering.borrower_key`, with the fair-share values that make it).

Pure like the rest of the core, and a reader: it changes nothing in the state it reads
(`State.peek`, not `head`).  The wording is here so that every reader, in every process,
shows the same sentence; a time is worded from `at`, never from a clock.
"""

from __future__ import annotations

from datetime import datetime, timezone
from heapq import heappop, heappush

from quotasched.events.labels import job_label
from quotasched.events.values import JobStatus
from quotasched.events.values import State as OnOff
from quotasched.services.scheduler.core.accounting import (
    BORROW_CEILING,
    ENVIRONMENT_FULL,
    LACKS_UNIT,
    MAY_NOT_BORROW,
    NO_IDLE_LENDABLE,
    OWN_IDLE_LENT,
    Misfit,
    Scratch,
    contribution,
    within_own_limit,
)
from quotasched.services.scheduler.core.admission import blocked_reason
from quotasched.services.scheduler.core.entities import Environment, Job, Queue, Share
from quotasched.services.scheduler.core.fairshare import decayed, fair_value, lent_inside
from quotasched.services.scheduler.core.ordering import borrower_key
from quotasched.services.scheduler.core.passes import placeable
from quotasched.services.scheduler.core.preemption import in_share_candidates
from quotasched.services.scheduler.core.state import State
from quotasched.services.scheduler.core.victims import budget_left, protected

SHARE_MISSING = "share_missing"
ENVIRONMENT_DISABLED = "environment_disabled"
BLOCKED = "blocked"
BEHIND_BLOCKED_HEAD = "behind_blocked_head"
BEHIND_HIGHER_PRIORITY = "behind_higher_priority"
BEHIND_EARLIER = "behind_earlier"
DISPATCHABLE = "dispatchable"

Pair = tuple[Share, Job]


class Waiting:
    """Why `job_id` waits: `code`, `text`, and what decides them.

    `head` is the share's head when the job waits behind it (None at the head); `ahead` the
    RUNNABLE jobs of its share before it; `blocked` the AWS reason of a head that can never
    fit; `misfits` the rules of dispatch the head (the job itself, or the one it is behind)
    fails now; `order` the borrowers' order (job ids) when the queue's options order it;
    `parts` the clauses `text` joins.  `key` says when the story is worth telling again: at
    the head every detail counts (the text itself), behind other jobs only the kind of wait.
    """

    __slots__ = ("code", "job_id", "label", "share", "head", "ahead", "blocked", "misfits",
                 "order", "parts", "key")  # fmt: skip

    def __init__(self, code: str = "", job_id: str = "", share: str = "", label: str = "") -> None:
        self.code = code
        self.job_id = job_id
        self.label = label or job_id  # how a person reads it (`events.labels`)
        self.share = share
        self.head: Job | None = None
        self.ahead = 0
        self.blocked: str | None = None
        self.misfits: list[Misfit] = []
        self.order: tuple[str, ...] = ()
        self.parts: list[str] = []
        self.key: tuple = ()

    @property
    def text(self) -> str:
        """`<job> waits (RUNNABLE): <clauses>.`"""
        return f"{self.label} waits (RUNNABLE): " + "; ".join(self.parts) + "."

    def __repr__(self) -> str:
        return f"Waiting({self.code}, {self.job_id})"


def waiting(state: State, job: Job, told: tuple | None = None, words: bool = True,
            ahead: int | None = None) -> Waiting:
    """Why the RUNNABLE `job` is not dispatched now.  Behind other jobs, when the kind of wait
    equals `told` (the `key` of what was told before), nothing more is worked out: the answer
    has its `key` and no `parts`.  Without `words`, only what decides the code is worked out
    (`code`, `head`, `blocked`, `misfits`): no sentence, no `key` (the metric's reading).
    `ahead`: how many jobs of its share come before it, when the caller knows (`in_order`
    does); else they are counted (a walk over the share's heap)."""
    queue = state.queues.get(job.queue)
    share = queue.shares.get(job.share) if queue is not None else None
    if queue is None or share is None:
        found = Waiting(SHARE_MISSING, job.job_id, job.share, label(job))
        found.parts.append(f"its quota share {job.share} no longer exists")
        found.key = (found.text,)
        return found
    environment = state.environments[queue.environment]
    found = Waiting("", job.job_id, share.name, label(job))
    if environment.state is OnOff.DISABLED:
        found.code = ENVIRONMENT_DISABLED
        if words:
            found.parts.append(f"service environment {environment.name} is DISABLED, so "
                               f"nothing is dispatched in job queue {queue.name}")  # fmt: skip
    head = state.peek(share)
    if head is not None and head is not job:
        _behind(state, environment, queue, share, job, head, found, told, words, ahead)
        return found
    blocked = blocked_reason(environment, queue, share, job.need)
    if blocked is not None:
        found.blocked = blocked[1]
        found.code = found.code or BLOCKED
        if words:
            found.parts.append(f"it heads {share.name}, which is blocked because it can never "
                               f"fit as configured: \"{blocked[1]}\"")  # fmt: skip
            found.key = (found.text,)
        return found
    found.misfits = Scratch(environment, queue).misfits(share, job.need)
    if found.misfits:
        found.code = found.code or found.misfits[0].rule
    if not found.code:  # neither DISABLED nor failing a rule
        found.code = DISPATCHABLE
    if not words:
        return found
    found.parts.extend(blockers(state, environment, queue, share, job, found.misfits))
    if found.code == DISPATCHABLE:
        found.parts.append("nothing keeps it waiting as things stand; the next scheduling pass "
                           "dispatches it")  # fmt: skip
    found.key = (found.text,)
    if has_order_options(queue):
        pairs = borrower_heads(state, queue, state.time)
        order = tuple(pair[1].job_id for pair in pairs)
        if len(order) >= 2 and job.job_id in order:
            # The order's values (decayed borrowing) move with the clock: the story is told
            # again when the order changes, or anything else does, not at every command.
            found.key = (found.text, order)
            found.order = order
            found.parts.extend(order_clauses(queue, pairs, state.time))
    return found


def _behind(state: State, environment: Environment, queue: Queue, share: Share, job: Job,
            head: Job, found: Waiting, told: tuple | None, words: bool = True,
            ahead: int | None = None) -> None:  # fmt: skip
    """`job` waits behind `head`: the kind of wait (the story changes only when it does, not
    with every new head or usage change ahead of it), then why the head itself waits."""
    found.head = head
    blocked = blocked_reason(environment, queue, share, head.need)
    if blocked is not None:
        found.key = ("blocked head", blocked[1], environment.state)
    elif head.priority > job.priority:
        found.key = ("behind higher priority", environment.state)
    else:
        found.key = ("behind earlier", environment.state)
    found.code = behind_code(head, job, blocked is not None, environment.state is OnOff.DISABLED)
    if blocked is not None:
        found.blocked = blocked[1]
    if found.key == told or not words:
        return  # the same kind of wait: nothing new to tell (and no work)
    if blocked is not None:
        text = (f"it is behind the blocked head of {share.name}, {label(head)}, which can "
                f"never fit as configured: \"{blocked[1]}\"")
    elif head.priority > job.priority:
        text = (f"it is behind higher-priority job {label(head)} (priority "
                f"{head.priority}, its own is {job.priority}) at the head of {share.name}")
    else:
        text = (f"it is behind {label(head)}, submitted earlier with the same priority "
                f"{job.priority}, at the head of {share.name}")
    found.ahead = len(jobs_ahead(state, share, job)) if ahead is None else ahead
    if found.ahead > 1:
        text += f" ({found.ahead} jobs are ahead of it in {share.name})"
    found.parts.append(text)
    if blocked is None:
        found.misfits = Scratch(environment, queue).misfits(share, head.need)
        reasons = blockers(state, environment, queue, share, head, found.misfits)
        if reasons:
            found.parts.append(f"{label(head)} itself waits because " + "; ".join(reasons))


def label(job: Job) -> str:
    """How the sentences name a job: its name first (`events.labels.job_label`)."""
    return job_label(job.job_id, job.job_name)


def who(state: State, job_id: str) -> str:
    """The label of the job `job_id` as the state knows it (its id when it knows no such job)."""
    job = state.jobs.get(job_id)
    return label(job) if job is not None else job_id


def behind_code(head: Job, job: Job, head_blocked: bool, disabled: bool) -> str:
    """The code of `job` waiting behind its share's `head` (`waiting` without its sentences,
    for a reader that counts every waiting job: the metric)."""
    if disabled:
        return ENVIRONMENT_DISABLED
    if head_blocked:
        return BEHIND_BLOCKED_HEAD
    return BEHIND_HIGHER_PRIORITY if head.priority > job.priority else BEHIND_EARLIER


def jobs_ahead(state: State, share: Share, job: Job) -> list[str]:
    """RUNNABLE jobs of the share that come before `job` (the share's heap, live entries)."""
    key = job.key()
    seen: set[str] = set()
    for priority, seq, other_id in share.heap:
        other = state.jobs.get(other_id)
        if (other is not None and other.status is JobStatus.RUNNABLE and other.priority == -priority
                and other.seq == seq and (priority, seq, other_id) < key):  # fmt: skip
            seen.add(other_id)
    return sorted(seen)


def in_order(state: State, share: Share, offset: int, limit: int) -> list[Job]:
    """The share's RUNNABLE jobs in dispatch order (its heap's order, stale entries passed
    over as `State.peek` does), the first `offset` skipped, at most `limit`.  A best-first
    walk down the heap: the work follows `offset + limit` (and the stale entries among them),
    not the share's size, so a page of a long queue is as cheap as the first."""
    heap, jobs = share.heap, state.jobs
    found: list[Job] = []
    if not heap or limit <= 0:
        return found
    seen: set[str] = set()  # a job requeued with the same key may have two equal entries
    frontier: list[tuple[tuple[int, int, str], int]] = [(heap[0], 0)]
    size = len(heap)
    while frontier and len(found) < limit:
        entry, index = heappop(frontier)
        job = jobs.get(entry[2])
        if (job is not None and job.status is JobStatus.RUNNABLE and job.key() == entry
                and entry[2] not in seen):  # fmt: skip
            seen.add(entry[2])
            if offset:
                offset -= 1
            else:
                found.append(job)
        for child in (2 * index + 1, 2 * index + 2):
            if child < size:
                heappush(frontier, (heap[child], child))
    return found


# -- the rules of dispatch a head fails, and why preemption does not make room ------------------


def blockers(state: State, environment: Environment, queue: Queue, share: Share, job: Job,
             misfits: list[Misfit] | None = None, preemption: bool = True) -> list[str]:  # fmt: skip
    """Every rule of dispatch `job` fails now (`misfits`, found with the passes' own check
    when not given) in sentences; with `preemption`, also why preemption can't make room."""
    if misfits is None:
        misfits = Scratch(environment, queue).misfits(share, job.need)
    reasons = [misfit_text(misfit, environment, queue, share, label(job)) for misfit in misfits]
    if not preemption or not reasons:
        return reasons
    units = {unit for unit, _ in job.need}
    reasons.extend(_preemption_blockers(queue, share, job, units))
    reasons.extend(_option_blockers(queue, share, job, units, state.time))
    return reasons


def misfit_text(misfit: Misfit, environment: Environment, queue: Queue, share: Share,
                who: str) -> str:  # fmt: skip
    """One rule of dispatch the job fails (a `Misfit`), as a sentence; `who` is how the
    sentence names the job (its `label`)."""
    rule, unit, need, used, limit = misfit.rule, misfit.unit, misfit.need, misfit.used, misfit.limit
    if rule == LACKS_UNIT:
        return f"service environment {environment.name} has no {unit} capacity"
    if rule == ENVIRONMENT_FULL:
        return (f"service environment {environment.name} is full: {misfit.in_use} of its "
                f"{misfit.bound} {unit} are in use and {who} needs {need}")  # fmt: skip
    if rule == MAY_NOT_BORROW:
        where = "is at" if used >= limit else "would go past"
        return (f"{share.name} {where} its own limit ({used} of {limit} {unit} in use, "
                f"{who} needs {need}) and a {share.strategy.value} share may not borrow")
    if rule == BORROW_CEILING:
        return (f"{share.name} has reached its borrow ceiling: it may use at most "
                f"{misfit.bound} {unit} (limit {limit} plus borrowLimit "
                f"{share.borrow_limit_percent}%), uses {used} and {who} needs {need}")
    if rule == NO_IDLE_LENDABLE:
        return (f"it would borrow {misfit.borrowing} {unit} beyond {share.name}'s own limit "
                f"({used} of {limit} in use) but there is no idle lendable capacity in other "
                f"shares: {_pool(queue, share, unit, misfit)}")  # fmt: skip
    if rule == OWN_IDLE_LENT:
        return (f"the idle capacity of {share.name} it would use within its own limit ({used} "
                f"of {limit} {unit} in use, {who} needs {need}) is lent out: "
                f"{_pool(queue, share, unit, misfit)}")  # fmt: skip
    members = [queue.shares[name] for name in queue.groups[misfit.group] if name in queue.shares]
    each = ", ".join(f"{member.name} {member.usage.get(unit, 0)}" for member in members)
    return (f"{share.name} is in share group {misfit.group}, which may hold at most "
            f"{misfit.bound} {unit} when one of its members borrows (an option beyond AWS): its "
            f"members hold {misfit.in_use} ({each}) and {who} needs {need}")  # fmt: skip


def _preemption_blockers(queue: Queue, share: Share, job: Job, units: set[str]) -> list[str]:
    """Why neither cross-share reclaim nor in-share preemption makes room for `job`."""
    reasons: list[str] = []
    if within_own_limit(share, job.need):
        over = [other.name for other in queue.shares.values() if other is not share
                and any(other.usage.get(u, 0) > other.limits.get(u, 0) for u in units)]  # fmt: skip
        if not over:
            reasons.append(f"cross-share reclaim finds nothing to take back: no other share is "
                           f"over its own limit in {', '.join(sorted(units))}")  # fmt: skip
        else:
            reasons.append(f"reclaiming from the shares over their limits ({', '.join(over)}) "
                           "would not make enough room")  # fmt: skip
    running = [other for other in share.dispatched.values()
               if any(unit in units for unit, _ in other.need)]  # fmt: skip
    lower = [other for other in running if other.priority < job.priority]
    listed = ", ".join(f"{label(other)} (priority {other.priority})" for other in running)
    if share.in_share_preemption:
        if running and not lower:
            reasons.append(f"in-share preemption (ENABLED in {share.name}) finds no running job "
                           f"with a priority below {job.priority}: {listed}")  # fmt: skip
        elif lower:
            reasons.append(f"preempting {share.name}'s lower-priority jobs "
                           f"({', '.join(label(other) for other in lower)}) would not make "
                           "enough room")  # fmt: skip
    elif lower:
        reasons.append(f"in-share preemption is DISABLED in {share.name}, so it does not preempt "
                       f"the lower-priority {', '.join(label(other) for other in lower)}")  # fmt: skip
    return reasons


def _pool(queue: Queue, share: Share, unit: str, misfit: Misfit) -> str:
    """Who lends and who borrows `unit` in the queue, from `share`'s point of view (its own
    idle capacity, `misfit.own_idle`, is not part of what others can lend it)."""
    lenders: list[str] = []
    reserve: list[str] = []
    borrowers: list[str] = []
    for other in queue.shares.values():
        used, limit = other.usage.get(unit, 0), other.limits.get(unit, 0)
        if used > limit:
            borrowers.append(f"{other.name} borrows {used - limit}")
        if other is share or used > limit:
            continue
        if other.strategy.lends:
            idle = limit - used
            lends = contribution(other, unit, used)[1]
            capped = f" (lends at most {other.lendable(unit)}: its lending limit)" if lends < idle else ""
            lenders.append(f"{other.name} ({other.strategy.value}) uses {used} of its limit "
                           f"{limit}" + (f", {idle} idle" if idle else "") + capped)  # fmt: skip
        elif limit:
            reserve.append(other.name)
    parts = ["lenders " + ", ".join(lenders) if lenders else "no other share has capacity to lend"]
    if borrowers:
        parts.append("already lent out: " + ", ".join(borrowers))
    if reserve:
        parts.append(", ".join(reserve) + (" is" if len(reserve) == 1 else " are")
                     + " RESERVE and never lend" + ("s" if len(reserve) == 1 else ""))  # fmt: skip
    free = max(0, misfit.pool - misfit.own_idle)
    parts.append(f"idle capacity of other shares not lent out yet: {free} {unit}")
    return "; ".join(parts)


def _option_blockers(queue: Queue, share: Share, job: Job, units: set[str], now: float) -> list[str]:
    """The victims the options beyond AWS keep from preemption now, and until when: jobs of
    other shares over their limits (reclaim) and the share's own lower-priority jobs
    (in-share preemption), per victims.py."""
    candidates = [other for over in queue.shares.values() if over is not share
                  and any(over.usage.get(u, 0) > over.limits.get(u, 0) for u in units)
                  for other in over.dispatched.values()]  # fmt: skip
    if share.in_share_preemption:
        candidates += in_share_candidates(share, job)
    reasons: list[str] = []
    spent: set[str] = set()
    for other in candidates:
        owner = queue.shares[other.share]
        if protected(owner, other, now):
            assert other.dispatched_at is not None and owner.min_runtime_s is not None
            reasons.append(f"{label(other)} of {owner.name} may not be preempted before "
                           f"{when(other.dispatched_at + owner.min_runtime_s)} ({owner.name}'s "
                           f"minimum runtime before preemption is {owner.min_runtime_s} s, an "
                           "option beyond AWS)")  # fmt: skip
        left = budget_left(owner, now)
        if left is not None and left <= 0 and owner.name not in spent and owner.budget is not None:
            spent.add(owner.name)
            most, window = owner.budget
            counted = sorted(at for at in owner.preempted_at if at > now - window)
            reasons.append(f"{owner.name} has spent its preemption budget ({most} preemptions "
                           f"in any {window} s, an option beyond AWS) until "
                           f"{when(counted[-most] + window)}")  # fmt: skip
    return reasons


# -- the borrowers' order under the queue's options beyond AWS ---------------------------------


def has_order_options(queue: Queue) -> bool:
    """Does the queue order its borrowers other than first come, first served?"""
    return bool(queue.groups) or queue.half_life is not None


def borrower_heads(state: State, queue: Queue, now: float) -> list[Pair]:
    """The heads a scheduling pass would now treat as borrowers (passes._place_one step (b):
    beyond their share's own limit, neither blocked for good nor refused by their own share's
    configuration, `passes.placeable`), in the order the core serves them."""
    environment = state.environments[queue.environment]
    pairs: list[Pair] = []
    for share in queue.shares.values():
        head = state.peek(share)
        if head is None or within_own_limit(share, head.need):
            continue
        if blocked_reason(environment, queue, share, head.need) is not None:
            continue
        if not placeable(share, head):
            continue
        pairs.append((share, head))
    return sorted(pairs, key=borrower_key(queue, now))


def order_clauses(queue: Queue, pairs: list[Pair], now: float) -> list[str]:
    """The borrowers' order and what makes it, one clause per rule the queue has."""
    clauses = ["borrowers are served in the order of the queue's options beyond AWS: "
               + ", then ".join(f"{label(head)} of {share.name}" for share, head in pairs)]
    if queue.groups:
        clauses.extend(_group_clauses(queue, pairs))
    if queue.half_life is not None:
        clauses.append(_fair_share_clause(queue, pairs, now))
    return clauses


def _group_clauses(queue: Queue, pairs: list[Pair]) -> list[str]:
    """`group dept lends inside first: ...` for every group that lends all its borrower needs;
    a sentence saying none does when no borrower is lent inside."""
    inside: dict[str, list[str]] = {}
    for share, head in pairs:
        if lent_inside(queue, share, head):
            inside.setdefault(queue.group_of[share.name], []).append(label(head))
    if not inside:
        return ["no share group's other members have idle capacity for all its borrower "
                "needs, so no group lends inside first"]  # fmt: skip
    return [f"group {group} lends inside first: its other members' idle lendable capacity "
            f"covers all {' and '.join(ids)} would borrow"
            for group, ids in inside.items()]  # fmt: skip


def _fair_share_clause(queue: Queue, pairs: list[Pair], now: float) -> str:
    values: list[str] = []
    for share, _ in pairs:
        weight = queue.weights.get(share.name, 1)
        values.append(f"share {share.name}'s decayed borrowing "
                      f"{amount(decayed(queue, share, now))} instance-s / weight {weight} = "
                      f"{amount(fair_value(queue, share, now))}")  # fmt: skip
    ranked = [fair_value(queue, share, now) for share, _ in pairs]
    ties = len(set(ranked)) < len(ranked)
    return (f"idle capacity goes by fair share (half-life {queue.half_life} s), the least "
            f"decayed borrowing per weight first: {', '.join(values)}"
            + ("; equal values go first come, first served" if ties else ""))  # fmt: skip


# -- numbers and times in a sentence -------------------------------------------------------------


def amount(value: float) -> str:
    """Instance-seconds without float noise: 40, 12.5, 0.013 (a tiny value keeps a digit)."""
    if value == 0 or value >= 0.001:
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"


def when(at: float) -> str:
    """An epoch time as an ISO timestamp (UTC); a small logical time (a replay file's) as t=…"""
    return moment(at) if at >= 1e9 else f"t={moment(at)} s"


def moment(at: float | None) -> str:
    """A time in a sentence: an epoch time as an ISO timestamp (UTC, 2026-12-01T17:58:38Z); a
    small logical time (a replay file's) in seconds without float noise: 3, 2.5."""
    if at is None:
        return "?"
    if at >= 1e9:
        stamp = datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")
        return stamp.replace("+00:00", "Z")
    return f"{at:.3f}".rstrip("0").rstrip(".")
