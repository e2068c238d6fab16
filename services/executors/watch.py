"""Keeping an executor's durable consumer as the executor made it: if it disappears or is
changed (by an operator, or by anyone whose credentials may), the executor says so loudly and
puts it back.

The executor's FastStream subscriber listens on the consumer's deliver subject and never learns
that the consumer behind it is gone or different: the server just stops delivering (or
delivers elsewhere, or other facts), and every later job would stay SCHEDULED while the
executor logs nothing.  `ConsumerWatch` asks the server about the consumer every `every_s`
seconds and compares its WHOLE configuration with the one the executor declared
(`app.consumer_config`: filter subject, ack policy, ack wait, max deliver, max ack pending,
replay policy, and every other option at its default) plus the deliver subject the running
subscriber listens on; it may start with every fact (`DeliverPolicy.ALL`) or, once restored,
after a sequence (`BY_START_SEQUENCE` at the sequence the watch chose, or found at its first
look).  When the server no longer knows the consumer, or any field differs, it logs an error
naming the consumer (and each field: expected, found), deletes what is there and creates the
declared consumer again (the same deliver subject, so the running subscriber receives again),
resuming after the last fact handled while the consumer was as declared: for a deleted one,
the later of what it had acked and what this executor had handled; for a changed one, what
was handled before the last check that found it right (facts delivered under a wrong filter
are ignored by the subscriber, app.subscribe).  What was delivered since is delivered again,
and a dispatch this executor already started is ignored (`Executor.started`).

The watch must have seen the consumer once to know how to recreate it (its deliver subject is
the running subscriber's inbox): `first_look` is awaited right after the subscriber started
(services/runtime.py), before any job can run, so a consumer deleted seconds after the start
is not missed (a watch that only looked every few seconds never saw a consumer deleted before
its first look, and then idled); a consumer found changed then (while no executor ran) is
restored at once, resuming after what it had acked.  If the consumer cannot be found then, or
cannot be put back `GIVE_UP_AFTER` times in a row while the server answers (or stays silent:
credentials that may not delete it), the executor stops with an error (`on_fatal`: the process
exits non-zero) instead of idling.  A bus that does not answer a look is only warned about:
nats-py reconnects and the watch asks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
from typing import Any

from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NotFoundError

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services import logs

log = logs.get("quotasched.executor")

WATCH_EVERY_S = 2.0  # one consumer_info request per check: no noticeable load
FIRST_LOOK_S = 30.0  # how long the subscriber may take to create its consumer at the start
GIVE_UP_AFTER = 3  # restorations refused in a row before the executor stops
# Compared apart (where it starts, its inbox) or not at all: the names are the key it was
# asked by; the server's metadata, replicas and storage are inherited from the stream.
SPECIAL = ("name", "durable_name", "deliver_policy", "opt_start_seq", "opt_start_time",
           "deliver_subject", "metadata", "num_replicas", "mem_storage")  # fmt: skip


class ConsumerLost(RuntimeError):
    """The executor's consumer is gone and could not be had back: the executor must stop."""


