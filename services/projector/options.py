"""The projector's tuning: `ProjectorOptions`, read from `QUOTASCHED_PROJECTOR_*` variables.

Every knob of the batching loop, the checkpoints and the read API lives here, with its bounds
(pydantic validates them when the options are made).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProjectorOptions(BaseSettings):
    """Tuning, from `QUOTASCHED_PROJECTOR_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_PROJECTOR_", extra="ignore")

    max_batch: int = Field(20_000, ge=1)  # facts per transaction at most
    max_wait_ms: float = Field(25.0, ge=0)  # linger after the first fact of a batch
    catch_up_wait_ms: float = Field(250.0, ge=0)  # linger for facts the server says are waiting
    high_water: int = Field(50_000, ge=1000)  # buffered facts before the reader pauses
    # A backlog of at least this many facts at start is spooled and projected like a rebuild
    # (services/projector/bulk.py) instead of in batches; 0: never.
    bulk_catch_up: int = Field(100_000, ge=0)
    query_timeout_s: float = Field(30.0, gt=0)  # a read is interrupted after this long
    query_threads: int = Field(2, ge=1, le=16)  # reads running at once
    progress_every_s: float = Field(10.0, gt=0)  # a progress log line at most this often
    heartbeat_s: float = Field(1.0, ge=0.1, le=30)  # the ordered consumer's idle heartbeat
    # Checkpoints block every writer (also one run from another thread).  DuckDB's own, at its
    # default 16 MB of write-ahead log (~26k facts at ~620 B each), cost 0.1-0.8 s each and
    # came every ~2.6 s at 10k facts/s: most of the lag's tail.  So the projector checkpoints
    # when the log goes quiet (`checkpoint_idle_s` without a new fact) and leaves DuckDB's
    # automatic one as a backstop at `checkpoint_threshold` (128 MB ~ 200k facts: one
    # checkpoint per ~20 s of sustained 10k facts/s; replaying that much log after a kill
    # takes under 0.5 s).  None: DuckDB's default.  benchmarks/projector_bench.py measures it.
    checkpoint_threshold: str | None = Field("128MB", pattern=r"^[0-9]+(\.[0-9]+)? ?[KMGT]?i?B$")
    checkpoint_idle_s: float = Field(1.0, gt=0)
    duckdb_threads: int | None = Field(None, ge=1, le=64)  # None: DuckDB's default (all cores)
    # A file written by another projection schema version (an upgrade changed a table, view
    # or macro) is deleted and rebuilt from the log's first fact; False: refuse to start.
    rebuild_on_schema_change: bool = True


__all__ = ["ProjectorOptions"]
