"""`quotasched up` as an operator runs it: one process tree owning one data directory.

Each test starts the real `quotasched up` (and through it the real nats-server) as a
subprocess on a free port and a temporary data directory, then does what an unlucky operator
does: a second `up` on the same directory, `kill -9` of `up`, of its process group, a SIGTERM
while it starts, a port already taken, a data directory that cannot be used.  The promises:
one data directory has one `up`; the embedded server never outlives `up`; every command the
bus acknowledged before a kill is decided after a restart; and every start-up error is one
line naming the path or port and the cause, exit status 2, never a traceback.

Processes are checked through /proc (Linux), without psutil.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from quotasched.services.client import Bus
from quotasched.services.nats.embedded import free_port
from tests.integration.conftest import QUOTASCHED, Process, end_jobs_left_in
from quotasched.events.subjects import FACTS_STREAM, GATE_PING
from tests.integration.helpers import (
    NO_TICKS,
    NOTEBOOK,
    eventually,
    publish_items,
    read_facts,
    setup_commands,
    wait_decided,
)

pytestmark = [pytest.mark.nats, pytest.mark.slow]

# A short lease: a restart after a kill waits for the dead leader's lease to expire.
ENV = {**NO_TICKS, "QUOTASCHED_LEASE_TTL_S": "2"}
ONE_SHOT_TIMEOUT = 60.0  # a generous ceiling for an `up` that must refuse to start


# -- processes through /proc ----------------------------------------------------------------


def process_state(pid: int) -> str | None:
    """The state letter of a process (None when it is gone; "Z" a zombie: dead, not reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


def children_of(parent: int) -> list[tuple[int, str, list[bytes]]]:
    """(pid, command name, argv) of each process whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append((int(entry.name), stat[stat.index("(") + 1 : stat.rindex(")")], argv))
    return found


def nats_servers_of(parent: int) -> list[int]:
    """The nats-server processes whose parent is `parent`."""
    return [pid for pid, name, _ in children_of(parent) if name == "nats-server"]


async def server_of(up: Process, servers: set[int]) -> int:
    """The pid of the nats-server `up` started, once it runs (also added to `servers`, those
    the test cleans up)."""

    async def started():
        return nats_servers_of(up.popen.pid)

    pid = (await eventually(started, 30, what=f"{up.args} starting nats-server"))[0]
    servers.add(pid)
    return pid


async def gone(pid: int, what: str) -> None:
    """Until `pid` is dead (a generous ceiling: the kernel delivers the parent-death signal at
    once, the process then needs a moment to exit)."""
    await eventually(lambda: asyncio.sleep(0, not alive(pid)), 20, what=what)


# -- starting `up` --------------------------------------------------------------------------


def up_env(**extra: str) -> dict[str, str]:
    """The environment of `up`: no QUOTASCHED_NATS_URL (it must start its own server)."""
    env = {key: value for key, value in os.environ.items() if key != "QUOTASCHED_NATS_URL"}
    return {**env, **ENV, **extra}


def up_args(data_dir: Path, port: int, *more: str) -> list[str]:
    return ["up", "--data-dir", str(data_dir), "--port", str(port), "--executor", "none", *more]


@pytest.fixture
def ups(tmp_path):
    """ups(data_dir, port, *flags, **env) starts a long-running `up`; at the end every one is
    stopped, and any nats-server one of them left behind is killed (so a failing test does
    not leave servers running)."""
    started: list[Process] = []
    servers: set[int] = set()

    def start(data_dir: Path, port: int, *more: str, **env: str) -> Process:
        log = tmp_path / f"up-{len(started)}.log"
        process = Process(up_args(data_dir, port, *more), up_env(**env), log)
        started.append(process)
        return process

    start.servers = servers
    yield start
    for process in started:
        servers.update(nats_servers_of(process.popen.pid))
        process.stop()
    for pid in servers:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    end_jobs_left_in(tmp_path)


def run_up(*args: str) -> subprocess.CompletedProcess:
    """A `quotasched up` that is expected to refuse to start: its exit status and output.
    If it runs on instead, it is killed (with its group) after the ceiling and reported as
    such (exit status None)."""
    with subprocess.Popen([QUOTASCHED, *args], env=up_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as up:
        try:
            out, err = up.communicate(timeout=ONE_SHOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            server = nats_servers_of(up.pid)
            os.killpg(up.pid, signal.SIGKILL)
            for pid in server:
                os.kill(pid, signal.SIGKILL)
            out, err = up.communicate()
            return subprocess.CompletedProcess(up.args, None, out, err + "\n<still running>")
    return subprocess.CompletedProcess(up.args, up.returncode, out, err)


def assert_one_line_error(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit status 2, nothing on stdout (no URL announced), one line on stderr that starts
    with `quotasched up:` and contains every `expected` text."""
    detail = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 2, detail
    assert "Traceback" not in result.stderr, detail
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, detail
    assert lines[0].startswith("quotasched up: "), detail
    for text in expected:
        assert text in lines[0], detail
    assert result.stdout == "", f"announced {result.stdout!r} although it did not start"
    return lines[0]


async def announced(up: Process, port: int) -> str:
    url = f"nats://127.0.0.1:{port}"

    async def printed():
        if up.popen.poll() is not None:
            raise AssertionError(f"{up.args} exited with {up.popen.returncode}: {up.output()}")
        return url in up.output()

    await eventually(printed, 60, what=f"{up.args} announcing {url}")
    return url


async def decide(url: str, items) -> list[int]:
    """Publish `items` through `url` (each one acknowledged by the bus) and wait until the
    last one is decided; returns their command sequences."""
    async with Bus(url) as bus:
        seqs = await publish_items(bus, items)
        await wait_decided(bus.js, seqs[-1], timeout=60)
    return seqs


# -- one data dir, one `up` -----------------------------------------------------------------


async def test_a_second_up_on_the_same_data_dir_is_refused_naming_the_first_ones_pid(
    tmp_path, ups
):  # fmt: skip
    """The second `up` (another port, with and without the projector) never starts a
    server on the same store: it exits 2 with one line naming the first one's pid, and the
    first one goes on deciding what it is sent."""
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port)
    url = await announced(first, port)
    for flags in ((), ("--no-projector",)):
        result = run_up(*up_args(data_dir, free_port(), *flags))
        line = assert_one_line_error(result, str(data_dir), f"pid {first.popen.pid}")
        assert "in use" in line
    assert first.popen.poll() is None, "the first up stopped"
    assert nats_servers_of(first.popen.pid), "the first up lost its server"
    seqs = await decide(url, setup_commands("second"))
    async with Bus(url) as bus:
        decided = {fact["commandSeq"] for fact in await read_facts(bus.js)}
    assert set(seqs) <= decided
    assert first.stop() == 0


