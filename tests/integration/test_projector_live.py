"""The projector against a real nats-server: `quotasched projector` processes applying the
fact log to a DuckDB file, answering over NATS request/reply, surviving kill -9, and stopping
on a fact it cannot apply.

"Equal to a rebuild" is checked with `projections.queries.checksum` (rows and an
order-independent hash of every table and view): the projector's file, asked over NATS while it
runs and opened directly after it stopped, against `projections.rebuild_from_file` of the same
log written to a JSON Lines file with `read_log` (a file's seq is its line number, so the log
must have no holes: each test checks that).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from quotasched import projections
from quotasched.events.codec import encode
from quotasched.events.subjects import FACTS_STREAM, fact_subject
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.client import Bus
from quotasched.services.projector import APPLIED_SUBJECT
from quotasched.services.projector.client import ProjectorError, request, wait_for_position
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import State
from quotasched.services.nats.log import ALL_FACTS, read_log
from quotasched.services.settings import Settings
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import (
    NO_TICKS,
    NOTEBOOK,
    describe_process,
    eventually,
    generate_workload,
    logged,
    publish_items,
    wait_decided,
    wait_quiet,
)

pytestmark = pytest.mark.nats


# -- helpers ----------------------------------------------------------------------------------


def notebook_items():
    """The notebook's commands with the (queue, share) route of every job-id command."""
    routes: dict[str, tuple[str, str]] = {}
    items = []
    for line in NOTEBOOK.read_text().splitlines():
        if not line.strip():
            continue
        command = json.loads(line)
        if command["kind"] == "SubmitServiceJob":
            routes[command["jobId"]] = (command["jobQueue"], command["quotaShareName"])
        items.append((command, routes.get(command.get("jobId"))
                      if command["kind"] != "SubmitServiceJob" else None))  # fmt: skip
    return items


async def wait_leading(process, timeout: float = 20.0) -> None:
    async def leading():
        if process.popen.poll() is not None:
            raise AssertionError(describe_process(process))
        return logged(process, "leading")

    await eventually(leading, timeout, what="the scheduler leading")


async def wait_projector(bus, process, timeout: float = 20.0, ask_s: float = 1.0) -> dict:
    """Until the projector process answers `position`.  `ask_s`: how long one request may
    wait (a restarted projector far behind, applying tiny batches on a loaded machine,
    answers between batches, late)."""

    async def answers():
        if process.popen.poll() is not None:
            raise AssertionError(describe_process(process))
        try:
            return await request(bus.nc, "position", timeout=ask_s)
        except ProjectorError:
            return None

    return await eventually(answers, timeout, what="the projector answering")


async def write_fact_file(js, path: Path) -> int:
    """The whole fact log as JSON Lines; returns its last seq (the log must have no holes)."""
    seqs = []
    with open(path, "wb") as out:
        async for seq, payload, _subject in read_log(js, ALL_FACTS):
            out.write(payload + b"\n")
            seqs.append(seq)
    assert seqs == list(range(1, len(seqs) + 1)), "the fact log has holes"
    return len(seqs)


def rebuilt_checksums(facts_path: Path, db_path: Path) -> tuple[int, dict]:
    projections.rebuild_from_file(str(facts_path), str(db_path))
    with projections.open(str(db_path), read_only=True) as store:
        return store.position(), projections.checksum(store.con)


def file_checksums(db_path: Path) -> tuple[int, dict]:
    with projections.open(str(db_path), read_only=True) as store:
        return store.position(), projections.checksum(store.con)


async def nats_checksums(nc) -> tuple[int, dict]:
    answer = await request(nc, "checksum")
    return answer["position"], {name: (table["rows"], int(table["hash"]))
                                for name, table in answer["tables"].items()}  # fmt: skip


def assert_same_tables(actual: dict, expected: dict, context: str) -> None:
    differ = {name: (actual.get(name), expected.get(name))
              for name in set(actual) | set(expected) if actual.get(name) != expected.get(name)}
    assert not differ, f"{context}: tables differ from a clean rebuild: {differ}"


