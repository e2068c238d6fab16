"""The four built-in executors described for the conformance kit (kit.py): how each is
started and killed, how a job makes its attempts run, fail or succeed, and what each lets the
kit observe.

- `process` and `agent` run the kit's job script (JOB_SCRIPT): it appends its own start and
  stop (wall-clock ns) to a records file, takes STOP_S to stop on SIGTERM (a checkpoint), and
  exits 1 on the attempts it is told to fail.  The agent runs two hosts, `h1` with GPUs 0,1
  and `h2` with GPU 2: the fleet has 3, no host has 3 for one attempt.
- `simulated` runs nothing observable: it keeps no records, and its "long" attempts last
  `long_s` seconds, so an attempt it failed to stop would report its end within the kit's
  wait.
- `sagemaker` runs against moto's SageMaker server: each CreateTrainingJob call (moto's
  request recorder) is an attempt's start; moto completes every training job at creation,
  so its scenarios that need a running attempt are skipped, with that reason.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from nats.js.errors import NotFoundError

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services.client import Bus
from quotasched.services.executors.sagemaker import ATTEMPT_TAG, JOB_ID_TAG
from tests.conformance.kit import (ENVIRONMENT, STOP_S, UNIT, WAIT_S, ExecutorUnderTest, JobSpec,
                                   Record, Stack)
from tests.integration.conftest import Process
from tests.integration.helpers import eventually, read_facts

JOB_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    records, seconds, fail_attempts, stop_s = sys.argv[1], *map(float, sys.argv[2:5])
    job, attempt = os.environ["QUOTASCHED_JOB_ID"], int(os.environ["QUOTASCHED_ATTEMPT"])

    def write(event, **more):
        line = {"event": event, "jobId": job, "attempt": attempt, "ns": time.time_ns(), **more}
        with open(records, "a") as out:  # O_APPEND: one whole line per write
            out.write(json.dumps(line) + "\\n")

    def stop(signum, frame):
        time.sleep(stop_s)  # a checkpoint: the instances are still in use
        write("stop", how="SIGTERM")
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)
    write("start", pid=os.getpid())
    time.sleep(seconds)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # one stop line, not two
    code = 1 if attempt <= fail_attempts else 0
    write("stop", how=f"exit {code}")
    sys.exit(code)
""")

# A job leaving a daemon: a `setsid` child writing its pid to the file named by argv[1] (in
# this script's folder) and sleeping; then the kit's job script, with the remaining arguments.
DAEMON_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    pidfile = os.path.join(here, sys.argv[1])
    daemon = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 300'
    subprocess.Popen(["setsid", "sh", "-c", daemon, "sh", pidfile])
    while not os.path.exists(pidfile):
        time.sleep(0.02)
    job = [os.path.join(here, "job.py"), os.path.join(here, "job-records.jsonl"), *sys.argv[2:]]
    os.execv(sys.executable, [sys.executable, *job])
""")

# A job writing its environment (JSON) to the file named by argv[1] (in this script's folder),
# then running the kit's job script with the remaining arguments.
ENV_SCRIPT = textwrap.dedent("""
    import json, os, sys
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    with open(os.path.join(here, sys.argv[1]), "w") as out:
        json.dump(dict(os.environ), out)
    job = [os.path.join(here, "job.py"), os.path.join(here, "job-records.jsonl"), *sys.argv[2:]]
    os.execv(sys.executable, [sys.executable, *job])
""")

NO_CAPACITY = {"an_attempt_that_cannot_be_placed_is_reported_insufficient_capacity":
               "it runs whatever is dispatched to it: it has no capacity of its own to lack"}
INSTANT_REASON = ("moto completes every training job at creation and answers StopTrainingJob "
                  "with HTTP 500: no attempt is ever running to {}; stop confirmation is "
                  "unit-tested (tests/unit/test_sagemaker_executor.py)")  # fmt: skip


def usage(quantity: int) -> dict[str, Any]:
    return {"capacityUsage": [{"capacityUnit": UNIT, "quantity": quantity}]}


async def consumer_exists(bus: Bus, durable: str) -> None:
    """Until the executor's durable consumer is on the fact stream (its subscriber started)."""

    async def exists():
        try:
            return await bus.js.consumer_info(FACTS_STREAM, durable)
        except NotFoundError:
            return None

    await eventually(exists, WAIT_S, what=f"consumer {durable}")


