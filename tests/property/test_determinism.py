"""Determinism and purity of the decision core.

(a) The same command file, replayed twice in one process, gives byte-identical facts.
(b) `quotasched replay FILE --state-out OUT` gives byte-identical standard output and state file
    in separate processes with different PYTHONHASHSEED values (so no decision may depend on the
    iteration order of a set or of a dict built from one), and the same facts as in-process.
(c) `decide` is pure: on random non-trivial states it leaves `canonical_state` untouched, gives
    exactly the facts `step` then gives, and a dry run leaves no trace that could change any
    later decision (the facts of the rest of the file are identical with and without dry runs).

Command files come from the seeded generator of `conftest.py` (seeds are fixed, so every run
tests the same files); a failure prints the file, ready for `quotasched replay`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from quotasched.events.codec import DecodeError, decode_command, encode
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import State, catch_up_clock, decide, fold, step, step_raw
from quotasched.services.scheduler.core.views import canonical_state
from tests.property.conftest import random_command_lines

MAIN = Path(__file__).resolve().parents[2]


def _replay(lines: list[str], state: State | None = None) -> list[str]:
    state = state if state is not None else State()
    return [encode(fact) for number, line in enumerate(lines, start=1)
            for fact in step_raw(state, line, number)]  # fmt: skip


def _file(lines: list[str]) -> str:
    return "command file:\n" + "\n".join(lines)


def _canonical(state: State) -> str:
    return json.dumps(canonical_state(state), sort_keys=True)


def _without_at(line: str) -> str | None:
    """The command of `line` stamped with the scheduler's current time (no `at`), if any."""
    try:
        command = json.loads(line)
    except ValueError:
        return None
    if not isinstance(command, dict):
        return None
    command.pop("at", None)
    return json.dumps(command)


# -- (a) same process --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_replaying_the_same_file_twice_gives_identical_facts(seed):
    lines = random_command_lines(random.Random(seed), steps=120)
    first, second = _replay(lines), _replay(lines)
    assert first == second, _file(lines)
    # The offline runner's own loop is the same core: the same bytes again.
    assert [encode(fact) for fact in replay_lines(lines)] == first, _file(lines)
    kinds = {json.loads(fact)["kind"] for fact in first}
    assert "JobSubmitted" in kinds and "CommandRejected" in kinds, "the generator went stale"


# -- (b) across processes ----------------------------------------------------------------------


