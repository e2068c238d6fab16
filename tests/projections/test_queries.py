"""Reads from the projection: the scheduler's read verbs answered from DuckDB, rollups that
add up, and the command line (`quotasched sql`, `quotasched projections ...`)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.events.codec import encode
from quotasched.projections import queries, rebuild, store
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler import api
from quotasched.services.scheduler.core import State
from tests.projections.helpers import EXAMPLES, project, random_workload, write_facts

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")
SCENARIOS = sorted(path.name for path in EXAMPLES.glob("*.jsonl")) + ["random-1", "random-2"]


def replayed(name: str) -> tuple[State, list[str]]:
    """The scheduler's final state and the facts of a scenario."""
    state = State()
    if name.startswith("random-"):
        lines = random_workload(seed=int(name.split("-")[1]), commands=800)
    else:
        lines = (EXAMPLES / name).read_bytes().splitlines()
    return state, [encode(fact) for fact in replay_lines(lines, state)]


def requests(state: State) -> list[tuple[str, dict]]:
    asked = [("describe-service-job", {"jobId": job_id}) for job_id in state.jobs]
    for queue in state.queues:
        asked.append(("get-job-queue-snapshot", {"jobQueue": queue}))
        for status in (None, "ALL", "RUNNABLE", "SCHEDULED", "STARTING", "SUCCEEDED", "FAILED"):
            asked.append(("list-service-jobs", {"jobQueue": queue, "jobStatus": status,
                                                "maxResults": 1000}))  # fmt: skip
        for share in state.queues[queue].shares:
            asked.append(("list-service-jobs", {"jobQueue": queue, "jobStatus": "ALL", "filters": [
                {"name": "QUOTA_SHARE_NAME", "values": [share]}]}))  # fmt: skip
        asked.append(("list-service-jobs", {"jobQueue": queue, "maxResults": 3, "filters": [
            {"name": "JOB_NAME", "values": ["N1", "n2*"]},
            {"name": "AFTER_CREATED_AT", "values": ["1500"]}]}))  # fmt: skip
    asked += [("describe-service-job", {"jobId": "nope"}),
              ("get-job-queue-snapshot", {"jobQueue": "x"}),
              ("list-service-jobs", {"jobQueue": "q", "filters": [{"name": "SHARE_IDENTIFIER"}]})]
    return asked


@pytest.mark.parametrize("name", SCENARIOS)
def test_read_verbs_from_the_projection_answer_as_the_scheduler_does(name):
    state, facts = replayed(name)
    with project(facts) as projection:
        for verb, request in requests(state):
            expected = api.answer(state, verb, request)
            expected.pop("nextToken", None)  # both page: compared on the pages' contents
            got = queries.answer(projection.con, verb, request)
            got.pop("nextToken", None)
            if "jobSummaryList" in got:  # the projection keeps the jobs retention forgot
                got["jobSummaryList"] = [job for job in got["jobSummaryList"]
                                         if job["jobId"] in state.jobs]  # fmt: skip
            if verb == "get-job-queue-snapshot" and "error" not in expected:
                _as_the_projection_answers_it(expected, got, state)
            assert got == expected, (verb, request)


def _as_the_projection_answers_it(expected: dict, got: dict, state: State) -> None:
    """A snapshot differs in two members only.  Why each head waits is the scheduler core's
    to say (`waitingReason`); the projection, with no decision state, leaves it out.  And
    `lastUpdatedAt` is as of the scheduler's last command, which the last fact never follows:
    the projection's is as of its last fact, never later.  Both checked, then set aside."""
    for jobs in expected["frontOfQuotaShares"]["quotaShares"].values():
        for job in jobs:
            job_id = job["jobArn"].rsplit("/", 1)[-1]
            name = state.jobs[job_id].job_name  # the job as a person reads it: "name (id)"
            who = job_id if name == job_id else f"{name} ({job_id})"
            assert job.pop("waitingReason")["message"].startswith(f"{who} waits (RUNNABLE): ")
    for part in ("frontOfQueue", "frontOfQuotaShares", "queueUtilization"):
        assert expected[part].pop("lastUpdatedAt") == round(state.time * 1000)
        assert got[part].pop("lastUpdatedAt") <= round(state.time * 1000)


