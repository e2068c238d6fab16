"""Catching up in bulk: a large backlog at start is spooled and projected like a rebuild.

A projector that starts far behind the log (a fresh file on an existing log, a file rebuilt
after a schema change, a projector that was down for a while) would apply the backlog in
batches of `max_batch` facts, each paying lookups over a file that grows with every batch.
When the backlog is at least `bulk_catch_up` facts, `BulkMixin` instead reads it up to the
last fact of a whole command (`services.nats.log.read_log_chunks`), spools it beside the
file (in the directory `<db>.catch-up/`) and projects it with `projections.rebuild.Spool`: one
transaction per run of consecutive sequences, the statements of a file rebuild.  Then the
projector follows the log from its new position as usual.

Requests are answered while the backlog is read; the projection itself is synchronous, as a
batch is.  A crash leaves whole runs committed (the position says which) and spool files that
the next start removes.  A fact that cannot be applied ends the bulk phase (the runs before it
are committed) and the batches that follow stop right before it, as they always do.
"""

from __future__ import annotations

import os
import shutil
import time

from nats.js.errors import NotFoundError

from quotasched import projections
from quotasched.events.subjects import FACTS_STREAM
from quotasched.projections.rebuild import Spool
from quotasched.services import logs
from quotasched.services.projector.reading import ends_command, place_in_command
from quotasched.services.nats.log import ALL_FACTS, LogReadStalled, read_log_chunks

log = logs.get("quotasched.projector")

MAX_LOOK_BACK = 10_000  # facts searched back from the log's end for a command's last fact


def spool_directory(db_path: str) -> str:
    return os.path.abspath(db_path) + ".catch-up"


def allow_spool(con, db_path: str) -> None:
    """Let DuckDB read the spool directory once external access is off (the projector turns
    it off for the SQL it answers; DuckDB refuses to widen this afterwards, so it is set
    before).  The spool holds facts of the log, which the `facts` view serves anyway."""
    directory = spool_directory(db_path).replace("'", "''")
    con.execute(f"SET allowed_directories = ['{directory}{os.sep}']")


class BulkMixin:
    """The bulk catch-up of `Projector`; its state is made in `Projector.__init__`."""

    async def _catch_up_in_bulk(self, stream_last: int) -> None:
        """Project facts position+1 .. (about) stream_last at once when there are enough."""
        directory = spool_directory(self.db_path)
        shutil.rmtree(directory, ignore_errors=True)  # left by a crash mid-way
        threshold = self.options.bulk_catch_up
        if not threshold or stream_last - self.position < threshold:
            return
        end = await command_end(self.js, stream_last, self.position)
        if end - self.position < threshold:
            return
        log.info("catching up in bulk", position=self.position, until_seq=end,
                 facts=end - self.position)  # fmt: skip
        spool = Spool(os.path.join(directory, "facts"))
        started = time.perf_counter()
        try:
            try:
                os.makedirs(directory)
                async for chunk in read_log_chunks(self.js, ALL_FACTS, self.position + 1,
                                                   until_seq=end):  # fmt: skip
                    if self._stopping:
                        return
                    spool.add(chunk)
                spool.close()
            except (projections.SpoolFailed, OSError) as failure:  # e.g. a full disk
                log.warning("bulk catch-up cannot spool the backlog; going on batch by batch",
                            position=self.position, error=str(failure))  # fmt: skip
                return
            except LogReadStalled as failure:  # the server gave nothing for a long while
                log.warning("bulk catch-up could not read the log; going on batch by batch",
                            position=self.position, error=str(failure))  # fmt: skip
                return
            read = time.perf_counter()
            try:
                spool.apply(self.store)  # synchronous, as a batch
            except projections.FactNotApplicable as failure:
                log.warning("bulk catch-up met a fact it cannot apply; going on batch by batch",
                            position=self.store.position(), error=str(failure))  # fmt: skip
            self._committed(spool.applied, time.perf_counter() - read)
            self._last_seen = self.position
            log.info("caught up in bulk", position=self.position, facts=spool.applied,
                     runs=sum(part.kind == "run" for part in spool.parts),
                     runs_refused=spool.refused, read_s=round(read - started, 2),
                     project_s=round(time.perf_counter() - read, 2))  # fmt: skip
            await self._announce(spool.applied)
        finally:
            spool.remove()
            shutil.rmtree(directory, ignore_errors=True)


async def command_end(js, last: int, floor: int) -> int:
    """The largest seq in (floor, last] found to be the last fact of its command (or to carry
    no command headers), so that reads after the bulk phase see whole decisions; `floor` if
    none turns up within MAX_LOOK_BACK messages.  A message id's index says how many facts of
    its command came before it; with one scheduling partition those are right before it, so
    one jump back usually lands on the previous command's last fact."""
    seq, looked = last, 0
    while seq > floor and looked < MAX_LOOK_BACK:
        looked += 1
        try:
            headers = (await js.get_msg(FACTS_STREAM, seq)).headers
        except NotFoundError:  # deleted from the stream
            seq -= 1
            continue
        if ends_command(headers):
            return seq
        seq -= place_in_command(headers)[0] + 1  # where its command began, minus one
    return floor
