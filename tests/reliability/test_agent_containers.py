"""The GPU agent runs attempts in containers (`--container-runtime podman`), against a real
nats-server, scheduler and podman: a job that names an image runs in a container of it with
CUDA_VISIBLE_DEVICES set to exactly its GPUs; preemption stops the container (the runtime's
stop, SIGTERM then SIGKILL) before its preemptor starts on those GPUs; a job without an image
runs as a process beside them; an agent SIGKILLed while its container runs removes that
container when it starts again.

The image is made here, offline: a root file system holding Debian's static busybox, imported
with `podman import` (no registry is reached).  `make test` installs podman, runc and
busybox-static with apt where they are missing; elsewhere this module skips, saying why.
The containers.conf below suits a machine without systemd or cgroup v2 delegation (runc,
cgroupfs, modest ulimits, no network): a real host's own configuration needs none of it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.test_agent_fleet import (
    FAST, capacity_is, check_fleet, logs_written, read_records, statuses,
)  # fmt: skip

pytestmark = [pytest.mark.nats, pytest.mark.slow]

QUEUE, ENVIRONMENT, IMAGE = "gq", "gq-se", "localhost/quotasched-test-busybox"
CONF = textwrap.dedent("""
    [containers]
    default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
    netns = "none"

    [engine]
    runtime = "runc"
    cgroup_manager = "cgroupfs"
