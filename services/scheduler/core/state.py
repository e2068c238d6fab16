"""The shape of scheduler state, and the journal that lets a decision be tried and undone.

State is a plain mutable object graph (environments, queues with their shares, jobs) because a
scheduler with 100k queued jobs cannot copy itself per command.  Only `evolve` changes it.
Purity is kept by the journal: `decide` runs inside `State.trial()`, which records how to undo
every change, and rolls them all back unless the caller commits.

Invariants kept here:
- a share's `usage` equals the sum of the needs of its dispatched jobs, per unit;
- a queue's `usage`, `borrowed` and `idle` totals equal the sums over its shares;
- every RUNNABLE job has an entry with its current key in its share's heap (stale entries,
  left by priority changes, dispatches or undone trials, are skipped lazily).
Mutable containers that are small (usage dicts, dirty sets) are replaced, never mutated, so a
shallow save of an object's slots is enough to undo it; the large ones (heaps, `dispatched`,
`jobs`) are changed in place through helpers that journal the inverse operation.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from events.values import JobStatus, SharingStrategy, State as OnOff

Need = tuple[tuple[str, int], ...]
HeapEntry = tuple[int, int, str]  # (-priority, acceptance seq, job id): heap order = dispatch order


class Job:
    __slots__ = (
        "job_id", "job_name", "queue", "share", "priority", "seq", "need", "status", "attempt",
        "preempted_count", "preemption_retries", "attempts_max", "attempts_used", "retry_rules",
        "attempt_timeout_s", "status_reason", "reason_code", "reason_since", "dispatched_at",
        "dispatch_order", "borrowed", "is_terminated", "client_token", "created_at", "admitted",
    )  # fmt: skip

    def __init__(self, job_id: str, job_name: str, queue: str, share: str, priority: int,
                 seq: int, need: Need, created_at: float) -> None:  # fmt: skip
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

    def key(self) -> HeapEntry:
        return (-self.priority, self.seq, self.job_id)

    def snapshot(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def restore(self, saved: tuple) -> None:
        for name, value in zip(self.__slots__, saved):
            setattr(self, name, value)

    # Pickled (snapshots) as the tuple of its slots: half the bytes of the default
    # slots-dict form, and faster both ways.
    __getstate__ = snapshot
    __setstate__ = restore


class Share:
    __slots__ = (
        "name", "queue", "limits", "strategy", "borrow_limit_percent", "in_share_preemption",
        "state", "config", "usage", "heap", "dispatched", "waits_on",
    )  # fmt: skip

    def __init__(self, name: str, queue: str):
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

    def limit(self, unit: str) -> int:
        return self.limits.get(unit, 0)

    def used(self, unit: str) -> int:
        return self.usage.get(unit, 0)

    def borrow_ceiling(self, unit: str) -> int | None:
        """Most a share may use beyond its own limit for `unit`; None is unlimited.

        A percentage of the own limit, rounded down (ruling: fractional ceilings round down).
        """
        if self.borrow_limit_percent is None:
            return None
        return self.limit(unit) * self.borrow_limit_percent // 100

    def snapshot(self) -> tuple:
        return (self.limits, self.strategy, self.borrow_limit_percent, self.in_share_preemption,
                self.state, self.config, self.usage, self.waits_on)  # fmt: skip

    def restore(self, saved: tuple) -> None:
        (self.limits, self.strategy, self.borrow_limit_percent, self.in_share_preemption,
         self.state, self.config, self.usage, self.waits_on) = saved  # fmt: skip


class Queue:
    __slots__ = (
        "name", "environment", "policy", "priority", "state", "time_limits", "config", "shares",
        "usage", "borrowed", "idle", "lendable", "listing", "dirty", "epoch",
    )  # fmt: skip

    def __init__(self, name: str):
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

    def snapshot(self) -> tuple:
        return (self.environment, self.policy, self.priority, self.state, self.time_limits,
                self.config, self.usage, self.borrowed, self.idle, self.lendable, self.listing,
                self.dirty, self.epoch)  # fmt: skip

    def restore(self, saved: tuple) -> None:
        (self.environment, self.policy, self.priority, self.state, self.time_limits, self.config,
         self.usage, self.borrowed, self.idle, self.lendable, self.listing, self.dirty,
         self.epoch) = saved  # fmt: skip


class Environment:
    __slots__ = ("name", "capacity", "state", "queue", "config")

    def __init__(self, name: str):
        self.name = name
        self.capacity: dict[str, int] = {}
        self.state = OnOff.ENABLED
        self.queue: str | None = None  # the one job queue it serves
        self.config: Any = None

    def snapshot(self) -> tuple:
        return (self.capacity, self.state, self.queue, self.config)

    def restore(self, saved: tuple) -> None:
        self.capacity, self.state, self.queue, self.config = saved


class State:
    """Everything the decision core knows.  Build it only by folding facts (`evolve`)."""

    def __init__(self) -> None:
        self.environments: dict[str, Environment] = {}
        self.policies: dict[str, Any] = {}
        self.queues: dict[str, Queue] = {}
        self.jobs: dict[str, Job] = {}
        self.client_tokens: dict[tuple[str, str], str] = {}  # (queue, token) -> job id
        self.time = 0.0
        self.next_seq = 1  # acceptance order of submissions (ruling 8)
        self.next_dispatch = 1  # dispatch order, for "most recently dispatched"
        self.timeouts: list[tuple[float, str, int]] = []  # (deadline, job id, attempt)
        # RUNNABLE jobs waiting with a reason a time limit may apply to: job id -> (queue, share)
        self.blocked: dict[str, tuple[str, str]] = {}
        # No time limit of a `blocked` job runs out before this (a lower bound, kept by evolve
        # and the timers): while it is ahead, the timers need not look at `blocked` at all.
        self.blocked_due = 0.0
        # Never undone by a trial, so an epoch is never handed out twice: a cached admission
        # result can only match the configuration it was computed under.
        self.epochs = 0
        self._journal: list | None = None
        self._saved: set[int] = set()

    # -- journal -----------------------------------------------------------------------------

    def trial(self) -> Trial:
        return Trial(self)

    def save(self, obj: Any) -> None:
        """Call before changing any slot of `obj` (Job, Share, Queue, Environment or State)."""
        if self._journal is not None and id(obj) not in self._saved:
            self._saved.add(id(obj))
            self._journal.append((obj, obj.snapshot()))

    def on_undo(self, undo: Callable[..., Any], *args: Any) -> None:
        if self._journal is not None:
            self._journal.append((undo, args))

    def snapshot(self) -> tuple:
        return (self.time, self.next_seq, self.next_dispatch, self.blocked_due)

    def restore(self, saved: tuple) -> None:
        self.time, self.next_seq, self.next_dispatch, self.blocked_due = saved

    # -- journaled structural changes --------------------------------------------------------

    def set_time(self, time: float) -> None:
        self.save(self)
        self.time = time

    def take_seq(self) -> int:
        """The next acceptance number (ruling 8: FIFO means acceptance order)."""
        self.save(self)
        self.next_seq += 1
        return self.next_seq - 1

    def take_dispatch(self) -> int:
        self.save(self)
        self.next_dispatch += 1
        return self.next_dispatch - 1

    def block(self, job: Job, queue: Queue) -> None:
        """Register a RUNNABLE job waiting with a reason a time limit may apply to."""
        self.put(self.blocked, job.job_id, (job.queue, job.share))
        seconds = queue.time_limits.get(job.reason_code)
        if seconds is not None and job.reason_since + seconds < self.blocked_due:
            self.save(self)
            self.blocked_due = job.reason_since + seconds

    def put(self, mapping: dict, key: Any, value: Any) -> None:
        if key in mapping:
            self.on_undo(mapping.__setitem__, key, mapping[key])
        else:
            self.on_undo(mapping.pop, key)
        mapping[key] = value

    def drop(self, mapping: dict, key: Any) -> None:
        if key in mapping:
            self.on_undo(mapping.__setitem__, key, mapping.pop(key))

    def push(self, heap: list, entry: Any) -> None:
        # An undone push leaves an entry that no live job matches; it is skipped lazily.
        heapq.heappush(heap, entry)

    def pop(self, heap: list) -> Any:
        entry = heapq.heappop(heap)
        self.on_undo(heapq.heappush, heap, entry)
        return entry

    # -- reads -------------------------------------------------------------------------------

    def head(self, share: Share) -> Job | None:
        """The first RUNNABLE job of a share in dispatch order, dropping stale heap entries."""
        heap = share.heap
        jobs = self.jobs
        while heap:
            priority, seq, job_id = heap[0]
            job = jobs.get(job_id)
            if (
                job is not None
                and job.status is JobStatus.RUNNABLE
                and job.priority == -priority
                and job.seq == seq
            ):
                return job
            self.pop(heap)
        return None

    def new_epoch(self, queue: Queue) -> None:
        """The queue's configuration changed: cached admission results no longer hold."""
        self.epochs += 1
        self.save(queue)
        queue.epoch = self.epochs

    def mark_dirty(self, queue: Queue, *share_names: str) -> None:
        """Mark the named shares (all shares when none are named) for re-evaluation."""
        names = share_names or tuple(queue.shares)
        if not queue.dirty.issuperset(names):
            self.save(queue)
            queue.dirty = queue.dirty.union(names)

    def mark_clean(self, queue: Queue, share_name: str, waits_on: Need = ()) -> None:
        """The share's head was evaluated and cannot be placed now; `waits_on` is the need a
        capacity change must touch to wake it (none: only its own share's changes can)."""
        if share_name in queue.dirty:
            self.save(queue)
            queue.dirty = queue.dirty - {share_name}
            share = queue.shares.get(share_name)
            if share is not None:
                self.save(share)
                share.waits_on = waits_on


class Trial:
    """`with state.trial() as trial: ... trial.commit()`; leaving without commit undoes all."""

    def __init__(self, state: State):
        self.state = state
        self.committed = False

    def __enter__(self) -> Trial:
        if self.state._journal is not None:
            raise RuntimeError("trials do not nest")
        self.state._journal = []
        self.state._saved = set()
        return self

    def commit(self) -> None:
        self.committed = True

    def __exit__(self, *exc_info: Any) -> None:
        journal, self.state._journal = self.state._journal, None
        self.state._saved = set()
        if self.committed:
            return
        for target, payload in reversed(journal):
            if callable(target) and not hasattr(target, "restore"):
                target(*payload)
            else:
                target.restore(payload)
