"""Configuration as code: a YAML file declares service environments, scheduling policies, job
queues and quota shares; `plan` compares it with the live configuration and lists the
contract's commands that make the live state match, in an order the scheduler accepts.

The file's four sections hold the contract's Create* commands without `kind`:

    serviceEnvironments: [CreateServiceEnvironment, ...]
    schedulingPolicies:  [CreateSchedulingPolicy, ...]
    jobQueues:           [CreateJobQueue, ...]
    quotaShares:         [CreateQuotaShare, ...]

so every field is validated exactly as the scheduler validates the command (camelCase names,
strict types, unknown fields refused), and a problem is reported with its path in the file
(`quotaShares[1] (q/qs2).capacityLimits[0].maxCapacity: ...`).  `tags` are not recorded by the
scheduler, so a file cannot declare them (they could never be compared or exported).

Everything here is pure: no I/O but `load`'s reading of the file.  `services/cli/config_cli.py`
reads the live state over NATS, prints the plan and publishes its commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from events.base import NAME_PATTERN, NAME_RULE
from events.commands import (
    Command,
    CreateJobQueue,
    CreateQuotaShare,
    CreateSchedulingPolicy,
    CreateServiceEnvironment,
    DeleteQuotaShare,
    UpdateJobQueue,
    UpdateQuotaShare,
    UpdateServiceEnvironment,
)
from events.values import ResourceSharingConfiguration, SharingStrategy, State

SECTIONS: dict[str, type[Command]] = {
    "serviceEnvironments": CreateServiceEnvironment,
    "schedulingPolicies": CreateSchedulingPolicy,
    "jobQueues": CreateJobQueue,
    "quotaShares": CreateQuotaShare,
}
NOT_IN_FILES = {
    "kind": "is implied by the section",
    "at": "is stamped by the scheduler",
    "tags": "are not recorded by the scheduler, so a configuration file cannot declare them",
}
# Fixed by the contract (one type only): accepted in a file, never exported.
NOT_EXPORTED = {"kind", "at", "tags", "serviceEnvironmentType", "jobQueueType"}
ShareKey = tuple[str, str]  # (job queue, quota share)


class ConfigError(ValueError):
    """A configuration file that cannot be applied; `problems` name each one by its path."""

    def __init__(self, source: str, problems: list[str]):
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source, self.problems = source, problems


@dataclass
class Configuration:
    """Resources by name, in file (or live) order."""

    environments: dict[str, CreateServiceEnvironment] = field(default_factory=dict)
    policies: dict[str, CreateSchedulingPolicy] = field(default_factory=dict)
    queues: dict[str, CreateJobQueue] = field(default_factory=dict)
    shares: dict[ShareKey, CreateQuotaShare] = field(default_factory=dict)


# -- reading a file --------------------------------------------------------------------------


def load(path: str | Path) -> Configuration:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(source, [f"cannot read it: {error.strerror}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(source, ["is not UTF-8 text"]) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(source, [f"is not valid YAML: {error}"]) from None
    return parse(document, source)


def parse(document: Any, source: str = "<configuration>") -> Configuration:
    """Validates a loaded document; raises ConfigError listing every problem found."""
    if document is None:
        return Configuration()
    if not isinstance(document, dict):
        raise ConfigError(source, ["the file must be a mapping with the sections "
                                   + ", ".join(SECTIONS)])  # fmt: skip
    problems = [f"unknown section {key!r}; expected one of: {', '.join(SECTIONS)}"
                for key in document if key not in SECTIONS]  # fmt: skip
    parsed: dict[str, list[tuple[str, Command]]] = {}
    for section, model in SECTIONS.items():
        entries = document.get(section)
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            problems.append(f"{section}: must be a list of entries")
            continue
        parsed[section] = []
        for index, entry in enumerate(entries):
            where = _where(section, index, entry)
            command = _validate_entry(model, entry, where, problems)
            if command is not None:
                parsed[section].append((where, command))
    config = Configuration()
    _collect(parsed.get("serviceEnvironments", []), config.environments,
             lambda c: c.service_environment_name, "service environment", problems)
    _collect(parsed.get("schedulingPolicies", []), config.policies,
             lambda c: c.name, "scheduling policy", problems)
    _collect(parsed.get("jobQueues", []), config.queues,
             lambda c: c.job_queue_name, "job queue", problems)
    _collect(parsed.get("quotaShares", []), config.shares,
             lambda c: (c.job_queue, c.quota_share_name), "quota share", problems)  # fmt: skip
    if problems:
        raise ConfigError(source, problems)
    return config


def _where(section: str, index: int, entry: Any) -> str:
    """`quotaShares[1] (q/qs2)`: the index, and the name when the entry has one."""
    name = None
    if isinstance(entry, dict):
        key = {"serviceEnvironments": "serviceEnvironmentName", "schedulingPolicies": "name",
               "jobQueues": "jobQueueName", "quotaShares": "quotaShareName"}[section]  # fmt: skip
        name = entry.get(key)
        if section == "quotaShares" and isinstance(entry.get("jobQueue"), str):
            name = f"{entry['jobQueue']}/{name}"
    return f"{section}[{index}]" + (f" ({name})" if isinstance(name, str) else "")


def _validate_entry(model: type[Command], entry: Any, where: str,
                    problems: list[str]) -> Command | None:  # fmt: skip
    if not isinstance(entry, dict):
        problems.append(f"{where}: must be a mapping of {model.__name__} fields")
        return None
    refused = [key for key in entry if key in NOT_IN_FILES]
    for key in refused:
        problems.append(f"{where}.{key}: {NOT_IN_FILES[key]}")
    try:
        # JSON, as on the wire: the same strict rules as a published command (no coercion).
        data = json.dumps({k: v for k, v in entry.items() if k not in NOT_IN_FILES}, default=str)
        command = model.model_validate_json(data, by_alias=True, by_name=False)
    except ValidationError as error:
        for item in error.errors(include_url=False):
            problems.append(f"{where}{_path(item['loc'])}: {_message(item, model)}")
        return None
    return None if refused else command


def _path(loc: tuple) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _message(item: dict, model: type[Command]) -> str:
    if item["type"] == "extra_forbidden":
        return f"is not a field of {model.__name__}"
    if item["type"] == "missing":
        return "is required"
    if item["type"] == "string_pattern_mismatch" and item["ctx"]["pattern"] == NAME_PATTERN:
        return NAME_RULE
    return item["msg"].removeprefix("Value error, ")


def _collect(entries: list[tuple[str, Command]], into: dict, key, what: str,
             problems: list[str]) -> None:  # fmt: skip
    first: dict[Any, str] = {}
    for where, command in entries:
        name = key(command)
        if name in into:
            shown = "/".join(name) if isinstance(name, tuple) else name
            problems.append(f"{where}: {what} {shown} is declared twice (first at {first[name]})")
            continue
        into[name], first[name] = command, where


# -- the live configuration ------------------------------------------------------------------


def from_live(environments: Mapping[str, Any], policies: Mapping[str, Any],
              queues: Mapping[str, Any], shares: Iterable[Mapping[str, Any]]) -> Configuration:
    """The configuration the scheduler's read answers describe (`describe-service-environments`,
    `describe-scheduling-policies`, `describe-job-queues`, `list-quota-shares` of each
    queue), as the same Create* commands a file holds."""

    def pick(item: Mapping[str, Any], *keys: str) -> dict[str, Any]:
        return {key: item[key] for key in keys if item.get(key) is not None}

    document = {
        "serviceEnvironments": [pick(item, "serviceEnvironmentName", "capacityLimits", "state")
                                for item in environments["serviceEnvironments"]],
        "schedulingPolicies": [pick(item, "name", "quotaSharePolicy")
                               for item in policies["schedulingPolicies"]],
        "jobQueues": [pick(item, "jobQueueName", "serviceEnvironmentOrder", "schedulingPolicy",
                           "priority", "state", "jobStateTimeLimitActions")
                      for item in queues["jobQueues"]],
        "quotaShares": [pick(item, "quotaShareName", "jobQueue", "capacityLimits",
                             "resourceSharingConfiguration", "preemptionConfiguration", "state")
                        for item in shares],
    }  # fmt: skip
    return parse(document, "the live configuration")


def to_document(config: Configuration) -> dict[str, list[dict[str, Any]]]:
    """The file form of a configuration: every field explicit, defaults included."""

    def entry(command: Command) -> dict[str, Any]:
        dumped = command.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {key: value for key, value in dumped.items() if key not in NOT_EXPORTED}

    return {
        "serviceEnvironments": [entry(c) for c in config.environments.values()],
        "schedulingPolicies": [entry(c) for c in config.policies.values()],
        "jobQueues": [entry(c) for c in config.queues.values()],
        "quotaShares": [entry(c) for c in config.shares.values()],
    }


def dump_yaml(config: Configuration, header: str = "") -> str:
    body = yaml.safe_dump(to_document(config), sort_keys=False, default_flow_style=None,
                          allow_unicode=True, width=120)  # fmt: skip
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + body


# -- the plan --------------------------------------------------------------------------------


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
    queue's share count stays within its limit).  `unfinished` counts the unfinished jobs of
    the shares to delete (see `doomed_shares`): deleting such a share terminates them, which
    only `allow_termination` permits."""
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


