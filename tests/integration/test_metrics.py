"""GET /metrics and /healthz of real `quotasched scheduler` and `quotasched projector` processes
against a real nats-server, scraped over HTTP while commands are decided: the share gauges
equal the fold of the recorded facts, leadership moves with the lease, the projector reports
its position and lag, and health turns 503 when NATS is gone."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quotasched.events.codec import decode_fact
from quotasched.services.client import Bus
from quotasched.services.metrics import share_figures
from quotasched.services.scheduler.core import State, evolve
from quotasched.services.nats.log import ALL_FACTS, read_log
from tests.integration.helpers import (
    NO_TICKS,
    describe_process,
    eventually,
    logged,
    wait_decided,
)

pytestmark = pytest.mark.nats

G5 = "ml.g5.xlarge"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def scrape(base: str) -> dict[tuple[str, tuple], float]:
    status, text = await asyncio.to_thread(get, f"{base}/metrics")
    assert status == 200, text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples}  # fmt: skip


async def health(base: str) -> tuple[int, dict]:
    status, text = await asyncio.to_thread(get, f"{base}/healthz")
    return status, json.loads(text)


def key(name: str, **labels: str) -> tuple[str, tuple]:
    return name, tuple(sorted(labels.items()))


async def endpoint_of(process) -> str:
    """The base URL a process announced for its metrics endpoint (it binds port 0)."""

    async def announced():
        if process.popen.poll() is not None:
            raise AssertionError(describe_process(process))
        lines = logged(process, "metrics endpoint")
        return lines[-1]["url"].removesuffix("/metrics") if lines else None

    return await eventually(announced, 20.0, what="the metrics endpoint")


async def folded(js) -> tuple[State, int]:
    """The state the recorded facts say, and the last fact's sequence."""
    state, last = State(), 0
    async for seq, data, _ in read_log(js, ALL_FACTS):
        evolve(state, decode_fact(data))
        last = seq
    return state, last


