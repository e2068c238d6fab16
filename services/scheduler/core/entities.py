"""The objects scheduler state is made of: jobs, quota shares, job queues, environments.

Each one has `__slots__` and a `snapshot`/`restore` pair: `State.save(obj)` keeps a snapshot
before a slot changes, so a trial can be undone (state.py).  Only `evolve` changes them.

Scheduler snapshots pickle them.  Each says what it pickles to (`__getstate__`): the same
tuple whether the core runs interpreted or compiled, so either can load a snapshot the other
wrote.  Every constructor argument has a default because mypyc's classes are unpickled by
calling the class with none, then `__setstate__`.
"""

from __future__ import annotations

from typing import Any, cast

from quotasched.events.values import JobStatus, SharingStrategy, State as OnOff

Need = tuple[tuple[str, int], ...]
HeapEntry = tuple[int, int, str]  # (-priority, acceptance seq, job id): heap order = dispatch order


# A job's fields, in the order of its `snapshot()`: readers that list them (views.py) use this,
# since a class compiled by mypyc has no `__slots__` attribute to read.
JOB_FIELDS: tuple[str, ...] = (
    "job_id", "job_name", "queue", "share", "priority", "seq", "need", "status", "attempt",
    "preempted_count", "preemption_retries", "attempts_max", "attempts_used", "retry_rules",
    "attempt_timeout_s", "status_reason", "reason_code", "reason_since", "dispatched_at",
    "dispatch_order", "borrowed", "is_terminated", "client_token", "created_at", "admitted",
    "tags", "payload", "history", "stopped_at",
)  # fmt: skip

# A job's attempt record, as DescribeServiceJob shows it: (attempt, dispatched at, started at
# or None, stopped at or None, status reason or None, preempted?).  A job keeps its most recent
# HISTORY_KEPT records: every dispatch is an attempt, and preemptions may requeue a job without
# end (spec 0 item 21 suggests a window of 10).
Attempt = tuple[int, float, Any, Any, Any, bool]
HISTORY_KEPT = 10


class Job:
    __slots__ = JOB_FIELDS

    def __init__(self, job_id: str = "", job_name: str = "", queue: str = "", share: str = "",
                 priority: int = 0, seq: int = 0, need: Need = (),
                 created_at: float = 0.0) -> None:  # fmt: skip
        self.job_id = job_id
        self.job_name = job_name
        self.queue = queue
        self.share = share
        self.priority = priority
        self.seq = seq
        self.need = need
        self.created_at = created_at
        self.status = JobStatus.RUNNABLE
        self.attempt = 0
        self.preempted_count = 0
        self.preemption_retries: int | None = None  # None: requeue after every preemption
        self.attempts_max = 1
        self.attempts_used = 1  # placing the job into RUNNABLE the first time is attempt 1
        self.retry_rules: tuple = ()
        self.attempt_timeout_s: int | None = None
        self.status_reason: str | None = None
        self.reason_code: str | None = None  # blocked / capacity reason code while RUNNABLE
        self.reason_since: float | None = None
        self.dispatched_at: float | None = None
        self.dispatch_order = 0
        self.borrowed: Need = ()
        self.is_terminated = False
        self.client_token: str | None = None
        self.admitted = 0  # config epoch under which this job was last found admissible
        # What DescribeServiceJob shows and no decision reads: the submission's tags and
        # payload as given, the recent attempts, and when the job reached SUCCEEDED/FAILED.
        self.tags: tuple = ()
        self.payload: str | None = None
        self.history: tuple = ()
        self.stopped_at: float | None = None

    def key(self) -> HeapEntry:
        return (-self.priority, self.seq, self.job_id)

    # Every slot, in `__slots__` order: written out rather than read with getattr, so the
    # compiled core (see __init__.py) keeps them as native attributes.
    def snapshot(self) -> tuple:
        return (
            self.job_id, self.job_name, self.queue, self.share, self.priority, self.seq,
            self.need, self.status, self.attempt, self.preempted_count,
            self.preemption_retries, self.attempts_max, self.attempts_used, self.retry_rules,
            self.attempt_timeout_s, self.status_reason, self.reason_code, self.reason_since,
            self.dispatched_at, self.dispatch_order, self.borrowed, self.is_terminated,
            self.client_token, self.created_at, self.admitted, self.tags, self.payload,
            self.history, self.stopped_at,
        )  # fmt: skip

    def restore(self, saved: tuple) -> None:
        (
            self.job_id, self.job_name, self.queue, self.share, self.priority, self.seq,
            self.need, self.status, self.attempt, self.preempted_count,
            self.preemption_retries, self.attempts_max, self.attempts_used, self.retry_rules,
            self.attempt_timeout_s, self.status_reason, self.reason_code, self.reason_since,
            self.dispatched_at, self.dispatch_order, self.borrowed, self.is_terminated,
            self.client_token, self.created_at, self.admitted, self.tags, self.payload,
            self.history, self.stopped_at,
        ) = saved  # fmt: skip

    # Pickled (snapshots) as the tuple of its slots: half the bytes of the default
    # slots-dict form, and faster both ways.
    def __getstate__(self) -> tuple:
        return self.snapshot()

    def __setstate__(self, saved: tuple) -> None:
        self.restore(saved)


