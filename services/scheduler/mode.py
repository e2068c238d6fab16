"""The partitioning a fleet of schedulers runs with, claimed before a scheduler starts.

A single partition and the per-queue ones must never run side by side, and a fact log keeps
the partitioning it began with: `claim_mode` refuses to start otherwise (`ModeConflict`).
"""

from __future__ import annotations

from nats.js.errors import NotFoundError

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.scheduler.log import first_writer
from quotasched.services.scheduler.partition import SINGLE, partition_mode


async def claim_mode(js, mode: str) -> None:
    """Refuse to run beside schedulers partitioned the other way, or on a log begun the other
    way.  A single partition and the per-queue ones would both decide the same commands and
    fence each other out forever; and a log keeps the layout it began with (a single
    partition records a fleet-wide command's facts as one group, which a queue's partition
    could not fold), so switching takes fresh streams."""
    wanted = "one partition for all job queues" if mode == SINGLE else "a partition per job queue"
    writer = await first_writer(js)
    if writer is not None and partition_mode(writer) != mode:
        raise ModeConflict(
            f"this scheduler runs {wanted}, but the fact log {FACTS_STREAM} was begun by "
            f"schedulers partitioned the other way (its first fact was written by partition "
            f"{writer}); a log keeps the partitioning it began with"
        )
    try:
        consumers = await js.consumers_info(COMMANDS_STREAM)
    except NotFoundError:
        return
    names = [c.name for c in consumers if (c.name or "").startswith("scheduler-")]
    per_queue = [n for n in names if partition_mode(n.removeprefix("scheduler-")) != SINGLE]
    other = per_queue if mode == SINGLE else [n for n in names if n not in per_queue]
    if other:
        raise ModeConflict(
            f"this scheduler runs {wanted}, but the command stream has consumers of schedulers "
            f"partitioned the other way ({', '.join(sorted(other))}); stop those schedulers "
            f"and delete their consumers (nats consumer rm {COMMANDS_STREAM} NAME) first"
        )


class ModeConflict(RuntimeError):
    pass
