"""The projector on its own thread and event loop, for processes that run other services too.

`store.apply` is synchronous (the projector never awaits inside a batch), so on a shared event
loop every batch would also stop the scheduler's loop for its whole length (~0.1 s at 10k
facts/s).  On its own thread, with its own NATS connection, only the projector waits: DuckDB
releases the GIL while it works.  `quotasched up` and `quotasched projector` both run it so.

    runner = ProjectorThread(url, "q.duckdb", on_exit=lambda error: ...)
    runner.start()      # blocks until it reads the log and answers requests; raises if it
                        # cannot start (file locked, not a projection of this log, ...)
    runner.stop()       # blocks until the store is closed; `runner.error` says why it ended
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from quotasched.services.nats.bus import connect
from quotasched.services.projector.service import Projector, ProjectorOptions


class ProjectorThread:
    def __init__(self, url: str, db_path: str, options: ProjectorOptions | None = None,
                 on_exit: Callable[[BaseException | None], None] | None = None):  # fmt: skip
        """`on_exit(error)` is called on the projector's thread when it ends (error None: it
        was stopped)."""
        self.url = url
        self.db_path = db_path
        self.options = options or ProjectorOptions()
        self.on_exit = on_exit
        self.projector: Projector | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()  # ready, or ended
        self._stop_requested = False
        self._thread = threading.Thread(target=self._main, name="projector", daemon=True)

    def start(self, timeout: float = 60.0) -> ProjectorThread:
        self._thread.start()
        if not self._started.wait(timeout):
            self.stop()
            raise TimeoutError(f"the projector did not start within {timeout:g} s")
        if self.error is not None:
            self._thread.join()
            raise self.error
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stop_requested = True
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # its loop has already closed
                pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as error:  # noqa: BLE001 (reported through `error` / on_exit)
            self.error = self.error or error
        finally:
            self._started.set()
            if self.on_exit is not None:
                self.on_exit(self.error)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            return
        nc = await connect(self.url, "quotasched-projector")
        try:
            self.projector = Projector(nc, self.db_path, self.options)
            task = asyncio.create_task(self.projector.run(self._stop))
            ready = asyncio.create_task(self.projector.ready.wait())
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            if self.projector.ready.is_set():
                self._started.set()
            await task
        finally:
            await nc.close()
