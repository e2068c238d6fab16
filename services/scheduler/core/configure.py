"""Configuration commands: service environments, scheduling policies, job queues, quota shares.

Each handler checks the command against the state (a refusal raises `Rejected`, which the
round turns into a CommandRejected naming the problem, AWS ClientException style) and emits
the configuration facts; evolve.py applies them.  The limits AWS documents for these resources
are here.  Registered with `round.handles`; decision.py runs them.
"""

from __future__ import annotations

from typing import Any

from quotasched.events import commands as C
from quotasched.events import facts as F
from quotasched.events.values import (
    JobStatus,
    State as OnOff,
    StatusCause,
)
from quotasched.services.scheduler.core.round import Rejected, Round, fact_base, handles

MAX_ENVIRONMENTS = 50
MAX_QUEUES = 50
MAX_SHARES_PER_QUEUE = 20


@handles(C.CreateServiceEnvironment)
def _create_environment(round_: Round, command: C.CreateServiceEnvironment) -> None:
    name = command.service_environment_name
    environments = round_.state.environments
    if name in environments:
        raise Rejected(f"Service environment {name} already exists")
    if len(environments) >= MAX_ENVIRONMENTS:
        raise Rejected(f"Limit of {MAX_ENVIRONMENTS} service environments reached")
    round_.emit(F.ServiceEnvironmentCreated(
        **fact_base(round_), service_environment=name, capacity_limits=command.capacity_limits,
        state=command.state,
    ))  # fmt: skip


@handles(C.UpdateServiceEnvironment)
def _update_environment(round_: Round, command: C.UpdateServiceEnvironment) -> None:
    environment = round_.state.environments.get(command.service_environment)
    if environment is None:
        raise Rejected(f"Service environment {command.service_environment} does not exist")
    current = environment.config
    round_.emit(F.ServiceEnvironmentUpdated(
        **fact_base(round_), service_environment=environment.name,
        capacity_limits=command.capacity_limits or current.capacity_limits,
        state=command.state or current.state,
    ))  # fmt: skip


@handles(C.CreateSchedulingPolicy)
def _create_policy(round_: Round, command: C.CreateSchedulingPolicy) -> None:
    if command.name in round_.state.policies:
        raise Rejected(f"Scheduling policy {command.name} already exists")
    round_.emit(F.SchedulingPolicyCreated(
        **fact_base(round_), name=command.name, quota_share_policy=command.quota_share_policy
    ))


@handles(C.CreateJobQueue)
def _create_queue(round_: Round, command: C.CreateJobQueue) -> None:
    state, name = round_.state, command.job_queue_name
    environment_name = command.service_environment_order[0].service_environment
    environment = state.environments.get(environment_name)
    if name in state.queues:
        raise Rejected(f"Job queue {name} already exists")
    if len(state.queues) >= MAX_QUEUES:
        raise Rejected(f"Limit of {MAX_QUEUES} job queues reached")
    if command.scheduling_policy not in state.policies:
        raise Rejected(f"Scheduling policy {command.scheduling_policy} does not exist")
    if environment is None:
        raise Rejected(f"Service environment {environment_name} does not exist")
    if environment.queue is not None:
        raise Rejected(
            f"Service environment {environment_name} is already attached to job queue "
            f"{environment.queue}; a quota-management environment serves one job queue"
        )
    round_.emit(F.JobQueueCreated(
        **fact_base(round_), job_queue=name, service_environment=environment_name,
        scheduling_policy=command.scheduling_policy, priority=command.priority,
        state=command.state, job_state_time_limit_actions=command.job_state_time_limit_actions,
    ))  # fmt: skip


@handles(C.UpdateJobQueue)
def _update_queue(round_: Round, command: C.UpdateJobQueue) -> None:
    queue = round_.state.queues.get(command.job_queue)
    if queue is None:
        raise Rejected(f"Job queue {command.job_queue} does not exist", job_queue=command.job_queue)
    current = queue.config
    actions = command.job_state_time_limit_actions
    round_.emit(F.JobQueueUpdated(
        **fact_base(round_), job_queue=queue.name, service_environment=queue.environment,
        scheduling_policy=queue.policy,
        priority=current.priority if command.priority is None else command.priority,
        state=command.state or current.state,
        job_state_time_limit_actions=current.job_state_time_limit_actions if actions is None else actions,
    ))  # fmt: skip


