"""FastStream wiring of an executor: one durable subscriber on the fact log, reports out."""

from __future__ import annotations

import os
import re
import warnings
from typing import get_args

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker
from faststream.nats.annotations import NatsMessage
from nats.js.api import AckPolicy as ConsumerAck
from nats.js.api import ConsumerConfig, DeliverPolicy, ReplayPolicy
from pydantic import ValidationError

from quotasched.events.base import NAME_PATTERN, NAME_RULE
from quotasched.events.codec import decode_fact
from quotasched.events.subjects import COMMANDS_STREAM, FACTS_PREFIX, FACTS_STREAM
from quotasched.services import logs
from quotasched.services.nats import natsfix
from quotasched.services.executors.base import Executor, ExecutorFact, consumer_name
from quotasched.services.executors.ledger import Ledger
from quotasched.services.executors.process import ProcessExecutor
from quotasched.services.executors.simulated import SimulatedExecutor
from quotasched.services.executors.watch import ConsumerWatch

natsfix.install()  # every fact an executor reads carries four headers; see services/nats/natsfix.py

log = logs.get("quotasched.executor")

# Only the facts an executor acts on (base.ExecutorFact, the contract's models); everything
# else is acked unread.  A job queue's facts name its service environment, which the GPU
# agent serves (agent.py).
EXECUTOR_MODELS = get_args(ExecutorFact)
EXECUTOR_FACTS = tuple(model.model_fields["kind"].default for model in EXECUTOR_MODELS)
# The ones that say how to run a job, or that it is over, or where (Executor.learn).
LEARNED = ("JobSubmitted", "JobPreempted", "JobStatusChanged", "JobQueueCreated",
           "JobQueueUpdated")  # fmt: skip
ACK_WAIT_S = 30.0  # a fact not acked within this is delivered again
MAX_ACK_PENDING = 1000  # facts delivered and not yet acked, at most
ERROR_MAX_CHARS = 1024  # a skipped fact's validation error, at most, in its log line


def consumer_config(durable: str, fact_filter: str) -> ConsumerConfig:
    """Every option of an executor's durable consumer, explicit: its subscriber creates it
    with these, and its watch (watch.py) holds it to them, restoring it if anyone changes one.
    Every fact in order, each acked explicitly after it was handled, redelivered forever."""
    return ConsumerConfig(durable_name=durable, filter_subject=fact_filter,
                          deliver_policy=DeliverPolicy.ALL, ack_policy=ConsumerAck.EXPLICIT,
                          ack_wait=ACK_WAIT_S, max_deliver=-1, max_ack_pending=MAX_ACK_PENDING,
                          replay_policy=ReplayPolicy.INSTANT)  # fmt: skip


def build_executor(broker: NatsBroker, kind: str, *, speed: float = 1.0, grace_s: float = 10.0,
                   name: str | None = None, state_dir: str | None = None,
                   job_queue: str | None = None) -> Executor:  # fmt: skip
    """Create the executor and register its subscriber on `broker` (start the broker after,
    then `await executor.recover()`).  `state_dir`: where its ledger lives
    (`executor-<name>.json`, see ledger.py); without one, nothing survives the process.
    `job_queue`: serve that job queue only (its facts, `qm.fact.<queue>.>`); the default name
    is then `<kind>-<queue>`, so one executor per queue can run side by side."""

    if kind not in ("simulated", "process", "sagemaker"):
        raise ValueError(f"unknown executor kind {kind!r}: simulated, process or sagemaker")
    if job_queue is not None and not re.fullmatch(NAME_PATTERN, job_queue):
        raise ValueError(f"job queue {job_queue!r}: {NAME_RULE}")
    durable = consumer_name(kind, name, job_queue)
    ledger = Ledger(os.path.join(state_dir, f"{durable}.json")) if state_dir is not None else None
    fact_filter = f"{FACTS_PREFIX}.>" if job_queue is None else f"{FACTS_PREFIX}.{job_queue}.>"
    publish = commands_publisher(broker)
    if kind == "simulated":
        executor: Executor = SimulatedExecutor(publish, speed=speed, ledger=ledger)
    elif kind == "process":
        from quotasched.services.settings import Settings

        executor = ProcessExecutor(publish, grace_s=grace_s, ledger=ledger)
        executor.grace_max_s = Settings().preempt_grace_max_s  # a job's tag `grace`, at most
    else:  # boto3 and the scheduler's naming only for the executor that needs them
        from quotasched.services.executors.sagemaker import SageMakerExecutor

        executor = SageMakerExecutor(publish, ledger=ledger)
    return subscribe(broker, executor, durable, fact_filter)


def read_fact(data: bytes, seq: int, subject: str,
              consumer: str | None = None) -> ExecutorFact | None:
    """The contract's fact (events/facts.py) in a message whose kind, its subject's last token
    (events.subjects.fact_subject), is one of EXECUTOR_FACTS: the caller decides that first,
    so no other fact is validated.  A message that is not a valid fact of those kinds is
    logged (one line: its stream sequence and why) and None is returned: the executor skips
    it (its subscriber acks it), it never stops on one."""
    try:
        fact = decode_fact(data)
    except Exception as error:  # pydantic's ValidationError, or anything it may raise
        log.error("an invalid fact was skipped", seq=seq, subject=subject, consumer=consumer,
                  error=describe(error))  # fmt: skip
        return None
    if not isinstance(fact, EXECUTOR_MODELS):
        log.error("a fact of another kind than its subject names was skipped", seq=seq,
                  subject=subject, consumer=consumer, kind=fact.kind)  # fmt: skip
        return None
    return fact


