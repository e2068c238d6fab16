"""`quotasched sql --nats-url`: the running projector answers, nobody else opens its file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import wait_until

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")
NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.jsonl"

pytestmark = pytest.mark.nats


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True, timeout=60)


def test_sql_over_nats_answers_from_the_live_projection(nats_server, spawn, tmp_path):
    spawn("scheduler")
    spawn("projector", "--db", str(tmp_path / "live.duckdb"))

    def applied():  # the scheduler declares the streams once it has started
        done = run("apply", str(NOTEBOOK), "--nats-url", nats_server.url, "--wait")
        return done if done.returncode == 0 else None

    wait_until(applied, timeout=30, interval=0.3)

    def statuses():
        answer = run("sql", "SELECT job_id, status FROM jobs ORDER BY job_id",
                     "--nats-url", nats_server.url, "--output", "json")  # fmt: skip
        if answer.returncode != 0:
            return None
        rows = {row["job_id"]: row["status"] for row in json.loads(answer.stdout)}
        return rows if len(rows) == 4 else None

    assert wait_until(statuses, timeout=30) == {
        "b1": "SCHEDULED", "high": "RUNNABLE", "low": "SCHEDULED", "med": "RUNNABLE",
    }
    refused = run("sql", "DELETE FROM jobs", "--nats-url", nats_server.url)
    assert refused.returncode == 1 and "SELECT" in refused.stderr + refused.stdout


def test_sql_without_a_source_says_what_to_give():
    answer = run("sql", "SELECT 1")
    assert answer.returncode == 2 and "--db" in answer.stderr
