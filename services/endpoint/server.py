"""The HTTP side: an aiohttp server on loopback that routes each request by botocore's model
(`POST /v1/<operation>`), validates its JSON body with botocore's `ParamValidator`, performs it
(`operations`) and answers the model's output shape, or AWS's error shape: HTTP 400 (500 for
the server's own trouble) with `{"__type": "ClientException", "message": ...}` and the
`x-amzn-ErrorType` header, which the AWS CLI prints as `An error occurred (ClientException)
when calling the X operation: ...` (exit status 254).

Authentication: requests are SigV4-signed by the clients.  Without keys (`quotasched up`, or
`quotasched endpoint` without --keys) any credentials are accepted and the signature is not
checked, so the endpoint then listens on loopback only (as the embedded NATS server accepts any
client); every request is performed with the process's own NATS credentials.  With keys (the
file `quotasched auth generate` writes), a request must carry a valid signature by a known key
(`sigv4`: AWS's 403s otherwise) and is performed over a NATS connection logged in as that key's
role (`roles`), so NATS's permissions decide what it may do: a refused subject is AWS's 403
AccessDeniedException, naming what was refused.  A team's key describing another share's job
is refused the same way (`roles.ResourceDenied`), as an IAM policy scoped to the team would.
A signed request is performed once: its signature replayed within its 15 minutes is refused
(`sigv4.Replays`).

Browsers: a request must be `Content-Type: application/json` (as every AWS SDK sends it), which a
page on another origin cannot send without a CORS preflight this server never grants; a
foreign `Origin` or a `Host` the server does not listen on (DNS rebinding) is refused, 403
AccessDeniedException.  Slow, idle and surplus connections are closed (`http_guard`).  Every bad
body is a 400 ClientException, never a bare 500.

Load: a scheduler that does not answer in time (overloaded, failing over, not running) is AWS's
throttle, HTTP 429 TooManyRequestsException, which the SDKs retry with backoff; and at most
QUOTASCHED_HTTP_MAX_IN_FLIGHT requests wait on the bus at once (`InFlight`), the surplus
answered the same 429 at once.  Their log lines are rate-limited like every error line here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import uuid

from aiohttp import web

from quotasched.services import logs
from quotasched.services.endpoint.model import conform, routes, validation_errors
from quotasched.services.endpoint.operations import Refused, perform, throttled
from quotasched.services.endpoint.roles import Denied, Key, RoleBuses
from quotasched.services.endpoint.sigv4 import Replays, Unauthenticated, signature_of, verify
from quotasched.services.http_guard import BindError, ConnectionGuard, Throttle, bind
from quotasched.services.settings import HttpOptions

log = logs.get("quotasched.endpoint")

HOST = "127.0.0.1"
MAX_BODY = 1024 * 1024  # SubmitServiceJob's payload is at most 10 KiB; the rest is smaller
JSON_TYPES = ("application/json", "application/x-amz-json-1.0", "application/x-amz-json-1.1")


class EndpointError(RuntimeError):
    """The endpoint could not start (its port is taken, say)."""


def _error(kind: str, message: str, status: int) -> web.Response:
    return web.json_response({"__type": kind, "message": message}, status=status,
                             headers={"x-amzn-ErrorType": kind,
                                      "x-amzn-RequestId": str(uuid.uuid4())})  # fmt: skip


class InFlight:
    """At most `cap` requests waiting on the bus at once.  A scheduler that is slow or gone
    makes each wait out its timeout (10 s a read, 30 s a write), so a burst would pile up
    tasks, subscriptions and sockets for nothing; beyond the cap a request is refused at once
    (a counter: the event loop is the only thread that takes and releases)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.count = 0

    def take(self) -> bool:
        if self.count >= self.cap:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1


