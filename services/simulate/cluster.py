"""The simulated cluster and its jobs, as the decision core's inputs.

- `setup_commands`: one service environment, one FIFO scheduling policy, one job queue and a
  quota share per configured share (with its options beyond AWS, when it has any), then the
  queue's options beyond AWS when the configuration has any (after the shares: the core
  refuses options that name a share it does not know), decoded from JSON like any
  production input;
- `templates`, `tick_template`: the validated submission, SUCCEEDED report and Tick whose
  copies the engine's hot path sends;
- `plan`: each job's share (by team), each share's limit and its largest job; a team without
  a share is an error, not a silent default.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from quotasched.events import commands as C
from quotasched.events.codec import decode_command
from quotasched.services.simulate.config import ConfigError, SimConfig
from quotasched.services.simulate.trace import Trace

ENVIRONMENT, POLICY, QUEUE = "pool", "fifo", "sim"


def setup_commands(config: SimConfig, limits: dict[str, int]) -> list[C.Command]:
    """The cluster as commands, decoded from JSON like any production input."""
    unit = config.environment.instance_type
    lines = [
        {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": ENVIRONMENT,
         "capacityLimits": [{"capacityUnit": unit, "maxCapacity": config.environment.max_instances}]},
        {"kind": "CreateSchedulingPolicy", "name": POLICY,
         "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
        {"kind": "CreateJobQueue", "jobQueueName": QUEUE, "schedulingPolicy": POLICY,
         "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": ENVIRONMENT}]},
    ]  # fmt: skip
    for share in config.shares:
        sharing: dict = {"strategy": share.strategy.value}
        if share.borrow_limit is not None:
            sharing["borrowLimit"] = share.borrow_limit
        lines.append({
            "kind": "CreateQuotaShare", "jobQueue": QUEUE, "quotaShareName": share.name,
            "capacityLimits": [{"capacityUnit": unit, "maxCapacity": limits[share.name]}],
            "resourceSharingConfiguration": sharing,
            "preemptionConfiguration": {
                "inSharePreemption": "ENABLED" if share.in_share_preemption else "DISABLED"},
        })  # fmt: skip
        if share.options is not None:
            lines.append({"kind": "SetQuotaShareOptions", "jobQueue": QUEUE,
                          "quotaShareName": share.name, "options": _wire(share.options)})
    if config.queue_options is not None:
        lines.append({"kind": "SetJobQueueOptions", "jobQueue": QUEUE,
                      "options": _wire(config.queue_options)})
    return [decode_command(json.dumps({"at": 0.0, **line})) for line in lines]


def _wire(options) -> dict:
    """Validated options back in the contract's wire names, as a command carries them."""
    return options.model_dump(mode="json", by_alias=True, exclude_none=True)


def templates(config: SimConfig, limits: dict[str, int],
              share_of_job: list[str]) -> tuple[C.SubmitServiceJob, C.ReportJobStatus]:  # fmt: skip
    """Validated commands whose copies carry each job: a submission and a SUCCEEDED report."""
    unit = config.environment.instance_type
    share = share_of_job[0] if share_of_job else config.shares[0].name
    submit = decode_command(json.dumps({
        "kind": "SubmitServiceJob", "at": 0.0, "jobName": "template", "jobId": "template",
        "jobQueue": QUEUE, "quotaShareName": share, "schedulingPriority": 0,
        "capacityUsage": [{"capacityUnit": unit, "quantity": 1}],
    }))  # fmt: skip
    report = decode_command(json.dumps({
        "kind": "ReportJobStatus", "at": 0.0, "jobId": "template", "status": "SUCCEEDED",
        "attempt": 1,
    }))  # fmt: skip
    return submit, report


def tick_template() -> C.Tick:
    """A validated Tick whose copies let the core's timers fire in simulated time."""
    return decode_command(json.dumps({"kind": "Tick", "at": 0.0}))


class Plan(NamedTuple):
    share_of_job: list[str]  # each job's share, indexed like the trace
    limits: dict[str, int]  # each share's limit in instances, as the run uses it
    largest_job: dict[str, int]  # each share's largest job in instances (shares with jobs)


def plan(trace: Trace, config: SimConfig) -> Plan:
    """Each job's share, each share's limit and largest job; a team without a share is an
    error."""
    owner = config.share_of_team()
    default = config.default_share
    unmapped = sorted({team for team in trace.team if team not in owner}) if default is None else []
    if unmapped:
        raise ConfigError(f"{config.name}: trace teams without a share: {', '.join(unmapped)} "
                          "(list them under a share's teams, or set default_share)")  # fmt: skip
    share_of_job = [owner.get(team, default) for team in trace.team]
    largest: dict[str, int] = {}
    for share, gpus in zip(share_of_job, trace.gpus):
        need = config.instances(gpus)
        if need > largest.get(share, 0):
            largest[share] = need
    return Plan(share_of_job, config.limits(largest), largest)
