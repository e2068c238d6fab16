"""The web view's job search over the fact log, streamed: the log is read once per pass in
chunks and folded as it comes (in a worker thread, off the stack's event loop), so a search
holds a few chunks of facts at a time, never the whole log (a 1.2 GB log once cost 2.9 GB per
search).  The folding itself is `quotasched explain`'s (`services.explain.texts`)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator

from quotasched.services.explain.story import Entry
from quotasched.services.explain.texts import ids_named, story_of
from quotasched.services.nats.log import read_log

CHUNK = 2000  # facts handed to the worker at once
IN_FLIGHT = 4  # chunks read ahead of the folding: the memory a search holds


async def _chunks(js) -> AsyncIterator[list[bytes]]:
    chunk: list[bytes] = []
    async for _, data, _ in read_log(js):
        chunk.append(data)
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def job_ids_named(js, name: str) -> list[str]:
    """`ids_named` over the log, chunk by chunk."""
    found: list[str] = []
    async for chunk in _chunks(js):
        found += await asyncio.to_thread(ids_named, name, chunk)
    return found


async def story(js, job_id: str) -> list[Entry]:
    """`story_of` over the log as it is read: the folding runs in a thread, fed through a queue
    of at most IN_FLIGHT chunks; an early end (an unreadable fact, a cancelled search) stops
    both sides."""
    handoff: queue.Queue = queue.Queue(maxsize=IN_FLIGHT)
    end = object()
    folded = threading.Event()

    def texts() -> Iterator[bytes]:
        while (chunk := handoff.get()) is not end:
            yield from chunk

    def fold() -> list[Entry]:
        try:
            return story_of(job_id, texts())
        finally:
            folded.set()

    def hand_on(item) -> None:  # in a thread: waits for room, unless the folding has ended
        while not folded.is_set():
            try:
                handoff.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    folding = asyncio.ensure_future(asyncio.to_thread(fold))
    try:
        async for chunk in _chunks(js):
            if folding.done():
                break
            await asyncio.to_thread(hand_on, chunk)
        await asyncio.to_thread(hand_on, end)
        return await folding
    finally:
        if not folding.done():  # cancelled: let the folding thread see the end and return
            while True:
                try:
                    handoff.put_nowait(end)
                    break
                except queue.Full:
                    try:
                        handoff.get_nowait()
                    except queue.Empty:
                        pass
