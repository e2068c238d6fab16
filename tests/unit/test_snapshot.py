"""Snapshots are captured at one instant, even though a child process writes them later."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path

from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.views import canonical_state
from quotasched.services.scheduler import log
from quotasched.services.scheduler.log import (
    Recovered,
    SNAPSHOT_VERSION,
    capture_snapshot,
    decode_snapshot,
    decompress_snapshot,
    encode_snapshot,
)

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

    version, fact_seq, decided_through, commands_through, last_refused, restored = decode_snapshot(
        decompress_snapshot(capture()))
    assert (version, fact_seq, decided_through) == (SNAPSHOT_VERSION, facts, half)
    assert commands_through == 0  # not given: no command beyond the recorded ones
    assert last_refused is False
    assert canonical_state(restored) == before


def test_the_captured_bytes_are_the_encoded_state_and_decode_to_it():
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    recovered = Recovered(state, facts, 7, 9)
    image = (SNAPSHOT_VERSION, facts, 7, 9, False, state)
    captured = capture_snapshot(recovered)()
    assert captured == encode_snapshot(image)
    *head, restored = decode_snapshot(decompress_snapshot(captured))
    assert head == [SNAPSHOT_VERSION, facts, 7, 9, False]
    assert canonical_state(restored) == canonical_state(state)


def test_jobs_pickled_in_runs_come_back_whole_and_in_acceptance_order(monkeypatch):
    """The jobs' tuples are pickled in runs (each with its own memo): with runs of 3, every
    run boundary and a short last run are crossed, and the state loads as it was, its job
    index in acceptance order (readers and DeleteQuotaShare rely on that order)."""
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    assert len(state.jobs) > 7 and len(state.jobs) % 3, "want several runs and a short last one"
    monkeypatch.setattr(log, "JOBS_PER_PICKLE", 3)
    raw = decompress_snapshot(encode_snapshot((SNAPSHOT_VERSION, facts, 1, 2, True, state)))
    runs = pickle.loads(raw)[-1][log.JOBS_AT]
    assert [len(pickle.loads(run)) for run in runs] == \
        [3] * (len(state.jobs) // 3) + [len(state.jobs) % 3]
    *_, restored = decode_snapshot(raw)
    assert list(restored.jobs) == list(state.jobs)
    assert [job.seq for job in restored.jobs.values()] == sorted(job.seq for job in state.jobs.values())
    assert all(restored.jobs[job_id].snapshot() == job.snapshot() for job_id, job in state.jobs.items())
    assert canonical_state(restored) == canonical_state(state)


def test_snapshots_are_zstandard_and_a_zlib_one_is_refused_so_the_whole_log_is_folded():
    """Snapshots are compressed with Zstandard (its frame magic, RFC 8878).  One stored with
    zlib by a release before (the same pickle inside) is refused, as is anything damaged, and
    `load_snapshot` then folds the whole log once."""
    state, facts = replayed((EXAMPLES / "notebook.jsonl").read_bytes().splitlines())
    stored = encode_snapshot((SNAPSHOT_VERSION, facts, 1, 2, False, state))
    assert stored[:4] == bytes.fromhex("28b52ffd")
    raw = decompress_snapshot(memoryview(stored))  # as the fetched buffer gives it
    *head, restored = decode_snapshot(raw)
    assert head == [SNAPSHOT_VERSION, facts, 1, 2, False]
    assert canonical_state(restored) == canonical_state(state)
    for damaged in (zlib.compress(raw, 1), stored[:40], b"", b"not compressed at all"):
        try:
            decompress_snapshot(damaged)
        except Exception:
            continue
        raise AssertionError(f"{damaged[:12]!r}... decompressed")


def test_an_older_layout_decodes_to_nothing_so_the_whole_log_is_folded():
    state, facts = replayed((EXAMPLES / "notebook.jsonl").read_bytes().splitlines())
    older = pickle.dumps((SNAPSHOT_VERSION - 1, facts, 1, 1, False, state), pickle.HIGHEST_PROTOCOL)
    assert decode_snapshot(older) is None
    assert decode_snapshot(pickle.dumps("not an image")) is None


def test_a_job_snapshot_lists_every_field_in_job_fields_order():
    """Job.snapshot/restore and pickling name the fields one by one (the compiled core keeps
    them native); JOB_FIELDS, which views.py reads them by, must list them in that order."""
    from quotasched.events.values import JobStatus
    from quotasched.services.scheduler.core.entities import JOB_FIELDS, Job

    values = {  # a different value for every field, each of the field's type
        "job_id": "j1", "job_name": "n2", "queue": "q3", "share": "s4", "priority": 5, "seq": 6,
        "need": (("u", 7),), "status": JobStatus.RUNNING, "attempt": 9, "preempted_count": 10,
        "preemption_retries": 11, "attempts_max": 12, "attempts_used": 13,
        "retry_rules": ("r14",), "attempt_timeout_s": 15, "status_reason": "sr16",
        "reason_code": "rc17", "reason_since": 18.5, "dispatched_at": 19.5,
        "dispatch_order": 20, "borrowed": (("b", 21),), "is_terminated": True,
        "client_token": "ct23", "created_at": 24.5, "admitted": 25, "tags": (("k", "v26"),),
        "payload": "p27", "history": ((1, 28.5, None, 29.5, "r30", True),), "stopped_at": 31.5,
    }  # fmt: skip
    assert sorted(values) == sorted(JOB_FIELDS)
    job = Job()
    for name, value in values.items():
        setattr(job, name, value)
    assert job.snapshot() == tuple(values[name] for name in JOB_FIELDS)
    copy = Job()
    copy.restore(job.snapshot())
    assert [getattr(copy, name) for name in JOB_FIELDS] == list(job.snapshot())
    unpickled = pickle.loads(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    assert unpickled.snapshot() == job.snapshot()


def test_a_restored_state_shares_each_job_between_its_index_and_its_share():
    """Jobs are pickled once, as tuples, and shares name their dispatched jobs by id: after
    loading, a share's dispatched job must be the very object the state's index holds, or a
    change folded into one would not be seen through the other."""
    lines = (EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines()
    half = len(lines) // 2
    state, _ = replayed(lines[:half])
    restored = pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    dispatched = [(share, job_id) for queue in restored.queues.values()
                  for share in queue.shares.values() for job_id in share.dispatched]  # fmt: skip
    assert dispatched, "the example should have dispatched jobs half way"
    for share, job_id in dispatched:
        assert share.dispatched[job_id] is restored.jobs[job_id]
    assert [list(s.dispatched) for q in restored.queues.values() for s in q.shares.values()] == \
        [list(s.dispatched) for q in state.queues.values() for s in q.shares.values()]

    # folding the rest into the restored state ends where folding it into the original does
    for _ in replay_lines(lines[half:], state):
        pass
    for _ in replay_lines(lines[half:], restored):
        pass
    assert canonical_state(restored) == canonical_state(state)


def test_decoding_a_snapshot_sets_off_no_collection_over_what_it_built():
    """The state is built with the collector paused and frozen before it runs again: frozen
    after, the first allocation set off a collection over every object just built (half a
    second for 551k jobs).  A low threshold makes this small state's thousands of
    allocations count as a large one's would."""
    import gc

    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    raw = decompress_snapshot(encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state)))
    collections: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(100)
    gc.callbacks.append(seen)
    try:
        assert gc.isenabled()
        *_, restored = decode_snapshot(raw)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    assert collections == [], f"collections of generations {collections} ran while decoding"
    assert canonical_state(restored) == canonical_state(state)
