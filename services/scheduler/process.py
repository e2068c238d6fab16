"""The partitions one `quotasched scheduler` process runs (see partition.py).

- no job queues named: the single partition, for every queue;
- job queues named (`--job-queue qa --job-queue qb`): the fleet partition and one partition
  per queue named, their leases spread over the processes that run them (members.py);
- `--job-queue '*'`: the fleet partition, and a partition for every job queue the fleet
  configuration holds, started as the queues are created.  The fleet partition's state (led
  or followed as a standby) is read every quarter of the lease TTL; a queue's partition then
  decides the queue's commands from the start of the command stream, so a command published
  before its queue existed is refused in stream order, as a single partition would have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from quotasched.services import logs
from quotasched.services.scheduler.members import Members
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.service import Scheduler
from quotasched.services.nats.waits import sleep_or
from quotasched.services.settings import Settings

EVERY_QUEUE = "*"

log = logs.get("quotasched.scheduler")

Expose = Callable[[Scheduler, bool], Awaitable[None]]


async def run_partitions(nc: Client, settings: Settings, job_queues: list[str], expose: Expose,
                         stop: asyncio.Event, holder: str | None = None) -> None:  # fmt: skip
    """`holder`: the instance lock's (instance.py): every partition's lease names it, and a
    lease this process finds naming it is a crashed predecessor's, taken back at once."""
    reclaim = holder is not None
    if not job_queues:
        instance = Scheduler(nc, settings, holder, Partition.single(settings.partition), reclaim=reclaim)
        await expose(instance, False)
        await instance.run(stop)
        return
    discover = EVERY_QUEUE in job_queues
    named = [q for q in job_queues if q != EVERY_QUEUE]
    scopes = [Partition.fleet(), *(Partition.for_queue(q) for q in dict.fromkeys(named))]
    members = Members([scope.name for scope in scopes], settings.lease_ttl_s)
    instances: dict[str, Scheduler] = {}
    tasks: list[asyncio.Task] = [asyncio.create_task(members.run(nc.jetstream(), stop))]

    async def start(scope: Partition) -> None:
        instance = instances[scope.name] = Scheduler(nc, settings, holder, scope, members, reclaim)
        if scope.name not in members.partitions:
            members.partitions.append(scope.name)
        await expose(instance, True)
        tasks.append(asyncio.create_task(instance.run(stop)))

    for scope in scopes:
        await start(scope)
    try:
        while discover and not stop.is_set():
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # e.g. ModeConflict: the process must stop
            for queue in sorted(instances["fleet"].known_queues() - set(named)):
                scope = Partition.for_queue(queue)
                if scope.name not in instances:
                    log.info("job queue discovered", job_queue=queue, partition=scope.name)
                    await start(scope)
            await sleep_or(stop, settings.lease_ttl_s / 4)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
