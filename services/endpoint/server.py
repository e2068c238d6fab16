"""The HTTP side: an aiohttp server on loopback that routes each request by botocore's model
(`POST /v1/<operation>`), validates its JSON body with botocore's `ParamValidator`, performs it
(`operations`) and answers the model's output shape, or AWS's error shape: HTTP 400 (500 for
the server's own trouble) with `{"__type": "ClientException", "message": ...}` and the
`x-amzn-ErrorType` header, which the AWS CLI prints as `An error occurred (ClientException)
when calling the X operation: ...` (exit status 254).

Authentication: requests are SigV4-signed by the clients; on loopback any credentials are
accepted and the signature is not checked (as the embedded NATS server accepts any client).
"""

from __future__ import annotations

import json
import socket
import uuid

from aiohttp import web

from quotasched.services import logs
from quotasched.services.endpoint.model import conform, routes, validation_errors
from quotasched.services.endpoint.operations import Refused, perform

log = logs.get("quotasched.endpoint")

HOST = "127.0.0.1"
MAX_BODY = 1024 * 1024  # SubmitServiceJob's payload is at most 10 KiB; the rest is smaller


class EndpointError(RuntimeError):
    """The endpoint could not start (its port is taken, say)."""


def _error(kind: str, message: str, status: int) -> web.Response:
    return web.json_response({"__type": kind, "message": message}, status=status,
                             headers={"x-amzn-ErrorType": kind,
                                      "x-amzn-RequestId": str(uuid.uuid4())})  # fmt: skip


class Endpoint:
    """`await Endpoint(bus, port).start()`; `url` once started; `await close()`.  `bus` is a
    connected `services.client.Bus`; port 0 takes a free one."""

    def __init__(self, bus, port: int = 0):
        self.bus = bus
        self.port = port
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> Endpoint:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, self.port))
        except OSError as error:
            sock.close()
            raise EndpointError(f"the AWS Batch endpoint cannot listen on {HOST}:{self.port}: "
                                f"{error.strerror or error}") from None  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.port = sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        operation = routes().get((request.method, request.path.rstrip("/")))
        if operation is None:
            return _error("ClientException", f"no AWS Batch operation at {request.method} "
                                             f"{request.path}", 404)  # fmt: skip
        try:
            body = await request.read()
            params = json.loads(body) if body.strip() else {}
        except (ValueError, web.HTTPException) as error:
            return _error("ClientException", f"the request body is not JSON: {error}", 400)
        if not isinstance(params, dict):
            return _error("ClientException", "the request body must be a JSON object", 400)
        problems = validation_errors(operation, params)
        if problems:
            return _error("ClientException", problems.replace("\n", " "), 400)
        try:
            answer = await perform(self.bus, operation, params)
        except Refused as refused:
            return _error(refused.kind, refused.message, refused.status)
        except Exception as error:  # never a hang or a bare 500: say what went wrong
            log.error("the AWS Batch endpoint failed a request", operation=operation,
                      error=repr(error), exc_info=error)  # fmt: skip
            return _error("ServerException", f"{type(error).__name__}: {error}", 500)
        return web.json_response(conform(operation, answer),
                                 headers={"x-amzn-RequestId": str(uuid.uuid4())})
