"""The pipeline client with a team's own credentials, against a real nats-server started with
the configuration `quotasched auth generate` writes (as in test_permissions.py).

A team (role `pipeline-<queue>-<share>`) may create consumers on the fact log only in its slots
`<role>-0` .. `-7` and only filtered on its share's facts, so the client follows its decisions
through such a consumer: the first free slot, deleted once the decision is in (and removed by
the server when its client went away).  Each test failed while the client subscribed with an
unnamed ordered consumer on `qm.fact.>`, which team credentials may not create.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from contextlib import asynccontextmanager
from unittest import mock

import pytest

from quotasched.events.subjects import FACTS_STREAM, command_subject
from quotasched.services.client import commands as client_commands
from quotasched.services.nats.credentials import INBOX_ENV, PASSWORD_ENV, TLS_CA_ENV, USER_ENV
from quotasched.services.config.auth import team_consumers
from quotasched.services.client import Bus, ClientError
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import NO_TICKS, NOTEBOOK, eventually, wait_decided, wait_gate_open
from tests.integration.test_failover import wait_leading
from tests.reliability.test_permissions import Client, generated, secured, without_url  # noqa: F401

pytestmark = pytest.mark.nats

G5 = "ml.g5.xlarge"
TEAM = "pipeline-q-qs1"


def submission(job_id: str, share: str = "qs1", name: str | None = None) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": name or job_id,
            "jobQueue": "q", "quotaShareName": share, "schedulingPriority": 1,
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


@asynccontextmanager
async def bus_as(env: dict[str, str]):
    """A client `Bus` connected with one role's credentials (the environment, as a pipeline's
    process would have it)."""
    variables = {key: env[key] for key in (USER_ENV, PASSWORD_ENV, INBOX_ENV) if key in env}
    with mock.patch.dict(os.environ, variables):
        os.environ.pop(TLS_CA_ENV, None)
        bus = Bus(env["url"], name=env.get(USER_ENV, "client"))
        await bus.__aenter__()
    try:
        yield bus
    finally:
        await bus.close()


async def team_consumer_names(admin: Client) -> list[str]:
    infos = await admin.js.consumers_info(FACTS_STREAM)
    return sorted(info.name for info in infos if info.name.startswith("pipeline-"))


@pytest.fixture
async def stack(secured, spawn):
    """The secured server, a scheduler with its own credentials, queue q and shares qs1-qs3
    configured by the admin; yields (credentials by role, admin client)."""
    server, creds = secured
    scheduler = spawn("scheduler", QUOTASCHED_NATS_URL=server.url, **NO_TICKS,
                      **without_url(creds["scheduler"]))  # fmt: skip
    await wait_leading(scheduler)
    await wait_gate_open(spawn("gate", QUOTASCHED_NATS_URL=server.url, **without_url(creds["gate"])))
    async with Client(creds["admin"]) as admin:
        lines = [line for line in NOTEBOOK.read_text().splitlines() if line.strip()][:6]
        async with bus_as(creds["admin"]) as bus:
            for line in lines:  # the environment (3 units), policy, queue q, shares qs1-qs3
                seq = await bus.publish(line)
        await wait_decided(admin.js, seq, processes=[scheduler])
        yield creds, admin


async def test_a_team_submits_and_waits_for_its_decision(stack):
    creds, admin = stack
    async with bus_as(creds[TEAM]) as bus:
        facts = await asyncio.wait_for(bus.submit_and_wait(submission("a")), 20)
    assert [(fact.kind, fact.job_id) for fact in facts] == [("JobSubmitted", "a"),
                                                            ("JobDispatched", "a")]
    assert await team_consumer_names(admin) == []  # deleted once the decision was in


async def test_a_refused_submission_returns_its_rejection(stack):
    creds, admin = stack
    async with bus_as(creds[TEAM]) as bus:
        await bus.submit_and_wait(submission("a"))
        # the same job id under another name: refused, under the command's own subject
        facts = await asyncio.wait_for(bus.submit_and_wait(submission("a", name="other")), 20)
    assert [fact.kind for fact in facts] == ["CommandRejected"]
    assert "already exists" in facts[0].status_reason
    assert await team_consumer_names(admin) == []


async def test_two_clients_of_one_team_wait_at_once_in_two_slots(stack):
    creds, admin = stack
    async with bus_as(creds[TEAM]) as first, bus_as(creds[TEAM]) as second:
        holder = client_commands.Decisions()  # a third wait in progress holds the first slot
        await holder.start(first)
        await holder.follow(command_subject("SubmitServiceJob", "q", "qs1"))
        assert await team_consumer_names(admin) == [f"{TEAM}-0"]
        decided = await asyncio.wait_for(asyncio.gather(
            first.submit_and_wait(submission("a")), second.submit_and_wait(submission("b"))), 20)
        assert [[fact.job_id for fact in facts][0] for facts in decided] == ["a", "b"]
        assert await team_consumer_names(admin) == [f"{TEAM}-0"]
        await holder.close()
    assert await team_consumer_names(admin) == []


async def test_every_slot_taken_is_a_clear_error_and_nothing_is_published(stack):
    creds, admin = stack
    for name in team_consumers(TEAM):  # someone else holds all eight slots
        await admin.js.add_consumer(FACTS_STREAM, name=name, filter_subject="qm.fact.q.qs1.*",
                                    deliver_subject=f"elsewhere.{name}", ack_policy="none",
                                    inactive_threshold=600.0)  # fmt: skip
    before = (await admin.js.stream_info("QM_COMMANDS")).state.last_seq
    async with bus_as(creds[TEAM]) as bus:
        with pytest.raises(ClientError, match="all 8 consumers"):
            await bus.submit_and_wait(submission("a"), timeout=1.0)
    assert (await admin.js.stream_info("QM_COMMANDS")).state.last_seq == before


async def test_a_decision_about_other_teams_jobs_returns_the_teams_own_facts(stack):
    """qs1 borrows qs2's idle unit; qs2's submission reclaims it: the decision preempts a qs1
    job (recorded under qs1, which qs2 may not read) and dispatches qs2's.  qs2's client gets
    its own facts, at once, though the decision's `Qm-Facts` counts more."""
    creds, admin = stack
    async with bus_as(creds[TEAM]) as bus:
        for job_id in ("a", "b"):  # a on qs1's own unit, b on the unit qs2 lends
            assert (await bus.submit_and_wait(submission(job_id)))[-1].kind == "JobDispatched"
    async with bus_as(creds["pipeline-q-qs2"]) as bus:
        started = asyncio.get_running_loop().time()
        facts = await asyncio.wait_for(bus.submit_and_wait(submission("x", "qs2")), 20)
        took = asyncio.get_running_loop().time() - started
    assert [(fact.kind, fact.job_id) for fact in facts] == [("JobSubmitted", "x"),
                                                            ("JobDispatched", "x")]
    assert facts[-1].after_preemption_of == ["b"]
    assert took < 5, f"the wait took {took:.1f}s"
    whole = await admin.js.get_last_msg(FACTS_STREAM, "qm.fact.q.qs1.JobPreempted")
    assert json.loads(whole.data)["commandSeq"] == facts[0].command_seq  # the same decision
    assert await team_consumer_names(admin) == []


