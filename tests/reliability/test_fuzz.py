"""Property-based hostile input through `replay` (the decision core and the CLI).

Every hostile message is either refused with a reason (one `CommandRejected` with a non-empty
`statusReason` of bounded length) or applied, and the state keeps every invariant after each
message.  Over the bus, a hostile tenant beside honest ones is tested against an expectation
that does not come from the scheduler's own decisions: tests/reliability/test_hostile_tenant.py.
"""

from __future__ import annotations

import json
import subprocess

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotasched.services.scheduler.core import State, step_raw
from quotasched.services.scheduler.core.invariants import check_state
from tests.integration.conftest import QUOTASCHED
from tests.reliability.hostile import hostile_message, setup_messages

MAX_REASON = 4096


def check_decision(facts: list, seq: int, what: str, payload: bytes) -> None:
    """A message's facts: at least one (a Tick that fires no timer has none: it only moves
    the clock); a refusal is alone and says why."""
    if not facts:
        assert json.loads(payload).get("kind") == "Tick", f"{what}: no fact (the message vanished)"
        return
    assert all(fact.command_seq == seq for fact in facts), what
    rejected = [fact for fact in facts if fact.kind == "CommandRejected"]
    if rejected:
        assert len(facts) == 1, f"{what}: rejected and applied at once"
        reason = rejected[0].status_reason
        assert reason and reason.strip(), f"{what}: refused without a reason"
        assert len(reason) <= MAX_REASON, f"{what}: a reason of {len(reason)} characters"


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(st.lists(hostile_message(big=False), min_size=1, max_size=25))
def test_replay_refuses_with_a_reason_or_applies_keeping_every_invariant(messages):
    state = State()
    lines = [payload for _, payload in setup_messages()] + [payload for _, payload in messages]
    for seq, line in enumerate(lines, start=1):
        facts = step_raw(state, line, seq)
        check_decision(facts, seq, f"line {seq} {line[:120]!r}", line)
        problems = check_state(state)
        assert not problems, f"after line {seq} {line[:120]!r}: {problems}"


def test_replay_cli_reads_a_hostile_file_to_the_end(tmp_path):
    collected: list[bytes] = []

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(hostile_message(big=False))
    def collect(message):
        collected.append(message[1].replace(b"\n", b" ").replace(b"\r", b" "))

    collect()
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join([payload for _, payload in setup_messages()] + collected) + b"\n")
    done = subprocess.run([QUOTASCHED, "replay", str(path)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    facts = [json.loads(line) for line in done.stdout.splitlines()]
    lines = [payload for _, payload in setup_messages()] + collected
    decided = {fact["commandSeq"] for fact in facts}
    # Every line is decided to the end, but a Tick that finds no timer due decides nothing
    # (no fact), so those lines alone may have none; which messages Hypothesis draws varies
    # with the modules already imported (its pool of the code's own constants).
    ticks = {seq for seq, line in enumerate(lines, start=1) if _kind(line) == "Tick"}
    assert set(range(1, len(lines) + 1)) - ticks <= decided <= set(range(1, len(lines) + 1))


def _kind(line: bytes):
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # hostile: not JSON, or nested past any decoder
        return None
    return message.get("kind") if isinstance(message, dict) else None