async def publish_facts(js, payloads: list[bytes]) -> list[int]:
    """Facts straight into QM_FACTS, on the subjects and with the headers the scheduler uses
    (message id <partition>:<command seq>:<index>, Qm-Facts = facts of that command)."""
    routes: dict[str, tuple[str, str]] = {}
    decoded = [json.loads(payload) for payload in payloads]
    counts: dict[int, int] = {}
    for fact in decoded:
        counts[fact.get("commandSeq")] = counts.get(fact.get("commandSeq"), 0) + 1
    index: dict[int, int] = {}
    seqs = []
    for payload, fact in zip(payloads, decoded):
        kind, job_id = fact.get("kind", "Unknown"), fact.get("jobId")
        queue, share = fact.get("jobQueue"), fact.get("quotaShareName")
        if kind == "JobSubmitted":
            routes[job_id] = (queue, share)
        elif queue is None and job_id in routes:
            queue, share = routes[job_id]
        command = fact.get("commandSeq")
        position = index[command] = index.get(command, -1) + 1
        headers = {"Nats-Msg-Id": f"test:{command}:{position}", "Qm-Facts": str(counts[command])}
        ack = await js.publish(fact_subject(kind, queue, share), payload, stream=FACTS_STREAM,
                               headers=headers)  # fmt: skip
        seqs.append(ack.seq)
    return seqs


def offline_fact_payloads(path: Path = NOTEBOOK) -> list[bytes]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [encode(fact).encode() for fact in replay_lines(lines)]


def final_statuses() -> dict[str, str]:
    state = State()
    for _ in replay_lines([line for line in NOTEBOOK.read_text().splitlines() if line.strip()],
                          state):  # fmt: skip
        pass
    return {job_id: job.status.value for job_id, job in state.jobs.items()}


# -- the notebook, live -----------------------------------------------------------------------


async def test_notebook_projected_live_equals_a_rebuild_and_is_answered_over_nats(
        nats_server, spawn, tmp_path):  # fmt: skip
    db = tmp_path / "live.duckdb"
    scheduler = spawn("scheduler", **NO_TICKS)
    projector = spawn("projector", "--db", str(db))
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await wait_projector(bus, projector)
        seqs = await publish_items(bus, notebook_items())
        await wait_decided(bus.js, seqs[-1])
        last = await wait_quiet(bus.js, 0.5)
        assert await wait_for_position(bus.nc, last, timeout=20) == last
        position = await request(bus.nc, "position")
        assert (position["position"], position["streamLastSeq"], position["lag"]) == (last, last, 0)

        # the jobs table shows the notebook's statuses, as the scheduler and the replay say
        answer = await request(bus.nc, "sql", sql="SELECT job_id, status FROM jobs ORDER BY 1")
        assert answer["columns"] == ["job_id", "status"]
        projected = dict(map(tuple, answer["rows"]))
        assert projected == final_statuses()
        for job_id, status in projected.items():
            scheduler_says = await bus.request("describe-service-job", jobId=job_id)
            assert scheduler_says["status"] == status
            assert await request(bus.nc, "describe-service-job", jobId=job_id) == scheduler_says
        # the same snapshot, but why each head waits: only the scheduler's core says that
        live = await bus.request("get-job-queue-snapshot", jobQueue="q")
        heads = [jobs[0] for jobs in live["frontOfQuotaShares"]["quotaShares"].values() if jobs]
        assert heads and all(head.pop("waitingReason")["code"] for head in heads)
        snapshot = await request(bus.nc, "get-job-queue-snapshot", jobQueue="q")
        for part in ("frontOfQueue", "frontOfQuotaShares", "queueUtilization"):
            # as of the last fact applied; the scheduler's, as of its last command
            assert snapshot[part].pop("lastUpdatedAt") <= live[part].pop("lastUpdatedAt")
        assert snapshot == live
        listed = await request(bus.nc, "list-service-jobs", jobQueue="q", jobStatus="ALL")
        assert sorted(job["jobId"] for job in listed["jobSummaryList"]) == sorted(projected)
        # `quotasched sql` reads QUOTASCHED_NATS_URL like every other command (issue 21)
        env = {**os.environ, "QUOTASCHED_NATS_URL": nats_server.url}
        env.pop("QUOTASCHED_PROJECTION_DB", None)
        cli = await asyncio.to_thread(subprocess.run, [QUOTASCHED, "sql", "SELECT count(*) AS n FROM jobs",
                                                      "--output", "json"], env=env,
                                      capture_output=True, text=True, timeout=60)  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout) == [{"n": len(projected)}]
        span = await request(bus.nc, "sql", sql='SELECT min("at"), max("at") FROM fact_log')
        t0, t1 = span["rows"][0]
        usage = await request(bus.nc, "utilization", t0=t0, t1=t1 + 1, bucketSeconds=3600)
        assert usage["position"] == last
        assert {row["quota_share"] for row in usage["rows"]} == {"qs1", "qs2", "qs3"}
        assert sum(row["used_s"] for row in usage["rows"]) > 0

        # only single read-only statements; a row limit; the projection is untouched
        for refused in ("DROP TABLE jobs", "DELETE FROM fact_log", "SELECT 1; DROP TABLE jobs",
                        "COPY jobs TO 'x.csv'", "ATTACH 'x.duckdb'", "PRAGMA threads=1"):
            with pytest.raises(ProjectorError) as error:
                await request(bus.nc, "sql", sql=refused)
            assert error.value.kind == "ClientException", refused
        with pytest.raises(ProjectorError) as error:  # a SELECT cannot read files either
            await request(bus.nc, "sql", sql=f"SELECT * FROM read_text('{NOTEBOOK}')")
        assert error.value.kind == "QueryFailed"
        limited = await request(bus.nc, "sql", sql="SELECT * FROM fact_log", limit=5)
        assert (limited["rowCount"], limited["truncated"], limited["position"]) == (5, True, last)
        with pytest.raises(ProjectorError):
            await request(bus.nc, "no-such-verb")

        # DuckDB: one process owns the file; others ask the projector
        with pytest.raises(projections.ProjectionLocked):
            projections.open(str(db), read_only=True)

        # equal to a fresh rebuild of the same log, while running and after a clean stop
        facts_file = tmp_path / "facts.jsonl"
        assert await write_fact_file(bus.js, facts_file) == last
        rebuilt = rebuilt_checksums(facts_file, tmp_path / "rebuilt.duckdb")
        assert rebuilt[0] == last
        live = await nats_checksums(bus.nc)
        assert live[0] == last
        assert_same_tables(live[1], rebuilt[1], "live projector")
    assert projector.stop() == 0
    stopped = file_checksums(db)
    assert stopped[0] == last
    assert_same_tables(stopped[1], rebuilt[1], "stopped projector")
    assert logged(projector, "projector stopped")[-1]["position"] == last


