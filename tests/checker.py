"""An independent checker of the scheduling rules, over the fact log alone.

It imports nothing from the product (no `services.*`, no `projections.*`, no `events.*`):
only the standard library.  It reads facts as plain dicts with the wire's camelCase names (a
decoded JSON line of `quotasched replay`, or `fact.model_dump(by_alias=True, mode="json")`,
done by the caller), folds them into its own small model, and checks every decision with its
own arithmetic, written from the spec (docs: docs/rules.md, spec section 0 rulings
1-16 and sections 3.3-3.5).  A wrong formula in the core is thus checked against a second,
separately written one, not against itself.

Use:

    checker = IndependentChecker()
    checker.check_command(facts)      # the facts of ONE command; raises RuleBroken
    check_log(facts)                  # a whole log, grouped by commandSeq

What is checked, per command (numbers as in issue 18's brief):

 1. limits at each dispatch: per unit the job needs, the share's usage after the dispatch is
    within its limit, or, only for LEND_AND_BORROW and only in a unit the share lists, within
    limit + floor(limit * borrowLimit / 100) (unlimited for -1/null); the dispatch's
    `borrowed` is exactly the part it adds beyond the limit;
 2. the service environment: it is ENABLED, lists the unit, and sum of usage <= maxCapacity
    per unit after the dispatch;
 3. borrowing backed (ruling 1): per unit, deficit = sum over shares of max(0, U - L) minus
    sum over LEND / LEND_AND_BORROW shares of max(0, L - U); a dispatch never leaves it
    positive and larger than it found it (it may stay <= 0, or not grow);
 4. RESERVE never lends: its idle capacity is not in the sum of 3; LEND never borrows (1);
 5. preemption: every victim named by `afterPreemptionOf` has its JobPreempted (and nothing
    else is preempted); the set is minimal (with any one victim kept, the preemptor does not
    fit); cross-share victims come from another share over its limit, at that moment, in a
    unit both the victim and the preemptor need, and only for a preemptor within its own
    limit (a would-be borrower never reclaims); in-share victims are of the preemptor's own
    share, with in-share preemption ENABLED, strictly lower priority, holding a needed unit;
 6. pass order (rulings 7, 8, 12; spec 3.3): a dispatched job is its share's head (highest
    priority, then earliest acceptance, kept across requeues); owners before borrowers (no
    borrower is dispatched while another share's head fits within its own limit by plain
    dispatch); borrowers first come first served (a borrower's plain dispatch passes no
    earlier-accepted borrower head that fits by plain dispatch; a borrower's in-share
    preemption passes no borrower head that fits by plain dispatch); owners in share order
    (no owner is dispatched while an owner head ranked before it fits by plain dispatch).
    Under the queue's options beyond AWS (SetJobQueueOptions) a borrower's plain dispatch
    passes no borrower head that fits by plain dispatch and comes before it by
    (group rank, D(now) / weight, acceptance): group rank 0 when the other members of the
    head's share group have idle lendable capacity for all it borrows, unit by unit; D the
    share's FAIR_SHARE charge, computed here from the facts (`Charge`: instance-seconds beyond
    its limits per period of H seconds from time 0, halved at each period boundary), equal
    values up to rounding (`_close`) allowing either order;
 7. stability (ruling 4): after each command no share's head fits by plain dispatch;
 9. options beyond AWS (SetQuotaShareOptions, docs/options.md), per victim's share: no
    victim is preempted before its dispatch + minRuntimeBeforePreemptionSeconds; no more than
    preemptionBudget.maxPreemptions of a share's jobs are preempted within any window of
    windowSeconds (counted from when the budget was set); a share with lendingLimits backs at
    most that much of a unit in rule 3's sum; with no option set, nothing changes;
 8. lifecycle: dispatch only from RUNNABLE with attempt + 1, preemption only while
    dispatched with the live attempt and the count/outcome of
    preemptionRetriesBeforeTermination, nothing after SUCCEEDED/FAILED, status changes only
    along the lifecycle, a blocked share names its head, facts about known jobs only, one
    commandSeq per command and increasing, `at` never going backwards (rulings 9, 13);
10. share groups' caps (SetJobQueueOptions): a dispatch that borrows a unit (takes its share
    beyond its own limit in it) leaves its share group's total usage of the unit within the
    group's maxCapacity for it; dispatches within the share's own limit are never held to it.

"Fits by plain dispatch" (`_fits`) is rules 1-3 together, as the spec states them (3.4 rules
1-2, 3.7, rulings 1-3), and a borrowing share's group cap (10), never preempting anything: a
borrower the cap alone holds back is not "left waiting" (7) nor passed over (6).

What is deliberately not checked (conservative, to never report a false violation):
 - the exact victim ranking of 3.5 and ruling 10's single-victim preference (5 checks only
   eligibility and minimality, which every valid choice satisfies);
 - ruling 12's FIFO among borrowers that preempt in their own share (it would need the
   victim search itself), beyond "no borrower head fits by plain dispatch" (likewise the
   options' order among borrowers that preempt in their own share);
 - that an owner's reclaim or in-share preemption was chosen over a later-ranked owner's;
 - static admissibility (which reason a ShareBlocked gives): a blocked head can never fit by
   the rules above, so stability covers it without repeating the core's reason logic;
 - the borrowing-backed rule across configuration changes: lowering a limit, changing a
   strategy or shrinking the service environment may break it without a dispatch (ruling 3
   says they preempt nothing); only dispatches are held to "no worse";
 - units a dispatch does not need (their usage does not change);
 - timers' deadlines (when a time limit or timeout is due) and retryStrategy counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from itertools import groupby
from typing import Any

DISPATCHED = frozenset({"SCHEDULED", "STARTING", "RUNNING"})
TERMINAL = frozenset({"SUCCEEDED", "FAILED"})
LENDERS = frozenset({"LEND", "LEND_AND_BORROW"})  # RESERVE never lends (ruling 2)


class RuleBroken(AssertionError):
    """The fact log breaks a rule of the spec."""


# -- the model -------------------------------------------------------------------------------


@dataclass
class Env:
    capacity: dict[str, int]
    enabled: bool


@dataclass(eq=False)
class Share:
    name: str
    limits: dict[str, int]
    strategy: str
    percent: int | None  # borrow ceiling in percent of the limit; None = unlimited
    in_share: bool
    enabled: bool
    usage: dict[str, int] = field(default_factory=dict)
    runnable: set[str] = field(default_factory=set)  # ids of its RUNNABLE jobs
    min_runtime: float | None = None  # options beyond AWS (9)
    budget: tuple[int, float] | None = None
    preempted_at: list[float] = field(default_factory=list)  # while budgeted
    lending: dict[str, int] = field(default_factory=dict)  # unit -> most of its idle it lends
    charge: Charge | None = None  # its borrowing so far, while its queue is FAIR_SHARE (6)

    def limit(self, unit: str) -> int:
        return self.limits.get(unit, 0)

    def used(self, unit: str) -> int:
        return self.usage.get(unit, 0)


@dataclass
class Queue:
    name: str
    env: str
    enabled: bool
    shares: dict[str, Share] = field(default_factory=dict)  # existing shares, creation order
    usage: dict[str, int] = field(default_factory=dict)  # every dispatched job of the queue
    # its options beyond AWS (SetJobQueueOptions, 6 and 10); all off: AWS's FIFO
    half_life: int | None = None  # FAIR_SHARE's half-life in seconds; None: FIFO
    weights: dict[str, int] = field(default_factory=dict)  # share name -> weight (else 1)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # group -> member names
    caps: dict[str, dict[str, int]] = field(default_factory=dict)  # group -> unit -> maxCapacity
    retention: float = 7 * 86400  # endedJobRetentionSeconds (issue 29); seven days unless set

    def group_of(self, share: Share) -> str | None:
        return next((name for name, members in self.groups.items() if share.name in members), None)


@dataclass(eq=False)
class Job:
    id: str
    queue: str
    share: Share  # the share object it was submitted to (a re-created name is a new share)
    priority: int
    accepted: int  # acceptance order: the order of JobSubmitted, kept across requeues
    need: dict[str, int]
    retries: int | None  # preemptionRetriesBeforeTermination; None = requeue forever
    status: str = "RUNNABLE"
    attempt: int = 0
    preempted: int = 0
    dispatched_at: float | None = None
    ended_at: float | None = None  # when it reached SUCCEEDED or FAILED

    def key(self) -> tuple[int, int]:
        """Order inside a share (3.3, ruling 8): higher priority, then earlier acceptance."""
        return (-self.priority, self.accepted)


def _percent(sharing: dict[str, Any]) -> int | None:
    """The borrow ceiling in percent: 0 unless LEND_AND_BORROW; None (unlimited) for -1/null."""
    if sharing.get("strategy") != "LEND_AND_BORROW":
        return 0
    value = sharing.get("borrowLimit")
    return None if value is None or value == -1 else int(value)


def _lendable(share: Share, unit: str, used: int) -> int:
    """The idle quota a share lends at usage `used`: max(0, L - U) for LEND and
    LEND_AND_BORROW, up to its lending limit (9); RESERVE lends nothing (4)."""
    if share.strategy not in LENDERS:
        return 0
    spare = max(0, share.limit(unit) - used)
    return min(spare, share.lending[unit]) if unit in share.lending else spare


def _need(items: list[dict[str, Any]]) -> dict[str, int]:
    need: dict[str, int] = {}
    for item in items or []:
        need[item["capacityUnit"]] = need.get(item["capacityUnit"], 0) + int(item["quantity"])
    return need


# -- FAIR_SHARE's charge (6) -----------------------------------------------------------------
#
# Written from the definition, not from the core's recurrence: a share's charge keeps what it
# borrowed in each period of H seconds (period k is [kH, (k+1)H), counted from time 0), and
# D(t) = sum over periods j of C[j] / 2**(k - j), k the period of t.  Exact fractions; the
# order check still allows for the core's float rounding (`_close`).

KEPT_PERIODS = 128
"""Periods a charge keeps: an older one counts for at most 2**-128 of itself, far below the
order check's tolerance."""

