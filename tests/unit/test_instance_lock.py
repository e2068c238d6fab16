"""The instance lock (services/scheduler/instance.py): one live process per lock file, and a
token that names the file, not the path: a file deleted and made again is another instance."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from quotasched.services.scheduler.instance import InstanceLock, InstanceLockError

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def holding(path) -> subprocess.Popen:
    """Another process that holds the lock on `path` until it is killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_the_token_is_written_once_and_read_back_on_every_start(tmp_path):
    path = tmp_path / "scheduler.lock"
    first = InstanceLock(path).acquire()
    token = first.token
    assert len(token) == 32 and path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first.release()
    again = InstanceLock(path).acquire()
    assert again.token == token and again.holder == first.holder
    assert token in again.holder
    again.release()


def test_a_file_deleted_and_made_again_is_another_instance(tmp_path):
    path = tmp_path / "scheduler.lock"
    first = InstanceLock(path).acquire()
    path.unlink()  # while the first still runs: a second start gets another file, another token
    second = InstanceLock(path).acquire()
    assert second.token != first.token and second.holder != first.holder
    first.release()
    second.release()


def test_a_lock_another_live_process_holds_is_refused_after_the_wait(tmp_path):
    path = tmp_path / "scheduler.lock"
    InstanceLock(path).acquire().release()  # the file and its token exist
    other = holding(path)
    try:
        started = time.monotonic()
        with pytest.raises(InstanceLockError, match="held by another running process") as refused:
            InstanceLock(path, wait_s=0.3).acquire()
        assert time.monotonic() - started >= 0.3
        assert str(path) in str(refused.value)
    finally:
        other.kill()
        other.wait()


def test_the_lock_of_a_killed_process_is_free_at_once_with_the_same_token(tmp_path):
    path = tmp_path / "scheduler.lock"
    token = InstanceLock(path).acquire()
    token.release()
    other = holding(path)
    os.kill(other.pid, signal.SIGKILL)
    other.wait()
    taken = InstanceLock(path, wait_s=0.0).acquire()
    assert taken.token == token.token
    taken.release()


def test_a_dying_holder_is_waited_for(tmp_path):
    """A crashed scheduler's forked snapshot child may hold the lock a moment longer."""
    path = tmp_path / "scheduler.lock"
    other = holding(path)
    killer = subprocess.Popen([sys.executable, "-c", f"import os,time; time.sleep(0.5); os.kill({other.pid}, 9)"])
    try:
        InstanceLock(path, wait_s=20.0).acquire().release()
    finally:
        killer.wait()
        other.kill()
        other.wait()


@pytest.mark.parametrize("content", [b"not a token\n", b"\xff\xfe" * 20, b"a" * 31 + b"\n",
                                     b"0123456789abcdef0123456789abcdeg\n"])  # fmt: skip
def test_a_file_that_holds_anything_but_a_token_is_refused_and_left_as_it_was(tmp_path, content):
    path = tmp_path / "not-a-lock"
    path.write_bytes(content)
    with pytest.raises(InstanceLockError, match="something other than an instance token"):
        InstanceLock(path).acquire()
    assert path.read_bytes() == content


def test_a_lock_file_that_cannot_be_made_names_the_path_and_the_cause(tmp_path):
    path = tmp_path / "missing-directory" / "scheduler.lock"
    with pytest.raises(InstanceLockError, match="No such file or directory") as refused:
        InstanceLock(path).acquire()
    assert str(path) in str(refused.value)
