"""Rulings 14-16 of the behaviour spec (section 0), with the bounds they rest on.

14: a job-state time limit counts time at the head only;
15: a refused command changes nothing, time included (on the bus the stream's timestamp is the
    time, see tests/integration/test_hostile_input.py for the live side);
16: every fact fits the bus: every field is bounded, a large message has its facts measured,
    and one preemption takes at most MAX_VICTIMS jobs.

Expected values are worked out by hand from the spec.
"""

from __future__ import annotations

import json

import pytest

from quotasched.events import facts as F
from quotasched.events.base import MAX_INSTANCES, MAX_TIME_S
from quotasched.events.codec import DecodeError, decode_command, encode_bytes
from quotasched.services.scheduler.core import State, catch_up_clock, fold, step_raw
from quotasched.services.scheduler.core.decision import FACT_BYTES_LIMIT, oversize
from quotasched.services.scheduler.core.preemption import MAX_VICTIMS
from quotasched.services.scheduler.routing import decide_message
from tests.builders import G5, Cluster, changes_of, dispatch_of, dispatched_ids, of_kind

QUOTA_LIMIT = "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"


def time_limited_share(seconds: int = 600) -> Cluster:
    """SE of 4 g5; queue q with a `seconds` limit on QUOTA_MANAGEMENT_LIMIT_EXCEEDED; share
    `a` RESERVE 2 g5, already full with `run` (priority 9, 2 g5)."""
    c = Cluster()
    c.environment(g5=4)
    c.queue(jobStateTimeLimitActions=[{"reason": QUOTA_LIMIT, "state": "RUNNABLE",
                                       "maxTimeSeconds": seconds, "action": "TERMINATE"}])
    c.share("a", "RESERVE", g5=2)
    c.share("b", "RESERVE", g5=2)
    assert dispatched_ids(c.submit("run", "a", priority=9, n=2)) == ["run"]
    return c


def time_limit_failures(facts: list[F.Fact]) -> list[tuple[str, float]]:
    return [(f.job_id, f.at) for f in of_kind(facts, F.JobStatusChanged)
            if f.cause.value == "TIME_LIMIT"]  # fmt: skip


# -- ruling 14: a time limit counts time at the head only -------------------------------------


def test_ruling14_a_head_pushed_back_after_200_s_restarts_its_600_s_clock_when_it_heads_again():
    c = time_limited_share()
    c.at = 0.0
    blocked = c.submit("big", "a", n=3)  # needs 3, share limit 2, RESERVE: blocked at once
    assert [f.reason.value for f in of_kind(blocked, F.ShareBlocked)] == [QUOTA_LIMIT]
    c.at = 200.0
    c.submit("urgent", "a", priority=5)  # goes ahead of big and waits for run's instances
    assert c.status("urgent") == "RUNNABLE"
    # 600 s after big first waited it is not the head: its clock stopped at 200 s.
    assert time_limit_failures(c.tick(600.0)) == []
    c.at = 700.0
    facts = c.finish("run")  # urgent dispatches; big heads its share again, from t=700
    assert dispatched_ids(facts) == ["urgent"]
    assert time_limit_failures(facts) == []  # the old count (from t=0) failed big here
    assert time_limit_failures(c.tick(1299.0)) == []
    assert time_limit_failures(c.tick(1300.0)) == [("big", 1300.0)]


def test_ruling14_a_head_that_never_leaves_the_head_is_failed_at_its_limit():
    c = time_limited_share()
    c.submit("big", "a", n=3)
    assert time_limit_failures(c.tick(599.0)) == []
    assert time_limit_failures(c.tick(601.0)) == [("big", 600.0)]  # stamped at its deadline


def test_ruling14_a_priority_drop_stops_the_clock_and_the_new_head_starts_its_own():
    c = time_limited_share()
    c.submit("big", "a", n=3, priority=5)
    c.at = 100.0
    c.submit("huge", "a", n=4, priority=1)  # also over the limit, queued behind big
    c.at = 300.0
    c.prioritize("big", 0)  # huge heads now: its clock starts at 300, big's stops
    facts = c.tick(900.0)
    assert time_limit_failures(facts) == [("huge", 900.0)]
    # big heads again from the moment huge left (t=900): its limit runs out at 1500
    assert time_limit_failures(c.tick(1499.0)) == []
    assert time_limit_failures(c.tick(1500.0)) == [("big", 1500.0)]


