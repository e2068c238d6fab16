"""DuckDB projections of the fact log (per-queue, per-share and per-job utilization).

    store    open(path) -> ProjectionStore: apply(batch of (seq, fact)), position()
    rebuild  rebuild_from_file / rebuild_from_stream: a fresh database from the log
    queries  AWS-shaped answers, utilization rollups and checksums from a connection
    schema, views, rollups, rows, checks: the SQL (tables, views, macros, fact -> rows)

See projections/README.md for the tables, the rollup definitions and example queries.
"""

from quotasched.projections.queries import QueryError, answer, checksum, utilization
from quotasched.projections.rebuild import Rebuilt, rebuild_from_file, rebuild_from_stream
from quotasched.projections.errors import (FactNotApplicable, ProjectionError, ProjectionLocked,
                                SchemaMismatch, SpoolFailed)
from quotasched.projections.schema import SCHEMA_VERSION
from quotasched.projections.store import ProjectionStore, open  # noqa: A004 (the store's open)

__all__ = [
    "SCHEMA_VERSION", "FactNotApplicable", "ProjectionError", "ProjectionLocked",
    "ProjectionStore", "QueryError", "Rebuilt", "SchemaMismatch", "SpoolFailed", "answer",
    "checksum", "open", "rebuild_from_file", "rebuild_from_stream", "utilization",
]  # fmt: skip
