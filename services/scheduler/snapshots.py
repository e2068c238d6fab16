"""The scheduler's snapshots: its state as of one fact of the log, so a restart folds only the
facts after it.  Written by the leader alone (credentials keep everyone else out of the
bucket), read by `log.recover`.

A snapshot as stored (layout SNAPSHOT_VERSION), in the object store `QM_SNAPSHOTS` under the
partition's name:

    MAGIC | header length (4 bytes, big-endian) | header | state frame | job frames ...

- header: the pickle of (version, fact_seq, decided_through, commands_through, last_refused,
  the state frame's length, ((block, its frame's length), ...));
- state frame: Zstandard level 1 of the pickle of `State.image(None)`, everything but the jobs
  and the shares' heaps (made again from the jobs on loading: `State.rebuild_heaps`);
- job frames: one per block of jobs, in the jobs' order (acceptance order), each Zstandard
  level 1 of the pickle of the list of the block's jobs' tuples (`Job.snapshot`).  A block is
  the jobs whose acceptance seqs share `seq >> BLOCK_BITS`.

Why blocks.  After a SIGKILL the tail to fold is the facts appended since the last stored
snapshot was captured, and under a steady load a snapshot is captured as soon as the one
before is stored: the tail is one to two encoding times' worth of appends, so a restart is as
fast as the encoding.  Most jobs do not change between two snapshots (a queue of 400k waiting
jobs moves at its head), so the writer keeps the frames of the last snapshot it encoded
(`SnapshotChain`) and the core marks the seq of every job it changes, adds or drops
(`State.changed`, marked where the journal that undoes a trial is kept); the next snapshot
encodes again only the blocks holding a marked seq, and copies the other frames as they are.

A reused frame holds what encoding its jobs again would give: the same jobs, unchanged, pickle
and compress to the same bytes.  The snapshot child checks this on VERIFIED_BLOCKS reused
frames picked at random; a frame that differs means a change the core did not mark, and the
child writes nothing (the writer logs an error, and the next snapshot is encoded whole).
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.state import JOBS_AT

if TYPE_CHECKING:
    from quotasched.services.scheduler.log import Recovered

# 15: jobs in frames by block of acceptance seqs, the rest in a frame of its own (reused
# between snapshots); 14: the jobs' tuples pickled in runs, each with its own memo; 13: jobs
# pickled as tuples by the State, shares' dispatched jobs by id; 12: the ended jobs awaiting
# expiry, per job queue (retention); 11: shares count their live jobs and submission windows
# (admission limits); 9: shares keep their options beyond AWS, the state its wake-ups; 8: jobs
# keep their tags, payload and recent attempts (DescribeServiceJob); 7: whether the last
# decided command was refused; 6: every state object pickled as a tuple, the same from the
# interpreted and the compiled core; 5: blocked_due in the state; 4: the last command in the
# state; 3: jobs pickled as slot tuples; 2: zlib; 1: pickle
SNAPSHOT_VERSION = 15
MAGIC = b"QMSNAP\r\n"  # a framed snapshot; the layouts before began with zlib's or zstd's bytes
_LENGTH = struct.Struct(">I")
BLOCK_BITS = 12  # 4,096 acceptance seqs a block
VERIFIED_BLOCKS = 2  # reused frames checked against a fresh encoding, each snapshot
LEVEL = 1  # Zstandard's compression level
# A state pickles to many repeated names and small ints: Zstandard's level 1 makes it about 4x
# smaller.  Zstandard, not zlib: the 110 MB pickle of a state of 551k jobs compressed in
# 0.21 s (zlib's level 1: 0.65 s) to 25.2 MB (26.5 MB), and decompressed in 0.09 s (0.26 s)
# (best of 3, 2026-12-05, this 2-core machine).


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off meanwhile (as it was after): for building or loading a state,
    which makes many long-lived objects and no cycles, so collections would only rescan it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class SnapshotMismatch(RuntimeError):
    """A reused frame differs from its jobs encoded again: a change the core did not mark."""


@dataclass
class Reuse:
    """What a snapshot may copy from the last one: its frames, minus those around `changed`."""

    payload: bytes
    frames: dict[int, tuple[int, int]]  # block -> (offset, length) in payload
    changed: set[int]  # seqs of the jobs changed since the last one was captured


@dataclass
class SnapshotChain:
    """One writer's last encoded snapshot, for the next to reuse its unchanged blocks.

    `begin` is called as a snapshot is captured: from then on the state marks its changes in
    a new set, and what was marked since the last capture says which blocks to encode again.
    `encoded` keeps the new snapshot once the child has written it.  A failed snapshot leaves
    nothing to reuse: the next is encoded whole.  So does a state other than the one whose
    changes were followed (a new term's, rebuilt from the log)."""

    payload: bytes | None = None
    frames: dict[int, tuple[int, int]] = field(default_factory=dict)
    marks: set[int] | None = None  # the set the followed state marks its changes in
    reuse: Reuse | None = None  # what the snapshot being encoded may copy
    copied: int = 0  # frames the last snapshot copied from the one before

    def begin(self, state: State) -> Reuse | None:
        reuse = None
        if self.payload is not None and self.marks is not None and state.changed is self.marks:
            reuse = Reuse(self.payload, self.frames, self.marks)
        self.payload, self.frames, self.reuse = None, {}, reuse
        state.changed = self.marks = set()
        return reuse

    def encoded(self, payload: bytes) -> None:
        self.payload, self.frames = payload, frame_index(payload)
        reuse, self.reuse = self.reuse, None
        if reuse is None:
            self.copied = 0
            return
        dirty = _blocks_of(reuse.changed)
        self.copied = sum(1 for block in self.frames if block in reuse.frames and block not in dirty)


def capture_snapshot(recovered: Recovered, chain: SnapshotChain | None = None) -> Callable[[], bytes]:
    """Capture the state as of `fact_seq` now; the returned function gives its bytes (it may
    block: call it in a thread).

    Where the platform can fork, a child process encodes its copy-on-write image of the state
    while the writer goes on deciding (encoding a state of a million jobs holds the
    interpreter for seconds), and the bytes come back through a pipe.  With a `chain`, the
    blocks of jobs that did not change since its last snapshot are copied from it.
    """
    image = (SNAPSHOT_VERSION, recovered.fact_seq, recovered.decided_through,
             recovered.commands_through, recovered.last_refused, recovered.state)  # fmt: skip
    reuse = chain.begin(recovered.state) if chain is not None else None
    if not hasattr(os, "fork"):
        payload = encode_snapshot(image, reuse)
        if chain is not None:
            chain.encoded(payload)
        return lambda: payload
    pid, pipe = _encode_in_child(image, reuse)

    def collect() -> bytes:
        payload = _collect(pid, pipe)
        if chain is not None:
            chain.encoded(payload)
        return payload

    return collect


def encode_snapshot(image: tuple, reuse: Reuse | None = None) -> bytes:
    """The snapshot of `image` (its header fields, then the state), as stored; with `reuse`,
    the frames of blocks no job of changed are copied from it, VERIFIED_BLOCKS of them checked.

    Each block's jobs are pickled on their own: pickle remembers every string and tuple it
    wrote (its memo), and one memo over every job of a large state grows to millions of
    entries, each added slower than the last (263k jobs: 0.66 s as one list, 0.32 s in runs of
    4,096; 2026-12-04, this 2-core machine).

    The cyclic collector is paused meanwhile: encoding builds a tuple of fields per job (and
    boxes the compiled core's numbers), each allocation threshold crossed starts a collection
    over them, and nothing cyclic is made.  A state of 197k jobs pickled in 0.74 s paused
    against 1.00 s running (best of 3, 2026-12-04, this 2-core machine)."""
    import zstandard  # here, not at the top: most of the CLI never touches a snapshot

    *head, state = image
    compress = zstandard.ZstdCompressor(level=LEVEL).compress
    protocol = pickle.HIGHEST_PROTOCOL
    with collector_paused():
        blocks = _blocks(state)
        counts: dict[int, int] = {}
        for block, _ in blocks:
            counts[block] = counts.get(block, 0) + 1
        dirty = set() if reuse is None else _blocks_of(reuse.changed)
        view = None if reuse is None else memoryview(reuse.payload)
        frames: list[Any] = []
        copied: list[tuple[int, list[Any], Any]] = []
        for block, jobs in blocks:
            at = reuse.frames.get(block) if reuse is not None and block not in dirty else None
            if at is not None and counts[block] == 1:
                frame = view[at[0]:at[0] + at[1]]
                copied.append((block, jobs, frame))
            else:
                frame = compress(pickle.dumps([job.snapshot() for job in jobs], protocol))
            frames.append(frame)
        for block, jobs, frame in random.sample(copied, min(VERIFIED_BLOCKS, len(copied))):
            fresh = compress(pickle.dumps([job.snapshot() for job in jobs], protocol))
            if fresh != frame:
                raise SnapshotMismatch(f"the jobs of block {block} changed unmarked")
        rest = compress(_pickled_without_heaps(state, protocol))
    header = pickle.dumps((*head, len(rest), tuple((block, len(frame)) for (block, _), frame
                                                   in zip(blocks, frames))), protocol)  # fmt: skip
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, rest, *frames])


