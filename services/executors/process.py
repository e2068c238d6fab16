"""The local-process executor: each attempt is a real process on this machine.

The command line comes from the job's tags (`command`) or its payload
(`AlgorithmSpecification.ContainerEntrypoint` plus `ContainerArguments`, or a top-level
`Command` string).  Exit code 0 is SUCCEEDED, anything else FAILED with the code as reason.
Preemption or termination sends SIGTERM to the process group, then SIGKILL after the grace
period.  The environment carries QUOTASCHED_JOB_ID and QUOTASCHED_ATTEMPT.

A process runs in its own session, so it outlives an executor that is killed; the ledger keeps
its pid and start time, and the next executor stops it (same signals, same grace period)
before it reports the attempt lost (base.Executor.recover).  The command never runs before
the ledger has its pid: the process starts as a shell waiting on a pipe (its stdin) and `exec`s
the command once the executor has written the ledger; an executor killed before that closes
the pipe, and the shell exits (125) without running anything.  The command's stdin is
/dev/null.

The attempt is reported STARTING before its process is spawned (a failed spawn: FAILED next)
and RUNNING once the process exists.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shlex
import shutil
import signal

from quotasched.services.executors.base import Attempt, Executor, Publish
from quotasched.services.executors.ledger import Entry, Ledger, process_alive, process_started


def command_line(spec: dict) -> list[str]:
    tags = spec.get("tags") or {}
    if "command" in tags:
        return shlex.split(tags["command"])
    payload = spec.get("payload")
    if isinstance(payload, str):
        payload = json.loads(payload)
    if isinstance(payload, dict):
        if isinstance(payload.get("Command"), str):
            return shlex.split(payload["Command"])
        algorithm = payload.get("AlgorithmSpecification") or {}
        entrypoint = algorithm.get("ContainerEntrypoint")
        if entrypoint:
            return [*entrypoint, *(algorithm.get("ContainerArguments") or [])]
    raise ValueError("the job names no command (tag 'command' or payload Command/ContainerEntrypoint)")


# `sh -c GATE sh <command...>`: wait for the executor's go (a line on stdin), then become the
# command; EOF (the executor died before the ledger had the pid) ends it unrun.
GATE = 'read -r go || exit 125; exec "$@" </dev/null'


class ProcessExecutor(Executor):
    name = "process"
    reports_progress = True  # STARTING before the spawn, RUNNING once the process exists

    def __init__(self, publish: Publish, grace_s: float = 10.0, workdir: str | None = None,
                 ledger: Ledger | None = None):  # fmt: skip
        super().__init__(publish, ledger)
        self.grace_s = grace_s
        self.workdir = workdir
        self.processes: dict[tuple[str, int], asyncio.subprocess.Process] = {}

    def environment(self, attempt: Attempt) -> dict[str, str]:
        """The attempt's process environment (the GPU agent adds CUDA_VISIBLE_DEVICES)."""
        return {**os.environ, "QUOTASCHED_JOB_ID": attempt.job_id,
                "QUOTASCHED_ATTEMPT": str(attempt.attempt)}  # fmt: skip

    def argv(self, attempt: Attempt) -> list[str]:
        """The attempt's command line (the GPU agent may wrap it in a container's)."""
        return command_line(attempt.spec)

    def log_path(self, attempt: Attempt) -> str | None:
        """Where the attempt's stdout and stderr go; None: nowhere (this executor keeps no
        logs; the GPU agent keeps one file per attempt)."""
        return None

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        await self.report(attempt, "STARTING")
        argv = self.argv(attempt)
        env = self.environment(attempt)
        if not _runnable(argv[0], self.workdir, env.get("PATH", os.defpath)):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        path = self.log_path(attempt)
        output = _open_log(path) if path is not None else None
        wait, go = os.pipe()  # the gate: the command runs once `go` has a line
        try:
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", GATE, "sh", *argv, cwd=self.workdir, env=env,
                start_new_session=True, stdin=wait,
                stdout=output or asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.STDOUT if output else asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            os.close(go)
            raise
        finally:
            os.close(wait)  # the process has its own copies of the descriptors
            if output is not None:
                output.close()
        key = (attempt.job_id, attempt.attempt)
        self.processes[key] = process
        try:
            self.note(attempt, process.pid, process_started(process.pid))
            os.write(go, b"go\n")  # the ledger has the pid: run the command
        except BrokenPipeError:
            pass  # the shell is gone already (killed): `wait` says how it ended
        finally:
            os.close(go)  # unless written, the shell exits unrun (the process ends as 125)
        await self.report(attempt, "RUNNING")  # a cancellation leaves the process to `interrupt`
        code = await process.wait()
        self.processes.pop(key, None)
        return ("SUCCEEDED", None) if code == 0 else ("FAILED", f"Process exited with code {code}")

    async def interrupt(self, attempt: Attempt) -> None:
        process = self.processes.pop((attempt.job_id, attempt.attempt), None)
        if process is None or process.returncode is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.grace_s)
        except (asyncio.TimeoutError, TimeoutError):
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    async def end_lost(self, entry: Entry) -> None:
        """SIGTERM, then SIGKILL after the grace period, to the process group of a process the
        previous executor started, if that very process still runs (pid and start time)."""
        if entry.pid is None or entry.pid_started is None:
            return
        for sig, wait_s in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 5.0)):
            if not process_alive(entry.pid, entry.pid_started):
                return
            try:
                os.killpg(entry.pid, sig)
            except ProcessLookupError:
                return
            # Not a child of this process: poll until it is gone (or a zombie of init's).
            for _ in range(max(1, int(wait_s / 0.05))):
                if not process_alive(entry.pid, entry.pid_started):
                    return
                await asyncio.sleep(0.05)


def _runnable(command: str, cwd: str | None, path: str) -> bool:
    """Whether `command` names an executable (the shell's `exec` would fail with 126/127: this
    says it as the spawn itself used to, FileNotFoundError)."""
    if os.sep in command:
        return os.access(os.path.join(cwd or "", command), os.X_OK)
    return shutil.which(command, path=path) is not None


def _open_log(path: str):
    """The attempt's log file, appended to (a retried attempt has its own file)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return open(path, "ab")
