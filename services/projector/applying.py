"""Applying batches: one transaction per batch (its rows and the position), then the notice.

`ApplyingMixin` (a part of `service.Projector`, on its state) commits a batch with
`projections.store.apply` (synchronous: nothing awaits inside), counts it, publishes the new
position on `qm.projected`, and checkpoints the write-ahead log when asked.

A fact the projection cannot apply halts the projector right before it: the facts before it
are committed, the fact is logged, `ProjectorHalted` is raised; nothing is ever skipped.
"""

from __future__ import annotations

import json
import time

import duckdb

from quotasched import projections
from quotasched.services import logs
from quotasched.services.projector import APPLIED_SUBJECT
from quotasched.services.projector.errors import ProjectorHalted

log = logs.get("quotasched.projector")


class ApplyingMixin:
    """The apply side of `Projector`; its state is made in `Projector.__init__`."""

    # -- applying ------------------------------------------------------------------------------

    async def _apply(self, items: list[tuple[int, bytes]]) -> None:
        started = time.perf_counter()
        try:
            applied = self.store.apply(items)  # one transaction; nothing awaits inside
        except projections.FactNotApplicable as failure:
            self._apply_up_to_failure(items, failure)  # raises ProjectorHalted
            applied = 0  # (every fact applied one part at a time after all: go on)
        except duckdb.Error as failure:
            log.error("the projection database failed", db=self.db_path, position=self.position,
                      first_seq=items[0][0], last_seq=items[-1][0], error=str(failure))  # fmt: skip
            raise
        else:
            self._committed(applied, time.perf_counter() - started)
        await self._announce(applied)

    def _checkpoint(self) -> None:
        """Write the write-ahead log into the file while nothing arrives (blocking: requests
        wait, as for a batch)."""
        started = time.perf_counter()
        try:
            self.store.con.execute("CHECKPOINT")
        except duckdb.Error as failure:  # e.g. a conflicting transaction: the next idle spell
            log.debug("checkpoint skipped", error=str(failure))
            return
        self._dirty = False
        log.debug("checkpoint", position=self.position,
                  seconds=round(time.perf_counter() - started, 3))  # fmt: skip

    def _committed(self, applied: int, seconds: float) -> None:
        self._dirty = True
        self.position = self.store.position()
        self.facts_applied += applied
        self.batches += 1
        self.apply_seconds += seconds
        self.apply_latency.observe(seconds)
        self.applied_at = time.time()

    async def _announce(self, applied: int) -> None:
        try:
            await self.nc.publish(APPLIED_SUBJECT, json.dumps({
                "position": self.position, "facts": applied, "at": self.applied_at}).encode())
        except Exception:  # a notification only; readers can always ask for `position`
            pass

    def _try_apply(self, items: list[tuple[int, bytes]]) -> projections.FactNotApplicable | None:
        started = time.perf_counter()
        try:
            applied = self.store.apply(items)
        except projections.FactNotApplicable as failure:
            return failure
        self._committed(applied, time.perf_counter() - started)
        return None

    def _apply_up_to_failure(self, items: list[tuple[int, bytes]],
                             failure: projections.FactNotApplicable) -> None:  # fmt: skip
        """Commit every fact before the first one that cannot be applied, then log it and
        raise ProjectorHalted.  The store names the fact (then one apply of the facts before
        it, one of the fact alone); when it does not, the batch is bisected (each part that
        applies is committed, so the position ends right before the bad fact)."""
        named = failure.problems[0][0] if failure.problems else None
        candidates = items
        if named is not None and any(seq == named for seq, _ in items):
            before = [item for item in items if item[0] < named]
            if not before or self._try_apply(before) is None:
                candidates = [item for item in items if item[0] >= named]
        while len(candidates) > 1:
            half = candidates[: len(candidates) // 2]
            refused = self._try_apply(half)
            if refused is None:
                candidates = candidates[len(half):]
            else:
                candidates, failure = half, refused
        refused = self._try_apply(candidates)
        if refused is None:  # the batch failed as a whole, yet every part applied
            log.warning("a batch was refused as a whole but applied in parts",
                        first_seq=items[0][0], last_seq=items[-1][0], error=str(failure))  # fmt: skip
            return
        failure = refused
        seq, kind, reason = (failure.problems[0] if failure.problems
                             else (candidates[0][0], None, str(failure)))  # fmt: skip
        if kind is None:
            try:
                kind = json.loads(candidates[0][1]).get("kind")
            except (ValueError, AttributeError):
                kind = "?"
        self.position = self.store.position()
        log.error("cannot apply fact: the projector stops", seq=seq, kind=kind, reason=reason,
                  position=self.position, problems=[list(p) for p in failure.problems],
                  db=self.db_path)  # fmt: skip
        raise ProjectorHalted(seq, kind, reason, self.position) from failure
