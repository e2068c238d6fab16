"""Read-only views of state: the `replay --state-out` document and queue snapshots."""

from __future__ import annotations

from typing import Any

from services.scheduler.core.state import State


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
