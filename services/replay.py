"""The offline runner behind `quotasched replay`: a command file through the decision core."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator

from quotasched.events.codec import encode
from quotasched.events.facts import Fact, JobExpired
from quotasched.services.scheduler.core import State, step_raw


def replay_lines(lines: Iterable[bytes | str], state: State | None = None) -> Iterator[Fact]:
    """Facts of every command line, in order.  Line numbers (1-based) are the command seqs,
    so a fact points at its line; a line that is not a command (blank ones included) becomes
    a CommandRejected, because nothing a caller sent may vanish silently."""
    state = state if state is not None else State()
    for number, line in enumerate(lines, start=1):
        if number % 16384 == 0:
            # The state is hundreds of thousands of long-lived objects; without this the
            # cyclic collector rescans them all, again and again, as the replay allocates.
            gc.freeze()
        yield from step_raw(state, line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n"), number)


def replay_file(path: str, state: State) -> Iterator[str]:
    """Encoded facts of a command file, one JSON document per fact."""
    with open(path, "rb") as handle:
        for fact in replay_lines(handle, state):
            yield encode(fact)


class ExpiredJobs:
    """The final records of jobs that retention forgot (JobExpired), so that `replay
    --state-out` still lists every job the file submitted, in acceptance order, as
    contract.md section 4 shows it.  Only the replay keeps this: the service answers such
    jobs from the projection."""

    def __init__(self) -> None:
        self.order: dict[str, None] = {}  # every job id submitted, in acceptance order
        self.records: dict[str, dict] = {}

    def note(self, fact: Fact) -> None:
        if isinstance(fact, JobExpired):
            self.records[fact.job_id] = {
                "status": fact.status.value, "quotaShareName": fact.quota_share_name,
                "schedulingPriority": fact.scheduling_priority,
                "preemptedAttemptCount": fact.preempted_attempt_count, "attempt": fact.attempt,
                "statusReason": fact.status_reason,
            }  # fmt: skip
        else:
            self.order.setdefault(fact.job_id, None)

    def noting(self, facts: Iterable[Fact]) -> Iterator[Fact]:
        """`facts`, each submission and expiry noted on its way through."""
        for fact in facts:
            if fact.kind in ("JobSubmitted", "JobExpired"):
                self.note(fact)
            yield fact

    def complete(self, document: dict) -> dict:
        """`document` (state_document's) with the forgotten jobs put back; a job id used
        again after its job was forgotten shows the newest job."""
        if not self.records:
            return document
        live = document["jobs"]
        document["jobs"] = {job_id: live.get(job_id) or self.records[job_id]
                            for job_id in self.order if job_id in live or job_id in self.records}  # fmt: skip
        return document
