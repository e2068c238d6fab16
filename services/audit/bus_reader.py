"""The live bus as a source of the audit: `BusReader` reads QM_FACTS (and QM_COMMANDS) with
nats-py on its own event loop in a background thread and hands records over through bounded
queues.  The log's end is taken before the command stream's, so every recorded fact's
command is read; a command whose facts are still being appended is held back."""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Iterator
from typing import Any

from quotasched.services.audit.records import CommandRecord, FactRecord


class BusUnavailable(Exception):
    """The NATS server can't be reached, or it has no quotasched streams."""


_END = object()


class BusReader:
    """Reads QM_FACTS (and QM_COMMANDS) on a private event loop in a background thread.

        with BusReader(url) as bus:
            result = verify(bus.commands(), bus.facts(), pending_allowed=True, ...)

    The fact log's last sequence is taken first, then the command stream's, so every fact
    read names a command that is read too.  Records cross to the caller's thread in batches
    through bounded queues, so neither stream is held in memory whole.
    """

    BATCH = 512

    def __init__(self, url: str, commands: bool = True, connect_timeout: float = 3.0,
                 facts_filter: str = "qm.fact.>"):  # fmt: skip
        self.url = url
        self.facts_filter = facts_filter  # one partition's facts, when there is one per queue
        self.want_commands = commands
        self.connect_timeout = connect_timeout
        self.partial: tuple[int, int, int] | None = None
        self._facts: queue_module.Queue = queue_module.Queue(maxsize=64)
        self._commands: queue_module.Queue = queue_module.Queue(maxsize=64)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="audit-bus-reader", daemon=True)

    def __enter__(self) -> BusReader:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        for channel in (self._facts, self._commands):  # unblock a waiting producer
            try:
                while True:
                    channel.get_nowait()
            except queue_module.Empty:
                pass
        self._thread.join(timeout=10)

    def facts(self) -> Iterator[FactRecord]:
        yield from self._drain(self._facts)

    def commands(self) -> Iterator[CommandRecord]:
        yield from self._drain(self._commands)

    def fact_messages(self) -> Iterator[bytes]:
        """Just the payloads of the fact log (for `explain`)."""
        for record in self.facts():
            yield record.text

    def _drain(self, channel: queue_module.Queue) -> Iterator:
        while True:
            batch = channel.get()
            if batch is _END:
                return
            if isinstance(batch, BaseException):
                raise batch
            yield from batch

    # -- the background thread -------------------------------------------------------------

    def _main(self) -> None:
        import asyncio

        try:
            asyncio.run(self._read())
        except BaseException as error:  # handed to the caller, never lost in the thread
            if not self._ready.is_set():
                self._error = error
                self._ready.set()
            else:
                for channel in (self._facts, self._commands):
                    self._put_blocking(channel, error)

    def _put_blocking(self, channel: queue_module.Queue, item: Any) -> None:
        while not self._stop.is_set():
            try:
                channel.put(item, timeout=0.1)
                return
            except queue_module.Full:
                continue

    async def _put(self, channel: queue_module.Queue, item: Any) -> bool:
        import asyncio

        while not self._stop.is_set():
            try:
                channel.put_nowait(item)
                return True
            except queue_module.Full:
                await asyncio.sleep(0.005)
        return False

    async def _read(self) -> None:
        import asyncio

        import nats
        from nats.js.errors import NotFoundError

        from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM
        from quotasched.services.nats.credentials import connect_options
        from quotasched.services.nats.bus import error_reason, last_sequence

        problems: list[BaseException] = []

        async def remember(error: BaseException) -> None:
            problems.append(error)

        try:
            nc = await nats.connect(self.url, name="quotasched-audit",
                                    connect_timeout=self.connect_timeout,
                                    max_reconnect_attempts=1, reconnect_time_wait=0.2,
                                    error_cb=remember, **connect_options())  # fmt: skip
        except Exception as error:
            cause = problems[-1] if problems else error
            raise BusUnavailable(f"cannot reach the NATS server at {self.url}: "
                                 f"{error_reason(cause)}") from None  # fmt: skip
        try:
            js = nc.jetstream()
            try:
                # The log's end first: every fact up to it names a command stored before it.
                await js.stream_info(FACTS_STREAM)
                facts_end = await last_sequence(js, self.facts_filter)
                commands_end = (await js.stream_info(COMMANDS_STREAM)).state.last_seq
            except NotFoundError:
                raise BusUnavailable(f"the NATS server at {self.url} has no quotasched streams "
                                     "(QM_COMMANDS, QM_FACTS)") from None  # fmt: skip
            self._ready.set()
            tasks = [asyncio.create_task(self._read_facts(js, facts_end))]
            if self.want_commands:
                tasks.append(asyncio.create_task(self._read_commands(js, commands_end)))
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            try:
                await asyncio.wait_for(nc.close(), 5)
            except Exception:
                pass

    async def _read_facts(self, js, end: int) -> None:
        """Fact messages in log order; a trailing command whose facts are not all in yet
        (its messages' `Qm-Facts` count says how many there will be) is held back."""
        from contextlib import aclosing

        from quotasched.services.nats.log import read_messages, stream_seq

        batch: list[FactRecord] = []
        held: list[FactRecord] = []  # the current command's facts until its last one arrives
        announced = 0
        if end > 0:
            async with aclosing(read_messages(js, self.facts_filter, 1, until_seq=end)) as messages:
                async for msg in messages:
                    if self._stop.is_set():
                        return
                    record = FactRecord.of(msg.data.decode("utf-8", errors="replace"),
                                           stream_seq(msg))  # fmt: skip
                    headers = msg.headers or {}
                    index, count = _position_in_command(headers)
                    if count is None:  # not written by the scheduler: pass it on as it is
                        batch.extend(held)
                        held = []
                        batch.append(record)
                    else:
                        if index == 0 and held:
                            batch.extend(held)  # an earlier group ended short: let verify see it
                            held = []
                        held.append(record)
                        announced = count
                        if index + 1 >= count:
                            batch.extend(held)
                            held = []
                    if len(batch) >= self.BATCH:
                        if not await self._put(self._facts, batch):
                            return
                        batch = []
        if held:
            self.partial = (held[0].command_seq or 0, len(held), announced)
        if batch:
            await self._put(self._facts, batch)
        await self._put(self._facts, _END)

    async def _read_commands(self, js, end: int) -> None:
        import asyncio

        from nats.js.api import ConsumerConfig, DeliverPolicy

        from quotasched.events.subjects import COMMANDS_PREFIX, COMMANDS_STREAM
        from quotasched.services.nats.log import sequence_and_time

        if end == 0:
            await self._put(self._commands, _END)
            return
        inbox: asyncio.Queue = asyncio.Queue(maxsize=20_000)

        async def deliver(msg) -> None:
            await inbox.put(msg)

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1)
        sub = await js.subscribe(f"{COMMANDS_PREFIX}.>", cb=deliver, ordered_consumer=True,
                                 config=config, stream=COMMANDS_STREAM,
                                 pending_msgs_limit=200_000)  # fmt: skip
        batch: list[CommandRecord] = []
        try:
            while not self._stop.is_set():
                msg = await inbox.get()
                # The very function the scheduler stamps commands with (sequence and time
                # from the ack subject, at nanosecond precision, or from the metadata).
                seq, stamp = sequence_and_time(msg)
                if seq > end:
                    break
                batch.append(CommandRecord(seq, msg.subject, msg.data, stamp))
                if len(batch) >= self.BATCH:
                    if not await self._put(self._commands, batch):
                        return
                    batch = []
                if seq >= end or _pending(msg) == 0:
                    break
        finally:
            await sub.unsubscribe()
        if batch:
            await self._put(self._commands, batch)
        await self._put(self._commands, _END)


def _position_in_command(headers: dict) -> tuple[int | None, int | None]:
    """(index of the fact within its command, facts the command produced) from the
    scheduler's headers: `Nats-Msg-Id` `<partition>:<command seq>:<index>` and `Qm-Facts`."""
    try:
        count = int(headers["Qm-Facts"])
        index = int(headers.get("Nats-Msg-Id", "").rsplit(":", 1)[1])
    except (KeyError, ValueError, IndexError):
        return None, None
    return index, count


def _pending(msg) -> int | None:
    try:
        return msg.metadata.num_pending
    except Exception:
        return None
