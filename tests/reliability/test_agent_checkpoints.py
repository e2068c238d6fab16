"""Checkpoints that survive attempts (issue 33, point 1), with real processes on fake GPUs.

- The example job (examples/jobs/checkpointed_train.py) is dispatched by a real scheduler to
  one of two `quotasched agent` processes sharing a checkpoint root, preempted by a job of
  higher priority, and its second attempt, on the other host, says it resumed from the step
  the first one saved on SIGTERM: the same directory for both attempts, mode 0700, removed
  once the job SUCCEEDED.  The agents' own --grace is 0: the save on SIGTERM (1 s) happens
  within the job's tag `grace` only; the preemptor starts once the victim has exited.
- QUOTASCHED_CHECKPOINT_KEEP=failed: a SUCCEEDED job's directory goes, a FAILED or terminated
  one's stays; under `--run-as nobody` (as root) the directories are nobody's, mode 0700,
  their root the agent's, 0711.
- Job ids a log older than the contract's rule may hold (`../x`, 200 characters, `bad.`,
  `..`), fed to a real agent object: each gets a directory of a safe name inside the root.
- A job asking for more grace than QUOTASCHED_PREEMPT_GRACE_MAX_S gets the maximum: ignoring
  SIGTERM, it is killed after it (the agent's --grace, 600 s, would outlast every wait here);
  a job asking for 0 is killed at once.
- In a podman container (tests/reliability/test_agent_containers.py's image), a payload with a
  CheckpointConfig gets the directory mounted at its LocalPath across attempts; one without
  gets no directory; a LocalPath the agent does not mount on fails the attempt, saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import textwrap
from pathlib import Path

import nats
import pytest

from quotasched.services.client import Bus
from quotasched.services.executors.agent import AgentOptions, GpuAgent
from quotasched.services.executors.checkpoints import container_path, directory_name
from quotasched.services.executors.fleet import Fleet, fleet_bucket
from quotasched.services.executors.process import asked_grace
from tests.executor_facts import dispatched, queue_created, status_changed, submitted
from tests.integration.helpers import G5, eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.test_agent_containers import IMAGE, podman  # noqa: F401 (its fixture)
from tests.reliability.test_agent_fleet import capacity_is, read_records, statuses

pytestmark = [pytest.mark.nats, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobs" / "checkpointed_train.py"
QUEUE, ENVIRONMENT = "gq", "gq-se"  # capacity_is reads this environment
AGENT = ["--heartbeat", "0.3", "--host-timeout", "1.5", "--place-timeout", "5",
         "--victim-timeout", "30"]  # fmt: skip

# Runs until the file it names exists (then exits 0); with `ignore`, SIGTERM is only said.
WAITER = textwrap.dedent("""
    import os, signal, sys, time
    print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    if sys.argv[2] == "ignore":
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    print("exiting", flush=True)
""")


def start_agent(spawn, state: Path, host: str, gpus: str, *more: str, **env: str):
    return spawn("agent", "--host", host, "--gpus", gpus, "--capacity-unit", G5,
                 "--service-environment", ENVIRONMENT, "--state-dir", str(state / host),
                 *AGENT, *more, **env)  # fmt: skip


async def submit(bus: Bus, job_id: str, priority: int, command: str, **tags: str) -> None:
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": QUEUE,
        "quotaShareName": "team", "schedulingPriority": priority,
        "tags": {"command": command, **tags}, "retryStrategy": {"attempts": 1},
        "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
    })  # fmt: skip


def waiter(tmp_path: Path, release: Path, ignore: bool = False) -> str:
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    return f"{sys.executable} {script} {release} {'ignore' if ignore else 'obey'}"


def records_of(state: Path, hosts: list[str], job_id: str, event: str) -> dict[int, dict]:
    """Each attempt's `event` record (claim, start, end) of `job_id`, by attempt."""
    return {r["attempt"]: r for r in read_records([state / h for h in hosts])
            if r["jobId"] == job_id and r["event"] == event}  # fmt: skip


def attempt_log(state: Path, hosts: list[str], job_id: str, attempt: int) -> str:
    """What the attempt printed, on the host that started it ("" before it started)."""
    start = records_of(state, hosts, job_id, "start").get(attempt)
    if start is None:
        return ""
    path = state / start["host"] / "logs" / job_id / f"{attempt}.log"
    return path.read_text() if path.exists() else ""


async def says(state: Path, hosts: list[str], job_id: str, attempt: int, words: str) -> str | None:
    text = attempt_log(state, hosts, job_id, attempt)
    return text if words in text else None


