"""The limits both HTTP ports keep (the AWS Batch endpoint, the web view), so that slow or idle
clients, a page on another origin, or a flood of one error cannot take a server (or the process
around it: `up` runs the scheduler and the executor beside them) down.

- Timeouts: a new connection must deliver a request's headers within `header_timeout_s`; after
  an answer, the next request's headers must come within `keepalive_timeout_s`; a body must
  arrive within `body_timeout_s` (the handler reads it under `read_body`).  A connection
  whose request is being handled is never timed out here (an event stream stays open).
- A connection cap: at most `max_connections` open connections per server.  A new connection
  beyond it closes the one idle the longest (no request in hand); when every one is busy, the
  newcomer is answered 503 with `Retry-After` and closed at once.  So idle sockets cannot keep
  an honest request out, and a server never holds more than the cap's file descriptors.
- Host and Origin: a request's `Host` must name an address the server listens on (or a name the
  operator declares in QUOTASCHED_HTTP_ALLOWED_HOSTS): a DNS-rebinding page is refused; an
  `Origin`, when present, must be the server's own.
- Error lines rate-limited (`Throttle`): one line per kind of error and interval, the lines held
  back counted on the next one, and told at close.

aiohttp has the pieces but not these rules: its keep-alive timer does not bound a slow request
line, and it has no connection cap, so each accepted connection goes through `_Connection`, a
protocol in front of aiohttp's own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from quotasched.services.settings import HttpOptions

REFUSED_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
                b"Content-Type: text/plain\r\nContent-Length: 22\r\n\r\nevery connection busy\n")  # fmt: skip


class BindError(OSError):
    """The address cannot be listened on (its port is taken, say)."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), for `ConnectionGuard.serve`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise BindError(error.errno, error.strerror or str(error)) from None
    return sock


class Throttle:
    """At most one line per key and `interval_s`: `admit(key)` is None for a line to hold back,
    else how many were held back since the last line told (0 the first time)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def admit(self, key: object) -> int | None:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if len(self._last) > 10_000:  # bounded: keys are kinds of error, not requests
            self._last.clear()
        self._last[key] = now
        return self._held.pop(key, 0)

    def held(self) -> dict[object, int]:
        """The lines held back and not yet told, per key (forgotten once returned)."""
        held, self._held = self._held, {}
        return held


class ThrottleFilter(logging.Filter):
    """The same rule for the standard library's loggers (aiohttp's "Error handling request",
    asyncio's "socket.accept() out of system resource")."""

    def __init__(self, interval_s: float):
        super().__init__()
        self.throttle = Throttle(interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.throttle.admit((record.name, record.msg))
        if held is None:
            return False
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it held back)"
            record.args = ()
        return True


def throttle_library_logs(interval_s: float) -> None:
    """Once per process: aiohttp's and asyncio's error lines through a `ThrottleFilter`."""
    for name in ("aiohttp.server", "aiohttp.web", "aiohttp.access", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ThrottleFilter) for f in logger.filters):
            logger.addFilter(ThrottleFilter(interval_s))


def _split_host(value: str) -> tuple[str, int | None] | None:
    """`name:port`, `[v6]:port` or a bare name, as (lowercase name, port or None)."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


class HostRule:
    """Which `Host` (and `Origin`) values a server listening on host:port answers to."""

    def __init__(self, host: str, port: int, declared: tuple[str, ...]):
        self.port = port
        listen = host.strip("[]").lower()
        # on a wildcard address any name may reach the server; only declared names then bind it
        self.any_name = _is_wildcard(listen) and not declared
        self.names = {listen}
        try:
            loopback = listen == "localhost" or ipaddress.ip_address(listen).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            self.names |= {"127.0.0.1", "localhost", "::1"}
        self.declared = [_split_host(name) for name in declared]

    def allows(self, value: str | None) -> bool:
        if self.any_name:
            return True
        split = _split_host(value or "")
        if split is None or not split[0]:
            return False
        name, port = split
        if name in self.names and (port or 80) == self.port:
            return True
        return any(d is not None and d[0] == name and (d[1] is None or d[1] == (port or 80))
                   for d in self.declared)  # fmt: skip

    def allows_origin(self, origin: str) -> bool:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and self.allows(parts.netloc)


class _Connection(asyncio.Protocol):
    """One accepted connection, in front of aiohttp's RequestHandler: counts it against the
    cap and closes it when its headers (or its next request) do not come in time."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0  # requests being handled
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, seconds: float) -> None:
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.busy == 0 and self.transport is not None:
            self.guard.timed_out += 1
            self.transport.abort()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.guard.opened(self)
        self.arm(self.guard.options.header_timeout_s)
        self.inner.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.disarm()
        self.guard.closed(self)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _Refused(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        transport.write(REFUSED_BUSY)
        transport.close()


class ConnectionGuard:
    """`await guard.serve(runner, sock)` serves aiohttp's runner on a bound socket under the
    rules above; `guard.middleware` marks requests in hand and checks Host and Origin,
    refusing with `refuse(status, message)` (each server's own error shape)."""

    def __init__(self, options: HttpOptions, refuse: Callable[[int, str], web.StreamResponse]):
        self.options = options
        self.refuse = refuse
        self.rule: HostRule | None = None
        self._open: dict[asyncio.Transport, _Connection] = {}  # oldest activity first
        self._server: asyncio.Server | None = None
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0
        throttle_library_logs(options.error_log_interval_s)

    async def serve(self, runner: web.AppRunner, sock, host: str) -> None:
        self.rule = HostRule(host, sock.getsockname()[1], self.options.allowed_hosts)
        factory = runner.server
        assert factory is not None

        def accept() -> asyncio.Protocol:
            if len(self._open) >= self.options.max_connections and not self._evict_one():
                self.refused += 1
                return _Refused()
            return _Connection(self, factory())

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(accept, sock=sock,
                                                backlog=self.options.max_connections)  # fmt: skip

    def _evict_one(self) -> bool:
        for transport, connection in self._open.items():
            if connection.busy == 0:
                del self._open[transport]  # counted out now: its connection_lost comes later
                self.evicted += 1
                transport.abort()
                return True
        return False

    def opened(self, connection: _Connection) -> None:
        if connection.transport is not None:
            self._open[connection.transport] = connection

    def closed(self, connection: _Connection) -> None:
        if connection.transport is not None:
            self._open.pop(connection.transport, None)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):  # fmt: skip
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is not None and transport is not None:
            connection.busy += 1
            connection.disarm()
            self._open[transport] = self._open.pop(transport)  # the latest activity last
        try:
            refusal = self._refusal(request)
            if refusal is not None:
                return refusal
            return await handler(request)
        finally:
            if connection is not None:
                connection.busy -= 1
                if connection.busy == 0 and connection.transport is not None:
                    connection.arm(self.options.keepalive_timeout_s)

    def _refusal(self, request: web.Request) -> web.StreamResponse | None:
        assert self.rule is not None
        host = request.headers.get("Host")
        if not self.rule.allows(host):
            return self.refuse(421, f"this server does not answer to the host {host!r}: only to "
                                    "the addresses it listens on and QUOTASCHED_HTTP_ALLOWED_HOSTS")
        origin = request.headers.get("Origin")
        if origin is not None and not self.rule.allows_origin(origin):
            return self.refuse(403, f"requests from the origin {origin!r} are refused: only "
                                    "this server's own pages may call it from a browser")
        return None

    async def read_body(self, request: web.Request) -> bytes:
        """The request's body within `body_timeout_s` (TimeoutError otherwise)."""
        return await asyncio.wait_for(request.read(), self.options.body_timeout_s)
