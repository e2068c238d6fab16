"""Read-only views of state: the `replay --state-out` document and queue snapshots."""

from __future__ import annotations

from typing import Any

from quotasched.services.scheduler.core.entities import JOB_FIELDS
from quotasched.services.scheduler.core.state import State


def state_document(state: State) -> dict[str, Any]:
    """The final state as `contract.md` section 4 shows it (jobs in acceptance order)."""
    jobs = {
        job.job_id: {
            "status": job.status.value,
            "quotaShareName": job.share,
            "schedulingPriority": job.priority,
            "preemptedAttemptCount": job.preempted_count,
            "attempt": job.attempt,
            "statusReason": job.status_reason,
        }
        for job in state.jobs.values()
    }
    queues = {}
    for queue in state.queues.values():
        units = sorted(set(state.environments[queue.environment].capacity) | set(queue.usage))
        queues[queue.name] = {
            "totalCapacityUsage": {unit: queue.usage.get(unit, 0) for unit in units},
            "quotaShares": {
                share.name: {
                    unit: share.usage.get(unit, 0)
                    for unit in sorted(set(share.limits) | set(share.usage))
                }
                for share in queue.shares.values()
            },
        }
    return {"jobs": jobs, "queues": queues}


def canonical_state(state: State) -> dict[str, Any]:
    """Everything state records, minus derived caches: two states that decide alike are equal.

    Used to prove replay equivalence (live state == fold of the emitted facts).
    """
    jobs = {job_id: {name: _plain(value) for name, value in zip(JOB_FIELDS, job.snapshot())
                     if name != "admitted"}  # a cache of the scheduling pass
            for job_id, job in state.jobs.items()}  # fmt: skip
    queues = {}
    for queue in state.queues.values():
        queues[queue.name] = {
            "config": _plain(queue.config), "usage": queue.usage, "borrowed": queue.borrowed,
            "idle": queue.idle, "lendable": queue.lendable, "options": _plain(queue.options),
            "shares": {
                share.name: {"config": _plain(share.config), "usage": share.usage,
                             "dispatched": sorted(share.dispatched),
                             "options": _plain(share.options),
                             "preemptedAt": list(share.preempted_at),
                             "charge": list(share.charge)}
                for share in queue.shares.values()
            },
        }  # fmt: skip
    return {
        "time": state.time, "nextSeq": state.next_seq, "nextDispatch": state.next_dispatch,
        "environments": {name: _plain(env.config) for name, env in state.environments.items()},
        "policies": {name: _plain(policy) for name, policy in state.policies.items()},
        "clientTokens": sorted(f"{q}/{t}={j}" for (q, t), j in state.client_tokens.items()),
        "queues": queues, "jobs": jobs,
    }  # fmt: skip


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        dumped = value.model_dump(mode="json", by_alias=True)
        dumped.pop("at", None)  # a config's effective time is history, not state
        dumped.pop("commandSeq", None)
        return dumped
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "value"):
        return value.value
    return value
