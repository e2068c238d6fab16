"""The job itself is hostile (issue 28): a tenant's job runs on the executor's host, beside the
executor that holds the scheduler's keys.

On a nats-server secured with the roles of `quotasched auth generate`, the process executor
runs under its own role, its credentials in its environment (QUOTASCHED_NATS_USER=executor
and its password), as a deployment sources its role's credentials file.  Team qs2 runs a job;
team qs1 submits a job that looks for every credential it can find (its environment, any file
a variable names) and tries each: connecting to NATS with it (and without any), publishing a
forged `ReportJobStatus` marking team qs2's RUNNING job FAILED, and changing the executor's
durable consumer's filter so that nothing is executed any more.  It used to succeed at both:
the executor passed its whole environment to every job.

Expected: the job finds no credential, every attempt fails, team qs2's job SUCCEEDS, and the
executor runs the jobs submitted after.  A job whose payload asks for the executor's password
by name (`Environment`) fails its attempt with a reason naming the variable.

`TestTheJobItselfIsHostileAsAnotherUser` runs the whole class, tests/reliability/hostile_job.sh
(every environment and credentials file it can read, the bus with each credential and none,
a `setsid` child and a daemon, writes into the executor's state), under `--run-as nobody`:
the executor's `/proc` and files are out of its reach, nothing it starts outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from quotasched.events.codec import decode_command
from quotasched.events.subjects import COMMANDS_STREAM, command_subject, subject_for_command
from tests.integration.helpers import NO_TICKS, NOTEBOOK, eventually, wait_decided
from tests.integration.test_failover import wait_leading
from tests.reliability.support import escaped_children, hostile_job_folder, sleeper_alive
from tests.reliability.test_permissions import (  # noqa: F401
    Client,
    generated,
    open_gate,
    secured,
    team_subject,
    without_url,
)

pytestmark = [pytest.mark.nats, pytest.mark.slow]

G5 = "ml.g5.xlarge"
EXECUTOR_CONSUMER = "executor-process"

# The hostile job: argv = NATS URL, the victim's job id, where to write what it found and did.
HOSTILE_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys
    import nats
    url, victim, out = sys.argv[1:4]
    found = {k: v for k, v in os.environ.items()
             if k.startswith(("QUOTASCHED_NATS_", "NATS_", "AWS_")) or "CRED" in k.upper()}
    for value in list(os.environ.values()):  # any file a variable names may hold keys
        if value.endswith((".env", ".creds")) and os.access(value, os.R_OK):
            for line in open(value, errors="replace"):
                key, _, val = line.strip().partition("=")
                if key.startswith("QUOTASCHED_NATS_"):
                    found[key] = val
    tries = []
    identities = [None]
    if found.get("QUOTASCHED_NATS_USER"):
        identities.append((found["QUOTASCHED_NATS_USER"],
                           found.get("QUOTASCHED_NATS_PASSWORD", "")))

    async def attack(identity):
        options = {} if identity is None else {"user": identity[0], "password": identity[1]}
        if identity is not None and found.get("QUOTASCHED_NATS_INBOX_PREFIX"):
            options["inbox_prefix"] = found["QUOTASCHED_NATS_INBOX_PREFIX"]
        try:
            nc = await nats.connect(url, allow_reconnect=False, connect_timeout=3, **options)
        except Exception as error:
            tries.append(["connect", str(identity and identity[0]), "refused", repr(error)[:200]])
            return
        tries.append(["connect", str(identity and identity[0]), "connected", ""])
        js = nc.jetstream(timeout=3)
        forged = {"kind": "ReportJobStatus", "jobId": victim, "attempt": 1, "status": "FAILED",
                  "statusReason": "forged by team qs1's job"}
        try:
            ack = await js.publish("qm.cmd.q.qs2.ReportJobStatus", json.dumps(forged).encode(),
                                   stream="QM_COMMANDS")
            tries.append(["forge a report", "", "stored", str(ack.seq)])
        except Exception as error:
            tries.append(["forge a report", "", "refused", repr(error)[:200]])
        try:
            from nats.js.api import ConsumerConfig
            info = await js.consumer_info("QM_FACTS", "executor-process")
            config = ConsumerConfig.from_response(info.config.as_dict())
            config.name, config.filter_subject = None, "qm.fact.nobody.>"
            await js.add_consumer("QM_FACTS", config)
            tries.append(["change the executor's consumer", "", "changed", ""])
        except Exception as error:
            tries.append(["change the executor's consumer", "", "refused", repr(error)[:200]])
        await nc.close()

    async def main():
        for identity in identities:
            await attack(identity)

    asyncio.run(main())
    with open(out, "w") as handle:
        json.dump({"found": sorted(found), "tries": tries, "environ": sorted(os.environ)}, handle)
""")


