"""Auditing the live log: one `verify` over the bus, or one per partition when the log was
written by a scheduling partition per job queue (see services/scheduler/partition.py)."""

from __future__ import annotations

from quotasched.services.audit.bus_reader import BusReader
from quotasched.services.audit.records import Result
from quotasched.services.audit.verifier import verify
from quotasched.services.scheduler.partition import PER_QUEUE, Partition, partition_mode


def verify_bus(url: str) -> list[Result]:
    """Audit the live log: one result, or one per partition when the log was written by a
    scheduling partition per job queue (each re-run over its own commands, see
    services/scheduler/partition.py)."""
    scopes = partitions_on_bus(url)
    return [_verify_partition(url, scope) for scope in scopes]


def _verify_partition(url: str, scope: Partition | None) -> Result:
    facts_filter = scope.fact_filter if scope is not None else "qm.fact.>"
    with BusReader(url, facts_filter=facts_filter) as bus:
        commands, facts = bus.commands(), bus.facts()
        result = verify(commands, facts, pending_allowed=True, scope=scope)
        if result.ok:
            for _ in facts:  # make sure the reader finished (it sets `partial` at the end)
                pass
        result.partial = bus.partial
    return result


def partitions_on_bus(url: str) -> list[Partition | None]:
    """[None] for a log written by one partition; else the fleet and every job queue with
    facts of its own.  Told apart by the partition names the writers put in their message
    ids (`<partition>:<command seq>:<index>`), in the log's first message."""
    import asyncio

    import nats

    from quotasched.events.subjects import FACTS_STREAM
    from quotasched.services.nats.credentials import connect_options
    from quotasched.services.scheduler.log import first_writer

    async def look() -> list[Partition | None]:
        nc = await nats.connect(url, name="quotasched-audit", connect_timeout=3,
                                max_reconnect_attempts=1, **connect_options())  # fmt: skip
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(FACTS_STREAM, subjects_filter="qm.fact.>")
            except Exception:  # no stream: the reader says so, in its words
                return [None]
            subjects = (info.state.subjects or {}) if info.state.messages else {}
            queues = sorted({subject.split(".")[2] for subject in subjects} - {"~"})
            writer = await first_writer(js)  # the mode guard's own reading of the log
            if writer is None or partition_mode(writer) != PER_QUEUE:
                return [None]
            return [Partition.fleet(), *(Partition.for_queue(q) for q in queues)]
        finally:
            await nc.close()

    try:
        return asyncio.run(look())
    except Exception:  # unreachable: the reader reports it with its own message
        return [None]
