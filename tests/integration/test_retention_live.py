"""Retention on the live service (issue 29): an ended job leaves the scheduler's state once its
queue's `endedJobRetentionSeconds` has passed (the scheduler publishes the Tick itself), and the
client still describes it, from the projection; its id is never used again.

Expectations by hand from the notebook's set-up (docs/options.md, "Retention of ended jobs"):
retention 0 forgets a job at the first Tick after it ended.
"""

from __future__ import annotations

import pytest

from quotasched.services.client import Bus, ClientError
from quotasched.services.projector.client import wait_for_position
from tests.integration.helpers import eventually, read_facts, wait_quiet
from tests.integration.test_projector_live import notebook_items, wait_leading, wait_projector

pytestmark = pytest.mark.nats

SETUP = [item for item in notebook_items() if item[0]["kind"].startswith("Create")]


def submit(job_id: str) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "q",
            "quotaShareName": "qs1",
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}  # fmt: skip


async def test_a_forgotten_job_is_described_from_the_projection_and_its_id_never_reused(
        nats_server, spawn, tmp_path):  # fmt: skip
    scheduler = spawn("scheduler")  # ticks every 0.5 s (the fixture's setting)
    projector = spawn("projector", "--db", str(tmp_path / "p.duckdb"))
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await wait_projector(bus, projector)
        for command, route in SETUP:
            await bus.submit_and_wait(command, route)
        await bus.submit_and_wait({"kind": "SetJobQueueOptions", "jobQueue": "q",
                                   "options": {"endedJobRetentionSeconds": 0}})  # fmt: skip
        await bus.submit_and_wait(submit("done-1"))
        await bus.submit_and_wait(submit("kept-1"))  # still running: never forgotten
        await bus.submit_and_wait({"kind": "ReportJobStatus", "jobId": "done-1",
                                   "status": "SUCCEEDED", "attempt": 1}, ("q", "qs1"))  # fmt: skip

        async def expired():
            facts = await read_facts(bus.js, "qm.fact.q.>")
            return [f for f in facts if f["kind"] == "JobExpired"]

        forgotten = await eventually(expired, 20, what="done-1 forgotten by the scheduler's Tick")
        assert [(f["jobId"], f["status"], f["endedAt"] <= f["at"]) for f in forgotten] == [
            ("done-1", "SUCCEEDED", True)]
        last = await wait_quiet(bus.js, 0.5)
        await wait_for_position(bus.nc, last, timeout=20)

        described = await bus.request("describe-service-job", jobId="done-1")  # the projection's
        assert (described["jobId"], described["status"]) == ("done-1", "SUCCEEDED")
        assert (await bus.request("describe-service-job", jobId="kept-1"))["status"] == "SCHEDULED"
        with pytest.raises(ClientError, match="does not exist"):
            await bus.request("describe-service-job", jobId="never-was")

        facts = await bus.submit_and_wait(submit("done-1"))
        assert [f.kind for f in facts] == ["CommandRejected"]
        assert "never used twice" in facts[0].status_reason
