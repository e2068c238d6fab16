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
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from itertools import compress
from operator import itemgetter
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from events.subjects import COMMANDS_STREAM, FACTS_STREAM
from events.values import JobStatus
from services import logs
from services.scheduler.core.state import State

log = logs.get("quotasched.metrics")

# Seconds.  Deciding a batch takes ~30-100 us per command, so 1 command to 1000 per batch.
DECIDE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5)  # fmt: skip
APPLY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUERY_TIMEOUT_S = 1.0  # for what a scrape asks the server
SCAN_CHUNK = 5_000  # queued jobs checked between two turns of the writer's event loop
QUEUED_STATUSES = (JobStatus.RUNNABLE, JobStatus.SCHEDULED, JobStatus.STARTING, JobStatus.RUNNING)

_SUBJECT = itemgetter(0)
# The encoder writes a JobPreempted's fields in their declared order: reason, then outcome.
_READ_KINDS = (".JobDispatched", ".JobPreempted")
_REASON_OUTCOME = re.compile(rb'"reason":"([A-Z_]+)","outcome":"([A-Z_]+)"')


class Histogram:
    """Fixed buckets, observed once per batch; safe to read from another thread."""

    __slots__ = ("bounds", "counts", "total", "_lock")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect_left(self.bounds, value)  # first bound >= value: `le` semantics
        with self._lock:
            self.counts[index] += 1
            self.total += value

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self.counts), self.total
        buckets, running = [], 0
        for bound, count in zip((*map(_float_text, self.bounds), "+Inf"), counts):
            running += count
            buckets.append((bound, running))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=total)


def dispatch_reason(payload: bytes) -> str:
    """Why a JobDispatched could happen, from its canonical JSON without decoding it:
    `preemption` (it waited for jobs to be preempted: `afterPreemptionOf` is not empty),
    else `borrowed` (part of it is beyond its share's own limit), else `own_quota`."""
    if b'"afterPreemptionOf":[]' not in payload:
        return "preemption"
    return "own_quota" if b'"borrowed":[]' in payload else "borrowed"


