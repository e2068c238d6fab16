"""A rebuild from the stream spools the log to JSON Lines runs and projects each run in one
pass (projections.rebuild.Spool): it must give exactly the tables the live projector's path
(`ProjectionStore.apply`, message by message) gives for the same (stream seq, payload) pairs,
whatever the gaps in the sequences and the shape of the messages."""

from __future__ import annotations

import errno
import json

import pytest

from quotasched.events.subjects import FACTS_STREAM, fact_subject
from quotasched.projections import FactNotApplicable, SpoolFailed, queries, rebuild, store
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.nats.log import read_log, read_log_chunks
from quotasched.services.settings import Settings
from tests.projections.helpers import facts_of, random_workload


@pytest.fixture(scope="module")
def facts() -> list[str]:
    return facts_of(random_workload(seed=11, commands=300))


def pretty(payload: str) -> bytes:
    """The same fact over several lines: valid JSON the file reader cannot take as a line."""
    return json.dumps(json.loads(payload), indent=1).encode()


def odd_log(facts: list[str]) -> list[tuple[int, bytes]]:
    """(seq, payload) with gaps in the sequence (deleted messages) and every shape of payload
    a publisher could send: several lines, CRLF, whitespace around the object."""
    pairs, seq = [], 0
    for index, fact in enumerate(facts):
        seq += 3 if index in (40, 41, 170) else 1
        payload = fact.encode()
        if index % 37 == 5:
            payload = pretty(fact)
        elif index % 53 == 7:
            payload = b"  " + payload + b" "
        elif index % 61 == 9:
            payload = payload + b"\r\n"
        pairs.append((seq, payload))
    return pairs


def checksum_of(path) -> dict:
    with store.open(str(path), read_only=True) as projection:
        return queries.checksum(projection.con)


def applied_one_by_one(pairs, path) -> dict:
    """The live projector's path: every message staged as it is."""
    with store.open(str(path)) as projection:
        for start in range(0, len(pairs), 25):
            projection.apply(pairs[start:start + 25])
    return checksum_of(path)


def spooled(pairs, path, chunk: int) -> int:
    spool = rebuild.Spool(str(path))
    for start in range(0, len(pairs), chunk):
        spool.add(pairs[start:start + chunk])
    spool.close()
    try:
        with store.open(str(path)) as projection:
            return spool.apply(projection)
    finally:
        spool.remove()


def test_plain_facts_make_one_run_whatever_the_chunks(facts, tmp_path):
    pairs = [(seq, fact.encode()) for seq, fact in enumerate(facts, 1)]
    spool = rebuild.Spool(str(tmp_path / "a.duckdb"))
    for start in range(0, len(pairs), 7):
        spool.add(pairs[start:start + 7])
    spool.close()
    assert [(part.kind, part.first, part.count) for part in spool.parts] == [
        ("run", 1, len(pairs))]
    spool.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_gap_starts_a_new_run_and_odd_messages_are_kept_apart(facts, tmp_path):
    plain = [fact.encode() for fact in facts[:7]]
    pairs = [(1, plain[0]), (2, plain[1]), (3, plain[2]), (4, pretty(facts[3])),
             (5, plain[4] + b"\n"), (6, plain[5]), (9, plain[6])]  # fmt: skip
    spool = rebuild.Spool(str(tmp_path / "a.duckdb"))
    spool.add(pairs[:4])
    spool.add(pairs[4:])
    spool.close()
    assert [(part.kind, part.first, part.count) for part in spool.parts] == [
        ("run", 1, 3), ("messages", 4, 2), ("run", 6, 1), ("run", 9, 1)]
    assert [pair for part in spool.parts if part.kind == "messages"
            for batch in spool._messages(part) for pair in batch] == pairs[3:5]  # fmt: skip
    spool.remove()
    assert list(tmp_path.iterdir()) == []


