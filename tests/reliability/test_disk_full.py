"""A full store stalls the scheduler loudly, loses nothing, and resumes by itself.

The nats-server runs with a small JetStream store (`max_file_store`): a filler stream takes
it all, so every write, the lease's included, is refused with 10023 "insufficient resources",
as on a disk that filled up.  Commands acknowledged before the store filled wait; the
scheduler logs "disk full", /healthz answers 503 and `quotasched_scheduler_storage_full` is 1.
Once the filler is deleted (space is back) the scheduler takes the lease again by itself,
decides every stored command, and /healthz answers 200.  Before the fix it retried in
silence (or logged "wrong last sequence", which reads like a second writer) and /healthz
stayed 200.

A real full disk is another matter: `quotasched up` on a small tmpfs in a private mount
namespace, filled by another process (ENOSPC).  nats-server then keeps the streams that hit
the write error failed until it restarts, so `up` restarts its own server once space is back
(services/storage_watch.py); before, the acknowledged commands stayed undecided for good.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from quotasched.services.client import Bus
from quotasched.services.nats.embedded import EmbeddedServer, free_port
from quotasched.services.storage_watch import StorageWatch
from tests.integration.helpers import (
    NO_TICKS,
    assert_decided_once,
    eventually,
    logged,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
)
from tests.integration.conftest import QUOTASCHED, Process
from tests.integration.test_failover import wait_leading
from tests.integration.test_metrics import get  # raises OSError until the endpoint listens
from tests.reliability.test_oversize_fact import submission
from tests.reliability.test_up_process import announced, up_args, up_env

pytestmark = [pytest.mark.nats, pytest.mark.slow]

STORE_LIMIT = 8 * 1024 * 1024
FILLER = "FILLER"


async def fill_store(js) -> int:
    """Publish to a filler stream until the server refuses for lack of storage; its code."""
    await js.add_stream(StreamConfig(name=FILLER, subjects=["filler.>"]))
    chunk = b"\0" * (512 * 1024)
    for _ in range(4 * STORE_LIMIT // len(chunk)):
        try:
            await js.publish("filler.x", chunk, stream=FILLER, timeout=5)
        except APIError as error:
            return error.err_code
    raise AssertionError("the store never filled")


async def test_full_store_is_reported_and_every_acknowledged_command_decided(tmp_path, spawn):
    conf = tmp_path / "small-store.conf"
    conf.write_text(f"jetstream {{ max_file_store: {STORE_LIMIT} }}\n")
    server = EmbeddedServer(tmp_path / "store", extra_args=["-c", str(conf)]).start()
    port = free_port()
    env = {"QUOTASCHED_NATS_URL": server.url, "QUOTASCHED_METRICS_PORT": str(port), **NO_TICKS}
    health = f"http://127.0.0.1:{port}/healthz"
    try:
        first = spawn("scheduler", **env)
        async with Bus(server.url) as bus:
            await wait_leading(first)
            setup = await publish_items(bus, setup_commands("fq"))
            await wait_decided(bus.js, setup[-1], processes=[first])
            first.stop()
            # acknowledged while no scheduler runs, then the store fills up
            waiting = await publish_items(bus, [(submission(f"job-{i}"), None) for i in range(5)])
            assert await fill_store(bus.js) == 10023
            scheduler = spawn("scheduler", **env)

            async def unhealthy():
                status, body = await asyncio.to_thread(get, health)
                return (status, json.loads(body)) if status == 503 else None

            status, document = await eventually(unhealthy, 60, what="/healthz 503")
            assert document["scheduler"]["storage"] == "full", document
            assert "disk full" in document["scheduler"]["storageError"]
            _, metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
            assert "quotasched_scheduler_storage_full 1.0" in metrics
            errors = logged(scheduler, "disk full: the fact log cannot store the scheduler's "
                                       "facts; commands wait, nothing acknowledged is lost")
            assert errors and errors[0]["level"] == "error", scheduler.output()[-2000:]
            assert "10023" in errors[0]["cause"]

            await bus.js.delete_stream(FILLER)  # space is back
            await wait_decided(bus.js, waiting[-1], timeout=60, processes=[scheduler])

            async def healthy():
                status, _ = await asyncio.to_thread(get, health)
                return status == 200

            await eventually(healthy, 30, what="/healthz 200")
            facts = await read_facts(bus.js)
        scheduler.stop()
    finally:
        server.stop()
    decided = {fact["commandSeq"] for fact in facts if fact["kind"] == "JobSubmitted"}
    assert set(waiting) <= decided, f"acknowledged commands not decided: {set(waiting) - decided}"
    assert_decided_once(facts)
    assert logged(scheduler, "disk space back: facts are stored again")


# -- a real full disk under `quotasched up` -------------------------------------------------

TMPFS_SIZE = "64m"
# Without the projector: its DuckDB file shares the full disk, and a projector that failed
# on it stops for good (the rest of `up` runs on); that is not what this test is about.
UP_FLAGS = ("--no-projector",)
LEFT_FREE = 256 * 1024  # bytes the filler leaves free at first


def mount_namespaces_permitted(tmp_path) -> str | None:
    """Why a tmpfs in a private mount namespace cannot be had here (None: it can)."""
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                 'mount -t tmpfs -o size=1m tmpfs "$1"', "sh", str(probe)],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unshare -m failed: {error}"
    if result.returncode != 0:
        return f"unshare -m / mount -t tmpfs not permitted: {result.stderr.strip()}"
    return None


class UpOnTmpfs(Process):
    """`quotasched up` whose data directory is a small tmpfs mounted in a private mount
    namespace of its own: the disk only it (and `nsenter` into it) sees, and fills."""

    def __init__(self, data_dir: Path, port: int, log_path: Path, *flags: str):
        self.args = up_args(data_dir, port, *flags)
        self.log_path = log_path
        self.log = open(log_path, "ab")
        script = (f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "$1" && shift && '
                  f'exec "$@"')  # fmt: skip
        self.popen = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
             str(data_dir), QUOTASCHED, *self.args],
            env=up_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.data_dir = data_dir

    def inside(self, *command: str) -> subprocess.CompletedProcess:
        """Run `command` in up's mount namespace (sh exec'd up, so its pid is up's)."""
        return subprocess.run(["nsenter", "--mount", "--target", str(self.popen.pid), *command],
                              capture_output=True, text=True, timeout=300)  # fmt: skip