class Share:
    __slots__ = (
        "name", "queue", "limits", "strategy", "borrow_limit_percent", "in_share_preemption",
        "state", "config", "usage", "heap", "dispatched", "waits_on", "min_runtime_s",
        "budget", "preempted_at", "lending", "options", "charge", "live", "submissions",
    )  # fmt: skip

    def __init__(self, name: str = "", queue: str = ""):
        self.name = name
        self.queue = queue
        self.limits: dict[str, int] = {}
        self.strategy = SharingStrategy.RESERVE
        self.borrow_limit_percent: int | None = 0  # None: unlimited (AWS's -1)
        self.in_share_preemption = False
        self.state = OnOff.ENABLED
        self.config: Any = None  # the QuotaShareCreated/Updated fact that set the configuration
        self.usage: dict[str, int] = {}
        self.heap: list[HeapEntry] = []
        self.dispatched: dict[str, Job] = {}  # insertion order = dispatch order
        # While the share is clean (see passes.py): the need of the head that could not be
        # placed; only a change to one of these units can let it through.
        self.waits_on: Need = ()
        # quotasched's options beyond AWS (SetQuotaShareOptions; None: off).  See victims.py.
        self.min_runtime_s: int | None = None  # no victim before this long after its dispatch
        self.budget: tuple[int, int] | None = None  # (most preemptions, window seconds)
        self.preempted_at: tuple[float, ...] = ()  # its latest preemptions, while budgeted
        self.lending: dict[str, int] | None = None  # unit -> most of its idle quota it lends
        self.options: Any = None  # the QuotaShareOptionsSet fact that set them
        # Under its queue's FAIR_SHARE (fairshare.py): (period, charge in it, decayed charge of
        # the periods before, time accrued to); () when its queue assigns idle capacity FIFO.
        self.charge: tuple = ()
        # Admission limits (limits.py): its jobs not yet ended, and (second, submissions in
        # it, bytes window, bytes in it) of its latest accepted submission; () before any.
        self.live = 0
        self.submissions: tuple = ()

    def limit(self, unit: str) -> int:
        return self.limits.get(unit, 0)

    def used(self, unit: str) -> int:
        return self.usage.get(unit, 0)

    def lendable(self, unit: str) -> int:
        """What others may ever borrow of its quota of `unit`: its limit when it lends, capped
        by its lending limit (an option beyond AWS); 0 for RESERVE."""
        if not self.strategy.lends:
            return 0
        limit = self.limits.get(unit, 0)
        cap = None if self.lending is None else self.lending.get(unit)
        return limit if cap is None or cap > limit else cap

    def borrow_ceiling(self, unit: str) -> int | None:
        """Most a share may use beyond its own limit for `unit`; None is unlimited.

        A percentage of the own limit, rounded down (ruling: fractional ceilings round down).
        """
        if self.borrow_limit_percent is None:
            return None
        return self.limit(unit) * self.borrow_limit_percent // 100

    def snapshot(self) -> tuple:
        return (self.limits, self.strategy, self.borrow_limit_percent, self.in_share_preemption,
                self.state, self.config, self.usage, self.waits_on, self.min_runtime_s,
                self.budget, self.preempted_at, self.lending, self.options, self.charge,
                self.live, self.submissions)  # fmt: skip

    def restore(self, saved: tuple) -> None:
        (self.limits, self.strategy, self.borrow_limit_percent, self.in_share_preemption,
         self.state, self.config, self.usage, self.waits_on, self.min_runtime_s, self.budget,
         self.preempted_at, self.lending, self.options, self.charge, self.live,
         self.submissions) = saved  # fmt: skip

    # Pickled with its dispatched jobs by id: the jobs themselves are pickled once, by the
    # State (as tuples), which links them back here when it is unpickled (State.__setstate__).
    def __getstate__(self) -> tuple:
        return (self.name, self.queue, self.heap, tuple(self.dispatched), self.snapshot())

    def __setstate__(self, saved: tuple) -> None:
        self.name, self.queue, self.heap, dispatched, kept = saved
        # job ids only, until the State links them
        self.dispatched = cast("dict[str, Job]", dict.fromkeys(dispatched))
        self.restore(kept)


