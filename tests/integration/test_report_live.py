"""`quotasched report` against a running service: through the projector over NATS while it
holds its DuckDB file, and a clear refusal, naming --nats-url, when that file is asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.services.report import report_data
from tests.integration.conftest import wait_until

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.jsonl"

pytestmark = pytest.mark.nats


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})  # fmt: skip


def test_the_report_reads_a_running_projector_over_nats(nats_server, spawn, tmp_path):
    db = tmp_path / "live.duckdb"
    spawn("scheduler")
    spawn("projector", "--db", str(db))

    def applied():  # the scheduler declares the streams once it has started
        done = run("apply", str(NOTEBOOK), "--nats-url", nats_server.url, "--wait")
        return done if done.returncode == 0 else None

    wait_until(applied, timeout=30, interval=0.3)

    def projected():  # the notebook's 4 jobs and 2 preemptions have reached the projection
        answer = run("sql", "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM "
                     "preemptions) AS n", "--nats-url", nats_server.url, "--output", "json")
        return answer.returncode == 0 and json.loads(answer.stdout)[0]["n"] == 6

    wait_until(projected, timeout=30, interval=0.3)
    out = tmp_path / "live.html"
    # the URL from the environment, as every other command reads it
    done = run("report", "--out", str(out), QUOTASCHED_NATS_URL=nats_server.url)
    assert done.returncode == 0, done.stderr
    data = report_data(out.read_text(encoding="utf-8"))
    assert data["source"] == f"the projector at {nats_server.url}"
    assert data["time"]["mode"] == "utc" and data["firstFact"].endswith("Z")  # a live clock
    (queue,) = data["queues"]
    assert queue["jobQueue"] == "q"
    (chart,) = [data["charts"][index] for index in queue["charts"]]
    shares = {d["key"].split(":", 1)[1] for d in chart["datasets"] if d["key"].startswith("own:")}
    assert shares == {"qs1", "qs2", "qs3"}
    assert [(p["jobId"], p["preemptorJobId"], p["reason"]) for p in queue["preemptions"]] == [
        ("med", "b1", "CROSS_SHARE_RECLAIM"), ("high", "low", "IN_SHARE_PRIORITY")]
    assert sorted(job["jobId"] for job in queue["waitingAtEnd"]) == ["high", "med"]

    # The file itself is the projector's: --db (which comes before QUOTASCHED_NATS_URL) is
    # refused with the way out.
    refused = run("report", "--db", str(db), "--out", str(tmp_path / "file.html"),
                  QUOTASCHED_NATS_URL=nats_server.url)  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "held by a running projector" in refused.stderr and "--nats-url" in refused.stderr


def test_no_projector_answering_is_a_usage_error(nats_server, tmp_path):
    done = run("report", "--nats-url", nats_server.url, "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "no projector is running" in done.stderr
