"""The Python client for pipelines, shaped like the SageMaker SDK's training queues.

    from quotasched.services.client import TrainingQueue

Public names: `Bus` (the async core: publish a command, wait for its decision, ask read
questions), `AsyncTrainingQueue` / `AsyncTrainingQueuedJob` (the async API),
`TrainingQueue` / `TrainingQueuedJob` (the same on a private event loop), `ClientError`
(a command the scheduler refused) and `GateRefused` (a `ClientError`: refused by the admission
gate, before the command stream).  They live in `queues` (the SDK's face), with `commands`
(commands in, decisions out), `reads` (routing read requests, retries while no leader answers,
merging a fan-out) and `loop` (the sync API's event loop) beside it.
"""

from quotasched.services.client.commands import ClientError, GateRefused
from quotasched.services.client.queues import (
    AsyncTrainingQueue,
    AsyncTrainingQueuedJob,
    Bus,
    TrainingQueue,
    TrainingQueuedJob,
)

__all__ = ["AsyncTrainingQueue", "AsyncTrainingQueuedJob", "Bus", "ClientError", "GateRefused",
           "TrainingQueue", "TrainingQueuedJob"]  # fmt: skip
