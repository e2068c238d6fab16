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
"""

from __future__ import annotations

import ipaddress
import json
import socket
import uuid

from aiohttp import web

from quotasched.services import logs
from quotasched.services.endpoint.model import conform, routes, validation_errors
from quotasched.services.endpoint.operations import Refused, perform
from quotasched.services.endpoint.roles import Denied, Key, RoleBuses
from quotasched.services.endpoint.sigv4 import Unauthenticated, verify

log = logs.get("quotasched.endpoint")

HOST = "127.0.0.1"
MAX_BODY = 1024 * 1024  # SubmitServiceJob's payload is at most 10 KiB; the rest is smaller


class EndpointError(RuntimeError):
    """The endpoint could not start (its port is taken, say)."""


def _error(kind: str, message: str, status: int) -> web.Response:
    return web.json_response({"__type": kind, "message": message}, status=status,
                             headers={"x-amzn-ErrorType": kind,
                                      "x-amzn-RequestId": str(uuid.uuid4())})  # fmt: skip


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
                 keys: dict[str, Key] | None = None, nats_url: str | None = None):  # fmt: skip
        self.bus = bus
        self.port = port
        self.host = host
        self.keys = keys
        self.roles = RoleBuses(nats_url) if keys is not None and nats_url else None
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> Endpoint:
        if self.keys is None and not is_loopback(self.host):
            raise EndpointError(f"the AWS Batch endpoint does not check signatures without keys, "
                                f"so it serves loopback only, not {self.host}: give the keys "
                                "file `quotasched auth generate` writes")  # fmt: skip
        if (self.keys is None and self.bus is None) or (self.keys is not None and self.roles is None):
            raise EndpointError("the AWS Batch endpoint needs a bus, or keys and a NATS URL")
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.port = await self._listen(app)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}"
        return self

    async def _listen(self, app: web.Application) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as error:
            sock.close()
            raise EndpointError(f"the AWS Batch endpoint cannot listen on {self.host}:{self.port}: "
                                f"{error.strerror or error}") from None  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        return sock.getsockname()[1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.roles is not None:
            await self.roles.close()

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPException as error:
            return _error("ClientException", f"the request body cannot be read: {error}", 400)
        key = None
        if self.keys is not None:
            try:
                key = self.keys[verify(request.method, f"{request.scheme}://{request.host}"
                                       f"{request.raw_path}", list(request.headers.items()), body,
                                       self._secret_of)]  # fmt: skip
            except Unauthenticated as refused:
                log.info("refused an unauthenticated request", reason=refused.kind,
                         peer=request.remote)  # fmt: skip
                return _error(refused.kind, refused.message, refused.status)
        operation = routes().get((request.method, request.path.rstrip("/")))
        if operation is None:
            return _error("ClientException", f"no AWS Batch operation at {request.method} "
                                             f"{request.path}", 404)  # fmt: skip
        try:
            params = json.loads(body) if body.strip() else {}
        except ValueError as error:
            return _error("ClientException", f"the request body is not JSON: {error}", 400)
        if not isinstance(params, dict):
            return _error("ClientException", "the request body must be a JSON object", 400)
        problems = validation_errors(operation, params)
        if problems:
            return _error("ClientException", problems.replace("\n", " "), 400)
        try:
            answer = await self._perform(key, operation, params)
        except Refused as refused:
            return _error(refused.kind, refused.message, refused.status)
        except Denied as denied:
            log.warning("NATS refused a request of the AWS Batch endpoint", role=denied.role,
                        operation=operation, refused=str(denied))  # fmt: skip
            return _error("AccessDeniedException", denied.message(operation), 403)
        except Exception as error:  # never a hang or a bare 500: say what went wrong
            log.error("the AWS Batch endpoint failed a request", operation=operation,
                      error=repr(error), exc_info=error)  # fmt: skip
            return _error("ServerException", f"{type(error).__name__}: {error}", 500)
        return web.json_response(conform(operation, answer),
                                 headers={"x-amzn-RequestId": str(uuid.uuid4())})

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
