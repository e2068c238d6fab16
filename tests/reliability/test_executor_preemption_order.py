"""An executor starts a preemptor only once every job it preempts has stopped.

The scheduler frees a victim's capacity in its accounting the moment it preempts, and
dispatches the preemptor in the same decision (`JobDispatched.afterPreemptionOf`); on real
hardware the victims hold the instances until they have stopped (docs/executors.md).  The
executor (services/executors/base.py) handles the log's facts one at a time: on `JobPreempted`
it cancels the victim's attempt and awaits it (its `interrupt`: SIGTERM, then the process's
exit, for the process executor), and on the preemptor's `JobDispatched` it also waits for every
job in `afterPreemptionOf` before starting it.

Both built-in executors run here against a real nats-server and scheduler: two jobs hold both
instances of a share, a third of higher priority needing both preempts them inside the share.
Stopping takes a while in both runs (the victims checkpoint for STOP_S seconds), so an executor
that started the preemptor without waiting for its victims' stop would run it on instances the
victims still hold.  What each executor did is recorded in one ordered list of events: "start"
and "stop" of every attempt as the executor sees them, and (in-process) its reports.
`check_preemption_order` is the invariant checker over those events and the fact log:
- no two attempts hold the same instances at once: at every point of the events, the
  attempts started and not yet stopped fit the service environment's capacity;
- every preempted attempt that started also stopped, before its preemptor started (and before
  the preemptor's STARTING report, when the reports are recorded);
- in the command stream, no report about a preempted attempt comes after the command whose
  decision preempted it (a victim left running would report later).
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import pytest

from quotasched.events.subjects import COMMANDS_STREAM
from quotasched.services.client import Bus
from tests.executor_facts import dispatched, preempted, submitted
from tests.integration.helpers import eventually, publish_items, read_facts, setup_commands
from tests.integration.test_failover import wait_leading
from tests.reliability.support import read_stream

pytestmark = [pytest.mark.nats, pytest.mark.slow]

G5 = "ml.g5.xlarge"
CAPACITY = 2
STOP_S = 1.5  # how long a victim takes to stop (a checkpoint); well under the 10 s grace
VICTIMS = ("low1", "low2")

Event = tuple  # ("start" | "stop", job, attempt) or ("report", job, attempt, status)


def check_preemption_order(events: list[Event], facts: list[dict], commands: list[tuple]) -> None:
    """The invariants above; `commands`: (stream seq, command) of QM_COMMANDS."""
    capacity = sum(limit["maxCapacity"] for fact in facts
                   if fact["kind"] == "ServiceEnvironmentCreated"
                   for limit in fact["capacityLimits"])  # fmt: skip
    need = {(f["jobId"], f["attempt"]): sum(u["quantity"] for u in f["capacityUsage"])
            for f in facts if f["kind"] == "JobDispatched"}  # fmt: skip
    at = {event[:3]: index for index, event in reversed(list(enumerate(events)))
          if event[0] in ("start", "stop")}  # fmt: skip (the first index of each)
    holding: dict[tuple[str, int], int] = {}
    for index, event in enumerate(events):
        if event[0] == "start":
            key = (event[1], event[2])
            assert key not in holding, f"attempt {key} started twice"
            holding[key] = need[key]
            assert sum(holding.values()) <= capacity, (
                f"event {index} {event}: attempts {sorted(holding)} hold "
                f"{sum(holding.values())} instances of {capacity} at once")
        elif event[0] == "stop":
            holding.pop((event[1], event[2]), None)
    for fact in facts:
        if fact["kind"] != "JobPreempted":
            continue
        victim = (fact["jobId"], fact["attempt"])
        [preemptor] = [f for f in facts if f["kind"] == "JobDispatched"
                       and f["jobId"] == fact["preemptorJobId"]
                       and f["_seq"] > fact["_seq"]][:1]  # fmt: skip
        assert fact["jobId"] in preemptor["afterPreemptionOf"]
        started = ("start", preemptor["jobId"], preemptor["attempt"])
        if ("start", *victim) in at and started in at:
            assert ("stop", *victim) in at, f"preempted attempt {victim} never stopped"
            assert at[("stop", *victim)] < at[started], (
                f"{preemptor['jobId']} started (event {at[started]}) before its victim "
                f"{victim} stopped (event {at[('stop', *victim)]}): {events}")
        starting = [i for i, e in enumerate(events)
                    if e == ("report", preemptor["jobId"], preemptor["attempt"], "STARTING")]
        if starting and ("start", *victim) in at:
            assert at.get(("stop", *victim), len(events)) < starting[0], (
                f"{preemptor['jobId']} reported STARTING before {victim} stopped: {events}")
        late = [(seq, c) for seq, c in commands
                if c and c.get("kind") == "ReportJobStatus" and c.get("jobId") == victim[0]
                and c.get("attempt") == victim[1] and seq > fact["commandSeq"]]  # fmt: skip
        assert late == [], f"a report about the preempted attempt {victim} came after it: {late}"


def recorded_simulated(events: list[Event]) -> type:
    """The simulated executor with its steps appended to `events`: each attempt's start
    (`execute` begins) and stop (`execute` ends, or `interrupt` has finished), and every
    report it publishes; its `interrupt` takes STOP_S, as a real backend's stop does."""
    from quotasched.services.executors.simulated import SimulatedExecutor

    class Recorded(SimulatedExecutor):
        def __init__(self, publish, **options):
            async def recorded(subject: str, data: bytes) -> None:
                command = json.loads(data)
                events.append(("report", command["jobId"], command["attempt"], command["status"]))
                await publish(subject, data)

            super().__init__(recorded, **options)

        async def execute(self, attempt):
            events.append(("start", attempt.job_id, attempt.attempt))
            result = await super().execute(attempt)  # a cancellation skips the next line
            events.append(("stop", attempt.job_id, attempt.attempt))
            return result

        async def interrupt(self, attempt):
            await asyncio.sleep(STOP_S)
            events.append(("stop", attempt.job_id, attempt.attempt))

    return Recorded


