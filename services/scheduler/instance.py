"""A scheduler instance's identity across its restarts: `--instance-lock FILE`.

After a SIGKILL, a restarted scheduler waits for its dead predecessor's lease to run out
(`lease_ttl_s`): nobody can tell a dead leader from a slow one.  With an instance lock it can.
The process holds an exclusive `flock` on FILE for its whole life, and its lease names it by
a token kept in FILE.  The kernel drops a `flock` when its process dies, so a process that
gets the lock knows that every earlier holder of this token is gone, and a lease that names
this token is a dead process's: it is taken back at once (`Lease.acquire`, `reclaim`).

The token is written once, when the file is created, and read on every start: a file deleted
and created again (by hand, or by a second process while the first still runs) gets a new
token, and a lease naming the old one is never taken back by it (it runs out by itself).
Another lease holder is never touched.  The file must be on a local file system (`flock` over
NFS is not dependable) and belong to this instance alone: two instances on one host need two
files.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import socket
import time
from pathlib import Path

# A restarted process may find the lock still held for a moment by its dead predecessor's
# forked snapshot child (it exits on its own, its pipe's reader gone): wait that long.
DYING_HOLDER_WAIT_S = 10.0
TOKEN_BYTES = 16


class InstanceLockError(Exception):
    """The instance lock cannot be taken; the message names the file and the cause."""


class InstanceLock:
    def __init__(self, path: Path, wait_s: float = DYING_HOLDER_WAIT_S):
        self.path = Path(path)
        self.wait_s = wait_s
        self._fd: int | None = None
        self.token = ""

    @property
    def holder(self) -> str:
        """The lease holder this instance writes: its host and its file's token."""
        return f"instance-{socket.gethostname()}-{self.token}"

    def acquire(self) -> InstanceLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise InstanceLockError(f"instance lock {self.path}: {error.strerror}") from None
        try:
            self._lock(fd)
            self.token = self._token(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _lock(self, fd: int) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise InstanceLockError(f"instance lock {self.path}: {error.strerror}") from None
            if time.monotonic() >= deadline:
                raise InstanceLockError(
                    f"instance lock {self.path} is held by another running process: each "
                    "scheduler instance needs a lock file of its own")
            time.sleep(0.1)

    def _token(self, fd: int) -> str:
        """The file's token, written now if the file has none (a new file)."""
        raw = os.pread(fd, 256, 0).strip()
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if len(text) == 2 * TOKEN_BYTES and all(c in "0123456789abcdef" for c in text):
            return text
        if raw:
            raise InstanceLockError(f"instance lock {self.path} holds something other than "
                                    "an instance token; give a file of its own")
        token = secrets.token_hex(TOKEN_BYTES)
        os.pwrite(fd, f"{token}\n".encode(), 0)
        os.fsync(fd)
        return token

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
