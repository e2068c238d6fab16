"""Containment: nothing an attempt started outlives the attempt.

An attempt's process runs in a session of its own, and the executor stops it with signals to
that session's process group; a job that starts a child with `setsid` (or daemonizes: a double
fork) takes the child out of the group, and the child would live on after the attempt ended,
holding what the attempt held (its GPUs).  So every attempt is contained, one of two ways:

- **A cgroup v2 per attempt** (the strong way).  `check` finds the cgroup2 mount in
  /proc/self/mounts and the executor's own cgroup in /proc/self/cgroup, makes
  `<mount>/<own cgroup>/quotasched-<executor>/` and proves it can use it: a probe process is
  moved into a cgroup there and killed with `cgroup.kill` (Linux >= 5.14).  Each attempt gets
  `<that>/<job>-<attempt>-<token>`; its first process (the process executor's gate shell, before
  it `exec`s the command) is written to the cgroup's `cgroup.procs`, so everything the command
  ever starts is born in it, setsid or not.  `cgroup.kill` kills the whole cgroup at once, forks
  racing the kill included.  No controller is enabled anywhere: membership and `cgroup.kill`
  need none, so cgroup v2's "no internal processes" rule (a cgroup with controllers enabled for
  its children holds no processes itself) never applies: the executor's own cgroup holds
  processes and therefore enables none, and ours enable none either.  Under systemd give the
  executor's unit `Delegate=yes`, so that systemd leaves the sub-cgroups it did not make alone.
  A job running as root can write itself out of its cgroup, as it can do anything.
- **A marker** (the fallback, where no cgroup can be made: no cgroup2 mount, not root nor
  delegated, no `cgroup.kill`).  Each attempt's environment carries a random
  `QUOTASCHED_ATTEMPT_TOKEN`, which its children inherit; the attempt's processes are those
  whose /proc/<pid>/environ holds it, or whose session is the attempt's first process's.  A
  job that clears its environment (`env -i`) and leaves its session, or that makes itself
  unreadable to the executor (non-dumpable, another user, when the executor is not root),
  escapes the fallback.

Either way, when an attempt ends (its main process exited, whatever its code, or it was
preempted, terminated, found lost after a restart, or the executor shuts down) whatever of it
is still alive is killed, and the attempt counts as ended only once nothing of it is alive:
the process executor reports the end, and the GPU agent frees the GPUs, after that.  The
cgroup's path and the token are in the executor's ledger, so a restarted executor ends what a
killed one left (ledger.py).  Setting `QUOTASCHED_CONTAINMENT=marker` forces the fallback (the
tests use it; so can a host whose cgroups another manager owns).

An attempt in a container: its process is the runtime's client, which the cgroup holds; the
container itself is the runtime's (podman with cgroupfs, or dockerd, places it and conmon
elsewhere) and is stopped through the runtime (containers.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import subprocess
from dataclasses import dataclass

from quotasched.services import logs
from quotasched.services.executors.ledger import proc_stat

log = logs.get("quotasched.executor")

TOKEN_VARIABLE = "QUOTASCHED_ATTEMPT_TOKEN"
MODE_VARIABLE = "QUOTASCHED_CONTAINMENT"  # "marker": never a cgroup
KILL_WAIT_S = 10.0  # how long `kill_all` waits for the killed processes to be gone


@dataclass(frozen=True)
class Support:
    """How this host contains an executor's attempts: a cgroup each under `parent`, or (None)
    the marker, for `reason`."""

    parent: str | None
    reason: str = ""

    def describe(self) -> str:
        """The start line: what contains the attempts, and what can escape."""
        if self.parent is not None:
            return (f"containment: cgroup v2 per attempt at {self.parent}/<job>-<attempt>-<token> "
                    "(cgroup.kill)")
        return (f"containment: no cgroup v2 here ({self.reason}); falling back to a marker in "
                f"each attempt's environment ({TOKEN_VARIABLE}), its processes found in /proc "
                "and killed when it ends; a job that clears its environment and leaves its "
                "session can escape")  # fmt: skip


def check(owner: str) -> Support:
    """Whether this executor (`owner`, its consumer name) can give each attempt a cgroup;
    makes its parent cgroup and proves it with a probe process."""
    if os.environ.get(MODE_VARIABLE) == "marker":
        return Support(None, f"{MODE_VARIABLE}=marker")
    mount = cgroup2_mount()
    if mount is None:
        return Support(None, "no cgroup2 file system in /proc/self/mounts")
    own = own_cgroup()
    if own is None:
        return Support(None, "this process is in no cgroup v2 (/proc/self/cgroup)")
    parent = os.path.join(mount, own.lstrip("/"), f"quotasched-{_name(owner)}")
    try:
        _mkdir(parent)
    except OSError as error:
        return Support(None, f"cannot make {parent}: {error.strerror}")
    if not os.path.exists(os.path.join(parent, "cgroup.kill")):
        _rmdir(parent)
        return Support(None, "no cgroup.kill: Linux older than 5.14")
    problem = _probe(parent)
    if problem is not None:
        _rmdir(parent)
        return Support(None, problem)
    return Support(parent)


def cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1].replace("\\040", " ")
    except OSError:
        pass
    return None


def own_cgroup() -> str | None:
    """This process's cgroup v2 path (the `0::` line), relative to the mount."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip() or None
    except OSError:
        pass
    return None


