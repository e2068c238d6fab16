"""Keeping an executor's durable consumer: if it disappears (deleted by an operator, or by
anyone whose credentials may), the executor says so loudly and recreates it.

The executor's FastStream subscriber listens on the consumer's deliver subject and never learns
that the consumer behind it is gone: the server just stops delivering, and every later job
would stay SCHEDULED while the executor logs nothing.  `ConsumerWatch` asks the server about
the consumer every `every_s` seconds; when the server no longer knows it, it logs an error
naming it and creates it again with the configuration it last saw (the same deliver subject,
so the running subscriber receives again), resuming after the last fact the old one had acked:
what was delivered since is delivered again, and a dispatch this executor already started is
ignored (`Executor.started`).  If it cannot be recreated, it says so at every try.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from events.subjects import FACTS_STREAM
from services import logs

log = logs.get("quotasched.executor")

WATCH_EVERY_S = 2.0


class ConsumerWatch:
    def __init__(self, js, name: str, every_s: float = WATCH_EVERY_S):
        self.js = js
        self.name = name
        self.every_s = every_s
        self.seen: ConsumerInfo | None = None  # the last answer about it: how to recreate it
        self.recreated = 0
        self._task: asyncio.Task | None = None

    def start(self) -> ConsumerWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.check()
            except Exception as error:  # the bus unreachable for now: ask again later
                log.warning("could not check the executor's consumer", consumer=self.name,
                            error=repr(error))  # fmt: skip

    async def check(self) -> None:
        """Look at the consumer once; recreate it if the server no longer has it."""
        try:
            self.seen = await self.js.consumer_info(FACTS_STREAM, self.name)
            return
        except NotFoundError:
            pass
        if self.seen is None:
            return  # never seen yet: its subscriber has not created it
        log.error("the executor's consumer is gone (deleted?); recreating it",
                  consumer=self.name, stream=FACTS_STREAM,
                  resume_after_seq=self.seen.ack_floor.stream_seq)  # fmt: skip
        self.seen = await self.js.add_consumer(FACTS_STREAM, replacement(self.seen))
        self.recreated += 1
        log.warning("the executor's consumer was recreated", consumer=self.name,
                    deliver_subject=self.seen.config.deliver_subject)  # fmt: skip


def replacement(info: ConsumerInfo) -> ConsumerConfig:
    """The lost consumer's configuration, starting after the last fact it had acked."""
    config = ConsumerConfig.from_response(info.config.as_dict())
    config.name = None  # created by its durable name, as the subscriber first did
    config.durable_name = info.name
    config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
    config.opt_start_seq = info.ack_floor.stream_seq + 1
    return config
