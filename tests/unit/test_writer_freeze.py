"""The writer moves the long-lived state out of the collector's reach every FREEZE_EVERY
decided commands (services/scheduler/writer.py `freeze_now`; why: benchmarks/
read_pressure_bench.py), and frozen objects are still freed once unreferenced."""

from __future__ import annotations

import gc
import weakref

from quotasched.services.scheduler.core.entities import Job
from quotasched.services.scheduler.writer import FREEZE_EVERY, freeze_now


def test_it_freezes_exactly_when_the_count_passes_a_multiple():
    assert not freeze_now(0, FREEZE_EVERY - 1)
    assert not freeze_now(FREEZE_EVERY, 2 * FREEZE_EVERY - 1)
    try:
        frozen = gc.get_freeze_count()
        assert freeze_now(FREEZE_EVERY - 1, FREEZE_EVERY)
        assert gc.get_freeze_count() > frozen
        assert freeze_now(10, 10 + 3 * FREEZE_EVERY)  # a batch passing several: once
    finally:
        gc.unfreeze()


class Record:
    """A job with a weak reference to tell when it is freed (Job itself has none)."""

    def __init__(self, job: Job) -> None:
        self.job = job


def test_a_frozen_job_is_freed_when_its_last_reference_goes():
    jobs = {"a": Record(Job("a", "a", "q", "qs1"))}
    try:
        gone = weakref.finalize(jobs["a"], lambda: None)  # alive while the record is
        assert freeze_now(0, FREEZE_EVERY)
        del jobs["a"]  # as retention forgets a job (state.drop)
        assert not gone.alive
    finally:
        gc.unfreeze()
