"""The projector catching up a large backlog in bulk (services/projector/bulk.py): spooled and
projected like a rebuild, then followed live, with the same tables as a clean rebuild; it
stops short of a command whose facts are not all in the log yet, and a fact it cannot apply
still stops it right before that fact.  `QUOTASCHED_PROJECTOR_BULK_CATCH_UP` is set low so
that a small log counts as a large backlog."""

from __future__ import annotations

import asyncio
import json

import pytest

from quotasched.events.subjects import FACTS_STREAM, fact_subject
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.client import Bus
from quotasched.services.projector.client import ProjectorError, request, wait_for_position
from quotasched.services.settings import Settings
from tests.integration.helpers import (
    describe_process,
    eventually,
    generate_workload,
    logged,
    offline_facts,
)
from tests.integration.test_projector_live import (
    assert_same_tables,
    file_checksums,
    nats_checksums,
    publish_facts,
    rebuilt_checksums,
    wait_projector,
    write_fact_file,
)

pytestmark = pytest.mark.nats

BULK = {"QUOTASCHED_PROJECTOR_BULK_CATCH_UP": "100"}


def workload_payloads(seed: int, count: int) -> list[bytes]:
    return [json.dumps(fact).encode()
            for fact in offline_facts(generate_workload(seed=seed, count=count))]  # fmt: skip


async def test_a_large_backlog_is_caught_up_in_bulk_then_followed_live(nats_server, spawn,
                                                                        tmp_path):  # fmt: skip
    payloads = workload_payloads(seed=5, count=500)
    head, tail = payloads[: len(payloads) * 2 // 3], payloads[len(payloads) * 2 // 3:]
    db = tmp_path / "bulk.duckdb"
    leftover = tmp_path / "bulk.duckdb.catch-up" / "facts.spool0"  # as a crash leaves it
    leftover.parent.mkdir()
    leftover.write_bytes(b"{}\n")
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        await publish_facts(bus.js, head)
        projector = spawn("projector", "--db", str(db), **BULK)
        await wait_projector(bus, projector)
        assert await wait_for_position(bus.nc, len(head), timeout=30) == len(head)
        (done,) = logged(projector, "caught up in bulk")
        assert done["position"] == done["facts"] == len(head)  # it ends on a whole command
        assert done["runs"] == 1 and done["runs_refused"] == 0  # DuckDB read the spool itself
        assert not leftover.parent.exists()  # the spool is gone, and so is what a crash left
        secret = tmp_path / "secret.txt"  # letting DuckDB read the spool opened nothing else
        secret.write_text("not for the SQL API")
        for path in (secret, leftover.parent / ".." / "secret.txt"):
            with pytest.raises(ProjectorError) as refused:
                await request(bus.nc, "sql", sql=f"SELECT content FROM read_text('{path}')")
            assert "disabled by configuration" in str(refused.value)
        last = (await publish_facts(bus.js, tail))[-1]  # then live, batch by batch
        assert await wait_for_position(bus.nc, last, timeout=30) == last
        live = await nats_checksums(bus.nc)
        assert await write_fact_file(bus.js, tmp_path / "facts.jsonl") == last
    expected = rebuilt_checksums(tmp_path / "facts.jsonl", tmp_path / "rebuilt.duckdb")
    assert live[0] == expected[0] == last
    assert_same_tables(live[1], expected[1], "bulk catch-up, then live")
    assert projector.stop() == 0
    assert len(logged(projector, "caught up in bulk")) == 1


async def test_bulk_catch_up_stops_before_a_command_whose_facts_are_not_all_logged(
        nats_server, spawn, tmp_path):  # fmt: skip
    payloads = workload_payloads(seed=6, count=300)
    counts: dict[int, int] = {}
    for payload in payloads:
        command = json.loads(payload)["commandSeq"]
        counts[command] = counts.get(command, 0) + 1
    command = max(seq for seq, count in counts.items() if count >= 2)
    first = next(i for i, p in enumerate(payloads) if json.loads(p)["commandSeq"] == command)
    held = first + 1  # publish this command's first fact only, then the rest later
    db = tmp_path / "partial.duckdb"
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        seqs = await publish_with_counts(bus.js, payloads[:held], counts)
        projector = spawn("projector", "--db", str(db), **BULK)
        await wait_projector(bus, projector)
        assert await wait_for_position(bus.nc, seqs[-1], timeout=30) == seqs[-1]
        (started,) = logged(projector, "catching up in bulk")
        assert started["until_seq"] == seqs[first - 1]  # the command before the partial one
        seqs += await publish_with_counts(bus.js, payloads[held:], counts, after=payloads[:held])
        assert await wait_for_position(bus.nc, seqs[-1], timeout=30) == seqs[-1]
        live = await nats_checksums(bus.nc)
        await write_fact_file(bus.js, tmp_path / "facts.jsonl")
    expected = rebuilt_checksums(tmp_path / "facts.jsonl", tmp_path / "rebuilt.duckdb")
    assert_same_tables(live[1], expected[1], "a partial command at the end of the backlog")
    assert projector.stop() == 0


async def publish_with_counts(js, payloads: list[bytes], counts: dict[int, int],
                              after: list[bytes] = ()) -> list[int]:  # fmt: skip
    """As the scheduler publishes: `Qm-Facts` is the command's whole count, also when only
    some of its facts are published now (`after`: the ones published before)."""
    index: dict[int, int] = {}
    for payload in after:
        command = json.loads(payload)["commandSeq"]
        index[command] = index.get(command, -1) + 1
    seqs = []
    for payload in payloads:
        fact = json.loads(payload)
        command = fact["commandSeq"]
        position = index[command] = index.get(command, -1) + 1
        headers = {"Nats-Msg-Id": f"test:{command}:{position}", "Qm-Facts": str(counts[command])}
        subject = fact_subject(fact["kind"], fact.get("jobQueue"), fact.get("quotaShareName"))
        seqs.append((await js.publish(subject, payload, stream=FACTS_STREAM, headers=headers)).seq)
    return seqs


async def test_a_fact_it_cannot_apply_in_a_bulk_backlog_stops_it_right_before_it(
        nats_server, spawn, tmp_path):  # fmt: skip
    payloads = workload_payloads(seed=7, count=300)
    bogus = {"kind": "JobStatusChanged", "at": 1.0, "commandSeq": 10_000, "jobId": "never",
             "attempt": 1, "status": "SUCCEEDED", "cause": "REPORTED"}  # fmt: skip
    middle = len(payloads) // 2
    db = tmp_path / "halt.duckdb"
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        await publish_facts(bus.js, payloads[:middle])
        bad_seq = (await publish_facts(bus.js, [json.dumps(bogus).encode()]))[0]
        await publish_facts(bus.js, payloads[middle:])
        projector = spawn("projector", "--db", str(db), **BULK)
        code = await asyncio.to_thread(projector.popen.wait, 60)
    assert code == 1, describe_process(projector)
    assert logged(projector, "bulk catch-up met a fact it cannot apply; going on batch by batch")
    (error,) = logged(projector, "cannot apply fact: the projector stops")
    assert error["seq"] == bad_seq and error["position"] == bad_seq - 1
    assert "never submitted" in error["reason"]
    assert file_checksums(db)[0] == bad_seq - 1


async def test_a_backlog_that_cannot_be_spooled_is_caught_up_batch_by_batch(
        nats_server, tmp_path, monkeypatch):  # fmt: skip
    """In process, to fill the disk on purpose: the bulk phase gives up, nothing is lost."""
    from quotasched.projections import rebuild

    tried = []

    def disk_full(self, chunk):
        tried.append(len(chunk))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rebuild.Spool, "_add", disk_full)
    await caught_up_batch_by_batch(nats_server, tmp_path, 8, "a backlog that could not be spooled")
    assert tried, "the bulk phase did not start"


