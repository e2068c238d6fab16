"""The data directory's lock can't be removed from under `up` (issue 29, point 7).

The lock is a `flock` on the directory (and on the server's store under it), not on a file
that can be deleted.  `flock` locks of two open descriptions conflict within one process too,
so these run in-process; tests/reliability/test_data_dir_lock.py does it with real `up`s.
"""

from __future__ import annotations

import os

import pytest

from quotasched.services.datadir import LOCK_NAME, STORE_NAME, DataDirInUse, lock


def test_deleting_the_lock_file_does_not_free_the_data_dir(tmp_path):
    data_dir = tmp_path / "data"
    with lock(data_dir):
        (data_dir / LOCK_NAME).unlink()
        with pytest.raises(DataDirInUse, match=f"in use by quotasched up pid {os.getpid()}"):
            lock(data_dir)
        assert not (data_dir / LOCK_NAME).exists(), "the refused lock created a lock file"
    lock(data_dir).release()  # free again once released


def test_a_store_reached_through_another_data_dir_is_refused(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    (first / STORE_NAME).mkdir(parents=True)  # as a server left it
    with lock(first):
        second.mkdir()
        (second / STORE_NAME).symlink_to(first / STORE_NAME)
        with pytest.raises(DataDirInUse, match=f"store {second / STORE_NAME} is in use by pid"):
            lock(second)


def test_locking_creates_no_store_the_server_would_then_open(tmp_path):
    for store in (True, False):
        with lock(tmp_path / "data", store=store):
            assert not (tmp_path / "data" / STORE_NAME).exists()
