"""A what-if configuration (YAML), validated by pydantic: the pool, the shares, the teams.

    name: lend-and-borrow
    environment: {instance_type: ml.g5.xlarge, gpus_per_instance: 1, max_instances: 1800}
    shares:
      - {name: big, teams: [cluster04], strategy: LEND_AND_BORROW, weight: 491.4,
         borrow_limit: 200, in_share_preemption: true}
      - {name: rest, teams: [cluster01, cluster02], strategy: LEND, limit: 300}
    priority: {kind: rule, rules: [{duration_at_most_s: 3600, priority: 5}], default: 1}
    checkpoint_interval_s: 3600        # absent: a preempted job restarts from zero
    checkpoint_overhead_s: 300         # each restart of a checkpointing job redoes 5 min
    checkpoint_classes:                # intervals by team, job_type or size (0: never)
      - {team: cluster03, interval_s: 1800}
      - {gpus_at_least: 8, interval_s: 7200}

Checkpoints are modelled in `checkpoints.py`; a class's interval overrides the global one
(team first, then job_type, then the largest `gpus_at_least` a job reaches).

A share may carry `options` beyond AWS, in the contract's wire names and checked by the
contract's own model (`QuotaShareOptions`), e.g. `options: {minRuntimeBeforePreemptionSeconds:
3600, preemptionBudget: {maxPreemptions: 20, windowSeconds: 86400}}`; the run sets them with a
`SetQuotaShareOptions` right after creating the share.

`queue_options` sets the job queue's options beyond AWS, in the wire names of the contract's
`JobQueueOptions` and checked by it, e.g. `queue_options: {idleResourceAssignmentStrategy:
FAIR_SHARE, fairShare: {halfLifeSeconds: 86400}, shareGroups: [{name: big, quotaShareNames:
[a, b], maxCapacity: [{capacityUnit: ml.g5.xlarge, maxCapacity: 600}]}]}`; every share it names
must be one of `shares` (else an error naming the key, e.g. `queue_options:
shareGroups.0.quotaShareNames.1 names share c, which is not one of the shares`).  The run sends
one `SetJobQueueOptions` after every share is created.  A group's `maxCapacity` is absolute
instances: `with_pool` scales share limits, not it.

A share's quota is either `limit` (instances) or `weight`: weighted shares split the pool in
proportion (largest remainder), and `raise_to_largest_job` (default on) lifts a limit that is
smaller than the largest job of the share's teams, which would otherwise block the share's
head forever under RESERVE or LEND.  Errors name the field: `shares.1.borrow_limit: ...`.
"""

from __future__ import annotations

import json
import math
import random
from typing import Annotated, Literal, Union

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, Json, ValidationError,
                      ValidationInfo, field_validator, model_validator)  # fmt: skip

from quotasched.events.base import NAME_PATTERN
from quotasched.events.values import JobQueueOptions, QuotaShareOptions, SharingStrategy

MAX_SHARES = 20  # quota shares per job queue (AWS service quota)
Priority = Annotated[int, Field(ge=0, le=9999)]


class ConfigError(ValueError):
    """A configuration that cannot be simulated; the message names the field at fault."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Environment(_Model):
    instance_type: Annotated[str, Field(min_length=1, max_length=128)] = "ml.g5.xlarge"
    gpus_per_instance: Annotated[int, Field(ge=1, le=64)] = 1
    max_instances: Annotated[int, Field(ge=1)]


class ShareConfig(_Model):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    teams: Annotated[list[str], Field(min_length=1)]
    strategy: SharingStrategy
    limit: Annotated[int, Field(ge=1)] | None = None
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    borrow_limit: Annotated[int, Field(ge=-1)] | None = None
    in_share_preemption: bool = False
    options: QuotaShareOptions | None = None  # absent: AWS's semantics, no command is sent

    @model_validator(mode="after")
    def _check(self) -> ShareConfig:
        if (self.limit is None) == (self.weight is None):
            raise ValueError("give exactly one of limit (instances) or weight (a share of the pool)")
        if self.borrow_limit is not None and self.strategy is not SharingStrategy.LEND_AND_BORROW:
            raise ValueError(f"borrow_limit can only be applied to the LEND_AND_BORROW strategy, "
                             f"not {self.strategy.value}")  # fmt: skip
        return self


class CheckpointClass(_Model):
    """Jobs of one team, one job_type or of at least so many GPUs checkpoint at their own
    interval (0: they never do), e.g. a team whose jobs save often, or big jobs that rarely."""

    team: Annotated[str, Field(min_length=1)] | None = None
    job_type: Annotated[str, Field(min_length=1)] | None = None
    gpus_at_least: Annotated[int, Field(ge=1)] | None = None
    interval_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]

    @model_validator(mode="after")
    def _one_selector(self) -> CheckpointClass:
        if sum(v is not None for v in (self.team, self.job_type, self.gpus_at_least)) != 1:
            raise ValueError("give exactly one of team, job_type or gpus_at_least")
        return self

    @property
    def selector(self) -> str:
        """How the class is written on the command line: team=X, job_type=X or gpus>=N."""
        if self.team is not None:
            return f"team={self.team}"
        if self.job_type is not None:
            return f"job_type={self.job_type}"
        return f"gpus>={self.gpus_at_least}"


class ConstantPriority(_Model):
    kind: Literal["constant"]
    value: Priority = 0


class JobTypePriority(_Model):
    """Priority from the trace's `job_type`; `default` for types not in `map` (absent: error)."""

    kind: Literal["job_type"]
    map: dict[str, Priority]
    default: Priority | None = None