async def _submit(bus: Bus, job_id: str, priority: int, quantity: int, tags: dict) -> None:
    await bus.publish({
        "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id, "jobQueue": "pq",
        "quotaShareName": "team", "schedulingPriority": priority, "tags": tags,
        "capacityUsage": [{"capacityUnit": G5, "quantity": quantity}],
    })  # fmt: skip


async def _facts_of(bus: Bus, kind: str) -> list[dict]:
    return [f for f in await read_facts(bus.js) if f["kind"] == kind]


async def _preemption_happened(bus: Bus) -> list[dict]:
    """The preemptor's dispatch, checked to name both victims (the scenario did happen)."""
    [dispatch] = await eventually(
        lambda: _dispatched_after_preemption(bus), 60, what="high's dispatch")
    assert sorted(dispatch["afterPreemptionOf"]) == sorted(VICTIMS)
    preempted = await _facts_of(bus, "JobPreempted")
    assert sorted((f["jobId"], f["attempt"], f["preemptorJobId"]) for f in preempted) == [
        ("low1", 1, "high"), ("low2", 1, "high")]
    return preempted


async def _dispatched_after_preemption(bus: Bus) -> list[dict] | None:
    found = [f for f in await _facts_of(bus, "JobDispatched") if f["jobId"] == "high"]
    return found or None


async def _setup(bus: Bus) -> None:
    await publish_items(bus, setup_commands("pq", shares=[("team", CAPACITY, "RESERVE", "ENABLED")],
                                            capacity=CAPACITY))  # fmt: skip


# -- the process executor: real processes, a shared file ----------------------------------------

JOB = textwrap.dedent("""
    import os, signal, sys, time
    path, stop_s = sys.argv[1], float(sys.argv[2])
    job, attempt = os.environ["QUOTASCHED_JOB_ID"], os.environ["QUOTASCHED_ATTEMPT"]

    def write(what):
        with open(path, "a") as log:  # O_APPEND: one whole line per write, in order
            log.write(f"{what} {job} {attempt} {time.monotonic_ns()}\\n")

    def stop(signum, frame):
        time.sleep(stop_s)  # checkpointing: the instances are still in use
        write("stop")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    write("start")
    while True:
        time.sleep(60)
""")


def _file_events(path) -> list[Event]:
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
    stamps = [int(line[3]) for line in lines]
    assert stamps == sorted(stamps), "the shared file's lines are out of time order"
    return [(what, job, int(attempt)) for what, job, attempt, _ in lines]


async def test_process_executor_starts_the_preemptor_after_its_victims_processes_exit(
        tmp_path, nats_server, spawn):  # fmt: skip
    script, log = tmp_path / "job.py", tmp_path / "events.log"
    script.write_text(JOB)
    tags = {"command": f"{sys.executable} {script} {log} {STOP_S}"}
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await _setup(bus)
        spawn("executor", "--kind", "process")
        for job_id in VICTIMS:
            await _submit(bus, job_id, priority=1, quantity=1, tags=tags)

        async def started(*jobs: str) -> bool:
            starts = {job for what, job, _ in _file_events(log) if what == "start"}
            return set(jobs) <= starts

        await eventually(lambda: started(*VICTIMS), 60, what="both victims' processes started")
        await _submit(bus, "high", priority=9, quantity=CAPACITY, tags=tags)
        await _preemption_happened(bus)
        await eventually(lambda: started("high"), 60, what="the preemptor's process started")
        events = _file_events(log)
        facts = await read_facts(bus.js)
        commands = await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>")
    assert [e for e in events if e[0] == "start"][-1] == ("start", "high", 1)
    check_preemption_order(events, facts, commands)


