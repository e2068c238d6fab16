"""The one way a loop waits for an event or a timeout, and never past a cancellation: the
scheduler's term loops, and every service's loops that are cancelled to stop (nats-py may
swallow a cancellation, see `sleep_or`; Python 3.11's `asyncio.wait_for` too, see `wait_set`)."""

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


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """True when `event` is set within `seconds`, False after them; a cancellation of the
    calling task always propagates.  `asyncio.wait_for(event.wait(), seconds)` does not in
    Python 3.11: when the event is set in the same turn of the loop as the task is cancelled,
    it returns as if nothing happened, and a loop that waits that way goes on forever (a GPU
    agent did not stop within 30 s of SIGTERM: its heartbeat loop, `make test`, 2026-12-04)."""
    await sleep_or(event, seconds)
    return event.is_set()


async def cancel_and_wait(task: asyncio.Task, again_s: float = 0.5) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again every `again_s` while it
    runs on: nats-py may swallow a cancellation (in a request or a flush), after which the
    task goes on as if never cancelled (the web view's log follower, cancelled 18 ms after it
    started, kept `up` from stopping: `make test`, 2026-12-04).  What the task raised is
    retrieved and dropped, as `gather(..., return_exceptions=True)` would."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_s)
    await asyncio.gather(task, return_exceptions=True)
