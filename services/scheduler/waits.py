"""The one way a term's loops wait: until a stop event or a timeout, and never past a
cancellation (nats-py may swallow one; see `sleep_or`)."""

from __future__ import annotations

import asyncio


async def sleep_or(stop: asyncio.Event, seconds: float) -> None:
    """Until `stop` is set or `seconds` passed; raises CancelledError if the calling task was
    cancelled, even when the cancellation was swallowed on the way.  nats-py swallows it inside
    a publish (`Client._flush_pending` catches CancelledError), so a `_renew` cancelled at the
    end of a term went on renewing the lease forever, and the term's end waited on it: the
    leader held its lease and decided nothing (seen when nats-server was killed under load).
    The scheduler's `_renew` and `_tick` loops pass through here each round, so they end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    if stop.is_set():
        return
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