def test_ruling14_the_fold_of_the_facts_keeps_the_same_clocks_as_the_live_state():
    c = time_limited_share()
    c.submit("big", "a", n=3)
    c.at = 200.0
    c.submit("urgent", "a", priority=5)
    folded = fold(c.facts)
    for job_id in ("big", "urgent"):
        assert folded.jobs[job_id].reason_since == c.state.jobs[job_id].reason_since
    assert c.state.jobs["big"].reason_since is None  # not the head: its clock is stopped


# -- ruling 15: a refused command changes nothing, time included ------------------------------


NOTEBOOK_SETUP = [
    '{"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3}]}',
    '{"at": 0, "kind": "CreateSchedulingPolicy", "name": "sp", "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}}',
    '{"at": 0, "kind": "CreateJobQueue", "jobQueueName": "q", "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}], "schedulingPolicy": "sp"}',
    '{"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs2", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}], "resourceSharingConfiguration": {"strategy": "LEND"}, "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}',
    '{"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs3", "capacityLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}], "resourceSharingConfiguration": {"strategy": "RESERVE"}, "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}',
    # t: 1 g5 in qs2 with a 100 s attempt timeout, dispatched at t=0 (deadline t=100)
    '{"at": 0, "kind": "SubmitServiceJob", "jobId": "t", "jobName": "t", "jobQueue": "q", "quotaShareName": "qs2", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}], "timeoutConfig": {"attemptDurationSeconds": 100}}',
]
LATE = '{"at": 150, "kind": "SubmitServiceJob", "jobId": "n", "jobName": "n", "jobQueue": "q", "quotaShareName": "qs3", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}'

REFUSED = {
    "undecodable, with a far-future at": '{"at": 1000000000, "jobName": "no-kind"}',
    "a valid shape naming no share": '{"at": 500, "kind": "SubmitServiceJob", "jobId": "x", "jobName": "x", "jobQueue": "q", "quotaShareName": "nope", "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]}',
    "a termination of no job": '{"at": 500, "kind": "TerminateServiceJob", "jobId": "ghost", "reason": "x"}',
}


def run(lines: list[str]) -> tuple[State, list[F.Fact]]:
    state = State()
    facts = [f for number, line in enumerate(lines, 1) for f in step_raw(state, line, number)]
    return state, facts


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_ruling15_a_refused_line_moves_no_clock_and_fires_no_timer(name):
    """t's attempt times out at t=100.  A refused line at t=500 fires nothing and moves no
    clock; the submission stamped 150 fires the timeout, stamped 100, and is decided at 150,
    exactly as if the refused line had never been there."""
    state, facts = run([*NOTEBOOK_SETUP, REFUSED[name], LATE])
    refused_seq = len(NOTEBOOK_SETUP) + 1
    [refusal] = [f for f in facts if f.command_seq == refused_seq]
    assert refusal.kind == "CommandRejected" and refusal.at == 0.0  # the clock as it stood
    timeout = [f for f in changes_of(facts, "t") if f.cause.value == "ATTEMPT_TIMEOUT"]
    assert [(f.at, f.command_seq) for f in timeout] == [(100.0, refused_seq + 1)]
    assert dispatch_of(facts, "n").at == 150.0
    assert state.time == 150.0
    without_state, without = run([*NOTEBOOK_SETUP, LATE])
    assert [encode_bytes(f) for f in facts if f.command_seq != refused_seq] == [
        encode_bytes(f.model_copy(update={"command_seq": f.command_seq + (
            f.command_seq > len(NOTEBOOK_SETUP))})) for f in without]  # fmt: skip
    assert without_state.time == state.time


