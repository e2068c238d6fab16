"""Properties that must always hold, checked by the tests after every command.

`check_state(state)` looks at one state: usage equals the dispatched jobs' needs, totals equal
the sums over shares, no job is both queued and dispatched, retry limits were respected.

`DecisionAuditor` walks a stream of facts with a shadow state and checks every *decision* at
the moment it was made: a dispatch stays under the service-environment ceiling, never borrows
for RESERVE or LEND, stays within limit + borrow ceiling, and never makes unbacked borrowing
worse (ruling 1); in-share victims have strictly lower priority than the preemptor;
cross-share victims come from other shares that were over their own limit.

`check_stable(state)` proves the dirty-share optimisation safe: a full re-evaluation of every
share of every queue finds nothing more to dispatch.
"""

from __future__ import annotations

from quotasched.events import facts as F
from quotasched.events.values import JobStatus, PreemptionOutcome, PreemptionReason
from quotasched.services.scheduler.core.accounting import contribution
from quotasched.services.scheduler.core.evolve import evolve
from quotasched.services.scheduler.core.passes import schedule
from quotasched.services.scheduler.core.round import Round
from quotasched.services.scheduler.core.state import State


def check_state(state: State) -> list[str]:
    problems = []
    for queue in state.queues.values():
        totals: dict[str, list[int]] = {}
        for share in queue.shares.values():
            usage: dict[str, int] = {}
            for job in share.dispatched.values():
                if not job.status.dispatched:
                    problems.append(f"{job.job_id} is {job.status.value} but holds capacity")
                for unit, quantity in job.need:
                    usage[unit] = usage.get(unit, 0) + quantity
            for unit in usage.keys() | share.usage.keys():
                if usage.get(unit, 0) != share.usage.get(unit, 0):
                    problems.append(f"{share.name} usage of {unit} is {share.usage.get(unit, 0)}, "
                                    f"its jobs hold {usage.get(unit, 0)}")  # fmt: skip
            for unit in share.limits.keys() | share.usage.keys():
                bor, idle = contribution(share, unit, share.usage.get(unit, 0))
                total = totals.setdefault(unit, [0, 0, 0])
                total[0] += share.usage.get(unit, 0)
                total[1] += bor
                total[2] += idle
        for unit, (used, borrowed, idle) in totals.items():
            kept = (queue.usage.get(unit, 0), queue.borrowed.get(unit, 0), queue.idle.get(unit, 0))
            if kept != (used, borrowed, idle):
                problems.append(f"queue {queue.name} totals for {unit} are {kept}, "
                                f"shares sum to {(used, borrowed, idle)}")  # fmt: skip
    for job in state.jobs.values():
        owner = state.queues[job.queue].shares.get(job.share)
        held = owner is not None and job.job_id in owner.dispatched
        if job.status.dispatched != held:
            problems.append(f"{job.job_id} is {job.status.value} but held={held}")
        retries = job.preemption_retries
        if retries is not None and job.preempted_count > retries + 1:
            problems.append(f"{job.job_id} preempted {job.preempted_count} times, "
                            f"allowed {retries} requeues")  # fmt: skip
        if retries is not None and job.preempted_count > retries and job.status is not JobStatus.FAILED:
            problems.append(f"{job.job_id} exhausted its preemption retries but is {job.status.value}")
        if job.attempts_used > job.attempts_max:
            problems.append(f"{job.job_id} used {job.attempts_used} of {job.attempts_max} attempts")
    return problems


def check_stable(state: State) -> list[F.Fact]:
    """Facts a full re-evaluation of every share would emit; must be empty after a command."""
    with state.trial():
        for queue in state.queues.values():
            state.mark_dirty(queue)
        round_ = Round(state, seq=0, at=state.time)
        schedule(round_)
        return round_.facts


class DecisionAuditor:
    """Folds facts into a shadow state, checking each decision against the rules first."""

    def __init__(self, state: State | None = None):
        self.state = state if state is not None else State()
        self.problems: list[str] = []
        self._pending_victims: list[F.JobPreempted] = []

    def feed(self, fact: F.Fact) -> None:
        if isinstance(fact, F.JobPreempted):
            self._check_victim(fact)
            self._pending_victims.append(fact)
        elif isinstance(fact, F.JobDispatched):
            self._check_dispatch(fact)
            self._pending_victims = []
        evolve(self.state, fact)

    def _check_victim(self, fact: F.JobPreempted) -> None:
        state = self.state
        victim, preemptor = state.jobs[fact.job_id], state.jobs[fact.preemptor_job_id]
        if not victim.status.dispatched:
            self.problems.append(f"{fact.job_id} preempted while {victim.status.value}")
        if fact.reason is PreemptionReason.IN_SHARE_PRIORITY:
            if victim.share != preemptor.share or victim.priority >= preemptor.priority:
                self.problems.append(
                    f"in-share victim {victim.job_id} (p{victim.priority}, {victim.share}) for "
                    f"{preemptor.job_id} (p{preemptor.priority}, {preemptor.share})"
                )
        else:
            share = state.queues[victim.queue].shares[victim.share]
            over = any(share.usage.get(u, 0) > share.limits.get(u, 0) for u, _ in victim.need)
            if victim.share == preemptor.share or not over:
                self.problems.append(f"cross-share victim {victim.job_id} of {victim.share} "
                                     f"was not borrowing for {preemptor.job_id}")  # fmt: skip
        retries = victim.preemption_retries
        count = victim.preempted_count + 1
        expected = (PreemptionOutcome.REQUEUED if retries is None or count <= retries
                    else PreemptionOutcome.FAILED)  # fmt: skip
        if fact.outcome is not expected or fact.preempted_attempt_count != count:
            self.problems.append(f"{victim.job_id} preemption {count} outcome {fact.outcome.value}")

    def _check_dispatch(self, fact: F.JobDispatched) -> None:
        state = self.state
        job = state.jobs[fact.job_id]
        queue = state.queues[job.queue]
        share = queue.shares[job.share]
        environment = state.environments[queue.environment]
        if job.status is not JobStatus.RUNNABLE:
            self.problems.append(f"{job.job_id} dispatched while {job.status.value}")
        for unit, quantity in job.need:
            used = share.usage.get(unit, 0)
            limit = share.limits.get(unit, 0)
            if queue.usage.get(unit, 0) + quantity > environment.capacity.get(unit, 0):
                self.problems.append(f"{job.job_id} dispatch exceeds the environment's {unit}")
            bor_before, idle_before = contribution(share, unit, used)
            bor_after, idle_after = contribution(share, unit, used + quantity)
            if bor_after > bor_before:
                if not share.strategy.borrows:
                    self.problems.append(f"{share.strategy.value} share {share.name} borrowed")
                ceiling = share.borrow_ceiling(unit)
                if ceiling is not None and used + quantity > limit + ceiling:
                    self.problems.append(f"{job.job_id} exceeds {share.name}'s borrow ceiling")
            slack = queue.idle.get(unit, 0) - queue.borrowed.get(unit, 0)
            after = slack - (bor_after - bor_before) - (idle_before - idle_after)
            if after < 0 and after < slack:
                self.problems.append(f"{job.job_id} dispatch leaves borrowing of {unit} unbacked "
                                     f"(free pool {slack} -> {after})")  # fmt: skip