async def publish_until_refused(bus, prefix: str, limit: int = 400) -> tuple[list[int], int]:
    """Publish submissions one by one until the bus has refused (or not answered) three in a
    row: the sequences of those it acknowledged, and how many it did not."""
    acked, refused, in_a_row = [], 0, 0
    for index in range(limit):
        try:
            acked.append(await bus.publish(submission(f"{prefix}-{index}", tags=10)))
            in_a_row = 0
        except Exception:  # a 503, no answer: not acknowledged, so not promised
            refused += 1
            in_a_row += 1
            if in_a_row == 3:
                break
    return acked, refused


async def test_a_real_full_disk_under_up_is_survived_once_space_is_back(tmp_path):
    """`up` on a tmpfs that another process fills to the last byte (ENOSPC): nats-server
    hits a write error on its store and answers no write on that stream until it restarts.
    `up` says "disk full", and once the filler is removed it restarts its own nats-server
    (same port, same store), the scheduler reconnects and decides every command the bus
    acknowledged, exactly once, and a canary after them.  Before, the scheduler retried in
    vain forever: the acknowledged commands stayed undecided."""
    reason = mount_namespaces_permitted(tmp_path)
    if reason is not None:
        pytest.skip(reason)
    data_dir, port = tmp_path / "data", free_port()
    data_dir.mkdir()
    up = UpOnTmpfs(data_dir, port, tmp_path / "up.log", *UP_FLAGS)
    filler = str(data_dir / "filler")
    try:
        url = await announced(up, port)
        async with Bus(url) as bus:
            jobs = [(submission(f"before-{i}"), None) for i in range(5)]
            before = await publish_items(bus, [*setup_commands("fq"), *jobs])
            await wait_decided(bus.js, before[-1], timeout=120, processes=[up])

            # leave a little room: some commands are stored (acknowledged) while their facts
            # or the ones after them hit the full disk
            free = up.inside("stat", "-f", "-c", "%a %S", str(data_dir))
            blocks, size = map(int, free.stdout.split())
            filled = up.inside("fallocate", "-l", str(blocks * size - LEFT_FREE), filler)
            assert filled.returncode == 0, filled.stderr
            acked, refused = await publish_until_refused(bus, "during")
            assert refused, "the disk never filled"
            assert acked, "no command was acknowledged once the disk was nearly full"

            async def said_full():
                return logged(up, "disk full: the fact log cannot store the scheduler's facts; "
                                  "commands wait, nothing acknowledged is lost")

            full = await eventually(said_full, 180, what="'disk full' in up's log")
            assert full[0]["level"] == "error"

            removed = up.inside("rm", "-f", filler)
            assert removed.returncode == 0, removed.stderr
            if acked:
                await wait_decided(bus.js, max(acked), timeout=300, processes=[up])

            async def canary_published():
                return await bus.publish(submission("canary"))

            canary = await eventually(canary_published, 120, interval=1.0,
                                      what="the canary acknowledged")  # fmt: skip
            await wait_decided(bus.js, canary, timeout=300, processes=[up])
            facts = await read_facts(bus.js)
    finally:
        up.stop(timeout=60)
    output = up.output()
    decided = {fact["commandSeq"] for fact in facts if fact["kind"] == "JobSubmitted"}
    promised = [*before[-5:], *acked, canary]
    missing = [seq for seq in promised if seq not in decided]
    assert not missing, (f"acknowledged commands not decided: {missing} (acknowledged during "
                         f"the full disk: {len(acked)}, refused: {refused})")  # fmt: skip
    assert_decided_once(facts)
    assert "Traceback" not in output, output[-4000:]


