"""Retention of ended jobs (issue 29; docs/options.md, "Retention of ended jobs"), at the edges
its docs name: a retention of 0, more jobs due at once than one command forgets (1,000), a
forgotten id offered again, a digest set large enough to be merged, and the read index over
a state that forgets.  Expectations by hand from the docs."""

from __future__ import annotations

import json
import pickle

from quotasched.services.replay import replay_lines
from quotasched.services.scheduler import api
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.state import FORGOTTEN_MERGE_AT
from quotasched.services.scheduler.core.timers import earliest_due
from quotasched.services.scheduler.reads import COMPACT_ABOVE, ReadIndex

G5 = "ml.g5.xlarge"
SETUP = [
    {"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 4}]},
    {"at": 0, "kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"at": 0, "kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
    {"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 4}],
     "resourceSharingConfiguration": {"strategy": "RESERVE"},
     "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
]  # fmt: skip


def retention(seconds: int, at: float = 0) -> dict:
    return {"at": at, "kind": "SetJobQueueOptions", "jobQueue": "q",
            "options": {"endedJobRetentionSeconds": seconds}}  # fmt: skip


def submit(job_id: str, at: float) -> dict:
    return {"at": at, "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id,
            "jobQueue": "q", "quotaShareName": "qs1",
            "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


def succeed(job_id: str, at: float) -> dict:
    return {"at": at, "kind": "ReportJobStatus", "jobId": job_id, "status": "SUCCEEDED", "attempt": 1}


def tick(at: float) -> dict:
    return {"at": at, "kind": "Tick"}


def run(commands: list[dict], state: State | None = None) -> tuple[State, list[dict]]:
    state = state if state is not None else State()
    lines = [json.dumps(command) for command in commands]
    facts = [json.loads(fact.model_dump_json(by_alias=True)) for fact in replay_lines(lines, state)]
    return state, facts


def kinds(facts: list[dict], kind: str) -> list[dict]:
    return [fact for fact in facts if fact["kind"] == kind]


def test_a_retention_of_0_forgets_a_job_at_the_next_command_even_at_the_same_time():
    state, facts = run([*SETUP, retention(0), submit("a", 1), succeed("a", 5), tick(5)])
    expired = kinds(facts, "JobExpired")
    assert [(f["jobId"], f["at"], f["endedAt"], f["commandSeq"]) for f in expired] == [("a", 5.0, 5.0, 8)]
    assert "a" not in state.jobs and state.was_forgotten("a")


def test_the_default_retention_is_seven_days():
    state, facts = run([*SETUP, submit("a", 1), succeed("a", 10), tick(10 + 7 * 86400 - 1)])
    assert not kinds(facts, "JobExpired") and "a" in state.jobs
    assert earliest_due(state) == 10 + 7 * 86400
    state, facts = run([tick(10 + 7 * 86400)], state)
    assert [f["jobId"] for f in kinds(facts, "JobExpired")] == ["a"]


def test_one_command_forgets_at_most_1000_and_the_next_the_rest_in_the_order_they_ended():
    commands = [*SETUP, retention(60)]
    for index in range(1500):
        commands += [submit(f"j{index:04d}", 1 + index * 0.001), succeed(f"j{index:04d}", 1 + index * 0.001)]
    state, facts = run([*commands, tick(200)])
    first = kinds(facts, "JobExpired")
    assert [f["jobId"] for f in first] == [f"j{index:04d}" for index in range(1000)]
    assert earliest_due(state) is not None and earliest_due(state) <= 200  # the rest: due now
    state, facts = run([tick(201)], state)
    assert [f["jobId"] for f in kinds(facts, "JobExpired")] == [f"j{index:04d}" for index in range(1000, 1500)]
    assert not state.jobs and earliest_due(state) is None


def test_a_forgotten_id_is_refused_and_a_refused_command_forgets_nothing():
    state, facts = run([*SETUP, retention(10), submit("a", 1), succeed("a", 2),
                        {"at": 20, "kind": "UpdateServiceJob", "jobId": "nope", "schedulingPriority": 1},
                        submit("a", 21)])  # fmt: skip
    # the refused update at 20 leaves no trace: `a` is forgotten by the submission at 21,
    # before it is decided, and the submission is then refused for the forgotten id
    refused = kinds(facts, "CommandRejected")
    assert refused[0]["commandKind"] == "UpdateServiceJob"
    assert refused[1]["commandKind"] == "SubmitServiceJob" and "never used twice" in refused[1]["statusReason"]
    # a refused command's facts are undone with it: the JobExpired stays unrecorded
    assert kinds(facts, "JobExpired") == []
    state, facts = run([submit("b", 22)], state)  # an accepted command forgets it
    assert [f["jobId"] for f in kinds(facts, "JobExpired")] == ["a"]
    state, facts = run([submit("a", 23)], state)
    assert "never used twice" in kinds(facts, "CommandRejected")[0]["statusReason"]


def test_forgotten_ids_survive_a_merge_and_a_snapshot():
    commands = [*SETUP, retention(0)]
    count = FORGOTTEN_MERGE_AT + 100
    for index in range(count):
        commands += [submit(f"m{index}", 1 + index), succeed(f"m{index}", 1 + index)]
    state, facts = run([*commands, tick(count + 10)])
    assert len(kinds(facts, "JobExpired")) == count
    assert sum(map(len, state.forgotten_ids)) >= FORGOTTEN_MERGE_AT  # in the sorted arrays
    restored = pickle.loads(pickle.dumps(state))
    assert all(restored.was_forgotten(f"m{index}") for index in range(count))
    assert not restored.was_forgotten("m-new")


def test_forgotten_id_arrays_merge_by_like_sizes_and_an_undone_merge_restores_them():
    state = State()
    for index in range(5 * FORGOTTEN_MERGE_AT):
        state.forget_id(f"x{index}")
    sizes = [len(ids) for ids in state.forgotten_ids]
    assert sizes == [4 * FORGOTTEN_MERGE_AT, FORGOTTEN_MERGE_AT]  # 4 merged, the 5th alone
    assert all(list(ids) == sorted(ids) for ids in state.forgotten_ids)
    for index in range(FORGOTTEN_MERGE_AT - 1):
        state.forget_id(f"y{index}")
    with state.trial():  # the digest that completes a level, then the trial is undone
        state.forget_id("z")
        assert [len(ids) for ids in state.forgotten_ids] == [4 * FORGOTTEN_MERGE_AT, 2 * FORGOTTEN_MERGE_AT]
        assert state.was_forgotten("z") and state.was_forgotten("x0")
    assert [len(ids) for ids in state.forgotten_ids] == sizes
    assert not state.was_forgotten("z") and state.was_forgotten("y0") and state.was_forgotten("x0")


def test_the_read_index_skips_forgotten_jobs_and_compacts():
    commands = [*SETUP, retention(0)]
    total = COMPACT_ABOVE + 2000
    for index in range(total):
        commands += [submit(f"r{index}", 1 + index * 0.01), succeed(f"r{index}", 1 + index * 0.01)]
    commands.append(submit("live", total))
    state = State()
    run(commands[: len(SETUP) + 1 + 200], state)  # 100 jobs, all but the last forgotten
    reads = ReadIndex(state)
    reads.catch_up()
    run(commands[len(SETUP) + 1 + 200:], state)
    assert list(state.jobs) == ["live"]
    while reads.catch_up(500):
        pass
    listed = api.list_service_jobs(state, {"jobQueue": "q", "jobStatus": "ALL"}, reads)
    assert [job["jobId"] for job in listed["jobSummaryList"]] == list(reversed(list(state.jobs)))
    assert reads.entries <= len(state.jobs) + max(COMPACT_ABOVE, len(state.jobs)) + 500