""")
# The job: print its GPUs and id, then run until stopped (PID 1 ignores SIGTERM unless it traps
# it; the trap says so in the log).
SCRIPT = ("trap 'echo stopped; exit 0' TERM; echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; "
          "echo job=$QUOTASCHED_JOB_ID; sleep {seconds} & wait")  # fmt: skip


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    """CONTAINERS_CONF for podman with the test image imported, or a skip naming what lacks."""
    busybox = shutil.which("busybox")
    if shutil.which("podman") is None or busybox is None:
        pytest.skip("podman or busybox (static) is not installed: `make test` installs podman, "
                    "runc and busybox-static with apt where it can")  # fmt: skip
    folder = tmp_path_factory.mktemp("podman")
    conf = folder / "containers.conf"
    conf.write_text(CONF)
    root = folder / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    for name in ("sh", "echo", "sleep", "cat"):
        (root / "bin" / name).symlink_to("busybox")
    env = {"CONTAINERS_CONF": str(conf), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    tar = folder / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    imported = subprocess.run(["podman", "import", str(tar), IMAGE], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    probe = subprocess.run(["podman", "run", "--rm", IMAGE, "echo", "ok"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    if imported.returncode != 0 or probe.stdout.strip() != "ok":
        pytest.skip(f"podman cannot run a container here: {(imported.stderr + probe.stderr).strip()}")
    remove_containers(str(conf))  # a killed earlier run's: they would count as this run's
    yield str(conf)
    remove_containers(str(conf))  # a stopped agent leaves its containers running


def remove_containers(conf: str) -> None:
    for name in containers_running(conf):
        subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=60,
                       env={"CONTAINERS_CONF": conf, "PATH": "/usr/bin:/bin"})  # fmt: skip


def containers_running(conf: str) -> set[str]:
    listed = subprocess.run(["podman", "ps", "--format", "{{.Names}}"], capture_output=True,
                            text=True, env={"CONTAINERS_CONF": conf, "PATH": "/usr/bin:/bin"},
                            timeout=60)  # fmt: skip
    return {name for name in listed.stdout.split() if name.startswith("quotasched-")}


async def _async(value):
    return value


def start_agent(spawn, tmp_path: Path, conf: str):
    return spawn("agent", "--host", "h1", "--gpus", "0,1", "--capacity-unit", G5,
                 "--service-environment", ENVIRONMENT, "--state-dir", str(tmp_path / "h1"),
                 "--container-runtime", "podman", *FAST, CONTAINERS_CONF=conf)  # fmt: skip


async def submit(bus: Bus, job_id: str, priority: int, gpus: int, tags: dict) -> None:
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
        "quotaShareName": "team", "schedulingPriority": priority, "tags": tags,
        "capacityUsage": [{"capacityUnit": G5, "quantity": gpus}],
    })  # fmt: skip


def log_of(tmp_path: Path, job_id: str, attempt: int = 1) -> str:
    path = tmp_path / "h1" / "logs" / job_id / f"{attempt}.log"
    return path.read_text() if path.exists() else ""


def logged(tmp_path: Path, job_id: str, text: str):
    async def check() -> bool:
        return text in log_of(tmp_path, job_id)
    return check


def none_running(conf: str):
    async def check() -> bool:
        return not containers_running(conf)
    return check


async def test_attempts_run_in_containers_on_their_gpus_and_preemption_stops_them(
        tmp_path, nats_server, spawn, podman):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")], capacity=1))  # fmt: skip
        agent = start_agent(spawn, tmp_path, podman)
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2 (one host)")

        # In a container: its log says the GPU it got and its job id; podman lists it.
        await submit(bus, "boxed", 1, 1, {"image": IMAGE, "command": f"sh -c \"{SCRIPT.format(seconds=300)}\""})
        await eventually(logged(tmp_path, "boxed", "job=boxed"), 60, what="boxed runs")
        assert containers_running(podman) == {"quotasched-boxed-1"}
        # No image: a plain process on the other GPU.
        await submit(bus, "plain", 1, 1, {"command": f"sh -c \"{SCRIPT.format(seconds=300)}\""})
        await eventually(logged(tmp_path, "plain", "job=plain"), 60, what="plain runs")
        assert containers_running(podman) == {"quotasched-boxed-1"}

        # Both GPUs busy: a two-GPU job of higher priority preempts both; the container is
        # stopped by the runtime, and the preemptor (in a container) gets both GPUs.
        await submit(bus, "wide", 9, 2, {"image": IMAGE, "command": f"sh -c \"{SCRIPT.format(seconds=300)}\""})
        await eventually(logged(tmp_path, "wide", "job=wide"), 60, what="wide runs")
        assert containers_running(podman) == {"quotasched-wide-1"}

        # SIGKILL the agent while wide's container runs: the container runs on, and the agent
        # started again follows it (the one host: nobody declares it lost); a termination
        # then stops it through the runtime.
        agent.kill()
        again = start_agent(spawn, tmp_path, podman)

        async def following() -> bool:
            return "following 1 attempts" in again.output()

        await eventually(following, 60, what="the restarted agent following wide")
        assert containers_running(podman) == {"quotasched-wide-1"}
        assert (1, "FAILED") not in await statuses(bus, "wide")
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "wide", "reason": "test"},
                          route=(QUEUE, "team"))  # fmt: skip

        async def wide_failed() -> bool:  # terminated
            return (1, "FAILED") in await statuses(bus, "wide")

        await eventually(wide_failed, 30, what="wide FAILED (terminated)")
        await eventually(lambda: _async(containers_running(podman) != {"quotasched-wide-1"}), 60,
                         what="wide's container stopped by the runtime")  # fmt: skip
        # boxed and plain, requeued by wide's preemption, start again once wide has failed:
        # end them all, so that nothing outlives the test.
        await eventually(lambda: logs_written(tmp_path, ["h1"]), 60, what="every log's first line")
        for job_id in ("boxed", "plain"):
            await bus.publish({"kind": "TerminateServiceJob", "jobId": job_id, "reason": "test"},
                              route=(QUEUE, "team"))  # fmt: skip
        await eventually(none_running(podman), 60, what="every container ended")
        facts = await read_facts(bus.js)
    # On another host (no log here), `quotasched logs` says where each attempt ran.
    elsewhere = subprocess.run([str(Path(sys.executable).parent / "quotasched"), "logs", "wide",
                                "--logs-dir", str(tmp_path / "elsewhere"), "--nats-url",
                                nats_server.url], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert elsewhere.returncode == 1
    assert "attempt 1 ran on host h1 (GPUs 0,1)" in elsewhere.stderr, elsewhere.stderr
    gpus = {job: log_of(tmp_path, job).splitlines()[0] for job in ("boxed", "plain", "wide")}
    assert sorted([gpus["boxed"], gpus["plain"]]) == ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]
    assert gpus["wide"] == "CUDA_VISIBLE_DEVICES=0,1"
    assert "stopped" in log_of(tmp_path, "boxed")  # SIGTERM reached the job inside
    records = read_records([tmp_path / "h1"])
    check_fleet(records, {"h1": tmp_path / "h1" / "logs"}, facts)  # GPUs seen inside, order
