"""`quotasched up`'s data directory: checked, then locked, before anything touches the store.

Two `up`s on one directory start two nats-servers on one JetStream file store, and commands
one of them acknowledges are lost (issue 17, point 3).  So `up` takes an exclusive `flock` on
`<data-dir>/up.lock` first, before its nats-server starts and before the projector opens
DuckDB, and a second `up` is refused with the holder's pid.  The kernel releases a `flock`
when every descriptor of it is closed: a killed `up` leaves its lock file behind, but never
its lock.  The embedded nats-server inherits the descriptor (services/embedded.py), so the
store stays locked until the server is gone too, also on a system where it could outlive
`up`.

Every problem with the directory is a `DataDirError`: one line naming the path and the cause.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_NAME = "up.lock"
STORE_NAME = "jetstream"
# A lock whose `up` is dead is held by its nats-server while the server exits: wait that long.
DYING_SERVER_WAIT_S = 10.0


class DataDirError(Exception):
    """The data directory cannot be used; the message names the path and the cause."""


class DataDirInUse(DataDirError):
    """Another `quotasched up` (or the nats-server it started) holds the data directory."""


def prepare(data_dir: Path, store: bool = True) -> Path:
    """Create the data directory if needed and check that it, and the server's store under it
    (`store`: an embedded server will use it) if it exists, are writable directories: a
    specific error now instead of a traceback from deep inside the server or DuckDB later."""
    data_dir = Path(data_dir)
    _make_directory(data_dir)
    _check_writable(data_dir, "data dir")
    store_dir = data_dir / STORE_NAME
    if store and (store_dir.exists() or store_dir.is_symlink()):
        _check_writable(store_dir, "the server's store")
    return data_dir


def _make_directory(data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise DataDirError(f"data dir {data_dir} is not a directory")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataDirError(f"cannot create data dir {data_dir}: {_cause(data_dir, error)}") from None


def _cause(path: Path, error: OSError) -> str:
    """Why `path` cannot be created: the ancestor that is a file, when that is the reason."""
    if error.errno == errno.ENOTDIR:
        blocker = next((parent for parent in path.parents if parent.exists()), None)
        if blocker is not None and not blocker.is_dir():
            return f"{blocker} is a file, not a directory"
    return error.strerror or str(error)


def _check_writable(directory: Path, what: str) -> None:
    """Write and remove a probe file: permission bits alone say nothing for root, and a
    read-only mount or an immutable directory stops root as well."""
    if not directory.is_dir():
        raise DataDirError(f"{what} {directory} is not a directory")
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise DataDirError(f"{what} {directory} is not writable: {error.strerror}") from None


class DataDirLock:
    """The exclusive lock of one data directory, held from `acquire()` to `release()` (or to
    the death of this process and of every child that inherited `fileno()`)."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        """Lock, or raise `DataDirInUse` naming the holder.  A holder whose `up` is dead is
        a nats-server exiting after it: waited for, up to DYING_SERVER_WAIT_S."""
        fd = self._open()
        try:
            self._lock(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._write(f"{os.getpid()}\n")
        return self

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise DataDirError(f"cannot create the lock file {self.path}: {error.strerror}") from None

    def _lock(self, fd: int) -> None:
        deadline = time.monotonic() + DYING_SERVER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                up, server = _holders(fd)
                if (up is not None and _alive(up)) or time.monotonic() > deadline:
                    raise DataDirInUse(self._in_use(up, server)) from None
                time.sleep(0.05)

    def _in_use(self, up: int | None, server: int | None) -> str:
        if up is not None and _alive(up):
            return f"data dir {self.data_dir} is in use by quotasched up pid {up} (lock {self.path})"
        if server is not None:
            return (f"data dir {self.data_dir} is in use by nats-server pid {server}, left "
                    f"running by quotasched up pid {up} (lock {self.path}); stop it first")  # fmt: skip
        return f"data dir {self.data_dir} is in use: {self.path} is locked by another process"

    def record_server(self, pid: int) -> None:
        """Note the embedded server's pid in the lock file (it shares the lock): the message
        a second `up` gives names it if it ever outlives this `up`."""
        self._write(f"{os.getpid()}\n{pid}\n")

    def _write(self, text: str) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the data dir lock is not held")
        return self._fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the lock goes with the last descriptor (a running server keeps it)

    def __enter__(self) -> DataDirLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _holders(fd: int) -> tuple[int | None, int | None]:
    """(pid of the `up`, pid of its nats-server) written in the lock file, None if absent."""
    try:
        lines = os.pread(fd, 64, 0).decode().split()
        pids = [int(line) for line in lines]
    except (OSError, ValueError):
        return None, None
    return (pids[0] if pids else None), (pids[1] if len(pids) > 1 else None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def lock(data_dir: Path, store: bool = True) -> DataDirLock:
    """Check the data directory (`prepare`) and take its lock: what `up` does first."""
    return DataDirLock(prepare(data_dir, store)).acquire()