def _probe(parent: str) -> str | None:
    """Move a throwaway process into a cgroup under `parent` and `cgroup.kill` it: the whole
    mechanism, once, at start.  None if it worked; otherwise why not."""
    cgroup = os.path.join(parent, f"probe-{os.getpid()}-{secrets.token_hex(4)}")
    process = subprocess.Popen(["/bin/sh", "-c", "read -r line"], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _mkdir(cgroup)
        _write(os.path.join(cgroup, "cgroup.procs"), str(process.pid))
        _write(os.path.join(cgroup, "cgroup.kill"), "1")
        process.wait(5)
        return None
    except OSError as error:
        return f"cannot use {parent}: {error.strerror}"
    except subprocess.TimeoutExpired:
        return f"cgroup.kill under {parent} killed nothing"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdin is not None:
            process.stdin.close()
        _rmdir(cgroup)


class Containment:
    """One attempt's processes: its cgroup (`path`), or without one its marker (`token`)."""

    def __init__(self, path: str | None, token: str, leader: int | None = None):
        self.path = path  # the attempt's cgroup directory (made by `enter`)
        self.token = token
        self.leader = leader  # its first process, whose session is the attempt's

    @classmethod
    def new(cls, support: Support, job_id: str, attempt: int) -> Containment:
        token = secrets.token_hex(16)
        path = None if support.parent is None else \
            os.path.join(support.parent, f"{_name(job_id)}-{attempt}-{token[:8]}")  # fmt: skip
        return cls(path, token)

    def environment(self) -> dict[str, str]:
        return {TOKEN_VARIABLE: self.token}

    def enter(self, pid: int) -> None:
        """Put `pid`, the attempt's first process (not yet running the command), in the
        attempt's cgroup: whatever it starts is born there.  Where that fails, this attempt
        is contained by its marker alone (said in the log)."""
        self.leader = pid
        if self.path is None:
            return
        try:
            _mkdir(os.path.dirname(self.path))
            _mkdir(self.path)
            _write(os.path.join(self.path, "cgroup.procs"), str(pid))
        except OSError as error:
            log.warning("attempt not in a cgroup: contained by its marker only", cgroup=self.path,
                        error=error.strerror)  # fmt: skip
            _rmdir(self.path)
            self.path = None

    def members(self) -> list[int]:
        """The pids of the attempt's live processes."""
        if self.path is not None:
            return self._in_cgroup(self.path)
        return self._marked()

    def alive(self) -> bool:
        return bool(self.members())

    def signal(self, sig: int, besides_group: int | None = None) -> None:
        """`sig` to every process of the attempt (its daemons too), but those of process group
        `besides_group`, which the caller signals itself (with killpg: once, atomically)."""
        for pid in self.members():
            stat = proc_stat(pid) if besides_group is not None else None
            if stat is not None and stat[2] == str(besides_group):
                continue
            try:
                os.kill(pid, sig)
            except OSError:
                pass  # gone meanwhile

    async def kill_all(self, wait_s: float = KILL_WAIT_S) -> bool:
        """SIGKILL every process of the attempt and wait until none is alive (at most
        `wait_s`); whether none is."""
        if self.path is not None and os.path.isdir(self.path):
            try:
                _write(os.path.join(self.path, "cgroup.kill"), "1")
            except OSError as error:
                log.error("cgroup.kill failed", cgroup=self.path, error=error.strerror)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            left = self.members()
            if not left:
                return True
            if loop.time() > deadline:
                log.error("processes of an ended attempt survive SIGKILL", pids=left,
                          cgroup=self.path)  # fmt: skip
                return False
            for pid in left:  # the marker's rounds; in a cgroup, whatever raced the kill
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            await asyncio.sleep(0.02)

    def cleanup(self) -> None:
        """Remove the attempt's cgroup (and any the job made inside it), once it is empty."""
        if self.path is None or not os.path.isdir(self.path):
            return
        for folder, _, _ in sorted(os.walk(self.path), key=lambda item: -len(item[0])):
            _rmdir(folder)

    # -- finding the attempt's processes ---------------------------------------------------------

    @staticmethod
    def _in_cgroup(path: str) -> list[int]:
        found: list[int] = []
        for folder, _, _ in os.walk(path):  # a job may make cgroups inside its own
            try:
                with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as handle:
                    found += [int(pid) for pid in handle.read().split()]
            except OSError:
                continue  # removed meanwhile
        return found

    def _marked(self) -> list[int]:
        """Processes carrying the token in their environment, or in the leader's session
        (zombies excluded: dead, only not yet reaped)."""
        needle = f"\0{TOKEN_VARIABLE}={self.token}\0".encode()
        found = []
        own = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == own:
                continue
            pid = int(entry)
            stat = proc_stat(pid)
            if stat is None or stat[0] == "Z":
                continue
            if self.leader is not None and stat[3] == str(self.leader):  # its session id
                found.append(pid)
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    environ = b"\0" + handle.read()
            except OSError:
                continue  # gone, or not ours to read
            if needle in environ:
                found.append(pid)
        return found


def _name(text: str) -> str:
    """A cgroup directory name from a job id or consumer name (no '/', no dots first)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".") or "_"


def _mkdir(path: str) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        pass


def remove_if_empty(cgroup: str) -> None:
    """Remove a cgroup directory nothing is in (an executor's parent, at its shutdown)."""
    _rmdir(cgroup)


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not there, or not empty (then it is said where it matters)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(text)
