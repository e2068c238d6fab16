"""The gate `quotasched up` runs: a child process of its own (a flood costs the gate's CPU, not
the scheduler's loop), started again if it ends while `up` runs, stopped with `up`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import structlog
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from quotasched.events.subjects import GATE_PING
from quotasched.services import logs
from quotasched.services.nats.embedded import die_with_parent

log = structlog.get_logger("quotasched.gate")

READY_WAIT_S = 20.0
RESTART_WAIT_S = 1.0
STOP_WAIT_S = 10.0


async def gate_ready(nc: Client, timeout: float = READY_WAIT_S) -> bool:
    """Whether a gate answers its ping within `timeout` seconds (asked again while none does)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        try:
            await nc.request(GATE_PING, b"", timeout=min(1.0, max(0.05, end - loop.time())))
            return True
        except (NoRespondersError, NatsTimeout, TimeoutError):
            await asyncio.sleep(0.1)
    return False


class GateProcess:
    """`quotasched gate --nats-url URL` as a child, with this process's environment (its
    credentials) and its stderr (one log)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.process: subprocess.Popen | None = None
        self._watch: asyncio.Task | None = None
        self._stopping = False

    def start(self) -> GateProcess:
        self._spawn()
        self._watch = asyncio.get_running_loop().create_task(self._keep())
        return self

    def _spawn(self) -> None:
        """The child logs at this process's level (`demo`'s WARNING, `up`'s INFO), unless
        QUOTASCHED_LOG_LEVEL says otherwise."""
        env = {**os.environ, "QUOTASCHED_NATS_URL": self.url}
        level = logs.configured_level()
        if level is not None:
            env.setdefault(logs.LEVEL_ENV, level)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "quotasched.services.cli.main", "gate", "--nats-url", self.url],
            stdin=subprocess.DEVNULL, env=env, preexec_fn=die_with_parent())  # fmt: skip

    async def _keep(self) -> None:
        """Start the gate again whenever it ends while `up` runs."""
        while not self._stopping:
            code = await asyncio.to_thread(self.process.wait)
            if self._stopping:
                return
            log.error("the gate ended; starting it again", exit_status=code,
                      wait_s=RESTART_WAIT_S)  # fmt: skip
            await asyncio.sleep(RESTART_WAIT_S)
            if not self._stopping:
                self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("the gate did not stop in time; killed", wait_s=STOP_WAIT_S)
                process.kill()
                await asyncio.to_thread(process.wait)
        if self._watch is not None:
            await self._watch