# -- the embedded server dies with `up` ------------------------------------------------------


async def test_sigkill_of_up_kills_its_server_and_a_restart_on_the_same_dir_and_port_decides_every_acknowledged_command(
    tmp_path, ups
):  # fmt: skip
    """`kill -9` of `up` alone (not its group): its nats-server dies with it.  A new `up` on
    the same directory and port (the dead one's lock file still there) starts, keeps the old
    streams, and decides every command the bus acknowledged before the kill, including those
    published right before it."""
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port, "--no-projector")
    url = await announced(first, port)
    server = await server_of(first, ups.servers)
    before = await decide(url, setup_commands("kq"))
    async with Bus(url) as bus:  # acknowledged, maybe not decided yet when the kill lands
        acked = await publish_items(bus, setup_commands("kr"))
    os.kill(first.popen.pid, signal.SIGKILL)
    first.popen.wait()
    await gone(server, f"nats-server {server} after kill -9 of up")
    assert (data_dir / "up.lock").exists()

    second = ups(data_dir, port, "--no-projector")
    await announced(second, port)
    async with Bus(url) as bus:
        await wait_decided(bus.js, acked[-1], timeout=60)
        decided = {fact["commandSeq"] for fact in await read_facts(bus.js)}
    assert set(before + acked) <= decided, "an acknowledged command was never decided"
    assert second.stop() == 0
    assert not nats_servers_of(second.popen.pid)


async def test_sigkill_of_the_process_group_of_up_leaves_no_server_and_up_restarts(
    tmp_path, ups
):  # fmt: skip
    """`kill -9 -<pgid>` (what a supervisor does): the server, in its own session, dies too;
    `up` starts again on the same directory and port, with the projector this time."""
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port)
    url = await announced(first, port)
    server = await server_of(first, ups.servers)
    seqs = await decide(url, setup_commands("gq"))
    first.kill()
    await gone(server, f"nats-server {server} after kill -9 of up's process group")

    second = ups(data_dir, port)
    await announced(second, port)
    async with Bus(url) as bus:
        decided = {fact["commandSeq"] for fact in await read_facts(bus.js)}
    assert set(seqs) <= decided
    assert second.stop() == 0


