"""The `agent` role of `quotasched auth generate`, live (issue 28, point 4): a nats-server
started with the generated configuration, the scheduler under its role, `quotasched agent`
under the agent's own credentials file, and a team's job that runs on it to SUCCEEDED.

Then what the agent (and the plain executor) may no longer do, tried on the wire: take over or
change a team's consumer on the fact log, delete any consumer but its own, report a job's
status outside the configured job queues, publish commands other than its own.
"""

from __future__ import annotations

import json
import sys

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM, command_subject
from quotasched.services.config.auth import CONSUMER_SLOTS
from tests.integration.helpers import G5, NO_TICKS, NOTEBOOK, eventually, wait_decided
from tests.integration.test_failover import wait_leading
from tests.reliability.test_permissions import (  # noqa: F401
    Client,
    generated,
    open_gate,
    secured,
    team_subject,
    without_url,
)

pytestmark = [pytest.mark.nats, pytest.mark.slow]

JOB = "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"


async def configure(admin: Client, scheduler) -> None:
    """Environment se (3 G5), policy sp, queue q, shares qs1-qs3: the notebook's first lines."""
    from quotasched.events.codec import decode_command
    from quotasched.events.subjects import subject_for_command

    lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
    for line in lines:
        ack = await admin.js.publish(subject_for_command(decode_command(line)), line.encode(),
                                     stream=COMMANDS_STREAM)  # fmt: skip
    await wait_decided(admin.js, ack.seq, processes=[scheduler])


async def test_the_agent_starts_and_runs_a_teams_job_under_its_generated_credentials(
        secured, spawn, tmp_path):  # fmt: skip
    server, creds = secured
    anonymous = {"QUOTASCHED_NATS_URL": server.url}
    scheduler = spawn("scheduler", **anonymous, **NO_TICKS, **without_url(creds["scheduler"]))
    await wait_leading(scheduler)
    await open_gate(spawn, server.url, creds)
    async with Client(creds["admin"]) as admin, Client(creds["pipeline-q-qs1"]) as team:
        await configure(admin, scheduler)
        agent = spawn("agent", "--host", "h1", "--gpus", "0,1", "--capacity-unit", G5,
                      "--service-environment", "se", "--state-dir", str(tmp_path / "h1"),
                      "--heartbeat", "0.3", "--host-timeout", "1.5", **anonymous,
                      **without_url(creds["agent"]))  # fmt: skip

        async def capacity_published():
            assert agent.popen.poll() is None, agent.output()[-3000:]
            reply = await admin.nc.request("qm.api.~.describe-service-environments", b"{}",
                                           timeout=2)  # fmt: skip
            limits = json.loads(reply.data)["serviceEnvironments"][0]["capacityLimits"]
            return limits == [{"capacityUnit": G5, "maxCapacity": 2}]

        await eventually(capacity_published, 30, what="the agent's capacity (2 GPUs) published")
        job = {"kind": "SubmitServiceJob", "jobId": "trained", "jobName": "trained",
               "jobQueue": "q", "quotaShareName": "qs1", "tags": {"command": f"{sys.executable} "
                                                                  f"-c \"{JOB}\""},
               "capacityUsage": [{"capacityUnit": G5, "quantity": 2}]}  # fmt: skip
        await team.js.publish(team_subject("SubmitServiceJob", "q", "qs1"),
                              json.dumps(job).encode(), stream=COMMANDS_STREAM)  # fmt: skip

        async def succeeded():
            assert agent.popen.poll() is None, agent.output()[-3000:]
            reply = await team.nc.request("qm.api.q.qs1.describe-service-job",
                                          b'{"jobId": "trained"}', timeout=2)  # fmt: skip
            return json.loads(reply.data).get("status") == "SUCCEEDED"

        await eventually(succeeded, 60, what="the team's job SUCCEEDED on the agent")
        log = (tmp_path / "h1" / "logs" / "trained" / "1.log").read_text()
        assert "gpus 0,1" in log, log
    assert agent.popen.poll() is None, agent.output()[-3000:]
    assert agent.stop() == 0, agent.output()[-3000:]  # it leaves the fleet, as it may
    assert "permissions violation" not in agent.output().lower(), agent.output()[-3000:]


TEAM_SLOT = "pipeline-q-qs1-0"


