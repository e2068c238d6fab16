"""What an executor reads is the contract's typed facts (services/executors/app.py `read_fact`):
decoded at the edge, only for the kinds it uses, and a fact that is not valid is logged in one
line with its stream sequence and the reason, then skipped (never raised)."""

from __future__ import annotations

import json

import pytest

from quotasched.events import facts as F
from quotasched.events.codec import encode_bytes
from quotasched.services.executors import app
from quotasched.services.executors.base import ExecutorFact
from tests.executor_facts import dispatched, preempted, queue_created, status_changed, submitted


class Lines:
    """Stands in for the executor's structlog logger: each call is one line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level: str):
        return lambda event, **fields: self.lines.append((level, event, fields))


@pytest.fixture
def lines(monkeypatch) -> Lines:
    recorder = Lines()
    monkeypatch.setattr(app, "log", recorder)
    return recorder


def test_the_kinds_an_executor_reads_are_the_contracts_models():
    assert app.EXECUTOR_FACTS == ("JobSubmitted", "JobDispatched", "JobPreempted",
                                  "JobStatusChanged", "JobQueueCreated", "JobQueueUpdated")
    assert app.EXECUTOR_MODELS == (F.JobSubmitted, F.JobDispatched, F.JobPreempted,
                                   F.JobStatusChanged, F.JobQueueCreated, F.JobQueueUpdated)
    assert set(app.LEARNED) <= set(app.EXECUTOR_FACTS)


@pytest.mark.parametrize("fact", [
    submitted("j", {"command": "true"}, payload={"Command": "true"}),
    dispatched("j", 2, after=["v"]), preempted("j"), status_changed("j"),
    queue_created("q", "se"),
], ids=lambda fact: fact.kind)  # fmt: skip
def test_a_valid_fact_is_read_as_its_model(fact: ExecutorFact, lines: Lines):
    subject = f"qm.fact.q.qs1.{fact.kind}"
    assert app.read_fact(encode_bytes(fact), 7, subject) == fact
    assert lines.lines == []


@pytest.mark.parametrize("data, words", [
    (b'{"kind": "JobDispatched", "at": 1.0, "commandSeq": 1, "jobId": "j"}',
     ["JobDispatched.attempt: Field required", "JobDispatched.capacityUsage: Field required"]),
    (json.dumps({**json.loads(encode_bytes(dispatched("j"))), "attempt": "1"}).encode(),
     ["JobDispatched.attempt: Input should be a valid integer"]),
    (json.dumps({**json.loads(encode_bytes(status_changed("j"))), "status": "DONE"}).encode(),
     ["JobStatusChanged.status: Input should be"]),
    (b"\xff\xfe not json\n at all", ["Invalid JSON"]),
    (b"", ["Invalid JSON"]),
    (b'{"kind": "JobLaunched"}', ["does not match any of the expected tags"]),
], ids=["fields missing", "a string count", "an unknown status", "not JSON", "empty",
        "an unknown kind"])  # fmt: skip
def test_an_invalid_fact_is_logged_in_one_line_and_skipped(data: bytes, words: list[str],
                                                           lines: Lines):  # fmt: skip
    assert app.read_fact(data, 41, "qm.fact.q.qs1.JobDispatched") is None
    [(level, event, fields)] = lines.lines
    assert level == "error" and "skipped" in event
    assert fields["seq"] == 41 and fields["subject"] == "qm.fact.q.qs1.JobDispatched"
    error = fields["error"]
    assert "\n" not in error and len(error) <= app.ERROR_MAX_CHARS
    assert all(word in error for word in words), error


def test_a_long_validation_error_is_cut_to_its_bound(lines: Lines):
    fact = json.loads(encode_bytes(submitted("j")))
    fact["tags"] = {f"tag{n}": n for n in range(500)}  # 500 values that are not strings
    assert app.read_fact(json.dumps(fact).encode(), 3, "qm.fact.q.qs1.JobSubmitted") is None
    error = lines.lines[0][2]["error"]
    assert len(error) == app.ERROR_MAX_CHARS and error.endswith("...")


def test_a_valid_fact_of_another_kind_than_its_subject_is_skipped(lines: Lines):
    rejected = F.CommandRejected(at=1.0, command_seq=1, command_kind="SubmitServiceJob",
                                 status_reason="no")  # fmt: skip
    assert app.read_fact(encode_bytes(rejected), 9, "qm.fact.q.qs1.JobDispatched") is None
    [(level, _, fields)] = lines.lines
    assert level == "error" and fields["seq"] == 9 and fields["kind"] == "CommandRejected"
