"""The plan: the changes that make the live configuration match the declared one, each with
the contract's commands that do it, in an order the scheduler accepts (parents first; a
queue's quota share deletions before its creations, a queue's options after its shares).
Changes the contract cannot make, and references to resources neither declared nor live, are
errors: nothing may be published."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from quotasched.events.commands import (
    Command,
    CreateQuotaShare,
    DeleteQuotaShare,
    SetJobQueueOptions,
    SetQuotaShareOptions,
    UpdateJobQueue,
    UpdateQuotaShare,
    UpdateServiceEnvironment,
)
from quotasched.events.values import JobQueueOptions, QuotaShareOptions, State
from quotasched.services.config.aspects import ASPECTS, IMMUTABLE, _show_limits
from quotasched.services.config.file import Configuration, Options, ShareKey


@dataclass(frozen=True)
class Change:
    """One resource to create, update or delete, with the commands that do it."""

    action: str  # create | update | delete
    resource: str  # "service environment", "scheduling policy", "job queue", "quota share"
    name: str
    fields: tuple[tuple[str, Any, Any], ...]  # (field, live value, declared value), display form
    commands: tuple[Command, ...]
    note: str = ""


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # any error: nothing may be published
    kept: list[str] = field(default_factory=list)  # live, not declared, and not deletable

    @property
    def commands(self) -> list[Command]:
        return [command for change in self.changes for command in change.commands]

    def count(self, action: str) -> int:
        return sum(1 for change in self.changes if change.action == action)


def doomed_shares(desired: Configuration, live: Configuration) -> list[ShareKey]:
    """Live quota shares the file deletes: those of job queues it declares that it does not
    declare itself.  Shares of job queues the file does not declare are left alone."""
    return [key for key in live.shares if key[0] in desired.queues and key not in desired.shares]


def plan(desired: Configuration, live: Configuration,
         unfinished: Mapping[ShareKey, int] | None = None,
         allow_termination: bool = False) -> Plan:  # fmt: skip
    """The changes that make `live` match `desired`, parent resources first: service
    environments, scheduling policies, job queues, then quota shares (deletions first, so a
    queue's share count stays within its limit), then the queues' options (the scheduler
    refuses options naming a share it does not have yet).  `unfinished` counts the unfinished
    jobs of the shares to delete (see `doomed_shares`): deleting such a share terminates them,
    which only `allow_termination` permits."""
    unfinished = unfinished or {}
    result = Plan()
    _check_references(desired, live, result)
    for name, want in desired.environments.items():
        _diff("service environment", name, want, live.environments.get(name),
              partial(UpdateServiceEnvironment, service_environment=name), result)
    for name, want in desired.policies.items():
        _diff("scheduling policy", name, want, live.policies.get(name), None, result)
    for name, want in desired.queues.items():
        _diff("job queue", name, want, live.queues.get(name),
              partial(UpdateJobQueue, job_queue=name), result)
    for key in doomed_shares(desired, live):
        _delete_share(key, live.shares[key], unfinished.get(key, 0), allow_termination, result)
    for key, want in desired.shares.items():
        _diff("quota share", "/".join(key), want, live.shares.get(key),
              partial(UpdateQuotaShare, job_queue=key[0], quota_share_name=key[1]), result)
        _options("quota share options", "/".join(key),
                 partial(SetQuotaShareOptions, job_queue=key[0], quota_share_name=key[1]),
                 QuotaShareOptions(), desired.options.get(key),
                 live.options.get(key) if key in live.shares else None, result)  # fmt: skip
    for name in desired.queues:
        _options("job queue options", name, partial(SetJobQueueOptions, job_queue=name),
                 JobQueueOptions(), desired.queue_options.get(name),
                 live.queue_options.get(name) if name in live.queues else None, result)  # fmt: skip
    _kept(desired, live, result)
    return result


def _check_references(desired: Configuration, live: Configuration, result: Plan) -> None:
    def missing(resource: str, name: str, field_: str, what: str, target: str) -> None:
        result.errors.append(f"{resource} {name}: {field_} names {what} {target}, which is "
                             f"neither declared nor live")  # fmt: skip

    for name, queue in desired.queues.items():
        environment = queue.service_environment_order[0].service_environment
        if environment not in desired.environments and environment not in live.environments:
            missing("job queue", name, "serviceEnvironmentOrder", "service environment",
                    environment)  # fmt: skip
        policy = queue.scheduling_policy
        if policy not in desired.policies and policy not in live.policies:
            missing("job queue", name, "schedulingPolicy", "scheduling policy", policy)
    for queue, share in desired.shares:
        if queue not in desired.queues and queue not in live.queues:
            missing("quota share", f"{queue}/{share}", "jobQueue", "job queue", queue)


def _diff(resource: str, name: str, want: Command, have: Command | None,
          update: Callable[..., Command] | None, result: Plan) -> None:  # fmt: skip
    """A create when `have` is None, else an update with the changed mutable fields only;
    a changed immutable field is an error."""
    aspects = ASPECTS[resource]
    if have is None:
        shown = tuple((a.field, None, a.show(getattr(want, a.attribute))) for a in aspects)
        result.changes.append(Change("create", resource, name, shown, (want,)))
        return
    fields, changed = [], {}
    for aspect in aspects:
        before, after = getattr(have, aspect.attribute), getattr(want, aspect.attribute)
        if aspect.key(before) == aspect.key(after):
            continue
        if not aspect.mutable:
            result.errors.append(f"{resource} {name}: {aspect.field} {aspect.show(before)} "
                                 f"cannot be changed to {aspect.show(after)} "
                                 f"({IMMUTABLE[resource]})")  # fmt: skip
            continue
        fields.append((aspect.field, aspect.show(before), aspect.show(after)))
        changed[aspect.attribute] = after
    if changed and update is not None:
        result.changes.append(Change("update", resource, name, tuple(fields),
                                     (update(**changed),)))  # fmt: skip


def _delete_share(key: ShareKey, have: CreateQuotaShare, jobs: int, allow_termination: bool,
                  result: Plan) -> None:  # fmt: skip
    name = "/".join(key)
    commands: list[Command] = []
    notes = []
    if have.state is not State.DISABLED:  # the scheduler deletes only a DISABLED share
        commands.append(UpdateQuotaShare(job_queue=key[0], quota_share_name=key[1],
                                         state=State.DISABLED))  # fmt: skip
        notes.append("DISABLED first")
    commands.append(DeleteQuotaShare(job_queue=key[0], quota_share_name=key[1]))
    if jobs:
        notes.append(f"terminates its {jobs} unfinished job{'s' if jobs > 1 else ''}")
        if not allow_termination:
            result.errors.append(
                f"quota share {name} is live but not declared: deleting it would terminate "
                f"its {jobs} unfinished job{'s' if jobs > 1 else ''}; declare it, or allow "
                f"that with --terminate-jobs")  # fmt: skip
    result.changes.append(Change("delete", "quota share", name,
                                 (("capacityLimits", _show_limits(have.capacity_limits), None),),
                                 tuple(commands), "; ".join(notes)))  # fmt: skip


def _kept(desired: Configuration, live: Configuration, result: Plan) -> None:
    for name in live.environments.keys() - desired.environments.keys():
        result.kept.append(f"service environment {name}: live, not declared; kept (the "
                           f"contract has no DeleteServiceEnvironment; declare it with state "
                           f"DISABLED to switch it off)")  # fmt: skip
    for name in live.policies.keys() - desired.policies.keys():
        result.kept.append(f"scheduling policy {name}: live, not declared; kept (the contract "
                           f"has no DeleteSchedulingPolicy)")  # fmt: skip
    for name in live.queues.keys() - desired.queues.keys():
        result.kept.append(f"job queue {name}: live, not declared; kept with its quota shares "
                           f"(the contract has no DeleteJobQueue)")  # fmt: skip
    result.kept.sort()


def _options(resource: str, name: str, command: Callable[..., Command], off: Options,
             want: Options | None, have: Options | None, result: Plan) -> None:  # fmt: skip
    """A resource's options beyond AWS (`off`: all of them off), declared as a whole, so an
    entry declared without `options` has them all turned off: an update of its one `options`
    field, which `command` (SetQuotaShareOptions or SetJobQueueOptions) sets."""
    _diff(resource, name, command(options=want or off), command(options=have or off), command,
          result)  # fmt: skip
