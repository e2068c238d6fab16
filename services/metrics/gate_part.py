"""The metrics and health of an admission gate (services/gate): commands passed on and refused,
per job queue, quota share and the limit a refusal named."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class GatePart:
    """Metrics and health of one `AdmissionGate`."""

    role = "gate"

    def __init__(self, gate) -> None:
        self.gate = gate

    async def refresh(self) -> None:
        """Everything is counted as it happens: nothing to ask at scrape time."""

    def families(self) -> list:
        gate = self.gate
        admitted = CounterMetricFamily("quotasched_gate_commands_admitted",
                                       "Team job commands the gate passed on to the command "
                                       "stream.", labels=["job_queue", "quota_share"])  # fmt: skip
        for (queue, share), count in sorted(gate.admitted_by_share.items()):
            admitted.add_metric([queue, share], count)
        refused = CounterMetricFamily("quotasched_gate_commands_refused",
                                      "Commands the gate refused (never stored), by the limit "
                                      "they passed.", labels=["job_queue", "quota_share", "reason"])  # fmt: skip
        for (queue, share, reason), count in sorted(gate.refused_by.items()):
            refused.add_metric([queue, share, reason], count)
        return [admitted, refused,
                CounterMetricFamily("quotasched_gate_failures",
                                    "Commands the gate failed on (a bug), each refused.",
                                    value=gate.errors),
                CounterMetricFamily("quotasched_gate_frames_shed",
                                    "Answers and commands the gate dropped unsent: the server "
                                    "read from it slower than it delivered to it.",
                                    value=gate.shed),
                GaugeMetricFamily("quotasched_gate_shares_with_limits",
                                  "Shares whose admission options the gate has read from the "
                                  "fact log (the others have the defaults).",
                                  value=len(gate.gate.limits))]  # fmt: skip

    def health(self) -> tuple[bool, dict[str, Any]]:
        connected = bool(self.gate.nc.is_connected)
        return self.gate.open and connected, {
            "state": "open" if self.gate.open else "closed", "connected": connected,
            "admitted": self.gate.admitted, "refused": self.gate.refused}  # fmt: skip
