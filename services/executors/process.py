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

Nothing of an attempt outlives it (contain.py): the gate shell is put in the attempt's cgroup
(or, without cgroups, the environment carries the attempt's marker) before the command runs,
and whatever the attempt started is killed when it ends, also when its main process exited by
itself, before the end is reported.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shlex
import shutil
import signal

from quotasched.services import logs
from quotasched.services.executors import jobenv
from quotasched.services.executors.base import Attempt, Executor, Publish
from quotasched.services.executors.contain import Containment, Support, check, remove_if_empty
from quotasched.services.executors.jobuser import JobUser, harden_executor
from quotasched.services.executors.ledger import Entry, Ledger, process_alive, process_started

log = logs.get("quotasched.executor")


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
        # Each running attempt's processes (contain.py), until nothing of it is alive.
        self.containments: dict[tuple[str, int], Containment] = {}
        self._support: Support | None = None
        # Its credentials live in its environment: no job of its own user may read them
        # through /proc (jobuser.py; a job running as root still can: --run-as).
        harden_executor()

    @property
    def support(self) -> Support:
        """How this executor contains its attempts: checked once (said in one log line)."""
        if self._support is None:
            self._support = check(self.consumer)
            log.info(self._support.describe(), consumer=self.consumer)
        return self._support

    async def recover(self) -> int:
        self.support  # noqa: B018 (the containment check, said at start)
        return await super().recover()

    async def close(self) -> None:
        """Stop and report the running attempts (base), each killed whole; then remove this
        executor's parent cgroup, if nothing is left in it."""
        await super().close()
        if self._support is not None and self._support.parent is not None:
            remove_if_empty(self._support.parent)

    # The operator's allow-list of the executor's variables a job also gets (`--pass-env`,
    # checked at start by jobenv.check_pass_env; set by the composition root).
    pass_env: tuple[str, ...] = ()
    # The user jobs run as (`--run-as`, jobuser.py; set by the composition root): None, this
    # executor's own user.
    job_user: JobUser | None = None

    def runs_as(self, attempt: Attempt) -> JobUser | None:
        """Who the attempt's process runs as (the GPU agent: the runtime's client stays the
        agent's, the container's process is the job user)."""
        return self.job_user

    def environment(self, attempt: Attempt, **fixed: str) -> dict[str, str]:
        """The attempt's process environment, built, never inherited (jobenv.py): no
        credential of the executor's; `fixed` adds what the executor sets (the GPU agent's
        CUDA_VISIBLE_DEVICES).  Raises JobEnvError (the attempt FAILS with it) when the
        payload's Environment asks for a variable no job may have."""
        return jobenv.build(os.environ, self.pass_env, attempt.spec, {
            "QUOTASCHED_JOB_ID": attempt.job_id, "QUOTASCHED_ATTEMPT": str(attempt.attempt),
            **fixed})  # fmt: skip

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
        containment = Containment.new(self.support, attempt.job_id, attempt.attempt)
        env = {**self.environment(attempt), **containment.environment()}
        cwd, spawn = self.workdir, {}
        user = self.runs_as(attempt)
        if user is not None:  # its own directory, which is also its HOME
            cwd = env["HOME"] = user.attempt_dir(attempt.job_id, attempt.attempt)
            spawn = user.spawn_options()
        if not _runnable(argv[0], cwd, env.get("PATH", os.defpath)):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
        path = self.log_path(attempt)
        output = _open_log(path) if path is not None else None
        wait, go = os.pipe()  # the gate: the command runs once `go` has a line
        try:
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", GATE, "sh", *argv, cwd=cwd, env=env,
                start_new_session=True, stdin=wait, **spawn,
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
        self.containments[key] = containment
        try:
            containment.enter(process.pid)  # before the go: all the command starts is in it
            self.note(attempt, process.pid, process_started(process.pid))
            os.write(go, b"go\n")  # the ledger has the pid: run the command
        except BrokenPipeError:
            pass  # the shell is gone already (killed): `wait` says how it ended
        finally:
            os.close(go)  # unless written, the shell exits unrun (the process ends as 125)
        await self.report(attempt, "RUNNING")  # a cancellation leaves the process to `interrupt`
        code = await process.wait()
        self.processes.pop(key, None)
        await self.end_processes(attempt)  # what it left running (a daemon) ends with it
        return ("SUCCEEDED", None) if code == 0 else ("FAILED", f"Process exited with code {code}")

    async def interrupt(self, attempt: Attempt) -> None:
        """SIGTERM to the attempt's process group and every other process of it; SIGKILL to
        all of it once the grace period is over, or once its main process has exited."""
        key = (attempt.job_id, attempt.attempt)
        process = self.processes.pop(key, None)
        containment = self.containments.get(key)
        loop = asyncio.get_running_loop()
        began = loop.time()
        if process is not None and process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            if containment is not None:
                containment.signal(signal.SIGTERM, besides_group=process.pid)
            try:
                await asyncio.wait_for(process.wait(), self.grace_s)
            except (asyncio.TimeoutError, TimeoutError):
                os.killpg(process.pid, signal.SIGKILL)
            if containment is not None:  # its other processes get what is left of the grace
                await _until(lambda: not containment.alive(), self.grace_s - (loop.time() - began))
        await self.end_processes(attempt)
        if process is not None:
            await process.wait()

    def note(self, attempt: Attempt, pid: int | None = None,
             pid_started: str | None = None) -> None:  # fmt: skip
        """The ledger's entry also names what contains the attempt (its cgroup, its marker)."""
        containment = self.containments.get((attempt.job_id, attempt.attempt))
        if self.ledger is None or containment is None:
            super().note(attempt, pid, pid_started)
            return
        self.ledger.record(Entry(attempt.job_id, attempt.attempt, attempt.job_queue,
                                 attempt.share, pid, pid_started, containment.path,
                                 containment.token))  # fmt: skip

    async def end_processes(self, attempt: Attempt) -> bool:
        """Kill whatever of the attempt is still alive and remove its cgroup; whether nothing
        of it is alive (then it is forgotten; otherwise it is tried again next time)."""
        key = (attempt.job_id, attempt.attempt)
        containment = self.containments.get(key)
        if containment is None:
            return True
        if not await containment.kill_all():
            return False
        containment.cleanup()
        self.containments.pop(key, None)
        user = self.runs_as(attempt)
        if user is not None:  # nothing of it runs any more: its scratch directory goes too
            user.remove_attempt_dir(attempt.job_id, attempt.attempt)
        return True

    async def end_lost(self, entry: Entry) -> None:
        """SIGTERM, then SIGKILL after the grace period, to what an attempt of the previous
        executor left: the process group of its process, if that very process still runs
        (pid and start time), and everything in its cgroup or carrying its marker (ledgers
        older than containment name neither); then its cgroup is removed."""

        def leader_alive() -> bool:
            return entry.pid is not None and entry.pid_started is not None and \
                process_alive(entry.pid, entry.pid_started)  # fmt: skip

        contained = None
        if entry.token:
            cgroup = entry.cgroup if entry.cgroup and os.path.isdir(entry.cgroup) else None
            leader = entry.pid if leader_alive() else None  # its session is the attempt's
            contained = Containment(cgroup, entry.token, leader)

        def alive() -> bool:
            return leader_alive() or (contained is not None and contained.alive())

        for sig, wait_s in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 5.0)):
            if not alive():
                break
            group = entry.pid if leader_alive() else None
            if group is not None:
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    group = None
            if contained is not None:
                contained.signal(sig, besides_group=group)
            await _until(lambda: not alive(), wait_s)  # not our children: polled
        if contained is not None and await contained.kill_all():
            contained.cleanup()


async def _until(condition, wait_s: float) -> None:
    """Poll `condition` until it holds, at most `wait_s`."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while not condition() and asyncio.get_running_loop().time() < deadline:
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
