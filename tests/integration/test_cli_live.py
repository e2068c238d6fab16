"""`quotasched apply` and `quotasched facts` against a real nats-server and a real
`quotasched scheduler` (the `aws batch` verbs are the real AWS CLI's now: test_aws_endpoint.py).

Every CLI call is a subprocess of the installed console script, as a user would run it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError


pytestmark = pytest.mark.nats

ROOT = Path(__file__).resolve().parents[2]
QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


def run(url: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUOTASCHED_NATS_URL": url, "COLUMNS": "200"}
    env.pop("QUOTASCHED_OUTPUT", None)
    return subprocess.run([QUOTASCHED, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=60)  # fmt: skip


def fact_lines(url: str, *args: str) -> list[str]:
    result = run(url, "facts", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def wait_for_scheduler(url: str, timeout: float = 20.0) -> None:
    """Until the scheduler leads: it answers reads, so its streams exist too."""

    async def answered() -> None:
        nc = await nats.connect(url)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while True:
                try:
                    await nc.request("qm.api.describe-job-queues", b"{}", timeout=0.5)
                    return
                except (NoRespondersError, TimeoutError):
                    if loop.time() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(answered())


@pytest.fixture
def live(nats_server, spawn) -> str:
    spawn("scheduler")
    wait_for_scheduler(nats_server.url)
    return nats_server.url


def test_apply_then_facts_equals_replay_without_at_and_command_seq(live):
    url = live
    applied = run(url, "apply", "examples/notebook.jsonl", "--wait")
    assert applied.returncode == 0, applied.stderr
    assert "applied 11 commands" in applied.stdout
    assert "11 decided: 11 accepted, 0 refused" in applied.stdout
    replayed = subprocess.run([QUOTASCHED, "replay", "examples/notebook.jsonl"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr

    def comparable(lines: list[str]) -> list[list[tuple]]:
        items = []
        for line in lines:
            fact = json.loads(line)
            del fact["at"], fact["commandSeq"]
            items.append(list(fact.items()))  # field order counts, as in the bytes
        return items

    live_facts = fact_lines(url)
    assert comparable(live_facts) == comparable(replayed.stdout.splitlines())
    kinds = [json.loads(line)["kind"] for line in live_facts]
    assert kinds.count("JobPreempted") == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("args", [
    ["apply", "examples/notebook.jsonl"],
    ["facts"],
], ids=["a command file", "the fact log"])  # fmt: skip
def test_an_unreachable_server_is_named_and_exits_2_without_a_traceback(args):
    url = f"nats://127.0.0.1:{_closed_port()}"
    result = run("nats://unused:1", *args, "--nats-url", url)
    assert result.returncode == 2
    assert f"cannot reach the NATS server at {url}" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
