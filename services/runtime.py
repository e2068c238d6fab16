"""The composition root: wire the server, the scheduler and an executor into one running stack.

`quotasched up`, `quotasched scheduler`, `quotasched executor` and `quotasched demo` all start
through here, so there is one place that decides what runs and in which order.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack

from faststream.nats import NatsBroker

from services import logs
from services.bus import connect, ensure_streams
from services.embedded import EmbeddedServer
from services.executors.app import build_executor
from services.scheduler.service import Scheduler
from services.settings import Settings

log = logs.get("quotasched.runtime")


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


class Stack:
    """Everything `quotasched up` runs, as an async context manager."""

    def __init__(self, settings: Settings, *, port: int | None = None, executor: str = "simulated",
                 speed: float = 1.0, scheduler: bool = True):  # fmt: skip
        self.settings = settings
        self.port = port
        self.executor_kind = executor
        self.speed = speed
        self.with_scheduler = scheduler
        self.url = settings.nats_url
        self.server: EmbeddedServer | None = None
        self.scheduler: Scheduler | None = None
        self.stop = asyncio.Event()
        self._exit = AsyncExitStack()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Stack:
        if self.url is None:
            self.server = EmbeddedServer(self.settings.data_dir, self.port).start()
            self._exit.callback(self.server.stop)
            self.url = self.server.url
            self.settings = self.settings.model_copy(update={"nats_url": self.url})
        nc = await connect(self.url, "quotasched-scheduler")
        self._exit.push_async_callback(nc.close)
        await ensure_streams(nc.jetstream(), self.settings)
        if self.with_scheduler:
            self.scheduler = Scheduler(nc, self.settings)
            self._task = asyncio.create_task(self.scheduler.run(self.stop))
            self._exit.push_async_callback(self._stop_scheduler)
            await asyncio.wait_for(self.scheduler.leading.wait(), self.settings.lease_ttl_s * 3)
        if self.executor_kind != "none":
            broker = NatsBroker(self.url, logger=None)
            build_executor(broker, self.executor_kind, speed=self.speed)
            await broker.start()
            self._exit.push_async_callback(broker.stop)
        return self

    async def _stop_scheduler(self) -> None:
        self.stop.set()
        if self._task is not None:
            await self._task

    async def __aexit__(self, *exc_info) -> None:
        self.stop.set()
        await self._exit.aclose()


async def serve(settings: Settings, *, port: int | None, executor: str, speed: float,
                announce: Callable[[str], None]) -> None:  # fmt: skip
    """Run until SIGINT/SIGTERM; the first thing announced is the NATS URL."""
    async with Stack(settings, port=port, executor=executor, speed=speed) as stack:
        announce(stack.url)
        stop_on_signals(stack.stop)
        await stack.stop.wait()
    log.info("stopped")
