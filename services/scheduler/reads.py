"""The read side's index of jobs, so that ListServiceJobs costs its page, not the job count.

The decision core keeps jobs in one dict (`State.jobs`, in acceptance order) and knows
nothing of reads.  This module, in the shell, indexes what never changes about a job (its
queue, share, name and acceptance `seq`) and is caught up by the reader itself: jobs are only
ever added to `State.jobs` at its end, with a `seq` above every other's, so the jobs not
indexed yet are those at its end with a `seq` above the last indexed.  Jobs leave the dict
when their queue's retention forgets them (JobExpired): their entries here go stale, are
skipped by every walk, and are dropped by rebuilding the index once they outnumber the live
jobs (and `COMPACT_ABOVE`), so the index holds at most about twice what the state does.  A
job's status does change; it is read from the job itself, and the jobs holding capacity are
found through their shares' `dispatched` maps.

Invariants:
- every list here is in ascending `seq` (newest last), so "newest first, older than a cursor"
  is a bisect and a backwards walk;
- `Selection` examines at most `SCAN_BUDGET` jobs (plus its page) per page, whatever the number
  of jobs, and says where it stopped: a page may come back short with a cursor, as AWS's
  ListServiceJobs pages may.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.state import State

SCAN_BUDGET = 2_000  # most jobs one request examines beyond its page (about 1 ms)
INDEX_CHUNK = 500  # jobs indexed between two yields to the event loop (about 1 ms)
COMPACT_ABOVE = 10_000  # stale entries (forgotten jobs) tolerated before a rebuild
DISPATCHED = ("SCHEDULED", "STARTING", "RUNNING")
LAST_CHAR = chr(0x10FFFF)
NEVER_HELD = ("SUBMITTED", "PENDING")  # statuses no job of the state ever has


def _seq(job: Job) -> int:
    return job.seq


@dataclass
class QueueIndex:
    jobs: list[Job] = field(default_factory=list)
    by_share: dict[str, list[Job]] = field(default_factory=dict)
    by_name: dict[str, list[Job]] = field(default_factory=dict)  # lower-cased name -> jobs
    names: list[str] = field(default_factory=list)  # the keys of by_name, sorted


class ReadIndex:
    """An index of one `State`'s jobs; a new state (a new term) needs a new index."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.jobs = state.jobs  # the dict indexed
        self.queues: dict[str, QueueIndex] = {}
        self.entries = 0  # jobs indexed, live or stale
        # At a (re)start the dict's jobs, oldest first, indexed a chunk at a time from `at`;
        # then jobs with a seq above `last_seq` (submitted since) from the dict's end.
        self.backlog: list[Job] | None = list(state.jobs.values())
        self.at = 0
        self.last_seq = self.backlog[-1].seq if self.backlog else 0

    def pending(self) -> int:
        """At most how many jobs are still to index."""
        backlog = 0 if self.backlog is None else len(self.backlog) - self.at
        return backlog + max(0, self.state.next_seq - 1 - self.last_seq)

    def stale(self) -> int:
        return self.entries - len(self.state.jobs)

    def catch_up(self, most: int | None = None) -> int:
        """Index up to `most` (None: all) of the jobs added since the last call; returns how
        many are left.  The newest come from the end of the dict, so this costs what it adds."""
        if self.state.jobs is not self.jobs or self.stale() > max(COMPACT_ABOVE, len(self.state.jobs)):
            self.__init__(self.state)  # another dict, or too many forgotten jobs: start over
        if self.backlog is not None:
            stop = len(self.backlog) if most is None else min(len(self.backlog), self.at + most)
            for job in self.backlog[self.at:stop]:
                self._add(job)
            taken, self.at = stop - self.at, stop
            if stop < len(self.backlog):
                return self.pending()
            self.backlog = None
            if most is not None:
                most -= taken
        added: list[Job] = []
        for job in reversed(self.state.jobs.values()):
            if job.seq <= self.last_seq:
                break
            added.append(job)
        added.reverse()
        if most is not None and len(added) > most:
            added = added[:most]
            self.last_seq = added[-1].seq if added else self.last_seq
        else:  # every job since: the newest may have been forgotten already
            self.last_seq = self.state.next_seq - 1
        for job in added:
            self._add(job)
        return self.pending()

    def live(self, walk: Iterator[Job]) -> Iterator[Job]:
        """The jobs of `walk` still in the state (not forgotten, nor replaced under their id)."""
        jobs = self.state.jobs
        return (job for job in walk if jobs.get(job.job_id) is job)

    def _add(self, job: Job) -> None:
        self.entries += 1
        index = self.queues.get(job.queue)
        if index is None:
            index = self.queues[job.queue] = QueueIndex()
        for jobs in (index.jobs, index.by_share.setdefault(job.share, [])):
            _append(jobs, job)
        name = job.job_name.lower()
        named = index.by_name.get(name)
        if named is None:
            named = index.by_name[name] = []
            insort(index.names, name)
        _append(named, job)

    # -- lookups --------------------------------------------------------------------------

    def candidates(self, queue: str, shares: set[str], patterns: list[str],
                   status: str, before_seq: int | None) -> Iterator[Job] | None:  # fmt: skip
        """The queue's jobs that may match, newest first, older than `before_seq`; None
        when an indexed lookup would cost more than a scan (the caller then scans the queue's
        jobs with the full predicate)."""
        index = self.queues.get(queue)
        if index is None:
            return iter(())
        if patterns:
            lists = self._named(index, patterns)
            if lists is None:
                return None
            return self.live(_newest_first_merged(lists, before_seq))
        if status in NEVER_HELD:
            return iter(())
        if status in DISPATCHED:
            return self._dispatched(queue, shares, status, before_seq)
        if shares:
            return self.live(_newest_first_merged([index.by_share.get(s, []) for s in shares], before_seq))
        return self.live(_newest_first(index.jobs, before_seq))

    def scan(self, queue: str, before_seq: int | None) -> Iterator[Job]:
        index = self.queues.get(queue)
        return iter(()) if index is None else self.live(_newest_first(index.jobs, before_seq))

    def _named(self, index: QueueIndex, patterns: list[str]) -> list[list[Job]] | None:
        keys: set[str] = set()
        for pattern in patterns:
            pattern = pattern.lower()
            if not pattern.endswith("*"):
                if pattern in index.by_name:
                    keys.add(pattern)
                continue
            prefix = pattern[:-1]
            # the names with the prefix: contiguous in sorted order, before prefix + the last
            # code point
            start = bisect_left(index.names, prefix)
            stop = bisect_left(index.names, prefix + LAST_CHAR, start)
            if stop - start > SCAN_BUDGET:
                return None
            keys.update(index.names[start:stop])
            if len(keys) > SCAN_BUDGET:
                return None
        return [index.by_name[key] for key in keys]

    def _dispatched(self, queue: str, shares: set[str], status: str,
                    before_seq: int | None) -> Iterator[Job]:  # fmt: skip
        """The jobs holding capacity: few (bounded by the queue's capacity), found through
        their shares rather than among every job."""
        held = self.state.queues.get(queue)
        if held is None:
            return iter(())
        found = [job for share in held.shares.values() if not shares or share.name in shares
                 for job in share.dispatched.values()
                 if job.status.value == status and (before_seq is None or job.seq < before_seq)]
        found.sort(key=_seq, reverse=True)
        return iter(found)


