"""The metrics and health of one `Scheduler` partition: leadership, term, its writer's counts,
the positions it has reached, its consumer's pending commands, and (when leading) the gauges
of its state; labelled with its partition when several run in one process."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services import logs
from quotasched.services.metrics.endpoint import QUERY_TIMEOUT_S
from quotasched.services.metrics.state_gauges import jobs_by_status_yielding, state_families

log = logs.get("quotasched.metrics")


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
        health = getattr(scheduler, "health", None)
        full = GaugeMetricFamily(
            "quotasched_scheduler_storage_full",
            "1 while the fact log's store refuses this instance's appends for lack of space "
            "(disk full), else 0; back to 0 once an append lands.")  # fmt: skip
        full.add_metric([], 1 if health is not None and health.storage_full else 0)
        refused = CounterMetricFamily(
            "quotasched_scheduler_commands_refused_by_log",
            "Commands recorded as CommandRejected because the fact log refused their facts "
            "(too large for the bus, or refused by the server on every try).",
            value=len(health.log_refusals) if health is not None else 0)  # fmt: skip
        out = [leader, term, decided, appended, full, refused, *scheduler.stats.families()]
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
        health = getattr(scheduler, "health", None)
        full = health.storage_full if health is not None else None
        return connected and full is None, {
            "state": "leader" if leading else "standby",
            "connected": connected,
            "storage": "full" if full else "ok",
            "storageError": f"disk full: {full}" if full else None,
            "partition": scheduler.partition,
            "term": scheduler.term,
            "decidedThrough": recovered.decided_through if leading and recovered else None,
        }
