"""An upgrade with jobs running: the previous release's `up` runs a job, the current code takes
over the same data directory and follows that very job (issue 30).

The previous release is a wheel kept beside this file (previous_release/README.md says which
commit and how it was built); it runs on this interpreter with its folder first on PYTHONPATH.
That release stops its jobs on a graceful stop, so the upgrade kills its process group
(docs/operations.md, "Upgrading from a release before restarts were followed"): the job runs
in its own session and lives on.  Its attempt record names no exit file (that release kept
no exit status), so the current code follows the process to its end, holding its capacity
(and, on a GPU host, its GPUs) the while, and then reports it FAILED with a reason that says
why; an attempt the new code starts itself ends as it ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from quotasched.services.nats.embedded import free_port
from tests.integration.helpers import eventually, publish_items, read_facts, setup_commands
from tests.reliability.test_up_process import alive, announced, decide, ups  # noqa: F401 (fixture)

pytestmark = [pytest.mark.nats, pytest.mark.slow]

WHEEL = Path(__file__).parent / "previous_release" / "quotasched-e7b9cdf-py3-none-any.whl"
WHEEL_SHA256 = "2b7c8a5c51a27cc8373c75e54b9337499125548b963bd52e9b9b2377d4a3196e"  # previous_release/README.md
G5 = "ml.g5.xlarge"


@pytest.fixture
def previous_release(tmp_path) -> dict[str, str]:
    """The environment that runs the previous release's `quotasched` on this interpreter."""
    digest = hashlib.sha256(WHEEL.read_bytes()).hexdigest()
    assert digest == WHEEL_SHA256, f"{WHEEL} is not the wheel built from e7b9cdf (sha256 {digest})"
    folder = tmp_path / "previous-release"
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(folder)
    return {"PYTHONPATH": str(folder)}


def executor_flags(kind: str) -> list[str]:
    if kind == "process":
        return ["--executor", "process"]
    return ["--executor", "agent", "--gpus", "0", "--capacity-unit", G5,
            "--service-environment", "up-se"]  # fmt: skip


@pytest.fixture
def short_dir():
    """A folder with a short path: a command tag is at most 256 characters, and pytest's
    (under xdist) are long."""
    folder = Path(tempfile.mkdtemp(prefix="qs"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def waiting_job(job_id: str, pidfile: Path, go: Path) -> dict:
    """A job that writes its own pid and runs until `go` exists (at most 90 s), then exits 0."""
    assert pidfile.parent == go.parent
    command = (f"sh -c 'cd {go.parent} && echo $$ > {pidfile.name}; i=0; "
               f"while [ ! -e {go.name} ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; "
               "exit 0'")  # fmt: skip
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "up",
            "quotaShareName": "alpha", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
            "tags": {"command": command}}  # fmt: skip


async def statuses(bus: Bus, job_id: str) -> list[tuple[int, str]]:
    return [(f["attempt"], f["status"]) for f in await read_facts(bus.js)
            if f["kind"] == "JobStatusChanged" and f["jobId"] == job_id]  # fmt: skip


async def job_pid(pidfile: Path) -> int:
    text = await eventually(lambda: asyncio.sleep(0, pidfile.exists() and pidfile.read_text().strip()),
                            30, what=f"the pid in {pidfile}")  # fmt: skip
    return int(text)


async def ended(bus: Bus, job_id: str) -> dict:
    async def done():
        job = await bus.request("describe-service-job", jobId=job_id)
        return job if job["status"] in ("SUCCEEDED", "FAILED") else None

    return await eventually(done, 60, what=f"the end of {job_id}")


@pytest.mark.parametrize("kind", ["process", "agent"])
async def test_an_upgrade_follows_the_previous_releases_running_job(tmp_path, ups, previous_release,
                                                                    short_dir, kind):  # fmt: skip
    """The previous release runs `train` (one instance: all the capacity); `kill -9` of its
    process group; the current code on the same directory follows the same process: `train`
    stays RUNNING with one attempt and its instance held (`next`, submitted after the
    upgrade, waits), and when `train` exits it is reported FAILED saying the old release kept
    no exit status; then `next` runs under the current code and ends SUCCEEDED."""
    data_dir, port = tmp_path / "data", free_port()
    flags = [*executor_flags(kind), "--no-projector"]
    old = ups(data_dir, port, *flags, **previous_release)
    url = await announced(old, port)
    await decide(url, setup_commands("up", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                     capacity=1))  # fmt: skip
    pidfile, go = short_dir / "train.pid", short_dir / "train.go"
    async with Bus(url) as bus:
        await publish_items(bus, [(waiting_job("train", pidfile, go), None)])
        pid = await job_pid(pidfile)

        async def running():
            return (1, "RUNNING") in await statuses(bus, "train")

        await eventually(running, 60, what="train RUNNING")
    old.kill()  # its process group: the job runs in its own session
    assert alive(pid), "the job stopped with the previous release"

    new = ups(data_dir, port, *flags)
    await announced(new, port)
    next_pid, next_go = short_dir / "next.pid", short_dir / "next.go"
    async with Bus(url) as bus:
        await publish_items(bus, [(waiting_job("next", next_pid, next_go), None)])
        await asyncio.sleep(3)  # time enough for a wrong dispatch of `next`
        train = await bus.request("describe-service-job", jobId="train")
        assert train["status"] == "RUNNING" and len(train["attempts"]) == 1, train
        waiting = await bus.request("describe-service-job", jobId="next")
        assert waiting["status"] == "RUNNABLE", ("the followed job's capacity was handed out", waiting)
        assert alive(pid) and pidfile.read_text().strip() == str(pid), "the job was restarted"

        go.touch()
        train = await ended(bus, "train")
        assert train["status"] == "FAILED" and len(train["attempts"]) == 1, train
        assert "kept no exit status" in train["statusReason"], train
        assert await statuses(bus, "train") == [(1, "STARTING"), (1, "RUNNING"), (1, "FAILED")]

        await job_pid(next_pid)  # the instance is free: `next` runs under the current code
        next_go.touch()
        job = await ended(bus, "next")
        assert job["status"] == "SUCCEEDED", job
    assert new.stop() == 0