def test_after_close_the_next_facts_start_a_new_run(facts, tmp_path):
    pairs = [(seq, fact.encode()) for seq, fact in enumerate(facts[:5], 1)]
    spool = rebuild.Spool(str(tmp_path / "a.duckdb"))
    spool.add(pairs[:3])
    spool.close()
    spool.add(pairs[3:])
    spool.close()
    assert [(part.kind, part.first, part.count) for part in spool.parts] == [
        ("run", 1, 3), ("run", 4, 2)]
    with store.open(str(tmp_path / "a.duckdb")) as projection:
        assert spool.apply(projection) == 5 and projection.position() == 5
    spool.remove()


def disk_full(self, chunk):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_spool_that_cannot_be_written_says_so(facts, tmp_path, monkeypatch):
    spool = rebuild.Spool(str(tmp_path / "a.duckdb"))
    monkeypatch.setattr(rebuild.Spool, "_add", disk_full)
    with pytest.raises(SpoolFailed, match="cannot write the spool .*No space left on device"):
        spool.add([(1, facts[0].encode())])


@pytest.mark.parametrize("chunk", [1, 13, 10_000])
def test_gaps_and_odd_messages_project_as_the_live_path_does(facts, tmp_path, chunk):
    pairs = odd_log(facts)
    assert spooled(pairs, tmp_path / "spooled.duckdb", chunk) == len(pairs)
    live = applied_one_by_one(pairs, tmp_path / "live.duckdb")
    assert checksum_of(tmp_path / "spooled.duckdb") == live
    with store.open(str(tmp_path / "spooled.duckdb"), read_only=True) as projection:
        rows = projection.con.execute("SELECT seq, body FROM fact_log ORDER BY seq").fetchall()
    seqs, bodies = zip(*rows)
    assert list(seqs) == [seq for seq, _ in pairs]
    assert [body.encode() for body in bodies] == [payload for _, payload in pairs]  # verbatim
    assert sorted(path.name for path in tmp_path.iterdir()) == ["live.duckdb", "spooled.duckdb"]


def test_a_message_that_is_not_json_is_named_by_its_stream_sequence(facts, tmp_path):
    pairs = [(seq + 100, fact.encode()) for seq, fact in enumerate(facts, 1)]
    pairs[57] = (pairs[57][0], b'{"kind": "JobSubmitted", oops}')  # looks like a line
    with pytest.raises(FactNotApplicable) as raised:
        spooled(pairs, tmp_path / "bad.duckdb", 100)
    assert raised.value.problems[0][0] == 158
    assert "not valid JSON" in str(raised.value)


# -- against a real nats-server ---------------------------------------------------------------


async def publish(js, pairs: list[tuple[int, bytes]]) -> list[int]:
    seqs = []
    for _, payload in pairs:
        try:
            document = json.loads(payload)
        except ValueError:
            document = {"kind": "Garbage"}
        subject = fact_subject(document["kind"], document.get("jobQueue"),
                               document.get("quotaShareName"))  # fmt: skip
        seqs.append((await js.publish(subject, payload)).seq)
    return seqs


@pytest.mark.nats
async def test_the_chunked_reader_reads_the_log_as_read_log_does(nats_server, facts):
    import nats

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        seqs = await publish(js, [(0, fact.encode()) for fact in facts])
        assert await js.delete_msg(FACTS_STREAM, seqs[100])
        expected = [(seq, payload) async for seq, payload, _ in read_log(js)]
        chunks = [chunk async for chunk in read_log_chunks(js, chunk_size=64)]
        assert all(0 < len(chunk) <= 64 for chunk in chunks)
        assert [pair for chunk in chunks for pair in chunk] == expected
        assert len(expected) == len(facts) - 1
        tail = [pair async for chunk in read_log_chunks(js, start_seq=seqs[-5], until_seq=seqs[-2])
                for pair in chunk]
        assert [seq for seq, _ in tail] == seqs[-5:-1]
        assert [chunk async for chunk in read_log_chunks(js, start_seq=seqs[-1] + 1)] == []
    finally:
        await nc.close()