async def test_storage_watch_restarts_only_once_space_is_back_and_writes_still_fail(tmp_path):
    """The watch's decisions, without a server: no restart while the disk is short of space
    (a margin larger than the disk) or while the scheduler writes; a restart once space is
    back and the store is still reported full after the grace; the next one only after twice
    the grace; and the same when the disk was short of space and the scheduler just cannot
    lead (its lease stuck in a failed bucket) without reporting anything."""
    full: list[str | None] = ["no answer to a write"]
    leading = [False]
    restarts: list[float] = []

    async def restart():
        restarts.append(asyncio.get_running_loop().time())

    huge = 1 << 62
    watch = StorageWatch(tmp_path, lambda: full[0], lambda: leading[0], restart,
                         grace_s=0.2, margin=huge)  # fmt: skip
    for _ in range(3):
        await watch.check()
        await asyncio.sleep(0.1)
    assert restarts == [], "restarted while the disk was still full"
    watch.margin = 0  # space is back
    await watch.check()  # noted, the scheduler gets its grace
    assert restarts == []
    await asyncio.sleep(0.25)
    await watch.check()
    assert len(restarts) == 1
    await asyncio.sleep(0.25)
    await watch.check()
    assert len(restarts) == 1, "restarted again before twice the grace"
    await asyncio.sleep(0.2)
    await watch.check()
    assert len(restarts) == 2
    full[0], leading[0] = None, True  # writes land: no more restarts
    await asyncio.sleep(1.0)
    await watch.check()
    await asyncio.sleep(1.0)
    await watch.check()
    assert len(restarts) == 2 and watch.grace_s == 0.2

    leading[0] = False  # not leading, nothing reported, no shortage seen: no episode
    await asyncio.sleep(0.3)
    await watch.check()
    assert len(restarts) == 2
    watch.margin = huge  # the disk fills; the scheduler reports nothing, does not lead
    await watch.check()
    watch.margin = 0
    await watch.check()
    await asyncio.sleep(0.25)
    await watch.check()
    assert len(restarts) == 3
