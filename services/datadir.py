"""`quotasched up`'s data directory: checked, then locked, before anything touches the store.

Two `up`s on one directory start two nats-servers on one JetStream file store, and commands
one of them acknowledges are lost (issue 17, point 3).  So `up` takes an exclusive `flock` on
the data directory itself first, before its nats-server starts and before the projector opens
DuckDB, and a second `up` is refused with the holder's pid.  The lock is on the directory, not
on a file in it: a lock file can be deleted while its lock is held, and the next `up` then
locks a new file of the same name and starts a second server on the store (issue 29, point
7); a directory that holds a store cannot be removed.  nats-server does not lock its store
(2.15: a second server on the same `-sd` starts), so `up` also locks the store directory,
`<data-dir>/jetstream`, when it exists, against an `up` whose data directory reaches the same
store by another path (a new store is created inside the locked directory).  `up.lock` only
records the pids (of `up`, then of its server) for the message; when it is gone the holder's
pid comes from the kernel's table of locks (/proc/locks).
The kernel releases a `flock` when every descriptor of it is closed: a killed `up` never
leaves its lock behind.  The embedded nats-server inherits the data directory's descriptor
(services/nats/embedded.py), so the directory stays locked until the server is gone too, also on a
system where it could outlive `up`.

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
    the death of this process and of every child that inherited `fileno()`).  `store`: lock
    the server's store directory too (an embedded server will use it)."""

    def __init__(self, data_dir: Path, store: bool = True):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_NAME
        self.store = store
        self._fd: int | None = None  # the data directory's: the lock the server inherits
        self._store_fd: int | None = None
        self._pids_fd: int | None = None  # up.lock, where the pids are written

    def acquire(self) -> DataDirLock:
        """Lock, or raise `DataDirInUse` naming the holder.  A holder whose `up` is dead is
        a nats-server exiting after it: waited for, up to DYING_SERVER_WAIT_S."""
        fd = _open_directory(self.data_dir, "data dir")
        try:
            self._lock(fd)
            if self.store and (self.data_dir / STORE_NAME).is_dir():  # else: created locked
                self._store_fd = self._lock_store()
            self._pids_fd = self._open_pids()
        except BaseException:
            self._fd = fd
            self.release()
            raise
        self._fd = fd
        self._write(f"{os.getpid()}\n")
        return self

    def _lock_store(self) -> int:
        store_dir = self.data_dir / STORE_NAME
        fd = _open_directory(store_dir, "the server's store")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _locker(store_dir)
            by = f" by pid {holder}" if holder is not None else ""
            raise DataDirInUse(f"the server's store {store_dir} is in use{by} (through another "
                               f"data dir?), data dir {self.data_dir}") from None  # fmt: skip
        return fd

    def _open_pids(self) -> int:
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
                up, server = self._holders()
                if (up is not None and _alive(up)) or time.monotonic() > deadline:
                    raise DataDirInUse(self._in_use(up, server)) from None
                time.sleep(0.05)

    def _holders(self) -> tuple[int | None, int | None]:
        """(pid of the `up`, pid of its nats-server): the kernel's word for the `up` (its
        lock file may be gone, or rewritten by hand), the lock file's for the server."""
        up, server = _recorded(self.path)
        locker = _locker(self.data_dir)
        if locker is not None and locker != up:
            return locker, None
        return up, server

    def _in_use(self, up: int | None, server: int | None) -> str:
        if up is not None and _alive(up):
            return f"data dir {self.data_dir} is in use by quotasched up pid {up} (lock {self.path})"
        if server is not None:
            return (f"data dir {self.data_dir} is in use by nats-server pid {server}, left "
                    f"running by quotasched up pid {up} (lock {self.path}); stop it first")  # fmt: skip
        return f"data dir {self.data_dir} is in use: it is locked by another process"

    def record_server(self, pid: int) -> None:
        """Note the embedded server's pid in the lock file (it shares the lock): the message
        a second `up` gives names it if it ever outlives this `up`."""
        self._write(f"{os.getpid()}\n{pid}\n")

    def _write(self, text: str) -> None:
        os.ftruncate(self._pids_fd, 0)
        os.pwrite(self._pids_fd, text.encode(), 0)

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the data dir lock is not held")
        return self._fd

    def release(self) -> None:
        fds = (self._pids_fd, self._store_fd, self._fd)
        self._pids_fd = self._store_fd = self._fd = None
        for fd in fds:
            if fd is not None:
                os.close(fd)  # the lock goes with the last descriptor (a running server keeps it)

    def __enter__(self) -> DataDirLock:
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _open_directory(directory: Path, what: str) -> int:
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise DataDirError(f"cannot open {what} {directory}: {error.strerror}") from None


def _recorded(path: Path) -> tuple[int | None, int | None]:
    """(pid of the `up`, pid of its nats-server) written in the lock file, None if absent."""
    try:
        pids = [int(line) for line in path.read_text().split()]
    except (OSError, ValueError):
        return None, None
    return (pids[0] if pids else None), (pids[1] if len(pids) > 1 else None)


def _locker(directory: Path) -> int | None:
    """The pid that took the `flock` held on `directory`, from /proc/locks (Linux; None
    elsewhere or if nobody holds it)."""
    try:
        stat = os.stat(directory)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    where = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12396 fe:00:260072 0 EOF"
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            return int(fields[4])
    return None


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
    return DataDirLock(prepare(data_dir, store), store).acquire()