class Queue:
    __slots__ = (
        "name", "environment", "policy", "priority", "state", "time_limits", "config", "shares",
        "usage", "borrowed", "idle", "lendable", "listing", "dirty", "epoch", "half_life",
        "weights", "group_of", "groups", "group_limits", "options",
    )  # fmt: skip

    def __init__(self, name: str = ""):
        self.name = name
        self.environment = ""
        self.policy = ""
        self.priority = 1
        self.state = OnOff.ENABLED
        self.time_limits: dict[str, int] = {}  # blocked reason code -> seconds before TERMINATE
        self.config: Any = None
        self.shares: dict[str, Share] = {}  # creation order
        # Totals over the shares, per capacity unit (see accounting.py for the meaning):
        self.usage: dict[str, int] = {}  # sum of U
        self.borrowed: dict[str, int] = {}  # sum of max(0, U - L)
        self.idle: dict[str, int] = {}  # sum over lending shares of max(0, L - U)
        self.lendable: dict[str, int] = {}  # sum over lending shares of L (configured)
        self.listing: dict[str, tuple[str, ...]] = {}  # unit -> shares with a limit for it
        # Shares whose head may have become placeable since it was last evaluated.
        self.dirty: frozenset[str] = frozenset()
        # Changes whenever anything admission depends on changes (see State.new_epoch).
        self.epoch = 0
        # quotasched's queue options beyond AWS (SetJobQueueOptions; see fairshare.py):
        self.half_life: int | None = None  # FAIR_SHARE's half-life; None: FIFO (AWS)
        self.weights: dict[str, int] = {}  # share -> fair-share weight (1 when not listed)
        self.group_of: dict[str, str] = {}  # share -> its share group
        self.groups: dict[str, tuple[str, ...]] = {}  # group -> its shares
        self.group_limits: dict[str, dict[str, int]] = {}  # group -> unit -> most it holds
        self.options: Any = None  # the JobQueueOptionsSet fact that set them

    def group_cap(self, share: str, unit: str) -> tuple[str, int] | None:
        """(group, its limit for `unit`) when `share` is in a share group that caps the unit."""
        group = self.group_of.get(share)
        caps = None if group is None else self.group_limits.get(group)
        cap = None if caps is None else caps.get(unit)
        return None if group is None or cap is None else (group, cap)

    def snapshot(self) -> tuple:
        return (self.environment, self.policy, self.priority, self.state, self.time_limits,
                self.config, self.usage, self.borrowed, self.idle, self.lendable, self.listing,
                self.dirty, self.epoch, self.half_life, self.weights, self.group_of, self.groups,
                self.group_limits, self.options)  # fmt: skip

    def restore(self, saved: tuple) -> None:
        (self.environment, self.policy, self.priority, self.state, self.time_limits, self.config,
         self.usage, self.borrowed, self.idle, self.lendable, self.listing, self.dirty,
         self.epoch, self.half_life, self.weights, self.group_of, self.groups,
         self.group_limits, self.options) = saved  # fmt: skip

    def __getstate__(self) -> tuple:
        return (self.name, self.shares, self.snapshot())

    def __setstate__(self, saved: tuple) -> None:
        self.name, self.shares, kept = saved
        self.restore(kept)


class Environment:
    __slots__ = ("name", "capacity", "state", "queue", "config")

    def __init__(self, name: str = ""):
        self.name = name
        self.capacity: dict[str, int] = {}
        self.state = OnOff.ENABLED
        self.queue: str | None = None  # the one job queue it serves
        self.config: Any = None

    def snapshot(self) -> tuple:
        return (self.capacity, self.state, self.queue, self.config)

    def restore(self, saved: tuple) -> None:
        self.capacity, self.state, self.queue, self.config = saved

    def __getstate__(self) -> tuple:
        return (self.name, self.snapshot())

    def __setstate__(self, saved: tuple) -> None:
        self.name, kept = saved
        self.restore(kept)
