"""The AsyncAPI document of the bus, generated from the code through FastStream.

Every subject and message of the public interface is declared on a FastStream `NatsBroker`
that is never connected, and FastStream's AsyncAPI 3.0 generator renders it:

- one channel per command kind, `qm.cmd.<jobQueue>.<quotaShare>.<Kind>`, received by the
  scheduler from `QM_COMMANDS`, its payload the command's pydantic model;
- one channel per fact kind, `qm.fact.<jobQueue>.<quotaShare>.<Kind>`, sent by the scheduler
  to `QM_FACTS`, its payload the fact's model;
- the read APIs, request/reply: `qm.api.<verb>` (the scheduler) and `qm.proj.<verb>` (the
  projector), and the projector's `qm.projected` notification.

The kinds come from the `AnyCommand` / `AnyFact` unions, the subjects from the same functions
the services route with (`events.subjects`), and the verbs from the services' own tables, so
a new kind or verb appears here by itself.  Every message carries a real example: the first
of its kind in the example command files or in their replay, and for the read verbs the
scheduler's answer after the notebook story.  What FastStream 0.7 cannot express (message
headers, examples, channel parameters, request/reply, the stream of a channel) is added to
its output afterwards, in `_complete`.

    quotasched asyncapi --out docs/asyncapi.yaml     # regenerate the committed document
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, get_args

import yaml
from faststream.nats import JStream, NatsBroker
from faststream.specification import AsyncAPI
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from events.codec import DecodeError, decode_command, encode
from events.commands import AnyCommand
from events.facts import AnyFact
from events.subjects import (
    ANY,
    API_PREFIX,
    COMMANDS_STREAM,
    FACTS_STREAM,
    GLOBAL_COMMANDS,
    JOB_ID_COMMANDS,
    fact_subject,
    subject_for_command,
)
from services.executors.app import EXECUTOR_FACTS
from services.projector import API_PREFIX as PROJ_PREFIX
from services.projector import APPLIED_SUBJECT, QUEUE_GROUP as PROJ_QUEUE_GROUP
from services.projector import api as projector_api
from services.replay import replay_lines
from services.scheduler import api as scheduler_api
from services.scheduler.core import State

TITLE = "quotasched"
VERSION = "0.1.0"
SERVER = "nats://127.0.0.1:4222"
API_QUEUE_GROUP = "qm-api"  # the scheduler's queue group on qm.api.> (services/scheduler/service.py)
QUEUE, SHARE = "{jobQueue}", "{quotaShare}"
DOCUMENT = "docs/asyncapi.yaml"
REGENERATE = f"quotasched asyncapi --out {DOCUMENT}"

DESCRIPTION = " ".join("""
quotasched is AWS Batch quota management as an event-sourced scheduler on NATS JetStream.
Clients publish commands (JSON, AWS Batch's camelCase field names) to the QM_COMMANDS stream
on `qm.cmd.<jobQueue>.<quotaShare>.<Kind>`; the single-writer scheduler decides them and appends
facts to the QM_FACTS stream on `qm.fact.<jobQueue>.<quotaShare>.<Kind>`.  `~` stands in a
subject where no queue or share applies.  Read requests go to `qm.api.<jobQueue>.<verb>`, or
`qm.api.~.<verb>` when they name no queue (the scheduler; with a partition per job queue, the
fleet partition answers those with `{"redirect": [queues]}` for the client to ask each queue),
and `qm.proj.<verb>` (the projector), NATS request/reply.  Generated from the code by
`quotasched asyncapi`; see docs/contract.md.""".split())


# -- the kinds, from the unions ---------------------------------------------------------------


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


# -- the read APIs: request models (for the document only) ------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class DescribeServiceJobRequest(_Request):
    job_id: str = Field(description="The job's id, or its ARN.")


class QueueRequest(_Request):
    job_queue: str = Field(description="The job queue's name, or its ARN.")


class ListFilter(_Request):
    name: Literal["QUOTA_SHARE_NAME", "JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT"]
    values: list[str]


class ListServiceJobsRequest(_Request):
    job_queue: str = Field(description="The job queue's name, or its ARN.")
    job_status: str | None = Field(None, description="Default RUNNING; ALL lists every status.")
    filters: list[ListFilter] | None = None
    max_results: int | None = Field(None, description="Default 100.")


class DescribeQuotaShareRequest(_Request):
    quota_share_arn: str | None = None
    job_queue: str | None = Field(None, description="With quotaShareName, instead of the ARN.")
    quota_share_name: str | None = None


class EmptyRequest(_Request):
    """No parameters: send `{}`."""


class AnyRequest(_Request):
    """A JSON object (this verb's parameters are not described here yet)."""


class SqlRequest(_Request):
    sql: str = Field(description="One read-only statement (SELECT, WITH, DESCRIBE, SHOW).")
    limit: int = Field(1000, description="Rows returned, at most 10000.")


class UtilizationRequest(_Request):
    t0: float
    t1: float
    bucket_seconds: float = 3600
    per: Literal["share", "queue"] = "share"


class Applied(_Request):
    """Published by the projector after every committed batch."""

    position: int = Field(description="The last fact sequence the projection applied.")
    facts: int = Field(description="Facts applied in this batch.")
    at: float | None = Field(description="Logical time of the last fact applied.")


API_REQUESTS: dict[str, type[_Request]] = {
    "describe-service-job": DescribeServiceJobRequest,
    "list-service-jobs": ListServiceJobsRequest,
    "get-job-queue-snapshot": QueueRequest,
    "list-quota-shares": QueueRequest,
    "describe-quota-share": DescribeQuotaShareRequest,
    "describe-service-environments": EmptyRequest,
    "describe-job-queues": EmptyRequest,
    "describe-scheduling-policies": EmptyRequest,
    "sql": SqlRequest,
    "utilization": UtilizationRequest,
    "checksum": EmptyRequest,
    "position": EmptyRequest,
}

ERROR_REPLY = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string", "examples": ["ClientException"]},
        "message": {"type": "string"}}}},
}  # fmt: skip


