"""docs/asyncapi.yaml: generated from the code, complete, consistent with the real routing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quotasched.events.codec import decode_command, decode_fact
from quotasched.events.commands import COMMAND_KINDS
from quotasched.events.subjects import JOB_ID_COMMANDS, parse_command_subject, subject_for_command
from quotasched.services import asyncapi
from quotasched.services.projector import api as projector_api
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler import api as scheduler_api
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.routing import fact_subject_of

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / asyncapi.DOCUMENT
QUOTASCHED = Path(sys.executable).parent / "quotasched"
EXAMPLES = sorted((ROOT / "examples").glob("*.jsonl"))


@pytest.fixture(scope="module")
def rendered() -> str:
    return asyncapi.render("yaml")


@pytest.fixture(scope="module")
def doc(rendered) -> dict:
    return yaml.safe_load(rendered)


def test_committed_document_is_up_to_date(rendered):
    committed = COMMITTED.read_text() if COMMITTED.exists() else ""
    assert committed == rendered, (
        f"{asyncapi.DOCUMENT} is out of date with the code; regenerate it with "
        f"`.venv/bin/{asyncapi.REGENERATE}` and commit it"
    )


def test_generation_is_deterministic_across_hash_seeds(rendered):
    for seed in ("1", "2"):
        out = subprocess.run(
            [str(QUOTASCHED), "asyncapi"], capture_output=True, cwd=ROOT, timeout=120,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode() == rendered


def test_document_is_valid_asyncapi_3(doc):
    """Against the official AsyncAPI 3.0.0 JSON Schema (schemas/3.0.0-without-$id.json of the
    npm package @asyncapi/specs 6.11.1, Apache-2.0), vendored minified so the test is offline."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parent / "asyncapi-3.0.0-schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{list(e.path)}: {e.message[:200]}" for e in validator.iter_errors(doc)]
    assert not errors, errors[:5]
    broken = {**doc, "operations": {**doc["operations"], "Tick": {"channel": {}}}}
    assert any(True for _ in validator.iter_errors(broken))  # the schema does check


def _schema_of(doc: dict, channel: dict) -> dict:
    (ref,) = channel["messages"].values()
    message = _resolve(doc, ref["$ref"])
    return _resolve(doc, message["payload"]["$ref"])


def _resolve(doc: dict, ref: str):
    node = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_every_command_kind_is_a_channel_with_its_model(doc):
    assert [m.model_fields["kind"].default for m in asyncapi.command_models()] == list(COMMAND_KINDS)
    for kind in COMMAND_KINDS:
        channel = doc["channels"][kind]
        assert channel["address"].startswith("qm.cmd.") and channel["address"].endswith(f".{kind}")
        assert channel["x-jetstream-stream"] == "QM_COMMANDS"
        assert doc["operations"][kind]["action"] == "receive"
        schema = _schema_of(doc, channel)
        assert schema["properties"]["kind"]["const"] == kind
        assert schema["additionalProperties"] is False  # unknown fields are refused


def test_every_fact_kind_is_a_channel_with_its_model(doc):
    kinds = [m.model_fields["kind"].default for m in asyncapi.fact_models()]
    assert len(kinds) >= 17 and "JobDispatched" in kinds
    for kind in kinds:
        channel = doc["channels"][kind]
        assert channel["address"].startswith("qm.fact.") and channel["address"].endswith(f".{kind}")
        assert channel["x-jetstream-stream"] == "QM_FACTS"
        assert doc["operations"][kind]["action"] == "send"
        (ref,) = channel["messages"].values()
        message = _resolve(doc, ref["$ref"])
        assert {"Nats-Msg-Id", "Qm-Facts"} <= set(message["headers"]["required"])
        schema = _resolve(doc, message["payload"]["$ref"])
        assert schema["properties"]["kind"]["const"] == kind
        assert {"at", "commandSeq"} <= set(schema["required"])