def _pickled_without_heaps(state: State, protocol: int) -> bytes:
    """The pickle of everything but the jobs, the shares' heaps left empty: a heap is the
    order its RUNNABLE jobs' slots give, which the loader makes again (`State.rebuild_heaps`).
    Pickling the heaps' 484k entries took 0.39-0.42 s of the 0.48 s this frame took, rebuilding
    them takes less than unpickling them (2026-12-05, this 2-core machine)."""
    shares = [share for queue in state.queues.values() for share in queue.shares.values()]
    heaps = [share.heap for share in shares]
    try:
        for share in shares:
            share.heap = []
        return pickle.dumps(state.image(None), protocol)
    finally:  # in process (no fork), the state goes on as it was
        for share, heap in zip(shares, heaps):
            share.heap = heap


def _blocks_of(seqs: set[int]) -> set[int]:
    """The blocks holding these acceptance seqs."""
    return {seq >> BLOCK_BITS for seq in seqs}


def _blocks(state: State) -> list[tuple[int, list[Any]]]:
    """The state's jobs, in its index's order, cut where the block of their seq changes."""
    blocks: list[tuple[int, list[Any]]] = []
    current, members = -1, []
    for job in state.jobs.values():
        block = job.seq >> BLOCK_BITS
        if block != current:
            current, members = block, []
            blocks.append((block, members))
        members.append(job)
    return blocks