TOLERANCE = Fraction(1, 10**9)
"""Relative difference under which two D/weight values are a tie (either order is right)."""

FLOOR = Fraction(1, 10**12)
"""Absolute difference under which they are a tie too (a charge decayed to almost nothing)."""


@dataclass(frozen=True)
class Charge:
    """What a share borrowed per period (instance-seconds), accrued up to `since`; `charged`:
    it borrowed at all since its charge started (else D is exactly 0 in any arithmetic)."""

    since: float
    periods: dict[int, Fraction] = field(default_factory=dict)
    charged: bool = False


def beyond_limits(share: Share) -> int:
    """B: the instances the share holds beyond its own limits, summed over units."""
    return sum(max(0, used - share.limit(unit)) for unit, used in share.usage.items())


def accrued(charge: Charge, half_life: int, borrowed: int, to: float) -> Charge:
    """The charge after the share held `borrowed` instances beyond its limits from
    `charge.since` to `to`: each period the interval overlaps gains borrowed x the overlap."""
    if to <= charge.since:
        return charge
    last = int(to // half_life)
    periods = {k: c for k, c in charge.periods.items() if k >= last - KEPT_PERIODS}
    if borrowed:
        start, end = Fraction(charge.since), Fraction(to)
        for k in range(max(int(charge.since // half_life), last - KEPT_PERIODS), last + 1):
            overlap = min(end, (k + 1) * half_life) - max(start, k * half_life)
            if overlap > 0:
                periods[k] = periods.get(k, Fraction(0)) + borrowed * overlap
    return Charge(to, periods, charge.charged or bool(borrowed))


def decayed(charge: Charge, half_life: int, now: float) -> Fraction:
    """D(now): each period's charge halved once per period boundary since."""
    k = int(now // half_life)
    return sum((c / 2 ** max(0, k - j) for j, c in charge.periods.items()), Fraction(0))


def _close(a: Fraction, b: Fraction) -> bool:
    """Equal up to rounding: the core computes D in floats, this checker exactly."""
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b)) + FLOOR


# -- the checker -----------------------------------------------------------------------------


class IndependentChecker:
    """Folds one command's facts at a time into its own model and checks every rule."""

    def __init__(self) -> None:
        self.envs: dict[str, Env] = {}
        self.queues: dict[str, Queue] = {}
        self.jobs: dict[str, Job] = {}
        self.forgotten: set[str] = set()  # ids of expired jobs: never used again
        self.accepted = 0
        self.last_seq: int | None = None
        self.last_at: float | None = None
        self.commands = 0
        self.problems: list[str] = []
        self._victims: list[dict[str, Any]] = []  # JobPreempted facts awaiting their dispatch

    # -- entry points ------------------------------------------------------------------------

    def check_command(self, facts: list[dict[str, Any]]) -> None:
        """Fold and check the facts of one command; raise RuleBroken naming what broke."""
        problems = self.feed_command(facts)
        if problems:
            raise RuleBroken("; ".join(problems))

    def feed_command(self, facts: list[dict[str, Any]]) -> list[str]:
        """Fold and check the facts of one command; return the problems found (none: [])."""
        self.problems = []
        self.commands += 1
        if facts:
            seqs = {fact["commandSeq"] for fact in facts}
            if len(seqs) != 1:
                self._bad(f"one command's facts carry several commandSeq values {sorted(seqs)}")
            seq = max(seqs)
            if self.last_seq is not None and seq <= self.last_seq:
                self._bad(f"commandSeq {seq} does not follow {self.last_seq}")
            self.last_seq = seq
        for fact in facts:
            self._fact(fact)
        if self._victims:
            names = [victim["jobId"] for victim in self._victims]
            self._bad(f"{names} preempted without a dispatch naming them")
            self._victims = []
        self._check_stable()
        return self.problems

    def _bad(self, message: str) -> None:
        self.problems.append(f"[command {self.last_seq}] {message}")

    # -- folding -----------------------------------------------------------------------------

    def _fact(self, fact: dict[str, Any]) -> None:
        kind = fact["kind"]
        at = float(fact["at"])
        if self.last_at is not None and at < self.last_at:  # rulings 9 and 13
            self._bad(f"{kind} at {at} goes back in time from {self.last_at}")
        self.last_at = max(at, self.last_at or at)
        self._accrue(at)  # what was borrowed up to this fact, before the fact changes it
        if self._victims and kind not in ("JobPreempted", "JobDispatched"):
            # A preemption frees capacity for the dispatch that follows it at once (ruling 5).
            self._bad(f"{kind} between preemptions and the dispatch they make room for")
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:  # CommandRejected, SchedulingPolicyCreated: no model change
            handler(fact)

    def _accrue(self, at: float) -> None:
        """Bring every FAIR_SHARE charge up to `at`: usage and limits only change at facts, so
        each share's B was constant since the previous one."""
        for queue in self.queues.values():
            if queue.half_life is None:
                continue
            for share in queue.shares.values():
                if share.charge is not None:
                    share.charge = accrued(share.charge, queue.half_life, beyond_limits(share), at)

    def _on_ServiceEnvironmentCreated(self, fact) -> None:
        self._on_ServiceEnvironmentUpdated(fact)

    def _on_ServiceEnvironmentUpdated(self, fact) -> None:
        capacity = {item["capacityUnit"]: int(item["maxCapacity"]) for item in fact["capacityLimits"]}
        self.envs[fact["serviceEnvironment"]] = Env(capacity, fact["state"] == "ENABLED")

    def _on_JobQueueCreated(self, fact) -> None:
        queue = self.queues.get(fact["jobQueue"])
        if queue is None:
            queue = self.queues[fact["jobQueue"]] = Queue(fact["jobQueue"], fact["serviceEnvironment"], True)
        queue.env = fact["serviceEnvironment"]
        queue.enabled = fact["state"] == "ENABLED"

    _on_JobQueueUpdated = _on_JobQueueCreated

    def _on_QuotaShareCreated(self, fact) -> None:
        queue = self.queues[fact["jobQueue"]]
        name = fact["quotaShareName"]
        sharing = fact["resourceSharingConfiguration"]
        limits = {item["capacityUnit"]: int(item["maxCapacity"]) for item in fact["capacityLimits"]}
        share = queue.shares.get(name)
        if share is None:
            share = queue.shares[name] = Share(name, limits, "", 0, False, True)
            if queue.half_life is not None:  # a new share's charge starts at 0
                share.charge = Charge(float(fact["at"]))
        share.limits = limits
        share.strategy = sharing["strategy"]
        share.percent = _percent(sharing)
        share.in_share = fact["preemptionConfiguration"]["inSharePreemption"] == "ENABLED"
        share.enabled = fact["state"] == "ENABLED"

    _on_QuotaShareUpdated = _on_QuotaShareCreated

    def _on_QuotaShareOptionsSet(self, fact) -> None:
        share = self.queues[fact["jobQueue"]].shares[fact["quotaShareName"]]
        options = fact["options"]
        runtime = options.get("minRuntimeBeforePreemptionSeconds")
        share.min_runtime = None if runtime is None else float(runtime)
        budget = options.get("preemptionBudget")
        share.budget = None if budget is None else (int(budget["maxPreemptions"]),
                                                    float(budget["windowSeconds"]))  # fmt: skip
        if budget is None:
            share.preempted_at = []
        share.lending = {item["capacityUnit"]: int(item["maxCapacity"])
                         for item in options.get("lendingLimits") or []}  # fmt: skip

    def _on_JobQueueOptionsSet(self, fact) -> None:
        """The queue's options beyond AWS, replaced as a whole: FAIR_SHARE's half-life and
        weights (charges start at 0 with a new half-life, end without one) and share groups."""
        queue = self.queues[fact["jobQueue"]]
        options = fact["options"] or {}
        fair = options.get("fairShare")
        if (options.get("idleResourceAssignmentStrategy") == "FAIR_SHARE") != (fair is not None):
            self._bad(f"queue options of {queue.name}: FAIR_SHARE and fairShare go together, got {options}")
        half_life = None if fair is None else int(fair["halfLifeSeconds"])
        if half_life != queue.half_life:
            for share in queue.shares.values():
                share.charge = None if half_life is None else Charge(float(fact["at"]))
        queue.half_life = half_life
        queue.weights = {item["quotaShareName"]: int(item["weight"]) for item in (fair or {}).get("weights") or []}
        groups = options.get("shareGroups") or []
        queue.groups = {group["name"]: tuple(group["quotaShareNames"]) for group in groups}
        queue.caps = {group["name"]: {item["capacityUnit"]: int(item["maxCapacity"])
                                      for item in group.get("maxCapacity") or []}
                      for group in groups}  # fmt: skip
        retention = options.get("endedJobRetentionSeconds")
        queue.retention = 7 * 86400 if retention is None else float(retention)
        named = set(queue.weights) | {name for members in queue.groups.values() for name in members}
        missing = sorted(named - set(queue.shares))
        members = [name for group in groups for name in group["quotaShareNames"]]
        if missing or len(members) != len(set(members)):
            self._bad(f"queue options of {queue.name} name shares that do not exist {missing} or "
                      f"put a share in two groups {members}")  # fmt: skip

    def _on_QuotaShareDeleted(self, fact) -> None:
        queue = self.queues[fact["jobQueue"]]
        share = queue.shares.pop(fact["quotaShareName"], None)
        if share is None:
            self._bad(f"deleted share {fact['quotaShareName']} does not exist")
            return
        left = [job.id for job in self.jobs.values() if job.share is share and job.status not in TERMINAL]
        if left:  # the core ends them (SHARE_DELETED) before the deletion; a job left would
            # keep counting against a share nobody can see
            self._bad(f"share {share.name} deleted while {left} are not finished")

    def _on_JobSubmitted(self, fact) -> None:
        job_id = fact["jobId"]
        if job_id in self.jobs or job_id in self.forgotten:
            self._bad(f"job {job_id} submitted twice")
            return
        queue = self.queues.get(fact["jobQueue"])
        share = queue.shares.get(fact["quotaShareName"]) if queue else None
        if share is None:
            self._bad(f"{job_id} submitted to a share that does not exist")
            return
        self.accepted += 1
        retries = (fact.get("preemptionConfiguration") or {}).get("preemptionRetriesBeforeTermination")
        job = Job(job_id, queue.name, share, int(fact["schedulingPriority"]), self.accepted,
                  _need(fact["capacityUsage"]), retries)  # fmt: skip
        self.jobs[job_id] = job
        share.runnable.add(job_id)

    def _job(self, fact) -> Job | None:
        job = self.jobs.get(fact["jobId"])
        if job is None:
            self._bad(f"{fact['kind']} names an unknown job {fact['jobId']}")
        return job

    def _on_JobExpired(self, fact) -> None:
        """Retention forgets an ended job: never before its queue's retention has passed since
        it ended, with the status it ended with; its id may then be used again."""
        job = self._job(fact)
        if job is None:
            return
        if job.status not in TERMINAL or job.ended_at is None:
            self._bad(f"{job.id} expired while {job.status}")
        else:
            retention = self.queues[job.queue].retention
            if float(fact["at"]) < job.ended_at + retention:
                self._bad(f"{job.id} expired at {fact['at']}, before {job.ended_at} + {retention} s")
            if fact["status"] != job.status or float(fact["endedAt"]) != job.ended_at:
                self._bad(f"{job.id} expired as {fact['status']} ended at {fact['endedAt']}, "
                          f"it was {job.status} since {job.ended_at}")  # fmt: skip
        del self.jobs[job.id]
        self.forgotten.add(job.id)

    def _on_SubmissionDeduplicated(self, fact) -> None:
        self._job(fact)

    def _on_JobReportIgnored(self, fact) -> None:
        self._job(fact)

    def _on_JobPriorityUpdated(self, fact) -> None:
        job = self._job(fact)
        if job is None:
            return
        if job.status in TERMINAL:
            self._bad(f"priority of {job.id} updated after it was {job.status}")
        job.priority = int(fact["schedulingPriority"])

    def _on_ShareBlocked(self, fact) -> None:
        job = self._job(fact)
        if job is None:
            return
        head = self._head(job.share)
        if job.status != "RUNNABLE" or head is not job:
            self._bad(f"share {fact['quotaShareName']} blocked by {job.id} ({job.status}), "
                      f"its head is {head.id if head else None}")  # fmt: skip

    def _on_JobStatusChanged(self, fact) -> None:
        job = self._job(fact)
        if job is None:
            return
        old, new = job.status, fact["status"]
        if old in TERMINAL:
            self._bad(f"{job.id} changed to {new} after it was {old}")
            return
        if int(fact["attempt"]) != job.attempt:
            self._bad(f"{job.id} status change names attempt {fact['attempt']}, its live one is {job.attempt}")
        allowed = {
            "STARTING": old == "SCHEDULED",
            "RUNNING": old in ("SCHEDULED", "STARTING"),
            "SUCCEEDED": old in DISPATCHED,
            "FAILED": True,
            # back to the queue: a retry or capacity bounce of a dispatched attempt, or a
            # queued job whose blocked reason went away
            "RUNNABLE": old in DISPATCHED or (old == "RUNNABLE" and fact.get("cause") == "UNBLOCKED"),
        }.get(new, False)  # SCHEDULED only ever comes from a JobDispatched
        if not allowed:
            self._bad(f"{job.id} went from {old} to {new} ({fact.get('cause')})")
        self._set_status(job, new)

    def _set_status(self, job: Job, new: str) -> None:
        """Move a job to `new`, releasing or taking nothing but what the statuses say."""
        if job.status in DISPATCHED and new not in DISPATCHED:
            self._add(job, -1)
        job.share.runnable.discard(job.id)
        if new in TERMINAL and job.status not in TERMINAL:
            job.ended_at = self.last_at
        job.status = new
        if new == "RUNNABLE":
            job.share.runnable.add(job.id)

    def _add(self, job: Job, sign: int) -> None:
        queue = self.queues[job.queue]
        for unit, n in job.need.items():
            job.share.usage[unit] = job.share.used(unit) + sign * n
            queue.usage[unit] = queue.usage.get(unit, 0) + sign * n

    def _on_JobPreempted(self, fact) -> None:
        # Held until the dispatch it makes room for: the decision is checked as a whole.
        self._victims.append(fact)

    def _on_JobDispatched(self, fact) -> None:
        victims, self._victims = self._victims, []
        job = self._job(fact)
        if job is None:
            return
        queue = self.queues[job.queue]
        share = job.share
        if (fact["jobQueue"], fact["quotaShareName"]) != (job.queue, share.name) or queue.shares.get(share.name) is not share:
            self._bad(f"{job.id} dispatched in {fact['jobQueue']}/{fact['quotaShareName']}, "
                      f"it was submitted to {job.queue}/{share.name} (or its share is gone)")  # fmt: skip
            return
        if _need(fact["capacityUsage"]) != job.need:
            self._bad(f"{job.id} dispatched with {fact['capacityUsage']}, it needs {job.need}")
        named = list(fact.get("afterPreemptionOf") or [])
        preempted = [victim["jobId"] for victim in victims]
        if sorted(named) != sorted(preempted) or len(set(named)) != len(named):
            self._bad(f"{job.id}: afterPreemptionOf {named}, preempted just before {preempted}")
        for victim in victims:
            if victim["preemptorJobId"] != job.id:
                self._bad(f"{victim['jobId']} preempted for {victim['preemptorJobId']}, "
                          f"but {job.id} is dispatched")  # fmt: skip
        # 8. lifecycle of the dispatched job
        if job.status != "RUNNABLE":
            self._bad(f"{job.id} dispatched while {job.status}")
            return
        if int(fact["attempt"]) != job.attempt + 1:
            self._bad(f"{job.id} dispatched as attempt {fact['attempt']} after attempt {job.attempt}")
        owner = self._within_own(share, job.need)  # decided before the victims were freed
        # 6. pass order, in the state the decision was made in
        self._check_order(queue, job, owner, victims)
        # 5. the victims: eligible at the moment each is freed, and a minimal set
        self._check_victims(queue, job, owner, victims)
        # 1-3. the dispatch itself, with the victims' capacity freed (ruling 5)
        self._check_dispatch(queue, job, fact)
        self._set_status(job, "SCHEDULED")
        job.attempt = int(fact["attempt"])
        job.dispatched_at = float(fact["at"])
        self._add(job, +1)

    # -- 1-3: one dispatch -------------------------------------------------------------------

    def _check_dispatch(self, queue: Queue, job: Job, fact) -> None:
        share = job.share
        env = self.envs.get(queue.env)
        if env is None or not env.enabled:
            self._bad(f"{job.id} dispatched while service environment {queue.env} is DISABLED or missing")
            return
        borrowed = _need(fact.get("borrowed") or [])
        expected: dict[str, int] = {}
        for unit, n in job.need.items():
            used, limit = share.used(unit), share.limit(unit)
            after = used + n
            extra = max(0, after - limit) - max(0, used - limit)  # what this job adds beyond L
            if extra:
                expected[unit] = extra
            # 2. the service environment is a hard ceiling (ruling 3)
            cap = env.capacity.get(unit)
            if cap is None or queue.usage.get(unit, 0) + n > cap:
                self._bad(f"{job.id} takes {unit} to {queue.usage.get(unit, 0) + n} of the "
                          f"environment's {cap}")  # fmt: skip
            # 1. limits: beyond L only for LEND_AND_BORROW, only within L + floor(L * % / 100)
            if after > limit:
                if share.strategy != "LEND_AND_BORROW":
                    self._bad(f"{share.strategy} share {share.name} goes to {after} of {unit}, its limit is "
                              f"{limit}: {share.strategy} never borrows")  # fmt: skip
                elif unit not in share.limits:
                    self._bad(f"{share.name} borrows {unit}, a unit it does not list (3.7)")
                elif share.percent is not None and after > limit + limit * share.percent // 100:
                    self._bad(f"{share.name} goes to {after} of {unit}: over its limit {limit} + "
                              f"borrow ceiling {limit * share.percent // 100} ({share.percent} % rounded down)")  # fmt: skip
            # 3. borrowing backed (ruling 1): never made worse once unbacked
            before_deficit = self._deficit(queue, unit)
            after_deficit = self._deficit(queue, unit, share, n)
            if after_deficit > 0 and after_deficit > before_deficit:
                self._bad(f"{job.id} leaves borrowing of {unit} unbacked: beyond-limit use exceeds "
                          f"lenders' idle capacity by {after_deficit} (was {before_deficit})")  # fmt: skip
        if borrowed != expected:
            self._bad(f"{job.id} records borrowed {borrowed}, the part beyond {share.name}'s limit is {expected}")
        for unit in expected:  # 10. a borrowing dispatch keeps its share's group within its cap
            room = self._group_cap(queue, share, unit)
            if room is not None and room[1] + job.need[unit] > room[2]:
                group, held, cap = room
                self._bad(f"rule 10 (group cap): {job.id} of {share.name} borrows {unit} and takes "
                          f"group {group} to {held + job.need[unit]} of it, over its maxCapacity {cap}")  # fmt: skip

    # -- the arithmetic of rules 1-3 ---------------------------------------------------------

    def _deficit(self, queue: Queue, unit: str, extra_share: Share | None = None, extra: int = 0,
                 removed: dict[int, dict[str, int]] | None = None) -> int:  # fmt: skip
        """sum over shares of max(0, U - L) - sum over lending shares of max(0, L - U), with
        `extra` more used by `extra_share` and `removed[id(share)]` less used."""
        beyond = idle = 0
        for share in queue.shares.values():
            used = share.used(unit) + (extra if share is extra_share else 0)
            if removed:
                used -= removed.get(id(share), {}).get(unit, 0)
            limit = share.limit(unit)
            beyond += max(0, used - limit)
            idle += _lendable(share, unit, used)
        return beyond - idle

    def _group_cap(self, queue: Queue, share: Share, unit: str,
                   removed: dict[int, dict[str, int]] | None = None) -> tuple[str, int, int] | None:  # fmt: skip
        """10: (group, what its members hold of `unit`, the group's maxCapacity of it) when
        `share` is in a group with a cap on `unit`, with `removed[id(share)]` freed; else None."""
        group = queue.group_of(share)
        cap = None if group is None else queue.caps[group].get(unit)
        if cap is None:
            return None
        held = 0
        for name in queue.groups[group]:
            member = queue.shares.get(name)
            if member is not None:
                held += member.used(unit) - ((removed or {}).get(id(member), {}).get(unit, 0))
        return group, held, cap

    def _fits(self, queue: Queue, job: Job, removed: list[Job] = ()) -> bool:  # type: ignore[assignment]
        """Would `job` fit by plain dispatch (rules 1-3), with the `removed` jobs' capacity
        freed?  Per unit: the environment has room; any part beyond the share's limit is
        allowed (LEND_AND_BORROW, a listed unit, within the rounded-down ceiling); and the
        unbacked borrowing it leaves is none, or no more than before."""
        env = self.envs.get(queue.env)
        if env is None or not env.enabled:
            return False
        share = job.share
        freed: dict[int, dict[str, int]] = {}
        total_freed: dict[str, int] = {}
        for other in removed:
            slot = freed.setdefault(id(other.share), {})
            for unit, n in other.need.items():
                slot[unit] = slot.get(unit, 0) + n
                total_freed[unit] = total_freed.get(unit, 0) + n
        own_freed = freed.get(id(share), {})
        for unit, n in job.need.items():
            cap = env.capacity.get(unit)
            if cap is None or queue.usage.get(unit, 0) - total_freed.get(unit, 0) + n > cap:
                return False
            used, limit = share.used(unit) - own_freed.get(unit, 0), share.limit(unit)
            if used + n > limit:
                if share.strategy != "LEND_AND_BORROW" or unit not in share.limits:
                    return False
                if share.percent is not None and used + n > limit + limit * share.percent // 100:
                    return False
                room = self._group_cap(queue, share, unit, freed)  # 10: only when it borrows
                if room is not None and room[1] + n > room[2]:
                    return False
            before = self._deficit(queue, unit, removed=freed)
            after = self._deficit(queue, unit, share, n, removed=freed)
            if after > 0 and after > before:
                return False
        return True

    def _within_own(self, share: Share, need: dict[str, int]) -> bool:
        """Does the job fit within its share's own limits (an owner, pass step (a))?"""
        return all(share.used(unit) + n <= share.limit(unit) for unit, n in need.items())

    def _head(self, share: Share) -> Job | None:
        """The share's head: its RUNNABLE job of highest priority, then earliest acceptance."""
        if not share.runnable:
            return None
        return min((self.jobs[job_id] for job_id in share.runnable), key=Job.key)

    def _share_rank(self, share: Share, head: Job) -> tuple:
        """Share order among owners (spec 3.3): lowest max over listed units of U/L, then
        the head's higher priority, then its earlier acceptance, then the share's name."""
        ratio = max((Fraction(share.used(unit), limit) for unit, limit in share.limits.items()),
                    default=Fraction(0))  # fmt: skip
        return (ratio, -head.priority, head.accepted, share.name)

    # -- 6: the pass order -------------------------------------------------------------------

    def _check_order(self, queue: Queue, job: Job, owner: bool, victims: list[dict]) -> None:
        share = job.share
        head = self._head(share)
        if head is not job:
            self._bad(f"{job.id} (priority {job.priority}, accepted #{job.accepted}) dispatched "
                      f"ahead of its share's head {head.id if head else None}"
                      + (f" (priority {head.priority}, accepted #{head.accepted})" if head else ""))  # fmt: skip
            return
        reason = victims[0]["reason"] if victims else None
        for other in queue.shares.values():
            if other is share:
                continue
            rival = self._head(other)
            if rival is None or not self._fits(queue, rival):
                continue  # only heads that would fit by plain dispatch are ever passed over
            rival_owner = self._within_own(other, rival.need)
            if owner and rival_owner and self._share_rank(other, rival) < self._share_rank(share, job):
                self._bad(f"owner {job.id} of {share.name} dispatched while {rival.id} of "
                          f"{other.name}, ranked before it (3.3), fits within its limit")  # fmt: skip
            elif not owner and rival_owner:
                self._bad(f"borrower {job.id} dispatched while {rival.id} of {other.name} fits "
                          f"within its own limit: owners first (ruling 7)")  # fmt: skip
            elif not owner and not rival_owner:
                why = ("plain dispatch comes before any borrower's in-share preemption" if reason is not None
                       else self._borrower_first(queue, (other, rival), (share, job)))  # fmt: skip
                if why:
                    self._bad(f"rule 6 (borrower order): borrower {job.id} of {share.name} (accepted "
                              f"#{job.accepted}) dispatched" + (" by in-share preemption" if reason else "")
                              + f" while borrower {rival.id} of {other.name} (accepted #{rival.accepted}) "
                              f"fits by plain dispatch and comes first: {why} (rulings 7, 8, 12)")  # fmt: skip

    def _borrower_first(self, queue: Queue, first: tuple[Share, Job], then: tuple[Share, Job]) -> str | None:
        """Why borrower head `first` must be served before `then` (6), or None if it need not.
        The order (options beyond AWS, docs/options.md; AWS's FIFO with none):
        1. (share groups) a head whose own group lends all it borrows, before the others;
        2. (FAIR_SHARE) lower D(now) / weight, a tie up to rounding allowing either order
           (exactly 0 for both, when neither share borrowed since its charge started, is a tie
           the next criterion decides);
        3. earlier acceptance (FIFO); distinct heads never tie on it, so the share name, the
           core's last criterion, never decides."""
        lent = [self._lent_inside(queue, share, head) for share, head in (first, then)]
        if lent[0] != lent[1]:
            return (f"its group {queue.group_of(first[0])} lends all it borrows (group rank)"
                    if lent[0] else None)  # fmt: skip
        charges = [share.charge for share, _ in (first, then)]
        if queue.half_life is not None and any(charge is not None and charge.charged for charge in charges):
            mine, theirs = (self._fair_value(queue, share) for share, _ in (first, then))
            if _close(mine, theirs) or mine > theirs:
                return None
            return (f"its share's decayed borrowing per weight is lower, {float(mine):.6g} < "
                    f"{float(theirs):.6g} (FAIR_SHARE)")  # fmt: skip
        if first[1].accepted < then[1].accepted:
            return "FIFO, it was accepted first" + (" and the charges are equal" if queue.half_life else "")
        return None

    def _fair_value(self, queue: Queue, share: Share) -> Fraction:
        """D(now) / weight of a share under FAIR_SHARE (charges are accrued up to now)."""
        value = Fraction(0) if share.charge is None else decayed(share.charge, queue.half_life, self.last_at)
        return value / queue.weights.get(share.name, 1)

    def _lent_inside(self, queue: Queue, share: Share, head: Job) -> bool:
        """Group rank 0: the head's share is in a group whose OTHER members' idle lendable
        capacity covers, unit by unit, all the head would borrow (its need beyond the share's
        limit)."""
        group = queue.group_of(share)
        if group is None:
            return False
        members = [queue.shares[name] for name in queue.groups[group]
                   if name != share.name and name in queue.shares]  # fmt: skip
        for unit, n in head.need.items():
            used, limit = share.used(unit), share.limit(unit)
            borrows = max(0, used + n - limit) - max(0, used - limit)
            if borrows and sum(_lendable(member, unit, member.used(unit)) for member in members) < borrows:
                return False
        return True

    # -- 5: the victims ----------------------------------------------------------------------

    def _check_victims(self, queue: Queue, job: Job, owner: bool, victims: list[dict]) -> None:
        found: list[Job] = []
        for fact in victims:
            victim = self.jobs.get(fact["jobId"])
            if victim is None or victim.status not in DISPATCHED or victim in found:
                self._bad(f"{fact['jobId']} preempted while "
                          f"{victim.status if victim else 'unknown'} (or twice)")  # fmt: skip
                return
            found.append(victim)
        # Preemption is the last resort (3.4 rule 7), and the set is minimal (rulings 6, 10):
        # with nothing preempted, or with any one victim kept, the preemptor does not fit.
        if found and self._fits(queue, job):
            self._bad(f"{job.id} preempted {[v.id for v in found]} although it fits without "
                      "preempting (preemption is the last resort)")  # fmt: skip
        elif len(found) > 1:
            for kept in found:
                if self._fits(queue, job, [v for v in found if v is not kept]):
                    self._bad(f"victim set {[v.id for v in found]} of {job.id} is not minimal: "
                              f"{kept.id} was not needed")  # fmt: skip
                    break
        needed = set(job.need)
        for fact, victim in zip(victims, found):
            reason = fact["reason"]
            held = needed & set(victim.need)
            if reason == "CROSS_SHARE_RECLAIM":
                if not owner:
                    self._bad(f"{job.id} reclaims from other shares although it would borrow (3.4 rule 4)")
                over = [u for u in held if victim.share.used(u) > victim.share.limit(u)]
                if victim.share is job.share or not over:
                    self._bad(f"cross-share victim {victim.id} of {victim.share.name} holds no "
                              f"unit {job.id} needs in which its share is over its limit")  # fmt: skip
            elif reason == "IN_SHARE_PRIORITY":
                if victim.share is not job.share or not job.share.in_share:
                    self._bad(f"in-share victim {victim.id} of {victim.share.name} for {job.id} of "
                              f"{job.share.name} (in-share preemption {job.share.in_share})")  # fmt: skip
                if victim.priority >= job.priority:
                    self._bad(f"in-share victim {victim.id} (priority {victim.priority}) is not "
                              f"strictly lower than {job.id} (priority {job.priority})")  # fmt: skip
                if not held:
                    self._bad(f"in-share victim {victim.id} holds no unit {job.id} needs")
            else:
                self._bad(f"{victim.id} preempted for an unknown reason {reason}")
            if reason != victims[0]["reason"]:
                self._bad(f"victims of {job.id} preempted for different reasons")
            self._check_options(victim, float(fact["at"]))
            self._free(victim, fact)

    def _check_options(self, victim: Job, at: float) -> None:
        """9: the victim's share's options beyond AWS allow this preemption at `at`."""
        share = victim.share
        if share.min_runtime is not None and victim.dispatched_at is not None \
                and at < victim.dispatched_at + share.min_runtime:
            self._bad(f"{victim.id} preempted at {at}, within {share.name}'s minimum runtime "
                      f"({share.min_runtime} s from its dispatch at {victim.dispatched_at})")  # fmt: skip
        if share.budget is not None:
            most, window = share.budget
            share.preempted_at.append(at)
            recent = [t for t in share.preempted_at if t > at - window]
            if len(recent) > most:
                self._bad(f"{share.name} had {len(recent)} jobs preempted within {window} s "
                          f"(up to {at}); its budget allows {most}")  # fmt: skip

    def _free(self, victim: Job, fact: dict[str, Any]) -> None:
        """A victim's preemption: its live attempt, counted against its retries (8)."""
        if int(fact["attempt"]) != victim.attempt:
            self._bad(f"{victim.id} preempted at attempt {fact['attempt']}, its live one is {victim.attempt}")
        count = victim.preempted + 1
        requeue = victim.retries is None or count <= victim.retries
        expected = "REQUEUED" if requeue else "FAILED"
        if fact["outcome"] != expected or int(fact["preemptedAttemptCount"]) != count:
            self._bad(f"{victim.id}'s preemption #{count} is {fact['outcome']} "
                      f"(count {fact['preemptedAttemptCount']}), expected {expected}")  # fmt: skip
        victim.preempted = count
        self._set_status(victim, "RUNNABLE" if fact["outcome"] == "REQUEUED" else "FAILED")

    # -- 7: stability ------------------------------------------------------------------------

    def _check_stable(self) -> None:
        """Ruling 4: after a command, no share's head fits by plain dispatch.  Every share is
        looked at, DISABLED ones and those of a DISABLED queue included: they accept no new
        jobs, but the jobs they hold are still scheduled (spec 1.4, 3.7).  A DISABLED service
        environment places nothing (`_fits` is False there)."""
        for queue in self.queues.values():
            for share in queue.shares.values():
                head = self._head(share)
                if head is not None and self._fits(queue, head):
                    self._bad(f"head {head.id} of {share.name} fits by plain dispatch but was left "
                              "waiting (ruling 4)")  # fmt: skip


def check_log(facts: list[dict[str, Any]], checker: IndependentChecker | None = None) -> IndependentChecker:
    """Check a whole fact log, one command (a run of equal commandSeq) at a time."""
    checker = checker if checker is not None else IndependentChecker()
    for _seq, group in groupby(facts, key=lambda fact: fact["commandSeq"]):
        checker.check_command(list(group))
    return checker
