"""The admission gate's limits (services/gate/limits.py), by hand: what one share may get past
the gate in a second and in a byte window, at the edges its docs name."""

from __future__ import annotations

import pytest

from quotasched.events.values import ADMISSION_DEFAULTS, QuotaShareOptions
from quotasched.services.gate.limits import DEFAULT_LIMITS, Gate

QS1, QS2 = ("q", "qs1"), ("q", "qs2")
SMALL = 500  # bytes: counts no bytes (16 KiB and under)
BIG = 20 * 1024  # counts its size


def gate_with(share=QS2, **options) -> Gate:
    gate = Gate()
    gate.set_limits(share, QuotaShareOptions.model_validate(options))
    return gate


def passed(gate: Gate, share, kind: str, count: int, now: float, size: int = SMALL) -> int:
    return sum(gate.admit(share, kind, size, now) is None for _ in range(count))


def test_a_share_gets_exactly_its_per_second_limit_and_the_next_second_starts_again():
    gate = gate_with(maxSubmissionsPerSecond=3)
    assert passed(gate, QS2, "SubmitServiceJob", 10, 100.0) == 3
    assert passed(gate, QS2, "SubmitServiceJob", 10, 100.999) == 0  # the same whole second
    assert gate.admit(QS2, "SubmitServiceJob", SMALL, 100.5) == (
        "Quota share qs2 already had 3 submissions in this second, its limit "
        "maxSubmissionsPerSecond of 3")
    assert passed(gate, QS2, "SubmitServiceJob", 10, 101.0) == 3


def test_a_limit_of_one_lets_one_through_per_second():
    gate = gate_with(maxSubmissionsPerSecond=1)
    assert [gate.admit(QS2, "SubmitServiceJob", SMALL, t) is None
            for t in (5.0, 5.2, 5.99, 6.0, 6.01, 8.5)] == [True, False, False, True, False, True]


def test_another_share_is_not_counted_with_the_flooding_one():
    gate = gate_with(maxSubmissionsPerSecond=2)
    assert passed(gate, QS2, "SubmitServiceJob", 100, 7.0) == 2
    assert passed(gate, QS1, "SubmitServiceJob", 100, 7.0) == 100  # the default: 10,000


def test_a_share_without_options_has_the_documented_default():
    gate = Gate()
    assert DEFAULT_LIMITS.per_second == ADMISSION_DEFAULTS["max_submissions_per_second"] == 10_000
    assert passed(gate, QS1, "SubmitServiceJob", 10_001, 3.0) == 10_000


def test_updates_and_terminations_each_have_the_per_second_limit_of_their_own():
    gate = gate_with(maxSubmissionsPerSecond=2)
    assert passed(gate, QS2, "SubmitServiceJob", 5, 1.0) == 2
    assert passed(gate, QS2, "UpdateServiceJob", 5, 1.0) == 2
    assert passed(gate, QS2, "TerminateServiceJob", 5, 1.0) == 2
    assert gate.admit(QS2, "UpdateServiceJob", SMALL, 1.5) == (
        "Quota share qs2 already had 2 UpdateServiceJob commands in this second, its limit "
        "maxSubmissionsPerSecond of 2")


def test_a_refusal_is_not_counted():
    gate = gate_with(maxSubmissionsPerSecond=2)
    for _ in range(1000):
        gate.admit(QS2, "SubmitServiceJob", SMALL, 1.0)
    assert passed(gate, QS2, "SubmitServiceJob", 3, 2.0) == 2


def test_submission_bytes_count_above_16_kib_only_within_their_window():
    gate = gate_with(maxSubmissionBytesPerWindow=2 * BIG + 10, submissionBytesWindowSeconds=60)
    assert passed(gate, QS2, "SubmitServiceJob", 100, 0.0, SMALL) == 100  # counted as 0 bytes
    assert passed(gate, QS2, "SubmitServiceJob", 2, 1.0, BIG) == 2
    assert gate.admit(QS2, "SubmitServiceJob", BIG, 59.9) == (
        f"Quota share qs2 would reach {3 * BIG} submission bytes in this 60-second window, "
        f"over its limit maxSubmissionBytesPerWindow of {2 * BIG + 10}")
    assert gate.admit(QS2, "SubmitServiceJob", SMALL, 59.9) is None  # small ones still pass
    assert passed(gate, QS2, "SubmitServiceJob", 3, 60.0, BIG) == 2  # the next window


def test_a_submission_just_at_16_kib_counts_no_bytes():
    gate = gate_with(maxSubmissionBytesPerWindow=1)
    assert gate.admit(QS2, "SubmitServiceJob", 16 * 1024, 0.0) is None
    assert gate.admit(QS2, "SubmitServiceJob", 16 * 1024 + 1, 0.0) is not None


def test_updates_count_no_bytes():
    gate = gate_with(maxSubmissionBytesPerWindow=1)
    assert gate.admit(QS2, "UpdateServiceJob", BIG, 0.0) is None


def test_options_dropped_bring_the_defaults_back():
    gate = gate_with(maxSubmissionsPerSecond=1)
    gate.set_limits(QS2, None)
    assert passed(gate, QS2, "SubmitServiceJob", 5, 0.0) == 5
    gate.set_limits(QS2, QuotaShareOptions())  # options without admission limits: defaults
    assert passed(gate, QS2, "SubmitServiceJob", 5, 1.0) == 5


@pytest.mark.parametrize("kind", ["CreateQuotaShare", "ReportJobStatus", "Tick", "", "Submit"])
def test_anything_but_a_job_command_is_refused(kind):
    reason = Gate().admit(QS1, kind, SMALL, 0.0)
    assert reason == (f"{kind} is not a job command of one quota share (the gate forwards "
                      "SubmitServiceJob, UpdateServiceJob, TerminateServiceJob only)")


def test_counts_that_can_no_longer_refuse_are_forgotten():
    gate = gate_with(maxSubmissionBytesPerWindow=10 * BIG, submissionBytesWindowSeconds=60)
    for index in range(1000):
        gate.admit(("q", f"s{index}"), "SubmitServiceJob", SMALL, 10.0)
    gate.admit(QS2, "SubmitServiceJob", BIG, 10.0)
    assert len(gate) == 1001
    assert gate.forget(10.5) == 0  # the same second: all could still refuse
    assert gate.forget(11.0) == 1000  # qs2 still holds bytes in its open window
    assert len(gate) == 1
    assert gate.forget(60.0) == 1
    assert len(gate) == 0
