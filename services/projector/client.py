"""Ask the projector (over NATS request/reply) instead of opening its DuckDB file.

    from quotasched.services.projector.client import query
    answer = query("nats://127.0.0.1:4222", "sql", sql="SELECT job_id, status FROM jobs")
    answer["columns"], answer["rows"], answer["truncated"], answer["position"]
    query(url, "describe-service-job", jobId="high")          # AWS-shaped, like qm.api.*
    query(url, "list-service-jobs", jobQueue="q", jobStatus="ALL")
    query(url, "get-job-queue-snapshot", jobQueue="q")
    query(url, "utilization", t0=0, t1=86400, bucketSeconds=3600, per="share")
    query(url, "checksum")
    query(url, "position")     # {"position", "streamLastSeq", "lag", ...}

`query` is synchronous (it runs its own event loop; call it from plain code such as a Typer
command).  From async code use `request(nc, verb, **params)` on an open connection, or
`aquery(url, verb, **params)`.  An error answer raises `ProjectorError` (its `kind` is the
answer's error type: ClientException for a refused or unknown request, QueryFailed for SQL
that DuckDB rejected, QueryTimeout, ...); no projector answering raises
`ProjectorUnavailable`.

`wait_for_position(nc, seq)` waits until the projector has applied fact `seq` (read your own
writes: publish a command, wait for its facts' sequence, then query).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats.errors

from quotasched.services.nats.bus import Unreachable, connect
from quotasched.services.projector import API_PREFIX, APPLIED_SUBJECT
from quotasched.services.nats.waits import wait_set


class ProjectorError(Exception):
    """The projector answered with an error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class ProjectorUnavailable(ProjectorError):
    """No projector answered (none running, still starting, or NATS unreachable)."""

    def __init__(self, message: str):
        super().__init__("Unavailable", message)


async def request(nc, verb: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
    """One request on an open nats-py connection; the answer, or ProjectorError."""
    try:
        reply = await nc.request(f"{API_PREFIX}.{verb}", json.dumps(params).encode(),
                                 timeout=timeout)  # fmt: skip
    except nats.errors.NoRespondersError:
        raise ProjectorUnavailable("no projector is running (nothing answers "
                                   f"{API_PREFIX}.{verb})") from None  # fmt: skip
    except (asyncio.TimeoutError, TimeoutError, nats.errors.TimeoutError):
        raise ProjectorUnavailable(f"the projector did not answer within {timeout:g} s") from None
    answer = json.loads(reply.data)
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        raise ProjectorError(answer["error"].get("type", "Error"),
                             answer["error"].get("message", ""))  # fmt: skip
    return answer


async def aquery(nats_url: str, verb: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
    try:
        nc = await connect(nats_url, "quotasched-projector-client", timeout=min(timeout, 10.0))
    except Unreachable as error:
        raise ProjectorUnavailable(str(error)) from None
    try:
        return await request(nc, verb, timeout=timeout, **params)
    finally:
        await nc.close()


def query(nats_url: str, verb: str, *, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
    """Ask the projector one question (see the module docstring for the verbs)."""
    return asyncio.run(aquery(nats_url, verb, timeout=timeout, **params))


async def wait_for_position(nc, seq: int, timeout: float = 30.0) -> int:
    """Until the projector's position is at least `seq`; returns the position."""
    reached = asyncio.Event()
    position = 0

    async def applied(msg) -> None:
        nonlocal position
        try:
            position = max(position, int(json.loads(msg.data)["position"]))
        except (ValueError, KeyError, TypeError):
            return
        if position >= seq:
            reached.set()

    sub = await nc.subscribe(APPLIED_SUBJECT, cb=applied)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:  # also ask: the projector may already be there and stay idle
                answer = await request(nc, "position", timeout=max(deadline - time.monotonic(), 0.1))
                position = max(position, answer["position"])
            except ProjectorUnavailable:
                pass
            if position >= seq:
                return position
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the projector reached position {position}, not {seq}, "
                                   f"within {timeout:g} s")  # fmt: skip
            await wait_set(reached, min(remaining, 1.0))
    finally:
        await sub.unsubscribe()


__all__ = ["ProjectorError", "ProjectorUnavailable", "aquery", "query", "request",
           "wait_for_position"]  # fmt: skip
