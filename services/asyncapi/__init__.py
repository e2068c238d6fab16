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

The package, one concept a module: `kinds` (the unions' models, their subjects and
descriptions), `read_requests` (the read APIs' request models), `broker` (the never-connected
`NatsBroker`), `example_messages` (the real examples), `completion` (what FastStream leaves
out, and the fixed order) and `document` (generate and render).  This module re-exports
their names, so `services.asyncapi` stays the one import path.

    quotasched asyncapi --out docs/asyncapi.yaml     # regenerate the committed document
"""

from quotasched.services.asyncapi.broker import API_QUEUE_GROUP, READ_APIS, SERVER, build_broker
from quotasched.services.asyncapi.completion import (
    COMMAND_HEADERS,
    FACT_HEADERS,
    PARAMETERS,
    _complete,
    _ordered,
    _pointer,
)
from quotasched.services.asyncapi.document import (
    DESCRIPTION,
    DOCUMENT,
    REGENERATE,
    TITLE,
    VERSION,
    generate,
    render,
)
from quotasched.services.asyncapi.example_messages import API_EXAMPLES, EXAMPLES, STORY, examples
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
from quotasched.services.asyncapi.read_requests import (
    API_REQUESTS,
    ERROR_REPLY,
    AnyRequest,
    Applied,
    DescribeQuotaShareRequest,
    DescribeServiceJobRequest,
    EmptyRequest,
    ListFilter,
    ListServiceJobsRequest,
    QueueRequest,
    SqlRequest,
    UtilizationRequest,
)

__all__ = [
    "API_EXAMPLES", "API_QUEUE_GROUP", "API_REQUESTS", "COMMAND_HEADERS", "DESCRIPTION",
    "DOCUMENT", "ERROR_REPLY", "EXAMPLES", "FACT_HEADERS", "PARAMETERS", "QUEUE", "READ_APIS",
    "REGENERATE", "SERVER", "SHARE", "STORY", "TITLE", "VERSION", "AnyRequest", "Applied",
    "DescribeQuotaShareRequest", "DescribeServiceJobRequest", "EmptyRequest", "ListFilter",
    "ListServiceJobsRequest", "QueueRequest", "SqlRequest", "UtilizationRequest",
    "build_broker", "command_address", "command_description", "command_models", "examples",
    "fact_address", "fact_description", "fact_models", "generate", "kind_of", "render",
]  # fmt: skip
