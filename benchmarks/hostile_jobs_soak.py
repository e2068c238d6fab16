"""Soak with a hostile job class: one team's jobs attack the service from inside their attempts.

    .venv/bin/python benchmarks/hostile_jobs_soak.py                 # ~40 hostile jobs, 2-3 min
    .venv/bin/python benchmarks/hostile_jobs_soak.py --rounds 100 --faults 10 --seed 7
    .venv/bin/python benchmarks/hostile_jobs_soak.py --smoke         # what `make test` runs

The secured stack as an operator deploys it: `quotasched auth generate` for examples/shares.yaml
(queue q, shares qs1-qs3), a real nats-server with the generated users, the scheduler and a
process executor each under its own role (the executor's credentials in its environment, as
the docs say), jobs run as the user `nobody` (`--run-as`) when the soak runs as root.  Team qs1
submits honest jobs (short real processes, retried if an executor restart loses them); team
qs2 submits, beside them, jobs that run tests/reliability/hostile_job.sh: each dumps every
environment it can read, searches files for credentials, tries every credential it found
(and none) on the bus to fail qs1's running job and to repoint or delete the executor's
consumer, starts a setsid child and a double-forked daemon, and tries to write the executor's
ledger, state directory and logs.  With --faults, the executor is SIGKILLed at random moments
and started again (its ledger then says what to stop).

At the end it checks, from the scheduler's facts, the server and the kernel:
  - every honest job SUCCEEDED and no status anywhere carries the hostile job's forged reason;
  - the executor's consumer has the configuration it was created with;
  - no process any hostile attempt started is alive (its setsid child and its daemon);
  - no hostile job found a credential, and nothing it tried to write was written;
  - the executor still runs a job submitted after everything else.
It prints the figures and the checks; exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nats.js.errors import NotFoundError  # noqa: E402

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM, command_subject  # noqa: E402
from quotasched.services.config.auth import read_credentials  # noqa: E402
from quotasched.services.client import Bus  # noqa: E402
from quotasched.services.nats.embedded import EmbeddedServer  # noqa: E402
from tests.integration.conftest import QUOTASCHED, Process  # noqa: E402
from tests.integration.helpers import eventually, holder_of, read_facts, wait_decided  # noqa: E402
from tests.reliability.support import escaped_children, hostile_job_folder, sleeper_alive  # noqa: E402

SHARES = ROOT / "examples" / "shares.yaml"
G5 = "ml.g5.xlarge"
CONSUMER = "executor-process"
FORGED = "forged by a hostile job"
CHECKED_CONFIG = ("filter_subject", "ack_policy", "deliver_policy", "deliver_subject")


class Stack:
    def __init__(self, root: Path, run_as: str | None):
        self.root = root
        self.run_as = run_as
        out = root / "auth"
        done = subprocess.run([QUOTASCHED, "auth", "generate", "--config", str(SHARES),
                               "--out", str(out)], capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"auth generate failed: {done.stderr}")
        self.server = EmbeddedServer(root / "nats", extra_args=["-c", str(out / "nats-server.conf")]).start()
        self.creds = {path.name.removesuffix(".env"): read_credentials(path)
                      for path in (out / "creds").iterdir()}  # fmt: skip
        # What hostile jobs may read or write: a world-writable report folder and the script.
        self.shared, self.script, self.reports = hostile_job_folder()
        self.state_dir = root / "executor-state"
        self.started = 0
        self.base_env = {key: value for key, value in os.environ.items()
                         if not key.startswith("QUOTASCHED_")}  # fmt: skip
        self.scheduler = self.spawn("scheduler", role="scheduler")
        self.executor: Process | None = None  # once the scheduler made the streams

    def env(self, role: str) -> dict[str, str]:
        return {**self.base_env, "QUOTASCHED_NATS_URL": self.server.url, **self.creds[role],
                "QUOTASCHED_TICK_INTERVAL_S": "0.5", "QUOTASCHED_LEASE_TTL_S": "3"}  # fmt: skip

    def spawn(self, *args: str, role: str) -> Process:
        self.started += 1
        return Process(list(args), self.env(role), self.root / f"{args[0]}-{self.started}.log")

    def start_executor(self) -> Process:
        extra = ["--run-as", self.run_as] if self.run_as else []
        return self.spawn("executor", "--kind", "process", "--state-dir", str(self.state_dir),
                          *extra, role="executor")  # fmt: skip

    def restart_executor(self) -> None:
        self.executor.kill()
        self.executor.log.close()
        self.executor = self.start_executor()

    def stop(self) -> None:
        for process in (self.executor, self.scheduler):
            if process is not None:
                process.stop()
        self.server.stop()


def honest_job(name: str, seconds: float) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": name, "jobName": name, "jobQueue": "q",
            "quotaShareName": "qs1", "schedulingPriority": 1,
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}],
            "retryStrategy": {"attempts": 10},
            "tags": {"command": f"sleep {seconds:.2f}"}}  # fmt: skip


def hostile_job(name: str, stack: Stack, victim: str) -> dict:
    host, port = stack.server.url.removeprefix("nats://").rsplit(":", 1)
    targets = [stack.state_dir, stack.state_dir / f"{CONSUMER}.json", stack.root / "auth"]
    command = " ".join(["bash", str(stack.script), str(stack.reports), host, port, "q", "qs1",
                        victim, *map(str, targets)])  # fmt: skip
    return {"kind": "SubmitServiceJob", "jobId": name, "jobName": name, "jobQueue": "q",
            "quotaShareName": "qs2", "schedulingPriority": 1,
            "serviceRequestPayload": json.dumps({  # the payload: a tag holds 256 characters
                "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 1},
                "Command": command})}  # fmt: skip


async def consumer_config(js) -> dict | None:
    """The checked fields of the executor's consumer; None while it does not exist."""
    try:
        info = await js.consumer_info(FACTS_STREAM, CONSUMER)
    except NotFoundError:
        return None
    return {key: str(getattr(info.config, key)) for key in CHECKED_CONFIG}