# -- the simulated executor: in-process, every step recorded ------------------------------------


async def test_simulated_executor_starts_the_preemptor_after_its_victims_stopped(
        nats_server, spawn, monkeypatch):  # fmt: skip
    """The simulated executor runs in this process (app.build_executor, a FastStream broker on
    the real server), with its steps recorded: each attempt's start (`execute` begins) and stop
    (`execute` ends, or `interrupt` has finished), and every report it publishes, in order.
    Its `interrupt` is given STOP_S of work, as a real backend's stop takes: the simulated one
    stops instantly, which would hide an executor that does not wait."""
    from faststream.nats import NatsBroker

    from quotasched.services.nats.credentials import broker_options
    from quotasched.services.executors import app as executor_app

    events: list[Event] = []
    Recorded = recorded_simulated(events)

    monkeypatch.setattr(executor_app, "SimulatedExecutor", Recorded)
    scheduler = spawn("scheduler")
    async with Bus(nats_server.url) as bus:
        await wait_leading(scheduler)
        await _setup(bus)
        broker = NatsBroker(nats_server.url, logger=None, **broker_options())
        executor = executor_app.build_executor(broker, "simulated", speed=1.0)
        assert isinstance(executor, Recorded)
        await broker.start()
        try:
            tags = {"duration": "600"}
            for job_id in VICTIMS:
                await _submit(bus, job_id, priority=1, quantity=1, tags=tags)

            async def reported(job_id: str, status: str) -> bool:
                return ("report", job_id, 1, status) in events

            for job_id in VICTIMS:
                await eventually(lambda: reported(job_id, "RUNNING"), 60, what=f"{job_id} runs")
            await _submit(bus, "high", priority=9, quantity=CAPACITY, tags=tags)
            await _preemption_happened(bus)
            await eventually(lambda: reported("high", "RUNNING"), 60, what="high runs")
            assert ("start", "high", 1) in await eventually(
                lambda: _ready(events, ("start", "high", 1)), 30, what="high's execute")
            recorded = list(events)
            facts = await read_facts(bus.js)
            commands = await read_stream(bus.js, COMMANDS_STREAM, "qm.cmd.>")
        finally:
            await executor.close()
            await broker.stop()
    check_preemption_order(recorded, facts, commands)
    # The executor's own view, step by step: both victims stop, then the preemptor reports
    # and starts.
    order = [e for e in recorded if e[1] == "high" or e[0] == "stop"]
    assert sorted(order[:2]) == [("stop", v, 1) for v in VICTIMS], recorded
    assert order[2:5] == [("report", "high", 1, "STARTING"), ("report", "high", 1, "RUNNING"),
                          ("start", "high", 1)], recorded  # fmt: skip


async def _ready(events: list[Event], wanted: Event) -> list[Event] | None:
    return list(events) if wanted in events else None


# -- the wait on afterPreemptionOf itself ----------------------------------------------------


async def test_a_dispatch_waits_for_a_victim_whose_stop_is_still_under_way():
    """The log is handled one fact at a time, so the `JobPreempted` handler has normally
    awaited the victim's stop before the preemptor's `JobDispatched` is read.  The dispatch's
    own wait on `afterPreemptionOf` is what holds when that stop is still under way as the
    dispatch is handled: here both facts are handed to the executor at once (no server)."""
    events: list[Event] = []

    async def publish(subject: str, data: bytes) -> None:
        pass

    executor = recorded_simulated(events)(publish, speed=1.0)
    tags = {"duration": "600"}
    facts = [
        submitted("low", tags, share="s", unit=G5),
        dispatched("low", share="s", unit=G5),
        submitted("high", tags, share="s", unit=G5),
        preempted("low", preemptor="high", share="s"),
        dispatched("high", share="s", unit=G5, after=["low"]),
    ]
    try:
        for fact in facts[:3]:
            await executor.on_fact(fact)
        await asyncio.wait_for(_until(lambda: ("start", "low", 1) in events), 30)
        await asyncio.wait_for(asyncio.gather(*(executor.on_fact(f) for f in facts[3:])), 30)
        await asyncio.wait_for(_until(lambda: ("start", "high", 1) in events), 30)
    finally:
        await executor.close()
    # The checker reads the log as read_facts gives it: JSON objects, "_seq" their position.
    environment = {"kind": "ServiceEnvironmentCreated",
                   "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}]}  # fmt: skip
    log = [environment, *(f.model_dump(by_alias=True, mode="json") for f in facts)]
    check_preemption_order(events, [{**fact, "_seq": seq} for seq, fact in enumerate(log, 1)], [])


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)
