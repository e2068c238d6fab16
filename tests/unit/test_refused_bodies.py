"""Issue 29: a refused command's body is not copied into the fact log.

A CommandRejected keeps a short prefix, the input's size and its sha256; the command stream
(here: the replay file) keeps the message whole, and `audit verify` re-derives the refusal
from it byte for byte.
"""

from __future__ import annotations

import base64
import hashlib
import json

from tests.unit.test_cli import NOTEBOOK_SETUP, facts_of, run

MIB = 1024 * 1024


def _replay_and_verify(tmp_path, bad: bytes) -> dict:
    commands = tmp_path / "commands.jsonl"
    commands.write_bytes(b"\n".join([*(line.encode() for line in NOTEBOOK_SETUP), bad]) + b"\n")
    replayed = run("replay", str(commands))
    assert replayed.returncode == 0, replayed.stderr.decode()
    facts = tmp_path / "facts.jsonl"
    facts.write_bytes(replayed.stdout)
    (rejected,) = [f for f in facts_of(replayed.stdout) if f["commandSeq"] == 7]
    verified = run("audit", "verify", "--commands", str(commands), "--facts", str(facts))
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    return rejected


def test_a_one_mib_undecodable_command_is_recorded_as_its_digest_prefix_and_size(tmp_path):
    bad = b'{"kind": "SubmitServiceJob", "jobQueue": "q", "junk": "' + b"x" * MIB + b'"}'
    rejected = _replay_and_verify(tmp_path, bad)
    assert rejected["kind"] == "CommandRejected"
    assert rejected["rawSize"] == len(bad)
    assert rejected["rawSha256"] == hashlib.sha256(bad).hexdigest()
    assert rejected["raw"].encode() == bad[:256]
    assert len(json.dumps(rejected)) < 2048  # the body is not in the record


def test_a_long_non_utf8_command_keeps_its_first_bytes_exactly_and_its_digest(tmp_path):
    bad = b"\xff\xfe" + b"\x00\x01" * 4096
    rejected = _replay_and_verify(tmp_path, bad)
    assert rejected["rawEncoding"] == "base64"
    assert base64.b64decode(rejected["raw"]) == bad[:256]
    assert rejected["rawSize"] == len(bad)
    assert rejected["rawSha256"] == hashlib.sha256(bad).hexdigest()


def test_a_short_undecodable_command_is_kept_whole_and_encoded_as_before(tmp_path):
    bad = b'{"kind": "LaunchRocket"}'
    rejected = _replay_and_verify(tmp_path, bad)
    assert rejected["raw"] == bad.decode()
    assert rejected["rawSize"] is None and "rawSha256" not in rejected
