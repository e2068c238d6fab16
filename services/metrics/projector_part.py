"""The metrics and health of a projector running on its own thread: facts applied, batches,
position, lag behind the fact stream, and the apply time of a batch."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from quotasched.events.subjects import FACTS_STREAM
from quotasched.services import logs
from quotasched.services.metrics.endpoint import QUERY_TIMEOUT_S

log = logs.get("quotasched.metrics")

# Seconds.
APPLY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
