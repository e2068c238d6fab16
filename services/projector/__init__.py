"""The projector: the fact log (QM_FACTS) applied to a DuckDB file, and its read API over NATS.

    quotasched projector --nats-url URL --db q.duckdb      # or part of `quotasched up`

    from quotasched.services.projector.client import query
    query(url, "sql", sql="SELECT status, count(*) FROM jobs GROUP BY ALL")
    query(url, "describe-service-job", jobId="high")
    query(url, "position")             # last applied fact seq, and lag behind the log

service.py  the `Projector`: start, run, watch the log, stop; built from the parts below
bulk.py     a large backlog at start: spooled and projected like a rebuild, then followed
reading.py  the consumer loop: ordered consumer from the file's position + 1, batches
applying.py `projections.store.apply`, one transaction per batch (rows + position), then
            `qm.projected`; checkpoints when the log goes quiet
answering.py  requests in, answers out (the subscription side of the read API)
api.py      the read verbs: request -> answer, on a cursor of the projector's connection
options.py  `ProjectorOptions`; errors.py `ProjectorError`, `ProjectorHalted`
client.py   `query(nats_url, verb, **params)` and its async forms, for other processes
thread.py   the projector on its own thread and event loop (how `quotasched up` runs it)

The projector process is the only one that opens its DuckDB file (DuckDB: one writer, or
readers without a writer); every other process asks it over request/reply:

    qm.proj.<verb>   request: a JSON object; reply: a JSON object, {"error": {...}} on failure
    qm.projected     published after every committed batch: {"position", "facts", "at"}
"""

from __future__ import annotations

API_PREFIX = "qm.proj"
APPLIED_SUBJECT = "qm.projected"
QUEUE_GROUP = "qm-proj"

__all__ = ["API_PREFIX", "APPLIED_SUBJECT", "QUEUE_GROUP"]
