"""A job's story, gathered: the facts folded with the core's own `evolve`, one command at a
time; what concerns the job told as an `Entry` (a sentence citing its command and time), and
why it waits derived again after every command that could change it.  No I/O here."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from quotasched.events import facts as F
from quotasched.events.labels import job_label
from quotasched.events.values import JobStatus
from quotasched.services.explain.contexts import _dispatch_context, _preemption_context
from quotasched.services.explain.queue_options import passed_over
from quotasched.services.explain.sentences import _sentence
from quotasched.services.explain.waiting import _waiting
from quotasched.services.scheduler.core import State, evolve
from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.waiting import moment as _time
from quotasched.services.scheduler.core.waiting import when, who

WAITING = "Waiting"  # the kind of an entry derived from the state, not a fact of its own


@dataclass(frozen=True)
class Entry:
    at: float
    command_seq: int
    kind: str  # the fact's kind, or "Waiting"
    sentence: str

    def document(self) -> dict[str, Any]:
        return {"at": self.at, "commandSeq": self.command_seq, "kind": self.kind,
                "sentence": self.sentence}  # fmt: skip


class Told(list):
    """A job's story: its entries, and the job's name (empty when no fact gave it), which
    `render` puts first where it names the job (`events.labels`)."""

    def __init__(self, entries: Iterable[Entry] = (), job_id: str = "", name: str = "") -> None:
        super().__init__(entries)
        self.job_id = job_id
        self.name = name


class InconsistentLog(ValueError):
    """The facts can't be folded (a fact refers to a job or share no earlier fact created)."""


# All a log may say about a job once it has finished: the core refuses to change it
# (CommandRejected), ignores reports on it and recognises a repeated submission.
_AFTER_THE_END = (F.CommandRejected, F.JobReportIgnored, F.SubmissionDeduplicated, F.JobExpired)


class Story:
    """A job's story, told as the log's facts arrive, one command's facts at a time.

        story = Story(job_id)
        for fact in facts:
            story.add(fact)
        entries = story.close()

    Once the job has finished (SUCCEEDED or FAILED, which the core never leaves) nothing
    later can change its story but a sentence about a fact naming it, and those facts need
    no state: so the state is no longer folded, and `finished` tells a caller holding raw
    lines that only lines naming the job need decoding (`mentions`)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.state = State()
        self.entries: list[Entry] = []
        self.finished = False
        self._last_wait: tuple | None = None
        self._group: list[F.Fact] = []

    def add(self, fact: F.Fact) -> None:
        if self._group and fact.command_seq != self._group[0].command_seq:
            self._flush()
        self._group.append(fact)

    def close(self) -> Told:
        self._flush()
        job = self.state.jobs.get(self.job_id)
        return Told(self.entries, self.job_id, job.job_name if job is not None else "")

    def _flush(self) -> None:
        group, self._group = self._group, []
        if not group:
            return
        seq = group[0].command_seq
        if self.finished:
            self._after_the_end(seq, group)
            return
        try:
            self._last_wait = _step(self.state, seq, group, self.job_id, self.entries,
                                    self._last_wait)  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError) as error:
            raise InconsistentLog(
                f"the facts of command {seq} can't be folded onto the ones before them "
                f"({type(error).__name__}: {error}); is the log complete? "
                "`quotasched audit verify` finds the first fact that differs"
            ) from None
        job = self.state.jobs.get(self.job_id)
        self.finished = job is not None and job.status.terminal

    def _after_the_end(self, seq: int, group: list[F.Fact]) -> None:
        for fact in group:
            if not _names(fact, self.job_id):
                continue
            if not isinstance(fact, _AFTER_THE_END):
                raise InconsistentLog(
                    f"command {seq}: a {fact.kind} fact names job {self.job_id} after it "
                    "finished; `quotasched audit verify` finds the first fact that differs")
            text = _sentence(self.state, fact, self.job_id, None, None, {})
            if text:
                self.entries.append(Entry(fact.at, fact.command_seq, fact.kind, text))


def explain(facts: Iterable[F.Fact], job_id: str) -> Told:
    """The story of `job_id` as the facts tell it (empty when no fact names the job)."""
    story = Story(job_id)
    for fact in facts:
        story.add(fact)
    return story.close()


def mentions(job_id: str) -> str | None:
    """What the JSON text of every fact naming `job_id` contains, or None when that can't be
    told from the text alone (an id JSON may write escaped: other than printable ASCII, a
    quote or a backslash)."""
    if not job_id.isascii() or not job_id.isprintable() or '"' in job_id or "\\" in job_id:
        return None
    return f'"{job_id}"'


def _step(state: State, seq: int, group: list[F.Fact], job_id: str, story: list[Entry],
          last_wait: tuple | None) -> tuple | None:  # fmt: skip
    """Fold one command's facts, tell what concerns the job, and why it waits now."""
    if not any(_names(fact, job_id) for fact in group):
        for fact in group:
            passed = passed_over(state, fact, job_id)  # read right before the other's dispatch
            evolve(state, fact)
            if passed is not None:
                story.append(Entry(fact.at, seq, fact.kind,
                                   f"{who(state, job_id)} waits (RUNNABLE): {passed}"))
        job = state.jobs.get(job_id)
        if job is None or job.status is not JobStatus.RUNNABLE:
            return last_wait
        if not any(_touches(state, fact, job) for fact in group):
            return last_wait
    else:
        _tell_group(state, group, job_id, story)
        job = state.jobs.get(job_id)
        if job is None:
            return last_wait
    if job.status is not JobStatus.RUNNABLE:
        return None
    key, wait = _waiting(state, job, last_wait)
    told_blocked = any(isinstance(fact, F.ShareBlocked) and fact.job_id == job_id
                       for fact in group)  # fmt: skip
    if wait is not None and key != last_wait and not told_blocked:
        story.append(Entry(group[-1].at, seq, WAITING, wait))
    return key