class WriterStats:
    """What the scheduler's writer counts per batch (its event loop only)."""

    def __init__(self) -> None:
        self.decide_seconds = Histogram(DECIDE_BUCKETS)
        self.facts_by_subject: Counter = Counter()  # fact subject -> facts stored
        self.preemptions: Counter = Counter()  # (subject, reason, outcome) -> facts
        self.dispatches: Counter = Counter()  # (subject, reason) -> facts

    def landed(self, out: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """A batch's facts (subject, payload, headers) are stored."""
        subjects = Counter(map(_SUBJECT, out))  # C-level: no Python code per fact
        self.facts_by_subject.update(subjects)
        # Payloads are read only for these two kinds, and only in batches that hold them.
        read = {subject for subject in subjects if subject.endswith(_READ_KINDS)}
        if read:
            for subject, payload, _ in compress(out, map(read.__contains__, map(_SUBJECT, out))):
                if subject.endswith(".JobDispatched"):
                    self.dispatches[(subject, dispatch_reason(payload))] += 1
                else:
                    self.preemptions[(subject, *_reason_and_outcome(payload))] += 1

    def families(self) -> list:
        facts = CounterMetricFamily("quotasched_scheduler_facts",
                                    "Facts this instance appended to the log, by kind.",
                                    labels=["kind"])  # fmt: skip
        dispatches = CounterMetricFamily(
            "quotasched_scheduler_dispatches",
            "JobDispatched facts this instance appended, by job queue, quota share and reason "
            "(own_quota, borrowed, preemption).",
            labels=["job_queue", "quota_share", "reason"])  # fmt: skip
        by_kind: Counter = Counter()
        for subject, count in sorted(self.facts_by_subject.items()):
            by_kind[subject.split(".")[4]] += count
        for (subject, reason), count in sorted(self.dispatches.items()):
            _, _, queue, share, _ = subject.split(".")
            dispatches.add_metric([queue, share, reason], count)
        for kind, count in sorted(by_kind.items()):
            facts.add_metric([kind], count)
        preemptions = CounterMetricFamily(
            "quotasched_scheduler_preemptions",
            "JobPreempted facts this instance appended, by the preempted job's queue and share, "
            "the preemption reason and the outcome.",
            labels=["job_queue", "quota_share", "reason", "outcome"])  # fmt: skip
        for (subject, reason, outcome), count in sorted(self.preemptions.items()):
            _, _, queue, share, _ = subject.split(".")
            preemptions.add_metric([queue, share, reason, outcome], count)
        decide = self.decide_seconds.family(
            "quotasched_scheduler_decide_seconds",
            "Time the decision core spent on one batch of commands (decide, fold, encode).")
        return [facts, dispatches, preemptions, decide]


# ---------------------------------------------------------------------------- the state's gauges


def share_figures(state: State) -> list[tuple[str, str, str, int, int, int, float]]:
    """(queue, share, unit, limit, usage, borrowed, lent) for every share and capacity unit it
    lists or uses.

    lent: borrowing is pooled per queue and unit (the log records how much a job borrowed,
    never from whom), so it is attributed to the lending shares in proportion to their idle
    quota, as the projections' `lent_s` and the report do:
        lent[s] = max(0, L - U) * min(1, B_q / I_q)   for a LEND or LEND_AND_BORROW share,
                = 0                                  for a RESERVE share,
    with B_q the queue's borrowed total and I_q its lendable idle total for the unit.  The lent
    amounts of a queue add up to min(B_q, I_q), which is B_q whenever borrowing is backed.
    """
    rows = []
    for queue in state.queues.values():
        for share in queue.shares.values():
            lends = share.strategy.lends
            for unit in sorted(share.limits.keys() | share.usage.keys()):
                limit = share.limits.get(unit, 0)
                used = share.usage.get(unit, 0)
                idle = max(0, limit - used) if lends else 0
                pool_idle = queue.idle.get(unit, 0)
                pool_borrowed = queue.borrowed.get(unit, 0)
                lent = idle * min(1.0, pool_borrowed / pool_idle) if idle and pool_idle else 0.0
                rows.append((queue.name, share.name, unit, limit, used, max(0, used - limit), lent))
    return rows


def jobs_by_status(state: State) -> dict[tuple[str, str], Counter]:
    """(queue, share) -> jobs per queued or dispatched status.  Reads the shares' heaps and
    dispatched jobs, not the whole job table: cost follows the live jobs, not the history."""
    result: dict[tuple[str, str], Counter] = {}
    for queue in state.queues.values():
        for share in queue.shares.values():
            counts = Counter(job.status for job in share.dispatched.values())
            counts[JobStatus.RUNNABLE] = len(_waiting(state.jobs, share.heap, set()))
            result[(queue.name, share.name)] = counts
    return result


async def jobs_by_status_yielding(state: State, chunk: int = SCAN_CHUNK) -> dict:
    """`jobs_by_status`, handing the event loop back every `chunk` heap entries, so a scrape of
    100k queued jobs (tens of ms) never holds up the writer for more than a few ms.  A share's
    heap is copied first (a C-level copy); jobs decided meanwhile are counted as they are when
    their entry is checked, and entries pushed meanwhile are left for the next scrape."""
    result: dict[tuple[str, str], Counter] = {}
    for queue in list(state.queues.values()):
        for share in list(queue.shares.values()):
            counts = Counter(job.status for job in share.dispatched.values())
            entries = list(share.heap)
            waiting: set[str] = set()
            for start in range(0, len(entries), chunk):
                if start:
                    await asyncio.sleep(0)
                _waiting(state.jobs, entries[start:start + chunk], waiting)
            counts[JobStatus.RUNNABLE] = len(waiting)
            result[(queue.name, share.name)] = counts
    return result


def _waiting(jobs: dict, entries: list, into: set[str]) -> set[str]:
    """Add the ids of the RUNNABLE jobs that `entries` (heap entries) stand for, skipping the
    stale entries as `State.head` does; a job with two live-looking entries counts once."""
    runnable = JobStatus.RUNNABLE  # a local: enum member lookups are slow in a 100k-job loop
    add = into.add
    for priority, seq, job_id in entries:
        job = jobs.get(job_id)
        if (job is not None and job.status is runnable and job.priority == -priority
                and job.seq == seq):  # fmt: skip
            add(job_id)
    return into


def state_families(state: State, job_counts: dict[tuple[str, str], Counter] | None = None,
                   only_queue: str | None = None) -> list:  # fmt: skip
    """The gauges of a scheduler's state (see docs/metrics.md); `job_counts`: its
    `jobs_by_status`, when already counted; `only_queue`: the one queue a partition serves
    (its state knows every queue's configuration, not their shares and jobs)."""
    queues = [q for q in state.queues.values() if only_queue is None or q.name == only_queue]
    labels = ["job_queue", "quota_share", "capacity_unit"]
    limit = GaugeMetricFamily("quotasched_share_limit",
                              "The share's own limit (maxCapacity) in instances.", labels=labels)
    usage = GaugeMetricFamily("quotasched_share_usage",
                              "Instances held by the share's dispatched jobs.", labels=labels)
    borrowed = GaugeMetricFamily("quotasched_share_borrowed",
                                 "Instances the share uses beyond its own limit.", labels=labels)
    lent = GaugeMetricFamily(
        "quotasched_share_lent",
        "Instances of the share's idle quota that other shares borrow (pooled per queue and "
        "unit, attributed pro rata to idle quota).", labels=labels)  # fmt: skip
    for queue, share, unit, *values in share_figures(state):
        for family, value in zip((limit, usage, borrowed, lent), values):
            family.add_metric([queue, share, unit], value)
    info = GaugeMetricFamily("quotasched_share_info", "1 per quota share, with its configuration.",
                             labels=["job_queue", "quota_share", "strategy", "state"])  # fmt: skip
    for queue in queues:
        for share in queue.shares.values():
            info.add_metric([queue.name, share.name, share.strategy.value, share.state.value], 1)
    jobs = GaugeMetricFamily(
        "quotasched_share_jobs",
        "Jobs of the share by status: the queue depth (RUNNABLE) and the dispatched jobs.",
        labels=["job_queue", "quota_share", "status"])  # fmt: skip
    if job_counts is None:
        job_counts = jobs_by_status(state)
    for (queue, share), counts in job_counts.items():
        for status in QUEUED_STATUSES:
            jobs.add_metric([queue, share, status.value], counts.get(status, 0))
    capacity = GaugeMetricFamily(
        "quotasched_queue_capacity",
        "maxCapacity of the job queue's service environment, per capacity unit.",
        labels=["job_queue", "capacity_unit"])  # fmt: skip
    for queue in queues:
        environment = state.environments.get(queue.environment)
        if environment is not None:
            for unit, quantity in sorted(environment.capacity.items()):
                capacity.add_metric([queue.name, unit], quantity)
    return [limit, usage, borrowed, lent, info, jobs, capacity]


# ---------------------------------------------------------------------------------- the parts


class SchedulerPart:
    """Metrics and health of one `Scheduler` (on the loop it runs on)."""

    role = "scheduler"

    def __init__(self, scheduler, labelled: bool = False) -> None:
        self.scheduler = scheduler
        # One of several partitions in this process: every series of the writer carries a
        # `partition` label, and the state's gauges cover only the partition's own queue.
        self.labelled = labelled
        self._pending: tuple[int, int] | None = None
        self._jobs: dict | None = None

    async def refresh(self) -> None:
        self._pending = self._jobs = None
        scheduler = self.scheduler
        if not scheduler.leading.is_set() or scheduler.recovered is None:
            return
        self._jobs = await jobs_by_status_yielding(scheduler.recovered.state)
        try:
            consumer = scheduler.scope.durable
            info = await scheduler.js.consumer_info(COMMANDS_STREAM, consumer,
                                                    timeout=QUERY_TIMEOUT_S)  # fmt: skip
        except Exception as error:  # no such consumer yet, a timeout, a lost connection
            log.debug("consumer info not available", error=repr(error))
            return
        self._pending = (info.num_pending or 0, info.num_ack_pending or 0)

    def families(self) -> list:
        out = self._families()
        if self.labelled:
            for family in out:
                for sample in family.samples:
                    sample.labels.setdefault("partition", self.scheduler.partition)
        return out

    def _families(self) -> list:
        scheduler = self.scheduler
        leading = scheduler.leading.is_set()
        leader = GaugeMetricFamily("quotasched_scheduler_leader",
                                   "1 while this instance leads its partition, else 0.",
                                   labels=["partition"])  # fmt: skip
        leader.add_metric([scheduler.partition], 1 if leading else 0)
        term = GaugeMetricFamily(
            "quotasched_scheduler_term",
            "The lease revision this instance's current (or last) term began with; a larger "
            "term is a later leader.  0 before the first term.", labels=["partition"])  # fmt: skip
        term.add_metric([scheduler.partition], scheduler.term or 0)
        decided = CounterMetricFamily("quotasched_scheduler_commands_decided",
                                      "Commands this instance decided (all terms).",
                                      value=scheduler.commands_decided)  # fmt: skip
        appended = CounterMetricFamily("quotasched_scheduler_facts_appended",
                                       "Facts this instance appended and saw stored.",
                                       value=scheduler.facts_appended)  # fmt: skip
        out = [leader, term, decided, appended, *scheduler.stats.families()]
        recovered = scheduler.recovered
        # A standby follows the log (`_warm`): how far tells how ready it is to take over.
        folded = recovered if leading else getattr(scheduler, "_warm", None)
        if folded is not None:
            out.append(GaugeMetricFamily(
                "quotasched_scheduler_fact_seq",
                "Stream sequence of the last fact in this instance's state: stored by the "
                "leader, or folded by a standby following the log.",
                value=folded.fact_seq))  # fmt: skip
        if leading and recovered is not None:
            out.append(GaugeMetricFamily(
                "quotasched_scheduler_decided_through",
                "Stream sequence of the last command whose facts were decided.",
                value=recovered.decided_through))  # fmt: skip
            if self._pending is not None:
                pending = GaugeMetricFamily(
                    "quotasched_scheduler_commands_pending",
                    "Commands of the scheduler's consumer not yet decided and stored: "
                    "undelivered (num_pending) and delivered but unacked (num_ack_pending).",
                    labels=["state"])  # fmt: skip
                pending.add_metric(["undelivered"], self._pending[0])
                pending.add_metric(["unacked"], self._pending[1])
                out.append(pending)
            scope = scheduler.scope
            if scope.token is None or scope.is_queue:  # the fleet has no shares or jobs
                out.extend(state_families(recovered.state, self._jobs, only_queue=scope.token))
        return out

    def health(self) -> tuple[bool, dict[str, Any]]:
        scheduler = self.scheduler
        leading = scheduler.leading.is_set()
        recovered = scheduler.recovered
        connected = bool(scheduler.nc.is_connected)
        return connected, {
            "state": "leader" if leading else "standby",
            "connected": connected,
            "partition": scheduler.partition,
            "term": scheduler.term,
            "decidedThrough": recovered.decided_through if leading and recovered else None,
        }


class ProjectorPart:
    """Metrics and health of a projector running on its own thread (`ProjectorThread`).
    `js` is a JetStream context of the endpoint's loop, used to read the fact stream's end."""

    role = "projector"

    def __init__(self, runner, js) -> None:
        self.runner = runner
        self.js = js
        self._stream_last: int | None = None

    async def refresh(self) -> None:
        try:
            info = await asyncio.wait_for(self.js.stream_info(FACTS_STREAM), QUERY_TIMEOUT_S)
            self._stream_last = info.state.last_seq
        except Exception as error:
            log.debug("fact stream info not available", error=repr(error))
            self._stream_last = None

    def families(self) -> list:
        projector = self.runner.projector
        if projector is None:
            return []
        position = projector.position
        out = [
            CounterMetricFamily("quotasched_projector_facts_applied",
                                "Facts the projector applied to its DuckDB file.",
                                value=projector.facts_applied),
            CounterMetricFamily("quotasched_projector_batches",
                                "Transactions (batches of facts) the projector committed.",
                                value=projector.batches),
            GaugeMetricFamily("quotasched_projector_position",
                              "Stream sequence of the last fact applied (committed).",
                              value=position),
        ]  # fmt: skip
        if self._stream_last is not None:
            out.append(GaugeMetricFamily("quotasched_projector_stream_last_seq",
                                         "The fact stream's last sequence, at scrape time.",
                                         value=self._stream_last))  # fmt: skip
            out.append(GaugeMetricFamily("quotasched_projector_lag",
                                         "Facts in the stream not yet applied "
                                         "(stream last sequence - position).",
                                         value=max(self._stream_last - position, 0)))  # fmt: skip
        out.append(projector.apply_latency.family(
            "quotasched_projector_apply_seconds",
            "Time to apply one batch of facts in one DuckDB transaction."))
        return out

    def health(self) -> tuple[bool, dict[str, Any]]:
        projector = self.runner.projector
        running = bool(self.runner.running and projector is not None and projector.ready.is_set())
        connected = bool(projector is not None and projector.nc.is_connected)
        return running and connected, {
            "state": "running" if running else "stopped",
            "connected": connected,
            "position": projector.position if projector is not None else None,
            "error": str(self.runner.error) if self.runner.error is not None else None,
        }


# ---------------------------------------------------------------------------------- the server


class MetricsEndpoint:
    """`GET /metrics` (Prometheus text format) and `GET /healthz` on one port, served by the
    running event loop.

        endpoint = await MetricsEndpoint("127.0.0.1", 9464).start()
        endpoint.add(SchedulerPart(scheduler))
        ...
        await endpoint.close()
    """

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port  # 0: any free port; the bound one once started
        self.parts: list = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Parts(self))
        ProcessCollector(registry=self.registry)
        self._server: asyncio.base_events.Server | None = None
        self._lock = asyncio.Lock()

    def add(self, part) -> None:
        self.parts.append(part)

    async def start(self) -> MetricsEndpoint:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics endpoint", url=f"http://{self.host}:{self.port}/metrics")
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def render(self) -> bytes:
        async with self._lock:  # one scrape at a time: refresh, then collect
            for part in self.parts:
                await part.refresh()
            return generate_latest(self.registry)  # synchronous: nothing changes meanwhile

    def health(self) -> tuple[bool, dict[str, Any]]:
        components = {}
        healthy = bool(self.parts)  # nothing attached yet: not ready
        for part in self.parts:
            ok, document = part.health()
            healthy = healthy and ok
            if part.role in components:  # several partitions: a list, one per partition
                if not isinstance(components[part.role], list):
                    components[part.role] = [components[part.role]]
                components[part.role].append(document)
            else:
                components[part.role] = document
        return healthy, {"status": "ok" if healthy else "unavailable", **components}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
                method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                    asyncio.TimeoutError, TimeoutError, ConnectionError):  # fmt: skip
                return
            path = target.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, kind, body = 405, "text/plain; charset=utf-8", b"only GET\n"
            elif path == "/metrics":
                status, kind, body = 200, CONTENT_TYPE_LATEST, await self.render()
            elif path == "/healthz":
                healthy, document = self.health()
                status, kind = (200 if healthy else 503), "application/json"
                body = json.dumps(document).encode() + b"\n"
            else:
                status, kind, body = 404, "text/plain; charset=utf-8", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                      503: "Service Unavailable"}[status]  # fmt: skip
            response = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
            writer.write(response.encode())
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except ConnectionError:
            pass
        except Exception as error:  # a scrape never takes the service down
            log.warning("metrics request failed", error=repr(error))
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:
                pass


class _Parts:
    def __init__(self, endpoint: MetricsEndpoint):
        self.endpoint = endpoint

    def collect(self):
        """Every part's families, those of the same name merged into one (the partitions of
        one process report the same metrics, told apart by their `partition` label)."""
        merged: dict[str, Any] = {}
        for part in self.endpoint.parts:
            for family in part.families():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()


def _reason_and_outcome(payload: bytes) -> tuple[str, str]:
    match = _REASON_OUTCOME.search(payload)
    if match is not None:
        return match[1].decode(), match[2].decode()
    fact = json.loads(payload)  # another field order: slower, same answer
    return fact["reason"], fact["outcome"]


def _float_text(value: float) -> str:
    return repr(float(value))


__all__ = ["Histogram", "MetricsEndpoint", "ProjectorPart", "SchedulerPart", "WriterStats",
           "jobs_by_status", "share_figures", "state_families"]  # fmt: skip
