"""The local-process executor: each attempt is a real process on this machine.

The command line comes from the job's tags (`command`) or its payload
(`AlgorithmSpecification.ContainerEntrypoint` plus `ContainerArguments`, or a top-level
`Command` string).  Exit code 0 is SUCCEEDED, anything else FAILED with the code as reason.
Preemption or termination sends SIGTERM to the process group, then SIGKILL after the grace
period.  The environment carries QUOTASCHED_JOB_ID and QUOTASCHED_ATTEMPT.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal

from services.executors.base import Attempt, Executor, Publish


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


class ProcessExecutor(Executor):
    name = "process"

    def __init__(self, publish: Publish, grace_s: float = 10.0, workdir: str | None = None):
        super().__init__(publish)
        self.grace_s = grace_s
        self.workdir = workdir
        self.processes: dict[tuple[str, int], asyncio.subprocess.Process] = {}

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        argv = command_line(attempt.spec)
        env = {**os.environ, "QUOTASCHED_JOB_ID": attempt.job_id,
               "QUOTASCHED_ATTEMPT": str(attempt.attempt)}  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=self.workdir, env=env, start_new_session=True,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        key = (attempt.job_id, attempt.attempt)
        self.processes[key] = process
        code = await process.wait()  # a cancellation leaves the process to `interrupt`
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
