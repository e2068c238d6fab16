"""The SageMaker-shaped client against a whole stack (services.runtime.Stack): an embedded
nats-server, the scheduler and the simulated executor, all in this process.

The stack runs on its own event loop in a background thread, so the sync `TrainingQueue`
(which blocks its caller while its private loop talks to NATS) and the async
`AsyncTrainingQueue` (on the test's loop) both reach it like an outside pipeline would.
The simulated executor runs at 200x: a job tagged `duration=1000` runs 5 s, enough to look at
it while it holds capacity; untagged jobs take the default 60 s, 0.3 s here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from quotasched.services.client import AsyncTrainingQueue, Bus, ClientError, TrainingQueue
from quotasched.services.runtime import Stack
from quotasched.services.settings import Settings

pytestmark = pytest.mark.nats

G5 = "ml.g5.xlarge"
SPEED = 200.0
LONG = {"duration": "1000"}  # 5 s of wall time at SPEED
SETUP = [
    {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 2}]},
    {"kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"kind": "CreateJobQueue", "jobQueueName": "q",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}],
     "schedulingPolicy": "sp"},
    {"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 100},
     "preemptionConfiguration": {"inSharePreemption": "ENABLED"}},
    {"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs2",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "LEND"},
     "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
]  # fmt: skip
ACTIVE = ("RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")


@pytest.fixture
def stack_url(tmp_path):
    """A running Stack on a loop of its own; yields its NATS URL, stops it afterwards."""
    loop = asyncio.new_event_loop()
    ready: concurrent.futures.Future = concurrent.futures.Future()
    stop: dict[str, asyncio.Event] = {}

    async def main() -> None:
        settings = Settings(data_dir=str(tmp_path / "stack"), lease_ttl_s=3.0, tick_interval_s=0.5)
        try:
            async with Stack(settings, executor="simulated", speed=SPEED) as stack:
                stop["event"] = stack.stop
                ready.set_result(stack.url)
                await stack.stop.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    url = ready.result(timeout=30)
    try:
        yield url
    finally:
        loop.call_soon_threadsafe(stop["event"].set)
        thread.join(30)
        assert not thread.is_alive(), "the stack did not stop"
        loop.close()


async def configure(url: str) -> None:
    async with Bus(url) as bus:
        for command in SETUP:
            facts = await bus.submit_and_wait(command)
            assert facts and facts[0].kind != "CommandRejected", facts


def test_sync_training_queue_round_trip(stack_url):
    asyncio.run(configure(stack_url))
    with TrainingQueue("q", nats_url=stack_url) as queue:
        with pytest.raises(ValueError, match="share_identifier"):
            queue.submit("nope", quota_share_name="qs1", share_identifier="qs1",
                         instance_type=G5)  # fmt: skip

        retries = {"preemptionRetriesBeforeTermination": 2}
        long = queue.submit("long-a", quota_share_name="qs1", priority=3, instance_type=G5,
                            instance_count=1, tags=LONG, preemption_config=retries)  # fmt: skip
        assert long.job_name == "long-a" and long.quota_share_name == "qs1"
        assert long.job_arn.endswith(f"/{long.job_id}")
        described = long.describe()
        assert described["jobId"] == long.job_id
        assert described["jobName"] == "long-a"
        assert described["jobQueue"] == "q"
        assert described["quotaShareName"] == "qs1"
        assert described["schedulingPriority"] == 3
        assert described["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 2}
        assert described["capacityUsage"] == [{"capacityUnit": G5, "quantity": 1}]
        assert described["status"] in ACTIVE

        long.update(scheduling_priority=7)
        assert long.describe()["schedulingPriority"] == 7

        assert [job["jobId"] for job in queue.list_jobs(job_name="long-a")] == [long.job_id]
        assert [job["jobId"] for job in queue.list_jobs(job_name="long-*")] == [long.job_id]
        assert queue.get_job("long-a").job_id == long.job_id
        with pytest.raises(ValueError):
            queue.get_job("no-such-job")

        # the long job reaches RUNNING through the executor's reports
        for _ in range(100):
            if long.describe()["status"] == "RUNNING":
                break
            time.sleep(0.05)
        assert long.describe()["status"] == "RUNNING"
        running = queue.list_jobs()  # RUNNING by default
        assert long.job_id in [job["jobId"] for job in running]
        by_share = queue.list_jobs_by_share("qs1")
        assert [job["jobId"] for job in by_share] == [long.job_id]
        assert queue.list_jobs_by_share("qs2") == []

        short = queue.submit("short-b", quota_share_name="qs2", instance_type=G5)
        finished = short.result(timeout=20)
        assert finished["status"] == "SUCCEEDED"
        assert short.wait(timeout=5)["status"] == "SUCCEEDED"
        assert short.job_id in [job["jobId"] for job in
                                queue.list_jobs_by_share("qs2", status="SUCCEEDED")]  # fmt: skip

        long.terminate("no longer needed")
        ended = long.wait(timeout=10)
        assert ended["status"] == "FAILED"
        assert ended.get("isTerminated") is True
        with pytest.raises(RuntimeError):
            long.result(timeout=5)
        with pytest.raises(ClientError):  # a terminated job's priority can't change any more
            long.update(scheduling_priority=1)
        with pytest.raises(ClientError):
            queue.submit("lost", quota_share_name="no-such-share", instance_type=G5)


async def test_async_training_queue_round_trip(stack_url):
    await configure(stack_url)
    async with Bus(stack_url) as bus:
        queue = AsyncTrainingQueue("q", bus)
        with pytest.raises(ValueError, match="share_identifier"):
            await queue.submit("nope", quota_share_name="qs1", share_identifier="x",
                               instance_type=G5)  # fmt: skip

        payload = {
            "TrainingJobName": "sm-job", "RoleArn": "arn:aws:iam::000000000000:role/r",
            "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
            "ResourceConfig": {"InstanceType": G5, "InstanceCount": 1, "VolumeSizeInGB": 30},
            "StoppingCondition": {"MaxRuntimeInSeconds": 100},
        }  # fmt: skip
        sagemaker = await queue.submit("sm-job", quota_share_name="qs2",
                                       service_request_payload=payload, priority=2)  # fmt: skip
        described = await sagemaker.describe()
        assert described["capacityUsage"] == [{"capacityUnit": G5, "quantity": 1}]
        assert described["schedulingPriority"] == 2
        assert (await sagemaker.result(timeout=20))["status"] == "SUCCEEDED"

        # qs1 runs one long job on its own instance and borrows qs2's idle one for another;
        # a job of qs2 then reclaims the lent instance (cross-share preemption, requeued)
        low = await queue.submit("low", quota_share_name="qs1", priority=1, instance_type=G5,
                                 tags=LONG)  # fmt: skip
        mid = await queue.submit("mid", quota_share_name="qs1", priority=2, instance_type=G5,
                                 tags=LONG)  # fmt: skip
        assert (await low.describe())["status"] in ACTIVE[1:]
        assert (await mid.describe())["status"] in ACTIVE[1:]
        assert (await mid.describe())["borrowed"] == [{"capacityUnit": G5, "quantity": 1}]
        listed = await queue.list_jobs_by_share("qs1", status="ALL")
        assert {job["jobId"] for job in listed} >= {low.job_id, mid.job_id}
        assert (await queue.get_job("mid")).job_id == mid.job_id

        owner = await queue.submit("owner", quota_share_name="qs2", instance_type=G5)
        assert (await mid.describe())["preemptionSummary"]["preemptedAttemptCount"] == 1
        assert (await owner.result(timeout=20))["status"] == "SUCCEEDED"
        for _ in range(100):  # the reclaimed job runs again once the owner is done
            if (await mid.describe())["status"] in ACTIVE[1:]:
                break
            await asyncio.sleep(0.05)
        assert (await mid.describe())["status"] in ACTIVE[1:]

        await mid.update(scheduling_priority=9)
        assert (await mid.describe())["schedulingPriority"] == 9

        await mid.terminate("done with it")
        assert (await mid.wait(timeout=10))["status"] == "FAILED"
        await low.terminate()
        ended = await low.wait(timeout=10)
        assert ended["status"] == "FAILED" and ended.get("isTerminated") is True
        with pytest.raises(RuntimeError):
            await low.result(timeout=5)
        snapshot = await queue.snapshot()
        assert "queueUtilization" in snapshot
