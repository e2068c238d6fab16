"""`--run-as USER` and the executor's hardening (services/executors/jobuser.py), with real users
and real processes: the expectations are the kernel's, not the module's.

Needs root and the `nobody` user (Debian's base system has it); the hardening test needs a
Python that `nobody` may run (the venv's lives under /root), Debian's /usr/bin/python3.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from quotasched.services.executors import jobuser
from quotasched.services.executors.jobuser import JobUser, JobUserError

MODULE = Path(jobuser.__file__).resolve()
SYSTEM_PYTHON = "/usr/bin/python3"

try:
    NOBODY = pwd.getpwnam("nobody")
except KeyError:  # pragma: no cover - every Debian has it
    NOBODY = None

needs_root = pytest.mark.skipif(os.geteuid() != 0 or NOBODY is None,
                                reason="switching users needs root and the user 'nobody'")


def as_nobody(*argv: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run(argv, user=NOBODY.pw_uid, group=NOBODY.pw_gid, extra_groups=[],
                          capture_output=True, text=True, timeout=30, **options)  # fmt: skip


def test_a_job_user_that_does_not_exist_is_refused_naming_it():
    with pytest.raises(JobUserError, match="--run-as no-such-user-here: no such user"):
        JobUser.resolve("no-such-user-here", "/tmp/w")


def test_a_job_may_not_run_as_root_by_name_or_number():
    for name in ("root", "0"):
        with pytest.raises(JobUserError, match="may not run as root"):
            JobUser.resolve(name, "/tmp/w")


@needs_root
def test_only_a_root_executor_can_run_jobs_as_another_user(tmp_path):
    # The same check, run by a process that is not root: the one line it prints is the refusal.
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('jobuser', {str(MODULE)!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['jobuser'] = m\n"
                "spec.loader.exec_module(m)\n"
            "try:\n    m.JobUser.resolve('daemon', '/tmp/w')\n"
            "except m.JobUserError as e:\n    print(e)\n")  # fmt: skip
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no Python that 'nobody' may run")
    result = as_nobody(SYSTEM_PYTHON, "-c", code)
    assert result.stdout.strip() == (f"--run-as daemon: the executor runs as uid {NOBODY.pw_uid}, "
                                     "and only root can start a job as another user")  # fmt: skip


@needs_root
def test_a_work_directory_the_job_user_cannot_reach_is_refused_naming_the_parent(tmp_path):
    os.chmod(tmp_path, 0o700)
    with pytest.raises(JobUserError, match=f"cannot reach {tmp_path}/work: {tmp_path} is mode 0700"):
        JobUser.resolve("nobody", str(tmp_path / "work"))


@pytest.fixture
def reachable():
    """A folder the job user may walk into (pytest's tmp_path lies under root's 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="quotasched-jobuser-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_an_attempt_directory_is_the_job_users_alone_and_its_parents_are_not(reachable):
    tmp_path = reachable
    user = JobUser.resolve("nobody", str(tmp_path / "work"))
    mine = Path(user.attempt_dir("job-a", 1))
    other = Path(user.attempt_dir("job-b", 2))
    assert mine == tmp_path / "work" / "job-a" / "1"
    assert (mine.stat().st_uid, mine.stat().st_mode & 0o777) == (NOBODY.pw_uid, 0o700)
    assert (mine.parent.stat().st_uid, mine.parent.stat().st_mode & 0o777) == (0, 0o711)
    wrote = as_nobody("sh", "-c", f"echo ok > {mine}/out && cat {mine}/out")
    assert wrote.stdout.strip() == "ok", wrote.stderr
    for forbidden in (f"touch {mine.parent}/planted", f"touch {tmp_path}/work/planted",
                      f"ls {tmp_path}/work"):  # fmt: skip
        result = as_nobody("sh", "-c", forbidden)
        assert result.returncode != 0 and "Permission denied" in result.stderr, forbidden
    assert not (mine.parent / "planted").exists()
    assert other.exists()


@needs_root
def test_spawn_options_start_the_process_as_the_user_with_no_groups_and_a_private_umask():
    user = JobUser.resolve("nobody", "/tmp/quotasched-work")
    result = subprocess.run(["sh", "-c", "id -u; id -G; umask"], capture_output=True, text=True,
                            timeout=30, **user.spawn_options())  # fmt: skip
    uid, groups, umask = result.stdout.split("\n")[:3]
    assert int(uid) == NOBODY.pw_uid
    assert groups.split() == [str(NOBODY.pw_gid)]
    assert umask.strip() == "0077"


@needs_root
def test_a_hardened_executors_environment_cannot_be_read_by_a_job_of_the_same_user():
    """The executor keeps its NATS credentials in its environment; a job of its own user reads
    /proc/<executor>/environ unless the executor made itself non-dumpable."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no Python that 'nobody' may run")
    readable = {}
    for hardened in (False, True):
        code = ("import importlib.util, sys, time\n"
                f"spec = importlib.util.spec_from_file_location('jobuser', {str(MODULE)!r})\n"
                "m = importlib.util.module_from_spec(spec); sys.modules['jobuser'] = m\n"
                "spec.loader.exec_module(m)\n"
                f"ok = m.harden_executor() if {hardened} else True\n"
                "print('ready' if ok else 'not hardened', flush=True); time.sleep(30)\n")  # fmt: skip
        executor = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", code], user=NOBODY.pw_uid, group=NOBODY.pw_gid,
            extra_groups=[], stdout=subprocess.PIPE, text=True,
            env={"QUOTASCHED_NATS_PASSWORD": "s3cret", "PATH": os.defpath})  # fmt: skip
        try:
            assert executor.stdout.readline().strip() == "ready"
            job = as_nobody("sh", "-c", f"cat /proc/{executor.pid}/environ | tr '\\0' '\\n'")
            readable[hardened] = "QUOTASCHED_NATS_PASSWORD=s3cret" in job.stdout
        finally:
            executor.kill()
            executor.wait()
    assert readable == {False: True, True: False}


def test_the_default_start_line_says_jobs_run_as_the_executors_user():
    assert f"uid {os.geteuid()}" in jobuser.describe_default()
    assert "--run-as USER" in jobuser.describe_default()


@needs_root
@pytest.mark.parametrize("job_id", ["..", ".", "a/b", ""])
def test_a_job_id_from_an_older_log_never_escapes_the_work_directory(tmp_path, job_id):
    user = JobUser.resolve("nobody", "/tmp/quotasched-work-never-made")
    user = JobUser(user.name, user.uid, user.gid, str(tmp_path / "work"))
    with pytest.raises(ValueError, match="cannot name a working directory"):
        user.attempt_dir(job_id, 1)
    user.remove_attempt_dir(job_id, 1)  # nothing to remove, and nothing outside is touched
    assert sorted(p.name for p in tmp_path.iterdir()) == []
