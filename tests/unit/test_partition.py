"""Scheduling partitions, without a server: what each partition hears, what it writes, how a
fleet-wide command's facts are split, and how reads are scoped and redirected."""

from __future__ import annotations

import json

import pytest

from quotasched.events.codec import decode_command
from quotasched.events.subjects import parse_command_subject, subject_for_command
from quotasched.services.client.reads import merge as _merge
from quotasched.services.client.reads import queue_of as _queue_of
from quotasched.services.scheduler.api import answer_in
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.partition import Partition, partition_mode
from quotasched.services.scheduler.routing import decide_message, fact_subject_of

G5 = "ml.g5.xlarge"
SINGLE, FLEET, QA, QB = Partition.single(), Partition.fleet(), Partition.for_queue("qa"), Partition.for_queue("qb")


def setup(queue: str, capacity: int = 2) -> list[dict]:
    return [
        {"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": f"{queue}-se",
         "capacityLimits": [{"capacityUnit": G5, "maxCapacity": capacity}]},
        {"at": 0, "kind": "CreateSchedulingPolicy", "name": f"{queue}-sp",
         "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
        {"at": 0, "kind": "CreateJobQueue", "jobQueueName": queue, "schedulingPolicy": f"{queue}-sp",
         "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": f"{queue}-se"}]},
        {"at": 0, "kind": "CreateQuotaShare", "jobQueue": queue, "quotaShareName": "s",
         "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 2 * capacity}],
         "resourceSharingConfiguration": {"strategy": "RESERVE"},
         "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
    ]  # fmt: skip


def submit(queue: str, job_id: str, at: float = 1.0, quantity: int = 2) -> dict:
    return {"at": at, "kind": "SubmitServiceJob", "jobQueue": queue, "quotaShareName": "s",
            "jobName": job_id, "jobId": job_id,
            "capacityUsage": [{"capacityUnit": G5, "quantity": quantity}]}  # fmt: skip


def messages(commands: list[dict]) -> list[tuple[int, str, bytes]]:
    return [(seq, subject_for_command(decode_command(json.dumps(c))), json.dumps(c).encode())
            for seq, c in enumerate(commands, start=1)]  # fmt: skip


def run(scope: Partition, commands: list[dict]) -> tuple[State, list[tuple[str, str]]]:
    """(state, [(subject, kind)]) of what `scope` decides and writes."""
    state, written = State(), []
    for seq, subject, data in messages(commands):
        if not scope.hears(subject):
            continue
        route = parse_command_subject(subject)[:2]
        for fact in decide_message(state, subject, data, seq, 0.0):
            fact_subject = fact_subject_of(state, fact, route)
            if scope.owns(fact_subject):
                written.append((fact_subject, fact.kind))
    return state, written


def test_filters_fences_and_names():
    assert SINGLE.command_filters == ["qm.cmd.>"] and SINGLE.fact_filter == "qm.fact.>"
    assert FLEET.command_filters == ["qm.cmd.~.>"] and FLEET.fact_filter == "qm.fact.~.>"
    assert QA.command_filters == ["qm.cmd.qa.>", "qm.cmd.~.>"] and QA.fact_filter == "qm.fact.qa.>"
    assert (QA.durable, QA.tick_subject, FLEET.tick_subject) == (
        "scheduler-queue-qa", "qm.cmd.qa.~.Tick", None)
    assert [partition_mode(p.name) for p in (SINGLE, FLEET, QA)] == ["single", "per-queue", "per-queue"]
    assert QA.hears("qm.cmd.qa.s.SubmitServiceJob") and QA.hears("qm.cmd.~.~.Tick")
    assert not QA.hears("qm.cmd.qb.s.SubmitServiceJob") and not FLEET.hears("qm.cmd.qa.~.Tick")
    assert QA.owns("qm.fact.qa.s.JobDispatched") and not QA.owns("qm.fact.~.~.JobQueueCreated")