async def take_over_team_consumer(client: Client) -> None:
    """Create (or change) a durable consumer under a team's slot name: the whole log to it."""
    await client.js.add_consumer(FACTS_STREAM, ConsumerConfig(
        durable_name=TEAM_SLOT, deliver_policy=DeliverPolicy.ALL, ack_policy="explicit",
        deliver_subject=client.nc.new_inbox()), timeout=1)  # fmt: skip


@pytest.mark.parametrize("role", ["executor", "agent"])
async def test_an_executor_role_cannot_touch_a_teams_consumer_nor_the_schedulers_nor_report_elsewhere(
        secured, role):  # fmt: skip
    _, creds = secured
    async with Client(creds["scheduler"]) as scheduler:
        from quotasched.services.nats.bus import ensure_streams
        from quotasched.services.settings import Settings

        await ensure_streams(scheduler.js, Settings())
    async with Client(creds["admin"]) as admin:  # a team's consumer, as its client makes it
        await admin.js.add_consumer(FACTS_STREAM, ConsumerConfig(
            name=TEAM_SLOT, filter_subject="qm.fact.q.qs1.*", ack_policy="none",
            deliver_subject="_INBOX_pipeline-q-qs1.mine", inactive_threshold=60.0))
    async with Client(creds[role]) as executor:
        executor.js = executor.nc.jetstream(timeout=1.0)  # refusals never answer: wait less
        # its own durable consumer (any `executor-...` name) is created and inspected
        await executor.js.add_consumer(FACTS_STREAM, ConsumerConfig(
            durable_name="executor-mine", deliver_policy=DeliverPolicy.ALL,
            ack_policy="explicit", deliver_subject=executor.nc.new_inbox()), timeout=2)
        await executor.js.consumer_info(FACTS_STREAM, "executor-mine")
        for slot in (0, CONSUMER_SLOTS - 1):  # a team's slots: neither created nor changed
            name = f"pipeline-q-qs1-{slot}"
            with pytest.raises(Exception):
                await executor.js.add_consumer(FACTS_STREAM, ConsumerConfig(
                    durable_name=name, deliver_policy=DeliverPolicy.ALL, ack_policy="explicit",
                    deliver_subject=executor.nc.new_inbox()), timeout=1)  # fmt: skip
            await executor.violation(f"$JS.API.CONSUMER.DURABLE.CREATE.{FACTS_STREAM}.{name}")
            with pytest.raises(Exception):
                await executor.js.add_consumer(FACTS_STREAM, ConsumerConfig(
                    name=name, filter_subject="qm.fact.>", ack_policy="explicit",
                    deliver_subject=executor.nc.new_inbox()), timeout=1)  # fmt: skip
            await executor.violation(f"$JS.API.CONSUMER.CREATE.{FACTS_STREAM}.{name}.qm.fact.>")
        for stream, name in ((FACTS_STREAM, TEAM_SLOT), (COMMANDS_STREAM, "scheduler-main")):
            with pytest.raises(Exception):
                await executor.js.delete_consumer(stream, name)
            await executor.violation(f"$JS.API.CONSUMER.DELETE.{stream}.{name}")
        # its own consumer it may delete: a changed one is recreated as declared (watch.py)
        await executor.js.delete_consumer(FACTS_STREAM, "executor-mine")
        report = json.dumps({"kind": "ReportJobStatus", "jobId": "x", "status": "FAILED",
                             "attempt": 1}).encode()  # fmt: skip
        for subject in (command_subject("ReportJobStatus", "other", "qs1"),  # not configured
                        command_subject("ReportJobStatus"),  # fleet-wide `~.~`
                        command_subject("SubmitServiceJob", "q", "qs1"),
                        command_subject("UpdateQuotaShare", "q", "qs1"),
                        command_subject("Tick", "q")):  # fmt: skip
            await executor.refused_publish(subject, report)
        ack = await executor.js.publish(command_subject("ReportJobStatus", "q", "qs1"), report,
                                        stream=COMMANDS_STREAM)  # fmt: skip
        assert ack.seq > 0
    async with Client(creds["pipeline-q-qs1"]) as team:  # and a team cannot touch executors'
        team.js = team.nc.jetstream(timeout=1.0)
        with pytest.raises(Exception):
            await team.js.consumer_info(FACTS_STREAM, "executor-mine", timeout=1)
        await team.violation(f"$JS.API.CONSUMER.INFO.{FACTS_STREAM}.executor-mine")
        with pytest.raises(Exception):
            await team.js.delete_consumer(FACTS_STREAM, "executor-mine")
        await team.violation(f"$JS.API.CONSUMER.DELETE.{FACTS_STREAM}.executor-mine")