@handles(C.CreateQuotaShare)
def _create_share(round_: Round, command: C.CreateQuotaShare) -> None:
    names: dict[str, Any] = {"job_queue": command.job_queue, "quota_share_name": command.quota_share_name}
    queue = round_.state.queues.get(command.job_queue)
    if queue is None:
        raise Rejected(f"Job queue {command.job_queue} does not exist", **names)
    if command.quota_share_name in queue.shares:
        raise Rejected(
            f"Quota share {command.quota_share_name} already exists in job queue {queue.name}",
            **names,
        )
    if len(queue.shares) >= MAX_SHARES_PER_QUEUE:
        raise Rejected(
            f"Job queue {queue.name} already has {MAX_SHARES_PER_QUEUE} quota shares, "
            "the most a job queue can have", **names,
        )  # fmt: skip
    round_.emit(F.QuotaShareCreated(
        **fact_base(round_), **names, capacity_limits=command.capacity_limits,
        resource_sharing_configuration=command.resource_sharing_configuration.as_recorded(),
        preemption_configuration=command.preemption_configuration, state=command.state,
    ))  # fmt: skip


def existing_share(round_: Round, job_queue: str, share_name: str, job_id: str | None = None):
    names = {"job_queue": job_queue, "quota_share_name": share_name}
    queue = round_.state.queues.get(job_queue)
    if queue is None:
        raise Rejected(f"Job queue {job_queue} does not exist", job_id=job_id, **names)
    share = queue.shares.get(share_name)
    if share is None:
        raise Rejected(f"Quota share {share_name} does not exist in job queue {job_queue}",
                       job_id=job_id, **names)  # fmt: skip
    return queue, share, names


@handles(C.UpdateQuotaShare)
def _update_share(round_: Round, command: C.UpdateQuotaShare) -> None:
    _, share, names = existing_share(round_, command.job_queue, command.quota_share_name)
    current = share.config
    sharing = command.resource_sharing_configuration
    round_.emit(F.QuotaShareUpdated(
        **fact_base(round_), **names,
        capacity_limits=command.capacity_limits or current.capacity_limits,
        resource_sharing_configuration=(
            sharing.as_recorded() if sharing else current.resource_sharing_configuration
        ),
        preemption_configuration=command.preemption_configuration or current.preemption_configuration,
        state=command.state or current.state,
    ))  # fmt: skip


@handles(C.DeleteQuotaShare)
def _delete_share(round_: Round, command: C.DeleteQuotaShare) -> None:
    queue, share, names = existing_share(round_, command.job_queue, command.quota_share_name)
    if share.state is not OnOff.DISABLED:
        raise Rejected(
            f"Quota share {share.name} must be DISABLED before it can be deleted", **names
        )
    doomed = [job for job in round_.state.jobs.values()
              if job.queue == queue.name and job.share == share.name and not job.status.terminal]
    for job in doomed:  # jobs dict order is acceptance order
        round_.emit(F.job_status_changed(
            **fact_base(round_), job_id=job.job_id, attempt=job.attempt, status=JobStatus.FAILED,
            status_reason=f"Quota share {share.name} was deleted",
            cause=StatusCause.SHARE_DELETED, is_terminated=True,
        ))  # fmt: skip
    round_.emit(F.QuotaShareDeleted(**fact_base(round_), **names))


@handles(C.SetQuotaShareOptions)
def _share_options(round_: Round, command: C.SetQuotaShareOptions) -> None:
    """quotasched's options beyond AWS (victims.py); the share must exist."""
    _, _, names = existing_share(round_, command.job_queue, command.quota_share_name)
    round_.emit(F.QuotaShareOptionsSet(
        **fact_base(round_), **names, options_version=command.options_version,
        options=command.options,
    ))  # fmt: skip


@handles(C.SetJobQueueOptions)
def _queue_options(round_: Round, command: C.SetJobQueueOptions) -> None:
    """quotasched's queue options beyond AWS (fairshare.py); the queue and every share the
    options name must exist."""
    queue = round_.state.queues.get(command.job_queue)
    if queue is None:
        raise Rejected(f"Job queue {command.job_queue} does not exist", job_queue=command.job_queue)
    for name in command.options.share_names():
        if name not in queue.shares:
            raise Rejected(f"Quota share {name} does not exist in job queue {queue.name}",
                           job_queue=queue.name, quota_share_name=name)  # fmt: skip
    round_.emit(F.JobQueueOptionsSet(
        **fact_base(round_), job_queue=queue.name, options_version=command.options_version,
        options=command.options,
    ))  # fmt: skip
