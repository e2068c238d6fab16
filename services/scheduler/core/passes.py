"""The scheduling pass: after every command, dispatch (and preempt) until nothing more fits.

Order within a pass (ruling 7), repeated after every placement:
  (a) heads that fit their share's own limit, in share order (ordering.share_order): plain
      dispatch, else cross-share reclaim, else in-share preemption where enabled;
  (b) heads that would borrow, first come first served (or under the queue's options beyond
      AWS, ordering.borrower_key): plain dispatch only;
  (c) the same heads, by in-share preemption where enabled.
Each share is strictly head-of-line: only its first RUNNABLE job is considered.

Only *dirty* shares are evaluated: those whose head changed or that may have gained room since
they last failed.  A failed head stays failed until capacity it needs is released (or
borrowed, making reclaim possible), its own share releases anything, or its share or the
configuration changes, because every placement only ever takes capacity away from the others.
A clean share records what can wake it (`Share.waits_on`: its head's need, or nothing when its
own share may not borrow for it); `check_stable` in the tests proves a full re-evaluation
would find nothing more.
"""

from __future__ import annotations

from quotasched.events import facts as F
from quotasched.events.values import (
    BlockedReason,
    JobStatus,
    PreemptionOutcome,
    PreemptionReason,
    StatusCause,
)
from quotasched.events.values import State as OnOff
from quotasched.services.scheduler.core.accounting import (
    Scratch,
    borrow_refused,
    borrowed_by,
    within_own_limit,
)
from quotasched.services.scheduler.core.admission import blocked_reason
from quotasched.services.scheduler.core.entities import Environment, Job, Queue, Share
from quotasched.services.scheduler.core.ordering import borrower_key, share_order
from quotasched.services.scheduler.core.preemption import (
    in_share_candidates,
    in_share_victims,
    reclaim_victims,
)
from quotasched.services.scheduler.core.round import Round

_MISCONFIGURED = frozenset(
    {BlockedReason.SERVICE_ENVIRONMENT_MAX_RESOURCE.value,
     BlockedReason.QUOTA_MANAGEMENT_LIMIT_EXCEEDED.value}
)  # fmt: skip


def schedule(round_: Round) -> None:
    """Run the pass on every queue that has dirty shares."""
    for queue in round_.state.queues.values():
        if queue.dirty:
            schedule_queue(round_, queue)


def schedule_queue(round_: Round, queue: Queue) -> None:
    environment = round_.state.environments[queue.environment]
    if environment.state is OnOff.DISABLED:
        return  # a DISABLED service environment places nothing; its jobs wait
    while queue.dirty:
        heads = _dirty_heads(round_, environment, queue)
        if not heads or not _place_one(round_, environment, queue, heads):
            return


def _dirty_heads(round_: Round, environment: Environment, queue: Queue) -> list[tuple[Share, Job]]:
    """Heads of the dirty shares that could be placed now; blocked heads are reported once."""
    state = round_.state
    heads = []
    for share in queue.shares.values():
        if share.name not in queue.dirty:
            continue
        head = state.head(share)
        if head is None:
            state.mark_clean(queue, share.name)
            continue
        if head.admitted != queue.epoch and not _admitted(round_, environment, queue, share, head):
            continue
        if not placeable(share, head):
            state.mark_clean(queue, share.name)
            continue
        heads.append((share, head))
    return heads


def placeable(share: Share, head: Job) -> bool:
    """Can anything the other shares do let a pass place `head`?  Not when it could only
    borrow, its share may not (`borrow_refused`), and no job of its own share could make room
    for it: it then waits for its own share's changes (which always mark the share)."""
    if not borrow_refused(share, head.need):
        return True
    return share.in_share_preemption and bool(in_share_candidates(share, head))


