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
scheduler, so a file cannot declare them (they could never be compared or exported).  A job
queue or quota share entry may also carry `options`, quotasched's options beyond AWS
(SetJobQueueOptions, SetQuotaShareOptions: docs/options.md), declared as a whole and set after
the resource (a queue's after its shares, which they may name).

Everything here is pure: no I/O but `load`'s reading of the file.  `services/cli/config_cli.py`
reads the live state over NATS, prints the plan and publishes its commands.

This module is the public face; the work is done by

    services/config/file.py     the file: sections, strict validation, load/parse, export form
    services/config/aspects.py  the fields a plan compares, how it shows them, which may change
    services/config/plan.py     the desired-vs-live diff and the commands of a plan
    services/config/render.py   the plan as a diff-like listing and a summary line
"""

from __future__ import annotations

from quotasched.events.values import State  # re-exported: callers name states as `config_as_code.State`
from quotasched.services.config.aspects import ASPECTS, IMMUTABLE, LIMITS, STATE, Aspect
from quotasched.services.config.file import (
    NOT_EXPORTED,
    NOT_IN_FILES,
    SECTIONS,
    ConfigError,
    Configuration,
    ShareKey,
    dump_yaml,
    from_live,
    load,
    parse,
    to_document,
)
from quotasched.services.config.plan import Change, Plan, doomed_shares, plan
from quotasched.services.config.render import SIGNS, render, summary

__all__ = [
    "ASPECTS",
    "IMMUTABLE",
    "LIMITS",
    "NOT_EXPORTED",
    "NOT_IN_FILES",
    "SECTIONS",
    "SIGNS",
    "STATE",
    "Aspect",
    "Change",
    "ConfigError",
    "Configuration",
    "Plan",
    "ShareKey",
    "State",
    "doomed_shares",
    "dump_yaml",
    "from_live",
    "load",
    "parse",
    "plan",
    "render",
    "summary",
    "to_document",
]