class _OneProcess(ExecutorUnderTest):
    """An executor that is one `quotasched executor --kind <name>` process."""

    args: tuple[str, ...] = ()
    process: Process | None = None

    def start(self, stack: Stack) -> None:
        self.process = stack.spawn("executor", "--kind", self.name, *self.args,
                                   **self.environment(stack))  # fmt: skip

    def environment(self, stack: Stack) -> dict[str, str]:
        return {}

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        assert self.process.stop() == 0

    async def ready(self, stack: Stack, bus: Bus) -> None:
        await consumer_exists(bus, f"executor-{self.name}")


class _JobScript:
    """Jobs as the kit's job script (process and agent executors) and its records file."""

    def job(self, stack: Stack, spec: JobSpec, quantity: int) -> dict[str, Any]:
        script = stack.directory / "job.py"
        if not script.exists():
            script.write_text(JOB_SCRIPT)
        command = (f"{sys.executable} {script} {self._records_path(stack)} {spec.seconds} "
                   f"{spec.fail_attempts} {STOP_S}")  # fmt: skip
        return {"tags": {"command": command}, **usage(quantity)}

    def daemon_job(self, stack: Stack, spec: JobSpec, quantity: int,
                   pidfile: Path) -> dict[str, Any]:  # fmt: skip
        """The job script, after DAEMON_SCRIPT started its setsid child (the command stays
        short: a tag holds at most 256 characters)."""
        fields = self.job(stack, spec, quantity)  # writes job.py
        script = stack.directory / "daemon.py"
        if not script.exists():
            script.write_text(DAEMON_SCRIPT)
        assert pidfile.parent == stack.directory
        command = (f"{sys.executable} {script} {pidfile.name} {spec.seconds} "
                   f"{spec.fail_attempts} {STOP_S}")  # fmt: skip
        return {**fields, "tags": {"command": command}}

    def environment_job(self, stack: Stack, spec: JobSpec, quantity: int, dump: Path,
                        asked: dict[str, str]) -> dict[str, Any]:  # fmt: skip
        """The job script, after ENV_SCRIPT wrote the environment; the need and the asked
        variables in a CreateTrainingJob payload (ResourceConfig, Environment)."""
        self.job(stack, spec, quantity)  # writes job.py
        script = stack.directory / "env.py"
        if not script.exists():
            script.write_text(ENV_SCRIPT)
        assert dump.parent == stack.directory
        payload = {"ResourceConfig": {"InstanceType": UNIT, "InstanceCount": quantity,
                                      "VolumeSizeInGB": 1}, "Environment": asked}  # fmt: skip
        command = f"{sys.executable} {script} {dump.name} {spec.seconds} {spec.fail_attempts} {STOP_S}"
        return {"tags": {"command": command}, "serviceRequestPayload": json.dumps(payload)}

    def records(self, stack: Stack) -> list[Record]:
        path = self._records_path(stack)
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [Record(line["event"], line["jobId"], line["attempt"], line["ns"]) for line in lines]

    @staticmethod
    def _records_path(stack: Stack) -> Path:
        return stack.directory / "job-records.jsonl"


class SimulatedTarget(_OneProcess):
    name = "simulated"
    args = ("--speed", "1")
    long_s = 4.0  # long enough to preempt, terminate or kill it; short enough to wait out
    follows_restarts = True
    fails_only_first = False  # tag outcome=FAILED fails every attempt
    skips = NO_CAPACITY

    def job(self, stack: Stack, spec: JobSpec, quantity: int) -> dict[str, Any]:
        tags = {"duration": str(spec.seconds)}
        if spec.fail_attempts:
            tags["outcome"] = "FAILED"
        return {"tags": tags, **usage(quantity)}


class ProcessTarget(_JobScript, _OneProcess):
    follows_restarts = True
    name = "process"
    skips = NO_CAPACITY