def _reads_only(request: web.Request) -> bool:
    """Describe*, List* and Get*: a replay of one changes nothing, and an honest client polling
    twice within a second sends the very same signature."""
    operation = routes().get((request.method, request.path.rstrip("/"))) or ""
    return operation.startswith(("Describe", "List", "Get"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


class Endpoint:
    """`await Endpoint(bus, port).start()`; `url` once started; `await close()`.  `bus` is a
    connected `services.client.Bus`; port 0 takes a free one.

    With `keys` (access key id -> `roles.Key`, `roles.load_keys`) every request must be signed
    by one of them and is performed as its role over `nats_url` (`bus` is not used); only then
    may `host` be other than loopback."""

    def __init__(self, bus=None, port: int = 0, *, host: str = HOST,
                 keys: dict[str, Key] | None = None, nats_url: str | None = None,
                 http: HttpOptions | None = None):  # fmt: skip
        self.bus = bus
        self.port = port
        self.host = host
        self.keys = keys
        self.roles = RoleBuses(nats_url) if keys is not None and nats_url else None
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self.http = http or HttpOptions()
        self.guard = ConnectionGuard(self.http, self._refused_by_guard)
        self.throttle = Throttle(self.http.error_log_interval_s)
        self.replays = Replays()
        self.in_flight = InFlight(self.http.max_in_flight)

    async def start(self) -> Endpoint:
        if self.keys is None and not is_loopback(self.host):
            raise EndpointError(f"the AWS Batch endpoint does not check signatures without keys, "
                                f"so it serves loopback only, not {self.host}: give the keys "
                                "file `quotasched auth generate` writes")  # fmt: skip
        if (self.keys is None and self.bus is None) or (self.keys is not None and self.roles is None):
            raise EndpointError("the AWS Batch endpoint needs a bus, or keys and a NATS URL")
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self.guard.middleware])
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.port = await self._listen(app)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}"
        return self

    async def _listen(self, app: web.Application) -> int:
        try:
            sock = bind(self.host, self.port)
        except BindError as error:
            raise EndpointError(f"the AWS Batch endpoint cannot listen on {self.host}:{self.port}: "
                                f"{error.strerror or error}") from None  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.http.keepalive_timeout_s)  # fmt: skip
        await self._runner.setup()
        await self.guard.serve(self._runner, sock, self.host)
        return sock.getsockname()[1]

    def _log(self, level: str, event: str, kind: str = "", **fields) -> None:
        """At most one line per event and kind per QUOTASCHED_HTTP_ERROR_LOG_INTERVAL_S, the
        lines held back counted on the next (`held_back`)."""
        held = self.throttle.admit((level, event, kind))
        if held is not None:
            getattr(log, level)(event, **fields, **({"held_back": held} if held else {}))

    def _refused_by_guard(self, status: int, message: str) -> web.Response:
        self._log("info", "refused a request from a browser or a foreign host", str(status),
                  reason=message)  # fmt: skip
        return _error("AccessDeniedException", message, 403)

    async def close(self) -> None:
        await self.guard.close()
        for (level, event, kind), held in self.throttle.held().items():
            getattr(log, level)(event, kind=kind, held_back=held)  # what the interval held back
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.roles is not None:
            await self.roles.close()

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await self.guard.read_body(request)
        except web.HTTPException as error:
            return _error("ClientException", f"the request body cannot be read: {error}", 400)
        except (asyncio.TimeoutError, TimeoutError):
            refused = _error("RequestTimeoutException", f"the request body did not arrive within "
                             f"{self.http.body_timeout_s:g} s", 408)  # fmt: skip
            refused.force_close()
            return refused
        key = None
        claimed = None
        if self.keys is not None:
            headers = list(request.headers.items())
            try:
                key = self.keys[verify(request.method, f"{request.scheme}://{request.host}"
                                       f"{request.raw_path}", headers, body, self._secret_of)]  # fmt: skip
                if not _reads_only(request):  # a repeated read changes nothing: allowed
                    claimed = signature_of(headers)
                    if claimed is not None:
                        self.replays.claim(*claimed)
            except Unauthenticated as refused:
                self._log("info", "refused an unauthenticated request", refused.kind,
                          reason=refused.kind, peer=request.remote)  # fmt: skip
                return _error(refused.kind, refused.message, refused.status)
        try:
            answer = await self._answer(request, key, body)
        except RecursionError:  # a body nested past what a decoder or validator follows
            answer = _error("ClientException", "the request body is not valid JSON here: it "
                                               "nests too deeply", 400)  # fmt: skip
        except Exception as error:  # never aiohttp's bare 500 with a traceback
            self._log("error", "the AWS Batch endpoint failed a request", type(error).__name__,
                      error=repr(error))  # fmt: skip
            answer = _error("ServerException", f"{type(error).__name__}: the endpoint could not "
                                               "answer this request", 500)  # fmt: skip
        if claimed is not None and answer.status >= 400:  # nothing done: it may come again
            self.replays.release(claimed[0])
        return answer

    async def _answer(self, request: web.Request, key: Key | None, body: bytes) -> web.Response:
        if request.content_type not in JSON_TYPES:
            self._log("info", "refused a request that is not JSON", request.content_type,
                      content_type=request.content_type, peer=request.remote)  # fmt: skip
            return _error("ClientException", f"the request's Content-Type must be "
                          f"application/json, as the AWS SDKs send it, not "
                          f"{request.content_type!r}", 400)  # fmt: skip
        operation = routes().get((request.method, request.path.rstrip("/")))
        if operation is None:
            return _error("ClientException", f"no AWS Batch operation at {request.method} "
                                             f"{request.path}", 404)  # fmt: skip
        try:
            params = json.loads(body) if body.strip() else {}
        except ValueError as error:
            return _error("ClientException", f"the request body is not valid JSON: {error}", 400)
        except RecursionError:
            return _error("ClientException", "the request body is not valid JSON here: it nests "
                                             "too deeply", 400)  # fmt: skip
        if not isinstance(params, dict):
            return _error("ClientException", "the request body must be a JSON object", 400)
        problems = validation_errors(operation, params)
        if problems:
            return _error("ClientException", problems.replace("\n", " "), 400)
        if not self.in_flight.take():
            return self._refused_in_flight(operation)
        try:
            answer = await self._perform(key, operation, params)
        except Refused as refused:
            if refused.status == 429:
                self._log("warning", "the scheduler did not answer in time: answered 429",
                          operation=operation, reason=refused.message)  # fmt: skip
            return _error(refused.kind, refused.message, refused.status)
        except Denied as denied:
            self._log("warning", "NATS refused a request of the AWS Batch endpoint", operation,
                      role=denied.role, operation=operation, refused=str(denied))  # fmt: skip
            return _error("AccessDeniedException", denied.message(operation), 403)
        except Exception as error:  # never a hang or a bare 500: say what went wrong
            self._log("error", "the AWS Batch endpoint failed a request", type(error).__name__,
                      operation=operation, error=repr(error), exc_info=error)  # fmt: skip
            return _error("ServerException", f"{type(error).__name__}: {error}", 500)
        finally:
            self.in_flight.release()
        return web.json_response(conform(operation, answer),
                                 headers={"x-amzn-RequestId": str(uuid.uuid4())})

    def _refused_in_flight(self, operation: str) -> web.Response:
        """Answered without touching the bus: the cap protects the scheduler, and a throttle
        costs a counter and, at most once an interval, a log line."""
        self._log("warning", "too many requests waiting on the scheduler: answered 429",
                  operation=operation, in_flight=self.in_flight.count)  # fmt: skip
        refused = throttled(f"{self.in_flight.cap} requests are already waiting on the scheduler "
                            "(QUOTASCHED_HTTP_MAX_IN_FLIGHT)")  # fmt: skip
        return _error(refused.kind, refused.message, refused.status)

    def _secret_of(self, access_key_id: str) -> str | None:
        key = self.keys.get(access_key_id) if self.keys is not None else None
        return key.secret if key is not None else None

    async def _perform(self, key: Key | None, operation: str, params: dict) -> dict:
        """As the key's role (its own NATS connection), or with the endpoint's one bus."""
        if key is None:
            return await perform(self.bus, operation, params)
        try:
            bus = await self.roles.bus(key)
        except Exception as error:
            raise Refused(f"the endpoint cannot connect to NATS as {key.role}: {error}", 500,
                          "ServerException") from None  # fmt: skip
        return await bus.run(perform(bus, operation, params))