def describe(error: Exception) -> str:
    """A decoding error in one line of at most ERROR_MAX_CHARS: each of pydantic's errors as
    `<where>: <message>` (never the input, which may be large), `; ` between them."""
    if isinstance(error, ValidationError):
        problems = []
        for item in error.errors(include_url=False):
            where = ".".join(str(part) for part in item["loc"])
            problems.append(f"{where}: {item['msg']}" if where else item["msg"])
        text = "; ".join(problems)
    else:
        text = repr(error)
    text = " ".join(text.split())  # one line, whatever a message holds
    return text if len(text) <= ERROR_MAX_CHARS else text[: ERROR_MAX_CHARS - 3] + "..."


def raw_body(msg) -> bytes:
    """The subscriber's decoder: the fact's bytes as they are, decoded only when their kind
    is an executor's (`read_fact`), instead of FastStream's JSON parse of every fact."""
    return msg.body


def commands_publisher(broker: NatsBroker):
    """An executor's `publish`: its reports (and the agent's capacity updates) to QM_COMMANDS."""

    async def publish(subject: str, data: bytes) -> None:
        await broker.publish(data, subject, stream=COMMANDS_STREAM)

    return publish


def subscribe(broker: NatsBroker, executor: Executor, durable: str, fact_filter: str) -> Executor:
    """Register `executor`'s durable subscriber on the fact log (`fact_filter`) on `broker`."""

    mine = fact_filter.removesuffix(">")  # `qm.fact.` or `qm.fact.<queue>.`

    async def on_fact(data: bytes, msg: NatsMessage) -> None:  # the fact's bytes (raw_body)
        subject = msg.raw_message.subject
        seq = msg.raw_message.metadata.sequence.stream
        if not subject.startswith(mine):  # its consumer was changed: the watch restores it
            log.error("a fact outside the executor's filter was delivered; ignored",
                      consumer=durable, subject=subject, fact_filter=fact_filter)  # fmt: skip
        elif subject.rsplit(".", 1)[-1] in EXECUTOR_FACTS:
            fact = read_fact(data, seq, subject, durable)
            if fact is not None:
                await executor.on_fact(fact)
        # Handled (acked next): a consumer recreated after a deletion resumes after it.
        executor.handled_seq = max(executor.handled_seq, seq)

    # One durable push consumer per executor name, on purpose: an executor must see every
    # fact in order (FastStream warns that such a consumer does not scale horizontally).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        broker.subscriber(
            fact_filter, stream=JStream(FACTS_STREAM, declare=False),
            durable=durable, deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.ACK, config=consumer_config(durable, fact_filter),
            decoder=raw_body,
        )(on_fact)  # fmt: skip

    executor.consumer = durable
    executor.fact_filter = fact_filter
    return executor


async def catch_up(js, executor: Executor, on_fatal=None) -> int:
    """Before the executor's durable consumer resumes, feed `executor.learn` the facts an
    earlier executor of the same name was delivered (up to the consumer's last delivered
    sequence; the rest is delivered again): the submissions of jobs that are not over yet
    are needed to run them.  Returns how many facts were read (0 for a new consumer).

    Also starts watching the consumer (watch.py), from here on and until `executor.close`:
    whoever starts an executor catches it up first, so none runs unwatched; once its
    subscriber has started, await `executor.watch.first_look()`.  `on_fatal(error)`: called
    if the consumer is lost for good (the executor must then stop, non-zero)."""
    from nats.js.errors import NotFoundError

    declared = consumer_config(executor.consumer, executor.fact_filter)
    executor.watch = ConsumerWatch(js, executor.consumer, on_fatal=on_fatal,
                                   handled=lambda: executor.handled_seq,
                                   expected=declared).start()  # fmt: skip

    from quotasched.services.nats.log import ALL_FACTS, read_log

    try:
        info = await js.consumer_info(FACTS_STREAM, executor.consumer)
    except NotFoundError:
        return 0
    through = info.delivered.stream_seq
    if not through:
        return 0
    read = 0
    mine = executor.fact_filter.removesuffix(">")  # `qm.fact.` or `qm.fact.<queue>.`
    # The whole log (ALL_FACTS): the message at `through` then surely comes, filter or not.
    async for seq, payload, subject in read_log(js, ALL_FACTS, 1, until_seq=through):
        read += 1
        kind = subject.rsplit(".", 1)[-1]  # decided before any decoding: most facts are not
        if subject.startswith(mine) and (kind in LEARNED or (
                kind == "JobDispatched" and executor.pending)):  # fmt: skip (when each was)
            fact = read_fact(payload, seq, subject, executor.consumer)
            if fact is not None:
                executor.learn(fact)
    log.info("caught up", consumer=executor.consumer, facts=read, jobs=len(executor.specs))
    return read