class SageMakerTarget(_OneProcess):
    """moto's server is started with the first executor and kept for the stack."""

    name = "sagemaker"
    reports_running = False  # moto's jobs go from created (STARTING) to Completed
    fails_only_first = False  # a payload botocore refuses is refused on every attempt
    records_stops = False  # moto's recorder shows the creates; a job never runs to stop
    skips = {
        "preemptor_starts_after_its_victims_stopped": INSTANT_REASON.format("preempt"),
        "a_late_report_about_a_preempted_attempt_changes_nothing": INSTANT_REASON.format("preempt"),
        "terminate_stops_the_running_attempt": INSTANT_REASON.format("terminate"),
        "a_restart_follows_the_running_attempts":
            "moto completes every training job at creation: no attempt is ever running to "
            "follow across a restart; following one by its name after SIGTERM and SIGKILL is "
            "tested in tests/integration/test_sagemaker_executor.py, what a restart does with "
            "each status in tests/unit/test_sagemaker_executor.py",
        "an_attempt_that_cannot_be_placed_is_reported_insufficient_capacity":
            "moto never refuses or fails a training job for capacity; the mapping of "
            "ResourceLimitExceeded and CapacityError is unit-tested",
    }  # fmt: skip
    POLL_S = 3.0  # the first DescribeTrainingJob comes this long after the create: the window
    # in which the executor can be killed mid-attempt (moto has completed the job already)
    moto = None

    def environment(self, stack: Stack) -> dict[str, str]:
        from tests.integration.test_sagemaker_executor import Moto, executor_env

        if self.moto is None:
            self.moto = Moto(stack.directory)
        # moto answers StopTrainingJob with HTTP 500: one retry, not botocore's usual four
        return {**executor_env(self.moto, poll_s=self.POLL_S), "AWS_RETRY_MODE": "standard",
                "AWS_MAX_ATTEMPTS": "2"}  # fmt: skip

    def job(self, stack: Stack, spec: JobSpec, quantity: int) -> dict[str, Any]:
        """A CreateTrainingJob request (moto ignores `spec.seconds`); a failing one lacks
        RoleArn, which botocore refuses before sending it."""
        from tests.integration.test_sagemaker_executor import PAYLOAD

        payload = {**PAYLOAD, "ResourceConfig": {**PAYLOAD["ResourceConfig"],
                                                 "InstanceCount": quantity}}  # fmt: skip
        if spec.fail_attempts:
            del payload["RoleArn"]
        return {"serviceJobType": "SAGEMAKER_TRAINING",
                "serviceRequestPayload": json.dumps(payload)}

    def records(self, stack: Stack) -> list[Record]:
        """Each CreateTrainingJob call, named by the attempt's two tags (no time: moto's
        recorder keeps none)."""
        records = []
        for call in self.moto.calls("CreateTrainingJob") if self.moto else []:
            tags = {tag["Key"]: tag["Value"] for tag in call.get("Tags", [])}
            records.append(Record("start", tags[JOB_ID_TAG], int(tags[ATTEMPT_TAG])))
        return records

    def close(self) -> None:
        if self.moto is not None:
            self.moto.stop()


class AgentTarget(_JobScript, ExecutorUnderTest):
    name = "agent"
    HOSTS = {"h1": "0,1", "h2": "2"}
    OPTIONS = ("--heartbeat", "0.3", "--host-timeout", "5", "--place-timeout", "1.5",
               "--grace", "3", "--victim-timeout", "10")  # fmt: skip
    capacity = 3
    created_capacity = 0  # the agents publish their GPUs
    follows_restarts = True  # started again within --host-timeout (5 s here)
    unplaceable_quantity = 3  # the fleet has 3 GPUs, no host has 3

    def __init__(self) -> None:
        self.processes: list[Process] = []

    def start(self, stack: Stack) -> None:
        self.processes = [
            stack.spawn("agent", "--host", host, "--gpus", gpus, "--capacity-unit", UNIT,
                        "--service-environment", ENVIRONMENT,
                        "--state-dir", str(stack.directory / host), *self.OPTIONS)
            for host, gpus in self.HOSTS.items()]  # fmt: skip

    def kill(self) -> None:
        for process in self.processes:
            process.kill()

    def stop(self) -> None:
        for process in self.processes:
            assert process.stop() == 0

    async def ready(self, stack: Stack, bus: Bus) -> None:
        """Until the environment's capacity is every host's GPUs (both agents joined)."""

        async def full():
            found = [limit["maxCapacity"] for f in await read_facts(bus.js)
                     if f["kind"] == "ServiceEnvironmentUpdated"
                     for limit in f["capacityLimits"] if limit["capacityUnit"] == UNIT]
            return found and found[-1] == self.capacity

        await eventually(full, WAIT_S, what=f"{ENVIRONMENT} capacity {self.capacity}")


TARGETS: dict[str, type[ExecutorUnderTest]] = {
    "simulated": SimulatedTarget, "process": ProcessTarget, "sagemaker": SageMakerTarget,
    "agent": AgentTarget,
}
