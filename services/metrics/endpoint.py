"""The HTTP endpoint: `GET /metrics` and `GET /healthz` on one port, served by the running
event loop, over the parts attached to it.  A part has a `role`, an async `refresh` (what a
scrape asks the server, within `QUERY_TIMEOUT_S`), `families` and `health`; one scrape runs at a
time, and the families of the same name from several parts are merged into one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quotasched.services import logs

log = logs.get("quotasched.metrics")

QUERY_TIMEOUT_S = 1.0  # for what a scrape asks the server


class MetricsEndpoint:
    """`GET /metrics` (Prometheus text format) and `GET /healthz` on one port, served by the
    running event loop.

        endpoint = await MetricsEndpoint("127.0.0.1", 9464).start()
        endpoint.add(SchedulerPart(scheduler))
        ...
        await endpoint.close()
    """

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port  # 0: any free port; the bound one once started
        self.parts: list = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Parts(self))
        ProcessCollector(registry=self.registry)
        self._server: asyncio.base_events.Server | None = None
        self._lock = asyncio.Lock()

    def add(self, part) -> None:
        self.parts.append(part)

    async def start(self) -> MetricsEndpoint:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics endpoint", url=f"http://{self.host}:{self.port}/metrics")
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def render(self) -> bytes:
        async with self._lock:  # one scrape at a time: refresh, then collect
            for part in self.parts:
                await part.refresh()
            return generate_latest(self.registry)  # synchronous: nothing changes meanwhile

    def health(self) -> tuple[bool, dict[str, Any]]:
        components = {}
        healthy = bool(self.parts)  # nothing attached yet: not ready
        for part in self.parts:
            ok, document = part.health()
            healthy = healthy and ok
            if part.role in components:  # several partitions: a list, one per partition
                if not isinstance(components[part.role], list):
                    components[part.role] = [components[part.role]]
                components[part.role].append(document)
            else:
                components[part.role] = document
        return healthy, {"status": "ok" if healthy else "unavailable", **components}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
                method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                    asyncio.TimeoutError, TimeoutError, ConnectionError):  # fmt: skip
                return
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, kind, body = 405, "text/plain; charset=utf-8", b"only GET\n"
            elif path == "/metrics":
                status, kind, body = 200, CONTENT_TYPE_LATEST, await self.render()
            elif path == "/healthz":
                healthy, document = self.health()
                status, kind = (200 if healthy else 503), "application/json"
                body = json.dumps(document).encode() + b"\n"
            else:
                status, kind, body = 404, "text/plain; charset=utf-8", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                      503: "Service Unavailable"}[status]  # fmt: skip
            response = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
            writer.write(response.encode())
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass
        except Exception as error:  # a scrape never takes the service down
            log.warning("metrics request failed", error=repr(error))
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:
                pass


class _Parts:
    def __init__(self, endpoint: MetricsEndpoint):
        self.endpoint = endpoint

    def collect(self):
        """Every part's families, those of the same name merged into one (the partitions of
        one process report the same metrics, told apart by their `partition` label)."""
        merged: dict[str, Any] = {}
        for part in self.endpoint.parts:
            for family in part.families():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()