async def test_a_crashed_clients_consumer_is_removed_by_the_server(stack, monkeypatch):
    creds, admin = stack
    monkeypatch.setattr(client_commands, "CONSUMER_IDLE_S", 1.0)
    async with bus_as(creds[TEAM]) as bus:
        decisions = client_commands.Decisions()
        await decisions.start(bus)
        await decisions.follow(command_subject("SubmitServiceJob", "q", "qs1"))
        assert await team_consumer_names(admin) == [f"{TEAM}-0"]
        await bus.nc.close()  # gone without deleting it
        bus.nc = None

    async def removed():
        return await team_consumer_names(admin) == []

    await eventually(removed, 10, what="the idle consumer removed")


async def test_apply_that_waits_works_with_a_teams_credentials(stack, tmp_path):
    """`apply --wait`, in a pipeline's environment."""
    creds, admin = stack
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QUOTASCHED_NATS")},
           **without_url(creds[TEAM]), "QUOTASCHED_NATS_URL": creds[TEAM]["url"]}  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([QUOTASCHED, *args, "--wait-timeout", "20"], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    commands = tmp_path / "team.jsonl"
    commands.write_text("".join(json.dumps(submission(job_id)) + "\n" for job_id in ("f1", "f2"))
                        + json.dumps(submission("f1", name="clash")) + "\n")  # fmt: skip
    applied = await asyncio.to_thread(run, "apply", str(commands), "--wait")
    assert applied.returncode == 1, applied.stderr  # the clash is refused
    assert "3 decided: 2 accepted, 1 refused" in applied.stdout
    assert await team_consumer_names(admin) == []
