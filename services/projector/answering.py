"""Answering requests: the projector's side of `qm.proj.<verb>` request/reply.

`AnsweringMixin` (a part of `service.Projector`, on its state) answers each request in its own
task: `position` on the event loop, the DuckDB verbs of `api.py` on a cursor of the projector's
connection in a worker thread (a bounded number at once, each interrupted after
`query_timeout_s`).  A failed request is answered with an error and never stops the projector.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import duckdb

from quotasched.services import logs
from quotasched.services.projector import API_PREFIX, api
from quotasched.services.projector.errors import ProjectorError

log = logs.get("quotasched.projector")


class AnsweringMixin:
    """The request/reply side of `Projector`; its state is made in `Projector.__init__`."""

    # -- answering -----------------------------------------------------------------------------

    async def _on_request(self, msg) -> None:
        # One task per request: a long query must not hold up the next request.
        task = asyncio.create_task(self._answer(msg))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _answer(self, msg) -> None:
        verb = msg.subject[len(API_PREFIX) + 1:]
        try:
            request = json.loads(msg.data) if msg.data else {}
            if not isinstance(request, dict):
                raise api.Refused("the request must be a JSON object")
            api.check_request(verb, request)
            if verb == "position":
                response = await self.describe_position()
            else:
                response = await self._query(verb, request)
        except (api.Refused, ValueError) as refused:
            response = api.error("ClientException", str(refused))
        except duckdb.InterruptException:
            response = api.error("QueryTimeout", f"the query ran longer than "
                                 f"{self.options.query_timeout_s:g} s and was interrupted")  # fmt: skip
        except duckdb.Error as failed:
            response = api.error("QueryFailed", str(failed))
        except Exception as failed:  # a request never takes the projector down
            log.warning("request failed", verb=verb, error=repr(failed))
            response = api.error("ServerException", f"{type(failed).__name__}: {failed}")
        if msg.reply:
            try:
                await msg.respond(api.encode(response, self.nc.max_payload - 512))
            except Exception as failed:  # the requester went away, the connection closed
                log.debug("reply not sent", verb=verb, error=repr(failed))

    async def describe_position(self) -> dict[str, Any]:
        stream_last = await self._stream_last_seq()
        return {"position": self.position, "streamLastSeq": stream_last,
                "lag": max(stream_last - self.position, 0), "factsApplied": self.facts_applied,
                "batches": self.batches, "applySeconds": round(self.apply_seconds, 6),
                "appliedAt": self.applied_at, "db": self.db_path}  # fmt: skip

    async def _query(self, verb: str, request: dict) -> dict[str, Any]:
        async with self._slots:
            if self.store is None or self._stopping:
                raise ProjectorError("the projector is stopping")
            # The cursor is made on the loop thread (never while a batch is applied: the
            # apply does not await), then used only by the worker thread.
            cursor = self.store.con.cursor()
            self._cursors.add(cursor)
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.options.query_timeout_s, cursor.interrupt)
            try:
                return await loop.run_in_executor(self._threads, api.run, cursor, verb, request)
            finally:
                timer.cancel()
                self._cursors.discard(cursor)
                cursor.close()

