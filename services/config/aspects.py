"""The fields of each resource as a plan compares and shows them: one Aspect per field, with
its comparison form (equal keys are no change: the order of capacity limits, or LEND_AND_BORROW
without borrowLimit versus AWS's -1), its display form, and whether the contract's Update*
command can change it (IMMUTABLE says why not).  A resource's options beyond AWS are one
field, `options`, set as a whole by SetQuotaShareOptions or SetJobQueueOptions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quotasched.events.values import (
    FairShareWeight,
    JobQueueOptions,
    ResourceSharingConfiguration,
)


def _limits(items) -> dict[str, int]:
    return {item.capacity_unit: item.max_capacity for item in items}


def _show_limits(items) -> str:
    return ", ".join(f"{item.max_capacity} {item.capacity_unit}" for item in items)


def _show_sharing(config: ResourceSharingConfiguration) -> str:
    config = config.as_recorded()
    if config.borrow_limit is None:
        return config.strategy.value
    return f"{config.strategy.value} (borrowLimit {config.borrow_limit})"


def _show_actions(actions) -> str:
    if not actions:
        return "none"
    return "; ".join(f"{a.action.value} after {a.max_time_seconds}s {a.state.value} "
                     f"with {a.reason.value}" for a in actions)  # fmt: skip


def _queue_options(options: JobQueueOptions) -> tuple:
    """The comparison form of a queue's options: the order of weights, of groups, of a group's
    members and of its limits changes no decision, so it is no change."""
    fair = options.fair_share
    half_life = None if fair is None else fair.half_life_seconds
    weights = frozenset((w.quota_share_name, w.weight) for w in _weights(options))
    groups = frozenset((group.name, frozenset(group.quota_share_names),
                        frozenset(_limits(group.max_capacity or ()).items()))
                       for group in options.share_groups or ())  # fmt: skip
    return options.idle_resource_assignment_strategy, half_life, weights, groups, options.retention()


def _show_queue_options(options: JobQueueOptions) -> str:
    """`summary`, and fair share's weights, so a change of weights alone shows too."""
    weights = ", ".join(f"{w.quota_share_name}={w.weight}" for w in _weights(options))
    return options.summary() + (f"; weights {weights}" if weights else "")


def _weights(options: JobQueueOptions) -> list[FairShareWeight]:
    return (options.fair_share and options.fair_share.weights) or []


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Aspect:
    """One field of a resource as the plan compares and shows it.  `attribute` names it on
    the Create command and, when `mutable`, on the Update command too."""

    field: str  # as in the file
    attribute: str
    show: Callable[[Any], Any] = _same
    key: Callable[[Any], Any] = _same  # the comparison form: equal keys are no change
    mutable: bool = True


STATE = Aspect("state", "state", show=lambda state: state.value)
LIMITS = Aspect("capacityLimits", "capacity_limits", show=_show_limits, key=_limits)
ASPECTS: dict[str, tuple[Aspect, ...]] = {
    "service environment": (LIMITS, STATE),
    "scheduling policy": (
        Aspect("quotaSharePolicy", "quota_share_policy", mutable=False,
               show=lambda p: p.idle_resource_assignment_strategy.value),),
    "job queue": (
        Aspect("serviceEnvironmentOrder", "service_environment_order", mutable=False,
               show=lambda order: order[0].service_environment),
        Aspect("schedulingPolicy", "scheduling_policy", mutable=False),
        Aspect("priority", "priority"), STATE,
        Aspect("jobStateTimeLimitActions", "job_state_time_limit_actions", show=_show_actions,
               key=lambda actions: sorted(a.model_dump_json(by_alias=True) for a in actions))),
    "quota share": (
        LIMITS,
        Aspect("resourceSharingConfiguration", "resource_sharing_configuration",
               show=_show_sharing, key=ResourceSharingConfiguration.as_recorded),
        Aspect("preemptionConfiguration", "preemption_configuration",
               show=lambda p: f"inSharePreemption {p.in_share_preemption.value}"), STATE),
    "quota share options": (Aspect("options", "options", show=lambda o: o.summary()),),
    "job queue options": (
        Aspect("options", "options", show=_show_queue_options, key=_queue_options),),
}  # fmt: skip
IMMUTABLE = {
    "scheduling policy": "the contract has no UpdateSchedulingPolicy",
    "job queue": "the contract's UpdateJobQueue changes only state, priority and "
                 "jobStateTimeLimitActions; declare a new job queue instead",
}  # fmt: skip