def test_every_kind_has_a_real_example_that_decodes(doc):
    """Examples come from the example files and their replay: each must be a valid message of
    its own kind, and every kind must have one (the example files cover them all)."""
    messages = doc["components"]["messages"]
    for model in [*asyncapi.command_models(), *asyncapi.fact_models()]:
        kind = asyncapi.kind_of(model)
        (ref,) = doc["channels"][kind]["messages"].values()
        (example,) = _resolve(doc, ref["$ref"])["examples"]
        decode = decode_command if kind in COMMAND_KINDS else decode_fact
        assert decode(json.dumps(example["payload"])).kind == kind, example["summary"]
    replies = [m for name, m in messages.items()
               if name.startswith("api.") and name.endswith(".reply") and "examples" in m]
    assert len(replies) >= 5
    for reply in replies:
        assert "error" not in reply["examples"][0]["payload"], reply["name"]


def test_every_read_verb_is_a_request_reply_channel(doc):
    for prefix, address, verbs in (("api", "qm.api.{jobQueue}", scheduler_api.VERBS),
                                   ("proj", "qm.proj", projector_api.VERBS)):  # fmt: skip
        for verb in verbs:
            name = f"{prefix}.{verb}"
            assert doc["channels"][name]["address"] == f"{address}.{verb}"
            operation = doc["operations"][name]
            assert operation["action"] == "receive"
            (reply,) = operation["reply"]["messages"]
            assert _resolve(doc, reply["$ref"])  # the reply message exists


def test_every_reference_resolves(doc):
    refs: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    assert len(refs) > 100
    for ref in refs:
        assert ref.startswith("#/"), ref
        _resolve(doc, ref)  # raises KeyError when dangling


def test_channel_parameters_match_addresses(doc):
    for name, channel in doc["channels"].items():
        address = channel["address"] or ""
        assert set(re.findall(r"\{(\w+)\}", address)) == set(channel.get("parameters", {})), name


def _pattern(address: str) -> re.Pattern:
    """A channel address as a regex: a parameter is one subject token (a name or `~`)."""
    parts = [r"[^.]+" if re.fullmatch(r"\{\w+\}", p) else re.escape(p) for p in address.split(".")]
    return re.compile(r"\.".join(parts))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_real_subjects_match_the_documented_addresses(doc, example):
    """Route every command and fact of an example the way the client and the scheduler do;
    each subject must match its kind's documented address (placeholders and `~` included)."""
    lines = example.read_bytes().splitlines()
    state = State()
    facts = list(replay_lines(iter(lines), state))
    routes = {job.job_id: (job.queue, job.share) for job in state.jobs.values()}
    seen, command_routes = 0, {}
    for number, line in enumerate(lines, start=1):
        try:
            command = decode_command(line)
        except ValueError:
            continue
        route = routes.get(getattr(command, "job_id", None)) if command.kind in JOB_ID_COMMANDS else None
        subject = subject_for_command(command, route)
        assert _pattern(doc["channels"][command.kind]["address"]).fullmatch(subject), subject
        command_routes[number] = parse_command_subject(subject)[:2]
        seen += 1
    for fact in facts:  # the scheduler's own fact routing
        subject = fact_subject_of(state, fact, command_routes.get(fact.command_seq, (None, None)))
        assert _pattern(doc["channels"][fact.kind]["address"]).fullmatch(subject), subject
    assert seen and facts


def test_check_option_reports_a_stale_file(tmp_path):
    stale = tmp_path / "asyncapi.yaml"
    stale.write_text("asyncapi: 3.0.0\n")
    out = subprocess.run([str(QUOTASCHED), "asyncapi", "--out", str(stale), "--check"],
                         capture_output=True, timeout=120)  # fmt: skip
    assert out.returncode == 1
    assert b"out of date" in out.stderr and b"quotasched asyncapi" in out.stderr
    assert stale.read_text() == "asyncapi: 3.0.0\n"
    fresh = subprocess.run([str(QUOTASCHED), "asyncapi", "--out", str(stale)], timeout=120)
    assert fresh.returncode == 0
    again = subprocess.run([str(QUOTASCHED), "asyncapi", "--out", str(stale), "--check"],
                           capture_output=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
