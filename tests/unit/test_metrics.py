"""The metrics computed from a scheduler's state and from the facts its writer appends, against
states built by the real core (tests/builders.py) and checked with independent counts."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quotasched.events import facts as F
from quotasched.events.codec import encode_bytes
from quotasched.events.subjects import fact_subject
from quotasched.events.values import JobStatus
from quotasched.services.metrics import (
    Histogram,
    MetricsEndpoint,
    _REASON_OUTCOME,
    WriterStats,
    jobs_by_status,
    jobs_by_status_yielding,
    share_figures,
    state_families,
)
from tests.builders import G5, Cluster, of_kind
from tests.integration.helpers import NOTEBOOK


def figures(cluster: Cluster) -> dict[tuple[str, str], tuple[int, int, int, float]]:
    """(share, unit) -> (limit, usage, borrowed, lent)."""
    return {(share, unit): tuple(values)
            for _, share, unit, *values in share_figures(cluster.state)}  # fmt: skip


def lending_cluster() -> Cluster:
    """Two lenders with different idle quota, a RESERVE share and an unlimited borrower."""
    c = Cluster()
    c.environment(g5=8)
    c.queue()
    c.share("bor", "LEND_AND_BORROW", borrow=-1, g5=1)
    c.share("l2", "LEND", g5=2)
    c.share("l4", "LEND", g5=4)
    c.share("res", "RESERVE", g5=1)
    return c


def test_borrowed_and_lent_are_attributed_pro_rata_to_idle_quota():
    c = lending_cluster()
    c.submit("a", "bor", n=3)  # 2 beyond its limit of 1; idle lendable quota 2 + 4 = 6
    assert c.status("a") == "SCHEDULED"
    got = figures(c)
    assert got[("bor", G5)] == (1, 3, 2, 0.0)
    assert got[("l2", G5)] == (2, 0, 0, 2 * 2 / 6)
    assert got[("l4", G5)] == (4, 0, 0, 4 * 2 / 6)
    assert got[("res", G5)] == (1, 0, 0, 0.0)  # RESERVE never lends, idle or not
    c.submit("b", "l4", n=3)  # l4 uses 3 of its 4: idle quota now 2 + 1 = 3 for 2 borrowed
    got = figures(c)
    assert got[("l2", G5)][3] == 2 * 2 / 3
    assert got[("l4", G5)][1:] == (3, 0, 1 * 2 / 3)


def test_lent_adds_up_to_what_is_borrowed_at_every_step():
    c = Cluster.notebook()
    for line in NOTEBOOK.read_text().splitlines()[6:]:
        c.send(line)
        totals: Counter = Counter()
        for _, _, unit, _, _, borrowed, lent in share_figures(c.state):
            totals[(unit, "borrowed")] += borrowed
            totals[(unit, "lent")] += lent
        queue = c.state.queues["q"]
        assert totals[(G5, "borrowed")] == queue.borrowed.get(G5, 0)
        assert abs(totals[(G5, "lent")] - min(queue.borrowed[G5], queue.idle[G5])) < 1e-9


def brute_force_jobs(cluster: Cluster) -> dict[tuple[str, str], Counter]:
    counts: dict[tuple[str, str], Counter] = {}
    for job in cluster.state.jobs.values():
        if job.status in (JobStatus.RUNNABLE, *(s for s in JobStatus if s.dispatched)):
            counts.setdefault((job.queue, job.share), Counter())[job.status] += 1
    return counts


def test_jobs_by_status_matches_a_scan_of_every_job_despite_stale_heap_entries():
    c = lending_cluster()
    for index in range(6):
        c.submit(f"r{index}", "res", priority=index)  # one dispatched, five waiting
    for index in range(4):
        c.prioritize(f"r{index}", 50 + index)  # leaves stale entries in the share's heap
    c.report("r0", "STARTING", attempt=1)
    c.report("r0", "RUNNING", attempt=1)
    c.finish("r0")  # r3, now the highest priority, is dispatched
    c.submit("x", "l2", n=2)
    assert len(c.state.queues["q"].shares["res"].heap) > 5  # stale entries are really there
    got = jobs_by_status(c.state)
    expected = brute_force_jobs(c)
    for share in set(got) | set(expected):
        counted = got.get(share)
        statuses = counted.statuses if counted is not None else Counter()
        assert +statuses == expected.get(share, Counter()), share
        waiting = sum(counted.reasons.values()) if counted is not None else 0
        assert waiting == expected.get(share, Counter())[JobStatus.RUNNABLE], share  # by reason
    assert asyncio.run(jobs_by_status_yielding(c.state, chunk=2)) == got  # in small slices
    assert got[("q", "res")].statuses[JobStatus.RUNNABLE] == 4
    assert got[("q", "res")].statuses[JobStatus.SCHEDULED] == 1
    assert got[("q", "bor")].statuses[JobStatus.RUNNABLE] == 0


def appended(facts: list[F.Fact]) -> list[tuple[str, bytes, dict[str, str]]]:
    """The (subject, payload, headers) the writer appends for these facts."""
    return [(fact_subject(fact.kind, getattr(fact, "job_queue", None),
                          getattr(fact, "quota_share_name", None)), encode_bytes(fact), {})
            for fact in facts]  # fmt: skip


def samples(families) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):
            return families

    registry.register(Fixed())
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):  # also proves the text parses
        for sample in family.samples:
            out[key(sample.name, **sample.labels)] = sample.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple]:
    return name, tuple(sorted(labels.items()))


def test_writer_counts_dispatches_and_preemptions_by_reason_from_the_appended_facts():
    c = Cluster.notebook()
    stats = WriterStats()
    for line in NOTEBOOK.read_text().splitlines()[6:]:
        stats.landed(appended(c.send(line)))  # one batch per command
    got = samples(stats.families())
    preempted = of_kind(c.facts, F.JobPreempted)
    assert {p.reason.value for p in preempted} == {"CROSS_SHARE_RECLAIM", "IN_SHARE_PRIORITY"}
    for fact in preempted:
        sample = key("quotasched_scheduler_preemptions_total", job_queue="q",
                     quota_share=fact.quota_share_name, reason=fact.reason.value,
                     outcome=fact.outcome.value)  # fmt: skip
        assert got[sample] == sum(1 for p in preempted if (p.quota_share_name, p.reason)
                               == (fact.quota_share_name, fact.reason))  # fmt: skip
    def reason(fact: F.JobDispatched) -> str:
        if fact.after_preemption_of:
            return "preemption"
        return "borrowed" if fact.borrowed else "own_quota"

    dispatched = Counter((fact.quota_share_name, reason(fact))
                         for fact in of_kind(c.facts, F.JobDispatched))  # fmt: skip
    assert {share for share, _ in dispatched} == {"qs1", "qs2"}
    assert {why for _, why in dispatched} == {"own_quota", "borrowed", "preemption"}
    for (share, why), count in dispatched.items():
        name = "quotasched_scheduler_dispatches_total"
        assert got[key(name, job_queue="q", quota_share=share, reason=why)] == count
    assert sum(value for (name, _), value in got.items()
               if name == "quotasched_scheduler_dispatches_total") == sum(dispatched.values())
    kinds = Counter(fact.kind for fact in c.facts[6:])
    for kind, count in kinds.items():
        assert got[key("quotasched_scheduler_facts_total", kind=kind)] == count


def test_preemption_reason_and_outcome_are_read_without_decoding_the_payload():
    c = Cluster.notebook()
    for line in NOTEBOOK.read_text().splitlines()[6:]:
        c.send(line)
    for fact in of_kind(c.facts, F.JobPreempted):  # the fast path matches the encoder's layout
        match = _REASON_OUTCOME.search(encode_bytes(fact))
        assert match is not None
        assert (match[1].decode(), match[2].decode()) == (fact.reason.value, fact.outcome.value)


def test_state_gauges_in_the_text_format():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)  # borrows qs2's idle instance
    c.submit("low", "qs1", priority=1)  # waits: nothing left to borrow
    got = samples(state_families(c.state))

    def share(name: str, share: str) -> float:
        return got[key(name, job_queue="q", quota_share=share, capacity_unit=G5)]

    assert share("quotasched_share_usage", "qs1") == 2
    assert share("quotasched_share_limit", "qs1") == 1
    assert share("quotasched_share_borrowed", "qs1") == 1
    assert share("quotasched_share_lent", "qs2") == 1
    assert share("quotasched_share_lent", "qs3") == 0
    jobs = "quotasched_share_jobs"
    assert got[key(jobs, job_queue="q", quota_share="qs1", status="RUNNABLE")] == 1
    assert got[key(jobs, job_queue="q", quota_share="qs1", status="SCHEDULED")] == 2
    assert got[key("quotasched_queue_capacity", job_queue="q", capacity_unit=G5)] == 3
    assert got[key("quotasched_share_info", job_queue="q", quota_share="qs3", state="ENABLED",
                   strategy="RESERVE")] == 1  # fmt: skip
    # by hand: low would borrow, qs2's idle instance is lent to med and qs3 is RESERVE
    waiting = "quotasched_jobs_waiting"
    assert got[key(waiting, job_queue="q", quota_share="qs1", reason="no_idle_lendable")] == 1
    assert [k for k in got if k[0] == waiting] == [key(waiting, job_queue="q", quota_share="qs1",
                                                       reason="no_idle_lendable")]  # fmt: skip


def test_waiting_jobs_are_counted_by_the_reason_they_wait():
    c = Cluster.notebook()
    c.submit("high", "qs1", priority=3)
    c.submit("med", "qs1", priority=2)
    c.submit("low", "qs1", priority=1)  # the head: nothing left to borrow
    c.submit("lower", "qs1", priority=0)  # behind low, of a higher priority
    c.submit("later", "qs1", priority=1)  # behind low, of its priority, submitted after it
    c.submit("also-later", "qs1", priority=1)
    c.send(json.dumps({"at": 9, "kind": "UpdateServiceEnvironment", "serviceEnvironment": "se",
                       "state": "DISABLED"}))  # fmt: skip
    got = samples(state_families(c.state))
    reasons = {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "quotasched_jobs_waiting"}
    assert reasons == {"environment_disabled": 4}
    c.send(json.dumps({"at": 10, "kind": "UpdateServiceEnvironment", "serviceEnvironment": "se",
                       "state": "ENABLED"}))  # fmt: skip
    got = samples(state_families(c.state))
    reasons = {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "quotasched_jobs_waiting"}
    assert reasons == {"no_idle_lendable": 1, "behind_higher_priority": 1, "behind_earlier": 2}
    assert sum(reasons.values()) == got[key("quotasched_share_jobs", job_queue="q",
                                            quota_share="qs1", status="RUNNABLE")]  # fmt: skip


def test_histogram_buckets_are_cumulative_with_le_semantics():
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 3.0):
        histogram.observe(value)
    got = samples([histogram.family("h_seconds", "test")])
    buckets = [got[key("h_seconds_bucket", le=le)] for le in ("0.1", "1.0", "+Inf")]
    assert buckets == [2, 4, 5]
    assert got[key("h_seconds_count")] == 5
    assert abs(got[key("h_seconds_sum")] - 4.65) < 1e-9


async def http(port: int, request: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_endpoint_answers_http_and_is_unhealthy_with_nothing_attached():
    endpoint = await MetricsEndpoint("127.0.0.1", 0).start()
    try:
        status, body = await http(endpoint.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, json.loads(body)) == (503, {"status": "unavailable"})
        status, body = await http(endpoint.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and b"process_cpu_seconds_total" in body
        assert (await http(endpoint.port, b"GET /nope HTTP/1.1\r\n\r\n"))[0] == 404
        assert (await http(endpoint.port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0] == 405
    finally:
        await endpoint.close()
