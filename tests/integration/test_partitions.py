"""A scheduling partition per job queue, against a real nats-server.

Two job queues, each with its own workload, published interleaved; scheduler processes run
with `--job-queue qa --job-queue qb`, so each leads or stands by for the fleet partition and
both queue partitions.  The facts under `qm.fact.<queue>.>` must be exactly what the decision
core gives over that partition's commands (the fleet-wide ones and the queue's own, in stream
order), the fleet's `qm.fact.~.>` likewise, every command decided once, across kills of the
leading process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from quotasched.services.nats.log import read_commands
from quotasched.services.scheduler.partition import Partition
from quotasched.services.scheduler.routing import decide_partition
from tests.integration.conftest import QUOTASCHED
from tests.integration.helpers import (
    G5,
    NO_TICKS,
    assert_alive,
    assert_decided_once,
    assert_same_facts,
    eventually,
    generate_workload,
    log_events,
    logged,
    publish_items,
    read_facts,
    wait_quiet,
)
from tests.integration.test_metrics import endpoint_of, health, key, scrape

pytestmark = pytest.mark.nats

QUEUES = ("qa", "qb")
PER_QUEUE = ("scheduler", "--job-queue", "qa", "--job-queue", "qb")


def workload(queue: str, seed: int, count: int):
    """generate_workload for one queue, its job ids and names made unique across queues."""
    items = []
    for command, route in generate_workload(seed, count, queue=queue):
        command = dict(command)
        for key in ("jobId", "jobName"):
            if key in command:
                command[key] = f"{queue}-{command[key]}"
        items.append((command, route))
    return items


def interleaved(count: int):
    """Both queues' set-ups, then their job commands merged by time (ties: qa first)."""
    a, b = workload("qa", 11, count), workload("qb", 12, count)
    setup_a = [i for i in a if i[0]["kind"].startswith("Create")]
    setup_b = [i for i in b if i[0]["kind"].startswith("Create")]
    jobs = sorted([i for i in a if i not in setup_a] + [i for i in b if i not in setup_b],
                  key=lambda item: item[0]["at"])  # fmt: skip
    # capacity events: fleet-wide commands that change what a queue's partition decides
    for position, environment, capacity in ((len(jobs) // 4, "qa-se", 8), (len(jobs) // 2, "qb-se", 7)):
        jobs.insert(position, ({
            "at": jobs[position][0]["at"], "kind": "UpdateServiceEnvironment",
            "serviceEnvironment": environment,
            "capacityLimits": [{"capacityUnit": G5, "maxCapacity": capacity}]}, None))  # fmt: skip
    return setup_a + setup_b + jobs


def partition_run(scope: Partition, commands) -> list[dict]:
    """What the core gives one partition over the recorded commands, as JSON objects."""
    return [json.loads(fact.model_dump_json(by_alias=True))
            for fact in decide_partition(scope, commands)]  # fmt: skip


async def assert_each_partition_matches_the_core(js, queues=QUEUES) -> dict[str, list[dict]]:
    commands = await read_commands(js)
    logs = {}
    for scope in (Partition.fleet(), *(Partition.for_queue(q) for q in queues)):
        recorded = await read_facts(js, scope.fact_filter)
        # each command's facts together, in command order, none twice (other partitions'
        # facts interleave in the stream, so the partition's own sequences have gaps)
        assert_decided_once([{k: v for k, v in f.items() if k != "_seq"} for f in recorded])
        assert_same_facts(recorded, partition_run(scope, commands), drop=(),
                          context=f"partition {scope.name}")  # fmt: skip
        logs[scope.name] = recorded
    return logs


async def wait_all_decided(js, items, seqs, timeout: float = 60.0) -> None:
    """Until each queue's last command (a submission: the workloads end with one) is decided."""
    last = {}
    for (command, _), seq in zip(items, seqs):
        if command.get("jobQueue") in QUEUES:
            last[command["jobQueue"]] = seq

    async def done():
        for queue in QUEUES:
            facts = await read_facts(js, f"qm.fact.{queue}.>")
            if not facts or facts[-1]["commandSeq"] < last[queue]:
                return False
        return True

    await eventually(done, timeout, what="both queues' last commands decided")


async def leaders(processes) -> dict[str, int]:
    """partition name -> index of the process that logged leading it last."""
    out = {}
    for index, process in enumerate(processes):
        for event in logged(process, "leading"):
            out[event["partition"]] = index
    return out


async def test_each_queue_is_decided_by_its_own_partition(spawn, nats_server):
    items = interleaved(300)
    first = spawn(*PER_QUEUE, "--metrics-port", "0", **NO_TICKS)
    second = spawn(*PER_QUEUE, "--metrics-port", "0", **NO_TICKS)
    async with Bus(nats_server.url) as bus:

        async def all_led():
            led = await leaders([first, second])
            return led if {"fleet", "queue-qa", "queue-qb"} <= set(led) else None

        await eventually(all_led, 25, what="a leader for every partition")
        seqs = await publish_items(bus, items)
        assert seqs == list(range(1, len(items) + 1))
        await wait_all_decided(bus.js, items, seqs)
        await wait_quiet(bus.js, 0.5)
        logs = await assert_each_partition_matches_the_core(bus.js)
        # the fleet wrote the configuration, each queue its own facts and nothing else
        assert {f["kind"] for f in logs["fleet"]} == {
            "ServiceEnvironmentCreated", "SchedulingPolicyCreated", "JobQueueCreated",
            "ServiceEnvironmentUpdated"}
        for queue in QUEUES:
            assert all(f["_subject"].startswith(f"qm.fact.{queue}.") for f in logs[f"queue-{queue}"])
            assert any(f["kind"] == "JobPreempted" for f in logs[f"queue-{queue}"])
        # reads: a queue's own partition answers, a job is found in whichever queue holds it
        job = await bus.request("describe-service-job", jobId="qb-job-00001")
        assert (job["jobQueue"], job["jobId"]) == ("qb", "qb-job-00001")
        snapshot = await bus.request("get-job-queue-snapshot", jobQueue="qa")
        assert snapshot["frontOfQueue"] is not None
        queues = await bus.request("describe-job-queues")
        assert sorted(q["jobQueueName"] for q in queues["jobQueues"]) == ["qa", "qb"]
        environments = await bus.request("describe-service-environments")
        assert len(environments["serviceEnvironments"]) == 2
        with pytest.raises(Exception, match="does not exist"):
            await bus.request("describe-service-job", jobId="nobody")
        assert_alive(first, second)

        # metrics: one endpoint per process, every partition's series labelled with it
        async def scraped_both():
            samples = {}
            for index, process in enumerate((first, second)):
                scraped = await scrape(await endpoint_of(process))
                for name in ("fleet", "queue-qa", "queue-qb"):  # leader or standby, each reports
                    assert key("quotasched_scheduler_leader", partition=name) in scraped
                samples.update({(metric, labels, index): value
                                for (metric, labels), value in scraped.items()})  # fmt: skip
            leading = sorted(dict(labels)["partition"] for (metric, labels, _), value
                             in samples.items() if metric == "quotasched_scheduler_leader" and value == 1)
            # each led by exactly one process (not caught in the middle of a hand-over)
            return samples if leading == ["fleet", "queue-qa", "queue-qb"] else None

        samples = await eventually(scraped_both, 20, what="every partition led once, in metrics")
        for queue in QUEUES:  # each queue's capacity reported once, by its own partition
            capacities = [labels for (metric, labels, _), _ in samples.items()
                          if metric == "quotasched_queue_capacity" and ("job_queue", queue) in labels]
            assert capacities == [tuple(sorted({"job_queue": queue, "capacity_unit": G5,
                                                "partition": f"queue-{queue}"}.items()))]
        status, document = await health(await endpoint_of(first))
        assert status == 200 and sorted(p["partition"] for p in document["scheduler"]) == [
            "fleet", "queue-qa", "queue-qb"]

        # the audit re-runs each partition over its own commands
        audit = await asyncio.to_thread(quotasched, nats_server.url, "audit", "verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        for name in ("fleet", "queue-qa", "queue-qb"):
            assert f"audit verify: OK: the decision core reproduces every recorded fact (bus: " \
                   f"{nats_server.url}, partition {name})" in audit.stdout
        report = json.loads((await asyncio.to_thread(
            quotasched, nats_server.url, "audit", "verify", "--output", "json")).stdout)
        assert report["ok"] and [p["partition"] for p in report["partitions"]] == [
            "fleet", "queue-qa", "queue-qb"]
        assert sum(p["facts"] for p in report["partitions"]) == sum(len(v) for v in logs.values())

        # a fact no partition decided, slipped into queue qb's log: its audit finds it
        first.stop(), second.stop()
        forged = {**logs["queue-qb"][-1]}
        forged["at"] += 1
        subject, forged = forged.pop("_subject"), {k: v for k, v in forged.items() if k != "_seq"}
        await bus.js.publish(subject, json.dumps(forged, separators=(",", ":")).encode(),
                             stream="QM_FACTS")  # fmt: skip
        audit = await asyncio.to_thread(quotasched, nats_server.url, "audit", "verify")
        assert audit.returncode == 1, audit.stdout + audit.stderr
        assert audit.stdout.count("audit verify: OK") == 2
        assert f"DIVERGENCE: the re-run disagrees with the log (bus: {nats_server.url}, " \
               "partition queue-qb)" in audit.stdout


def quotasched(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "QUOTASCHED_NATS_URL"}
    return subprocess.run([QUOTASCHED, *args, "--nats-url", url], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip


async def test_killed_leaders_partitions_are_taken_over_and_decided_once(spawn, nats_server):
    """SIGKILL the process leading every partition twice while commands flow; each time the
    standby takes all three over mid-stream and a new standby is started."""
    items = interleaved(1500)
    often = {**NO_TICKS, "QUOTASCHED_SNAPSHOT_EVERY": "200"}  # rebuilds start from snapshots
    processes = [spawn(*PER_QUEUE, **often)]
    async with Bus(nats_server.url) as bus:

        async def leads_all(index: int):
            led = await leaders(processes)
            return all(led.get(name) == index for name in ("fleet", "queue-qa", "queue-qb"))

        async def decided(count: int):
            facts = await read_facts(bus.js, "qm.fact.qa.>")
            return facts and facts[-1]["commandSeq"] >= count

        await eventually(lambda: leads_all(0), 25, what="the first process leading everything")

        async def pace(index: int) -> None:
            if index % 25 == 0:
                await asyncio.sleep(0.01)

        seqs: list[int] = []
        publishing = asyncio.create_task(publish_items(bus, items, pace=pace, published=seqs))
        for kill, at_command in enumerate((len(items) // 3, 2 * len(items) // 3)):
            processes.append(spawn(*PER_QUEUE, **often))  # the next standby
            await eventually(lambda: _logged_async(processes[-1], "state rebuilt"), 25,
                             what="a standby following the log")  # fmt: skip
            await eventually(lambda: decided(at_command), 60, what=f"command {at_command} decided")
            processes[kill].signal(signal.SIGKILL)
            try:  # a takeover is ~5 s here (lease TTL 3 s); a loaded CI machine is slower
                await eventually(lambda: leads_all(kill + 1), 60, what="the standby taking over")
            except AssertionError as failed:
                raise AssertionError(f"{failed}\n{lease_story(processes)}") from None
        await publishing
        await wait_all_decided(bus.js, items, seqs, timeout=90)
        await wait_quiet(bus.js, 0.5)
        await assert_each_partition_matches_the_core(bus.js)
        assert_alive(processes[-1])
        rebuilt = [e for p in processes for e in logged(p, "state rebuilt")]
        assert any(e["snapshot_seq"] > 0 for e in rebuilt if e["partition"] != "fleet")


async def test_partitions_spread_over_the_processes_that_run_them(spawn, nats_server):
    """The first process takes every lease; once a second one runs the same partitions, the
    first hands one over (landing what it has in flight) and the work goes on, decided once."""
    items = interleaved(200)
    processes = [spawn(*PER_QUEUE, **NO_TICKS)]

    async def counts():
        led = await leaders(processes)
        return sorted(list(led.values()).count(i) for i in range(len(processes)))

    async with Bus(nats_server.url) as bus:
        await eventually(lambda: _equals(counts(), [3]), 25, what="one process leading all")
        seqs = await publish_items(bus, items[: len(items) // 2])
        processes.append(spawn(*PER_QUEUE, **NO_TICKS))
        await eventually(lambda: _equals(counts(), [1, 2]), 40, what="the leases spread 2 + 1")
        handed = logged(processes[0], "handing over")
        assert len(handed) == 1, handed
        seqs += await publish_items(bus, items[len(items) // 2:])
        await wait_all_decided(bus.js, items, seqs)
        await wait_quiet(bus.js, 0.5)
        await assert_each_partition_matches_the_core(bus.js)
        await asyncio.sleep(4 * 3.0)  # two more lease TTLs: no further hand-over (no flapping)
        assert await counts() == [1, 2] and len(logged(processes[0], "handing over")) == 1
        assert_alive(*processes)


async def _equals(value, expected) -> bool:
    return await value == expected


async def test_every_queue_gets_a_partition_as_it_is_created(spawn, nats_server):
    """`--job-queue '*'`: partitions start for the queues the fleet configuration holds, also
    for a queue created while the process runs; a command published before its queue existed
    is refused in stream order, as a single partition would."""
    items = interleaved(150)
    processes = [spawn("scheduler", "--job-queue", "*", **NO_TICKS)]
    await eventually(lambda: _logged_async(processes[0], "leading"), 25, what="the fleet led")
    async with Bus(nats_server.url) as bus:
        early = await bus.publish(submit_to("qc", "early"))  # before queue qc exists
        seqs = await publish_items(bus, items)
        await wait_all_decided(bus.js, items, seqs)
        processes.append(spawn("scheduler", "--job-queue", "*", **NO_TICKS))  # a standby
        later = workload("qc", 13, 40)
        seqs = await publish_items(bus, later)
        await eventually(lambda: _decided(bus.js, "qc", seqs[-1]), 30, what="queue qc decided")
        await wait_quiet(bus.js, 0.5)
        logs = await assert_each_partition_matches_the_core(bus.js, ("qa", "qb", "qc"))
        refused = [f for f in logs["queue-qc"] if f["commandSeq"] == early]
        assert [(f["kind"], f["statusReason"]) for f in refused] == [
            ("CommandRejected", "Job queue qc does not exist")]
        discovered = {e["job_queue"] for p in processes for e in logged(p, "job queue discovered")}
        assert discovered == {"qa", "qb", "qc"}
        assert_alive(*processes)


def submit_to(queue: str, job_id: str) -> dict:
    return {"at": 0, "kind": "SubmitServiceJob", "jobQueue": queue, "quotaShareName": "alpha",
            "jobName": job_id, "jobId": job_id,
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


async def _decided(js, queue: str, seq: int) -> bool:
    facts = await read_facts(js, f"qm.fact.{queue}.>")
    return bool(facts) and facts[-1]["commandSeq"] >= seq


def lease_story(processes) -> str:
    """Each process's lease and rebuild events, for a takeover that did not happen."""
    told = ("leading", "stepped down", "stepped down after an error", "handing over",
            "state rebuilt", "could not follow the log", "recovered")  # fmt: skip
    lines = []
    for index, process in enumerate(processes):
        events = [e for e in log_events(process) if e.get("event") in told]
        lines += [f"process {index}:"] + [f"  {e}" for e in events[-20:]]
    return "\n".join(lines)


async def _logged_async(process, event: str):
    return logged(process, event)


async def test_a_scheduler_refuses_to_mix_partitioning_modes(spawn, nats_server):
    per_queue = spawn(*PER_QUEUE, **NO_TICKS)
    await eventually(lambda: _logged_async(per_queue, "leading"), 25, what="a per-queue leader")
    async with Bus(nats_server.url) as bus:
        # beside running per-queue schedulers: refused, naming their consumers
        single = spawn("scheduler", **NO_TICKS)
        code = await asyncio.to_thread(single.popen.wait, 30)
        assert code == 2, single.output()
        assert "consumers of schedulers partitioned the other way" in single.output()
        assert "scheduler-queue-qa" in single.output()
        assert_alive(per_queue)

        await publish_items(bus, workload("qa", 1, 1)[:3])  # the log begins, per queue
        await eventually(lambda: read_facts(bus.js, "qm.fact.~.>"), 20, what="fleet facts")

        # and on a log begun per queue, even with those schedulers and consumers gone
        assert per_queue.stop() == 0
        for consumer in ("scheduler-fleet", "scheduler-queue-qa", "scheduler-queue-qb"):
            await bus.js.delete_consumer(COMMANDS_STREAM, consumer)
        single = spawn("scheduler", **NO_TICKS)
        code = await asyncio.to_thread(single.popen.wait, 30)
        assert code == 2, single.output()
        assert "was begun by schedulers partitioned the other way" in single.output()
        assert "partition fleet" in single.output()
