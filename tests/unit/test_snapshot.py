"""Snapshots: captured at one instant though a child process writes them later, framed by
block of jobs, and the blocks no job of changed reused from the snapshot before."""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import pytest
import zstandard

from quotasched.services.replay import replay_lines
from quotasched.services.scheduler import snapshots
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.decision import step_raw
from quotasched.events.values import JobStatus
from quotasched.services.scheduler.core.views import canonical_state
from quotasched.services.scheduler.log import Recovered
from quotasched.services.scheduler.snapshots import (
    SNAPSHOT_VERSION,
    SnapshotChain,
    SnapshotMismatch,
    capture_snapshot,
    decode_snapshot,
    encode_snapshot,
    frame_index,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def replayed(lines: list[bytes]) -> tuple[State, int]:
    state = State()
    facts = list(replay_lines(lines, state))
    return state, len(facts)


def same_state(restored: State, state: State) -> None:
    """Every job's every field, the index's order, and everything else the views read."""
    assert list(restored.jobs) == list(state.jobs)
    assert [job.snapshot() for job in restored.jobs.values()] == \
        [job.snapshot() for job in state.jobs.values()]
    assert canonical_state(restored) == canonical_state(state)


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

    version, fact_seq, decided_through, commands_through, last_refused, restored = \
        decode_snapshot(capture())
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
    *head, restored = decode_snapshot(memoryview(captured))  # as the fetched buffer gives it
    assert head == [SNAPSHOT_VERSION, facts, 7, 9, False]
    same_state(restored, state)


def test_jobs_are_framed_by_block_of_seqs_and_come_back_in_acceptance_order(monkeypatch):
    """Blocks of 4 seqs: every job's frame is the one of its seq >> 2, frames follow the
    index's order, each a Zstandard frame (RFC 8878's magic); the state loads as it was, its
    job index in acceptance order (readers and DeleteQuotaShare rely on that order)."""
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    monkeypatch.setattr(snapshots, "BLOCK_BITS", 2)
    stored = encode_snapshot((SNAPSHOT_VERSION, facts, 1, 2, True, state))
    frames = frame_index(stored)
    expected: dict[int, list[str]] = {}
    for job in state.jobs.values():
        expected.setdefault(job.seq >> 2, []).append(job.job_id)
    assert len(expected) > 3, "want several blocks"
    assert list(frames) == list(expected)
    for block, (at, length) in frames.items():
        assert stored[at:at + 4] == bytes.fromhex("28b52ffd")
        tuples = pickle.loads(zstandard.ZstdDecompressor().decompress(stored[at:at + length]))
        assert [fields[0] for fields in tuples] == expected[block]
    *_, restored = decode_snapshot(stored)
    assert [job.seq for job in restored.jobs.values()] == sorted(job.seq for job in state.jobs.values())
    same_state(restored, state)


def chained_snapshots(monkeypatch, verified: int) -> list[tuple[bytes, State, set[int], int]]:
    """The two-teams day in eight parts, a snapshot after each through one chain, as the
    writer takes them: (what was stored, a copy of the state then, the seqs marked since, the
    frames the chain says it copied)."""
    monkeypatch.setattr(snapshots, "BLOCK_BITS", 2)
    monkeypatch.setattr(snapshots, "VERIFIED_BLOCKS", verified)
    lines = (EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines()
    state, chain, taken = State(), SnapshotChain(), []
    facts = 0
    for part in range(8):
        for seq in range(len(lines) * part // 8 + 1, len(lines) * (part + 1) // 8 + 1):
            facts += len(step_raw(state, lines[seq - 1], seq))
        marked = set(state.changed or ())
        stored = capture_snapshot(Recovered(state, facts, 0), chain)()
        taken.append((stored, pickle.loads(pickle.dumps(state)), marked, chain.copied))
    return taken


def test_a_chain_reuses_the_blocks_no_job_of_changed_and_loads_the_state_exactly(monkeypatch):
    """Each snapshot of a chain decodes to the state it was taken of, field for field, and
    copies byte for byte the frames of the blocks holding no job marked since the one before;
    every reused frame is checked against its jobs encoded again (VERIFIED_BLOCKS raised)."""
    taken = chained_snapshots(monkeypatch, verified=10**6)
    reused = encoded = 0
    assert taken[0][3] == 0  # the first is encoded whole
    for (before, *_), (stored, state, marked, said) in zip(taken, taken[1:]):
        *_, restored = decode_snapshot(stored)
        same_state(restored, state)
        old, new = frame_index(before), frame_index(stored)
        dirty = {seq >> 2 for seq in marked}
        copied = 0
        for block, (at, length) in new.items():
            if block in old and block not in dirty:
                was = old[block]
                assert stored[at:at + length] == before[was[0]:was[0] + was[1]]
                copied += 1
            else:
                encoded += 1
        assert said == copied
        reused += copied
    assert reused >= 5 and encoded >= 5, (reused, encoded)
    *_, first = decode_snapshot(taken[0][0])
    same_state(first, taken[0][1])


def test_a_job_changed_without_its_mark_is_caught_and_the_next_snapshot_is_whole(monkeypatch):
    """A job changed behind the core's back (no `save`, so no mark): the snapshot child finds
    its reused frame differs from the job encoded again and writes nothing; the chain then
    has nothing to reuse, and the next snapshot holds the change."""
    monkeypatch.setattr(snapshots, "BLOCK_BITS", 2)
    monkeypatch.setattr(snapshots, "VERIFIED_BLOCKS", 10**6)
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    chain = SnapshotChain()
    capture_snapshot(Recovered(state, facts, 0), chain)()
    job = next(iter(state.jobs.values()))
    job.priority += 1  # not through state.save: unmarked
    with pytest.raises(SnapshotMismatch):
        capture_snapshot(Recovered(state, facts, 0), chain)()
    assert chain.payload is None
    stored = capture_snapshot(Recovered(state, facts, 0), chain)()
    *_, restored = decode_snapshot(stored)
    assert restored.jobs[job.job_id].priority == job.priority
    same_state(restored, state)


def test_a_chain_reuses_nothing_for_a_state_whose_changes_it_did_not_follow():
    """A new term's state (rebuilt from the log) is not the one the chain's marks were kept
    in: its first snapshot is encoded whole."""
    state, facts = replayed((EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines())
    chain = SnapshotChain()
    assert chain.begin(state) is None  # nothing yet
    chain.encoded(encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state)))
    assert chain.begin(state) is not None  # the state it follows
    chain.encoded(encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state)))
    rebuilt = pickle.loads(pickle.dumps(state))
    assert rebuilt.changed is None
    assert chain.begin(rebuilt) is None
    assert rebuilt.changed is chain.marks


