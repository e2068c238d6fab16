"""Recovery of the scheduler's state from its snapshot and the fact log; storing and loading
snapshots (their layout: snapshots.py).

The log readers themselves are the shell's plumbing (services/nats/log.py): every service
reads the log with them, none through the scheduler.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import DigestMismatchError, NotFoundError, ObjectNotFoundError

from quotasched.events.codec import decode_fact, encode_bytes
from quotasched.events.subjects import ANY, COMMANDS_PREFIX, COMMANDS_STREAM, FACTS_STREAM, SNAPSHOTS_BUCKET
from quotasched.services.nats.bus import last_sequence
from quotasched.services.nats.log import header_value, read_log_chunks, read_messages, sequence_and_time
from quotasched.services.nats.objects import fetch_object, store_object
from quotasched.services.scheduler.core import State, evolve
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.routing import decide_message, fact_subject_of
from quotasched.services.scheduler.snapshots import capture_snapshot, collector_paused, decode_snapshot


async def first_writer(js: JetStreamContext) -> str | None:
    """The partition that wrote the fact log's first message (from its `Nats-Msg-Id`,
    `<partition>:<command seq>:<index>`); None for an empty log or a message without one."""
    try:
        info = await js.stream_info(FACTS_STREAM)
        if not info.state.messages:
            return None
        first = await js.get_msg(FACTS_STREAM, info.state.first_seq)
    except NotFoundError:
        return None
    message_id = (first.headers or {}).get("Nats-Msg-Id") or ""
    return message_id.split(":", 1)[0] if message_id.count(":") == 2 else None


@dataclass
class Recovered:
    state: State
    fact_seq: int  # the last fact folded into state (every command up to it is complete)
    decided_through: int  # the last command sequence whose facts are all in the log
    commands_through: int = 0  # the last command the state includes (>= decided_through)
    log_end: int = 0  # the log's last sequence, partial command included: the next fence
    partial: tuple[int, list[bytes]] | None = None  # (command seq, its facts already logged)
    snapshot_seq: int = 0  # the snapshot this state was rebuilt from (0: from the start)
    folded: int = 0  # facts of this partition folded (or decided again) since the snapshot
    last_refused: bool = False  # was the command at decided_through refused (it moved no clock)
    load_seconds: float = 0.0  # how long fetching and loading its snapshot took


async def recover(js: JetStreamContext, scope: Partition, warm: Recovered | None = None) -> Recovered:
    """Latest snapshot plus the tail of the partition's facts, folded with the one `evolve`.

    With `warm` (the result of an earlier call that nothing has changed since), only the
    facts logged after it are folded: a standby calls this over and over to follow the log,
    so that taking over costs a short tail, not a whole fold under a running lease.

    Facts are folded a whole command at a time: each message says how many facts its
    command produced (`Qm-Facts`) and which one it is (the index ending its message id).  A
    writer that died mid-append may have left only the first facts of its last command; those
    are not folded but returned as `partial`, so the next leader re-decides that command
    (deterministically: to the same facts) and appends only what is missing.

    A job queue's partition records only its own facts, so the fleet-wide commands it
    decided (an environment created, a queue created) are not all in what it folds: those
    are decided again from the command stream, in order among its own commands (see
    `FleetCommands`).
    """
    loading = time.perf_counter()
    recovered = warm or await load_snapshot(js, scope.name) or Recovered(State(), 0, 0)
    if warm is None:
        recovered.load_seconds = time.perf_counter() - loading
    await check_log_complete(js, scope, recovered.fact_seq)
    recovered.log_end, recovered.partial = recovered.fact_seq, None
    fleet = await FleetCommands.read(js, scope, recovered.commands_through) if scope.is_queue else None
    group: list = []
    with collector_paused():  # see FOLD_CHUNK
        async for chunk in read_log_chunks(js, scope.fact_filter, recovered.fact_seq + 1,
                                           chunk_size=FOLD_CHUNK, keep=_seq_data_count):  # fmt: skip
            for seq, data, count in chunk:
                recovered.log_end = seq
                group.append((seq, data))
                if len(group) < count:
                    continue
                _fold_command(recovered, fleet, group)
                group = []
            gc.collect(0)
            gc.freeze()
    if group:
        recovered.partial = (decode_fact(group[0][1]).command_seq, [data for _, data in group])
    return recovered


# Facts read as one chunk and folded before the next gc.freeze(), with the cyclic collector
# paused meanwhile: a fold creates the state's long-lived objects and nothing cyclic (the
# core's objects hold no cycles; see writer.freeze_now), so collections during it would only
# rescan what stays.  Before each freeze a collection of the youngest generation frees what
# other tasks left cyclic meanwhile, so nothing garbage is frozen for good (no cost measured
# on a fold of 116k facts).  Chunks instead of a queue and a generator step per message:
# recovery took 15-20 % less CPU per fact (116k facts folded in process, alternating with the
# former loop, 2026-12-04, this 2-core machine).
FOLD_CHUNK = 16_384


def _seq_data_count(seq: int, headers: bytes | None, data: bytes) -> tuple[int, bytes, int]:
    """A fact message as recovery folds it: stream seq, payload, and how many facts its
    command produced (`Qm-Facts`)."""
    return seq, data, int(header_value(headers, b"Qm-Facts") or 1)


def _fold_command(recovered: Recovered, fleet: FleetCommands | None, group: list) -> None:
    """Fold one whole command's facts, (stream seq, payload) in log order, into `recovered`."""
    facts = [decode_fact(data) for _, data in group]
    command_seq = facts[0].command_seq
    redecided = fleet.decide_through(recovered, command_seq) if fleet is not None else None
    if redecided is not None:  # a fleet-wide command, decided again just now
        if redecided != [data for _, data in group]:
            raise RuntimeError(f"deciding fleet-wide command {command_seq} again gave "
                               "other facts than the log holds")  # fmt: skip
    else:
        for fact in facts:
            evolve(recovered.state, fact)
    recovered.fact_seq = group[-1][0]
    recovered.folded += len(group)
    if command_seq >= recovered.decided_through:
        recovered.last_refused = facts[0].kind == "CommandRejected"
    recovered.decided_through = max(recovered.decided_through, command_seq)
    recovered.commands_through = max(recovered.commands_through, command_seq)