def _admitted(round_: Round, environment: Environment, queue: Queue, share: Share, head: Job) -> bool:
    """Can `head` fit some day as things are configured?  If not, its share is blocked."""
    blocked = blocked_reason(environment, queue, share, head.need)
    if blocked is not None:
        reason, text = blocked
        if head.reason_code != reason.value or head.status_reason != text:
            round_.emit(F.ShareBlocked(
                at=round_.at, command_seq=round_.seq, job_queue=queue.name,
                quota_share_name=share.name, job_id=head.job_id, reason=reason,
                status_reason=text,
            ))  # fmt: skip
        round_.state.mark_clean(queue, share.name)
        return False
    if head.reason_code in _MISCONFIGURED:
        # The configuration changed under a blocked head: it is an ordinary waiter again.
        round_.emit(F.job_status_changed(
            at=round_.at, command_seq=round_.seq, job_id=head.job_id, attempt=head.attempt,
            status=JobStatus.RUNNABLE, status_reason=None, cause=StatusCause.UNBLOCKED,
        ))  # fmt: skip
    # A cache, safe to keep across an undone trial (epochs are unique): not journaled, but a
    # snapshot holds it, so it is marked as changed all the same.
    round_.state.touch(head)
    head.admitted = queue.epoch
    return True


def _place_one(round_: Round, environment: Environment, queue: Queue, heads) -> bool:
    """Place the first head that can be placed under the pass order; False if none can."""
    state = round_.state
    owners: list[tuple[Share, Job]] = []
    borrowers: list[tuple[Share, Job]] = []
    for pair in heads:
        (owners if within_own_limit(pair[0], pair[1].need) else borrowers).append(pair)
    owners.sort(key=lambda pair: share_order(*pair))
    for share, head in owners:
        if _fits(environment, queue, share, head):
            return _dispatch(round_, queue, share, head, [], None)
        victims = reclaim_victims(environment, queue, share, head, round_.at)
        if victims:
            return _dispatch(round_, queue, share, head, victims,
                             PreemptionReason.CROSS_SHARE_RECLAIM)  # fmt: skip
        if share.in_share_preemption:
            victims = in_share_victims(environment, queue, share, head, round_.at)
            if victims:
                return _dispatch(round_, queue, share, head, victims,
                                 PreemptionReason.IN_SHARE_PRIORITY)  # fmt: skip
        state.mark_clean(queue, share.name, head.need)
    borrowers.sort(key=borrower_key(queue, round_.at))
    for share, head in borrowers:
        if _fits(environment, queue, share, head):
            return _dispatch(round_, queue, share, head, [], None)
    for share, head in borrowers:
        if share.in_share_preemption:
            victims = in_share_victims(environment, queue, share, head, round_.at)
            if victims:
                return _dispatch(round_, queue, share, head, victims,
                                 PreemptionReason.IN_SHARE_PRIORITY)  # fmt: skip
        state.mark_clean(queue, share.name, head.need)
    return False


def _fits(environment: Environment, queue: Queue, share: Share, head: Job) -> bool:
    return Scratch(environment, queue).fits(share, head.need)


def _dispatch(round_: Round, queue: Queue, share: Share, head: Job, victims: list[Job],
              reason: PreemptionReason | None) -> bool:  # fmt: skip
    """Emit the victims' preemptions, then the head's dispatch; capacity frees at once."""
    for victim in victims:
        assert reason is not None  # a victim is always taken for a reason
        count = victim.preempted_count + 1
        retries = victim.preemption_retries
        requeued = retries is None or count <= retries
        round_.emit(F.JobPreempted(
            at=round_.at, command_seq=round_.seq, job_id=victim.job_id, attempt=victim.attempt,
            job_queue=queue.name, quota_share_name=victim.share, preemptor_job_id=head.job_id,
            reason=reason,
            outcome=PreemptionOutcome.REQUEUED if requeued else PreemptionOutcome.FAILED,
            preempted_attempt_count=count,
        ))  # fmt: skip
    round_.emit(F.job_dispatched(
        at=round_.at, command_seq=round_.seq, job_id=head.job_id, attempt=head.attempt + 1,
        job_queue=queue.name, quota_share_name=share.name, capacity_usage=head.need,
        borrowed=borrowed_by(share, head.need),
        after_preemption_of=[victim.job_id for victim in victims],
    ))  # fmt: skip
    return True