def test_ruling15_on_the_bus_the_streams_timestamp_is_the_time_and_at_is_ignored():
    state = State()
    for seq, line in enumerate(NOTEBOOK_SETUP[:5], 1):
        decide_message(state, _subject(line), line.encode(), seq, 10.0)
    line = json.dumps({**json.loads(NOTEBOOK_SETUP[5]), "at": 5e9})
    [submitted, dispatched] = decide_message(state, _subject(line), line.encode(), 6, 20.0)
    assert (submitted.at, dispatched.at, state.time) == (20.0, 20.0, 20.0)
    # a refusal on the bus is recorded at the clock as it stands, whatever the stamp
    [refused] = decide_message(state, "qm.cmd.q.qs2.SubmitServiceJob", b'{"at": 9e9}', 7, 30.0)
    assert refused.kind == "CommandRejected" and refused.at == 20.0 and state.time == 20.0


def _subject(line: str) -> str:
    from quotasched.events.subjects import subject_for_command

    return subject_for_command(decode_command(line))


def test_ruling15_recovery_does_not_move_the_clock_for_a_recorded_refusal():
    state, facts = run([*NOTEBOOK_SETUP[:5], REFUSED["a termination of no job"]])
    recovered = fold(facts)
    catch_up_clock(recovered, REFUSED["a termination of no job"], refused=True)
    assert recovered.time == state.time == 0.0


# -- ruling 16: every fact fits the bus -------------------------------------------------------


def refusal(line: dict) -> str:
    with pytest.raises(DecodeError) as error:
        decode_command(json.dumps(line))
    return error.value.reason


