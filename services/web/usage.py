"""Instances in use over time, per quota share and for the whole job queue, as step lines whose
steps are the facts' own times: the projector's `share_usage` and `queue_usage` views (one row
per dispatch, preemption or end that changed a share's usage, at that fact's `at`).

Why the views and not the facts: they are the projection's running sums of the
`share_changes` table, which the projector keeps as it applies facts, so a window of usage is
one query over that table (DuckDB, in the projector's process) instead of a read of the fact
log per request; and they are what the report plots, so the two agree.  A level holds until
the next step; the line starts at the window's start with the level then and ends at its end
(now, or the last fact's time when the log's clock is behind now) with the last level; a
queue younger than the window starts at its first step.
"""

from __future__ import annotations

import time
from typing import Any

from quotasched.services.projector.client import ProjectorError, ProjectorUnavailable
from quotasched.services.projector.client import request as ask_projector

WINDOWS = {"15m": 900, "1h": 3600, "6h": 21600, "24h": 86400}
DEFAULT_WINDOW = "1h"
MAX_STEPS = 10_000  # the projector's row bound: the newest steps are kept past it


def window_bounds(window: str, last_at: float | None,
                  now: float | None = None) -> tuple[float, float]:  # fmt: skip
    """(t0, t1) of the window ending now, or at the last fact's time when the facts are not
    epoch times (a replayed file's logical clock) or lie ahead of this machine's clock."""
    seconds = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    now = time.time() if now is None else now
    if last_at is None:
        t1 = now
    elif last_at < 1e9:
        t1 = last_at
    else:
        t1 = max(now, last_at)
    return t1 - seconds, t1


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def steps_sql(queue: str, t0: float, t1: float) -> str:
    """Per series (a share, or NULL for the queue) and capacity unit: its level at t0 (the last
    step before it), then every step in (t0, t1]; newest first, so a cut keeps the newest."""
    return f"""
WITH s AS (
    SELECT quota_share AS series, capacity_unit, "at", seq, in_use FROM share_usage
    WHERE job_queue = {_literal(queue)}
    UNION ALL
    SELECT NULL, capacity_unit, "at", seq, in_use FROM queue_usage
    WHERE job_queue = {_literal(queue)})
SELECT series, capacity_unit, {t0!r} AS "at", seq, in_use FROM s WHERE "at" <= {t0!r}
QUALIFY row_number() OVER (PARTITION BY series, capacity_unit ORDER BY seq DESC) = 1
UNION ALL
SELECT series, capacity_unit, "at", seq, in_use FROM s WHERE "at" > {t0!r} AND "at" <= {t1!r}
ORDER BY seq DESC"""


def series_of(rows: list, t0: float, t1: float) -> list[dict[str, Any]]:
    """The step lines: shares in order of name, then the queue's total ("all shares"); each
    `points` [[at, instances], ...] in time order, from t0 to t1."""
    lines: dict[tuple, list] = {}
    for series, unit, at, _, in_use in reversed(rows):  # oldest first
        lines.setdefault((series, unit), []).append([max(float(at), t0), int(in_use)])
    units = sorted({unit for _, unit in lines})
    shown = []
    for (series, unit), points in sorted(lines.items(), key=lambda item: (
            item[0][0] is None, item[0][0] or "", item[0][1])):  # fmt: skip
        points.append([t1, points[-1][1]])
        name = series if series is not None else "all shares"
        shown.append({"quotaShareName": series, "capacityUnit": unit, "points": points,
                      "label": name if len(units) == 1 else f"{name} {unit}"})  # fmt: skip
    return shown


async def usage(nc, queue: str, window: str, last_at: float | None) -> dict[str, Any]:
    """The job queue's step lines over the last `window` (15m, 1h, 6h, 24h), or why there are
    none (no projector answers, or it refused)."""
    t0, t1 = window_bounds(window, last_at)
    try:
        answer = await ask_projector(nc, "sql", timeout=10.0, sql=steps_sql(queue, t0, t1),
                                     limit=MAX_STEPS)  # fmt: skip
    except ProjectorUnavailable as error:
        return {"available": False, "reason": f"No usage over time: {error}."}
    except ProjectorError as error:
        return {"available": False, "reason": f"The projector refused: {error}."}
    series = series_of(answer["rows"], t0, t1)
    # a queue younger than the window is drawn from its first step, not from an empty start
    start = min((line["points"][0][0] for line in series), default=t0)
    return {"available": True, "jobQueue": queue,
            "window": window if window in WINDOWS else DEFAULT_WINDOW, "t0": start, "t1": t1,
            "position": answer.get("position"), "truncated": bool(answer.get("truncated")),
            "series": series}  # fmt: skip