# -- the broker --------------------------------------------------------------------------------


def _handler(model: type[BaseModel]):
    """A handler whose only parameter is `model`: FastStream documents its schema."""

    async def handle(message) -> None:  # never called: the broker is never started
        raise NotImplementedError

    handle.__annotations__ = {"message": model, "return": None}
    handle.__name__ = model.__name__
    return handle


READ_APIS = (
    (f"{API_PREFIX}.{QUEUE}", scheduler_api.VERBS, API_QUEUE_GROUP,
     "the leading scheduler (of the job queue's partition) from its decided state, shaped "
     "like AWS Batch's answer; `~` for the queue when the request names none"),
    (PROJ_PREFIX, projector_api.VERBS, PROJ_QUEUE_GROUP,
     "the projector from its DuckDB projection of the fact log"),
)  # fmt: skip


def build_broker() -> NatsBroker:
    """A NatsBroker declaring every subject and message; nothing connects."""
    broker = NatsBroker(SERVER, description="NATS with JetStream (a cluster in production)")
    commands = JStream(COMMANDS_STREAM, declare=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for model in command_models():
            broker.subscriber(command_address(model), stream=commands, title=kind_of(model),
                              description=command_description(model))(_handler(model))  # fmt: skip
        for prefix, verbs, group, answered_by in READ_APIS:
            for verb in verbs:
                broker.subscriber(
                    f"{prefix}.{verb}", queue=group, title=f"{prefix.split('.')[1]}.{verb}",
                    description=f"Request/reply ({verb}), answered by {answered_by}.",
                )(_handler(API_REQUESTS.get(verb, AnyRequest)))  # fmt: skip
    for model in fact_models():
        broker.publisher(fact_address(model), schema=model, title=kind_of(model),
                         description=fact_description(model))  # fmt: skip
    broker.publisher(APPLIED_SUBJECT, schema=Applied, title="projected",
                     description="Core NATS (not stored): the projector applied a batch.")
    return broker


def generate() -> dict[str, Any]:
    """The AsyncAPI 3.0 document as a JSON-able dict."""
    spec = AsyncAPI(build_broker(), title=TITLE, version=VERSION, description=DESCRIPTION,
                    schema_version="3.0.0").to_specification()  # fmt: skip
    return _complete(spec.to_jsonable())


# -- examples: the example command files, replayed ---------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STORY = "notebook.jsonl"  # the read verbs' examples answer from its final state
API_EXAMPLES: dict[str, dict[str, Any]] = {
    "describe-service-job": {"jobId": "med"},
    "list-service-jobs": {"jobQueue": "q", "jobStatus": "ALL", "maxResults": 2},
    "get-job-queue-snapshot": {"jobQueue": "q"},
    "describe-quota-share": {"jobQueue": "q", "quotaShareName": "qs1"},
    "describe-service-environments": {},
    "describe-scheduling-policies": {},
}


def examples() -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[dict, dict]]]:
    """Real messages: per command kind and per fact kind the first one found in the example
    files (in name order) and its replay, and per read verb a request and the scheduler's
    answer after the notebook story.  Named after the file and line they come from."""
    if not (EXAMPLES / STORY).exists():
        raise FileNotFoundError(f"{EXAMPLES / STORY} not found: generate the AsyncAPI document "
                                "from a source checkout")  # fmt: skip
    commands: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    for path in sorted(EXAMPLES.glob("*.jsonl")):
        lines = path.read_bytes().splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                kind = decode_command(line).kind
            except DecodeError:
                continue
            commands.setdefault(kind, {"name": kind, "summary": f"examples/{path.name}, line {number}",
                                       "payload": json.loads(line)})  # fmt: skip
        for fact in replay_lines(lines):
            facts.setdefault(fact.kind, {
                "name": fact.kind, "payload": json.loads(encode(fact)),
                "summary": f"quotasched replay examples/{path.name} (command on line {fact.command_seq})",
            })  # fmt: skip
    state = State()
    for _ in replay_lines((EXAMPLES / STORY).read_bytes().splitlines(), state):
        pass
    answers = {verb: (request, scheduler_api.answer(state, verb, request))
               for verb, request in API_EXAMPLES.items() if verb in scheduler_api.VERBS}  # fmt: skip
    return commands, facts, answers