async def test_sigterm_while_up_starts_leaves_no_server(tmp_path, ups):
    """A SIGTERM after `up` started its server but before it announced its URL (it is
    waiting for the lease a killed `up` left behind) ends `up` and its server."""
    data_dir, port = tmp_path / "data", free_port()
    slow = {"QUOTASCHED_LEASE_TTL_S": "30"}  # the bucket keeps a dead leader's lease 30 s
    first = ups(data_dir, port, "--no-projector", **slow)
    await announced(first, port)
    first_server = await server_of(first, ups.servers)
    os.kill(first.popen.pid, signal.SIGKILL)
    first.popen.wait()
    if alive(first_server):  # the other tests prove it dies by itself; this one needs it gone
        os.kill(first_server, signal.SIGKILL)
    await gone(first_server, f"the first nats-server {first_server}")
    second = ups(data_dir, port, "--no-projector", **slow)
    server = await server_of(second, ups.servers)
    assert "nats://" not in second.output(), "up had already started"
    second.popen.send_signal(signal.SIGTERM)
    second.popen.wait(30)
    await gone(server, f"nats-server {server} after SIGTERM of up during start-up")


# -- a port in use is an error, never a silent join ------------------------------------------


def test_a_port_held_by_a_plain_listener_is_a_one_line_error(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_up(*up_args(tmp_path / "data", port, "--no-projector"))
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert not (tmp_path / "data" / "jetstream").exists(), "the store was opened"


async def test_a_port_held_by_another_up_is_a_one_line_error_and_not_a_standby(tmp_path, ups):
    port = free_port()
    first = ups(tmp_path / "first", port, "--no-projector")
    await announced(first, port)
    result = run_up(*up_args(tmp_path / "second", port, "--no-projector"))
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert first.popen.poll() is None
    assert first.stop() == 0


def test_an_aws_port_held_by_a_listener_is_a_one_line_error_before_anything_starts(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_up(*up_args(tmp_path / "data", free_port(), "--no-projector"),
                        "--aws-port", str(port))  # fmt: skip
    assert_one_line_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert not (tmp_path / "data" / "jetstream").exists(), "the store was opened"


@pytest.mark.parametrize("value", ["abc", "70000", "-1"])
def test_an_aws_port_that_is_not_a_port_is_a_one_line_error(tmp_path, value):
    result = run_up(*up_args(tmp_path / "data", free_port()), "--aws-port", value)
    assert_one_line_error(result, f"--aws-port must be a port (1-65535), 0 or off, not {value!r}")


async def test_aws_port_off_serves_no_endpoint(tmp_path, ups):
    port = free_port()
    up = ups(tmp_path / "data", port, "--no-projector", "--aws-port", "off")
    await announced(up, port)
    assert up.stop() == 0  # then its output is whole
    assert "AWS_ENDPOINT_URL_BATCH" not in up.output()
    assert f"nats://127.0.0.1:{port}" in up.output()


# -- a data dir that cannot be used: one line naming it ----------------------------------------


def test_a_data_dir_that_is_a_file_is_a_one_line_error(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.write_text("not a directory")
    result = run_up(*up_args(data_dir, free_port()))
    assert_one_line_error(result, str(data_dir), "not a directory")


def test_a_data_dir_below_a_file_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_up(*up_args(blocker / "data", free_port()))
    assert_one_line_error(result, str(blocker / "data"), f"{blocker} is a file")


def test_a_jetstream_that_is_a_file_is_a_one_line_error(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "jetstream").write_text("not a directory")
    result = run_up(*up_args(data_dir, free_port(), "--no-projector"))
    assert_one_line_error(result, str(data_dir / "jetstream"), "not a directory")


def read_only_mounts_possible(tmp_path: Path) -> str | None:
    """Why a read-only bind mount in a private mount namespace cannot be made here, if not."""
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(["unshare", "-m", "sh", "-c", read_only(probe, f"touch '{probe}/x'")],
                          capture_output=True, text=True)  # fmt: skip
    if "Read-only file system" in done.stderr:
        return None
    return f"no read-only bind mount (unshare -m) here: {done.stderr.strip() or done.returncode}"


def read_only(path: Path, command: str) -> str:
    """A shell line: make `path` a read-only bind mount (in this private namespace), then run
    `command` (root ignores permission bits; a read-only mount stops it as well)."""
    return (f"mount --bind '{path}' '{path}' && mount -o remount,ro,bind '{path}' && "
            f"exec {command}")  # fmt: skip


def run_up_read_only(path: Path, *args: str) -> subprocess.CompletedProcess:
    command = " ".join(f"'{arg}'" for arg in (QUOTASCHED, *args))
    done = subprocess.run(["unshare", "-m", "sh", "-c", read_only(path, command)],
                          env=up_env(), capture_output=True, text=True,
                          timeout=ONE_SHOT_TIMEOUT)  # fmt: skip
    return done


def test_a_read_only_data_dir_is_a_one_line_error(tmp_path):
    reason = read_only_mounts_possible(tmp_path)
    if reason:
        pytest.skip(reason)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    result = run_up_read_only(data_dir, *up_args(data_dir, free_port()))
    assert_one_line_error(result, str(data_dir), "Read-only file system")


async def test_a_read_only_jetstream_dir_is_a_one_line_error(tmp_path, ups):
    """The store of an earlier run, now on a read-only mount (the data dir itself writable)."""
    reason = read_only_mounts_possible(tmp_path)
    if reason:
        pytest.skip(reason)
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port, "--no-projector")
    await announced(first, port)
    assert first.stop() == 0
    store = data_dir / "jetstream"
    result = run_up_read_only(store, *up_args(data_dir, port, "--no-projector"))
    assert_one_line_error(result, str(store), "Read-only file system")


async def test_up_on_a_store_whose_first_facts_were_purged_refuses_to_start_naming_the_restore(
        tmp_path, ups):  # fmt: skip
    """The scheduler inside `up` refuses a fact log that lost its configuration (issue 29) as
    `quotasched scheduler` does: `up` exits 2 with that one line last, instead of waiting for
    a leader that never comes."""
    data_dir, port = tmp_path / "data", free_port()
    up = ups(data_dir, port, "--no-projector")
    url = await announced(up, port)
    lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
    async with Bus(url) as bus:
        last = 0
        for line in lines:
            last = await bus.publish(line)
        await wait_decided(bus.js, last)
        end = (await bus.js.stream_info(FACTS_STREAM)).state.last_seq
        await bus.js.purge_stream(FACTS_STREAM, keep=2)  # the configuration's first facts go
    assert up.stop() == 0
    result = run_up(*up_args(data_dir, port, "--no-projector"))
    detail = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert result.returncode == 2, detail
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"quotasched up: the fact log {FACTS_STREAM} begins at sequence "
                                f"{end - 1}: "), detail  # fmt: skip
    assert "restore" in last_line, detail


async def test_sigusr1_writes_every_threads_stack_and_up_runs_on(tmp_path, ups):
    """`kill -USR1 <pid>` (docs/operations.md): the stacks of every thread on stderr (the
    projector has a thread of its own), then every asyncio task's (the scheduler's term among
    them), and `up` goes on deciding, then stops cleanly, saying so first."""
    data_dir, port = tmp_path / "data", free_port()
    first = ups(data_dir, port)
    url = await announced(first, port)
    first.popen.send_signal(signal.SIGUSR1)

    async def dumped():
        out = first.output()  # faulthandler: one "(most recent call first)" per thread
        return "Current thread" in out and out.count("most recent call first") >= 2 \
            and re.search(r"^\d+ asyncio tasks \(most recent call last\):", out, re.M) \
            and "Stack for <Task" in out

    await eventually(dumped, 20, what="the stacks written after SIGUSR1")
    assert "in run" in first.output()  # the scheduler's term, awaiting its commands
    seqs = await decide(url, setup_commands("gu"))
    assert seqs
    assert first.stop() == 0
    assert '"signal": "SIGTERM", "event": "stopping"' in first.output()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_a_restart_of_up_costs_the_running_job_nothing(tmp_path, ups, how):
    """`up --executor process`, a job that writes its own pid and runs until told to end.
    Ctrl-C (SIGTERM) or `kill -9` of up's process group: the job runs on, and `up` started
    again on the same directory follows that very process: one attempt, reported STARTING and
    RUNNING once, SUCCEEDED when the job exits 0."""
    data_dir, port = tmp_path / "data", free_port()
    pidfile, go = tmp_path / "job.pid", tmp_path / "go"
    first = ups(data_dir, port, "--executor", "process", "--no-projector")
    url = await announced(first, port)
    await decide(url, setup_commands("rq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                     capacity=1))  # fmt: skip
    command = f"sh -c 'echo $$ > {pidfile}; i=0; while [ ! -e {go} ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; exit 0'"
    async with Bus(url) as bus:
        await publish_items(bus, [({
            "kind": "SubmitServiceJob", "jobId": "train", "jobName": "train", "jobQueue": "rq",
            "quotaShareName": "alpha", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge",
                                                          "quantity": 1}],
            "tags": {"command": command}}, None)])  # fmt: skip

        async def running():
            return [f for f in await read_facts(bus.js)
                    if f["kind"] == "JobStatusChanged" and f["status"] == "RUNNING"]

        await eventually(running, 60, what="the job RUNNING")
    pid = int(await eventually(lambda: asyncio.sleep(0, pidfile.exists() and pidfile.read_text().strip()),
                               30, what="the job's pid"))  # fmt: skip
    if how == "sigterm":
        assert first.stop() == 0
        assert "1 attempts keep running; start again to follow them" in first.output()
    else:
        first.kill()
    assert alive(pid), f"the job stopped with `up` ({how})"

    second = ups(data_dir, port, "--executor", "process", "--no-projector")
    await announced(second, port)
    async with Bus(url) as bus:
        job = await bus.request("describe-service-job", jobId="train")
        assert job["status"] == "RUNNING" and len(job["attempts"]) == 1, job
        go.touch()

        async def ended():
            job = await bus.request("describe-service-job", jobId="train")
            return job if job["status"] in ("SUCCEEDED", "FAILED") else None

        job = await eventually(ended, 60, what="the job's end")
        assert job["status"] == "SUCCEEDED" and len(job["attempts"]) == 1, job
        changes = [(f["attempt"], f["status"]) for f in await read_facts(bus.js)
                   if f["kind"] == "JobStatusChanged"]
        assert changes == [(1, "STARTING"), (1, "RUNNING"), (1, "SUCCEEDED")], changes
    assert pidfile.read_text().strip() == str(pid), "the job was started again"
    assert second.stop() == 0


# -- the admission gate `up` runs -------------------------------------------------------------


def gates_of(parent: int) -> list[int]:
    """The `quotasched gate` processes whose parent is `parent`."""
    return [pid for pid, _, argv in children_of(parent) if b"gate" in argv]


async def gate_answers(url: str) -> bool:
    async with Bus(url) as bus:
        return (await bus.nc.request(GATE_PING, b"", timeout=2)).data == b"{}"


async def test_up_starts_its_gate_again_when_it_dies_and_stops_it_with_itself(tmp_path, ups):
    """`up` runs the admission gate as a child of its own: open once `up` has announced its
    URL, started again when it dies (kill -9), stopped when `up` stops; a submission is
    decided after the restart."""
    data_dir, port = tmp_path / "data", free_port()
    up = ups(data_dir, port, "--no-projector")
    url = await announced(up, port)
    [gate] = gates_of(up.popen.pid)
    assert await gate_answers(url)
    os.kill(gate, signal.SIGKILL)
    await gone(gate, f"the gate {gate} after kill -9")

    async def another_gate():
        pids = gates_of(up.popen.pid)
        return pids if pids and pids != [gate] and await gate_answers(url) else None

    [again] = await eventually(another_gate, 30, what="a new gate answering")
    assert "the gate ended; starting it again" in up.output()
    need = [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]
    seqs = await decide(url, setup_commands("gg") + [(
        {"kind": "SubmitServiceJob", "jobId": "through", "jobName": "through", "jobQueue": "gg",
         "quotaShareName": "alpha", "capacityUsage": need}, None)])  # fmt: skip
    async with Bus(url) as bus:
        assert any(fact.get("jobId") == "through" and fact["kind"] == "JobSubmitted"
                   for fact in await read_facts(bus.js)), seqs  # fmt: skip
    assert up.stop() == 0
    assert not alive(again), "the gate outlived up"
