"""Closing a connection never waits on a stuck subscription for long: `up`'s stop drains its
buses (the web view's, the endpoint's), and nats-py's default drain timeout, 30 s, let one
subscription whose handler never returns hold a stop for half a minute."""

from __future__ import annotations

import asyncio

import pytest

from quotasched.services.nats.bus import DRAIN_TIMEOUT_S, connect

pytestmark = [pytest.mark.nats]


async def test_a_subscription_stuck_in_its_handler_does_not_hold_the_close(nats_server):
    nc = await connect(nats_server.url, "drain-test")
    entered = asyncio.Event()

    async def stuck(msg) -> None:
        entered.set()
        await asyncio.Event().wait()  # never returns: the drain cannot finish

    await nc.subscribe("drain.test", cb=stuck)
    await nc.publish("drain.test", b"1")
    await nc.publish("drain.test", b"2")  # pending behind the stuck one
    await nc.flush()
    await asyncio.wait_for(entered.wait(), 10)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await nc.drain()  # nats-py gives up on a drain after its timeout, then closes
    took = loop.time() - began
    assert nc.is_closed
    # Bounds, not a speed: it waited for the drain first, and gave up long before nats-py's
    # default of 30 s (a wait_for cannot tell: drain swallows the cancellation and returns).
    assert DRAIN_TIMEOUT_S - 0.5 <= took < 20, took