# -- what FastStream 0.7 leaves out ------------------------------------------------------------

COMMAND_HEADERS = {
    "type": "object",
    "properties": {"Nats-Msg-Id": {"type": "string", "description":
        "Optional. JetStream drops a second message with the same id within the stream's "
        "duplicate window (QUOTASCHED_STREAM_DUPLICATE_WINDOW_S, 120 s by default). Ticks use "
        "`tick:<partition>:<slot>`; submissions are made idempotent by jobId or clientToken."}},
}  # fmt: skip

FACT_HEADERS = {
    "type": "object",
    "required": ["Nats-Msg-Id", "Qm-Facts"],
    "properties": {
        "Nats-Msg-Id": {"type": "string", "pattern": "^[^:]+:[0-9]+:[0-9]+$", "description":
            "`<partition>:<command stream sequence>:<index>`: the index-th fact of that command."},
        "Qm-Facts": {"type": "string", "pattern": "^[0-9]+$", "description":
            "How many facts the command produced, so a reader knows when it has all of them."},
        "Nats-Expected-Last-Subject-Sequence": {"type": "string", "description":
            "Fencing, set by the writer: the sequence of the previous fact on qm.fact.>; the "
            "server refuses the append if another fact got in first."},
        "Nats-Expected-Last-Subject-Sequence-Subject": {"type": "string", "const": "qm.fact.>"},
    },
}  # fmt: skip

PARAMETERS = {
    "jobQueue": {"description": f"The job queue's name, or `{ANY}` where none applies."},
    "quotaShare": {"description": f"The quota share's name, or `{ANY}` where none applies."},
}


