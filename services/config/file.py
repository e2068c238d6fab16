"""The configuration file: its four sections of the contract's Create* commands, read and
validated strictly (every problem named by its path in the file), and written back.  A job
queue entry and a quota share entry may also carry `options`, quotasched's options beyond AWS
(SetJobQueueOptions, SetQuotaShareOptions).

`load` reads and `parse` validates a file; `from_live` builds the same Configuration from the
scheduler's read answers; `to_document` and `dump_yaml` give a configuration's file form.
Nothing here does I/O but `load`'s reading of the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import yaml
from pydantic import ValidationError

from quotasched.events.base import NAME_PATTERN, NAME_RULE
from quotasched.events.commands import (
    Command,
    CreateJobQueue,
    CreateQuotaShare,
    CreateSchedulingPolicy,
    CreateServiceEnvironment,
)
from quotasched.events.values import JobQueueOptions, QuotaShareOptions

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
# The sections whose entries may carry `options` (beyond AWS), and the options' model.
Options: TypeAlias = JobQueueOptions | QuotaShareOptions
OPTIONS: dict[str, type[Options]] = {
    "jobQueues": JobQueueOptions,
    "quotaShares": QuotaShareOptions,
}


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
    # quotasched's options beyond AWS (a share entry's `options`, docs/options.md); a share
    # without an entry here has every option off
    options: dict[ShareKey, QuotaShareOptions] = field(default_factory=dict)
    # the same for a job queue (a jobQueues entry's `options`): FAIR_SHARE, share groups
    queue_options: dict[str, JobQueueOptions] = field(default_factory=dict)


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


def parse(document: Any, source: str = "<configuration>", live: bool = False) -> Configuration:
    """Validates a loaded document; raises ConfigError listing every problem found.

    `live`: the document is the scheduler's own answers (`from_live`).  A file's queue options
    may name only the queue's shares the file declares (any other is deleted, or never
    created, before the options are set); the live ones may still name a share deleted since
    they were set, which the scheduler keeps in them."""
    if document is None:
        return Configuration()
    if not isinstance(document, dict):
        raise ConfigError(source, ["the file must be a mapping with the sections "
                                   + ", ".join(SECTIONS)])  # fmt: skip
    problems = [f"unknown section {key!r}; expected one of: {', '.join(SECTIONS)}"
                for key in document if key not in SECTIONS]  # fmt: skip
    parsed: dict[str, list[tuple[str, Command]]] = {}
    option_sets: dict[ShareKey, QuotaShareOptions] = {}
    queue_option_sets: dict[str, tuple[str, JobQueueOptions]] = {}  # with where it is declared
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
            options = None
            if section in OPTIONS and isinstance(entry, dict) and "options" in entry:
                entry = dict(entry)
                options = _validate_options(OPTIONS[section], entry.pop("options"),
                                            f"{where}.options", problems)  # fmt: skip
            command = _validate_entry(model, entry, where, problems)
            if command is not None:
                parsed[section].append((where, command))
                if isinstance(options, QuotaShareOptions) and isinstance(command, CreateQuotaShare):
                    option_sets[(command.job_queue, command.quota_share_name)] = options
                if isinstance(options, JobQueueOptions) and isinstance(command, CreateJobQueue):
                    queue_option_sets[command.job_queue_name] = (where, options)
    config = Configuration()
    _collect(parsed.get("serviceEnvironments", []), config.environments,
             lambda c: c.service_environment_name, "service environment", problems)
    _collect(parsed.get("schedulingPolicies", []), config.policies,
             lambda c: c.name, "scheduling policy", problems)
    _collect(parsed.get("jobQueues", []), config.queues,
             lambda c: c.job_queue_name, "job queue", problems)
    _collect(parsed.get("quotaShares", []), config.shares,
             lambda c: (c.job_queue, c.quota_share_name), "quota share", problems)  # fmt: skip
    if not live:
        for queue, (where, options) in queue_option_sets.items():
            problems.extend(_undeclared_shares(queue, options, f"{where}.options", config))
    if problems:
        raise ConfigError(source, problems)
    config.options = {key: options for key, options in option_sets.items() if _set(options)}
    config.queue_options = {queue: options for queue, (_, options) in queue_option_sets.items()
                            if _set(options)}  # fmt: skip
    return config


def _set(options: Options) -> bool:
    """Whether any option is on: all off is the same as no `options` at all."""
    return options != type(options)()


def _validate_options(model: type[Options], value: Any, where: str,
                      problems: list[str]) -> Options | None:  # fmt: skip
    """An entry's `options` (beyond AWS), validated as SetJobQueueOptions or
    SetQuotaShareOptions validates them."""
    try:
        return model.model_validate_json(json.dumps(value, default=str), by_alias=True,
                                         by_name=False)  # fmt: skip
    except ValidationError as error:
        for item in error.errors(include_url=False):
            message = ("is not an option (docs/options.md)" if item["type"] == "extra_forbidden"
                       else item["msg"].removeprefix("Value error, "))  # fmt: skip
            problems.append(f"{where}{_path(item['loc'])}: {message}")
        return None


def _undeclared_shares(queue: str, options: JobQueueOptions, where: str,
                       config: Configuration) -> list[str]:  # fmt: skip
    """Each place a queue's options name a share the file does not declare in that queue: the
    scheduler refuses options naming a share that does not exist, and the plan deletes a live
    share of a declared queue that the file leaves out."""
    fair = options.fair_share
    named = [(f".fairShare.weights[{index}].quotaShareName", weight.quota_share_name)
             for index, weight in enumerate(fair.weights or () if fair else ())]  # fmt: skip
    named += [(f".shareGroups[{group_index}].quotaShareNames[{index}]", name)
              for group_index, group in enumerate(options.share_groups or ())
              for index, name in enumerate(group.quota_share_names)]  # fmt: skip
    return [f"{where}{path}: names quota share {name}, which the file does not declare in job "
            f"queue {queue}"
            for path, name in named if (queue, name) not in config.shares]  # fmt: skip


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
                           "priority", "state", "jobStateTimeLimitActions", "options")
                      for item in queues["jobQueues"]],
        "quotaShares": [pick(item, "quotaShareName", "jobQueue", "capacityLimits",
                             "resourceSharingConfiguration", "preemptionConfiguration", "state",
                             "options")
                        for item in shares],
    }  # fmt: skip
    return parse(document, "the live configuration", live=True)


def to_document(config: Configuration) -> dict[str, list[dict[str, Any]]]:
    """The file form of a configuration: every field explicit, defaults included."""

    def entry(command: Command) -> dict[str, Any]:
        dumped = command.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {key: value for key, value in dumped.items() if key not in NOT_EXPORTED}

    return {
        "serviceEnvironments": [entry(c) for c in config.environments.values()],
        "schedulingPolicies": [entry(c) for c in config.policies.values()],
        "jobQueues": [_with_options(entry(c), config.queue_options.get(name))
                      for name, c in config.queues.items()],
        "quotaShares": [_with_options(entry(c), config.options.get(key))
                        for key, c in config.shares.items()],
    }


def _with_options(document: dict[str, Any], options: Options | None) -> dict[str, Any]:
    if options is not None:
        document["options"] = options.model_dump(mode="json", by_alias=True, exclude_none=True)
    return document


def dump_yaml(config: Configuration, header: str = "") -> str:
    body = yaml.safe_dump(to_document(config), sort_keys=False, default_flow_style=None,
                          allow_unicode=True, width=120)  # fmt: skip
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + body
