"""Projections are disposable: every way of building one from the same log gives the same
tables, compared by `queries.checksum` over every table and view."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from quotasched.projections import queries, rebuild, store
from tests.projections.helpers import (
    example_facts,
    facts_of,
    project,
    random_workload,
    write_facts,
)


@pytest.fixture(scope="module")
def workload() -> list[str]:
    return facts_of(random_workload(seed=7))


@pytest.fixture(scope="module")
def clean(workload, tmp_path_factory) -> dict:
    """The checksum of a one-shot rebuild from a fact file."""
    directory = tmp_path_factory.mktemp("clean")
    facts = write_facts(directory / "facts.jsonl", workload)
    rebuild.rebuild_from_file(str(facts), str(directory / "clean.duckdb"))
    with store.open(str(directory / "clean.duckdb"), read_only=True) as projection:
        return queries.checksum(projection.con)


def test_the_workload_exercises_every_table(clean):
    empty = [name for name, (count, _) in clean.items() if count == 0]
    assert empty == []


def test_two_rebuilds_from_a_file_are_identical(workload, clean, tmp_path):
    facts = write_facts(tmp_path / "facts.jsonl", workload)
    done = rebuild.rebuild_from_file(str(facts), str(tmp_path / "again.duckdb"))
    assert done.facts == len(workload)
    with store.open(str(tmp_path / "again.duckdb"), read_only=True) as projection:
        assert queries.checksum(projection.con) == clean


def test_a_rebuild_replaces_the_old_file_whole(workload, clean, tmp_path):
    target = tmp_path / "p.duckdb"
    project(workload[:100], str(target)).close()
    facts = write_facts(tmp_path / "facts.jsonl", workload)
    rebuild.rebuild_from_file(str(facts), str(target))
    with store.open(str(target), read_only=True) as projection:
        assert queries.checksum(projection.con) == clean
    assert not (tmp_path / "p.duckdb.rebuild").exists()


@pytest.mark.parametrize("batch", [13, 64, 500])
def test_incremental_batches_of_any_size_equal_the_rebuild(workload, clean, batch):
    with project(workload, batch=batch) as projection:
        assert queries.checksum(projection.con) == clean


def test_uneven_batches_and_single_facts_equal_the_rebuild(workload, clean):
    projection = store.open(":memory:")
    numbered = list(enumerate(workload, start=1))
    start, sizes = 0, [1, 1, 2, 17, 1, 250, 3, 999]
    while start < len(numbered):
        size = sizes[start % len(sizes)]
        projection.apply(numbered[start:start + size])
        start += size
    assert queries.checksum(projection.con) == clean


def test_a_file_applied_on_top_of_batches_resumes_after_the_position(workload, clean, tmp_path):
    facts = write_facts(tmp_path / "facts.jsonl", workload)
    with project(workload[:777], batch=100) as projection:
        assert projection.apply_file(str(facts)) == len(workload) - 777
        assert queries.checksum(projection.con) == clean


def test_redelivered_facts_are_skipped(workload, clean):
    projection = project(workload, batch=400)
    numbered = list(enumerate(workload, start=1))
    assert projection.apply(numbered[100:900]) == 0
    assert queries.checksum(projection.con) == clean


def test_a_projector_killed_between_batches_resumes_exactly(workload, clean, tmp_path):
    facts = write_facts(tmp_path / "facts.jsonl", workload)
    path = tmp_path / "crashed.duckdb"
    script = tmp_path / "crash.py"
    script.write_text(_killing_projector())
    crashed = subprocess.run([sys.executable, str(script), str(path), str(facts), "600"],
                             capture_output=True, text=True)  # fmt: skip
    assert crashed.returncode == 9, crashed.stderr
    with store.open(str(path)) as projection:
        assert projection.position() == 600  # twelve whole batches of 50, nothing of the 13th
        numbered = list(enumerate(workload, start=1))
        for start in range(0, len(numbered), 333):  # resume, redelivering from the start
            projection.apply(numbered[start:start + 333])
        assert queries.checksum(projection.con) == clean


def _killing_projector() -> str:
    """A projector process that os._exit()s inside the transaction of the first batch after
    `crash_after` facts, once that batch's first rows are written: a kill -9 mid-batch."""
    return textwrap.dedent("""
        import os, sys
        from quotasched.projections import store
        path, facts_path, crash_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
        numbered = list(enumerate(open(facts_path).read().splitlines(), start=1))
        projection = store.open(path)
        project = projection._project

        def dying(lo, source, hi, on_step=None):
            def step(name):
                if name == "share_changes":
                    os._exit(9)
            return project(lo, source, hi, step)

        for start in range(0, len(numbered), 50):
            if start >= crash_after:
                projection._project = dying
            projection.apply(numbered[start:start + 50])
    """)


def test_a_failed_batch_leaves_no_trace_and_the_next_attempt_succeeds(workload, clean):
    projection = project(workload[:1000], batch=250)
    before = queries.checksum(projection.con)
    numbered = list(enumerate(workload, start=1))
    real_statements = dict(store.rows.STATEMENTS)
    store.rows.STATEMENTS["capacity_changes"] = "SELECT error('disk full (simulated)')"
    try:
        with pytest.raises(Exception, match="disk full"):
            projection.apply(numbered[1000:1500])
    finally:
        store.rows.STATEMENTS.clear()
        store.rows.STATEMENTS.update(real_statements)
    assert projection.position() == 1000
    assert queries.checksum(projection.con) == before
    projection.apply(numbered[1000:])
    assert queries.checksum(projection.con) == clean


@pytest.mark.parametrize("name", ["notebook.jsonl", "reclaim-and-retries.jsonl",
                                  "two-teams-day.jsonl", "blocked-heads-and-capacity-events.jsonl"])
def test_every_example_projects_the_same_fact_by_fact_and_in_one_batch(name):
    facts = example_facts(name)
    with project(facts) as whole, project(facts, batch=1) as single:
        assert queries.checksum(single.con) == queries.checksum(whole.con)
