"""Small helpers of the reliability tests (everything talks to a real nats-server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy


async def read_stream(js, stream: str, subject: str) -> list[tuple[int, dict[str, Any] | None]]:
    """(stream seq, JSON object or None when undecodable) of every message of `stream` on
    `subject`, read with an ordered consumer up to the stream's last sequence at the call."""
    info = await js.stream_info(stream)
    end = info.state.last_seq
    out: list[tuple[int, dict[str, Any] | None]] = []
    if info.state.messages == 0:
        return out
    done = asyncio.Event()

    async def deliver(msg) -> None:
        seq = msg.metadata.sequence.stream
        try:
            out.append((seq, json.loads(msg.data)))
        except ValueError:
            out.append((seq, None))
        if seq >= end:
            done.set()

    sub = await js.subscribe(subject, cb=deliver, ordered_consumer=True, stream=stream,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))  # fmt: skip
    try:
        # the last message may be on another subject: stop once nothing came for a second
        while not done.is_set():
            before = len(out)
            try:
                await asyncio.wait_for(done.wait(), 1.0)
            except (asyncio.TimeoutError, TimeoutError):
                if len(out) == before:
                    break
    finally:
        await sub.unsubscribe()
    return out
