"""Why a RUNNABLE job waits, as the state stands: behind the head of its share (and why the
head waits), a blocked head, or the rules of dispatch it fails itself, and, waiting to borrow
with others under the queue's options beyond AWS, the order they are served in; with the key
that says when the story is worth telling again."""

from __future__ import annotations

from quotasched.events.values import JobStatus
from quotasched.events.values import State as OnOff
from quotasched.services.explain.blockers import _blockers
from quotasched.services.explain.queue_options import waiting_order
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.admission import blocked_reason
from quotasched.services.scheduler.core.entities import Job, Share

# -- why a job waits ---------------------------------------------------------------------------


def why_waiting(state: State, job: Job) -> str:
    """Why a RUNNABLE job is not dispatched, as the state stands (after a scheduling pass)."""
    return _waiting(state, job)[1]


def _waiting(state: State, job: Job, told: tuple | None = None) -> tuple[tuple, str | None]:
    """(what would make the story worth telling again, the sentence; None when that is `told`).

    At the head of its share every detail counts (usage, lenders, who runs): the sentence
    itself is the key.  Behind other jobs, the story changes only when the kind of wait does
    (behind a higher-priority job, behind earlier ones, behind a blocked head and its reason,
    the service environment disabled), not with every new head or usage change ahead of it.
    """
    queue = state.queues.get(job.queue)
    share = queue.shares.get(job.share) if queue is not None else None
    if queue is None or share is None:
        text = f"{job.job_id} waits: its quota share {job.share} no longer exists."
        return (text,), text
    environment = state.environments[queue.environment]
    parts: list[str] = []
    if environment.state is OnOff.DISABLED:
        parts.append(f"service environment {environment.name} is DISABLED, so nothing is "
                     f"dispatched in job queue {queue.name}")  # fmt: skip
    head = state.head(share)
    if head is not None and head is not job:
        blocked = blocked_reason(environment, queue, share, head.need)
        if blocked is not None:
            key: tuple = ("blocked head", blocked[1], environment.state)
        elif head.priority > job.priority:
            key = ("behind higher priority", environment.state)
        else:
            key = ("behind earlier", environment.state)
        if key == told:
            return key, None  # the same kind of wait: nothing new to tell (and no work)
        if blocked is not None:
            text = (f"it is behind the blocked head of {share.name}, {head.job_id}, which can "
                    f"never fit as configured: \"{blocked[1]}\"")
        elif head.priority > job.priority:
            text = (f"it is behind higher-priority job {head.job_id} (priority "
                    f"{head.priority}, its own is {job.priority}) at the head of {share.name}")
        else:
            text = (f"it is behind {head.job_id}, submitted earlier with the same priority "
                    f"{job.priority}, at the head of {share.name}")
        ahead = _ahead(state, share, job)
        if len(ahead) > 1:
            text += f" ({len(ahead)} jobs are ahead of it in {share.name})"
        parts.append(text)
        if blocked is None:
            reasons = _blockers(state, environment, queue, share, head)
            if reasons:
                parts.append(f"{head.job_id} itself waits because " + "; ".join(reasons))
        return key, f"{job.job_id} waits (RUNNABLE): " + "; ".join(parts) + "."
    blocked = blocked_reason(environment, queue, share, job.need)
    if blocked is not None:
        parts.append(f"it heads {share.name}, which is blocked because it can never fit as "
                     f"configured: \"{blocked[1]}\"")  # fmt: skip
    else:
        parts.extend(_blockers(state, environment, queue, share, job))
    if not parts:
        parts.append("nothing keeps it waiting as things stand; the next scheduling pass "
                     "dispatches it")  # fmt: skip
    text = f"{job.job_id} waits (RUNNABLE): " + "; ".join(parts) + "."
    order = waiting_order(state, queue, job) if blocked is None else None
    if order is None:
        return (text,), text
    # The order's values (decayed borrowing) move with the clock: the story is told again
    # when the order changes, or anything else does, not at every command.
    ids, clauses = order
    return (text, ids), f"{text[:-1]}; {clauses}."


def _ahead(state: State, share: Share, job: Job) -> list[str]:
    """RUNNABLE jobs of the share that come before `job` (the share's heap, live entries)."""
    key = job.key()
    seen = set()
    for priority, seq, other_id in share.heap:
        other = state.jobs.get(other_id)
        if (other is not None and other.status is JobStatus.RUNNABLE and other.priority == -priority
                and other.seq == seq and (priority, seq, other_id) < key):
            seen.add(other_id)
    return sorted(seen)