def test_the_projection_describes_the_jobs_the_scheduler_forgot():
    """retention.jsonl forgets two ended jobs (JobExpired): the scheduler no longer knows them,
    the projection describes each as its JobExpired fact says it ended."""
    state, facts = replayed("retention.jsonl")
    expired = [json.loads(fact) for fact in facts if json.loads(fact)["kind"] == "JobExpired"]
    assert [fact["jobId"] for fact in expired] == ["train-1", "train-2"]
    with project(facts) as projection:
        for fact in expired:
            assert fact["jobId"] not in state.jobs
            described = queries.answer(projection.con, "describe-service-job", {"jobId": fact["jobId"]})
            assert (described["jobId"], described["status"], described.get("statusReason")) == (
                fact["jobId"], fact["status"], fact["statusReason"])
            listed = queries.answer(projection.con, "list-service-jobs", {"jobQueue": "q", "jobStatus": "ALL"})
            assert fact["jobId"] in [job["jobId"] for job in listed["jobSummaryList"]]


@pytest.fixture(scope="module")
def busy():
    _, facts = replayed("random-3")
    with project(facts) as projection:
        yield projection.con


def test_a_mistyped_job_status_is_refused_naming_the_valid_ones(busy):
    """Issue 21: `RUNING` answered an empty list, as if nothing ran."""
    refused = queries.answer(busy, "list-service-jobs", {"jobQueue": "q", "jobStatus": "RUNING"})
    assert refused["error"]["message"] == (
        "jobStatus 'RUNING' is not a job status; expected one of SUBMITTED, PENDING, RUNNABLE, "
        "SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED or ALL")


def test_share_rollups_add_up_to_the_queue_rollup(busy):
    t1 = busy.execute("SELECT last_at FROM projection_state").fetchone()[0]
    shares = busy.execute(f"""
        SELECT capacity_unit, bucket_start, sum(used_s), sum(borrowed_s), sum(lent_s)
        FROM utilization(0, {t1}, 300) GROUP BY ALL ORDER BY ALL""").fetchall()
    queue = busy.execute(f"""
        SELECT capacity_unit, bucket_start, used_s, borrowed_s, lent_s
        FROM queue_utilization(0, {t1}, 300) ORDER BY ALL""").fetchall()
    assert len(shares) == len(queue) > 10
    for mine, theirs in zip(shares, queue):
        assert mine[:2] == theirs[:2]
        assert mine[2:] == pytest.approx(theirs[2:], abs=1e-6)


def test_every_share_bucket_splits_its_limit_into_own_use_lent_and_idle(busy):
    rows = busy.execute("SELECT limit_s, used_s - borrowed_s + lent_s + idle_s, lent_s, idle_s "
                        "FROM utilization(0, 5000, 250)").fetchall()
    assert rows
    for limit_s, parts, lent_s, idle_s in rows:
        assert parts == pytest.approx(limit_s, abs=1e-6)
        assert lent_s >= -1e-9 and idle_s >= -1e-9


def test_used_instance_seconds_equal_the_allocations_overlap(busy):
    t0, t1 = 100.0, 3000.0
    from_allocations = busy.execute(f"""
        SELECT quota_share, capacity_unit,
               sum(quantity * greatest(0, least(coalesce(end_at, {t1}), {t1})
                                          - greatest(start_at, {t0})))
        FROM allocations GROUP BY ALL HAVING sum(quantity) > 0 ORDER BY ALL""").fetchall()
    from_rollup = busy.execute(f"""SELECT quota_share, capacity_unit, sum(used_s)
        FROM utilization({t0}, {t1}, 77) GROUP BY ALL ORDER BY ALL""").fetchall()
    used = {(s, u): v for s, u, v in from_rollup if v}
    assert len(used) >= 5
    assert used == pytest.approx({(s, u): v for s, u, v in from_allocations if v}, abs=1e-6)


