"""The one envelope every message shares: camelCase JSON on the wire, snake_case in Python.

Messages are frozen and forbid unknown fields, so a typo in a pipeline's JSON is refused with a
message naming the field instead of being silently dropped.  Validation is strict: `"3"` is not
a number and `1.5` is not a count.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    """Base of every value type, command and fact."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
        use_enum_values=False,
        ser_json_inf_nan="null",
    )


def _strip_arn(value: object) -> object:
    """Accept an ARN wherever AWS accepts one, keeping only the resource name.

    `arn:aws:batch:us-east-1:123456789012:job-queue/q` and `.../scheduling-policy/sp` both
    become their last path element, so the rest of the system only ever sees names.
    """
    if isinstance(value, str) and value.startswith("arn:"):
        resource = value.split(":", 5)[-1]
        return resource.rsplit("/", 1)[-1]
    return value


NAME_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"
NAME_RULE = "must be 1-128 characters of letters, digits, hyphens (-) and underscores (_)"

# The pattern is checked in pydantic-core (no Python call per name); codec.py turns its
# generic "should match pattern" message into NAME_RULE.
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
"""An AWS Batch resource name: 1-128 characters of `[A-Za-z0-9_-]`."""

NameOrArn = Annotated[str, Field(pattern=NAME_PATTERN), BeforeValidator(_strip_arn),
                      WithJsonSchema({"type": "string"})]
"""A name, or an ARN whose last path element is the name."""

JobId = Annotated[str, Field(min_length=1, max_length=256), BeforeValidator(_strip_arn),
                  WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 256})]
"""A job id (or a job ARN, as the SageMaker SDK sends), naming an existing job: any id a log
may hold, so a job submitted under an older rule can still be updated and terminated."""

JOB_ID_PATTERN = r"^[A-Za-z0-9_-]+$"
JOB_ID_RULE = ("must be 1-128 characters of letters, digits, hyphens (-) and underscores (_): "
               "a job id becomes one token of a NATS key and one directory name, so no dots, "
               "colons, slashes, wildcards or spaces")
# Checked in pydantic-core like NAME_PATTERN (whose Rust regex `$` is the end of the text);
# codec.py turns the generic message into JOB_ID_RULE.
NewJobId = Annotated[str, Field(min_length=1, max_length=128, pattern=JOB_ID_PATTERN)]
"""The `jobId` a submission may choose: exactly one subject token (no `.`, `*`, `>`, spaces)
and one safe path component (never `.`, `..` or holding `/`)."""


def is_path_component(text: str) -> bool:
    """Whether `text` can name one directory under another: not empty, `.` or `..`, no `/`
    or NUL.  Every id the contract accepts is one; an id from an older log may not be."""
    return text not in ("", ".", "..") and "/" not in text and "\0" not in text

Priority = Annotated[int, Field(ge=0, le=9999)]
"""`schedulingPriority`: 0-9999, higher is more important."""

MAX_TIME_S = 1e10
"""The latest logical time accepted (seconds; as Unix time, the year 2286).  A bound keeps
every deadline (`at` + an attempt timeout or a time limit) a finite, exact float."""

LogicalTime = Annotated[float, Field(ge=0, le=MAX_TIME_S)]
"""Seconds on the scheduler's logical clock; only ever enters through `at`."""

INT32_MAX = 2_147_483_647
"""AWS's `Integer`: the upper bound of every count the API leaves open (retries, order)."""

MAX_INSTANCES = 1_000_000
"""The most instances of one capacity unit a limit, an environment or a job may name: a
documented bound (AWS leaves it open) that keeps every sum of usage exact in 32 bits."""
