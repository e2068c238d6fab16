"""Snapshots are captured at one instant, even though a child process writes them later."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path

from services.replay import replay_lines
from services.scheduler.core import State
from services.scheduler.core.views import canonical_state
from services.scheduler.log import SNAPSHOT_VERSION, Recovered, capture_snapshot, encode_snapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def replayed(lines: list[bytes]) -> tuple[State, int]:
    state = State()
    facts = list(replay_lines(lines, state))
    return state, len(facts)


def test_a_capture_holds_the_state_of_its_moment_while_the_state_moves_on():
    lines = (EXAMPLES / "notebook.jsonl").read_bytes().splitlines()
    half = len(lines) // 2
    state, facts = replayed(lines[:half])
    before = canonical_state(state)
    capture = capture_snapshot(Recovered(state, facts, half))

    # the writer goes on deciding before the captured bytes are read
    for _ in replay_lines(lines[half:], state):
        pass
    assert canonical_state(state) != before

    version, fact_seq, decided_through, commands_through, restored = pickle.loads(
        zlib.decompress(capture()))
    assert (version, fact_seq, decided_through) == (SNAPSHOT_VERSION, facts, half)
    assert commands_through == 0  # not given: no command beyond the recorded ones
    assert canonical_state(restored) == before


def test_the_captured_bytes_are_the_compressed_pickle_of_the_state():
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    recovered = Recovered(state, facts, 7, 9)
    image = (SNAPSHOT_VERSION, facts, 7, 9, state)
    captured = capture_snapshot(recovered)()
    assert zlib.decompress(captured) == pickle.dumps(image, protocol=pickle.HIGHEST_PROTOCOL)
    assert captured == encode_snapshot(image)