async def statuses(js) -> dict[str, str]:
    last: dict[str, str] = {}
    for fact in await read_facts(js):
        if fact["kind"] == "JobStatusChanged":
            last[fact["jobId"]] = fact["status"]
    return last


async def soak(rounds: int, faults: int, seed: int, root: Path, run_as: str | None) -> bool:
    began = time.monotonic()
    rng = random.Random(seed)
    stack = Stack(root, run_as)
    checks: dict[str, bool] = {}
    figures: dict[str, int] = {"honest jobs": 0, "hostile jobs": 0, "executor SIGKILLs": 0}
    try:
        await eventually(lambda: asyncio.sleep(0, holder_of(stack.scheduler)), 60,
                         what="a scheduler leading")  # fmt: skip
        stack.executor = stack.start_executor()  # its role may not create the streams
        admin = {"QUOTASCHED_NATS_URL": stack.server.url, **stack.creds["admin"]}
        env = {**stack.base_env, **admin}
        applied = subprocess.run([QUOTASCHED, "config", "apply", str(SHARES)], env=env,
                                 capture_output=True, text=True, timeout=120)  # fmt: skip
        if applied.returncode != 0:
            raise SystemExit(f"config apply failed: {applied.stdout}{applied.stderr}")
        async with Bus(stack.server.url, credentials=stack.creds["admin"]) as bus:
            await eventually(lambda: consumer_config(bus.js), 60, what="the executor's consumer")
            created = await consumer_config(bus.js)
            fault_rounds = set(rng.sample(range(1, rounds + 1), min(faults, rounds)))
            last = 0
            for number in range(1, rounds + 1):
                honest = f"honest-{number}"
                for command in (honest_job(honest, rng.uniform(0.3, 2.0)),
                                hostile_job(f"hostile-{number}", stack, honest)):  # fmt: skip
                    subject = command_subject("SubmitServiceJob", "q", command["quotaShareName"])
                    ack = await bus.js.publish(subject, json.dumps(command).encode(),
                                               stream=COMMANDS_STREAM)  # fmt: skip
                    last = ack.seq
                figures["honest jobs"] += 1
                figures["hostile jobs"] += 1
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                if number in fault_rounds:
                    stack.restart_executor()
                    figures["executor SIGKILLs"] += 1
            await wait_decided(bus.js, last, timeout=120, processes=[stack.scheduler])

            async def all_over():
                last_status = await statuses(bus.js)
                names = [f"{team}-{n}" for team in ("honest", "hostile") for n in range(1, rounds + 1)]
                return all(last_status.get(name) in ("SUCCEEDED", "FAILED") for name in names)

            try:
                await eventually(all_over, 60 + 10 * rounds, interval=0.5, what="every job ended")
            except AssertionError:
                for fact in await read_facts(bus.js):
                    if fact["kind"] == "CommandRejected":
                        print(f"refused: {fact.get('statusReason')}", flush=True)
                print(f"last statuses: {await statuses(bus.js)}", flush=True)
                raise
            # a job after everything: the executor still executes
            ack = await bus.js.publish(command_subject("SubmitServiceJob", "q", "qs1"),
                                       json.dumps(honest_job("after", 0.1)).encode(),
                                       stream=COMMANDS_STREAM)  # fmt: skip

            async def after_ran():
                return (await statuses(bus.js)).get("after") == "SUCCEEDED"

            try:
                await eventually(after_ran, 60, interval=0.5, what="a job after the attack")
                checks["the executor still runs a job submitted after the attack"] = True
            except AssertionError:
                checks["the executor still runs a job submitted after the attack"] = False
            facts = await read_facts(bus.js)
            last_status = await statuses(bus.js)
            honest_names = [f"honest-{n}" for n in range(1, rounds + 1)]
            checks["every honest job SUCCEEDED"] = all(
                last_status.get(name) == "SUCCEEDED" for name in honest_names)
            checks["no status carries the forged reason"] = not any(
                FORGED in json.dumps(fact) for fact in facts)
            checks["the executor's consumer kept its configuration"] = (
                await consumer_config(bus.js) == created)
    finally:
        stack.stop()
        reports = {path.name: path.read_text(errors="replace")
                   for path in stack.reports.glob("*.report")} if stack.reports.exists() else {}
    pids = [pid for report_dir in stack.reports.glob("*") if report_dir.is_dir()
            for pid in escaped_children(report_dir)]  # fmt: skip
    survivors = [pid for pid in pids if sleeper_alive(pid)]
    for pid in survivors:  # leave the machine clean whatever the verdict
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(stack.shared, ignore_errors=True)
    text = "\n".join(reports.values())
    checks["no process a hostile attempt started is alive"] = not survivors
    checks["no hostile job found a credential"] = "found credentials" not in text
    checks["nothing a hostile job tried to write was written"] = "WROTE" not in text
    checks["every hostile job reported what it tried"] = len(reports) >= figures["hostile jobs"]
    checks["the bus refused every hostile connection"] = all(
        "Authorization Violation" in text and "+OK" not in text for text in reports.values())
    if run_as is not None:
        uid = pwd.getpwnam(run_as).pw_uid if not run_as.isdigit() else int(run_as)
        checks[f"every hostile job ran as {run_as}"] = all(
            text.startswith(f"uid {uid} ") for text in reports.values())
    ok = all(checks.values())
    print(f"\nhostile jobs soak seed {seed}: {figures['honest jobs']} honest jobs, "
          f"{figures['hostile jobs']} hostile jobs ({len(reports)} attempts reported, "
          f"{len(pids)} escaping children started, {len(survivors)} alive at the end), "
          f"{figures['executor SIGKILLs']} executor SIGKILLs, jobs run as "
          f"{run_as or 'the executor user'}; {time.monotonic() - began:.0f} s")  # fmt: skip
    for name, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'} {name}")
    if not ok:
        print(f"logs in {root}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40, help="honest + hostile job pairs")
    parser.add_argument("--faults", type=int, default=4, help="executor SIGKILLs (and restarts)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="4 rounds, 1 fault: for make test")
    parser.add_argument("--run-as", default="nobody" if os.geteuid() == 0 else None,
                        help="the user jobs run as (default: nobody when root, else the executor's)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.faults = 4, 1
    root = Path(tempfile.mkdtemp(prefix="quotasched-hostile-soak-"))
    os.chmod(root, 0o755)  # the job user walks down to its working directory (executor-state/work)
    ok = asyncio.run(soak(args.rounds, args.faults, args.seed, root, args.run_as))
    if args.keep or not ok:
        print(f"logs and stores kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
