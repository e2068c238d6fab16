"""Who a job runs as, and where: `--run-as USER` of the process executor and the GPU agent.

A job runs on the executor's host, so by default it runs as the executor's own user and can do
whatever that user can: read the executor's state directory (its ledger, the agent's records,
every attempt's log), read a credentials file the executor was started with, signal the
executor itself.  Two defences, one always on and one chosen by the operator:

- The executor makes itself non-dumpable when it starts (`harden_executor`, prctl
  PR_SET_DUMPABLE 0): a process of the same user that is not root can then no longer read
  `/proc/<executor>/environ`, `mem` or its file descriptors, where its own NATS credentials
  are.  It holds against a job of the same user; root reads them anyway.
- `--run-as USER` (`JobUser`): every attempt runs as USER (its primary group, no
  supplementary groups, umask 077), in a working directory of its own,
  `<work_dir>/<job>/<attempt>`, mode 0700 and owned by USER, which is also its HOME, removed
  once nothing of the attempt runs any more.  The executor must be root to switch users, and
  USER must not be root: both are refused at start in one line.  The executor then writes
  everything with umask 077 and keeps its state directory 0700; the work directory's parents
  are its own, 0711: a job cannot list other jobs' directories nor touch the executor's files
  (ledger, records, logs, credentials); it can still write where USER may write anyway
  (/tmp, USER's home).  All jobs share USER: a job can reach another running job's directory
  if it guesses its path, or signal that job's processes.  In a container (the GPU agent's
  --container-runtime) the runtime's client stays root and the container runs `--user
  UID:GID`.

It imports nothing of quotasched at module level: its tests load it into a Python that an
unprivileged user may run, to check the kernel's answers as that user.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pwd
import shutil
from dataclasses import dataclass
from typing import Any

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
PR_GET_DUMPABLE = 3


class JobUserError(ValueError):
    """`--run-as` cannot be honoured here: the reason, in one line."""


def harden_executor() -> bool:
    """Make this process non-dumpable (Linux): its environment, memory and descriptors are no
    longer readable through /proc by processes of the same user that are not root.  Returns
    whether it is (False where prctl is not there: not Linux)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    if not hasattr(libc, "prctl"):
        return False
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0


@dataclass(frozen=True)
class JobUser:
    """The user every attempt runs as, and the directory its attempts work in."""

    name: str
    uid: int
    gid: int
    work_dir: str

    @classmethod
    def resolve(cls, name: str, work_dir: str) -> JobUser:
        """USER by name or number; refused (JobUserError) where the switch cannot happen."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, OverflowError):
            raise JobUserError(f"--run-as {name}: no such user on this host") from None
        if entry.pw_uid == 0:
            raise JobUserError(f"--run-as {name}: a job may not run as root (uid 0); "
                               "name an unprivileged user")  # fmt: skip
        if os.geteuid() != 0:
            raise JobUserError(f"--run-as {name}: the executor runs as uid {os.geteuid()}, "
                               "and only root can start a job as another user")  # fmt: skip
        user = cls(entry.pw_name, entry.pw_uid, entry.pw_gid, os.path.abspath(work_dir))
        user.check_reach()
        return user

    def check_reach(self, target: str | None = None, setting: str = "--work-dir") -> None:
        """The user must be able to walk down to its working directories (or to `target`, its
        checkpoint directory): every existing parent searchable by it (the executor makes the
        rest).  JobUserError names the parent and the `setting` to change."""
        target = target or self.work_dir
        path = os.path.dirname(target)
        while True:
            if os.path.exists(path):
                mode = os.stat(path)
                if mode.st_uid == self.uid:
                    allowed = mode.st_mode & 0o100
                elif mode.st_gid == self.gid:
                    allowed = mode.st_mode & 0o010
                else:
                    allowed = mode.st_mode & 0o001
                if not allowed:
                    raise JobUserError(
                        f"--run-as {self.name}: the user cannot reach {target}: "
                        f"{path} is mode {mode.st_mode & 0o777:04o}; choose another {setting}")
            parent = os.path.dirname(path)
            if parent == path:
                return
            path = parent

    def describe(self) -> str:
        return f"jobs run as {self.name} (uid {self.uid}) in {self.work_dir}/<job>/<attempt>"

    def attempt_dir(self, job_id: str, attempt: int) -> str:
        """Create the attempt's working directory (0700, owned by the job's user) under
        parents only the executor may write, and return it.  A job id that cannot name a
        directory (only a log older than the contract's rule holds one) is a ValueError: the
        attempt fails with it, never escaping the work directory."""
        from quotasched.events.base import is_path_component  # (stdlib-only at import: below)

        if not is_path_component(job_id):
            raise ValueError(f"the job id {job_id[:60]!r} cannot name a working directory; "
                             "it is not run")  # fmt: skip
        job_dir = os.path.join(self.work_dir, job_id)
        for parent in (self.work_dir, job_dir):
            os.makedirs(parent, mode=0o711, exist_ok=True)
            os.chown(parent, 0, 0)
            os.chmod(parent, 0o711)  # traversable to one's own directory, never listable
        path = os.path.join(job_dir, str(attempt))
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chown(path, self.uid, self.gid)
        os.chmod(path, 0o700)
        return path

    def remove_attempt_dir(self, job_id: str, attempt: int) -> None:
        """Remove the attempt's working directory once nothing of the attempt runs (rmtree
        works through directory descriptors: a symlink the job left is removed, never
        followed), and the job's once it holds no attempt."""
        from quotasched.events.base import is_path_component

        if not is_path_component(job_id):
            return  # never made (attempt_dir refused it)
        job_dir = os.path.join(self.work_dir, job_id)
        shutil.rmtree(os.path.join(job_dir, str(attempt)), ignore_errors=True)
        try:
            os.rmdir(job_dir)
        except OSError:
            pass  # another attempt's directory is still there (or it is gone already)

    def spawn_options(self) -> dict[str, Any]:
        """The subprocess arguments that start the attempt's process as the user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o077}


def make_private(directory: str, traversable: bool = False) -> None:
    """The executor's own directory, once jobs run as another user: mode 0700 (0711 where a
    job's working directory lies below it), and the files directly in it 0600."""
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o711 if traversable else 0o700)
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                os.chmod(entry.path, 0o600)


def describe_default() -> str:
    """What the start line says when --run-as is not given."""
    return (f"jobs run as this executor's own user (uid {os.geteuid()}): a job can read and "
            "write what the executor can (its state directory, its logs); --run-as USER "
            "runs them as another user")  # fmt: skip
