"""Reusable parts of the integration tests: a deterministic workload, reading the fact log into
comparable lists, checks on command groups, and small async waits.

Everything here talks to a real nats-server through nats-py; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError
from nats.js.errors import NotFoundError

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM, LEASES_BUCKET
from quotasched.services.scheduler.core import State, step_raw
from quotasched.services.nats.log import ALL_FACTS, read_log, read_messages, sequence_and_time

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOTEBOOK = EXAMPLES / "notebook.jsonl"
LEASE_KEY = "scheduler.main"
G5 = "ml.g5.xlarge"

# Settings for scheduler processes that must not publish Ticks during a test: a Tick is a
# command too, so it would shift every later command sequence and make two runs differ.
NO_TICKS = {"QUOTASCHED_TICK_INTERVAL_S": "100000"}

Route = tuple[str, str] | None
Item = tuple[dict[str, Any], Route]


# -- the workload -----------------------------------------------------------------------------


def setup_commands(queue: str = "fq", shares: Iterable[tuple[str, int, str, str]] | None = None,
                   capacity: int = 6) -> list[Item]:  # fmt: skip
    """A service environment, a FIFO policy, a queue and its quota shares, all at `at` 0."""
    shares = list(shares or [
        ("alpha", 2, "LEND_AND_BORROW", "ENABLED"),
        ("beta", 2, "LEND", "DISABLED"),
        ("gamma", 1, "LEND_AND_BORROW", "ENABLED"),
        ("delta", 1, "RESERVE", "DISABLED"),
    ])  # fmt: skip
    items: list[Item] = [
        ({"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": f"{queue}-se",
          "capacityLimits": [{"capacityUnit": G5, "maxCapacity": capacity}]}, None),
        ({"at": 0, "kind": "CreateSchedulingPolicy", "name": f"{queue}-sp",
          "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}, None),
        ({"at": 0, "kind": "CreateJobQueue", "jobQueueName": queue,
          "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": f"{queue}-se"}],
          "schedulingPolicy": f"{queue}-sp"}, None),
    ]  # fmt: skip
    for name, limit, strategy, preemption in shares:
        sharing: dict[str, Any] = {"strategy": strategy}
        if strategy == "LEND_AND_BORROW":
            sharing["borrowLimit"] = 100
        items.append(({
            "at": 0, "kind": "CreateQuotaShare", "jobQueue": queue, "quotaShareName": name,
            "capacityLimits": [{"capacityUnit": G5, "maxCapacity": limit}],
            "resourceSharingConfiguration": sharing,
            "preemptionConfiguration": {"inSharePreemption": preemption},
        }, None))  # fmt: skip
    return items


class _Pool:
    """A set with O(1) add, remove and seeded random choice (insertion-order independent of
    hashing, so the same operations give the same choices)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def add(self, item: str) -> None:
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)

    def discard(self, item: str) -> None:
        position = self.index.pop(item, None)
        if position is None:
            return
        last = self.items.pop()
        if position < len(self.items):
            self.items[position] = last
            self.index[last] = position

    def choice(self, rng: random.Random) -> str:
        return self.items[rng.randrange(len(self.items))]

    def __len__(self) -> int:
        return len(self.items)


