"""A component whose consumer disappears says so loudly and gets it back (issue 17, point 5).

Against a real nats-server, scheduler, executor and projector: an operator (or anyone whose
credentials may) deletes a component's consumer.  The server then simply stops delivering;
the component used to log nothing, and for the executor the next job stayed SCHEDULED for
good.  Now the executor and the projector log an error naming the consumer, recreate it, and
go on: the next job runs, the next facts are projected.  The scheduler ends its term when its
command consumer is deleted, and the next term recreates it: a command sent after is decided.  (That a team's credentials cannot
delete them at all: tests/reliability/test_permission_table.py, role pipeline-q-qs1, whose
`CONSUMER.DELETE.QM_FACTS.executor-simulated` is refused.)
"""

from __future__ import annotations

import json

import pytest
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.client import Bus
from quotasched.services.client.commands import ClientError
from tests.integration.helpers import eventually, publish_items, setup_commands
from tests.integration.test_failover import wait_leading

pytestmark = [pytest.mark.nats, pytest.mark.slow]

EXECUTOR_CONSUMER = "executor-simulated"
SCHEDULER_CONSUMER = "scheduler-main"  # Partition.single("main").durable


def job(job_id: str) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "lq",
            "quotaShareName": "alpha", "tags": {"duration": "1"},
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}  # fmt: skip


async def succeeded(bus: Bus, job_id: str) -> bool:
    try:
        reply = await bus.request("describe-service-job", jobId=job_id)
    except ClientError:  # not decided yet
        return False
    return reply.get("status") == "SUCCEEDED"


async def delivered_through(js, seq: int) -> bool:
    info = await js.consumer_info(FACTS_STREAM, EXECUTOR_CONSUMER)
    return info.ack_floor.stream_seq >= seq


async def said(process, *words: str) -> bool:
    """Has the process logged a line holding every one of `words`?"""
    return any(all(word in line for word in words) for line in process.output().splitlines())


async def test_a_deleted_executor_consumer_is_reported_recreated_and_the_next_job_runs(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        executor = spawn("executor", "--speed", "1000")
        await publish_items(bus, setup_commands("lq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        await bus.publish(job("before"))
        await eventually(lambda: succeeded(bus, "before"), 30, what="the first job SUCCEEDED")

        before_seq = (await bus.js.stream_info(FACTS_STREAM)).state.last_seq
        await eventually(lambda: delivered_through(bus.js, before_seq), 30,
                         what="the executor delivered every fact so far")  # fmt: skip
        await bus.js.delete_consumer(FACTS_STREAM, EXECUTOR_CONSUMER)  # as an admin may
        await eventually(lambda: said(executor, "consumer is gone", EXECUTOR_CONSUMER), 30,
                         what="the executor saying its consumer is gone")  # fmt: skip
        await bus.publish(job("after"))
        await eventually(lambda: succeeded(bus, "after"), 30, what="the next job SUCCEEDED")
        info = await bus.js.consumer_info(FACTS_STREAM, EXECUTOR_CONSUMER)
        assert info.num_pending == 0
        # Resumed after what it had handled (the first job's facts), not from the log's start.
        assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
        assert info.config.opt_start_seq > before_seq, info.config
    assert executor.popen.poll() is None, executor.output()[-2000:]


async def projector_consumers(js) -> list[str]:
    """The fact log's consumers other than the executor's: the projector's ordered one."""
    return [info.name for info in await js.consumers_info(FACTS_STREAM)
            if not info.name.startswith("executor-")]


async def test_a_deleted_projector_consumer_is_reported_recreated_and_projecting_goes_on(
        nats_server, spawn, tmp_path):  # fmt: skip
    scheduler = spawn("scheduler")
    projector = spawn("projector", "--db", str(tmp_path / "p.duckdb"))
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("lq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip

        async def at_the_end():
            last = (await bus.js.stream_info(FACTS_STREAM)).state.last_seq
            reply = await bus.nc.request("qm.proj.position", b"{}", timeout=1.0)
            return json.loads(reply.data).get("position") == last

        await eventually(at_the_end, 30, what="the projector at the log's end")
        [name] = await eventually(lambda: projector_consumers(bus.js), 30,
                                  what="the projector's consumer")  # fmt: skip
        try:
            await bus.js.delete_consumer(FACTS_STREAM, name)
        except NotFoundError:  # replaced meanwhile (a gap): delete what replaced it
            [name] = await projector_consumers(bus.js)
            await bus.js.delete_consumer(FACTS_STREAM, name)
        await eventually(lambda: said(projector, "consumer is gone", name), 30,
                         what="the projector saying its consumer is gone")  # fmt: skip
        await bus.publish(job("after"))
        await eventually(at_the_end, 30, what="the projector at the log's end again")
    assert projector.popen.poll() is None, projector.output()[-2000:]


async def decided(bus: Bus, job_id: str) -> bool:
    try:
        await bus.request("describe-service-job", jobId=job_id)
    except ClientError:  # not decided yet
        return False
    return True


async def test_a_deleted_scheduler_command_consumer_ends_the_term_and_a_later_command_is_decided(
        nats_server, spawn):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await publish_items(bus, setup_commands("lq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        await bus.publish(job("before"))
        await eventually(lambda: decided(bus, "before"), 30, what="the first job decided")

        await bus.js.delete_consumer(COMMANDS_STREAM, SCHEDULER_CONSUMER)  # as an admin may
        await bus.publish(job("after"))  # stored, but nobody consumes it now
        await eventually(lambda: said(scheduler, "command consumer is gone", SCHEDULER_CONSUMER),
                         30, what="the scheduler saying its command consumer is gone")
        await eventually(lambda: decided(bus, "after"), 30, what="the later job decided")
        await bus.js.consumer_info(COMMANDS_STREAM, SCHEDULER_CONSUMER)  # recreated
    assert scheduler.popen.poll() is None, scheduler.output()[-2000:]