# -- kill -9 ----------------------------------------------------------------------------------


async def test_kill_9_mid_stream_resumes_exactly(nats_server, spawn, tmp_path):
    """A few thousand commands; the projector runs with small batches (so it is still
    applying when killed), is killed with SIGKILL twice at different positions and restarted;
    the final file equals a clean rebuild, and each restart began at a committed position."""
    db = tmp_path / "crash.duckdb"
    small = {"QUOTASCHED_PROJECTOR_MAX_BATCH": "20", "QUOTASCHED_PROJECTOR_MAX_WAIT_MS": "0"}
    items = generate_workload(seed=7, count=3000)
    scheduler = spawn("scheduler", **NO_TICKS)
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        projector = spawn("projector", "--db", str(db), **small)
        await wait_projector(bus, projector)
        publishing = asyncio.create_task(publish_items(bus, items))
        positions = []
        for kill_at in (400, 1500):
            async def reached(target=kill_at):
                # a projector busy with tiny batches on a loaded machine may answer late
                answer = await request(bus.nc, "position", timeout=15.0)
                return answer["position"] >= target and answer

            seen = (await eventually(reached, 60, interval=0.02, what=f"position {kill_at}"))
            projector.kill()  # SIGKILL, most likely in the middle of a batch's transaction
            assert projector.popen.returncode == -signal.SIGKILL
            positions.append(seen["position"])
            projector = spawn("projector", "--db", str(db), **small)
            await wait_projector(bus, projector, timeout=90, ask_s=15.0)  # like `reached`
            started = logged(projector, "projector started")[-1]
            # resumed from what the file committed: at least what it reported before the kill
            assert started["position"] >= seen["position"]
            assert started["lag"] > 0, "the kill was not mid-stream"
        seqs = await publishing
        await wait_decided(bus.js, seqs[-1], timeout=60)
        last = await wait_quiet(bus.js, 0.5)
        assert last > 3000
        assert projector.stop() == 0
        projector = spawn("projector", "--db", str(db))  # default batch sizes to finish
        await wait_projector(bus, projector)
        assert await wait_for_position(bus.nc, last, timeout=60) == last
        facts_file = tmp_path / "facts.jsonl"
        assert await write_fact_file(bus.js, facts_file) == last
        rebuilt = rebuilt_checksums(facts_file, tmp_path / "rebuilt.duckdb")
        live = await nats_checksums(bus.nc)
        assert live[0] == rebuilt[0] == last
        assert_same_tables(live[1], rebuilt[1], "projector killed twice")
    assert projector.stop() == 0
    assert_same_tables(file_checksums(db)[1], rebuilt[1], "projector killed twice, stopped")


