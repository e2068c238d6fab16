"""The scheduler state, and the journal that lets a decision be tried and undone.

State is a plain mutable object graph (environments, queues with their shares, jobs; their
classes are in entities.py) because a scheduler with 100k queued jobs cannot copy itself per
command.  Only `evolve` changes it.
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

import hashlib
import heapq
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any

from quotasched.events.values import JobStatus
from quotasched.services.scheduler.core.entities import Environment, Job, Need, Queue, Share


FORGOTTEN_MERGE_AT = 4096
JOBS_AT = 3  # where State.image puts the jobs' tuples (the snapshot writer packs them)


def id_digest(job_id: str) -> int:
    """A job id's 64-bit digest (BLAKE2b, the same on every machine)."""
    return int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=8).digest(), "big")


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
        # When a victim may become eligible again under an option beyond AWS (a protection
        # runs out, a preemption leaves a budget's window): (time, job queue), a heap.  Pushed
        # by evolve, popped by the timers, which then look at the queue's waiting heads again.
        self.wakes: list[tuple[float, str]] = []
        # Never undone by a trial, so an epoch is never handed out twice: a cached admission
        # result can only match the configuration it was computed under.
        self.epochs = 0
        # Ended jobs not yet forgotten, per job queue, in the order they ended (so in time
        # order: facts never go back in time): (when it ended, job id).  Retention (timers.py)
        # forgets them from the front.
        self.ended: dict[str, deque[tuple[float, str]]] = {}
        # No ended job is to be forgotten before this (a lower bound, kept by evolve and the
        # timers, as `blocked_due` is): while it is ahead, no command looks at `ended`.
        self.expiry_due = float("inf")
        # The ids of forgotten jobs (JobExpired), as 64-bit digests: 8 bytes a job, so a job
        # id is never used twice (the log and the projection name each job by its id) while
        # memory stays flat in the jobs ever submitted.  The newest wait in `forgotten_new`;
        # every FORGOTTEN_MERGE_AT of them become a sorted array in `forgotten_ids`, whose
        # arrays (largest first) are merged two by two when of like size, so each digest is
        # merged about log2(N / FORGOTTEN_MERGE_AT) times and a lookup bisects that many.
        self.forgotten_ids: list[array] = []
        self.forgotten_new: set[int] = set()
        # The acceptance seqs of the jobs changed, added or dropped since the shell last took
        # this set (None: nobody asks).  A snapshot re-encodes only the jobs around these and
        # reuses the rest of the one before (services/scheduler/snapshots.py).  Marked where the
        # journal is kept (`save`, `put` and `drop` on `jobs`), so whatever a trial could undo
        # is marked, even outside a trial.
        self.changed: set[int] | None = None
        self._journal: list[tuple[Any, Any]] | None = None
        self._saved: set[int] = set()

    # -- journal -----------------------------------------------------------------------------

    def trial(self) -> Trial:
        return Trial(self)

    def save(self, obj: Any) -> None:
        """Call before changing any slot of `obj` (Job, Share, Queue, Environment or State)."""
        if self.changed is not None and isinstance(obj, Job):
            self.changed.add(obj.seq)
        if self._journal is not None and id(obj) not in self._saved:
            self._saved.add(id(obj))
            self._journal.append((obj, obj.snapshot()))

    def touch(self, job: Job) -> None:
        """Call before changing a slot of `job` that no trial undoes (a cache): the next
        snapshot encodes the job again all the same."""
        if self.changed is not None:
            self.changed.add(job.seq)

    def savepoint(self) -> Savepoint:
        """Record from here on, inside a trial or not, so that what follows can be undone
        alone (a refused command leaves no trace: ruling 15)."""
        return Savepoint(self)

    def on_undo(self, undo: Callable[..., Any], *args: Any) -> None:
        if self._journal is not None:
            self._journal.append((undo, args))

    def snapshot(self) -> tuple:
        return (self.time, self.next_seq, self.next_dispatch, self.blocked_due, self.expiry_due)

    def restore(self, saved: tuple) -> None:
        self.time, self.next_seq, self.next_dispatch, self.blocked_due, self.expiry_due = saved

    # Pickled (snapshots) without the journal: a trial is never in progress in a snapshot.
    # Jobs are pickled as the tuples of their slots, not as objects: pickle's per-object
    # protocol (a reduce call, and a memo entry for each job) made the 197k jobs of a state
    # take 1.54 s to pickle, their tuples 0.88 s with building them (2026-12-04, this 2-core
    # machine).
    def __getstate__(self) -> tuple:
        return self.image([job.snapshot() for job in self.jobs.values()])

    def image(self, jobs: Any) -> tuple:
        """What pickles the state, with `jobs` (the jobs' tuples, or what the snapshot writer
        puts in their place) at JOBS_AT."""
        return (self.environments, self.policies, self.queues, jobs, self.client_tokens,
                self.timeouts, self.blocked, self.epochs, self.wakes, self.ended,
                self.forgotten_ids, self.forgotten_new, self.snapshot())  # fmt: skip

    def __setstate__(self, saved: tuple) -> None:
        (self.environments, self.policies, self.queues, jobs, self.client_tokens,
         self.timeouts, self.blocked, self.epochs, self.wakes, self.ended, self.forgotten_ids,
         self.forgotten_new, kept) = saved  # fmt: skip
        self.jobs = {}
        for fields in jobs:
            job = Job()
            job.restore(fields)
            self.jobs[job.job_id] = job
        for queue in self.queues.values():
            for share in queue.shares.values():
                share.dispatched = {job_id: self.jobs[job_id] for job_id in share.dispatched}
        self.restore(kept)
        self.changed = None
        self._journal = None
        self._saved = set()

    def rebuild_heaps(self) -> None:
        """Every share's heap made again from its jobs: an entry for each RUNNABLE job, and
        nothing else.  A heap holds no more than the order the jobs' own slots give (its stale
        entries are passed over wherever it is read), so a snapshot leaves the heaps out and
        its loader calls this (snapshots.py)."""
        for queue in self.queues.values():
            for share in queue.shares.values():
                share.heap = []
        for job in self.jobs.values():
            if job.status is JobStatus.RUNNABLE:
                of_queue = self.queues.get(job.queue)
                of_share = of_queue.shares.get(job.share) if of_queue is not None else None
                if of_share is not None:
                    of_share.heap.append((-job.priority, job.seq, job.job_id))
        for queue in self.queues.values():
            for share in queue.shares.values():
                heapq.heapify(share.heap)

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
        code, since = job.reason_code, job.reason_since
        seconds = None if code is None else queue.time_limits.get(code)
        if seconds is not None and since is not None and since + seconds < self.blocked_due:
            self.save(self)
            self.blocked_due = since + seconds

    def put(self, mapping: dict, key: Any, value: Any) -> None:
        if key in mapping:
            self.on_undo(mapping.__setitem__, key, mapping[key])
            self._mark(mapping, mapping[key])
        else:
            self.on_undo(mapping.pop, key)
        self._mark(mapping, value)
        mapping[key] = value

    def drop(self, mapping: dict, key: Any) -> None:
        if key in mapping:
            self._mark(mapping, mapping[key])
            self.on_undo(mapping.__setitem__, key, mapping.pop(key))

    def _mark(self, mapping: dict, value: Any) -> None:
        """A job entering or leaving `jobs` changes the snapshot's jobs around its seq."""
        if mapping is self.jobs:
            self.touch(value)

    def append_ended(self, queue: str, at: float, job_id: str) -> None:
        ended = self.ended.get(queue)
        if ended is None:
            ended = self.ended[queue] = deque()
            self.on_undo(self.ended.pop, queue)
        ended.append((at, job_id))
        self.on_undo(ended.pop)

    def pop_ended(self, queue: str) -> tuple[float, str]:
        ended = self.ended[queue]
        entry = ended.popleft()
        self.on_undo(ended.appendleft, entry)
        return entry

    def forget_id(self, job_id: str) -> None:
        """Remember that `job_id` named a job that was forgotten (never to be used again)."""
        digest = id_digest(job_id)
        if digest in self.forgotten_new:
            return
        self.forgotten_new.add(digest)
        self.on_undo(self.forgotten_new.discard, digest)
        if len(self.forgotten_new) >= FORGOTTEN_MERGE_AT:
            levels = [*self.forgotten_ids, array("Q", sorted(self.forgotten_new))]
            while len(levels) > 1 and len(levels[-2]) <= len(levels[-1]):
                last = levels.pop()
                levels[-1] = array("Q", sorted((*levels[-1], *last)))
            self.on_undo(self._unmerge, self.forgotten_ids, self.forgotten_new)
            self.forgotten_ids, self.forgotten_new = levels, set()

    def _unmerge(self, ids: list[array], new: set[int]) -> None:
        self.forgotten_ids, self.forgotten_new = ids, new

    def was_forgotten(self, job_id: str) -> bool:
        if not self.forgotten_new and not self.forgotten_ids:
            return False
        digest = id_digest(job_id)
        if digest in self.forgotten_new:
            return True
        for ids in self.forgotten_ids:
            at = bisect_left(ids, digest)
            if at < len(ids) and ids[at] == digest:
                return True
        return False

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

    def peek(self, share: Share) -> Job | None:
        """The share's head, as `head` finds it, without touching the heap: what a reader
        asks (a read must not change the state it reads).  Usually the heap's first entry;
        past stale entries it looks at every entry."""
        heap = share.heap
        jobs = self.jobs
        if not heap:
            return None
        priority, seq, job_id = heap[0]
        job = jobs.get(job_id)
        if job is not None and job.status is JobStatus.RUNNABLE and job.priority == -priority and job.seq == seq:
            return job
        best: Job | None = None
        for priority, seq, job_id in heap:
            job = jobs.get(job_id)
            if job is None or job.status is not JobStatus.RUNNABLE or job.priority != -priority or job.seq != seq:
                continue
            if best is None or (priority, seq) < (-best.priority, best.seq):
                best = job
        return best

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
        journal: list[tuple[Any, Any]] = self.state._journal or []
        self.state._journal = None
        self.state._saved = set()
        if not self.committed:
            _undo(journal)


