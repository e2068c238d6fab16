"""The FastStream `NatsBroker` that declares every subject and message of the public
interface and is never connected: command channels received from QM_COMMANDS, fact channels
sent to QM_FACTS, the read APIs' request/reply verbs and the `qm.projected` notification."""

from __future__ import annotations

import warnings

from faststream.nats import JStream, NatsBroker
from pydantic import BaseModel

from quotasched.events.subjects import API_PREFIX, COMMANDS_STREAM
from quotasched.services.asyncapi.kinds import (
    QUEUE,
    SHARE,
    command_address,
    command_description,
    command_models,
    fact_address,
    fact_description,
    fact_models,
    kind_of,
)
from quotasched.services.asyncapi.read_requests import API_REQUESTS, AnyRequest, Applied
from quotasched.services.projector import API_PREFIX as PROJ_PREFIX
from quotasched.services.projector import APPLIED_SUBJECT, QUEUE_GROUP as PROJ_QUEUE_GROUP
from quotasched.services.projector import api as projector_api
from quotasched.services.scheduler import api as scheduler_api

SERVER = "nats://127.0.0.1:4222"
API_QUEUE_GROUP = "qm-api"  # the scheduler's queue group on qm.api.> (services/scheduler/service.py)


def _handler(model: type[BaseModel]):
    """A handler whose only parameter is `model`: FastStream documents its schema."""

    async def handle(message) -> None:  # never called: the broker is never started
        raise NotImplementedError

    handle.__annotations__ = {"message": model, "return": None}
    handle.__name__ = model.__name__
    return handle


READ_APIS = (
    ("api", f"{API_PREFIX}.{QUEUE}", scheduler_api.VERBS, API_QUEUE_GROUP,
     "the leading scheduler (of the job queue's partition) from its decided state, shaped "
     "like AWS Batch's answer; `~` for the queue when the request names none"),
    ("api.team", f"{API_PREFIX}.{QUEUE}.{SHARE}", scheduler_api.VERBS, API_QUEUE_GROUP,
     "the leading scheduler, as on qm.api.{jobQueue}.<verb>, for a team: the only read subject "
     "a pipeline role may use; other shares' jobs come without serviceRequestPayload and tags"),
    ("proj", PROJ_PREFIX, projector_api.VERBS, PROJ_QUEUE_GROUP,
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
        for title, prefix, verbs, group, answered_by in READ_APIS:
            for verb in verbs:
                broker.subscriber(
                    f"{prefix}.{verb}", queue=group, title=f"{title}.{verb}",
                    description=f"Request/reply ({verb}), answered by {answered_by}.",
                )(_handler(API_REQUESTS.get(verb, AnyRequest)))  # fmt: skip
    for model in fact_models():
        broker.publisher(fact_address(model), schema=model, title=kind_of(model),
                         description=fact_description(model))  # fmt: skip
    broker.publisher(APPLIED_SUBJECT, schema=Applied, title="projected",
                     description="Core NATS (not stored): the projector applied a batch.")
    return broker