SUBMIT = {"at": 0, "kind": "SubmitServiceJob", "jobName": "j", "jobQueue": "q",
          "quotaShareName": "qs", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


@pytest.mark.parametrize(("change", "words"), [
    ({"tags": {"k" * 129: "v"}}, ["tags", "128"]),
    ({"tags": {"": "v"}}, ["tags", "at least 1"]),
    ({"tags": {"k": "v" * 257}}, ["tags", "256"]),
    ({"tags": {f"k{i}": "v" for i in range(51)}}, ["tags", "50"]),
    ({"capacityUsage": [{"capacityUnit": G5, "quantity": MAX_INSTANCES + 1}]}, ["1000000"]),
    ({"capacityUsage": [{"capacityUnit": G5, "quantity": 2**63}]}, ["quantity"]),
    ({"capacityUsage": None, "serviceRequestPayload": {"ResourceConfig": {
        "InstanceType": G5, "InstanceCount": 2**63}}}, ["InstanceCount", "1-1000000"]),
    ({"at": MAX_TIME_S * 2}, ["at"]),
    ({"at": 1.7e308}, ["at"]),
    ({"clientToken": "t" * 65}, ["clientToken"]),
    ({"timeoutConfig": {"attemptDurationSeconds": 2**31}}, ["attemptDurationSeconds"]),
    ({"preemptionConfiguration": {"preemptionRetriesBeforeTermination": 2**31}}, ["preemption"]),
    ({"shareIdentifier": "s" * 300}, ["shareIdentifier"]),
])
def test_ruling16_every_open_field_of_a_submission_has_a_bound(change, words):
    reason = refusal({**SUBMIT, **change})
    assert all(word in reason for word in words), reason
    assert len(reason) <= 2048


def test_ruling16_the_limits_themselves_are_accepted():
    decode_command(json.dumps({**SUBMIT, "tags": {f"{i:03d}" + "k" * 125: "v" * 256
                                                  for i in range(50)}}))  # fmt: skip
    decode_command(json.dumps({**SUBMIT, "at": MAX_TIME_S,
                               "capacityUsage": [{"capacityUnit": G5, "quantity": MAX_INSTANCES}]}))


def test_ruling16_a_refusal_never_repeats_a_huge_input():
    reason = refusal({**SUBMIT, "tags": {"k" * 1_000_000: "v"}})
    assert len(reason) < 300 and "k" * 41 not in reason


def test_ruling16_the_largest_facts_the_bounds_allow_fit_one_message():
    """Every field at its bound, in the characters that encode longest: the facts stay under
    FACT_BYTES_LIMIT, so no valid command can make an unappendable fact."""
    wide = "\U0001f680"  # 4 bytes of UTF-8 per character
    payload = json.dumps({"ResourceConfig": {"InstanceType": G5, "InstanceCount": 1},
                          "Pad": "\u0001" * 1500})  # 6 bytes a character once escaped
    line = json.dumps({**SUBMIT, "jobId": "i" * 128, "jobName": "n" * 128, "clientToken": "t" * 64,
                       "capacityUsage": None, "serviceRequestPayload": payload,
                       "tags": {f"{i:02d}" + wide * 126: wide * 256 for i in range(50)}},
                      ensure_ascii=False)  # fmt: skip
    state, facts = run([*NOTEBOOK_SETUP[:3], NOTEBOOK_SETUP[3].replace("qs2", "qs"),
                        line])  # fmt: skip
    submitted = [f for f in facts if f.kind == "JobSubmitted"]
    assert submitted and oversize(submitted) is None
    assert 50_000 < len(encode_bytes(submitted[0])) < FACT_BYTES_LIMIT
    rejected = step_raw(state, "\u0001" * 900_000, 99)  # control characters escape 6x
    assert rejected[0].kind == "CommandRejected" and oversize(rejected) is None
    dispatch = F.JobDispatched(at=0, command_seq=1, job_id="p", attempt=1, job_queue="q",
                               quota_share_name="qs", capacity_usage=[], borrowed=[],
                               after_preemption_of=["v" * 128] * MAX_VICTIMS)  # fmt: skip
    assert oversize([dispatch]) is None


def test_ruling16_a_fact_over_the_limit_is_named_with_its_size():
    fact = F.CommandRejected(at=0, command_seq=1, command_kind="Tick", status_reason="x" * 500)
    assert oversize([fact], limit=100).startswith("The CommandRejected fact of this command would")
    assert oversize([fact], limit=10_000) is None


def test_ruling16_a_large_padded_command_is_measured_and_decided_as_usual():
    """Over 256 KiB of whitespace: its facts are measured under a savepoint and fit."""
    line = NOTEBOOK_SETUP[5][:-1] + " " * 300_000 + "}"
    state, facts = run([*NOTEBOOK_SETUP[:5], line])
    assert [f.kind for f in facts[-2:]] == ["JobSubmitted", "JobDispatched"]
    assert state.jobs["t"].status.value == "SCHEDULED"


@pytest.mark.parametrize(("victims", "preempted"), [(MAX_VICTIMS, True), (MAX_VICTIMS + 1, False)])
def test_ruling16_one_preemption_takes_at_most_max_victims_jobs(victims, preempted):
    """b (limit 1, borrowing without limit) runs victims + 1 one-instance jobs, `victims` of
    them on capacity lent by `own`; own's job needs all of it back."""
    lines = [
        json.dumps({"at": 0, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
                    "capacityLimits": [{"capacityUnit": G5, "maxCapacity": victims + 1}]}),
        *NOTEBOOK_SETUP[1:3],
        _share("own", "LEND", victims), _share("b", "LEND_AND_BORROW", 1),
        *[json.dumps({**SUBMIT, "quotaShareName": "b", "jobId": f"b{i:04d}"})
          for i in range(victims + 1)],
        json.dumps({**SUBMIT, "quotaShareName": "own", "jobId": "owner",
                    "capacityUsage": [{"capacityUnit": G5, "quantity": victims}]}),
    ]  # fmt: skip
    state, facts = run(lines)
    last = [f for f in facts if f.command_seq == len(lines)]
    if preempted:
        assert len(dispatch_of(last, "owner").after_preemption_of) == MAX_VICTIMS
        assert len(of_kind(last, F.JobPreempted)) == MAX_VICTIMS
    else:
        assert dispatched_ids(last) == [] and of_kind(last, F.JobPreempted) == []
        assert state.jobs["owner"].status.value == "RUNNABLE"


def _share(name: str, strategy: str, limit: int) -> str:
    sharing = {"strategy": strategy, **({"borrowLimit": -1} if strategy == "LEND_AND_BORROW" else {})}
    return json.dumps({"at": 0, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": name,
                       "capacityLimits": [{"capacityUnit": G5, "maxCapacity": limit}],
                       "resourceSharingConfiguration": sharing,
                       "preemptionConfiguration": {"inSharePreemption": "DISABLED"}})