def _limits(items) -> dict[str, int]:
    return {item.capacity_unit: item.max_capacity for item in items}


def _show_limits(items) -> str:
    return ", ".join(f"{item.max_capacity} {item.capacity_unit}" for item in items)


def _sharing(config: ResourceSharingConfiguration) -> ResourceSharingConfiguration:
    """As the scheduler records it: LEND_AND_BORROW without borrowLimit means -1."""
    if config.strategy is SharingStrategy.LEND_AND_BORROW and config.borrow_limit is None:
        return ResourceSharingConfiguration(strategy=config.strategy, borrow_limit=-1)
    return config


def _show_sharing(config: ResourceSharingConfiguration) -> str:
    config = _sharing(config)
    if config.borrow_limit is None:
        return config.strategy.value
    return f"{config.strategy.value} (borrowLimit {config.borrow_limit})"


def _show_actions(actions) -> str:
    if not actions:
        return "none"
    return "; ".join(f"{a.action.value} after {a.max_time_seconds}s {a.state.value} "
                     f"with {a.reason.value}" for a in actions)  # fmt: skip


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
               show=_show_sharing, key=_sharing),
        Aspect("preemptionConfiguration", "preemption_configuration",
               show=lambda p: f"inSharePreemption {p.in_share_preemption.value}"), STATE),
}  # fmt: skip
IMMUTABLE = {
    "scheduling policy": "the contract has no UpdateSchedulingPolicy",
    "job queue": "the contract's UpdateJobQueue changes only state, priority and "
                 "jobStateTimeLimitActions; declare a new job queue instead",
}  # fmt: skip


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


# -- showing a plan --------------------------------------------------------------------------

SIGNS = {"create": "+", "update": "~", "delete": "-"}


def render(result: Plan) -> list[str]:
    """The plan as a diff-like listing, one resource per line and one line per field."""
    lines = []
    for change in result.changes:
        note = f"  ({change.note})" if change.note else ""
        lines.append(f"{SIGNS[change.action]} {change.action} {change.resource} "
                     f"{change.name}{note}")  # fmt: skip
        for name, before, after in change.fields:
            if change.action == "create":
                lines.append(f"      {name}: {after}")
            elif change.action == "update":
                lines.append(f"      {name}: {before} -> {after}")
    for kept in result.kept:
        lines.append(f"= {kept}")
    for error in result.errors:
        lines.append(f"! {error}")
    return lines


def summary(result: Plan) -> str:
    if not result.changes:
        return "no changes: the live configuration matches the file"
    commands = len(result.commands)
    return (f"{result.count('create')} to create, {result.count('update')} to update, "
            f"{result.count('delete')} to delete ({commands} command"
            f"{'' if commands == 1 else 's'})")  # fmt: skip