def test_heaps_are_left_out_and_made_again_from_the_jobs_with_the_same_order():
    """A snapshot stores no heap entry; the loaded state's heaps hold one entry for each
    RUNNABLE job (the live ones may also hold stale entries, passed over wherever a heap is
    read), are heaps, and give every share the same head and the same waiting order as the
    live state."""
    from quotasched.services.scheduler.core.waiting import in_order

    lines = (EXAMPLES / "two-teams-day.jsonl").read_bytes().splitlines()[:30]
    submissions = [json.loads(line) for line in lines if b'"SubmitServiceJob"' in line]
    at = max(json.loads(line).get("at", 0) for line in lines)
    for index in range(40):  # more jobs waiting, and priority updates leaving stale entries
        extra = {**submissions[index % len(submissions)], "at": at, "jobId": f"extra-{index}",
                 "jobName": f"extra-{index}", "schedulingPriority": index % 4}  # fmt: skip
        extra.pop("clientToken", None)
        lines.append(json.dumps(extra).encode())
    lines += [json.dumps({"at": at, "kind": "UpdateServiceJob", "jobId": f"extra-{index}",
                          "schedulingPriority": 9 - index % 3}).encode()
              for index in range(0, 40, 3)]  # fmt: skip
    state, facts = replayed(lines)
    shares = [(queue.name, share) for queue in state.queues.values()
              for share in queue.shares.values()]  # fmt: skip
    before = [list(share.heap) for _, share in shares]
    assert sum(map(len, before)) > 30, "want waiting jobs"
    assert sum(len(heap) for heap in before) > sum(
        job.status is JobStatus.RUNNABLE for job in state.jobs.values()), "want stale entries"
    stored = encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state))
    assert [share.heap for _, share in shares] == before  # the live state as it was
    header, at = snapshots._header(stored)
    fields = pickle.loads(zstandard.ZstdDecompressor().decompress(stored[at:at + header[-2]]))
    assert all(share.heap == [] for queue in fields[2].values() for share in queue.shares.values())

    *_, restored = decode_snapshot(stored)
    for queue_name, share in shares:
        loaded = restored.queues[queue_name].shares[share.name]
        live = {entry for entry in share.heap if (job := state.jobs.get(entry[2])) is not None
                and job.status is JobStatus.RUNNABLE and job.key() == entry}  # fmt: skip
        assert sorted(loaded.heap) == sorted(live)
        assert all(loaded.heap[i] <= loaded.heap[c] for i in range(len(loaded.heap))
                   for c in (2 * i + 1, 2 * i + 2) if c < len(loaded.heap))  # fmt: skip
        assert [job.job_id for job in in_order(restored, loaded, 0, 10**6)] == \
            [job.job_id for job in in_order(state, share, 0, 10**6)]
        head, loaded_head = state.peek(share), restored.peek(loaded)
        assert (head and head.job_id) == (loaded_head and loaded_head.job_id)


def test_older_layouts_decode_to_nothing_so_the_whole_log_is_folded():
    """The layouts before (a zlib or a Zstandard pickle, version 14 and older) are not read:
    the whole log is folded once instead.  A framed snapshot cut short raises (`load_snapshot`
    folds the whole log then too)."""
    state, facts = replayed((EXAMPLES / "notebook.jsonl").read_bytes().splitlines())
    older = pickle.dumps((SNAPSHOT_VERSION - 1, facts, 1, 1, False, state), pickle.HIGHEST_PROTOCOL)
    for payload in (older, zlib.compress(older, 1), zstandard.ZstdCompressor().compress(older),
                    pickle.dumps("not an image"), b""):
        assert decode_snapshot(payload) is None
    stored = encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state))
    for damaged in (stored[:-1], stored + b"x", stored[:40]):
        with pytest.raises(Exception):
            decode_snapshot(damaged)


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
    raw = encode_snapshot((SNAPSHOT_VERSION, facts, 1, 1, False, state))
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