async def test_a_backlog_whose_read_stalls_is_caught_up_batch_by_batch(
        nats_server, tmp_path, monkeypatch):  # fmt: skip
    """The bulk read gets nothing (every frame lost on the way, each remade consumer too,
    until LogReadStalled): the bulk phase gives up, the projector goes on batch by batch and
    loses nothing."""
    from quotasched.services.nats.log import BulkRead

    lost = []
    monkeypatch.setattr(BulkRead, "_on_frame", lambda self, *frame: lost.append(frame))
    monkeypatch.setattr(BulkRead, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(BulkRead, "STALLED_S", 0.6)
    monkeypatch.setattr(BulkRead, "RESETS", 1)
    await caught_up_batch_by_batch(nats_server, tmp_path, 9, "a backlog whose read stalled")
    assert lost, "the bulk phase did not start"


async def caught_up_batch_by_batch(nats_server, tmp_path, seed: int, what: str) -> None:
    """A projector in process, started on a backlog of 300 commands' facts, catches up batch
    by batch (its bulk phase made to give up by the caller) to the same tables as a rebuild."""
    from quotasched.services.projector.service import Projector, ProjectorOptions

    db = tmp_path / "caught-up.duckdb"
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        last = (await publish_facts(bus.js, workload_payloads(seed=seed, count=300)))[-1]
        projector = Projector(bus.nc, str(db), ProjectorOptions(bulk_catch_up=100, max_batch=200))
        stop = asyncio.Event()
        running = asyncio.create_task(projector.run(stop))
        await eventually(lambda: asyncio.sleep(0, projector.position == last or running.done()),
                         30, what="caught up")  # fmt: skip
        stop.set()
        await running
        assert projector.position == last and projector.batches > 1  # batch by batch
        assert not (tmp_path / "caught-up.duckdb.catch-up").exists()
        await write_fact_file(bus.js, tmp_path / "facts.jsonl")
    expected = rebuilt_checksums(tmp_path / "facts.jsonl", tmp_path / "rebuilt.duckdb")
    assert_same_tables(file_checksums(db)[1], expected[1], what)