def _names(fact: F.Fact, job_id: str) -> bool:
    if getattr(fact, "job_id", None) == job_id:
        return True
    return isinstance(fact, F.JobPreempted) and fact.preemptor_job_id == job_id


_NO_CHANGE = (F.CommandRejected, F.JobReportIgnored, F.SubmissionDeduplicated)


def _touches(state: State, fact: F.Fact, job: Job) -> bool:
    """Could this fact change why `job` waits?  (Anything in its job queue or its SE.)"""
    if getattr(fact, "job_queue", None) == job.queue:
        return True
    other = getattr(fact, "job_id", None)
    if other is not None and other in state.jobs and state.jobs[other].queue == job.queue:
        return not isinstance(fact, _NO_CHANGE)
    queue = state.queues.get(job.queue)
    return queue is not None and getattr(fact, "service_environment", None) == queue.environment


# -- one command's facts -----------------------------------------------------------------------


def _tell_group(state: State, group: list[F.Fact], job_id: str, story: list[Entry]) -> None:
    """Fold the facts of one command, telling those that concern the job; contexts (usage,
    candidates) are read from the state right before the fact they explain."""
    preempted_for: dict[str, list[F.JobPreempted]] = {}  # preemptor -> its victims' facts
    context: str | None = None
    for index, fact in enumerate(group):
        before = None
        if isinstance(fact, F.JobPreempted):
            run_start = index == 0 or not (
                isinstance(group[index - 1], F.JobPreempted)
                and group[index - 1].preemptor_job_id == fact.preemptor_job_id
            )
            if run_start:
                victims = _run_of(group, index)
                involved = fact.preemptor_job_id == job_id or any(
                    victim.job_id == job_id for victim in victims)
                context = _preemption_context(state, fact, victims, job_id) if involved else None
            preempted_for.setdefault(fact.preemptor_job_id, []).append(fact)
        elif isinstance(fact, F.JobDispatched) and fact.job_id == job_id:
            before = _dispatch_context(state, fact)
        elif isinstance(fact, F.JobPriorityUpdated) and fact.job_id == job_id:
            job = state.jobs.get(job_id)
            before = job.priority if job is not None else None
        evolve(state, fact)
        if not _names(fact, job_id):
            continue
        text = _sentence(state, fact, job_id, before, context, preempted_for)
        if text:
            story.append(Entry(fact.at, fact.command_seq, fact.kind, text))


def _run_of(group: list[F.Fact], start: int) -> list[F.JobPreempted]:
    first = group[start]
    run = []
    for fact in group[start:]:
        if not isinstance(fact, F.JobPreempted) or fact.preemptor_job_id != first.preemptor_job_id:
            break
        run.append(fact)
    return run


# -- rendering ---------------------------------------------------------------------------------


def render(entries: list[Entry], job_id: str) -> str:
    """The answer first, in one line (where the job stands and why, since when), then the
    story: one entry per fact, its long explanation split at its parts (Why, Right before,
    Candidates...) and clauses, one per line (never inside a clause, so a search for a phrase
    still finds it), times as ISO timestamps (or `t=…` for logical times)."""
    name = getattr(entries, "name", "")
    title = f"{name} (job id {job_id})" if name and name != job_id else job_id
    lines = [headline(entries, job_id), "", f"The story of job {title}, from the fact log:"]
    for entry in entries:
        for number, part in enumerate(_parts(entry.sentence)):
            clauses = part.split("; ")
            first = (f"  [{when(entry.at)}, command {entry.command_seq}, {entry.kind}] "
                     if number == 0 else " " * 6)  # fmt: skip
            lines.append(first + clauses[0] + (";" if len(clauses) > 1 else ""))
            for index, clause in enumerate(clauses[1:], start=2):
                lines.append(" " * 8 + clause + (";" if index < len(clauses) else ""))
    return "\n".join(lines)


def headline(entries: list[Entry], job_id: str) -> str:
    """`med is waiting: it is behind higher-priority job high … (since t=5 s)`: the last
    entry's first clause, and since when it holds."""
    last = entries[-1]
    me = job_label(job_id, getattr(entries, "name", ""))
    clause = _parts(last.sentence)[0].split("; ")[0].rstrip(".")
    clause = clause.replace(f"{me} waits (RUNNABLE): ", f"{me} is waiting: ", 1)
    if not clause.startswith(f"{me} "):
        clause = f"{me}: {clause}"
    end = max(entry.at for entry in entries)
    held = f", {duration(end - last.at)} before the last fact" if end > last.at else ""
    return f"{clause} (since {when(last.at)}{held})"


_PART = re.compile(r"(?<=[.)]) (?=(?:Why|Right before|Candidates|It went|It was|Then|"
                   r"Idle|The job|So|Its)\b|\S+(?: \(\S+\))? was chosen\b)")  # fmt: skip


def _parts(sentence: str) -> list[str]:
    return _PART.split(sentence)


def duration(seconds: float) -> str:
    """3 min 12 s, 2 h 5 min, 0.5 s."""
    if seconds < 60:
        return f"{_time(round(seconds, 1))} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