def _run_replay(exe: Path, commands: Path, state_out: Path, hash_seed: str) -> tuple[bytes, bytes]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    result = subprocess.run(
        [str(exe), "replay", str(commands), "--state-out", str(state_out)],
        cwd=MAIN, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout, state_out.read_bytes()


@pytest.mark.parametrize("seed", [7, 2024])
def test_replay_is_byte_identical_across_hash_seeds(seed, tmp_path, quotasched_exe):
    lines = random_command_lines(random.Random(seed), steps=300)
    commands = tmp_path / "commands.jsonl"
    commands.write_text("\n".join(lines) + "\n")
    runs = {hash_seed: _run_replay(quotasched_exe, commands, tmp_path / f"state-{hash_seed}.json", hash_seed)
            for hash_seed in ("0", "1", "12345")}  # fmt: skip
    outputs = {stdout for stdout, _ in runs.values()}
    states = {state for _, state in runs.values()}
    assert len(outputs) == 1, f"stdout differs between PYTHONHASHSEED values; {_file(lines)}"
    assert len(states) == 1, f"--state-out differs between PYTHONHASHSEED values; {_file(lines)}"
    stdout = outputs.pop().decode()
    assert stdout.splitlines() == _replay(lines), "the CLI and the in-process core disagree"
    document = json.loads(states.pop())
    assert set(document) == {"jobs", "queues"}


# -- (c) decide is pure ------------------------------------------------------------------------


def _split(seed: int) -> tuple[list[str], list[str]]:
    lines = random_command_lines(random.Random(seed), steps=100)
    setup = sum(1 for line in lines if '"Create' in line)
    cut = setup + (len(lines) - setup) // 2
    return lines[:cut], lines[cut:]


@pytest.mark.parametrize("seed", range(10))
def test_decide_leaves_the_state_untouched(seed):
    """canonical_state before decide == after, for every command of the second half of a
    random file, each decided on the state the first half (and what came since) built."""
    prefix, rest = _split(seed)
    state = State()
    _replay(prefix, state)
    for number, line in enumerate(rest, start=len(prefix) + 1):
        try:
            command = decode_command(line)
        except DecodeError:
            continue
        before = _canonical(state)
        decide(state, command, number)
        assert _canonical(state) == before, (
            f"decide() changed canonical_state on line {number}: {line}\n{_file(prefix + rest[: number - len(prefix)])}"
        )
        step(state, command, number)


@pytest.mark.parametrize("seed", range(10))
def test_decide_gives_the_facts_step_gives(seed):
    prefix, rest = _split(seed)
    state = State()
    _replay(prefix, state)
    for number, line in enumerate(rest, start=len(prefix) + 1):
        try:
            command = decode_command(line)
        except DecodeError:
            continue
        expected = [encode(fact) for fact in decide(state, command, number)]
        actual = [encode(fact) for fact in step(state, command, number)]
        assert actual == expected, f"line {number}: {line}\n{_file(prefix + rest)}"


@pytest.mark.parametrize("seed", range(16))
def test_dry_runs_leave_no_trace(seed):
    """Two states built from the same commands; one of them also answers 'what if' questions
    (decide on other commands of the file, stamped with the current time) before every real
    command.  Every later fact must be identical byte for byte."""
    rng = random.Random(1000 + seed)
    prefix, rest = _split(seed)
    probes = [probe for probe in map(_without_at, prefix + rest) if probe is not None]
    plain, probed = State(), State()
    _replay(prefix, plain)
    _replay(prefix, probed)
    log = list(prefix)
    for number, line in enumerate(rest, start=len(prefix) + 1):
        for _ in range(2):
            what_if = rng.choice(probes)
            try:
                decide(probed, decode_command(what_if), number)
            except DecodeError:
                pass
            log.append(f"# dry run: {what_if}")
        log.append(line)
        expected = [encode(fact) for fact in step_raw(plain, line, number)]
        actual = [encode(fact) for fact in step_raw(probed, line, number)]
        assert actual == expected, (
            f"after dry runs, line {number} decided differently:\n  with:    {actual}\n"
            f"  without: {expected}\n" + _file(log)
        )


# -- minimal reproductions of what the properties above found ----------------------------------

SETUP = [
    '{"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 2}]}',
    '{"at": 0, "kind": "CreateSchedulingPolicy", "name": "sp", "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}',
    '{"at": 0, "kind": "CreateJobQueue", "jobQueueName": "q", "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}], "schedulingPolicy": "sp"}',
    '{"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 2}], "resourceSharingConfiguration": {"strategy": "RESERVE"}, "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}',
]


def _submit(job_id: str, timeout: int | None = None) -> str:
    command = {"at": 0, "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "q",
               "quotaShareName": "qs", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}  # fmt: skip
    if timeout is not None:
        command["timeoutConfig"] = {"attemptDurationSeconds": timeout}
    return json.dumps(command)


def test_decide_keeps_the_order_of_a_shares_dispatched_jobs():
    """Undoing the release of `a` must not move it behind `b` in its share's dispatched jobs."""
    state = State()
    _replay(SETUP + [_submit("a"), _submit("b")], state)
    before = _canonical(state)
    decide(state, decode_command('{"at": 1, "kind": "TerminateServiceJob", "jobId": "a", "reason": "what if"}'), 7)
    assert _canonical(state) == before


def test_a_dry_run_does_not_shorten_a_later_attempt():
    """`decide` dispatches b at t=10 (timer for t=110); for real b is dispatched at t=50 and
    must time out at t=150, not at t=110.  (c's timer sits on top of the heap, so b's phantom
    one is not cleaned before the real dispatch.)"""
    lines = SETUP + [_submit("c", timeout=100), _submit("a"), _submit("b", timeout=100)]
    later = ['{"at": 50, "kind": "TerminateServiceJob", "jobId": "a", "reason": "now"}',
             '{"at": 120, "kind": "Tick"}']  # fmt: skip
    plain, probed = State(), State()
    _replay(lines, plain)
    _replay(lines, probed)
    decide(probed, decode_command('{"at": 10, "kind": "TerminateServiceJob", "jobId": "a", "reason": "what if"}'), 8)
    expected = [encode(f) for n, line in enumerate(later, 8) for f in step_raw(plain, line, n)]
    actual = [encode(f) for n, line in enumerate(later, 8) for f in step_raw(probed, line, n)]
    assert actual == expected


def test_a_state_recovered_from_the_facts_decides_like_the_live_one():
    """Recovery as the live service does it (services/scheduler/log.py `recover` and the
    consumer of a new term): fold the fact log, then decide again every command after the last
    one the log records.  A Tick that fired nothing left no fact, so the fold alone lags the
    live clock (1000); re-deciding that Tick brings it back, and a later command stamped 500
    then happens at 1000 on both (ruling 9)."""
    lines = SETUP + ['{"at": 1000, "kind": "Tick"}']
    late = '{"at": 500, "kind": "SubmitServiceJob", "jobId": "a", "jobName": "a", "jobQueue": "q", "quotaShareName": "qs", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}'
    live = State()
    facts = [fact for number, line in enumerate(lines, start=1) for fact in step_raw(live, line, number)]
    recovered = fold(facts)
    recorded_through = max(fact.command_seq for fact in facts)
    for number, line in enumerate(lines, start=1):
        if number > recorded_through:
            assert step_raw(recovered, line, number) == []  # silent, as the first time
    assert canonical_state(recovered) == canonical_state(live)
    number = len(lines) + 1
    assert [encode(f) for f in step_raw(recovered, late, number)] == [encode(f) for f in step_raw(live, late, number)]

def test_recovery_after_a_tick_that_only_fired_a_timer():
    """The same recovery, when the Tick *did* leave a fact: a's 100 s attempt times out at its
    deadline (t=100) during the Tick at t=150.  The fact is stamped 100 and the log records the
    Tick, so recovery does not decide it again: the recovered clock stays at 100 while the live
    one is at 150, and b, stamped 120, is decided at 120 instead of 150 (time going backwards
    across the failover, which ruling 9 forbids and an audit re-running the commands cannot
    reproduce)."""
    lines = SETUP[:3] + [
        '{"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}], "resourceSharingConfiguration": {"strategy": "RESERVE"}, "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}',
        _submit("a", timeout=100),
        '{"at": 150, "kind": "Tick"}',
    ]
    late = _submit("b").replace('"at": 0', '"at": 120')
    live = State()
    facts = [fact for number, line in enumerate(lines, start=1) for fact in step_raw(live, line, number)]
    recovered = fold(facts)
    recorded_through = max(fact.command_seq for fact in facts)
    catch_up_clock(recovered, lines[recorded_through - 1])  # as a new term does (service.py)
    for number, line in enumerate(lines, start=1):
        if number > recorded_through:
            assert step_raw(recovered, line, number) == []
    number = len(lines) + 1
    assert [encode(f) for f in step_raw(recovered, late, number)] == [encode(f) for f in step_raw(live, late, number)]
    assert canonical_state(recovered) == canonical_state(live)
