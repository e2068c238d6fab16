"""Deleting `up.lock` while `up` runs does not let a second `up` onto the same store (issue 29,
point 7): once, the lock was a `flock` on that file, so a second `up` locked a new file of the
same name, started a second nats-server on the same JetStream store, and after both stopped
every acknowledged command was lost.  The lock is now on the data directory itself.

Real `quotasched up` subprocesses, as in test_up_process.py (whose helpers these are).
"""

from __future__ import annotations

import pytest

from quotasched.services.client import Bus
from quotasched.services.nats.embedded import free_port
from tests.integration.helpers import publish_items, read_facts, setup_commands, wait_decided
from tests.reliability.test_up_process import (  # noqa: F401  (ups is a fixture)
    announced,
    assert_one_line_error,
    nats_servers_of,
    run_up,
    server_of,
    up_args,
    ups,
)

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def publish(url: str, queue: str) -> list[int]:
    """Publish one queue's set-up commands; each is acknowledged by the bus (stored)."""
    async with Bus(url) as bus:
        return await publish_items(bus, setup_commands(queue))


async def test_a_second_up_after_the_lock_file_was_deleted_is_refused_and_nothing_acknowledged_is_lost(
    tmp_path, ups
):  # fmt: skip
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port, "--no-projector")
    url = await announced(first, port)
    server = await server_of(first, ups.servers)
    acked = await publish(url, "before")

    (data_dir / "up.lock").unlink()
    result = run_up(*up_args(data_dir, free_port(), "--no-projector"))
    line = assert_one_line_error(result, str(data_dir), f"pid {first.popen.pid}")
    assert "in use" in line

    assert first.popen.poll() is None, "the first up stopped"
    assert nats_servers_of(first.popen.pid) == [server], "the first up lost its server"
    acked += await publish(url, "after")
    assert first.stop() == 0

    restarted = ups(data_dir, port, "--no-projector")
    await announced(restarted, port)
    async with Bus(url) as bus:
        await wait_decided(bus.js, max(acked), timeout=60)
        decided = {fact["commandSeq"] for fact in await read_facts(bus.js)}
    assert set(acked) <= decided, "an acknowledged command was lost"
    assert restarted.stop() == 0
