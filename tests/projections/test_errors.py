"""A fact the projection cannot apply stops it loudly: the batch raises FactNotApplicable
naming the fact, nothing of the batch is written, and the store stays usable."""

from __future__ import annotations

import json

import pytest

from quotasched.projections import queries, store
from quotasched.projections.store import FactNotApplicable, ProjectionError
from tests.projections.helpers import example_facts, project

NOTEBOOK = example_facts("notebook.jsonl")  # 17 facts; seq 8 is high's JobDispatched


def dispatched(job_id: str, attempt: int = 1, **changes) -> str:
    fact = {"kind": "JobDispatched", "at": 9.0, "commandSeq": 99, "jobId": job_id,
            "attempt": attempt, "jobQueue": "q", "quotaShareName": "qs1",
            "capacityUsage": [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}],
            "borrowed": [], "afterPreemptionOf": []}  # fmt: skip
    fact.update(changes)
    return json.dumps(fact)


def changed(job_id: str, attempt: int, status: str, cause: str = "REPORTED") -> str:
    return json.dumps({"kind": "JobStatusChanged", "at": 9.0, "commandSeq": 99, "jobId": job_id,
                       "attempt": attempt, "status": status, "statusReason": None,
                       "cause": cause})  # fmt: skip


@pytest.fixture
def projection():
    with project(NOTEBOOK) as projected:
        yield projected


def refuse(projection, *facts: str) -> FactNotApplicable:
    """Apply `facts` after the notebook (one valid fact first) and expect a refusal that
    leaves the projection exactly as it was."""
    before, position = queries.checksum(projection.con), projection.position()
    valid = json.dumps({"kind": "CommandRejected", "at": 9.0, "commandSeq": 98,
                        "commandKind": "Tick", "statusReason": "test"})  # fmt: skip
    batch = [(position + 1, valid), *((position + 2 + i, fact) for i, fact in enumerate(facts))]
    with pytest.raises(FactNotApplicable) as refused:
        projection.apply(batch)
    assert projection.position() == position
    assert queries.checksum(projection.con) == before
    assert projection.apply([(position + 1, valid)]) == 1  # still usable
    return refused.value


def test_a_dispatch_of_a_job_never_submitted_is_refused(projection):
    error = refuse(projection, dispatched("ghost"))
    assert str(error).startswith(
        "cannot project fact seq 19 (JobDispatched): job ghost was never submitted")


def test_an_unknown_fact_kind_is_refused(projection):
    error = refuse(projection, json.dumps({"kind": "JobTeleported", "at": 9.0, "commandSeq": 1}))
    assert "unknown fact kind 'JobTeleported'" in str(error)


def test_a_fact_without_a_required_field_is_refused(projection):
    fact = json.loads(dispatched("med", attempt=2))
    del fact["capacityUsage"]
    assert "lacks capacityUsage" in str(refuse(projection, json.dumps(fact)))


def test_a_field_of_the_wrong_type_is_refused(projection):
    assert "lacks attempt (or it has the wrong type)" in str(
        refuse(projection, dispatched("med", attempt="two")))


def test_text_that_is_not_json_is_refused(projection):
    error = refuse(projection, '{"kind": "JobDispatched", ')
    assert error.problems[0][0] == 19 and "not valid JSON" in str(error)


def test_a_second_dispatch_of_a_running_job_is_refused(projection):
    # b1 holds attempt 1 since t=4; attempt 2 cannot start before attempt 1 ended.
    assert "attempt 1 has not ended" in str(refuse(projection, dispatched("b1", attempt=2)))
    assert "attempt 1 of job b1 was already dispatched" in str(refuse(projection, dispatched("b1")))


def test_a_status_for_an_attempt_that_is_not_running_is_refused(projection):
    # high's attempt 1 was preempted at t=5.
    assert "not holding capacity" in str(refuse(projection, changed("high", 1, "RUNNING")))


def test_a_preemption_of_a_job_that_is_not_running_is_refused(projection):
    fact = {"kind": "JobPreempted", "at": 9.0, "commandSeq": 99, "jobId": "med", "attempt": 1,
            "jobQueue": "q", "quotaShareName": "qs1", "preemptorJobId": "low",
            "reason": "IN_SHARE_PRIORITY", "outcome": "REQUEUED", "preemptedAttemptCount": 2}
    error = refuse(projection, json.dumps(fact))
    assert "attempt 1 of job med is not holding capacity" in str(error)


def test_a_job_in_a_share_that_does_not_exist_is_refused(projection):
    fact = json.loads(NOTEBOOK[6])  # high's JobSubmitted
    fact.update(jobId="new", quotaShareName="nowhere")
    assert "quota share q/nowhere does not exist" in str(refuse(projection, json.dumps(fact)))


def test_a_job_submitted_twice_is_refused(projection):
    assert "job high was already submitted" in str(refuse(projection, NOTEBOOK[6]))


def test_facts_out_of_order_are_refused_before_anything_is_written(projection):
    with pytest.raises(ProjectionError, match="out of order"):
        projection.apply([(19, NOTEBOOK[0]), (18, NOTEBOOK[1])])
    assert projection.position() == 17


def test_a_refused_rebuild_names_the_line_and_keeps_the_old_file(tmp_path):
    from quotasched.projections.rebuild import rebuild_from_file

    target = tmp_path / "p.duckdb"
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(NOTEBOOK) + "\n")
    rebuild_from_file(str(facts), str(target))
    facts.write_text("\n".join([*NOTEBOOK[:3], dispatched("ghost"), *NOTEBOOK[3:]]) + "\n")
    with pytest.raises(FactNotApplicable, match="seq 4 .*job ghost was never submitted"):
        rebuild_from_file(str(facts), str(target))
    with store.open(str(target), read_only=True) as kept:
        assert kept.position() == 17
    assert not (tmp_path / "p.duckdb.rebuild").exists()
