"""An executor whose durable consumer is changed says so loudly and puts it back (issue 28,
point 1).

Against a real nats-server, scheduler and executor: an admin connection changes one field of
the live executor's consumer, the way a job holding the executor's credentials could: its
filter (an update in place), its deliver subject, ack policy or deliver policy (deleted and
created again under the same name, the only way the server allows).  The
executor used to check only that the consumer existed: nothing was executed any more, jobs
stayed SCHEDULED, and nothing was logged.  Now it logs an error naming the consumer and the
field (expected, found), restores the declared configuration, and both the job submitted
while the consumer was wrong and one submitted after it run to SUCCEEDED.
"""

from __future__ import annotations

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services.client import Bus
from tests.integration.helpers import eventually, publish_items, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.test_lost_consumers import EXECUTOR_CONSUMER, job, said, succeeded

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def changed_filter(config: ConsumerConfig) -> bool:
    config.filter_subject = "qm.fact.nobody.>"  # editable: an update in place
    return False


def changed_deliver_subject(config: ConsumerConfig) -> bool:
    config.deliver_subject = "_INBOX.elsewhere"  # deliveries to nobody (the server refuses
    return True  # to move a bound push consumer's: delete and create again)


def changed_ack_policy(config: ConsumerConfig) -> bool:
    config.ack_policy = AckPolicy.NONE  # not editable: delete and create again
    config.max_ack_pending = None  # the server's rule without acks
    return True


def changed_deliver_policy(config: ConsumerConfig) -> bool:
    config.deliver_policy, config.opt_start_seq = DeliverPolicy.NEW, None  # likewise
    return True


CHANGES = {"filter_subject": changed_filter, "deliver_subject": changed_deliver_subject,
           "ack_policy": changed_ack_policy, "deliver_policy": changed_deliver_policy}  # fmt: skip


@pytest.mark.parametrize("field", list(CHANGES))
async def test_a_changed_executor_consumer_is_reported_restored_and_jobs_run(
        nats_server, spawn, field):  # fmt: skip
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        executor = spawn("executor", "--speed", "1000")
        await publish_items(bus, setup_commands("lq", shares=[("alpha", 1, "RESERVE", "DISABLED")],
                                                capacity=1))  # fmt: skip
        await bus.publish(job("before"))
        await eventually(lambda: succeeded(bus, "before"), 30, what="the first job SUCCEEDED")

        info = await bus.js.consumer_info(FACTS_STREAM, EXECUTOR_CONSUMER)
        declared = info.config
        config = ConsumerConfig.from_response(info.config.as_dict())
        if CHANGES[field](config):  # as an admin (or the executor's credentials) may
            await bus.js.delete_consumer(FACTS_STREAM, EXECUTOR_CONSUMER)
        await bus.js.add_consumer(FACTS_STREAM, config)
        await bus.publish(job("during"))  # dispatched while the consumer is wrong
        await eventually(lambda: said(executor, "consumer was changed", EXECUTOR_CONSUMER,
                                      f"{field}: expected"), 30,
                         what=f"the executor saying its consumer's {field} was changed")
        await eventually(lambda: succeeded(bus, "during"), 30, what="the job dispatched meanwhile")
        await bus.publish(job("after"))
        await eventually(lambda: succeeded(bus, "after"), 30, what="the next job SUCCEEDED")
        restored = (await bus.js.consumer_info(FACTS_STREAM, EXECUTOR_CONSUMER)).config
        for name in ("filter_subject", "deliver_subject", "ack_policy", "ack_wait",
                     "max_deliver", "max_ack_pending"):  # fmt: skip
            assert getattr(restored, name) == getattr(declared, name), name
        assert restored.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
    assert executor.popen.poll() is None, executor.output()[-2000:]
