"""The shapes of the AWS Batch API model that our CLI options use, and the conversion of
parsed shorthand (strings, lists and dicts of strings) into the types a shape names.

Shorthand carries only strings; the shape says which members are integers, lists, nested
structures, so `maxCapacity=3` becomes `3` and an unknown key is refused by name.  Every
problem is a `ShorthandError` naming the parameter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

from quotasched.services.cli.shorthand_grammar import ShorthandError


# -- shapes (the parts of the AWS Batch API model our options use) --------------------------


@dataclass(frozen=True)
class Scalar:
    kind: str  # "string", "integer" or "boolean"


@dataclass(frozen=True)
class Structure:
    members: dict[str, Shape]


@dataclass(frozen=True)
class ListOf:
    member: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape = field(default_factory=lambda: STRING)


Shape = Union[Scalar, Structure, ListOf, MapOf]

STRING, INTEGER, BOOLEAN = Scalar("string"), Scalar("integer"), Scalar("boolean")

CAPACITY_LIMITS = ListOf(Structure({"capacityUnit": STRING, "maxCapacity": INTEGER}))
CAPACITY_USAGE = ListOf(Structure({"capacityUnit": STRING, "quantity": INTEGER}))
SHAPES: dict[str, Shape] = {
    "capacityLimits": CAPACITY_LIMITS,
    "capacityUsage": CAPACITY_USAGE,
    "quotaSharePolicy": Structure({"idleResourceAssignmentStrategy": STRING}),
    "serviceEnvironmentOrder": ListOf(Structure({"order": INTEGER, "serviceEnvironment": STRING})),
    "jobStateTimeLimitActions": ListOf(Structure({
        "reason": STRING, "state": STRING, "maxTimeSeconds": INTEGER, "action": STRING,
    })),  # fmt: skip
    "resourceSharingConfiguration": Structure({"strategy": STRING, "borrowLimit": INTEGER}),
    "sharePreemptionConfiguration": Structure({"inSharePreemption": STRING}),
    "jobPreemptionConfiguration": Structure({"preemptionRetriesBeforeTermination": INTEGER}),
    "retryStrategy": Structure({
        "attempts": INTEGER,
        "evaluateOnExit": ListOf(Structure({"action": STRING, "onStatusReason": STRING})),
    }),  # fmt: skip
    "timeoutConfig": Structure({"attemptDurationSeconds": INTEGER}),
    "tags": MapOf(STRING),
    "filters": ListOf(Structure({"name": STRING, "values": ListOf(STRING)})),
}


# -- conversion by shape ---------------------------------------------------------------------


def convert(option: str, value: Any, shape: Shape, where: str) -> Any:
    if isinstance(shape, Scalar):
        return _scalar(option, value, shape, where)
    if isinstance(shape, ListOf):
        items = value if isinstance(value, list) else [value]
        return [convert(option, item, shape.member, where) for item in items]
    if not isinstance(value, dict):
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be a structure "
                             f"of key=value pairs, got {value!r}")  # fmt: skip
    if isinstance(shape, MapOf):
        return {key: convert(option, item, shape.value, f"{where}.{key}")
                for key, item in value.items()}  # fmt: skip
    unknown = [key for key in value if key not in shape.members]
    if unknown:
        raise ShorthandError(
            f"Error parsing parameter '{option}': unknown key {unknown[0]!r}; "
            f"valid keys are: {', '.join(shape.members)}"
        )  # fmt: skip
    return {key: convert(option, item, shape.members[key], key) for key, item in value.items()}


def _scalar(option: str, value: Any, shape: Scalar, where: str) -> Any:
    if isinstance(value, (list, dict)):
        raise ShorthandError(f"Error parsing parameter '{option}': {where} takes one "
                             f"{shape.kind}, got {value!r}")  # fmt: skip
    if shape is INTEGER:
        if re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be an integer, "
                             f"got {value!r}")  # fmt: skip
    if shape is BOOLEAN:
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ShorthandError(f"Error parsing parameter '{option}': {where} must be true or "
                             f"false, got {value!r}")  # fmt: skip
    return value
