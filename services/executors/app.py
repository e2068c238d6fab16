"""FastStream wiring of an executor: one durable subscriber on the fact log, reports out."""

from __future__ import annotations

import warnings

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker
from nats.js.api import DeliverPolicy

from events.subjects import COMMANDS_STREAM, FACTS_STREAM
from services import natsfix
from services.executors.base import Executor
from services.executors.process import ProcessExecutor
from services.executors.simulated import SimulatedExecutor

natsfix.install()  # every fact an executor reads carries four headers; see services/natsfix.py

# Only the facts an executor acts on; everything else stays on the server.
EXECUTOR_FACTS = ("JobSubmitted", "JobDispatched", "JobPreempted", "JobStatusChanged")


def build_executor(broker: NatsBroker, kind: str, *, speed: float = 1.0,
                   grace_s: float = 10.0, name: str | None = None) -> Executor:  # fmt: skip
    """Create the executor and register its subscriber on `broker` (start the broker after)."""

    async def publish(subject: str, data: bytes) -> None:
        await broker.publish(data, subject, stream=COMMANDS_STREAM)

    if kind == "simulated":
        executor: Executor = SimulatedExecutor(publish, speed=speed)
    elif kind == "process":
        executor = ProcessExecutor(publish, grace_s=grace_s)
    else:
        raise ValueError(f"unknown executor kind {kind!r}: simulated or process")

    async def on_fact(fact: dict) -> None:  # FastStream hands over the decoded JSON object
        if fact.get("kind") in EXECUTOR_FACTS:
            await executor.on_fact(fact)

    # One durable push consumer per executor name, on purpose: an executor must see every
    # fact in order (FastStream warns that such a consumer does not scale horizontally).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        broker.subscriber(
            "qm.fact.>", stream=JStream(FACTS_STREAM, declare=False),
            durable=f"executor-{name or kind}", deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.ACK,
        )(on_fact)  # fmt: skip

    return executor