def _append(jobs: list[Job], job: Job) -> None:
    if jobs and jobs[-1].seq > job.seq:  # not expected (acceptance order), but kept sorted
        insort(jobs, job, key=_seq)
    else:
        jobs.append(job)


def _newest_first(jobs: list[Job], before_seq: int | None) -> Iterator[Job]:
    end = len(jobs) if before_seq is None else bisect_left(jobs, before_seq, key=_seq)
    return (jobs[i] for i in range(end - 1, -1, -1))


def _newest_first_merged(lists: list[list[Job]], before_seq: int | None) -> Iterator[Job]:
    walks = [_newest_first(jobs, before_seq) for jobs in lists if jobs]
    if len(walks) == 1:
        return walks[0]
    return heapq.merge(*walks, key=lambda job: -job.seq)


class Selection:
    """Up to `limit` jobs of `walk` that `keep`, examining at most `limit + budget` (`kept`),
    and the cursor to continue from (`next_seq`: the seq below which the rest lies), or None
    when nothing more matches.  With the page full, it looks on for one more match, so that a
    listing does not end with an empty page; when the budget runs out first, it gives a cursor
    anyway.  `steps` does the work, pausing every `STEP` jobs examined (about 0.05 ms), so that
    a service can let the decisions run between (see `api.JobPage`)."""

    STEP = 100

    def __init__(self, walk: Iterator[Job], keep: Callable[[Job], bool], limit: int,
                 budget: int = SCAN_BUDGET) -> None:  # fmt: skip
        self.walk, self.keep, self.limit, self.budget = walk, keep, limit, budget
        self.kept: list[Job] = []
        self.next_seq: int | None = None

    def steps(self) -> Iterator[None]:
        kept, keep, limit = self.kept, self.keep, self.limit
        skipped = examined = 0
        for job in self.walk:
            examined += 1
            if examined % self.STEP == 0:
                yield
            if not keep(job):
                skipped += 1
                if skipped >= self.budget:
                    self.next_seq = job.seq
                    return
            elif len(kept) < limit:
                kept.append(job)
            else:  # one more match: there is a next page
                self.next_seq = kept[-1].seq
                return

