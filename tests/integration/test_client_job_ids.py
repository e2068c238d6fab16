"""Issue 29, point 6, end to end: a team that claimed the job ids the scheduler used to derive
for the next acceptance numbers (`uuid5(<queue>/seq/<n>)`) refused every submission of another
team's Python client ("already used").  Now the client sends an id of its own (a random UUID4)
and the scheduler's derived ids mix in the submission and pass over taken ones.
"""

from __future__ import annotations

import uuid

import pytest

from quotasched.services.client import AsyncTrainingQueue, Bus
from quotasched.services.scheduler.core.jobs import JOB_ID_NAMESPACE
from tests.integration.test_client import G5, configure, stack_url  # noqa: F401

pytestmark = pytest.mark.nats


async def test_a_team_claiming_the_next_derived_ids_refuses_no_other_teams_client(stack_url):
    await configure(stack_url)
    async with Bus(stack_url) as bus:
        # No job yet: the claims take acceptance numbers 1..20, and claim 21..40's old ids.
        for n in range(20):
            claimed = str(uuid.uuid5(JOB_ID_NAMESPACE, f"q/seq/{21 + n}"))
            facts = await bus.submit_and_wait(
                {"kind": "SubmitServiceJob", "jobId": claimed, "jobName": f"claim-{n}",
                 "jobQueue": "q", "quotaShareName": "qs1",
                 "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]})  # fmt: skip
            assert facts[0].kind == "JobSubmitted", facts

        job = await AsyncTrainingQueue("q", bus).submit("train", quota_share_name="qs2",
                                                        instance_type=G5)  # fmt: skip
        assert uuid.UUID(job.job_id).version == 4
        assert (await job.describe())["quotaShareName"] == "qs2"