async def ended(state: Path, hosts: list[str], job_id: str, attempt: int) -> dict | None:
    return records_of(state, hosts, job_id, "end").get(attempt)


async def status_is(bus: Bus, job_id: str, attempt: int, status: str) -> bool:
    return (attempt, status) in await statuses(bus, job_id)


def gone(path: Path):
    """`eventually`'s condition: `path` no longer exists."""

    async def check() -> bool:
        return not path.exists()

    return check


# -- a preempted job resumes from its checkpoint ------------------------------------------------


async def test_a_preempted_job_resumes_from_its_checkpoint_on_another_host(
        tmp_path, nats_server, spawn):  # fmt: skip
    """h1 and h2 (one GPU each) share the checkpoint root, as an NFS mount would.  `train`
    runs, `filler` takes the other GPU, `urgent` preempts `train` (the lowest priority) and
    takes its GPU once it has exited; `filler` ends, and `train` runs again on its host."""
    shared, hosts = tmp_path / "shared-checkpoints", ["h1", "h2"]
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
        for host, gpu in (("h1", "0"), ("h2", "1")):
            start_agent(spawn, tmp_path, host, gpu, "--grace", "0",
                        QUOTASCHED_CHECKPOINT_DIR=str(shared),
                        QUOTASCHED_PREEMPT_GRACE_MAX_S="30")  # fmt: skip
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2 (two hosts)")

        train = (f"{sys.executable} {EXAMPLE} --steps 50 --every 5 --step-seconds 0.1 "
                 "--save-seconds 1")  # fmt: skip
        await submit(bus, "train", 1, train, grace="20")
        await eventually(lambda: says(tmp_path, hosts, "train", 1, "saved step 5"), 30,
                         what="train's first checkpoint")  # fmt: skip
        folder = shared / "train"
        assert folder.is_dir() and stat.S_IMODE(folder.lstat().st_mode) == 0o700
        release = tmp_path / "release-filler"
        await submit(bus, "filler", 5, waiter(tmp_path, release))
        await eventually(lambda: says(tmp_path, hosts, "filler", 1, "ready"), 30, what="filler")
        await submit(bus, "urgent", 9, waiter(tmp_path, tmp_path / "release-urgent"))
        await eventually(lambda: says(tmp_path, hosts, "urgent", 1, "ready"), 60, what="urgent")
        release.touch()
        await eventually(lambda: status_is(bus, "train", 2, "SUCCEEDED"), 90,
                         what="train's second attempt SUCCEEDED")  # fmt: skip
        await eventually(gone(folder), 30, what="train's directory removed")
        facts = await read_facts(bus.js)

    first, second = (attempt_log(tmp_path, hosts, "train", n) for n in (1, 2))
    saved = re.search(r"^SIGTERM: saved step (\d+), exiting$", first, re.M)
    assert saved, f"the first attempt did not save on SIGTERM within its grace: {first}"
    resumed = re.search(r"^resumed from step (\d+)$", second, re.M)
    assert resumed and resumed.group(1) == saved.group(1) != "0", second
    assert "done at step 50" in second
    assert f"checkpoints in {folder}\n" in first and f"checkpoints in {folder}\n" in second
    starts = records_of(tmp_path, hosts, "train", "start")
    assert starts[1]["host"] != starts[2]["host"], starts  # resumed on the other host
    # The GPUs were in use until the victim exited: the preemptor started after its end, there.
    [preempted] = [f for f in facts if f["kind"] == "JobPreempted"]
    assert (preempted["jobId"], preempted["preemptorJobId"]) == ("train", "urgent")
    urgent = records_of(tmp_path, hosts, "urgent", "start")[1]
    victim_end = records_of(tmp_path, hosts, "train", "end")[1]
    assert victim_end["ns"] < urgent["ns"] and urgent["gpus"] == starts[1]["gpus"]
    assert victim_end["host"] == urgent["host"] == starts[1]["host"]


# -- what an ended job leaves -------------------------------------------------------------------


def job_user_setup() -> tuple[list[str], Path, str]:
    """`--run-as nobody` where this runs as root (a state directory nobody can reach, as an
    operator's /var/lib/quotasched, and a shell nobody may run); else none."""
    if os.geteuid() != 0:
        return [], Path(tempfile.mkdtemp(prefix="quotasched-state-")), "sh"
    state = Path(tempfile.mkdtemp(prefix="quotasched-state-", dir="/tmp"))
    os.chmod(state, 0o755)
    return ["--run-as", "nobody"], state, "/bin/sh"


