"""Property-based hostile input, through `replay` (the decision core) and over the bus (a live
scheduler on a real nats-server).

Every hostile message is either refused with a reason (one `CommandRejected` with a non-empty
`statusReason` of bounded length) or applied; the state keeps every invariant after each
message; the live scheduler decides exactly what the core decides offline for the same
messages (so what it applied, it applied correctly); it never stops leading; and its memory
stays bounded while hostile rounds keep coming.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from events.subjects import COMMANDS_STREAM
from services.client import Bus
from services.scheduler.core import State, step_raw
from services.scheduler.core.invariants import check_state
from services.scheduler.routing import decide_message
from services.scheduler.log import sequence_and_time
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import (
    assert_alive,
    assert_decided_once,
    assert_same_facts,
    logged,
    read_facts,
    wait_decided,
)
from tests.integration.test_failover import wait_leading
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
    lines = len(collected) + len(setup_messages())
    assert {fact["commandSeq"] for fact in facts} == set(range(1, lines + 1))


ROUNDS = 4
PER_ROUND = 250


def hostile_rounds() -> list[list[tuple[str, bytes]]]:
    """ROUNDS different rounds of PER_ROUND hostile messages, the same on every run."""
    rounds: list[list[tuple[str, bytes]]] = []
    for index in range(ROUNDS):
        messages: list[tuple[str, bytes]] = []

        @seed(20261130 + index)
        @settings(max_examples=PER_ROUND, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(hostile_message())
        def collect(message):
            messages.append(message)

        collect()
        rounds.append(messages)
    return rounds


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def read_commands(js, end: int) -> list[tuple[int, str, bytes, float]]:
    """(seq, subject, payload, stamp) of every command, with the stamp the scheduler uses."""
    import asyncio

    out: list = []
    done = asyncio.Event()

    async def deliver(msg) -> None:
        seq, stamp = sequence_and_time(msg)
        out.append((seq, msg.subject, msg.data, stamp))
        if seq >= end:
            done.set()

    sub = await js.subscribe("qm.cmd.>", cb=deliver, ordered_consumer=True, stream=COMMANDS_STREAM)
    try:
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await sub.unsubscribe()
    return out


@pytest.mark.nats
@pytest.mark.slow
async def test_hostile_rounds_over_the_bus_match_the_core_and_memory_stays_bounded(spawn,
                                                                                    nats_server):
    from tests.integration.helpers import NO_TICKS

    rounds = hostile_rounds()
    scheduler = spawn("scheduler", **NO_TICKS)
    await wait_leading(scheduler)
    rss = []
    async with Bus(nats_server.url) as bus:
        for subject, payload in setup_messages():
            await bus.js.publish(subject, payload, stream=COMMANDS_STREAM)
        for messages in rounds:
            for subject, payload in messages:
                ack = await bus.js.publish(subject, payload, stream=COMMANDS_STREAM)
            await wait_decided(bus.js, ack.seq, timeout=60, processes=[scheduler])
            assert_alive(scheduler)
            rss.append(rss_kib(scheduler.popen.pid))
        commands = await read_commands(bus.js, ack.seq)
        facts = await read_facts(bus.js)
    assert len(logged(scheduler, "leading")) == 1, "the scheduler stopped leading"
    assert_decided_once(facts)

    # offline, the same messages with the same sequences and stamps: the same facts, and every
    # message refused with a reason or applied keeping the invariants
    state, expected = State(), []
    for seq, subject, payload, stamp in commands:
        decided = decide_message(state, subject, payload, seq, stamp)
        check_decision(decided, seq, f"command {seq} on {subject}: {payload[:120]!r}", payload)
        assert not check_state(state), f"after command {seq}: {check_state(state)}"
        expected.extend(json.loads(fact.model_dump_json(by_alias=True)) for fact in decided)
    assert_same_facts(facts, expected, drop=(), context="live vs offline:")

    # memory: later rounds (as hostile as the first) do not keep growing the process
    growth_mib = (max(rss[1:]) - rss[0]) / 1024
    assert growth_mib < 64, f"RSS grew {growth_mib:.0f} MiB after the first round: {rss} KiB"