# -- a fact it cannot apply -------------------------------------------------------------------

GHOST_DISPATCH = {"kind": "JobDispatched", "at": 99.0, "commandSeq": 9999, "jobId": "ghost",
                  "attempt": 1, "jobQueue": "q", "quotaShareName": "qs1",
                  "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
                  "borrowed": [], "afterPreemptionOf": []}  # fmt: skip
UNKNOWN_KIND = {"kind": "JobTeleported", "at": 99.0, "commandSeq": 9999, "jobId": "high"}


@pytest.mark.parametrize("bogus,live", [(GHOST_DISPATCH, False), (UNKNOWN_KIND, True)],
                         ids=["dispatch-of-unknown-job-in-backlog", "unknown-kind-while-live"])
async def test_a_fact_it_cannot_apply_stops_it_loudly_right_before_it(
        nats_server, spawn, tmp_path, bogus, live):  # fmt: skip
    """The notebook's facts with a bogus one in the middle, published on the fact stream with
    the scheduler's headers (no scheduler runs: the bogus fact would break its fencing).  The
    projector exits 1, its log names the fact's seq, and its file holds every fact before it
    and nothing from it on, also after a second start."""
    db = tmp_path / "halt.duckdb"
    good = offline_fact_payloads()
    head, tail = good[:10], good[10:]
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))  # as the spawned processes
        await publish_facts(bus.js, head)
        projector = spawn("projector", "--db", str(db))
        if live:
            await wait_projector(bus, projector)
            assert await wait_for_position(bus.nc, len(head), timeout=20) == len(head)
        bad_seq = (await publish_facts(bus.js, [json.dumps(bogus).encode()]))[0]
        await publish_facts(bus.js, tail)
        assert bad_seq == len(head) + 1
        for attempt in range(2):
            code = await asyncio.to_thread(projector.popen.wait, 30)
            assert code == 1, describe_process(projector)
            errors = logged(projector, "cannot apply fact: the projector stops")
            assert errors and errors[-1]["seq"] == bad_seq and errors[-1]["level"] == "error"
            assert errors[-1]["position"] == bad_seq - 1
            assert errors[-1]["kind"] == bogus["kind"]
            assert f"seq {bad_seq}" in projector.output()  # also in the one-line message
            position, _ = file_checksums(db)
            assert position == bad_seq - 1
            with projections.open(str(db), read_only=True) as store:
                assert store.con.execute("SELECT max(seq) FROM fact_log").fetchone()[0] == bad_seq - 1
            if attempt == 0:
                projector = spawn("projector", "--db", str(db))  # never skips it on a restart


# -- holes in what arrives --------------------------------------------------------------------