class Savepoint:
    """A mark in the journal that nests in a trial: `undo()` takes back every change made
    since it was taken, `keep()` keeps them (for an enclosing trial to undo, if any).

    Objects saved before the mark are saved again after it (`_saved` starts afresh), so
    undoing to the mark restores them as they were *at* the mark; an enclosing trial that
    undoes everything replays both saves in reverse and ends at the older one."""

    def __init__(self, state: State):
        self.state = state
        self.outer = state._journal
        self.outer_saved = state._saved
        self.mark = 0 if self.outer is None else len(self.outer)
        if self.outer is None:
            state._journal = []
        state._saved = set()

    def keep(self) -> None:
        state = self.state
        if self.outer is None:
            state._journal, state._saved = None, set()
        else:
            state._saved = self.outer_saved | state._saved

    def undo(self) -> None:
        state = self.state
        journal = state._journal or []
        _undo(journal[self.mark:])
        del journal[self.mark:]
        if self.outer is None:
            state._journal = None
        state._saved = self.outer_saved if self.outer is not None else set()


def _undo(entries: list[tuple[Any, Any]]) -> None:
    """Apply a journal's inverse operations, the latest change first."""
    for index in range(len(entries) - 1, -1, -1):  # (mypyc cannot compile reversed() here)
        target, payload = entries[index]
        if callable(target) and not hasattr(target, "restore"):
            target(*payload)
        else:
            target.restore(payload)
