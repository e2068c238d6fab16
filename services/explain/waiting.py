"""Why a RUNNABLE job waits, as the core answers it (`scheduler.core.waiting`: the same value
the web view, `get-job-queue-snapshot` and the `quotasched_jobs_waiting` metric show), with
the key that says when the story is worth telling again."""

from __future__ import annotations

from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.core.waiting import waiting


def why_waiting(state: State, job: Job) -> str:
    """Why a RUNNABLE job is not dispatched, as the state stands (after a scheduling pass)."""
    return waiting(state, job).text


def _waiting(state: State, job: Job, told: tuple | None = None) -> tuple[tuple, str | None]:
    """(what would make the story worth telling again, the sentence; None when that is `told`).

    At the head of its share every detail counts (usage, lenders, who runs): the sentence
    itself is the key.  Behind other jobs, the story changes only when the kind of wait does
    (behind a higher-priority job, behind earlier ones, behind a blocked head and its reason,
    the service environment disabled), not with every new head or usage change ahead of it.
    """
    found = waiting(state, job, told)
    if found.head is not None and found.key == told:
        return found.key, None  # the same kind of wait: nothing new to tell
    return found.key, found.text