class LogIncomplete(RuntimeError):
    """The fact log lost facts the state needs: the scheduler must not start on it."""


async def check_log_complete(js: JetStreamContext, scope: Partition, folded_through: int) -> None:
    """Refuse a fact log whose first messages are gone (evicted by a limit, or purged) where
    the state folded so far (a snapshot, or nothing) does not reach them.  Folding on from
    the first message left would apply facts about jobs and shares whose creation is gone,
    and fail on every try.  A partition cannot tell whether the missing messages were its
    own, so any gap it has not folded past is refused."""
    state = (await js.stream_info(FACTS_STREAM)).state
    if state.last_seq and state.first_seq > folded_through + 1:
        covered = (f"the snapshot of partition {scope.name} ends at {folded_through}"
                   if folded_through else f"partition {scope.name} has no snapshot")  # fmt: skip
        raise LogIncomplete(
            f"the fact log {FACTS_STREAM} begins at sequence {state.first_seq}: facts "
            f"{folded_through + 1} to {state.first_seq - 1} are gone (evicted or purged) and "
            f"{covered}, so the state cannot be rebuilt; restore {FACTS_STREAM} from a backup "
            "(nats stream restore; docs/operations.md, Retention and compaction)"
        )


class FleetCommands:
    """The fleet-wide commands (`qm.cmd.~.>`) after a point of the command stream, for a job
    queue's partition to decide again among its own recorded commands.  They are few: the
    configuration of environments, policies and queues, and explicit Ticks."""

    def __init__(self, scope: Partition, messages: list[tuple[int, str, bytes, float]]):
        self.scope = scope
        self.pending = messages  # (seq, subject, data, stamp), in stream order

    @classmethod
    async def read(cls, js: JetStreamContext, scope: Partition, after: int) -> FleetCommands:
        subject = f"{COMMANDS_PREFIX}.{ANY}.>"
        end = await last_sequence(js, subject, COMMANDS_STREAM)
        messages = []
        if end > after:
            async for msg in read_messages(js, subject, after + 1, end, stream=COMMANDS_STREAM):
                seq, stamp = sequence_and_time(msg)
                messages.append((seq, msg.subject, msg.data, stamp))
        return cls(scope, messages)

    def decide_through(self, recovered: Recovered, seq: int) -> list[bytes] | None:
        """Decide every fleet-wide command up to `seq` not yet in the state; returns this
        partition's facts of command `seq` itself when it was one of them."""
        mine = None
        while self.pending and self.pending[0][0] <= seq:
            command_seq, subject, data, stamp = self.pending.pop(0)
            if command_seq <= recovered.commands_through:
                continue
            state = recovered.state
            facts = decide_message(state, subject, data, command_seq, stamp)
            recovered.commands_through = command_seq
            if command_seq == seq:
                route = (None, None)  # fleet-wide: parse_command_subject gives no tokens
                mine = [encode_bytes(fact) for fact in facts
                        if self.scope.owns(fact_subject_of(state, fact, route))]
        return mine


async def save_snapshot(nc: Client, partition: str,
                        snapshot: Recovered | Callable[[], bytes],
                        timings: dict[str, float] | None = None) -> int:  # fmt: skip
    """Store a snapshot (a state, or what `capture_snapshot` returned) so a restart folds only
    the tail; returns its size in bytes.  Written by the scheduler alone (credentials keep
    everyone else out of the bucket, see the security docs).  `timings`, when given, gets
    the `time.perf_counter()` at which the bytes were "encoded" and "stored"."""
    timings = {} if timings is None else timings
    capture = capture_snapshot(snapshot) if isinstance(snapshot, Recovered) else snapshot
    payload = await asyncio.get_running_loop().run_in_executor(None, capture)
    timings["encoded"] = time.perf_counter()
    await store_object(nc, SNAPSHOTS_BUCKET, partition, payload)
    timings["stored"] = time.perf_counter()
    return len(payload)


async def load_snapshot(js: JetStreamContext, partition: str) -> Recovered | None:
    try:
        buffer = await fetch_object(js, SNAPSHOTS_BUCKET, partition)
    except ObjectNotFoundError:
        return None
    except DigestMismatchError:  # a damaged object: fold the whole log instead
        return None
    try:
        image = decode_snapshot(buffer.getbuffer())
    except Exception:  # a damaged object: fold the whole log instead
        return None
    if image is None:
        return None  # an older layout: fold the whole log instead
    _, fact_seq, decided_through, commands_through, last_refused, state = image
    return Recovered(state, fact_seq, decided_through, commands_through, snapshot_seq=fact_seq,
                     last_refused=last_refused)
