"""The composition root: wire the server, the scheduler, the projector and an executor into one
running stack.

`quotasched up`, `quotasched scheduler`, `quotasched projector`, `quotasched executor` and
`quotasched demo` all start through here, so there is one place that decides what runs and in
which order: server, scheduler, projector (optional), executor; stopped in the reverse order.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from quotasched.services import logs
from quotasched.services.nats.bus import connect, ensure_streams
from quotasched.services.datadir import DataDirLock
from quotasched.services.nats.embedded import EmbeddedServer
from quotasched.services.metrics import MetricsEndpoint, ProjectorPart, SchedulerPart, WriterStats
from quotasched.services.scheduler.instance import InstanceLock
from quotasched.services.scheduler.service import Scheduler
from quotasched.services.storage_watch import StorageWatch
from quotasched.services.settings import Settings

if TYPE_CHECKING:
    from quotasched.services.projector.service import Projector
    from quotasched.services.projector.thread import ProjectorThread

# The projector (DuckDB) and the executors (FastStream) are imported where a stack runs them:
# `quotasched scheduler` needs neither, and a restarted scheduler is deciding sooner without
# their 0.15-0.2 s of imports (2026-12-04, this 2-core machine).

log = logs.get("quotasched.runtime")


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM stop the stack (said in one line, so a stop that does not end shows
    whether it began); SIGUSR1 writes every thread's stack (faulthandler, cli/main.py) and
    then every asyncio task's, which shows what a stop that does not end is waiting for."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stopping, stop, sig)
    if hasattr(signal, "SIGUSR1"):
        import faulthandler

        # the loop's handler replaces faulthandler's, which then goes first again, chained
        registered = faulthandler.unregister(signal.SIGUSR1)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        if registered:
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)


def _stopping(stop: asyncio.Event, sig: int) -> None:
    if not stop.is_set():
        log.info("stopping", signal=signal.Signals(sig).name)
    stop.set()


def dump_tasks() -> None:
    """Every asyncio task of this loop with its stack, on stderr."""
    tasks = asyncio.all_tasks()
    print(f"{len(tasks)} asyncio tasks (most recent call last):", file=sys.stderr, flush=True)
    for task in tasks:
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


class Stack:
    """Everything `quotasched up` runs, as an async context manager."""

    def __init__(self, settings: Settings, *, port: int | None = None, executor: str = "simulated",
                 speed: float = 1.0, scheduler: bool = True, projector_db: str | None = None,
                 projector_required: bool = False, executor_name: str | None = None,
                 executor_state_dir: str | None = None,
                 executor_job_queue: str | None = None,
                 data_lock: DataDirLock | None = None,
                 aws_port: int | None = None, agent=None,
                 web_port: int | None = None, stop_jobs: bool = False,
                 gate: bool = False):  # fmt: skip
        """`projector_db`: run a projector writing that DuckDB file.  If it stops on a fact it
        cannot apply, the rest of the stack runs on (the projection is disposable; the
        scheduler does not depend on it) and `failed` holds the error, unless
        `projector_required` (`quotasched projector`), which stops the whole stack.
        `data_lock`: the data directory's lock `up` holds; the embedded server inherits it,
        so the store stays locked while the server lives.  `aws_port`: serve the AWS Batch
        endpoint on loopback at that port (0: a free one; None: not at all); `web_port`, the
        live web view (services/web) likewise.  `agent`: the
        GPU agent's options (services/executors/agent.py), with executor "agent".
        `stop_jobs`: stopping the stack stops the running attempts and reports them FAILED
        (by default the executors that can leave them running for the next start to follow).
        `gate`: run the admission gate (services/gate) as a child process, open before the
        stack is ready."""
        self.settings = settings
        self.port = port
        self.executor_kind = executor
        self.executor_name = executor_name
        self.executor_state_dir = executor_state_dir  # its ledger (services/executors/ledger.py)
        self.executor_job_queue = executor_job_queue  # serve that job queue only
        self.agent = agent  # AgentOptions, when the executor is the GPU agent
        self.data_lock = data_lock
        self.speed = speed
        self.stop_jobs = stop_jobs
        self.with_scheduler = scheduler
        self.with_gate = gate
        self.url = settings.nats_url
        self.server: EmbeddedServer | None = None
        self.scheduler: Scheduler | None = None
        self.projector_db = projector_db
        self.projector_required = projector_required
        self.projector: Projector | None = None
        self.failed: BaseException | None = None  # why the projector stopped, if it did
        self.metrics: MetricsEndpoint | None = None  # GET /metrics, /healthz (metrics_port)
        self.aws_port = aws_port
        self.endpoint = None  # the AWS Batch endpoint (services/endpoint), when aws_port is set
        self.web_port = web_port
        self.web = None  # the live web view (services/web), when web_port is set
        self._nc = None
        self.stop = asyncio.Event()
        self._exit = AsyncExitStack()
        self._task: asyncio.Task | None = None
        self._projector_runner: ProjectorThread | None = None

    async def __aenter__(self) -> Stack:
        try:
            return await self._start()
        except BaseException:
            self.stop.set()  # `async with` does not call __aexit__ when __aenter__ fails
            await self._exit.aclose()
            raise

    async def _start(self) -> Stack:
        if self.url is None:
            self._start_server()
        nc = self._nc = await connect(self.url, "quotasched-scheduler")
        self._exit.push_async_callback(nc.close)
        await ensure_streams(nc.jetstream(), self.settings)
        if self.with_gate:  # its own process, starting while the scheduler does
            from quotasched.services.gate.process import GateProcess

            self._exit.push_async_callback(GateProcess(self.url).start().stop)
        if self.with_scheduler:
            holder = None
            if self.settings.instance_lock:  # QUOTASCHED_INSTANCE_LOCK (scheduler/instance.py)
                lock = InstanceLock(Path(self.settings.instance_lock)).acquire()
                self._exit.callback(lock.release)
                holder = lock.holder
            self.scheduler = Scheduler(nc, self.settings, holder, reclaim=holder is not None)
            self._task = asyncio.create_task(self.scheduler.run(self.stop))
            self._task.add_done_callback(self._scheduler_ended)
            self._exit.push_async_callback(self._stop_scheduler)
            await self.expose(self.scheduler)
            await self._until_leading()
            if self.server is not None:
                self._watch_storage(self.scheduler)
        if self.projector_db is not None:
            await self._start_projector()
        if self.executor_kind != "none":
            from faststream.nats import NatsBroker

            from quotasched.services.executors.app import build_executor, catch_up
            from quotasched.services.nats.credentials import broker_options

            broker = NatsBroker(self.url.split(","), logger=None, **broker_options())
            if self.executor_kind == "agent":
                from quotasched.services.executors.agent import build_agent

                executor = await build_agent(broker, nc, self.agent, self.executor_state_dir)
            else:
                executor = build_executor(broker, self.executor_kind, speed=self.speed,
                                          name=self.executor_name,
                                          state_dir=self.executor_state_dir,
                                          job_queue=self.executor_job_queue)  # fmt: skip
            executor.pass_env = self.settings.pass_env  # what a job also gets (jobenv.py)
            executor.stop_jobs = self.stop_jobs
            if self.settings.run_as is not None:
                self._run_jobs_as(executor)
            await catch_up(nc.jetstream(), executor, on_fatal=self._executor_lost)
            self._exit.push_async_callback(executor.watch.stop)  # also if the start fails
            await broker.start()  # its subscriber creates (or resumes) the durable consumer
            self._exit.push_async_callback(broker.stop)
            self._exit.push_async_callback(executor.close)  # first: reports while connected
            await executor.watch.first_look()  # now it knows how to recreate it if deleted
            await executor.recover()
            if self.executor_kind == "agent":
                await executor.join()  # advertised only once what a crash left is stopped
        if self.aws_port is not None:
            await self._start_endpoint()
        if self.web_port is not None:
            await self._start_web()
        if self.with_gate:
            from quotasched.services.gate.process import gate_ready

            if not await gate_ready(nc):
                log.warning("the admission gate is not open yet; teams' commands wait for it")
        return self

    def _run_jobs_as(self, executor) -> None:
        """`--run-as`: the jobs run as that user (jobuser.py), and everything this process
        writes from now on (ledger, records, logs) is its own alone: umask 077, the files
        already in its state directory made private, the directory traversable only (the
        work directory may be inside), the logs directory private."""
        from quotasched.services.executors.jobuser import JobUser, make_private

        state_dir = self.executor_state_dir or ".quotasched"
        work_dir = self.settings.job_work_dir or os.path.join(state_dir, "work")
        executor.job_user = JobUser.resolve(self.settings.run_as, work_dir)
        os.umask(0o077)
        make_private(state_dir, traversable=True)
        if self.agent is not None and self.agent.logs_dir:
            make_private(self.agent.logs_dir)

    async def _start_endpoint(self) -> None:
        """The AWS Batch endpoint, last: by then a request finds the whole stack running."""
        from quotasched.services.endpoint.server import Endpoint

        self.endpoint = await Endpoint(await self._bus("quotasched-aws-endpoint"),
                                       self.aws_port).start()  # fmt: skip
        self._exit.push_async_callback(self.endpoint.close)

    async def _start_web(self) -> None:
        """The live web view, read-only on loopback, over its own connection."""
        from quotasched.services.web import WebView

        self.web = await WebView(await self._bus("quotasched-web"), self.web_port).start()
        self._exit.push_async_callback(self.web.close)

    async def _bus(self, name: str):
        """A connected client `Bus` of its own, closed when the stack stops."""
        from quotasched.services.client import Bus

        bus = Bus(self.url, name=name)
        await bus.__aenter__()
        self._exit.push_async_callback(bus.close)
        return bus

    def _start_server(self) -> None:
        lock = self.data_lock
        self.server = EmbeddedServer(self.settings.data_dir, self.port,
                                     inherit_fds=[lock.fileno()] if lock else []).start()
        self._exit.callback(self.server.stop)
        if lock is not None:
            lock.record_server(self.server.process.pid)
        self.url = self.server.url
        self.settings = self.settings.model_copy(update={"nats_url": self.url})

    def _watch_storage(self, scheduler: Scheduler) -> None:
        """Watch the data directory's disk; after the store was reported full or the disk
        short of space, restart the embedded server once space is back but the scheduler
        still cannot write (services/storage_watch.py)."""
        settings = self.settings
        # a couple of the scheduler's tries: its pause, a lease, an append and its diagnosis
        grace = 2 * (settings.lease_ttl_s + 2 * settings.publish_timeout_s) + 5
        watch = StorageWatch(settings.data_dir, lambda: scheduler.health.storage_full,
                             scheduler.leading.is_set, self._restart_server, grace)  # fmt: skip
        task = asyncio.create_task(watch.run(self.stop))

        async def stop_watch() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        self._exit.push_async_callback(stop_watch)  # before the server is stopped

    async def _restart_server(self) -> None:
        """Stop the embedded server cleanly and start it again on the same port and store."""
        await self.server.restart()
        if self.data_lock is not None:
            try:
                self.data_lock.record_server(self.server.process.pid)
            except OSError as error:  # the lock file's disk may still be short of space
                log.warning("the data directory's lock does not name the new server's pid",
                            error=str(error))  # fmt: skip

    async def _start_projector(self) -> None:
        from quotasched.services.projector.service import ProjectorOptions
        from quotasched.services.projector.thread import ProjectorThread

        # Its own thread and event loop: a batch's apply blocks its loop, not the scheduler's.
        loop = asyncio.get_running_loop()

        def ended(error: BaseException | None) -> None:  # on the projector's thread
            try:
                loop.call_soon_threadsafe(self._projector_ended, error)
            except RuntimeError:  # this loop is gone: the stack has stopped
                pass

        runner = ProjectorThread(self.url, self.projector_db, ProjectorOptions(), on_exit=ended)
        self._projector_runner = runner
        self._exit.push_async_callback(self._stop_projector)
        await asyncio.to_thread(runner.start)  # raises why it could not start
        self.projector = runner.projector
        endpoint = await self._metrics()
        if endpoint is not None:
            endpoint.add(ProjectorPart(runner, self._nc.jetstream()))

    async def expose(self, scheduler: Scheduler, labelled: bool = False) -> None:
        """Serve a scheduler's metrics and health on the metrics port, when one is set (also
        for a scheduler run outside the stack, as `quotasched scheduler` does); `labelled`:
        one of several partitions of this process."""
        endpoint = await self._metrics()
        if endpoint is not None:
            scheduler.stats = WriterStats()  # its per-batch counts, read by the endpoint
            endpoint.add(SchedulerPart(scheduler, labelled))

    async def _metrics(self) -> MetricsEndpoint | None:
        if self.settings.metrics_port is None:
            return None
        if self.metrics is None:
            endpoint = MetricsEndpoint(self.settings.metrics_host, self.settings.metrics_port)
            self.metrics = await endpoint.start()
            self._exit.push_async_callback(endpoint.close)
        return self.metrics

    def _projector_ended(self, error: BaseException | None) -> None:
        if error is None or self.failed is not None or self.projector is None:
            return  # stopped, already reported, or it never started (start() raises that)
        self.failed = error
        if self.projector_required:
            self.stop.set()
        elif not self.stop.is_set():
            log.error("the projector stopped; the scheduler and the executor run on",
                      db=self.projector_db, error=str(error))  # fmt: skip

    def _executor_lost(self, error: BaseException) -> None:
        """The executor's consumer is gone for good (watch.py said why): stop, non-zero."""
        self.failed = self.failed or error
        self.stop.set()

    async def _stop_projector(self) -> None:
        runner = self._projector_runner
        if runner is not None:
            await asyncio.to_thread(runner.stop)
            self.failed = self.failed or runner.error

    async def _until_leading(self) -> None:
        """Until the scheduler leads, or raise what stopped it first (a log it refuses to
        start on, ModeConflict or LogIncomplete: the caller says it in one line)."""
        leading = asyncio.ensure_future(self.scheduler.leading.wait())
        try:
            await asyncio.wait({leading, self._task}, timeout=self.settings.lease_ttl_s * 3,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            leading.cancel()
        if self._task.done() and not self._task.cancelled() and self._task.exception():
            raise self._task.exception()
        if not self.scheduler.leading.is_set():
            raise TimeoutError("the scheduler did not lead in time")

    def _scheduler_ended(self, task: asyncio.Task) -> None:
        """The scheduler's loop ended: fine when the stack stops; an error otherwise, said
        at once (not when `up` is stopped, maybe days later), and the stack stops, non-zero:
        nothing would decide commands any more."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        self.failed = self.failed or error
        log.error("the scheduler stopped on an error; stopping", error=repr(error),
                  exc_info=error)  # fmt: skip
        self.stop.set()

    async def _stop_scheduler(self) -> None:
        self.stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)  # _scheduler_ended said it

    async def __aexit__(self, *exc_info) -> None:
        self.stop.set()
        await self._exit.aclose()


async def serve(settings: Settings, *, port: int | None, executor: str, speed: float,
                announce: Callable[[str], None], projector_db: str | None = None,
                data_lock: DataDirLock | None = None, aws_port: int | None = None,
                agent=None, web_port: int | None = None, stop_jobs: bool = False) -> int:  # fmt: skip
    """Run until SIGINT/SIGTERM; the first thing announced is the NATS URL, then (with
    `aws_port`) `AWS_ENDPOINT_URL_BATCH=<the AWS Batch endpoint's URL>`, then (with `web_port`)
    `WEB=<the live web view's URL>`.  Returns the exit
    status: 1 if the projector stopped on a fact it could not apply, else 0.  `data_lock`:
    the lock of settings.data_dir, taken by the caller before anything touched it."""
    # The executor's ledger sits beside the streams: `up` again on the same data directory ends
    # the attempts a killed `up` left running (services/executors/ledger.py).
    async with Stack(settings, port=port, executor=executor, speed=speed,
                     projector_db=projector_db, executor_state_dir=settings.data_dir,
                     data_lock=data_lock, aws_port=aws_port, agent=agent,
                     web_port=web_port, stop_jobs=stop_jobs, gate=True) as stack:  # fmt: skip
        stop_on_signals(stack.stop)  # before the announcement: a SIGTERM after it stops cleanly
        announce(stack.url)
        if stack.endpoint is not None:
            announce(f"AWS_ENDPOINT_URL_BATCH={stack.endpoint.url}")
        if stack.web is not None:
            announce(f"WEB={stack.web.url}")
        await stack.stop.wait()
    log.info("stopped")
    return 1 if stack.failed is not None else 0
