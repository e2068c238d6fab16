"""The attempts an executor is running, kept in a file so that its next start follows them.

An executor that stops (a crash, SIGKILL, a host restart, or a plain shutdown) leaves the
attempts it was running without anybody to report on them: the scheduler would keep them
RUNNING, holding capacity, until their attempt timeout (or forever without one).  So every
attempt is written here when it starts and removed once its end is reported or the scheduler
ended it; whatever the file still lists when the executor starts again, `Executor.recover`
takes over: an executor that can follow its attempts across a restart (every built-in one)
follows each again and reports its real end; another reports it FAILED
(the job's retryStrategy then decides between a retry and FAILED, as for any failed attempt).

A local process outlives its executor (it runs in its own session), so the file also records
its pid and its start time: the next executor follows (or stops) that process only when the
pid still names the same process, never a later one that happens to reuse the number.  It
records where the attempt's supervising shell writes the exit status (`exit_file`), so an
attempt that ended while no executor ran is reported as it ended; whether RUNNING was already
reported (`running`); and when the attempt was dispatched (`dispatched_at`, the fact's `at`),
from which the simulated executor computes its end.  It also records the attempt's cgroup and
marker (contain.py), so that stopping it kills whatever else the attempt started.

The file is JSON Lines, one change a line (`{"add": entry}` or `{"end": [job, attempt]}`),
appended as it happens, so a change costs the same however many attempts run; it is compacted
(rewritten through a temporary file and `os.replace`) when it opens and once it holds more
ended lines than live ones.  A crash can only tear the last line, which reading ignores.  One
executor per file: the name of the file is the executor's durable consumer's.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from quotasched.services import logs

log = logs.get("quotasched.executor")


@dataclass(frozen=True)
class Entry:
    job_id: str
    attempt: int
    job_queue: str
    share: str
    pid: int | None = None
    pid_started: str | None = None  # the process's start time, from /proc (Linux)
    # What contains everything the attempt started (contain.py): its cgroup, and the marker in
    # its processes' environment.  Absent from the files of executors that predate them.
    cgroup: str | None = None
    token: str | None = None
    # Absent from the files of executors that predate following attempts across restarts.
    exit_file: str | None = None  # where the attempt's shell writes its exit status
    running: bool = False  # RUNNING was reported
    dispatched_at: float | None = None  # the JobDispatched fact's `at` (epoch seconds)
    gpus: list[str] | None = None  # the GPU agent's: the GPUs the attempt holds


class Ledger:
    def __init__(self, path: str):
        self.path = path
        self.entries: dict[tuple[str, int], Entry] = self._read()
        self._lines = 0  # lines in the file since it was last compacted
        self.version = 0  # bumped by every change (the GPU agent mirrors the entries to KV)
        if os.path.exists(path):
            self._compact()

    def record(self, entry: Entry) -> None:
        self.entries[(entry.job_id, entry.attempt)] = entry
        self.version += 1
        self._append({"add": asdict(entry)})

    def forget(self, job_id: str, attempt: int) -> None:
        entry = self.entries.pop((job_id, attempt), None)
        if entry is not None:
            self.version += 1
            self._append({"end": [job_id, attempt]})
            if entry.exit_file is not None:  # its end is reported: its status is not needed
                try:
                    os.unlink(entry.exit_file)
                except OSError:
                    pass

    def _read(self) -> dict[tuple[str, int], Entry]:
        try:
            with open(self.path, "rb") as handle:
                lines = handle.read().split(b"\n")
        except FileNotFoundError:
            return {}
        except OSError as error:
            raise LedgerError(f"cannot read the executor's attempt file {self.path}: {error}; "
                              "move it away to start without it") from None  # fmt: skip
        entries: dict[tuple[str, int], Entry] = {}
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                change = json.loads(line)
                if "add" in change:
                    entry = Entry(**change["add"])
                    entries[(entry.job_id, entry.attempt)] = entry
                else:
                    job_id, attempt = change["end"]
                    entries.pop((job_id, attempt), None)
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                if number == len(lines):  # the last line, torn by a crash mid-append
                    break
                raise LedgerError(f"cannot read the executor's attempt file {self.path}: line "
                                  f"{number} is not a change ({error}); move it away to start "
                                  "without it") from None  # fmt: skip
        return entries

    def _append(self, change: dict) -> None:
        """Best effort: a file that cannot be written (disk full, permissions) is logged and
        the attempts run on; only what a crash would leave behind is at stake."""
        if self._lines > 2 * len(self.entries) + 64:
            self._compact()
            return  # the compacted file holds this change too
        if self._write(self.path, "a", [change]):
            self._lines += 1

    def _compact(self) -> None:
        partial = self.path + ".tmp"
        changes = [{"add": asdict(entry)} for entry in self.entries.values()]
        if self._write(partial, "w", changes):
            os.replace(partial, self.path)
            self._lines = len(changes)

    def _write(self, path: str, mode: str, changes: list[dict]) -> bool:
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, mode, encoding="utf-8") as handle:
                handle.writelines(json.dumps(change) + "\n" for change in changes)
            return True
        except OSError as error:
            log.error("executor attempt file not written", path=self.path, error=str(error))
            return False


class LedgerError(RuntimeError):
    pass


def proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), None without such a process or /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    return stat[stat.rfind(")") + 2:].split()


def process_started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), None if there is no
    such process or no /proc: two processes with the same pid and start time are the same."""
    fields = proc_stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def process_alive(pid: int, started: str) -> bool:
    """Whether the process that started at `started` still runs as `pid` (a zombie, dead but
    not yet reaped, does not count)."""
    fields = proc_stat(pid)
    return fields is not None and len(fields) > 19 and fields[19] == started and fields[0] != "Z"
