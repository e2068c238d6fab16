"""The web view's HTTP side: an aiohttp server on loopback, read-only (GET only).

    GET /?queue=Q&share=S&offset=N&window=1h&job=J
                                         the page, its first state rendered here (render.py)
    GET /static/...                      its script, style and vendored Chart.js
    GET /api/queues                      {"jobQueues": [...], "position": last fact seen}
    GET /api/queue?name=Q[&share=S&offset=N&limit=L]
                                         shares (per unit: limit, inUse, borrowed, lent, ...),
                                         heads, and a page of each share's waiting jobs (of S
                                         alone from N, when S is given) with why each waits
    GET /api/waiting?name=Q&share=S&offset=N&limit=L
                                         a page of S's waiting jobs, in dispatch order
                                         (offset >= 0, limit 0-100, default 0 and 20)
    GET /api/activity?name=Q             recent dispatches, preemptions and ends (the log)
    GET /api/usage?name=Q&window=1h      instances in use per share and in all, step lines at
                                         the facts' times (the projection), or why none
    GET /api/job?id=J                    describe-service-job and the job's story (explain); J
                                         may be a job name
    GET /api/events                      Server-Sent Events: one `fact` event per fact

An error is `{"error": message}` with status 400 (a bad request, an unknown queue or job),
429 (a job search is already running: one at a time, `Retry-After` says when to ask again) or
503 (the scheduler does not answer, or the search ran past QUOTASCHED_HTTP_SEARCH_TIMEOUT_S).
A `Host` the view does not listen on (DNS rebinding) is refused 421, a foreign `Origin` 403;
slow, idle and surplus connections are closed (`services/http_guard.py`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web
from nats.errors import NoRespondersError

from quotasched.services import logs
from quotasched.services.client.commands import ClientError
from quotasched.services.endpoint.server import is_loopback
from quotasched.services.http_guard import BindError, ConnectionGuard, bind
from quotasched.services.nats.waits import cancel_and_wait
from quotasched.services.settings import HttpOptions
from quotasched.services.web import answers, render, usage
from quotasched.services.web.follow import Follower

log = logs.get("quotasched.web")

HOST = "127.0.0.1"
STATIC = Path(__file__).parent / "static"
HEARTBEAT_S = 15.0
BATCH_S = 0.1  # at most ten writes a second per page, whatever the rate of facts
SEARCH_RETRY_S = 2  # Retry-After of a search refused while another runs


class WebError(RuntimeError):
    """The web view could not start (its port is taken, or a host other than loopback)."""


def _json(value, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, headers={"Cache-Control": "no-store"})


class WebView:
    """`await WebView(bus, port).start()`; `url` once started; `await close()`.  `bus` is a
    connected `services.client.Bus` (its connection also asks the projector and reads the log);
    port 0 takes a free one."""

    def __init__(self, bus, port: int = 0, host: str = HOST, http: HttpOptions | None = None):
        self.bus = bus
        self.port = port
        self.host = host
        self.url: str | None = None
        self.follower = Follower(bus.js)
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None
        self.http = http or HttpOptions()
        self.guard = ConnectionGuard(self.http, self._refused_by_guard)
        # a search reads the whole log: one at a time, so a few pages cannot take the process
        self._searching = asyncio.Lock()

    @staticmethod
    def _refused_by_guard(status: int, message: str) -> web.Response:
        return web.Response(status=status, text=message + "\n")

    async def start(self) -> WebView:
        if not is_loopback(self.host):
            raise WebError(f"the web view serves loopback only, not {self.host}")
        app = web.Application(middlewares=[self.guard.middleware])
        app.router.add_get("/", self._page)
        app.router.add_static("/static/", STATIC, follow_symlinks=False)
        for path, handler in (("queues", self._queues), ("queue", self._queue),
                              ("waiting", self._waiting), ("activity", self._activity),
                              ("job", self._job), ("usage", self._usage),
                              ("events", self._events)):  # fmt: skip
            app.router.add_get(f"/api/{path}", handler)
        try:
            sock = bind(self.host, self.port)
        except BindError as error:
            raise WebError(f"the web view cannot listen on {self.host}:{self.port}: "
                           f"{error.strerror or error}") from None  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=1.0,
                                     keepalive_timeout=self.http.keepalive_timeout_s)  # fmt: skip
        await self._runner.setup()
        await self.guard.serve(self._runner, sock, self.host)
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        self._task = asyncio.create_task(self._follow())
        return self

    async def _follow(self) -> None:
        try:
            await self.follower.run()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the page still answers; it just is no longer pushed to
            log.error("the web view stopped following the fact log", error=repr(error))

    async def close(self) -> None:
        await self.guard.close()
        self.follower.close()
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- handlers ------------------------------------------------------------------------------

    async def _page(self, request: web.Request) -> web.Response:
        first = await self.first_state(request.query)
        return web.Response(text=render.page(first), content_type="text/html",
                            headers={"Cache-Control": "no-store"})  # fmt: skip

    async def first_state(self, query) -> dict:
        """What the page shows first, from the same answers as its JSON: the queue asked
        (`queue`, else the first), its shares and waiting jobs (`share` and `offset` page one
        share), the recent activity, the usage over `window`, and `job`'s story when asked.
        A read that fails leaves its part empty and says why (the script tries again)."""
        share, job = query.get("share", ""), query.get("job", "").strip()
        first: dict = {"queues": [], "queue": None, "share": share, "window":
                       query.get("window") if query.get("window") in usage.WINDOWS
                       else usage.DEFAULT_WINDOW, "job": job,
                       "position": self.follower.position, "view": None, "viewError": None,
                       "activity": [], "usage": None, "story": None}  # fmt: skip
        try:
            first["queues"] = (await answers.queues(self.bus))["jobQueues"]
            asked = query.get("queue")
            first["queue"] = (asked if asked in first["queues"]
                              else next(iter(first["queues"]), None))  # fmt: skip
            if first["queue"] is not None:
                first["view"] = await answers.queue(self.bus, first["queue"], share or None,
                                                    query.get("offset"), query.get("limit"))
        except ClientError as error:
            first["viewError"] = str(error)
        except (asyncio.TimeoutError, TimeoutError, NoRespondersError) as error:
            first["viewError"] = f"the scheduler did not answer: {error}"
        if first["queue"] is not None:
            first["activity"] = await self.follower.activity(first["queue"], self._name_of)
            first["usage"] = await usage.usage(self.bus.nc, first["queue"], first["window"],
                                               self.follower.last_at)  # fmt: skip
        if job:
            if self._searching.locked():
                first["story"] = {"error": "another job search is running; search again in a "
                                           "moment"}  # fmt: skip
            else:
                async with self._searching:
                    try:
                        first["story"] = await self._search(job)
                    except (ClientError, asyncio.TimeoutError, TimeoutError,
                            NoRespondersError) as error:  # fmt: skip
                        first["story"] = {"error": str(error)}
        return first

    async def _name_of(self, job_id: str) -> str | None:
        return await answers.job_name(self.bus, job_id)

    async def _answer(self, work) -> web.Response:
        try:
            return _json(await work)
        except ClientError as error:
            return _json({"error": str(error)}, 400)
        except (asyncio.TimeoutError, TimeoutError, NoRespondersError) as error:
            return _json({"error": f"the scheduler did not answer: {error}"}, 503)

    async def _queues(self, request: web.Request) -> web.Response:
        async def work():
            return {**await answers.queues(self.bus), "position": self.follower.position}

        return await self._answer(work())

    async def _queue(self, request: web.Request) -> web.Response:
        query = request.query
        return await self._answer(answers.queue(self.bus, query.get("name", ""),
                                                query.get("share") or None, query.get("offset"),
                                                query.get("limit")))  # fmt: skip

    async def _waiting(self, request: web.Request) -> web.Response:
        query = request.query
        if not query.get("name") or not query.get("share"):
            return _json({"error": "give a job queue and a quota share: "
                                   "/api/waiting?name=Q&share=S&offset=0&limit=20"}, 400)
        return await self._answer(answers.waiting(self.bus, query["name"], query["share"],
                                                  query.get("offset"), query.get("limit")))

    async def _activity(self, request: web.Request) -> web.Response:
        return _json({"events": await self.follower.activity(request.query.get("name", ""),
                                                             self._name_of)})  # fmt: skip

    async def _job(self, request: web.Request) -> web.Response:
        job_id = request.query.get("id", "").strip()
        if not job_id:
            return _json({"error": "give a job id: /api/job?id=JOB_ID"}, 400)
        if self._searching.locked():
            return web.json_response({"error": "another job search is running; ask again in a "
                                               "moment"}, status=429,
                                     headers={"Retry-After": str(SEARCH_RETRY_S),
                                              "Cache-Control": "no-store"})  # fmt: skip
        async with self._searching:
            return await self._answer(self._search(job_id))

    async def _search(self, job_id: str) -> dict:
        limit = asyncio.timeout(self.http.search_timeout_s)
        try:
            async with limit:
                return await answers.job(self.bus, self.bus.js, job_id)
        except TimeoutError:
            if not limit.expired():  # the scheduler's own silence: _answer says so
                raise
            raise TimeoutError(f"the search ran past {self.http.search_timeout_s:g} s "
                               "(QUOTASCHED_HTTP_SEARCH_TIMEOUT_S)") from None

    async def _usage(self, request: web.Request) -> web.Response:
        name = request.query.get("name", "")
        if not name:
            return _json({"error": "give a job queue: /api/usage?name=Q&window=1h"}, 400)
        return await self._answer(usage.usage(self.bus.nc, name, request.query.get("window", ""),
                                              self.follower.last_at))  # fmt: skip

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-store"})  # fmt: skip
        await response.prepare(request)
        inbox = self.follower.listen()
        try:
            await response.write(b"retry: 2000\nevent: hello\ndata: "
                                 + json.dumps({"position": self.follower.position}).encode()
                                 + b"\n\n")  # fmt: skip
            while True:
                try:
                    event = await asyncio.wait_for(inbox.get(), HEARTBEAT_S)
                except (asyncio.TimeoutError, TimeoutError):
                    await response.write(b": keep-alive\n\n")
                    continue
                events = [event]
                while events[-1] is not None and not inbox.empty():  # a burst: one write
                    events.append(inbox.get_nowait())
                closing = events[-1] is None  # the view is closing
                await response.write("".join(f"event: fact\ndata: {json.dumps(e)}\n\n"
                                             for e in events if e is not None).encode())
                if closing:
                    break
                await asyncio.sleep(BATCH_S)  # a burst of facts goes out in a few writes
        except ConnectionResetError:  # the page went away
            pass
        finally:
            self.follower.unlisten(inbox)
        return response
