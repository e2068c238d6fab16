"""The kinds of the bus, from the `AnyCommand` / `AnyFact` unions: their models, the subject
each kind travels on (from the same functions the services route with, `events.subjects`,
with `{jobQueue}` / `{quotaShare}` where the queue and share go), and the description the
AsyncAPI document gives each.  A new kind appears here by itself."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import get_args

from pydantic import BaseModel

from quotasched.events.commands import AnyCommand
from quotasched.events.facts import AnyFact
from quotasched.events.subjects import (
    COMMANDS_STREAM,
    FACTS_STREAM,
    GLOBAL_COMMANDS,
    JOB_ID_COMMANDS,
    fact_subject,
    subject_for_command,
)
from quotasched.services.executors.app import EXECUTOR_FACTS

QUEUE, SHARE = "{jobQueue}", "{quotaShare}"


def command_models() -> list[type[BaseModel]]:
    """Every command model, in the order of the `AnyCommand` union."""
    return list(get_args(get_args(AnyCommand)[0]))


def fact_models() -> list[type[BaseModel]]:
    """Every fact model, in the order of the `AnyFact` union."""
    return list(get_args(get_args(AnyFact)[0]))


def kind_of(model: type[BaseModel]) -> str:
    return model.model_fields["kind"].default


def command_address(model: type[BaseModel]) -> str:
    """The subject of a command kind, from the clients' own routing function, with
    `{jobQueue}` / `{quotaShare}` where the command's queue and share go."""
    fields = model.model_fields
    probe = SimpleNamespace(kind=kind_of(model))
    for name in ("job_queue", "job_queue_name"):
        if name in fields:
            setattr(probe, name, QUEUE)
    if "quota_share_name" in fields:
        probe.quota_share_name = SHARE
    return subject_for_command(probe, route=(QUEUE, SHARE))


def fact_address(model: type[BaseModel]) -> str:
    """The subject of a fact kind, as the scheduler routes facts: the fact's queue and share,
    or those of the job it names."""
    fields = model.model_fields
    about_job = "job_id" in fields
    queue = QUEUE if "job_queue" in fields or about_job else None
    share = SHARE if "quota_share_name" in fields or about_job else None
    return fact_subject(kind_of(model), queue, share)


def _summary(model: type[BaseModel]) -> str:
    doc = inspect.getdoc(model) if model.__doc__ else None
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


def command_description(model: type[BaseModel]) -> str:
    kind = kind_of(model)
    if kind in GLOBAL_COMMANDS:
        where = "Not about one queue or share: always published on `qm.cmd.~.~.%s`." % kind
    elif kind in JOB_ID_COMMANDS:
        where = ("Names a job by `jobId`: publish it on the job's own queue and share; the "
                 "scheduler rejects it (CommandRejected) on any other subject.")  # fmt: skip
    else:
        where = "The subject must carry the queue (and share) the command names, or it is rejected."
    lines = [_summary(model), f"Command, stored in {COMMANDS_STREAM}. {where}",
             "The scheduler answers with facts whose `commandSeq` is this message's stream "
             "sequence."]  # fmt: skip
    return " ".join(line for line in lines if line)


def fact_description(model: type[BaseModel]) -> str:
    kind = kind_of(model)
    lines = [_summary(model), f"Fact, appended to {FACTS_STREAM} by the leading scheduler only."]
    if kind in EXECUTOR_FACTS:
        lines.append("Executors act on it (services/executors).")
    return " ".join(line for line in lines if line)