async def test_a_lost_delivery_is_read_again_and_a_deleted_fact_is_passed_over(
        nats_server, tmp_path):  # fmt: skip
    """In process, to lose a message on purpose: a fact that never reaches the projector but
    is in the stream makes it read again from its position; a fact deleted from the stream
    (as an operator might, or max_age) is passed over, as a rebuild from the stream does."""
    from quotasched.services.projector.service import Projector, ProjectorOptions
    from quotasched.services.nats.log import stream_seq
    from tests.integration.helpers import offline_facts

    payloads = [json.dumps(fact).encode() for fact in
                offline_facts(generate_workload(seed=3, count=600))]  # fmt: skip
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        seqs = await publish_facts(bus.js, payloads)
        deleted = next(seq for seq, payload in zip(seqs, payloads)
                       if seq > len(seqs) // 2 and b'"JobPriorityUpdated"' in payload)  # fmt: skip
        assert await bus.js.delete_msg(FACTS_STREAM, deleted)
        lost = len(seqs) // 4
        projector = Projector(bus.nc, str(tmp_path / "holes.duckdb"), ProjectorOptions(max_batch=50))
        take, dropped = projector._take, []

        def lossy_take():
            batch = take()
            if not dropped and any(stream_seq(msg) == lost for msg in batch):
                dropped.append(lost)
                return [msg for msg in batch if stream_seq(msg) != lost]
            return batch

        projector._take = lossy_take
        stop = asyncio.Event()
        running = asyncio.create_task(projector.run(stop))
        await eventually(lambda: asyncio.sleep(0, projector.position == seqs[-1] or
                                                running.done()), 30, what="caught up")  # fmt: skip
        stop.set()
        await running
        assert dropped == [lost]
        assert projector.facts_applied == len(seqs) - 1
        await projections.rebuild_from_stream(bus.js, str(tmp_path / "rebuilt.duckdb"))
    assert_same_tables(file_checksums(tmp_path / "holes.duckdb")[1],
                       file_checksums(tmp_path / "rebuilt.duckdb")[1], "holes")  # fmt: skip


# -- quotasched up ----------------------------------------------------------------------------


async def announced(process, url: str) -> None:
    """Until `up` printed its URL: it is started and installs its signal handlers next (a
    SIGTERM before that would end it with -15 instead of a clean stop)."""
    await eventually(lambda: asyncio.sleep(0, url in process.output()), 30,
                     what=f"{process.args} announcing {url}")  # fmt: skip
    await asyncio.sleep(0.2)


async def test_up_runs_the_projector_by_default_and_not_with_no_projector(nats_server, spawn,
                                                                         tmp_path):  # fmt: skip
    data_dir = tmp_path / "data"
    up = spawn("up", "--data-dir", str(data_dir), "--executor", "none")
    async with Bus(nats_server.url) as bus:
        applied = []

        async def on_applied(msg):
            applied.append(json.loads(msg.data)["position"])

        await bus.nc.subscribe(APPLIED_SUBJECT, cb=on_applied)
        await wait_projector(bus, up, timeout=30)
        await announced(up, nats_server.url)
        seqs = await publish_items(bus, notebook_items()[:7])
        await wait_decided(bus.js, seqs[-1])
        last = await wait_quiet(bus.js, 0.5)
        assert await wait_for_position(bus.nc, last) == last
        await eventually(lambda: asyncio.sleep(0, applied and applied[-1] == last), 5,
                         what="a position notification")  # fmt: skip
        assert up.stop() == 0
        assert file_checksums(data_dir / "quotasched.duckdb")[0] == last

        other = tmp_path / "other"
        bare = spawn("up", "--data-dir", str(other), "--executor", "none", "--no-projector")
        await announced(bare, nats_server.url)
        with pytest.raises(ProjectorError):
            await request(bus.nc, "position", timeout=1.0)
        assert bare.stop() == 0
        assert not (other / "quotasched.duckdb").exists()


# -- a file of another schema version --------------------------------------------------------


def older_projection(db: Path, pretend_position: int) -> None:
    """A projection file as an older release wrote it: another schema version, and a position
    its (empty) tables do not back, so a file resumed instead of rebuilt cannot pass."""
    with projections.open(str(db)) as store:
        store.con.execute("UPDATE projection_state SET schema_version = schema_version - 1, "
                          "position = $p", {"p": pretend_position})  # fmt: skip


async def test_a_file_of_another_schema_version_is_rebuilt_from_the_log(nats_server, spawn,
                                                                      tmp_path):  # fmt: skip
    db = tmp_path / "old.duckdb"
    older_projection(db, pretend_position=5)
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings(lease_ttl_s=3.0))
        last = (await publish_facts(bus.js, offline_fact_payloads()))[-1]
        projector = spawn("projector", "--db", str(db))
        await wait_projector(bus, projector)
        assert await wait_for_position(bus.nc, last, timeout=20) == last
        live = await nats_checksums(bus.nc)
        (warning,) = logged(projector,
                            "projection schema changed: rebuilding the file from the log")
        assert "schema version" in warning["reason"] and warning["level"] == "warning"
        last_seq = await write_fact_file(bus.js, tmp_path / "facts.jsonl")
    expected = rebuilt_checksums(tmp_path / "facts.jsonl", tmp_path / "rebuilt.duckdb")
    assert live[0] == expected[0] == last_seq == last
    assert_same_tables(live[1], expected[1], "after the schema change")
    assert projector.stop() == 0


async def test_with_rebuilds_off_a_file_of_another_schema_version_is_refused(nats_server, spawn,
                                                                           tmp_path):  # fmt: skip
    db = tmp_path / "old.duckdb"
    older_projection(db, pretend_position=5)
    before = db.read_bytes()
    projector = spawn("projector", "--db", str(db),
                      QUOTASCHED_PROJECTOR_REBUILD_ON_SCHEMA_CHANGE="false")
    code = await asyncio.to_thread(projector.popen.wait, 30)
    assert code == 2, describe_process(projector)
    assert "schema version" in projector.output() and "rebuild" in projector.output()
    assert db.read_bytes() == before
