"""Loops that wait for an event or a timeout end when their task is cancelled, whatever else
happens in the same turn of the event loop (services/nats/waits.py)."""

from __future__ import annotations

import asyncio

import pytest

from quotasched.services.nats.waits import cancel_and_wait, wait_set


async def _loop(wait, event: asyncio.Event, rounds: list[int]) -> None:
    while True:
        await wait(event)
        rounds.append(1)
        event.clear()


async def _wait_for(event: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(event.wait(), 10)
    except (asyncio.TimeoutError, TimeoutError):
        pass


async def _set_then_cancel(wait) -> asyncio.Task:
    """A loop waiting on `wait`; its event set, then its task cancelled, in the same turn."""
    event, rounds = asyncio.Event(), []
    task = asyncio.create_task(_loop(wait, event, rounds))
    await asyncio.sleep(0.01)
    event.set()
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0.1)
    return task


async def test_a_loop_on_wait_set_ends_when_cancelled_as_its_event_is_set():
    task = await _set_then_cancel(lambda event: wait_set(event, 10))
    assert task.done() and task.cancelled()


async def test_the_same_loop_on_wait_for_would_not_end_which_is_why_wait_set_exists():
    """Python 3.11's asyncio.wait_for returns normally when the event completes in the turn
    the task is cancelled: the loop goes on (a GPU agent that did not stop on SIGTERM).  If a
    later Python mends it, this test says so and wait_set can go."""
    task = await _set_then_cancel(_wait_for)
    try:
        assert not task.done(), "asyncio.wait_for no longer swallows the cancellation"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_wait_set_says_whether_the_event_was_set_or_the_time_ran_out():
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_set(event, 5) is True
    assert await wait_set(event, 0) is True  # already set: at once


async def test_a_task_that_swallows_its_cancellation_is_cancelled_until_it_ends():
    """As nats-py does inside a request or a flush: the first cancellation is caught and the
    task goes on waiting.  cancel_and_wait cancels it again until it has ended."""
    swallowed = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.append(1)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        await asyncio.sleep(60)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    await asyncio.wait_for(cancel_and_wait(task, again_s=0.05), 5)
    assert task.cancelled() and swallowed == [1]


async def test_what_the_task_raised_is_retrieved():
    async def failing() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert isinstance(task.exception(), RuntimeError)
