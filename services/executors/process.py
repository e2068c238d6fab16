"""The local-process executor: each attempt is a real process on this machine.

The command line comes from the job's tags (`command`) or its payload
(`AlgorithmSpecification.ContainerEntrypoint` plus `ContainerArguments`, or a top-level
`Command` string).  Exit code 0 is SUCCEEDED, anything else FAILED with the code as reason.
Preemption or termination sends SIGTERM to the process group, then SIGKILL after the grace
period: the executor's (`--grace`), or the job's own tag `grace` (seconds, for a checkpoint to
be saved), at most the operator's QUOTASCHED_PREEMPT_GRACE_MAX_S (`grace_for`).  The
environment carries QUOTASCHED_JOB_ID and QUOTASCHED_ATTEMPT.

A process runs in its own session, so it outlives its executor: a shutdown leaves it running
(unless `--stop-jobs`), and so does a SIGKILL.  The ledger keeps its pid and start time, and
the next executor follows it (base.Executor.recover): it watches that very process to its end
(a pidfd, else polling) and reports how it ended.  The process is a shell that supervises the
command: it waits on a pipe (its stdin) for the executor's go, so the command never runs
before the ledger has its pid (an executor killed before that closes the pipe, and the shell
exits, 125, without running anything); then it runs the command, outlives a SIGTERM to its
group until the command has ended, and writes the command's exit status to a file the ledger
names, so an attempt that ended while no executor ran is reported as it ended.  An attempt
whose process is gone without a status is reported FAILED, saying so.  An attempt an older
release started (its ledger entry names no exit file: an upgrade) is followed too while its
process runs, and reported FAILED when it ends (that release's process kept no exit status
anybody can read: the job's retryStrategy decides); one that ended before the upgrade is
reported lost.  The command's stdin is /dev/null.

The attempt is reported STARTING before its process is spawned (a failed spawn: FAILED next)
and RUNNING once the process exists.

Nothing of an attempt outlives it (contain.py): the gate shell is put in the attempt's cgroup
(or, without cgroups, the environment carries the attempt's marker) before the command runs,
and whatever the attempt started is killed when it ends, also when its main process exited by
itself, before the end is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable

from quotasched.services import logs
from quotasched.services.executors import jobenv
from quotasched.services.executors.base import (
    LOST, UNRECORDED, VANISHED, Attempt, Executor, Publish)
from quotasched.services.executors.contain import Containment, Support, check, remove_if_empty
from quotasched.services.executors.crash import crash_point
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


# `sh -c GATE sh EXIT_FILE <command...>`: wait for the executor's go (a line on stdin), then
# run the command and write its exit status to EXIT_FILE (`w`: a temporary file, then a
# rename, its directory made again if it is gone; nothing when EXIT_FILE is empty).  EOF (the
# executor died before its go) ends it unrun, and EXIT_FILE says "unrun": the next executor
# reports that the command never ran.  The trap keeps the shell through a SIGTERM to the group
# until the command has ended (a caught signal is reset to the default in the command, an
# ignored one would not be).  The shell's own stderr is /dev/null (it would add "Terminated" to
# the job's log); the command's is the attempt's (fd 3, closed in the command), set in a
# subshell that becomes the command (dash says "Terminated" on the stderr of a command's own
# redirection).
GATE = ('f=$1; shift; '
        'w() { [ -z "$f" ] || { mkdir -p "${f%/*}"; echo "$1" >"$f.tmp" && mv -f "$f.tmp" "$f"; }; }; '
        'read -r go || { w unrun; exit 125; }; trap : HUP INT TERM; exec 3>&2 2>/dev/null; '
        '( exec "$@" </dev/null 2>&3 3>&- ); c=$?; w "$c"; exit "$c"')
UNRUN = 256  # read_exit: the shell ended before its go (no exit status is 256 or more)
NEVER_RAN = ("Executor restarted before the attempt's command was let run: it never ran "
             "(the job's retryStrategy decides)")


GRACE_TAG = "grace"  # a job's own grace period, in seconds (bounded: ProcessExecutor.grace_for)


def asked_grace(spec: dict) -> float | None:
    """The seconds the job's tag `grace` asks for between SIGTERM and SIGKILL; None when it
    asks for none.  ValueError for a value that is not a number of seconds >= 0 ("inf": as
    long as the operator allows)."""
    asked = (spec.get("tags") or {}).get(GRACE_TAG)
    if asked is None:
        return None
    try:
        value = float(asked)
    except (TypeError, ValueError):
        value = math.nan
    if math.isnan(value) or value < 0:
        raise ValueError(f"the tag {GRACE_TAG}={str(asked)[:40]!r} is not a number of "
                         "seconds >= 0")  # fmt: skip
    return value


def outcome(code: int) -> tuple[str, str | None]:
    if code == UNRUN:
        return "FAILED", NEVER_RAN
    return ("SUCCEEDED", None) if code == 0 else ("FAILED", f"Process exited with code {code}")


def read_exit(path: str | None) -> int | None:
    """The exit status the attempt's shell wrote (UNRUN: it never let the command run), None
    without one (or an unreadable one)."""
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
        return UNRUN if text == "unrun" else int(text)
    except (OSError, ValueError):
        return None


class ProcessExecutor(Executor):
    name = "process"
    reports_progress = True  # STARTING before the spawn, RUNNING once the process exists
    follows_across_restarts = True

    def __init__(self, publish: Publish, grace_s: float = 10.0, workdir: str | None = None,
                 ledger: Ledger | None = None):  # fmt: skip
        super().__init__(publish, ledger)
        self.grace_s = grace_s
        self.workdir = workdir
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}  # started by this one
        # Each running attempt's first process, (pid, start time): its own or one it follows.
        self.leaders: dict[tuple[str, int], tuple[int, str | None]] = {}
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
    # The most a job's tag `grace` may ask for (QUOTASCHED_PREEMPT_GRACE_MAX_S; set by the
    # composition root): None, the tag is not read and every job gets `grace_s`.
    grace_max_s: float | None = None

    def grace_for(self, spec: dict, job_id: str | None = None) -> float:
        """The seconds between SIGTERM and SIGKILL for a job: its tag `grace` bounded by
        `grace_max_s`, else the executor's `grace_s` (also for a tag that is no number of
        seconds, which is logged: the job runs as it would without it)."""
        if self.grace_max_s is None:
            return self.grace_s
        try:
            asked = asked_grace(spec)
        except ValueError as error:
            log.warning(f"{error}: the executor's grace period is used", job_id=job_id,
                        grace_s=self.grace_s)  # fmt: skip
            return self.grace_s
        return self.grace_s if asked is None else min(asked, self.grace_max_s)

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

    def exit_file(self, attempt: Attempt, work_dir: str | None) -> str | None:
        """Where the attempt's shell writes the exit status: in the attempt's own directory
        when the job runs as another user (it cannot write the executor's), else beside the
        ledger; None without a ledger (nothing outlives this executor then)."""
        if self.ledger is None:
            return None
        if work_dir is not None:
            return os.path.join(work_dir, ".quotasched-exit")
        directory = self.ledger.path.removesuffix(".json") + ".exits"
        os.makedirs(directory, exist_ok=True)
        digest = hashlib.sha256(f"{attempt.job_id}\0{attempt.attempt}".encode()).hexdigest()
        return os.path.join(directory, digest[:32])

    async def adopt(self, attempt: Attempt) -> bool:
        """An attempt whose shell writes an exit status is followed, and so is an older
        release's (no exit file) while its process still runs: an upgrade costs it nothing
        but the exit status that release never kept."""
        entry = attempt.adopted
        return entry is not None and (entry.exit_file is not None or leader_alive(entry))

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        if attempt.adopted is not None:
            return await self._follow(attempt)
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
        exit_file = self.exit_file(attempt, cwd if user is not None else None)
        if exit_file is not None:  # a spawn of this attempt that died before its ledger entry
            with contextlib.suppress(FileNotFoundError):  # left one ("unrun"): not this one's
                os.unlink(exit_file)
        path = self.log_path(attempt)
        output = _open_log(path) if path is not None else None
        wait, go = os.pipe()  # the gate: the command runs once `go` has a line
        try:
            # Not asyncio's subprocess: its transport kills a child still running when it is
            # closed, and a shutdown leaves the attempt running.
            process = subprocess.Popen(
                ["/bin/sh", "-c", GATE, "sh", exit_file or "", *argv], cwd=cwd, env=env,
                start_new_session=True, stdin=wait, **spawn,
                stdout=output or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if output else subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            os.close(go)
            raise
        finally:
            os.close(wait)  # the process has its own copies of the descriptors
            if output is not None:
                output.close()
        key = (attempt.job_id, attempt.attempt)
        started = process_started(process.pid)
        self.processes[key] = process
        self.leaders[key] = (process.pid, started)
        self.containments[key] = containment
        try:
            containment.enter(process.pid)  # before the go: all the command starts is in it
            self.note(attempt, process.pid, started, exit_file)
            crash_point("attempt-recorded")
            os.write(go, b"go\n")  # the ledger has the pid: run the command
        except BrokenPipeError:
            pass  # the shell is gone already (killed): `wait` says how it ended
        finally:
            os.close(go)  # unless written, the shell exits unrun (the process ends as 125)
        crash_point("command-started")
        await self.report(attempt, "RUNNING")  # a cancellation leaves the process to `interrupt`
        self.noted_running(attempt)
        await until_ended(lambda: process.poll() is None, process.pid)
        self.processes.pop(key, None)
        self.leaders.pop(key, None)
        await self.end_processes(attempt)  # what it left running (a daemon) ends with it
        return outcome(process.returncode)

    async def _follow(self, attempt: Attempt) -> tuple[str, str | None]:
        """An attempt a previous executor started: watch its process to its end if it still
        runs, then report how it ended; RUNNING first if that one had not reported it and the
        command did run (it runs, or its exit status says it ran)."""
        entry = attempt.adopted
        key = (attempt.job_id, attempt.attempt)
        pid, started = entry.pid, entry.pid_started
        contained = left_containment(entry)
        if contained is not None:
            self.containments[key] = contained
        # An older release's entry does not say whether it reported RUNNING (it did, but for
        # a kill between the spawn and the report): never report it twice.
        unreported = not entry.running and entry.exit_file is not None
        if leader_alive(entry):
            self.leaders[key] = (pid, started)
            if unreported:
                await self.report(attempt, "RUNNING")
                self.noted_running(attempt)
                unreported = False
            await until_ended(lambda: process_alive(pid, started), pid)
            self.leaders.pop(key, None)
        code = read_exit(entry.exit_file)
        if unreported and code is not None and code != UNRUN:
            await self.report(attempt, "RUNNING")  # it ran while no executor watched
        await self.end_processes(attempt)
        if code is None:
            if entry.exit_file is None and pid is not None:
                return "FAILED", UNRECORDED
            return "FAILED", VANISHED if pid is not None else LOST
        return outcome(code)

    async def interrupt(self, attempt: Attempt) -> None:
        """SIGTERM to the attempt's process group and every other process of it; SIGKILL to
        all of it once the job's grace period (`grace_for`) is over, or once its main process
        has exited."""
        key = (attempt.job_id, attempt.attempt)
        process = self.processes.pop(key, None)
        leader = self.leaders.pop(key, None)
        containment = self.containments.get(key)
        if leader is not None:
            pid, started = leader
            if process is not None:
                alive = lambda: process.poll() is None  # noqa: E731 (reaps it once it ends)
            else:
                alive = lambda: started is not None and process_alive(pid, started)  # noqa: E731
            grace_s = self.grace_for(attempt.spec, attempt.job_id)
            await self._terminate(pid, alive, containment, grace_s)
        await self.end_processes(attempt)

    async def _terminate(self, group: int | None, alive: Callable[[], bool],
                         containment: Containment | None, grace_s: float) -> None:  # fmt: skip
        """SIGTERM to the attempt: to process group `group` while its leader is `alive` (never
        to the group of a leader that is gone: its number may be another's now) and to every
        other process of it; SIGKILL to the group once `grace_s` is over.  The rest of the
        attempt gets what is left of the grace; the caller then kills what survives
        (`Containment.kill_all`)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        leading = group is not None and alive()
        if leading:
            _killpg(group, signal.SIGTERM)
        if containment is not None:
            containment.signal(signal.SIGTERM, besides_group=group if leading else None)
        crash_point("victim-signalled")
        if leading and not await until_ended(alive, group, grace_s):
            _killpg(group, signal.SIGKILL)
            await until_ended(alive, group, 5.0)
        if containment is not None:
            await _until(lambda: not containment.alive(), grace_s - (loop.time() - began))

    def note(self, attempt: Attempt, pid: int | None = None, pid_started: str | None = None,
             exit_file: str | None = None) -> None:  # fmt: skip
        """The ledger's entry also names what contains the attempt (its cgroup, its marker)
        and where its exit status will be."""
        containment = self.containments.get((attempt.job_id, attempt.attempt))
        if self.ledger is None or containment is None:
            super().note(attempt, pid, pid_started)
            return
        self.ledger.record(Entry(attempt.job_id, attempt.attempt, attempt.job_queue,
                                 attempt.share, pid, pid_started, containment.path,
                                 containment.token, exit_file,
                                 dispatched_at=attempt.dispatched_at,
                                 gpus=self.gpus_of(attempt) or None))  # fmt: skip

    def gpus_of(self, attempt: Attempt) -> list[str]:
        """The GPUs the attempt holds (the GPU agent's; a plain process holds none)."""
        return []

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
        """Stop what an attempt of the previous executor left, as a preemption does
        (`_terminate`): the process group of its process, if that very process still runs
        (pid and start time), and everything in its cgroup or carrying its marker (ledgers
        older than containment name neither); then its cgroup is removed."""
        contained = left_containment(entry)
        grace_s = self.grace_for(self.specs.get(entry.job_id) or {}, entry.job_id)
        await self._terminate(entry.pid, lambda: leader_alive(entry), contained, grace_s)
        if contained is not None and await contained.kill_all():
            contained.cleanup()


def leader_alive(entry: Entry) -> bool:
    """Whether the process a ledger entry names still runs (the same pid and start time)."""
    return entry.pid is not None and entry.pid_started is not None and \
        process_alive(entry.pid, entry.pid_started)  # fmt: skip


def left_containment(entry: Entry) -> Containment | None:
    """What contains an attempt a previous executor left (its cgroup, if it is still there,
    and its marker); None for a ledger older than containment."""
    if not entry.token:
        return None
    cgroup = entry.cgroup if entry.cgroup and os.path.isdir(entry.cgroup) else None
    return Containment(cgroup, entry.token, entry.pid if leader_alive(entry) else None)


def _killpg(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


async def until_ended(alive: Callable[[], bool], pid: int,
                      wait_s: float | None = None) -> bool:  # fmt: skip
    """Until `alive()` is false (whether it is, after at most `wait_s`).  Woken by a pidfd of
    `pid` as soon as that process exits (Linux 5.3+), and `alive` asked again at least every
    few seconds (a pidfd of a pid already reused by another process is never readable); no
    pidfd: polled."""
    loop = asyncio.get_running_loop()
    deadline = None if wait_s is None else loop.time() + wait_s
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while alive():
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            step = 0.1 if fd is None else 5.0
            if fd is None:
                await asyncio.sleep(step if left is None else min(step, left))
                continue
            woken = loop.create_future()
            loop.add_reader(fd, lambda: woken.done() or woken.set_result(None))
            try:
                await asyncio.wait_for(woken, step if left is None else min(step, left))
            except (asyncio.TimeoutError, TimeoutError):
                pass
            finally:
                loop.remove_reader(fd)
        return True
    finally:
        if fd is not None:
            os.close(fd)


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
