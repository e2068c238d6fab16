"""Prometheus metrics (`GET /metrics`) and a health endpoint (`GET /healthz`) for the scheduler
and the projector.  Every metric is documented in docs/metrics.md.

Design.  The scheduler's state is a plain mutable object graph changed only by its event loop
(`_decide_batch` runs to completion without awaiting), so the endpoint is a small HTTP server
on that same loop (`asyncio.start_server`): a scrape runs between two batches and reads a
consistent state, with no lock and no copy.  The gauges (usage, limits, borrowed, lent, jobs
by status) are computed from the state at scrape time by a custom collector, so a command
pays nothing for them (the queued jobs are walked in slices, handing the loop back to the
writer in between).  What the state does not keep (dispatches and preemptions so far, how
long deciding took) is counted by `WriterStats`, once per batch: one histogram observation
when a batch is decided, and one C-level `Counter.update` over the subjects of the facts when
they are stored (the subject carries queue, share and kind; the payloads are read only in the
rare batches that hold a `JobPreempted`, for its reason and outcome).

The projector runs on its own thread and loop; its numbers are plain attributes (read as
whole values) and a histogram whose updates take a lock, so the endpoint reads them from the
main loop.  Values that live on the server (the scheduler consumer's pending commands, the fact
stream's last sequence for the projector's lag) are asked for at scrape time, with a short
timeout; a metric whose question failed is left out of that scrape.

A scrape that never gets an answer is itself a signal: the endpoint answers from the loop the
scheduler decides on, so a blocked loop fails the health check too.

Modules: `histogram` (the per-batch histogram), `writer_stats` (what the writer counts),
`state_gauges` (the gauges of a scheduler's state), `scheduler_part` and `projector_part` (the
metrics and health of each kind of part), `endpoint` (the HTTP server, `/metrics` and
`/healthz`).  This package re-exports their names, so `services.metrics` is the one import path.
"""

from __future__ import annotations

# Every name the old single module had, private ones too (tests read `_REASON_OUTCOME`);
# `__all__` is unchanged.
from quotasched.services.metrics.endpoint import QUERY_TIMEOUT_S, MetricsEndpoint, _Parts
from quotasched.services.metrics.histogram import Histogram, _float_text
from quotasched.services.metrics.projector_part import APPLY_BUCKETS, ProjectorPart
from quotasched.services.metrics.scheduler_part import SchedulerPart
from quotasched.services.metrics.state_gauges import (
    QUEUED_STATUSES,
    SCAN_CHUNK,
    _waiting,
    jobs_by_status,
    jobs_by_status_yielding,
    share_figures,
    state_families,
)
from quotasched.services.metrics.writer_stats import (
    _READ_KINDS,
    _REASON_OUTCOME,
    _SUBJECT,
    DECIDE_BUCKETS,
    WriterStats,
    _reason_and_outcome,
    dispatch_reason,
)


__all__ = ["Histogram", "MetricsEndpoint", "ProjectorPart", "SchedulerPart", "WriterStats",
           "jobs_by_status", "share_figures", "state_families"]  # fmt: skip