def _complete(doc: dict[str, Any]) -> dict[str, Any]:
    doc = _ordered(doc)
    channels, operations = doc["channels"], doc["operations"]
    messages = doc["components"]["messages"]
    for message in messages.values():
        message.pop("correlationId", None)  # FastStream's default; quotasched sets none
    commands = {kind_of(m) for m in command_models()}
    facts = {kind_of(m) for m in fact_models()}
    command_examples, fact_examples, answers = examples()
    replies: dict[str, Any] = {}
    for key, channel in channels.items():
        params = {p: PARAMETERS[p] for p in PARAMETERS if "{%s}" % p in channel["address"]}
        if params:
            channel["parameters"] = params
        headers = None
        if key in commands:
            channel["x-jetstream-stream"] = COMMANDS_STREAM
            headers = COMMAND_HEADERS
        elif key in facts:
            channel["x-jetstream-stream"] = FACTS_STREAM
            headers = FACT_HEADERS
        for ref in channel["messages"].values():
            message = messages[ref["$ref"].rsplit("/", 1)[1]]
            message["name"] = key
            if headers is not None:
                message["headers"] = headers
            example = command_examples.get(key) or fact_examples.get(key)
            if example is not None:
                message["examples"] = [example]
            elif key[4:] in answers and key.startswith("api."):
                message["examples"] = [{"name": key, "payload": answers[key[4:]][0]}]
        if key.startswith(("api.", "proj.")):
            replies[key] = {"name": f"{key}.reply", "title": f"{key} reply",
                            "payload": {"oneOf": [{"type": "object"}, ERROR_REPLY]}}  # fmt: skip
            if key.startswith("api.") and key[4:] in answers:
                replies[key]["examples"] = [{
                    "name": f"{key}.reply", "payload": answers[key[4:]][1],
                    "summary": f"the answer after quotasched replay examples/{STORY}",
                }]  # fmt: skip
    if replies:
        channels["reply"] = {
            "address": None,
            "description": "The requester's inbox (the NATS reply subject of the request).",
            "messages": {name: {"$ref": f"#/components/messages/{name}.reply"} for name in replies},
        }
        for name, reply in replies.items():
            messages[f"{name}.reply"] = reply
            operations[name]["reply"] = {
                "channel": {"$ref": "#/channels/reply"},
                "messages": [{"$ref": f"#/channels/reply/messages/{_pointer(name)}"}],
            }
    # plain data with no shared parts, so YAML writes no anchors
    return json.loads(json.dumps(_ordered(doc)))


def _ordered(doc: dict[str, Any]) -> dict[str, Any]:
    """Channels and operations in a fixed order (FastStream keeps its endpoints unordered):
    commands and facts in the unions' order, then the read APIs, then the rest; messages in
    channel order, schemas by name.  The document must not change from one run to the next."""
    rank = {kind_of(m): i for i, m in enumerate([*command_models(), *fact_models()])}

    def key(name: str) -> tuple:
        group = 0 if name in rank else 1 if name.startswith("api.") else \
            2 if name.startswith("proj.") else 3  # fmt: skip
        return group, rank.get(name, 0), name

    channels = {name: doc["channels"][name] for name in sorted(doc["channels"], key=key)}
    doc["channels"] = channels
    doc["operations"] = {name: doc["operations"][name] for name in sorted(doc["operations"], key=key)}
    messages = doc["components"]["messages"]
    order = [ref["$ref"].rsplit("/", 1)[1] for channel in channels.values()
             for ref in channel["messages"].values()]  # fmt: skip
    doc["components"]["messages"] = {name: messages[name] for name in order}
    schemas = doc["components"]["schemas"]
    doc["components"]["schemas"] = {name: schemas[name] for name in sorted(schemas)}
    return doc


def _pointer(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def render(fmt: str = "yaml") -> str:
    doc = generate()
    if fmt == "json":
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)
    raise ValueError(f"unknown format {fmt!r}: yaml or json")