def test_rollups_are_the_same_bit_for_bit_on_every_run_and_thread_count():
    """A DOUBLE sum under DuckDB's parallel aggregation changed its last bits from run to run
    on inputs this large; the macros sum exact DECIMAL pieces instead (rollups.py)."""
    with store.open(":memory:") as projection:
        con = projection.con
        # Four lending shares of one unit, limit 1 each, whose usage cycles 1, 2, 1, 0 at
        # uneven times: 100k changes, with borrowing (usage 2) and lending all along.
        con.execute("INSERT INTO capacity_changes VALUES (0, 0.0, 'q', 'u', 8)")
        con.execute("INSERT INTO share_changes SELECT i, 0.0, 'q', 's' || i, 'u', 0, 1, true, -1 "
                    "FROM range(0, 4) t(i)")  # fmt: skip
        con.execute("""
            INSERT INTO share_changes
            SELECT 10 + i, i * 0.0137 + (hash(i) % 1000) / 1e5, 'q', 's' || (i % 4), 'u',
                   CASE WHEN (i // 4) % 4 < 2 THEN 1 ELSE -1 END, NULL, NULL, NULL
            FROM range(1, 100001) t(i)""")
        con.execute('UPDATE projection_state SET last_at = (SELECT max("at") FROM share_changes)')
        t1 = con.execute("SELECT last_at FROM projection_state").fetchone()[0]
        for macro in ("utilization", "queue_utilization"):
            query = f"SELECT * FROM {macro}(0, {t1}, 600)"
            runs = [con.execute(query).fetchall() for _ in range(3)]
            con.execute("SET threads = 1")
            runs.append(con.execute(query).fetchall())
            con.execute("RESET threads")
            assert len(runs[0]) > 1 and any(row[-2] > 0 for row in runs[0])  # lent_h
            assert all(run == runs[0] for run in runs), macro


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cli")
    _, facts = replayed("notebook.jsonl")
    facts_path = write_facts(directory / "facts.jsonl", facts)
    done = quotasched("projections", "rebuild", "--db", str(directory / "p.duckdb"),
                      "--facts", str(facts_path), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "rebuilt" in done.stdout and "17 facts" in done.stdout
    return directory / "p.duckdb"


def quotasched(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True)


def test_sql_prints_json_and_csv(database):
    query = 'SELECT job_id, status, wait_s FROM jobs ORDER BY job_id'
    as_json = quotasched("sql", query, "--db", str(database), "--output", "json")
    assert json.loads(as_json.stdout) == [
        {"job_id": "b1", "status": "SCHEDULED", "wait_s": 0.0},
        {"job_id": "high", "status": "RUNNABLE", "wait_s": 0.0},
        {"job_id": "low", "status": "SCHEDULED", "wait_s": 2.0},
        {"job_id": "med", "status": "RUNNABLE", "wait_s": 1.0},
    ]
    as_csv = quotasched("sql", query, "--db", str(database), "--output", "csv")
    assert list(csv.reader(io.StringIO(as_csv.stdout)))[:2] == [
        ["job_id", "status", "wait_s"], ["b1", "SCHEDULED", "0.0"]]
    table = quotasched("sql", "SELECT * FROM utilization(0, 5, 5)", "--db", str(database))
    assert table.returncode == 0 and "qs2" in table.stdout


def test_sql_tables_fit_the_terminal_or_turn_into_one_block_a_row(database):
    """Issue 21: at 80 columns utilization()'s 14 columns were cut to `ev…` and long ids wrapped
    over lines.  A result wider than the terminal prints one `column  value` block a row, every
    value whole; numbers are rounded to 3 decimals."""
    narrow = subprocess.run([QUOTASCHED, "sql", "SELECT * FROM utilization(0, 5, 5) ORDER BY quota_share",
                             "--db", str(database)], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert narrow.returncode == 0 and "…" not in narrow.stdout
    lines = [line.rstrip() for line in narrow.stdout.splitlines()]
    assert lines[0].startswith("row 1 ─")
    assert "quota_share   qs1" in lines and "capacity_unit ml.g5.xlarge" in lines
    assert all(len(line) <= 80 for line in lines)
    rounded = subprocess.run([QUOTASCHED, "sql", "SELECT 2/3 AS third, 5.0 AS five, 'x' AS s",
                              "--db", str(database)], capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert re.search(r"│ 0\.667 +│ 5 +│ x +│", rounded.stdout), rounded.stdout


def test_query_answers_the_read_verbs_in_the_scheduler_shapes(database):
    snapshot = json.loads(quotasched("projections", "query", "get-job-queue-snapshot",
                                     "--db", str(database), "--job-queue", "q").stdout)  # fmt: skip
    front = [job["jobArn"].rsplit("/", 1)[1] for job in snapshot["frontOfQueue"]["jobs"]]
    assert front == ["high", "med"]
    listed = json.loads(quotasched(
        "projections", "query", "list-service-jobs", "--db", str(database), "--job-queue", "q",
        "--job-status", "ALL", "--filters", "name=QUOTA_SHARE_NAME,values=qs2").stdout)
    assert [job["jobId"] for job in listed["jobSummaryList"]] == ["b1"]
    missing = quotasched("projections", "query", "describe-service-job", "--db", str(database),
                         "--job-id", "nope")  # fmt: skip
    assert missing.returncode == 1 and "Job nope does not exist" in missing.stderr


def test_checksum_command_reports_every_table(database):
    document = json.loads(quotasched("projections", "checksum", "--db", str(database)).stdout)
    assert document["position"] == 17 and document["tables"]["jobs"]["rows"] == 4


def test_bad_sql_and_missing_databases_fail_clearly(database, tmp_path):
    bad = quotasched("sql", "SELECT nothing FROM nowhere", "--db", str(database))
    assert bad.returncode == 1 and "nowhere" in bad.stderr
    missing = quotasched("sql", "SELECT 1", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 2 and "no projection database" in missing.stderr
    neither = quotasched("projections", "rebuild", "--db", str(tmp_path / "x.duckdb"))
    assert neither.returncode == 2 and "--facts FILE or --nats-url URL" in neither.stderr


def test_a_read_while_the_projector_holds_the_file_says_so(database):
    with store.open(str(database)):  # this process is now the writer
        held = quotasched("sql", "SELECT 1", "--db", str(database))
    assert held.returncode == 2 and "held by a running projector" in held.stderr
    assert "ask that projector instead with --nats-url URL" in held.stderr  # what answers live


@pytest.mark.nats
async def test_a_rebuild_from_the_stream_equals_a_rebuild_from_the_file(nats_server, tmp_path):
    import nats

    from quotasched.events.subjects import fact_subject
    from quotasched.services.nats.bus import ensure_streams
    from quotasched.services.settings import Settings

    _, facts = replayed("random-1")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await ensure_streams(js, Settings(nats_url=nats_server.url))
        for fact in facts:
            document = json.loads(fact)
            subject = fact_subject(document["kind"], document.get("jobQueue"),
                                   document.get("quotaShareName"))  # fmt: skip
            await js.publish(subject, fact.encode())
        from_stream = await rebuild.rebuild_from_stream(js, str(tmp_path / "s.duckdb"),
                                                        chunk_size=97)  # fmt: skip
    finally:
        await nc.close()
    facts_path = write_facts(tmp_path / "f.jsonl", facts)
    rebuild.rebuild_from_file(str(facts_path), str(tmp_path / "f.duckdb"))
    assert from_stream.facts == len(facts)
    with store.open(str(tmp_path / "s.duckdb"), read_only=True) as a, \
            store.open(str(tmp_path / "f.duckdb"), read_only=True) as b:  # fmt: skip
        assert queries.checksum(a.con) == queries.checksum(b.con)
