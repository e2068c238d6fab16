"""What FastStream 0.7 leaves out of the AsyncAPI document, added to its output afterwards:
message headers, examples, channel parameters, request/reply, the stream of a channel; and a
fixed order of channels, operations, messages and schemas, so the document does not change
from one run to the next."""

from __future__ import annotations

import json
from typing import Any

from quotasched.events.subjects import ANY, COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.asyncapi.example_messages import STORY, examples
from quotasched.services.asyncapi.kinds import command_models, fact_models, kind_of
from quotasched.services.asyncapi.read_requests import ERROR_REPLY

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
