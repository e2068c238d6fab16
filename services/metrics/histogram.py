"""The fixed-bucket histogram the scheduler's writer and the projector observe once per batch,
and its Prometheus family.  Observed on one thread, read on another: the counts and the sum
change together under a lock, and a read copies them."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client.core import HistogramMetricFamily


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


def _float_text(value: float) -> str:
    return repr(float(value))