def generate_workload(seed: int, count: int, queue: str = "fq",
                      shares: Iterable[tuple[str, int, str, str]] | None = None) -> list[Item]:
    """`count` job commands after the set-up: submissions, priority updates, executor reports
    (STARTING / RUNNING / SUCCEEDED / FAILED for attempts that really are live) and a few
    terminations, across four shares.  Same seed, same list.

    The generator runs the real decision core over what it emits (with the stream sequences
    the commands will get on a fresh server), so reports target live attempts and lead to
    dispatches, preemptions and requeues.  Every command carries `at` (non-decreasing), so the
    facts do not depend on when the commands reach the stream.  The last command is always a
    submission: it is decided with at least one fact, which tells a test the run is complete.
    """
    rng = random.Random(seed)
    items = setup_commands(queue, shares)
    setup = len(items)
    shares = [command["quotaShareName"] for command, _ in items
              if command["kind"] == "CreateQuotaShare"]  # fmt: skip
    state = State()
    queued, live = _Pool(), _Pool()

    def run(command: dict[str, Any], seq: int) -> None:
        for fact in step_raw(state, json.dumps(command), seq):
            job_id = getattr(fact, "job_id", None)
            job = state.jobs.get(job_id) if job_id else None
            if job is None:
                continue
            queued.discard(job_id)
            live.discard(job_id)
            if job.status.value == "RUNNABLE":
                queued.add(job_id)
            elif job.status.value in ("SCHEDULED", "STARTING", "RUNNING"):
                live.add(job_id)

    for seq, (command, _) in enumerate(items, start=1):
        run(command, seq)
    at = 0.0
    submitted = 0
    while len(items) < setup + count:
        at += round(rng.expovariate(4.0), 3)
        last = len(items) == setup + count - 1
        roll = rng.random()
        if last or roll < 0.45 or not (live or queued):
            submitted += 1
            command: dict[str, Any] = {
                "at": at, "kind": "SubmitServiceJob", "jobId": f"job-{submitted:05d}",
                "jobName": f"train-{submitted:05d}", "jobQueue": queue,
                "quotaShareName": rng.choice(shares), "schedulingPriority": rng.randrange(0, 10),
                "capacityUsage": [{"capacityUnit": G5, "quantity": rng.choice((1, 1, 1, 2))}],
            }  # fmt: skip
            if rng.random() < 0.3:
                command["preemptionConfiguration"] = {
                    "preemptionRetriesBeforeTermination": rng.randrange(0, 3)}
            if rng.random() < 0.2:
                command["retryStrategy"] = {"attempts": rng.randrange(1, 4)}
            route: Route = None
        else:
            if roll < 0.60 or not live:
                pool = queued if (roll < 0.55 and queued) or not live else live
                job = state.jobs[pool.choice(rng)]
                command = {"at": at, "kind": "UpdateServiceJob", "jobId": job.job_id,
                           "schedulingPriority": rng.randrange(0, 10)}  # fmt: skip
            elif roll < 0.63:
                job = state.jobs[(queued if queued and rng.random() < 0.5 else live).choice(rng)]
                command = {"at": at, "kind": "TerminateServiceJob", "jobId": job.job_id,
                           "reason": "cancelled by the workload"}  # fmt: skip
            else:
                job = state.jobs[live.choice(rng)]
                status = {"SCHEDULED": "STARTING", "STARTING": "RUNNING"}.get(job.status.value)
                if status is None:
                    status = "FAILED" if rng.random() < 0.2 else "SUCCEEDED"
                command = {"at": at, "kind": "ReportJobStatus", "jobId": job.job_id,
                           "status": status, "attempt": job.attempt}  # fmt: skip
            route = (job.queue, job.share)
        items.append((command, route))
        run(command, len(items))
    return items