@pytest.mark.nats
async def test_a_rebuild_from_the_stream_equals_the_live_path_over_gaps_and_odd_messages(
        nats_server, facts, tmp_path):  # fmt: skip
    import nats

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        odd = odd_log(facts)
        seqs = await publish(js, odd)
        # Deleted (as an operator or max_age might): facts no other fact depends on.
        deletable = [seq for seq, (_, payload) in zip(seqs, odd) if any(
            kind in payload for kind in (b"CommandRejected", b"JobPriorityUpdated"))]
        for deleted in (deletable[1], deletable[2], deletable[-1]):
            assert await js.delete_msg(FACTS_STREAM, deleted)
        pairs = [(seq, payload) async for seq, payload, _ in read_log(js)]
        done = await rebuild.rebuild_from_stream(js, str(tmp_path / "s.duckdb"), chunk_size=29)
    finally:
        await nc.close()
    assert done.facts == len(pairs) == len(facts) - 3
    assert checksum_of(tmp_path / "s.duckdb") == applied_one_by_one(pairs, tmp_path / "live.duckdb")
    assert sorted(path.name for path in tmp_path.iterdir() if "duckdb" in path.name) == [
        "live.duckdb", "s.duckdb"]  # no spool or partial file left


@pytest.mark.nats
async def test_a_rebuild_from_the_stream_that_fails_keeps_the_old_file(
        nats_server, facts, tmp_path):  # fmt: skip
    import nats

    target = tmp_path / "kept.duckdb"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        seqs = await publish(js, [(0, fact.encode()) for fact in facts[:50]])
        await rebuild.rebuild_from_stream(js, str(target))
        before = checksum_of(target)
        bad = await publish(js, [(0, b"{not json at all}")])
        await publish(js, [(0, fact.encode()) for fact in facts[50:]])
        with pytest.raises(FactNotApplicable) as raised:
            await rebuild.rebuild_from_stream(js, str(target))
    finally:
        await nc.close()
    assert raised.value.problems[0][0] == bad[0] == seqs[-1] + 1
    assert checksum_of(target) == before
    left = sorted(path.name for path in tmp_path.iterdir() if "duckdb" in path.name)
    assert left == ["kept.duckdb"]  # no spool or partial file left


@pytest.mark.nats
async def test_the_cli_rebuilds_from_the_stream_and_names_a_bad_fact(nats_server, facts, tmp_path):
    import asyncio
    import subprocess
    import sys
    from pathlib import Path

    import nats

    quotasched = str(Path(sys.executable).parent / "quotasched")

    def rebuild_command(db: str) -> subprocess.CompletedProcess:
        command = [quotasched, "projections", "rebuild", "--db", db, "--nats-url", nats_server.url]
        return subprocess.run(command, capture_output=True, text=True)

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        await publish(js, [(0, fact.encode()) for fact in facts])
        done = await asyncio.to_thread(rebuild_command, str(tmp_path / "cli.duckdb"))
        assert done.returncode == 0, done.stderr
        assert f"rebuilt {tmp_path / 'cli.duckdb'}: {len(facts)} facts" in done.stdout
        bad = await publish(js, [(0, b'{"kind": "JobSubmitted", "at": 1.0, "commandSeq": 9}')])
        failed = await asyncio.to_thread(rebuild_command, str(tmp_path / "cli.duckdb"))
    finally:
        await nc.close()
    assert failed.returncode == 1
    assert f"cannot project fact seq {bad[0]} (JobSubmitted): lacks jobId" in failed.stderr
    with store.open(str(tmp_path / "cli.duckdb"), read_only=True) as projection:
        assert projection.position() == len(facts)  # the last good rebuild, untouched


@pytest.mark.nats
async def test_a_rebuild_from_the_stream_on_a_full_disk_fails_cleanly(
        nats_server, facts, tmp_path, monkeypatch):  # fmt: skip
    import nats

    target = tmp_path / "kept.duckdb"
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        await publish(js, [(0, fact.encode()) for fact in facts])
        await rebuild.rebuild_from_stream(js, str(target))
        before = checksum_of(target)
        monkeypatch.setattr(rebuild.Spool, "_add", disk_full)
        with pytest.raises(SpoolFailed, match="No space left on device"):
            await rebuild.rebuild_from_stream(js, str(target))
    finally:
        await nc.close()
    assert checksum_of(target) == before
    left = sorted(path.name for path in tmp_path.iterdir() if "duckdb" in path.name)
    assert left == ["kept.duckdb"]
