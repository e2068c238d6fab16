"""Keeping an executor's durable consumer: if it disappears (deleted by an operator, or by
anyone whose credentials may), the executor says so loudly and recreates it.

The executor's FastStream subscriber listens on the consumer's deliver subject and never learns
that the consumer behind it is gone: the server just stops delivering, and every later job
would stay SCHEDULED while the executor logs nothing.  `ConsumerWatch` asks the server about
the consumer every `every_s` seconds; when the server no longer knows it, it logs an error
naming it and creates it again with the configuration it last saw (the same deliver subject,
so the running subscriber receives again), resuming after the last fact the old one had acked
or this executor had handled, whichever is later: what was delivered since is delivered again, and a dispatch this executor already started is
ignored (`Executor.started`).

The watch must have seen the consumer once to know how to recreate it (its deliver subject is
the running subscriber's inbox): `first_look` is awaited right after the subscriber started
(services/runtime.py), before any job can run, so a consumer deleted seconds after the start
is not missed (a watch that only looked every few seconds never saw a consumer deleted before
its first look, and then idled).  If the consumer cannot be found then, or cannot be
recreated `GIVE_UP_AFTER` times in a row while the server answers, the executor stops with
an error (`on_fatal`: the process exits non-zero) instead of idling.  A bus that does not
answer is only warned about: nats-py reconnects and the watch asks again.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NotFoundError

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services import logs

log = logs.get("quotasched.executor")

WATCH_EVERY_S = 2.0  # one consumer_info request per check: no noticeable load
FIRST_LOOK_S = 30.0  # how long the subscriber may take to create its consumer at the start
GIVE_UP_AFTER = 3  # recreations the server refused in a row before the executor stops


class ConsumerLost(RuntimeError):
    """The executor's consumer is gone and could not be had back: the executor must stop."""


class ConsumerWatch:
    def __init__(self, js, name: str, every_s: float = WATCH_EVERY_S, on_fatal=None,
                 handled=lambda: 0):  # fmt: skip
        self.js = js
        self.handled = handled  # () -> the stream sequence of the last fact it handled
        self.name = name
        self.every_s = every_s
        self.on_fatal = on_fatal  # called with a ConsumerLost when the watch gives up
        self.seen: ConsumerInfo | None = None  # the last answer about it: how to recreate it
        self.recreated = 0
        self.refused = 0  # recreations refused in a row
        self._task: asyncio.Task | None = None

    async def first_look(self, ceiling_s: float = FIRST_LOOK_S) -> ConsumerInfo:
        """Record the consumer's configuration as soon as its subscriber has created it;
        raises ConsumerLost if it does not appear within `ceiling_s`."""
        deadline = asyncio.get_running_loop().time() + ceiling_s
        while True:
            try:
                self.seen = await self.js.consumer_info(FACTS_STREAM, self.name)
                return self.seen
            except NotFoundError:
                if asyncio.get_running_loop().time() > deadline:
                    log.error("the executor's consumer does not exist after its subscriber "
                              "started", consumer=self.name, stream=FACTS_STREAM)  # fmt: skip
                    raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} not found "
                                       "after start") from None  # fmt: skip
                await asyncio.sleep(0.1)

    def start(self) -> ConsumerWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        """Stop watching (idempotent): the consumer is about to go quiet on purpose."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.check()
            except ConsumerLost as error:
                if self.on_fatal is not None:
                    self.on_fatal(error)
                return
            except (NatsTimeout, ConnectionError, OSError) as error:  # unreachable for now
                log.warning("could not check the executor's consumer", consumer=self.name,
                            error=repr(error))  # fmt: skip
            except Exception as error:  # anything else: loud, and asked again
                log.error("could not check the executor's consumer", consumer=self.name,
                          error=repr(error))  # fmt: skip

    async def check(self) -> None:
        """Look at the consumer once; recreate it if the server no longer has it."""
        try:
            self.seen = await self.js.consumer_info(FACTS_STREAM, self.name)
            return
        except NotFoundError:
            pass
        if self.seen is None:  # first_look was not awaited: nothing to recreate it from
            log.error("the executor's consumer is gone and was never seen", consumer=self.name,
                      stream=FACTS_STREAM)  # fmt: skip
            raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} not found")
        after = max(self.seen.ack_floor.stream_seq, self.handled())
        log.error("the executor's consumer is gone (deleted?); recreating it",
                  consumer=self.name, stream=FACTS_STREAM, resume_after_seq=after)  # fmt: skip
        try:
            self.seen = await self.js.add_consumer(FACTS_STREAM, replacement(self.seen, after))
        except APIError as error:  # the server answered no (permissions, stream gone, ...)
            self.refused += 1
            log.error("the executor's consumer could not be recreated", consumer=self.name,
                      error=repr(error), tries=self.refused)  # fmt: skip
            if self.refused >= GIVE_UP_AFTER:
                raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} is gone and could "
                                   f"not be recreated: {error}") from error  # fmt: skip
            return
        self.refused = 0
        self.recreated += 1
        log.warning("the executor's consumer was recreated", consumer=self.name,
                    deliver_subject=self.seen.config.deliver_subject)  # fmt: skip


def replacement(info: ConsumerInfo, after: int) -> ConsumerConfig:
    """The lost consumer's configuration, starting after stream sequence `after`."""
    config = ConsumerConfig.from_response(info.config.as_dict())
    config.name = None  # created by its durable name, as the subscriber first did
    config.durable_name = info.name
    config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
    config.opt_start_seq = after + 1
    return config