def hostile_job(folder: Path, url: str, victim: str) -> tuple[dict, Path]:
    """Team qs1's hostile job (its SubmitServiceJob fields) and where it writes what it found
    and did (JSON: found, tries, environ)."""
    script, out = folder / "hostile.py", folder / "hostile.json"
    script.write_text(HOSTILE_SCRIPT)
    command = f"{sys.executable} {script} {url} {victim} {out}"
    return {"tags": {"command": command},
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}, out  # fmt: skip


def submission(job_id: str, share: str, fields: dict) -> bytes:
    return json.dumps({"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id,
                       "jobQueue": "q", "quotaShareName": share, "schedulingPriority": 1,
                       **fields}).encode()  # fmt: skip


def sleeping(seconds: float) -> dict:
    return {"tags": {"command": f"sleep {seconds}"},
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


async def configure(admin: Client, scheduler) -> None:
    """The notebook's environment, policy, queue q and shares qs1-qs3, decided."""
    for line in [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]:
        subject = subject_for_command(decode_command(line))
        ack = await admin.js.publish(subject, line.encode(), stream=COMMANDS_STREAM)
    await wait_decided(admin.js, ack.seq, processes=[scheduler])


async def job_status(client: Client, job_id: str) -> dict:
    reply = await client.nc.request("qm.api.q.describe-service-job",
                                    json.dumps({"jobId": job_id}).encode(), timeout=5.0)
    return json.loads(reply.data)


async def until_status(client: Client, job_id: str, *statuses: str, timeout: float = 60) -> dict:
    seen: list[dict] = [{}]

    async def reached():
        seen[0] = await job_status(client, job_id)
        return seen[0] if seen[0].get("status") in statuses else None

    try:
        return await eventually(reached, timeout, what=f"{job_id} {'/'.join(statuses)}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last described: {seen[0]}") from None


class TestTheJobItselfIsHostile:
    async def test_a_job_finds_no_credential_and_can_harm_no_other_team(self, secured, spawn,
                                                                         tmp_path):  # fmt: skip
        server, creds = secured
        anonymous = {"QUOTASCHED_NATS_URL": server.url}
        scheduler = spawn("scheduler", **anonymous, **NO_TICKS, **without_url(creds["scheduler"]))
        await open_gate(spawn, server.url, creds)
        await wait_leading(scheduler)
        executor = spawn("executor", "--kind", "process", **anonymous,
                         **without_url(creds["executor"]))  # its role's keys in its environment
        async with Client(creds["admin"]) as admin, \
                Client(creds["pipeline-q-qs1"]) as team_a, \
                Client(creds["pipeline-q-qs2"]) as team_b:  # fmt: skip
            await configure(admin, scheduler)

            await team_b.js.publish(team_subject("SubmitServiceJob", "q", "qs2"),
                                    submission("victim", "qs2", sleeping(6)),
                                    stream=COMMANDS_STREAM)  # fmt: skip
            await until_status(admin, "victim", "RUNNING")
            fields, out = hostile_job(tmp_path, server.url, "victim")
            await team_a.js.publish(team_subject("SubmitServiceJob", "q", "qs1"),
                                    submission("hostile", "qs1", fields), stream=COMMANDS_STREAM)
            greedy = {"serviceRequestPayload": json.dumps({
                "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 1},
                "Environment": {"QUOTASCHED_NATS_PASSWORD": "give it to me"}}),
                "tags": {"command": "true"}}  # fmt: skip
            await team_a.js.publish(team_subject("SubmitServiceJob", "q", "qs1"),
                                    submission("greedy", "qs1", greedy), stream=COMMANDS_STREAM)
            hostile = await until_status(admin, "hostile", "SUCCEEDED", "FAILED")
            assert hostile["status"] == "SUCCEEDED", hostile
            victim = await until_status(admin, "victim", "SUCCEEDED", "FAILED")
            refused = await until_status(admin, "greedy", "SUCCEEDED", "FAILED")
            await admin.js.publish(command_subject("SubmitServiceJob", "q", "qs3"),
                                   submission("later", "qs3", sleeping(0.2)),
                                   stream=COMMANDS_STREAM)  # fmt: skip
            later = await until_status(admin, "later", "SUCCEEDED", "FAILED")

        report = json.loads(out.read_text())
        assert report["found"] == [], f"the job found credentials: {report['found']}"
        assert [t[2] for t in report["tries"]] == ["refused"], report["tries"]  # anonymous
        assert victim["status"] == "SUCCEEDED", f"team qs2's job: {victim}"
        assert later["status"] == "SUCCEEDED", f"a job after the hostile one: {later}"
        assert refused["status"] == "FAILED"
        assert "QUOTASCHED_NATS_PASSWORD" in refused["statusReason"], refused
        assert "consumer was changed" not in executor.output()
        assert executor.popen.poll() is None, executor.output()[-2000:]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="--run-as needs root (CI runs as root)")