async def test_an_ended_jobs_directory_goes_unless_the_keep_setting_keeps_it(nats_server, spawn):
    """QUOTASCHED_CHECKPOINT_KEEP=failed: `ok` (SUCCEEDED) loses its directory; `bad` (FAILED,
    exit 3) and `stopped` (terminated) keep theirs, with what they saved."""
    run_as, state, shell = job_user_setup()
    hosts, root = ["h1"], state / "h1" / "checkpoints"  # the default: <state-dir>/checkpoints
    save = 'echo saved > "$QUOTASCHED_CHECKPOINT_DIR/state"; id -u'
    try:
        scheduler = spawn("scheduler")
        async with Bus(nats_server.url) as bus:
            await wait_leading(scheduler)
            await publish_items(bus, setup_commands(
                QUEUE, shares=[("team", 3, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
            agent = start_agent(spawn, state, "h1", "0,1,2", "--grace", "5", *run_as,
                                QUOTASCHED_CHECKPOINT_KEEP="failed")  # fmt: skip
            await eventually(lambda: capacity_is(bus, 3), 30, what="capacity 3")
            for job_id, command in (("ok", f"{shell} -c '{save}; exit 0'"),
                                    ("bad", f"{shell} -c '{save}; exit 3'"),
                                    ("stopped", f"{shell} -c '{save}; echo ready; sleep 120'")):
                await submit(bus, job_id, 1, command)
            await eventually(lambda: says(state, hosts, "stopped", 1, "ready"), 30, what="ready")
            await bus.publish({"kind": "TerminateServiceJob", "jobId": "stopped",
                               "reason": "the test ends it"})  # fmt: skip
            for job_id, status in (("ok", "SUCCEEDED"), ("bad", "FAILED"), ("stopped", "FAILED")):
                await eventually(lambda: status_is(bus, job_id, 1, status), 30,
                                 what=f"{job_id} {status}")  # fmt: skip
            await eventually(gone(root / "ok"), 30, what="ok's directory gone")
            await asyncio.sleep(1)  # a removal would be as quick as ok's was
            agent.stop()  # before its state directory goes (it is outside tmp_path)
        for job_id in ("bad", "stopped"):
            kept = root / job_id
            assert (kept / "state").read_text() == "saved\n", job_id
            assert stat.S_IMODE(kept.lstat().st_mode) == 0o700
            if run_as:
                assert kept.lstat().st_uid == 65534 and (kept / "state").lstat().st_uid == 65534
                assert attempt_log(state, hosts, job_id, 1).startswith("65534\n")
        if run_as:
            assert stat.S_IMODE(root.lstat().st_mode) == 0o711 and root.lstat().st_uid == 0
    finally:
        shutil.rmtree(state, ignore_errors=True)


# -- ids a log older than the rules may hold ----------------------------------------------------

HOSTILE_IDS = ["../x", "a" * 200, "bad.", "..", "ok-id_1"]


async def test_any_job_id_gets_a_directory_of_a_safe_name_inside_the_root(tmp_path, nats_server):
    """Fed to a real agent (the scheduler refuses such ids now): `a`*200 and `bad.` run with a
    hashed name; `../x` and `..` fail (no log directory), their directory still inside the
    root; an accepted id is its own name.  Each goes once its job is over."""
    root = tmp_path / "state" / "ckpt"
    nc = await nats.connect(nats_server.url)
    reports: dict[str, list[str]] = {}

    async def heard(message) -> None:
        command = json.loads(message.data)
        reports.setdefault(command["jobId"], []).append(command["status"])

    await nc.subscribe("qm.cmd.q.s.ReportJobStatus", cb=heard)

    async def publish(subject: str, data: bytes) -> None:
        await nc.publish(subject, data)

    options = AgentOptions(gpus=[str(n) for n in range(8)], capacity_unit="u",
                           service_environment="se", host="h1", place_timeout_s=5,
                           heartbeat_s=1, host_timeout_s=5, checkpoint_dir=str(root),
                           checkpoint_keep="never", grace_max_s=5)  # fmt: skip
    fleet = Fleet(await fleet_bucket(nc.jetstream(), storage="memory"), nc, publish, "h1", "se",
                  heartbeat_s=1, host_timeout_s=5)  # fmt: skip
    agent = GpuAgent(publish, options, fleet, state_dir=str(tmp_path / "state"))
    await agent.join()
    command = "sh -c 'echo \"$QUOTASCHED_CHECKPOINT_DIR\"; : > \"$QUOTASCHED_CHECKPOINT_DIR/mark\"'"
    try:
        await agent.on_fact(queue_created("q", "se"))
        for job_id in HOSTILE_IDS:
            await agent.on_fact(submitted(job_id, {"command": command}, share="s", unit="u"))
            await agent.on_fact(dispatched(job_id, share="s", unit="u"))

        async def all_ended() -> bool:
            return all(any(s in ("SUCCEEDED", "FAILED") for s in reports.get(job_id, []))
                       for job_id in HOSTILE_IDS)  # fmt: skip

        await eventually(all_ended, 30, what=f"every attempt reported ended: {reports}")
        made = sorted(path.name for path in root.iterdir())
        assert not (tmp_path / "state" / "x").exists() and not (tmp_path / "x").exists()
        for job_id in HOSTILE_IDS:
            name = directory_name(job_id)
            assert (root / name).is_dir(), (job_id, made)
            if job_id == "ok-id_1":
                assert name == job_id
            else:  # at most 40 of its safe characters, a dot no accepted id has, a digest
                assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}\.[0-9a-f]{32}", name), name
        for job_id in ("a" * 200, "bad.", "ok-id_1"):  # these ran, and saw their directory
            assert reports[job_id][-1] == "SUCCEEDED", reports[job_id]
            assert (root / directory_name(job_id) / "mark").exists()
        for job_id in ("../x", ".."):
            assert reports[job_id][-1] == "FAILED", reports[job_id]
        assert len(made) == len(HOSTILE_IDS), made
        for job_id in HOSTILE_IDS:  # the scheduler records each end: the directories go
            status = "SUCCEEDED" if reports[job_id][-1] == "SUCCEEDED" else "FAILED"
            await agent.on_fact(status_changed(job_id, status=status, cause="REPORTED"))
        async def emptied() -> bool:
            return not any(root.iterdir())

        await eventually(emptied, 30, what="every directory removed")
    finally:
        await agent.close()
        await nc.close()
    assert directory_name("a" * 200) != directory_name("a" * 201)
    assert directory_name("a" * 128) == "a" * 128  # the longest id the contract accepts


# -- the grace a job asks for, bounded --------------------------------------------------------


async def test_a_jobs_grace_is_bounded_by_the_operators_maximum_and_may_be_zero(
        tmp_path, nats_server, spawn):  # fmt: skip
    """One GPU; the agent's --grace is 600 s and QUOTASCHED_PREEMPT_GRACE_MAX_S 3.  `stubborn`
    asks for 3600 s and ignores SIGTERM: preempted, it is killed after 3 s, and only then does
    its preemptor start on the GPU.  `zero` asks for 0 and ignores SIGTERM: terminated, it is
    killed at once."""
    hosts = ["h1"]
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 1, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
        start_agent(spawn, tmp_path, "h1", "0", "--grace", "600",
                    QUOTASCHED_PREEMPT_GRACE_MAX_S="3")  # fmt: skip
        await eventually(lambda: capacity_is(bus, 1), 30, what="capacity 1")
        never = tmp_path / "never"
        await submit(bus, "stubborn", 1, waiter(tmp_path, never, ignore=True), grace="3600")
        await eventually(lambda: says(tmp_path, hosts, "stubborn", 1, "ready"), 30, what="ready")
        done = tmp_path / "preemptor-done"
        done.touch()  # the preemptor exits as soon as it runs
        await submit(bus, "preemptor", 9, waiter(tmp_path, done))
        await eventually(lambda: status_is(bus, "preemptor", 1, "SUCCEEDED"), 90,
                         what="the preemptor ran, once stubborn was killed")  # fmt: skip
        victim = await eventually(lambda: ended(tmp_path, hosts, "stubborn", 1), 10, what="end")
        said = attempt_log(tmp_path, hosts, "stubborn", 1)
        assert "ignoring SIGTERM" in said and "exiting" not in said, said
        assert victim["how"] == "STOPPED"
        preemptor = records_of(tmp_path, hosts, "preemptor", "start")[1]
        assert victim["ns"] < preemptor["ns"] and preemptor["gpus"] == victim["gpus"]

        await eventually(lambda: says(tmp_path, hosts, "stubborn", 2, "ready"), 60,
                         what="stubborn's second attempt")  # fmt: skip
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "stubborn", "reason": "done"})
        await eventually(lambda: status_is(bus, "stubborn", 2, "FAILED"), 60, what="stubborn")
        await submit(bus, "zero", 1, waiter(tmp_path, never, ignore=True), grace="0")
        await eventually(lambda: says(tmp_path, hosts, "zero", 1, "ready"), 60, what="zero ready")
        await bus.publish({"kind": "TerminateServiceJob", "jobId": "zero", "reason": "at once"})
        stopped = await eventually(lambda: ended(tmp_path, hosts, "zero", 1), 60,
                                   what="zero killed (its grace is 0, not the agent's 600 s)")
    assert stopped["how"] == "STOPPED"
    assert "exiting" not in attempt_log(tmp_path, hosts, "zero", 1)


def test_the_grace_tag_reads_seconds_and_refuses_anything_else():
    assert asked_grace({"tags": {}}) is None and asked_grace({}) is None
    assert [asked_grace({"tags": {"grace": v}}) for v in ("0", "2.5", "120")] == [0, 2.5, 120]
    assert asked_grace({"tags": {"grace": "inf"}}) == float("inf")  # as long as allowed
    for bad in ("-1", "soon", "nan", ""):
        with pytest.raises(ValueError, match="not a number of seconds"):
            asked_grace({"tags": {"grace": bad}})


# -- in a container ------------------------------------------------------------------------------

# Attempt 1 saves and fails; attempt 2 finds what attempt 1 saved, and succeeds.
RESUMING = ('sh -c "echo dir=${QUOTASCHED_CHECKPOINT_DIR:-none}; '
            'if [ -f /ckpt/saved ]; then echo resumed; exit 0; fi; echo 1 > /ckpt/saved; exit 1"')


async def test_a_container_gets_the_directory_at_its_checkpoint_configs_local_path(
        tmp_path, nats_server, spawn, podman):  # fmt: skip
    root, hosts = tmp_path / "ckpt", ["h1"]
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands(
            QUEUE, shares=[("team", 2, "RESERVE", "ENABLED")], capacity=0))  # fmt: skip
        start_agent(spawn, tmp_path, "h1", "0,1", "--container-runtime", "podman",
                    CONTAINERS_CONF=podman, QUOTASCHED_CHECKPOINT_DIR=str(root))  # fmt: skip
        await eventually(lambda: capacity_is(bus, 2), 30, what="capacity 2")
        jobs = {"boxed": ({"S3Uri": "s3://bucket/ckpt", "LocalPath": "/ckpt"}, RESUMING),
                "plain": (None, 'sh -c "echo dir=${QUOTASCHED_CHECKPOINT_DIR:-none}"'),
                "kernel": ({"S3Uri": "s3://bucket/ckpt", "LocalPath": "/proc/ckpt"}, "true")}
        for job_id, (config, command) in jobs.items():
            payload = {"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1}}
            if config is not None:
                payload["CheckpointConfig"] = config
            await bus.publish({
                "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id,
                "jobQueue": QUEUE, "quotaShareName": "team", "retryStrategy": {"attempts": 2},
                "tags": {"image": IMAGE, "command": command},
                "serviceRequestPayload": json.dumps(payload)})  # fmt: skip
        await eventually(lambda: status_is(bus, "boxed", 2, "SUCCEEDED"), 120, what="boxed")
        await eventually(lambda: status_is(bus, "plain", 1, "SUCCEEDED"), 120, what="plain")
        await eventually(lambda: status_is(bus, "kernel", 2, "FAILED"), 120, what="kernel")
        await eventually(gone(root / "boxed"), 30, what="boxed's directory removed")
        facts = await read_facts(bus.js)
    first, second = (attempt_log(tmp_path, hosts, "boxed", n) for n in (1, 2))
    assert first == "dir=/ckpt\n" and second == "dir=/ckpt\nresumed\n", (first, second)
    assert attempt_log(tmp_path, hosts, "plain", 1) == "dir=none\n"
    [refused, *_] = [f["statusReason"] for f in facts if f["kind"] == "JobStatusChanged"
                     and f["jobId"] == "kernel" and f["status"] in ("FAILED", "RUNNABLE")]
    assert "LocalPath '/proc/ckpt' is under /proc" in refused, refused


def test_where_a_container_gets_its_directory_is_a_plain_absolute_path():
    def at(config) -> str | None:
        return container_path({"payload": json.dumps({"CheckpointConfig": config})})

    assert container_path({"payload": None}) is None and container_path({"payload": "{}"}) is None
    assert at({"S3Uri": "s3://b/p"}) == at({"S3Uri": "s3://b/p", "LocalPath": ""}) \
        == at({"LocalPath": "/opt/ml/checkpoints/"}) == "/opt/ml/checkpoints"  # fmt: skip
    assert at({"LocalPath": "/data/run-7.ckpt"}) == "/data/run-7.ckpt"
    for bad in ("ckpt", "/", "/a/../etc", "/a/./b", "/a,readonly=false", "/a b", "/a:rw",
                "/proc/self", "/sys", "/dev/shm", "/" + "a" * 1100):
        with pytest.raises(ValueError, match="LocalPath"):
            at({"LocalPath": bad})
    with pytest.raises(ValueError, match="not an object"):
        at("s3://b/p")