def setup() -> list[tuple[dict, tuple[str, str] | None]]:
    limits = lambda n: [{"capacityUnit": G5, "maxCapacity": n}]  # noqa: E731
    share = lambda name, n, sharing: {  # noqa: E731
        "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": name,
        "capacityLimits": limits(n), "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}  # fmt: skip
    return [
        ({"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
          "capacityLimits": limits(4)}, None),
        ({"kind": "CreateSchedulingPolicy", "name": "sp",
          "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}, None),
        ({"kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
          "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]}, None),
        (share("bor", 1, {"strategy": "LEND_AND_BORROW", "borrowLimit": 200}), None),
        (share("len", 2, {"strategy": "LEND"}), None),
        (share("res", 1, {"strategy": "RESERVE"}), None),
    ]  # fmt: skip


def submit(job_id: str, share: str) -> tuple[dict, None]:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "q",
            "quotaShareName": share, "schedulingPriority": 1,
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}, None  # fmt: skip


async def publish(bus, items) -> int:
    seq = 0
    for command, route in items:
        seq = await bus.publish(command, route=route)
    return seq


async def assert_shares_match_the_log(base: str, js) -> dict:
    state, _ = await folded(js)
    got = await scrape(base)
    rows = share_figures(state)
    assert rows, "the log holds no quota share"
    for queue, share, unit, limit, usage, borrowed, lent in rows:
        labels = dict(job_queue=queue, quota_share=share, capacity_unit=unit)
        assert got[key("quotasched_share_limit", **labels)] == limit
        assert got[key("quotasched_share_usage", **labels)] == usage
        assert got[key("quotasched_share_borrowed", **labels)] == borrowed
        assert got[key("quotasched_share_lent", **labels)] == pytest.approx(lent)
    return got


async def test_scheduler_and_projector_metrics_and_health(spawn, nats_server, tmp_path):
    leader = spawn("scheduler", "--metrics-port", "0", **NO_TICKS)
    leader_url = await endpoint_of(leader)

    async def leading():
        return logged(leader, "leading")

    await eventually(leading, 20.0, what="the first scheduler leading")
    standby = spawn("scheduler", "--metrics-port", "0", **NO_TICKS)
    standby_url = await endpoint_of(standby)
    projector = spawn("projector", "--db", str(tmp_path / "p.duckdb"), "--metrics-port", "0")
    projector_url = await endpoint_of(projector)

    async with Bus(nats_server.url) as bus:
        # bor runs 2 on a limit of 1: it borrows len's idle instance (res never lends).
        seq = await publish(bus, [*setup(), submit("a", "bor"), submit("b", "bor")])
        await wait_decided(bus.js, seq, processes=[leader])

        async def decided_through(target):
            status, document = await health(leader_url)
            decided = document["scheduler"]["decidedThrough"]
            return (status, document) if decided is not None and decided >= target else None

        status, document = await eventually(lambda: decided_through(seq), 10.0, what="healthz")
        assert status == 200 and document["status"] == "ok"
        assert document["scheduler"]["state"] == "leader"
        got = await assert_shares_match_the_log(leader_url, bus.js)
        labels = dict(job_queue="q", capacity_unit=G5)
        assert got[key("quotasched_share_borrowed", quota_share="bor", **labels)] == 1
        assert got[key("quotasched_share_lent", quota_share="len", **labels)] == 1
        assert got[key("quotasched_share_lent", quota_share="res", **labels)] == 0
        assert got[key("quotasched_scheduler_leader", partition="main")] == 1
        term = got[key("quotasched_scheduler_term", partition="main")]
        assert term > 0
        assert got[key("quotasched_scheduler_decide_seconds_count")] >= 1

        # len takes its lent instance back: b is preempted (CROSS_SHARE_RECLAIM) and waits.
        seq = await publish(bus, [submit("c", "len"), submit("d", "len")])
        await wait_decided(bus.js, seq, processes=[leader])

        async def reclaimed():
            got = await scrape(leader_url)
            preempted = key("quotasched_scheduler_preemptions_total", job_queue="q",
                            quota_share="bor", reason="CROSS_SHARE_RECLAIM",
                            outcome="REQUEUED")  # fmt: skip
            return got if got.get(preempted) == 1 else None

        got = await eventually(reclaimed, 10.0, what="the preemption counted")
        jobs = lambda share, status: key("quotasched_share_jobs", job_queue="q",  # noqa: E731
                                         quota_share=share, status=status)  # fmt: skip
        assert got[jobs("bor", "RUNNABLE")] == 1 and got[jobs("bor", "SCHEDULED")] == 1
        assert got[jobs("len", "SCHEDULED")] == 2
        def dispatches(share: str) -> float:
            return sum(value for (name, labels), value in got.items()
                       if name == "quotasched_scheduler_dispatches_total"
                       and ("quota_share", share) in labels)  # fmt: skip

        assert (dispatches("bor"), dispatches("len")) == (2, 2)
        assert got[key("quotasched_scheduler_facts_total", kind="JobPreempted")] == 1
        pending = sum(value for (name, _), value in got.items()
                      if name == "quotasched_scheduler_commands_pending")  # fmt: skip
        assert pending == 0  # everything published was decided, stored and acked
        await assert_shares_match_the_log(leader_url, bus.js)

        # The standby: healthy, not leading, and no state of its own to report.
        status, document = await health(standby_url)
        assert status == 200 and document["scheduler"]["state"] == "standby"
        got = await scrape(standby_url)
        assert got[key("quotasched_scheduler_leader", partition="main")] == 0
        assert not any(name.startswith("quotasched_share_") for name, _ in got)

        # The projector catches up with the log.
        _, last_fact = await folded(bus.js)

        async def projected():
            got = await scrape(projector_url)
            return got if got.get(key("quotasched_projector_position")) == last_fact else None

        got = await eventually(projected, 20.0, what="the projector caught up")
        standby_fact_seq = key("quotasched_scheduler_fact_seq")

        async def followed():  # the standby folds the log as it grows
            return (await scrape(standby_url)).get(standby_fact_seq) == last_fact

        await eventually(followed, 20.0, what="the standby following the log")
        assert got[key("quotasched_projector_lag")] == 0
        assert got[key("quotasched_projector_stream_last_seq")] == last_fact
        assert got[key("quotasched_projector_facts_applied_total")] == last_fact
        assert got[key("quotasched_projector_apply_seconds_count")] >= 1
        status, document = await health(projector_url)
        assert status == 200 and document["projector"]["position"] == last_fact

    # The leader stops: the standby takes over, with a later term.
    assert leader.stop() == 0

    async def took_over():
        got = await scrape(standby_url)
        return got if got[key("quotasched_scheduler_leader", partition="main")] == 1 else None

    got = await eventually(took_over, 20.0, what="the standby leading")
    assert got[key("quotasched_scheduler_term", partition="main")] > term
    assert (await health(standby_url))[1]["scheduler"]["state"] == "leader"

    # Without NATS, both report 503 (and keep answering: they are waiting to reconnect).
    nats_server.stop()

    async def unavailable(url):
        status, document = await health(url)
        return document if status == 503 else None

    for url in (standby_url, projector_url):
        document = await eventually(lambda: unavailable(url), 10.0, what="503 without NATS")
        assert document["status"] == "unavailable"