@needs_root
class TestTheJobItselfIsHostileAsAnotherUser:
    """The whole hostile class (tests/reliability/hostile_job.sh): with `--run-as nobody`, a job
    reads no environment but its own (the executor is non-dumpable and root's), finds no
    credentials file, writes nothing of the executor's, and leaves nothing running."""

    async def test_a_job_run_as_another_user_finds_nothing_writes_nothing_and_leaves_nothing(
            self, secured, spawn):  # fmt: skip
        server, creds = secured
        shared, script, reports = hostile_job_folder()
        state = Path(tempfile.mkdtemp(prefix="quotasched-state-", dir="/tmp"))
        os.chmod(state, 0o755)  # as an operator's /var/lib/quotasched: the executor tightens it
        try:
            anonymous = {"QUOTASCHED_NATS_URL": server.url}
            scheduler = spawn("scheduler", **anonymous, **NO_TICKS,
                              **without_url(creds["scheduler"]))  # fmt: skip
            await wait_leading(scheduler)
            await open_gate(spawn, server.url, creds)
            executor = spawn("executor", "--kind", "process", "--run-as", "nobody",
                             "--state-dir", str(state), **anonymous,
                             **without_url(creds["executor"]))  # fmt: skip
            async with Client(creds["admin"]) as admin, \
                    Client(creds["pipeline-q-qs1"]) as team_a, \
                    Client(creds["pipeline-q-qs2"]) as team_b:  # fmt: skip
                await configure(admin, scheduler)
                await team_b.js.publish(team_subject("SubmitServiceJob", "q", "qs2"),
                                        submission("victim", "qs2", sleeping(8)),
                                        stream=COMMANDS_STREAM)  # fmt: skip
                try:
                    await until_status(admin, "victim", "RUNNING")
                except AssertionError as error:
                    raise AssertionError(f"{error}\nexecutor: {executor.output()[-3000:]}") from None
                host, port = server.url.removeprefix("nats://").rsplit(":", 1)
                ledger = state / f"{EXECUTOR_CONSUMER}.json"
                command = " ".join(["bash", str(script), str(reports), host, port, "q", "qs2",
                                    "victim", str(state), str(ledger), str(state / "work")])
                await team_a.js.publish(team_subject("SubmitServiceJob", "q", "qs1"),
                                        submission("hostile", "qs1", {
                                            "tags": {"command": command},
                                            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}),
                                        stream=COMMANDS_STREAM)  # fmt: skip
                hostile = await until_status(admin, "hostile", "SUCCEEDED", "FAILED", timeout=90)
                victim = await until_status(admin, "victim", "SUCCEEDED", "FAILED")
                await admin.js.publish(command_subject("SubmitServiceJob", "q", "qs3"),
                                       submission("later", "qs3", sleeping(0.2)),
                                       stream=COMMANDS_STREAM)  # fmt: skip
                later = await until_status(admin, "later", "SUCCEEDED", "FAILED")

            report = (reports / "hostile-1.report").read_text()
            assert hostile["status"] == "SUCCEEDED", (hostile.get("statusReason"), report)
            children = escaped_children(reports / "hostile-1")
            assert len(children) == 2, children
            assert report.startswith("uid 65534 "), report  # it ran as nobody
            assert "found credentials" not in report and "credential variable" not in report, report
            assert "WROTE" not in report, report
            assert report.count("refused: write") == 3, report
            assert "Authorization Violation" in report, report  # without credentials: no bus
            survivors = [pid for pid in children if sleeper_alive(pid)]
            assert not survivors, f"{survivors} outlived the attempt"
            assert victim["status"] == "SUCCEEDED", f"team qs2's job: {victim}"
            assert later["status"] == "SUCCEEDED", f"a job after the hostile one: {later}"
            assert "planted" not in ledger.read_text() if ledger.exists() else True
            assert not list(state.glob("planted-by-*"))
            assert not (state / "work" / "hostile").exists()  # its directory went with it
            assert state.stat().st_mode & 0o777 == 0o711  # traversable to the work dir only
            assert "consumer was changed" not in executor.output()
            assert executor.popen.poll() is None, executor.output()[-2000:]
        finally:
            shutil.rmtree(shared, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