def _header(payload: bytes | memoryview) -> tuple[tuple, int] | None:
    """The header of a stored snapshot and where its state frame begins; None for a layout
    without one (the whole log is folded instead)."""
    view = memoryview(payload)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        return None
    start = len(MAGIC) + _LENGTH.size
    (size,) = _LENGTH.unpack(view[len(MAGIC):start])
    header = pickle.loads(view[start:start + size])
    if not isinstance(header, tuple) or not header or header[0] != SNAPSHOT_VERSION:
        return None
    return header, start + size


def frame_index(payload: bytes) -> dict[int, tuple[int, int]]:
    """Where each block's frame lies in `payload` (a block seen twice is left out)."""
    found = _header(payload)
    if found is None:
        return {}
    header, at = found
    rest, blocks = header[-2], header[-1]
    at += rest
    frames: dict[int, tuple[int, int]] = {}
    twice: set[int] = set()
    for block, length in blocks:
        if block in frames:
            twice.add(block)
        frames[block] = (at, length)
        at += length
    for block in twice:
        del frames[block]
    return frames


def decode_snapshot(payload: bytes | memoryview) -> tuple | None:
    """The image `encode_snapshot` was given, or None when `payload` is an older layout (the
    whole log is folded instead).  Raises on damaged bytes.

    The cyclic collector is paused while the state is built, then what it built is frozen:
    a state's hundreds of thousands of objects all live on, and each allocation threshold
    crossed would start a collection over them (a state of 263k jobs took 2.1 s to load with
    the collector running against 0.66 s paused: the 400k replay workload, 2026-12-04, this
    2-core machine).  Frozen, the loaded state is never rescanned by the tail's fold (the
    core's objects hold no cycles; see writer.freeze_now).  Frozen before the collector runs
    again: its count of allocations is then reset, while re-enabled first, the next
    allocation set off a collection of everything just built (0.5 s for 551k jobs)."""
    import zstandard

    found = _header(payload)
    if found is None:
        return None
    header, at = found
    view = memoryview(payload)
    decompress = zstandard.ZstdDecompressor().decompress
    with collector_paused():
        fields = pickle.loads(decompress(view[at:at + header[-2]]))
        at += header[-2]
        jobs: list[tuple] = []
        for _, length in header[-1]:
            jobs.extend(pickle.loads(decompress(view[at:at + length])))
            at += length
        if at != len(view):
            raise ValueError(f"the snapshot is {len(view)} bytes, its frames end at {at}")
        state = State()
        state.__setstate__((*fields[:JOBS_AT], jobs, *fields[JOBS_AT + 1:]))
        state.rebuild_heaps()
        gc.freeze()
    return (*header[:-2], state)


def _encode_in_child(image: tuple, reuse: Reuse | None) -> tuple[int, int]:
    """Fork; the child writes the encoded `image` to a pipe and exits at once."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no event loop, no logging, no cleanup handlers
        code = 1
        try:
            os.close(read)
            try:
                payload = encode_snapshot(image, reuse)
            except SnapshotMismatch:
                code = MISMATCH_EXIT
                raise
            with open(write, "wb") as out:
                out.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


MISMATCH_EXIT = 3


def _collect(pid: int, pipe: int) -> bytes:
    """Everything the child wrote, once it has exited cleanly."""
    with open(pipe, "rb") as handle:
        payload = handle.read()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == MISMATCH_EXIT:
        raise SnapshotMismatch("a reused block of the last snapshot differs from its jobs "
                               "encoded again: a change the core did not mark (a bug); this "
                               "snapshot is not written, the next is encoded whole")  # fmt: skip
    if code != 0:
        raise RuntimeError(f"the snapshot process failed (status {status})")
    return payload
