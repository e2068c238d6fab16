"""The projector's read verbs: a request (a JSON object) in, an answer (a JSON object) out.

    sql                     {"sql": "SELECT ...", "limit": 1000}
                            -> {"columns", "types", "rows", "rowCount", "truncated", "position"}
    describe-service-job    the AWS-shaped requests and answers of projections.queries
    list-service-jobs       (the same shapes as the scheduler's qm.api.<verb>; list-service-jobs
                            pages: maxResults 1-1000, default 100, and an opaque nextToken)
    get-job-queue-snapshot
    utilization             {"t0", "t1", "bucketSeconds": 3600, "per": "share"|"queue"}
                            -> {"rows": [...], "position"}
    checksum                {} -> {"position", "tables": {name: {"rows", "hash"}}}
    position                answered by the service itself (no DuckDB work)

`run(cursor, verb, request)` runs on a cursor of the projector's own connection, inside one
read transaction (so a multi-statement answer sees one snapshot, and `position` says which
facts it reflects), which is always rolled back.  `sql` takes exactly one statement that
DuckDB's own parser classifies as a SELECT (SELECT, WITH ... SELECT, DESCRIBE, SHOW,
SUMMARIZE, FROM-first, VALUES); anything else is refused before it runs.  The service also
turns off DuckDB's external access (no files, no ATTACH, no extensions), so a SELECT cannot
read the file system either.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import duckdb

from quotasched.projections import queries

DEFAULT_ROW_LIMIT = 1000
MAX_ROW_LIMIT = 10_000

AWS_VERBS = tuple(queries.VERBS)  # describe-service-job, list-service-jobs, get-job-queue-snapshot
DB_VERBS = ("sql", *AWS_VERBS, "utilization", "checksum")
VERBS = (*DB_VERBS, "position")


class Refused(ValueError):
    """A request the projector will not run (bad verb, not a read-only query, bad params)."""


def error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


def check_sql(statement: Any) -> str:
    """The statement if it is exactly one read-only query; Refused otherwise."""
    if not isinstance(statement, str) or not statement.strip():
        raise Refused('give the query as {"sql": "SELECT ..."}')
    try:
        parsed = duckdb.extract_statements(statement)
    except duckdb.Error as problem:
        raise Refused(f"not a valid query: {problem}") from None
    if len(parsed) != 1:
        raise Refused(f"give exactly one statement, not {len(parsed)}")
    if parsed[0].type != duckdb.StatementType.SELECT:
        kind = parsed[0].type.name
        raise Refused(f"only read-only queries (SELECT, WITH, DESCRIBE, SHOW) are answered, "
                      f"not {kind}")  # fmt: skip
    return statement


def row_limit(request: dict) -> int:
    limit = request.get("limit", DEFAULT_ROW_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise Refused(f"limit must be a positive integer, not {limit!r}")
    return min(limit, MAX_ROW_LIMIT)


def check_request(verb: str, request: dict) -> None:
    """Everything that can be refused without the database (run on the event loop)."""
    if verb not in VERBS:
        raise Refused(f"unknown verb {verb!r}; expected one of {', '.join(VERBS)}")
    if verb == "sql":
        check_sql(request.get("sql"))
        row_limit(request)
    elif verb == "utilization":
        _utilization_params(request)
    elif verb == "list-service-jobs":  # maxResults, filters and nextToken, as the scheduler's
        queries.list_params(request)


def _utilization_params(request: dict) -> tuple[float, float, float, str]:
    try:
        t0, t1 = float(request["t0"]), float(request["t1"])
        bucket = float(request.get("bucketSeconds", 3600))
    except (KeyError, TypeError, ValueError):
        raise Refused('utilization takes {"t0": seconds, "t1": seconds, "bucketSeconds": '
                      '3600, "per": "share" or "queue"}') from None  # fmt: skip
    per = request.get("per", "share")
    if per not in ("share", "queue"):
        raise Refused(f"per must be share or queue, not {per!r}")
    if not (bucket > 0 and t1 >= t0):
        raise Refused("need bucketSeconds > 0 and t1 >= t0")
    return t0, t1, bucket, per


def run(cursor: duckdb.DuckDBPyConnection, verb: str, request: dict) -> dict[str, Any]:
    """Answer a database verb on `cursor` (blocking: the service calls it in a thread)."""
    cursor.execute("BEGIN TRANSACTION")
    try:
        if verb == "sql":
            return _sql(cursor, request)
        if verb in AWS_VERBS:
            return queries.answer(cursor, verb, request)
        if verb == "utilization":
            t0, t1, bucket, per = _utilization_params(request)
            return {"rows": queries.utilization(cursor, t0, t1, bucket, per),
                    "position": _position(cursor)}  # fmt: skip
        if verb == "checksum":
            sums = queries.checksum(cursor)
            return {"position": _position(cursor),
                    "tables": {name: {"rows": rows, "hash": str(digest)}
                               for name, (rows, digest) in sums.items()}}  # fmt: skip
        raise Refused(f"unknown verb {verb!r}")
    finally:
        cursor.execute("ROLLBACK")


def _position(cursor) -> int:
    return cursor.execute("SELECT position FROM projection_state").fetchone()[0]


def _sql(cursor, request: dict) -> dict[str, Any]:
    statement = check_sql(request.get("sql"))
    limit = row_limit(request)
    position = _position(cursor)
    result = cursor.execute(statement)
    if result.description is None:
        return {"columns": [], "types": [], "rows": [], "rowCount": 0, "truncated": False,
                "position": position}  # fmt: skip
    columns = [column[0] for column in result.description]
    types = [str(column[1]) for column in result.description]
    rows = result.fetchmany(limit + 1)
    truncated = len(rows) > limit
    rows = rows[:limit]
    return {"columns": columns, "types": types, "rows": [list(row) for row in rows],
            "rowCount": len(rows), "truncated": truncated, "position": position}  # fmt: skip


# -- JSON -------------------------------------------------------------------------------------


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _plain(value: Any) -> Any:
    """What json.dumps cannot take directly: non-string map keys, NaN and infinities."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_plain(k), default=_default): _plain(v)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode(answer: dict[str, Any], max_bytes: int | None = None) -> bytes:
    """The answer as JSON bytes; an `sql` answer too large for one NATS message loses rows
    from its end (and says so in `truncated`), any other becomes an error answer."""
    try:
        data = json.dumps(answer, default=_default, allow_nan=False).encode()
    except (TypeError, ValueError):
        data = json.dumps(_plain(answer), default=_default, allow_nan=False).encode()
    if max_bytes is None or len(data) <= max_bytes:
        return data
    rows = answer.get("rows") if isinstance(answer.get("rows"), list) else None
    if rows is None or "columns" not in answer:
        return json.dumps(error("AnswerTooLarge", f"the answer is {len(data)} bytes, more than "
                                f"a NATS message may carry ({max_bytes}); ask for fewer rows"
                                )).encode()  # fmt: skip
    keep = len(rows)
    while keep > 0 and len(data) > max_bytes:
        keep = min(keep - 1, int(keep * max_bytes / len(data) * 0.95))
        trimmed = {**answer, "rows": rows[:keep], "rowCount": max(keep, 0), "truncated": True}
        data = encode(trimmed)
    return data