class Rule(_Model):
    """Matches when every bound given holds; `priority` applies to the job."""

    priority: Priority
    gpus_at_least: Annotated[int, Field(ge=1)] | None = None
    gpus_at_most: Annotated[int, Field(ge=1)] | None = None
    duration_at_least_s: Annotated[float, Field(ge=0)] | None = None
    duration_at_most_s: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _some_bound(self) -> Rule:
        if all(v is None for v in (self.gpus_at_least, self.gpus_at_most,
                                   self.duration_at_least_s, self.duration_at_most_s)):  # fmt: skip
            raise ValueError("a rule needs at least one of gpus_at_least, gpus_at_most, "
                             "duration_at_least_s, duration_at_most_s")  # fmt: skip
        return self

    def matches(self, gpus: int, duration: float) -> bool:
        return ((self.gpus_at_least is None or gpus >= self.gpus_at_least)
                and (self.gpus_at_most is None or gpus <= self.gpus_at_most)
                and (self.duration_at_least_s is None or duration >= self.duration_at_least_s)
                and (self.duration_at_most_s is None or duration <= self.duration_at_most_s))  # fmt: skip


class RulePriority(_Model):
    """The first matching rule gives the priority, else `default`."""

    kind: Literal["rule"]
    rules: Annotated[list[Rule], Field(min_length=1)]
    default: Priority = 0


class RandomPriority(_Model):
    """Each job draws from `values` (optionally weighted) with its own seeded generator."""

    kind: Literal["random"]
    values: Annotated[list[Priority], Field(min_length=1)]
    weights: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _same_length(self) -> RandomPriority:
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ValueError(f"weights has {len(self.weights)} entries, values has {len(self.values)}")
        if self.weights is not None and not any(self.weights):
            raise ValueError("weights are all zero")
        return self


def _as_wire(value: object) -> object:
    """Options as the JSON a command would carry, so that the contract's strict model checks
    them as it checks a published command (an enum is a string there, as in YAML)."""
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return value.model_dump_json(by_alias=True, exclude_none=True)
    return json.dumps(value, default=str)


WireQueueOptions = Annotated[Json[JobQueueOptions], BeforeValidator(_as_wire)]

PriorityRule = Annotated[
    Union[ConstantPriority, JobTypePriority, RulePriority, RandomPriority],
    Field(discriminator="kind"),
]


