"""The projection's physical tables: append-only, each row a function of one fact.

Every table here is written only by `rows.py` (INSERT ... SELECT over a staged batch of facts)
and never updated, except the one-row `projection_state`, which records the last applied fact
sequence in the same transaction as the rows (DESIGN principle 4).  Everything that depends on
more than one fact (current job status, running usage, when an attempt ended) is either looked
up from rows of earlier facts while a fact is projected (`allocation_ends`, `share_changes`,
`capacity_changes`) or computed by a view (`views.py`).  So the database holds no state that
is not a pure function of the facts applied so far, and a rebuild, an incremental build in
batches of any size and a resume after a crash all give the same tables.

`at` and `limit` are SQL keywords in DuckDB: quote them (`"at"`, `"limit"`) or qualify them
(`t.at`) in queries.
"""

from __future__ import annotations

from quotasched.projections.errors import SchemaMismatch

# Views and macros live in the file too: bump this whenever a table, view or macro changes, so
# an old file is refused (and rebuilt) instead of answering with yesterday's definitions.
SCHEMA_VERSION = 4

UNIT_LIMIT = "STRUCT(capacity_unit VARCHAR, max_capacity INTEGER)[]"

TABLES_DDL = """
CREATE TABLE projection_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version INTEGER NOT NULL,
    position BIGINT NOT NULL,         -- seq of the last applied fact (0: none)
    facts_applied BIGINT NOT NULL,
    last_at DOUBLE                    -- logical time of the last applied fact
);
INSERT INTO projection_state VALUES (1, {schema_version}, 0, 0, NULL);

-- The log itself, parsed once: the typed columns the views and rows.py filter on, every field
-- any projected kind carries (`fields`, from rows.SPEC; absent ones NULL), and the fact's JSON
-- exactly as logged (`body`).  zstd: ~4x smaller than DuckDB's default string compression
-- for JSON text, and ~1.6x faster to write.
CREATE TABLE fact_log (
    seq BIGINT NOT NULL,
    "at" DOUBLE,                      -- NULL only in a malformed fact, which checks.py refuses
    kind VARCHAR,
    command_seq BIGINT,
    job_id VARCHAR,
    job_queue VARCHAR,                -- as the fact names them (the `facts` view fills them in)
    quota_share VARCHAR,
    fields {fields_type},
    body VARCHAR USING COMPRESSION zstd NOT NULL
);

-- One row per dispatched attempt and capacity unit (a heterogeneous job has several).
CREATE TABLE allocation_starts (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    job_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    job_queue VARCHAR NOT NULL,
    quota_share VARCHAR NOT NULL,
    unit_index INTEGER NOT NULL,      -- position in the job's capacityUsage
    capacity_unit VARCHAR NOT NULL,
    quantity INTEGER NOT NULL,
    borrowed INTEGER NOT NULL         -- the part of quantity beyond the share's own limit
);

-- The fact that ended an attempt: the first JobPreempted or non-dispatched JobStatusChanged
-- for that (job, attempt) after its dispatch.
CREATE TABLE allocation_ends (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    job_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    end_reason VARCHAR NOT NULL,      -- SUCCEEDED, FAILED, PREEMPTED, TERMINATED
    cause VARCHAR NOT NULL            -- the StatusCause, or the preemption reason
);

CREATE TABLE preemptions (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    job_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    preemptor_job_id VARCHAR NOT NULL,
    reason VARCHAR NOT NULL,          -- CROSS_SHARE_RECLAIM, IN_SHARE_PRIORITY
    outcome VARCHAR NOT NULL,         -- REQUEUED, FAILED
    job_queue VARCHAR NOT NULL,
    quota_share VARCHAR NOT NULL,
    preemptor_share VARCHAR,          -- NULL only for an unknown preemptor (refused)
    preempted_attempt_count INTEGER NOT NULL
);

-- Changes of one share's usage (delta) or configuration (new_limit / new_lends / new_cap;
-- NULL: unchanged) for one unit; share_usage integrates them.
CREATE TABLE share_changes (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    job_queue VARCHAR NOT NULL,
    quota_share VARCHAR NOT NULL,
    capacity_unit VARCHAR NOT NULL,
    delta INTEGER NOT NULL,
    new_limit INTEGER,
    new_lends BOOLEAN,
    new_cap INTEGER                   -- lending limit (an option beyond AWS); -1: none
);

-- A job queue's capacity per unit: its service environment's maxCapacity.
CREATE TABLE capacity_changes (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    job_queue VARCHAR NOT NULL,
    capacity_unit VARCHAR NOT NULL,
    capacity INTEGER NOT NULL
);

CREATE TABLE environment_config (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    service_environment VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    capacity_limits {unit_limit} NOT NULL
);

CREATE TABLE queue_config (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    kind VARCHAR NOT NULL,
    job_queue VARCHAR NOT NULL,
    service_environment VARCHAR NOT NULL,
    scheduling_policy VARCHAR NOT NULL,
    priority INTEGER NOT NULL,
    state VARCHAR NOT NULL
);

-- One row per QuotaShareCreated / Updated / Deleted (deleted: no limits, no strategy).
CREATE TABLE share_config (
    seq BIGINT NOT NULL,
    "at" DOUBLE NOT NULL,
    kind VARCHAR NOT NULL,
    job_queue VARCHAR NOT NULL,
    quota_share VARCHAR NOT NULL,
    deleted BOOLEAN NOT NULL,
    strategy VARCHAR,
    borrow_limit INTEGER,
    in_share_preemption VARCHAR,
    state VARCHAR,
    capacity_limits {unit_limit} NOT NULL
);
"""

# Physical tables, in the order rows.py fills them; every one is append-only but the first.
TABLES = (
    "projection_state", "fact_log", "allocation_starts", "allocation_ends", "preemptions",
    "environment_config", "queue_config", "share_config", "share_changes", "capacity_changes",
)  # fmt: skip


def create(con) -> None:
    """Create every table, view and macro in an empty database."""
    from quotasched.projections import rollups, rows, views

    fields_type = con.execute(f"SELECT typeof({rows.FIELDS}) FROM "
                              "(SELECT json_transform('{}', $spec) AS f)",
                              {"spec": rows.SPEC}).fetchone()[0]  # fmt: skip
    con.execute("BEGIN")
    try:
        con.execute(TABLES_DDL.format(fields_type=fields_type, schema_version=SCHEMA_VERSION,
                                      unit_limit=UNIT_LIMIT))  # fmt: skip
        con.execute(views.VIEWS_DDL)
        con.execute(rollups.MACROS_DDL)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def check(con, path: str) -> None:
    """Refuse a file of another schema version: projections are disposable, so the answer
    is always a rebuild, never a migration."""
    row = con.execute("SELECT schema_version FROM projection_state").fetchone()
    if row is None or row[0] != SCHEMA_VERSION:
        found = None if row is None else row[0]
        raise SchemaMismatch(
            f"{path} holds projection schema version {found}, this code writes version "
            f"{SCHEMA_VERSION}: rebuild it (quotasched projections rebuild --db {path} ...)"
        )


def is_empty(con) -> bool:
    return not con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'projection_state'"
    ).fetchone()[0]
