"""Real messages for the AsyncAPI document: per command kind and per fact kind the first one
found in the example command files or in their replay, and per read verb a request and the
scheduler's answer after the notebook story."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quotasched import examples_dir
from quotasched.events.codec import DecodeError, decode_command, encode
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler import api as scheduler_api
from quotasched.services.scheduler.core import State

EXAMPLES = examples_dir()
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
