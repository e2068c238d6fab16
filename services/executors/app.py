"""FastStream wiring of an executor: one durable subscriber on the fact log, reports out."""

from __future__ import annotations

import json
import os
import warnings

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker
from nats.js.api import DeliverPolicy

from events.subjects import COMMANDS_STREAM, FACTS_STREAM
from services import logs, natsfix
from services.executors.base import Executor
from services.executors.ledger import Ledger
from services.executors.process import ProcessExecutor
from services.executors.simulated import SimulatedExecutor

natsfix.install()  # every fact an executor reads carries four headers; see services/natsfix.py

log = logs.get("quotasched.executor")

# Only the facts an executor acts on; everything else stays on the server.
EXECUTOR_FACTS = ("JobSubmitted", "JobDispatched", "JobPreempted", "JobStatusChanged")
# The ones that say how to run a job, or that it is over (Executor.learn).
LEARNED = ("JobSubmitted", "JobPreempted", "JobStatusChanged")


def build_executor(broker: NatsBroker, kind: str, *, speed: float = 1.0, grace_s: float = 10.0,
                   name: str | None = None, state_dir: str | None = None) -> Executor:  # fmt: skip
    """Create the executor and register its subscriber on `broker` (start the broker after,
    then `await executor.recover()`).  `state_dir`: where its ledger lives
    (`executor-<name>.json`, see ledger.py); without one, nothing survives the process."""

    async def publish(subject: str, data: bytes) -> None:
        await broker.publish(data, subject, stream=COMMANDS_STREAM)

    if kind not in ("simulated", "process"):
        raise ValueError(f"unknown executor kind {kind!r}: simulated or process")
    durable = f"executor-{name or kind}"
    ledger = Ledger(os.path.join(state_dir, f"{durable}.json")) if state_dir is not None else None
    if kind == "simulated":
        executor: Executor = SimulatedExecutor(publish, speed=speed, ledger=ledger)
    else:
        executor = ProcessExecutor(publish, grace_s=grace_s, ledger=ledger)

    async def on_fact(fact: dict) -> None:  # FastStream hands over the decoded JSON object
        if fact.get("kind") in EXECUTOR_FACTS:
            await executor.on_fact(fact)

    # One durable push consumer per executor name, on purpose: an executor must see every
    # fact in order (FastStream warns that such a consumer does not scale horizontally).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        broker.subscriber(
            "qm.fact.>", stream=JStream(FACTS_STREAM, declare=False),
            durable=durable, deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.ACK,
        )(on_fact)  # fmt: skip

    executor.consumer = durable
    return executor


async def catch_up(js, executor: Executor) -> int:
    """Before the executor's durable consumer resumes, feed `executor.learn` the facts an
    earlier executor of the same name was delivered (up to the consumer's last delivered
    sequence; the rest is delivered again): the submissions of jobs that are not over yet
    are needed to run them.  Returns how many facts were read (0 for a new consumer)."""
    from nats.js.errors import NotFoundError

    from services.scheduler.log import ALL_FACTS, read_log

    try:
        info = await js.consumer_info(FACTS_STREAM, executor.consumer)
    except NotFoundError:
        return 0
    through = info.delivered.stream_seq
    if not through:
        return 0
    read = 0
    async for _seq, payload, subject in read_log(js, ALL_FACTS, 1, until_seq=through):
        read += 1
        if subject.rsplit(".", 1)[-1] in LEARNED:
            executor.learn(json.loads(payload))
    log.info("caught up", consumer=executor.consumer, facts=read, jobs=len(executor.specs))
    return read