class ConsumerWatch:
    def __init__(self, js, name: str, every_s: float = WATCH_EVERY_S, on_fatal=None,
                 handled=lambda: 0, expected: ConsumerConfig | None = None):  # fmt: skip
        self.js = js
        self.handled = handled  # () -> the stream sequence of the last fact it handled
        self.name = name
        self.every_s = every_s
        self.on_fatal = on_fatal  # called with a ConsumerLost when the watch gives up
        # The declared configuration (app.consumer_config); its deliver subject is learned at
        # the first look.  None: the configuration first seen is the one kept.
        self.expected = expected
        self.start_seq: int | None = None  # BY_START_SEQUENCE at this sequence is as declared
        self.good_through = 0  # facts through this sequence were handled under the declared one
        self.seen: ConsumerInfo | None = None  # the last answer about it
        self.recreated = 0
        self.restored = 0  # changed consumers put back
        self.refused = 0  # restorations refused in a row
        self._task: asyncio.Task | None = None

    async def first_look(self, ceiling_s: float = FIRST_LOOK_S) -> ConsumerInfo:
        """Record the consumer's deliver subject (and where it starts) as soon as its
        subscriber has created it, and restore it if it is not as declared; raises
        ConsumerLost if it does not appear within `ceiling_s`."""
        deadline = asyncio.get_running_loop().time() + ceiling_s
        while True:
            try:
                found = await self.js.consumer_info(FACTS_STREAM, self.name)
                break
            except NotFoundError:
                if asyncio.get_running_loop().time() > deadline:
                    log.error("the executor's consumer does not exist after its subscriber "
                              "started", consumer=self.name, stream=FACTS_STREAM)  # fmt: skip
                    raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} not found "
                                       "after start") from None  # fmt: skip
                await asyncio.sleep(0.1)
        self.seen = found
        if self.expected is None:
            self.expected = _config(found)
        self.expected.deliver_subject = found.config.deliver_subject  # the subscriber's inbox
        if _value(found.config.deliver_policy) == DeliverPolicy.BY_START_SEQUENCE.value:
            self.start_seq = found.config.opt_start_seq  # restored before this executor started
        self.good_through = found.ack_floor.stream_seq  # what it had acked: all we can know
        await self._compare(found, self.good_through)
        return self.seen

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
        """Look at the consumer once; put it back if the server no longer has it or it is not
        as declared."""
        handled = self.handled()  # before the look: all of it came through what is looked at
        try:
            found = await self.js.consumer_info(FACTS_STREAM, self.name)
        except NotFoundError:
            found = None
        if found is not None:
            await self._compare(found, handled)
            return
        if self.seen is None:  # first_look was not awaited: nothing to recreate it from
            log.error("the executor's consumer is gone and was never seen", consumer=self.name,
                      stream=FACTS_STREAM)  # fmt: skip
            raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} not found")
        after = max(self.good_through, self.seen.ack_floor.stream_seq, self.handled())
        log.error("the executor's consumer is gone (deleted?); recreating it",
                  consumer=self.name, stream=FACTS_STREAM, resume_after_seq=after)  # fmt: skip
        if await self._restore(after, delete=False):
            self.recreated += 1
            log.warning("the executor's consumer was recreated", consumer=self.name,
                        deliver_subject=self.seen.config.deliver_subject)  # fmt: skip

    async def _compare(self, found: ConsumerInfo, handled: int) -> None:
        if self.expected is None:  # no first look: what it is now is what it should stay
            self.expected = _config(found)
        changed = differences(self.expected, found.config, self.start_seq)
        if not changed:
            self.seen = found
            self.refused = 0
            self.good_through = max(self.good_through, handled, found.ack_floor.stream_seq)
            return
        after = self.good_through
        log.error("the executor's consumer was changed; restoring it", consumer=self.name,
                  stream=FACTS_STREAM, resume_after_seq=after,
                  changed="; ".join(f"{field}: expected {want!r}, found {have!r}"
                                    for field, (want, have) in changed.items()))  # fmt: skip
        if await self._restore(after, delete=True):
            self.restored += 1
            log.warning("the executor's consumer was restored", consumer=self.name,
                        fields=",".join(changed))  # fmt: skip

    async def _restore(self, after: int, delete: bool) -> bool:
        """Delete whatever has the consumer's name (`delete`) and create the declared one,
        starting after stream sequence `after`; False if the server refused (ConsumerLost
        after GIVE_UP_AFTER refusals in a row)."""
        try:
            if delete:
                with contextlib.suppress(NotFoundError):
                    await self.js.delete_consumer(FACTS_STREAM, self.name)
            self.seen = await self.js.add_consumer(FACTS_STREAM,
                                                   replacement(self.expected, self.name, after))
        except (APIError, NatsTimeout) as error:  # the server said no, or stayed silent
            self.refused += 1  # (a permissions violation has no answer)
            log.error("the executor's consumer could not be put back", consumer=self.name,
                      error=repr(error), tries=self.refused)  # fmt: skip
            if self.refused >= GIVE_UP_AFTER:
                raise ConsumerLost(f"consumer {self.name} on {FACTS_STREAM} is gone or changed "
                                   f"and could not be put back: {error!r}") from error
            return False
        self.refused = 0
        self.start_seq = after + 1
        return True


def differences(expected: ConsumerConfig, found: ConsumerConfig,
                start_seq: int | None) -> dict[str, tuple[Any, Any]]:  # fmt: skip
    """Each field of `found` that is not as `expected`: field -> (expected, found).  Unset,
    zero and empty are one value (the server leaves defaults out).  It may start with every
    fact, or at `start_seq` (where a restoration made it start)."""
    changed = {}
    for field in dataclasses.fields(ConsumerConfig):
        if field.name in SPECIAL:
            continue
        want, have = _value(getattr(expected, field.name)), _value(getattr(found, field.name))
        if want != have:
            changed[field.name] = (want, have)
    if expected.deliver_subject is not None and found.deliver_subject != expected.deliver_subject:
        changed["deliver_subject"] = (expected.deliver_subject, found.deliver_subject)
    policy = _value(found.deliver_policy)
    restarted = policy == DeliverPolicy.BY_START_SEQUENCE.value and found.opt_start_seq == start_seq
    if policy != DeliverPolicy.ALL.value and not restarted:
        want = "all" if start_seq is None else f"all or by_start_sequence {start_seq}"
        changed["deliver_policy"] = (want, f"{policy} {found.opt_start_seq or ''}".strip())
    return changed


def _value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value
    return None if value in (None, 0, False, "", [], {}) else value


def _config(info: ConsumerInfo) -> ConsumerConfig:
    return ConsumerConfig.from_response(info.config.as_dict())


def replacement(config: ConsumerConfig, name: str, after: int) -> ConsumerConfig:
    """The declared configuration, starting after stream sequence `after`."""
    config = ConsumerConfig.from_response(config.as_dict())
    config.name = None  # created by its durable name, as the subscriber first did
    config.durable_name = name
    config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
    config.opt_start_seq = after + 1
    return config