class SimConfig(_Model):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str = ""
    environment: Environment
    shares: Annotated[list[ShareConfig], Field(min_length=1, max_length=MAX_SHARES)]
    default_share: str | None = None
    raise_to_largest_job: bool = True
    priority: PriorityRule = ConstantPriority(kind="constant")
    checkpoint_interval_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    checkpoint_overhead_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    checkpoint_classes: list[CheckpointClass] = []
    queue_options: WireQueueOptions | None = None  # absent: AWS's semantics, no command is sent

    @field_validator("queue_options")
    @classmethod
    def _known_shares(cls, options: JobQueueOptions | None, info: ValidationInfo):
        """The core would refuse the whole run's set-up for a share it does not know; say so
        here, naming the key, before anything runs."""
        shares = info.data.get("shares")  # absent when the shares themselves are invalid
        if options is not None and shares is not None:
            unknown = undefined_shares(options, {share.name for share in shares})
            if unknown:
                raise ValueError("; ".join(
                    f"{key} names share {name}, which is not one of the shares"
                    for key, name in unknown))  # fmt: skip
        return options

    @model_validator(mode="after")
    def _consistent(self) -> SimConfig:
        names = [share.name for share in self.shares]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"share {name} is listed more than once")
        owner: dict[str, str] = {}
        for share in self.shares:
            for team in share.teams:
                if team in owner:
                    raise ValueError(f"team {team} is mapped to both {owner[team]} and {share.name}")
                owner[team] = share.name
        if self.default_share is not None and self.default_share not in names:
            raise ValueError(f"default_share {self.default_share} is not one of the shares")
        if len({share.limit is None for share in self.shares}) > 1:
            raise ValueError("give every share a limit, or every share a weight, not a mix")
        selectors = [kind.selector for kind in self.checkpoint_classes]
        for selector in selectors:
            if selectors.count(selector) > 1:
                raise ValueError(f"checkpoint_classes lists {selector} more than once")
        return self

    def with_pool(self, instances: int) -> SimConfig:
        """The same configuration on a pool of `instances`; absolute limits scale with it."""
        if instances < 1:
            raise ConfigError(f"the pool must hold at least 1 instance, not {instances}")
        old = self.environment.max_instances
        shares = [
            share if share.limit is None
            else share.model_copy(update={"limit": max(1, share.limit * instances // old)})
            for share in self.shares
        ]  # fmt: skip
        return self.model_copy(update={
            "environment": self.environment.model_copy(update={"max_instances": instances}),
            "shares": shares,
        })  # fmt: skip

    def instances(self, gpus: int) -> int:
        return -(-gpus // self.environment.gpus_per_instance)

    def share_of_team(self) -> dict[str, str]:
        return {team: share.name for share in self.shares for team in share.teams}

    def limits(self, largest_job: dict[str, int]) -> dict[str, int]:
        """Each share's limit in instances; `largest_job` maps a share to its largest need."""
        limits = self.configured_limits()
        if self.raise_to_largest_job:
            for name, need in largest_job.items():
                limits[name] = max(limits[name], need)
        return limits

    def configured_limits(self) -> dict[str, int]:
        """Each share's limit in instances as configured, before `raise_to_largest_job`."""
        if self.shares[0].limit is not None:
            limits = {share.name: share.limit for share in self.shares}
        else:
            pool = self.environment.max_instances
            total = sum(share.weight for share in self.shares)
            exact = {share.name: pool * share.weight / total for share in self.shares}
            limits = {name: max(1, math.floor(value)) for name, value in exact.items()}
            spare = pool - sum(limits.values())
            by_remainder = sorted(exact, key=lambda name: (limits[name] - exact[name], name))
            for name in by_remainder[:max(0, spare)]:
                limits[name] += 1
        return limits

    def priorities(self, job_type: list[str], gpus: list[int], duration: list[float]) -> list[int]:
        rule = self.priority
        if isinstance(rule, ConstantPriority):
            return [rule.value] * len(gpus)
        if isinstance(rule, JobTypePriority):
            out = []
            for index, kind in enumerate(job_type):
                value = rule.map.get(kind, rule.default)
                if value is None:
                    raise ConfigError(f"priority.map has no entry for job_type {kind!r} (row "
                                      f"{index + 1} of the trace) and priority.default is not set")  # fmt: skip
                out.append(value)
            return out
        if isinstance(rule, RulePriority):
            out = []
            for g, d in zip(gpus, duration):
                out.append(next((r.priority for r in rule.rules if r.matches(g, d)), rule.default))
            return out
        rng = random.Random(rule.seed)
        return rng.choices(rule.values, rule.weights, k=len(gpus))


def undefined_shares(options: JobQueueOptions, names: set[str]) -> list[tuple[str, str]]:
    """(key under queue_options, share) for every share the options name outside `names`."""
    unknown = []
    weights = options.fair_share.weights if options.fair_share is not None else None
    for index, item in enumerate(weights or ()):
        if item.quota_share_name not in names:
            unknown.append((f"fairShare.weights.{index}.quotaShareName", item.quota_share_name))
    for index, group in enumerate(options.share_groups or ()):
        for position, name in enumerate(group.quota_share_names):
            if name not in names:
                unknown.append((f"shareGroups.{index}.quotaShareNames.{position}", name))
    return unknown


def parse_config(data: object, source: str = "<config>") -> SimConfig:
    try:
        return SimConfig.model_validate(data)
    except ValidationError as error:
        lines = []
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            message = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {where}: {message}")
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None


def load_config(path: str) -> SimConfig:
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top (name, environment, shares, ...)")
    return parse_config(data, path)