def offline_facts(items: list[Item], seqs: list[int] | None = None,
                  times: list[float] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The facts `quotasched replay` gives for `items` with command seqs 1, 2, ... (a fresh
    stream), or with the given stream sequences.  `times`: each command's stream timestamp,
    which is its time on the bus (ruling 15), replacing the `at` the item was published with."""
    state = State()
    out = []
    for index, (seq, (command, _)) in enumerate(zip(seqs or itertools.count(1), items)):
        if times is not None:
            command = {**command, "at": times[index]}
        out.extend(json.loads(fact.model_dump_json(by_alias=True))
                   for fact in step_raw(state, json.dumps(command), seq))  # fmt: skip
    return out


async def stream_times(js, seqs: Iterable[int]) -> list[float]:
    """The command stream's timestamp of each of `seqs`, in that order."""
    wanted = list(seqs)
    if not wanted:
        return []
    times: dict[int, float] = {}
    async for msg in read_messages(js, "qm.cmd.>", min(wanted), max(wanted),
                                   stream=COMMANDS_STREAM):  # fmt: skip
        seq, stamp = sequence_and_time(msg)
        times[seq] = stamp
    return [times[seq] for seq in wanted]


async def replayed_as_live(js, items: list[Item], seqs: list[int] | None = None) -> list[dict]:
    """`offline_facts` of `items` at the times the bus gave them (stored as `seqs`, or 1..n)."""
    seqs = seqs or list(range(1, len(items) + 1))
    return offline_facts(items, seqs, await stream_times(js, seqs))


async def publish_items(bus, items: list[Item],
                        pace: Callable[[int], Awaitable[None]] | None = None,
                        published: list[int] | None = None) -> list[int]:  # fmt: skip
    """Publish with `Bus.publish` (explicit routes, so no request to the scheduler is needed
    while it is down); returns the stream sequences.  `pace(i)` is awaited before item i."""
    seqs = published if published is not None else []
    for index, (command, route) in enumerate(items):
        if pace is not None:
            await pace(index)
        seqs.append(await bus.publish(command, route=route))
    return seqs


# -- reading the fact log ---------------------------------------------------------------------


async def read_facts(js, subject: str = ALL_FACTS) -> list[dict[str, Any]]:
    """Every fact of the log as a JSON object, in log order, with its stream `_seq` and
    `_subject` (removed again by `comparable`)."""
    facts = []
    async for seq, data, fact_subject in read_log(js, subject):
        fact = json.loads(data)
        fact["_seq"], fact["_subject"] = seq, fact_subject
        facts.append(fact)
    return facts


def comparable(facts: Iterable[dict[str, Any]], drop: Iterable[str] = ("at",)) -> list[dict]:
    """Facts without the given fields (and without the log positions read_facts adds)."""
    drop = {*drop, "_seq", "_subject"}
    return [{key: value for key, value in fact.items() if key not in drop} for fact in facts]


def command_groups(facts: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(commandSeq, number of facts) per maximal run of facts sharing a commandSeq."""
    groups: list[list[int]] = []
    for fact in facts:
        if groups and groups[-1][0] == fact["commandSeq"]:
            groups[-1][1] += 1
        else:
            groups.append([fact["commandSeq"], 1])
    return [(seq, n) for seq, n in groups]


def assert_decided_once(facts: list[dict[str, Any]]) -> None:
    """Every command that produced facts appears in exactly one contiguous group, groups in
    command order, log sequences without gaps, and no fact twice."""
    seqs = [seq for seq, _ in command_groups(facts)]
    repeated = sorted({seq for seq in seqs if seqs.count(seq) > 1})
    assert not repeated, f"commands decided more than once (non-contiguous groups): {repeated[:10]}"
    assert seqs == sorted(seqs), "commands decided out of stream order"
    log_seqs = [fact["_seq"] for fact in facts if "_seq" in fact]
    if log_seqs:
        assert log_seqs == list(range(log_seqs[0], log_seqs[0] + len(log_seqs))), "gap in the log"
    encoded = [json.dumps(fact, sort_keys=True) for fact in comparable(facts, drop=())]
    assert len(set(encoded)) == len(encoded), "the same fact appears twice in the log"


def assert_same_facts(actual: list[dict[str, Any]], expected: list[dict[str, Any]],
                      drop: Iterable[str] = ("at",), context: str = "") -> None:  # fmt: skip
    """`actual == expected` (both through `comparable`), with a short diagnosis instead of a
    diff of thousands of facts: commands missing or extra, and the first fact that differs."""
    left, right = comparable(actual, drop), comparable(expected, drop)
    if left == right:
        return
    got = {fact["commandSeq"] for fact in left}
    want = {fact["commandSeq"] for fact in right}
    missing, extra = sorted(want - got), sorted(got - want)
    first = next((i for i, (a, b) in enumerate(zip(left, right)) if a != b),
                 min(len(left), len(right)))  # fmt: skip
    raise AssertionError(
        f"{context} fact logs differ: {len(left)} facts vs {len(right)} expected; "
        f"{len(missing)} commands with facts expected but none recorded "
        f"(first {missing[:8]}, last {missing[-3:]}); "
        f"{len(extra)} unexpected commands {extra[:8]}; "
        f"first difference at index {first}: got {left[first] if first < len(left) else None} "
        f"expected {right[first] if first < len(right) else None}"
    )


async def last_fact(js) -> dict[str, Any] | None:
    try:
        message = await js.get_last_msg(FACTS_STREAM, ALL_FACTS)
    except NotFoundError:
        return None
    return json.loads(message.data)


async def command_kind(js, seq: int) -> str:
    message = await js.get_msg(COMMANDS_STREAM, seq)
    try:
        return json.loads(message.data).get("kind")
    except ValueError:
        return "?"


# -- waiting ----------------------------------------------------------------------------------


async def eventually(condition: Callable[[], Awaitable[Any]], timeout: float = 20.0,
                     interval: float = 0.1, what: str = "condition") -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await condition()
        except (asyncio.TimeoutError, TimeoutError, OSError, NoRespondersError):
            value = None  # e.g. no scheduler answers requests while none leads
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(interval)


async def wait_decided(js, command_seq: int, timeout: float = 30.0,
                       processes: Iterable[Any] = ()) -> dict[str, Any]:  # fmt: skip
    """Until the log's last fact belongs to command `command_seq` or a later one.  On a
    timeout, the message says which of `processes` died and how their logs end."""

    processes = list(processes)

    async def done():
        if processes and all(process.popen.poll() is not None for process in processes):
            raise AssertionError("every scheduler process exited")
        fact = await last_fact(js)
        return fact if fact is not None and fact["commandSeq"] >= command_seq else None

    try:
        return await eventually(done, timeout, what=f"a fact for command {command_seq}")
    except AssertionError as error:
        last = await last_fact(js)
        raise AssertionError(
            f"{error}; last fact is for command {last and last['commandSeq']}; "
            + "; ".join(describe_process(process) for process in processes)
        ) from None


def describe_process(process) -> str:
    code = process.popen.poll()
    state = "running" if code is None else f"exited with {code}"
    tail = " | ".join(line[:300] for line in process.output().splitlines()[-4:])
    return f"{process.args} {state}, log ends: {tail}"


def assert_alive(*processes) -> None:
    dead = [describe_process(process) for process in processes if process.popen.poll() is not None]
    assert not dead, "scheduler process died: " + "; ".join(dead)


async def wait_quiet(js, seconds: float = 1.0, timeout: float = 20.0) -> int:
    """Until the fact log did not grow for `seconds`; returns its last sequence."""
    deadline = time.monotonic() + timeout
    last = (await js.stream_info(FACTS_STREAM)).state.last_seq
    since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = (await js.stream_info(FACTS_STREAM)).state.last_seq
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return last
    raise AssertionError("the fact log kept growing")


# -- leadership -------------------------------------------------------------------------------


async def lease_holder(js) -> str | None:
    try:
        kv = await js.key_value(LEASES_BUCKET)
        entry = await kv.get(LEASE_KEY)
    except NotFoundError:  # no bucket yet, no key, or a delete marker (KeyDeletedError)
        return None
    return entry.value.decode() if entry.value else None


def log_events(process) -> list[dict[str, Any]]:
    """The JSON log lines (structlog) a spawned process wrote so far."""
    events = []
    for line in process.output().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return events


def holder_of(process) -> str | None:
    """The lease holder name a process announced in its last "leading" log line."""
    holders = [event.get("holder") for event in logged(process, "leading")]
    return holders[-1] if holders else None


def logged(process, event: str) -> list[dict[str, Any]]:
    return [line for line in log_events(process) if line.get("event") == event]


async def api_ready(bus, timeout: float = 20.0) -> None:
    """Until a scheduler answers read requests (it subscribes to the API once it has recovered
    its state and bound its command consumer, a little after it logs "leading")."""

    async def answered():
        return await bus.request("describe-job-queues", timeout=1.0)

    await eventually(answered, timeout, what="a scheduler answering requests")


async def wait_gate_open(process, timeout: float = 25.0) -> None:
    """Until a spawned `quotasched gate` says it is open (its limits read, its queue group
    joined): a team's commands go through it (services/gate)."""

    async def opened():
        return '"gate open"' in process.output() or "gate open" in process.output()

    await eventually(opened, timeout, what=f"{process.args} open")