def test_every_fact_is_written_by_exactly_one_partition_and_each_queue_sees_the_fleet():
    commands = [*setup("qa"), *setup("qb"), submit("qa", "a1"), submit("qb", "b1"),
                submit("qa", "a2"),  # waits: qa's environment is full
                {"at": 2, "kind": "UpdateServiceEnvironment", "serviceEnvironment": "qa-se",
                 "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 4}]}]  # fmt: skip
    _, everything = run(SINGLE, commands)
    parts = {scope.name: run(scope, commands)[1] for scope in (FLEET, QA, QB)}
    assert sorted(everything) == sorted(sum(parts.values(), []))  # a partition of the log
    assert {kind for _, kind in parts["fleet"]} == {
        "ServiceEnvironmentCreated", "SchedulingPolicyCreated", "JobQueueCreated",
        "ServiceEnvironmentUpdated"}
    # the capacity event is fleet-wide, and the dispatch it causes is written by qa's partition
    assert parts["queue-qa"][-1] == ("qm.fact.qa.s.JobDispatched", "JobDispatched")
    assert all(subject.startswith("qm.fact.qb.") for subject, _ in parts["queue-qb"])
    state, _ = run(QA, commands)
    assert set(state.environments) == {"qa-se", "qb-se"} and set(state.jobs) == {"a1", "a2"}


def test_a_refusal_goes_under_the_subject_it_was_published_on():
    state = State()
    for seq, subject, data in messages(setup("qa")):
        decide_message(state, subject, data, seq, 0.0)
    # a submission into queue qa's share s, published on another share's subject
    data = json.dumps(submit("qa", "x")).encode()
    [fact] = decide_message(state, "qm.cmd.qa.t.SubmitServiceJob", data, 9, 0.0)
    assert fact.kind == "CommandRejected"
    assert fact_subject_of(state, fact, ("qa", "t")) == "qm.fact.qa.t.CommandRejected"
    # CreateJobQueue is fleet-wide now: the old per-queue subject is refused, naming the new one
    old = json.dumps({**setup("qz")[2], "jobQueueName": "qz"}).encode()
    [fact] = decide_message(state, "qm.cmd.qz.~.CreateJobQueue", old, 10, 0.0)
    assert "qm.cmd.~.~.CreateJobQueue" in fact.status_reason
    assert fact_subject_of(state, fact, ("qz", None)) == "qm.fact.qz.~.CommandRejected"


def test_a_queue_partition_ticks_on_its_own_subject():
    """On the bus the stream's timestamp is the time; the `at` a client wrote is ignored."""
    state, _ = run(QA, setup("qa"))
    facts = decide_message(state, "qm.cmd.qa.~.Tick", b'{"kind":"Tick","at":500}', 99, 5.0)
    assert facts == [] and state.time == 5


def test_reads_on_a_queue_subject_are_about_that_queue_only():
    state, _ = run(SINGLE, [*setup("qa"), *setup("qb"), submit("qa", "a1"), submit("qb", "b1")])
    assert answer_in(SINGLE, state, "describe-service-job", {"jobId": "b1"})["jobQueue"] == "qb"
    refused = answer_in(SINGLE, state, "describe-service-job", {"jobId": "b1"}, "qa")
    assert refused["error"]["message"] == "Job b1 does not exist"
    listed = answer_in(SINGLE, state, "list-service-jobs", {"jobStatus": "ALL"}, "qa")
    assert [job["jobId"] for job in listed["jobSummaryList"]] == ["a1"]
    other = answer_in(SINGLE, state, "list-service-jobs", {"jobQueue": "qb"}, "qa")
    assert "qm.api.qb.list-service-jobs" in other["error"]["message"]
    queues = answer_in(SINGLE, state, "describe-job-queues", {}, "qa")["jobQueues"]
    assert [q["jobQueueName"] for q in queues] == ["qa"]


def test_the_fleet_redirects_what_only_queues_know():
    state, _ = run(FLEET, [*setup("qa"), *setup("qb")])
    assert answer_in(FLEET, state, "describe-service-job", {"jobId": "a1"}) == {
        "redirect": ["qa", "qb"]}
    environments = answer_in(FLEET, state, "describe-service-environments", {})
    assert len(environments["serviceEnvironments"]) == 2


@pytest.mark.parametrize("value, queue", [
    ("qa", "qa"), ("arn:aws:batch:local:000000000000:job-queue/qa", "qa"),
    (None, None), ("", None), ("not a name!", None),
])  # fmt: skip
def test_the_client_routes_by_the_queue_a_request_names(value, queue):
    assert _queue_of(value) == queue


def test_the_client_merges_the_answers_of_several_queues():
    missing = {"error": {"type": "ClientException", "message": "Job j does not exist"}}
    assert _merge("describe-service-job", [missing, {"jobId": "j", "jobQueue": "qb"}]) == {
        "jobId": "j", "jobQueue": "qb"}
    assert _merge("describe-service-job", [missing, missing]) == missing
    merged = _merge("describe-job-queues", [{"jobQueues": [{"n": 1}]}, {"jobQueues": [{"n": 2}]}])
    assert merged == {"jobQueues": [{"n": 1}, {"n": 2}]}
    assert "error" in _merge("describe-job-queues", [])


def test_a_process_hands_over_only_to_even_out_by_two_and_not_too_often():
    from quotasched.services.scheduler.members import Member, Members

    members = Members(["fleet", "queue-qa", "queue-qb"], ttl_s=6.0)
    members.leading = {"fleet", "queue-qa", "queue-qb"}
    members.others = {"b": Member(["fleet", "queue-qa"], [])}
    assert not members.should_hand_over("queue-qb", now=100.0)  # b cannot lead qb
    assert members.should_hand_over("queue-qa", now=100.0)  # 3 against 0: hand qa to b
    assert not members.may_take("queue-qa", now=105.0) and members.may_take("queue-qa", now=113.0)
    members.leading.discard("queue-qa")
    members.others["b"].leading = ["queue-qa"]
    assert not members.should_hand_over("fleet", now=120.0)  # 2 against 1: even enough
    members.others["b"].leading = []
    assert not members.should_hand_over("fleet", now=105.0)  # one hand-over per two TTLs
    assert members.should_hand_over("fleet", now=113.0)
