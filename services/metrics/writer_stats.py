"""What the scheduler's writer counts per batch and the state does not keep: facts stored by
kind, dispatches by reason, preemptions by reason and outcome, and how long deciding took.
Counted on the writer's event loop only, from the subjects of the stored facts (payloads are
read only for the rare `JobDispatched` and `JobPreempted` kinds)."""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import compress
from operator import itemgetter

from prometheus_client.core import CounterMetricFamily

from quotasched.services.metrics.histogram import Histogram

# Seconds.  Deciding a batch takes ~30-100 us per command, so 1 command to 1000 per batch.
DECIDE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5)  # fmt: skip

_SUBJECT = itemgetter(0)
# The encoder writes a JobPreempted's fields in their declared order: reason, then outcome.
_READ_KINDS = (".JobDispatched", ".JobPreempted")
_REASON_OUTCOME = re.compile(rb'"reason":"([A-Z_]+)","outcome":"([A-Z_]+)"')


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
        self.append_failures: Counter = Counter()  # cause (services.nats.bus) -> failed appends

    def append_failed(self, cause: str) -> None:
        """A batch did not land; `cause` is the diagnosis (fence, disk_full, command,
        unavailable)."""
        self.append_failures[cause] += 1

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
        failures = CounterMetricFamily(
            "quotasched_scheduler_append_failures",
            "Appends of a batch of facts that did not land, by diagnosed reason: fence (another "
            "writer), disk_full (the store is full or cannot write), command (the server "
            "refuses the messages themselves), unavailable (no answer, no stream leader).",
            labels=["reason"])  # fmt: skip
        for reason in ("fence", "disk_full", "command", "unavailable"):
            failures.add_metric([reason], self.append_failures.get(reason, 0))
        return [facts, dispatches, preemptions, decide, failures]


def _reason_and_outcome(payload: bytes) -> tuple[str, str]:
    match = _REASON_OUTCOME.search(payload)
    if match is not None:
        return match[1].decode(), match[2].decode()
    fact = json.loads(payload)  # another field order: slower, same answer
    return fact["reason"], fact["outcome"]
