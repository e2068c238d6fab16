"""`restart_bench.py --worst-tail` measures a restart against the longest tail its run's
snapshot cadence allows; `worst_tail` reads that tail off the "snapshot written" lines.  The
expectations are worked by hand from the rule: a kill an instant before snapshot k+1 is stored
leaves every fact since k was captured, and the facts the log held then are read off the
captures around that instant, at a steady rate between two captures."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from restart_bench import Written, snapshots_written, worst_tail  # noqa: E402


def test_snapshots_stored_well_before_the_next_capture_leave_the_interval_and_the_store():
    # k+1 captured at 51,000 (t=20) and stored 1.5 s later; k+2 captured at 101,000 (t=30):
    # 15 % of the way, so 58,500 facts in the log at the store, 57,500 since k's capture
    written = [Written(1_000, 10.0, 11.0), Written(51_000, 20.0, 21.5), Written(101_000, 30.0, 31.0)]
    assert worst_tail(written) == 57_500


def test_back_to_back_snapshots_leave_everything_up_to_the_next_capture():
    # each capture comes the moment the one before is stored: the upper bound S_k+2 - S_k
    written = [Written(1_000, 0.0, 2.0), Written(51_000, 2.0, 4.0), Written(120_000, 4.0, 6.0)]
    assert worst_tail(written) == 119_000


def test_the_longest_of_every_cycle_counts():
    written = [Written(0, 0.0, 1.0), Written(50_000, 10.0, 11.0), Written(100_000, 20.0, 25.0),
               Written(150_000, 30.0, 31.0)]  # fmt: skip
    # cycle 1: 50,000 + 0.1 * 50,000 - 0 = 55,000; cycle 2: 100,000 + 0.5 * 50,000 - 50,000
    assert worst_tail(written) == 75_000


def test_fewer_than_three_snapshots_give_no_worst_tail():
    assert worst_tail([]) is None
    assert worst_tail([Written(0, 0.0, 1.0), Written(50_000, 10.0, 11.0)]) is None


def test_the_lines_are_read_from_the_schedulers_own_log(tmp_path):
    log = tmp_path / "scheduler.log"
    log.write_text(
        '{"event": "snapshot written", "fact_seq": 50000, "seconds": 1.5,'
        ' "timestamp": "2026-12-05T10:00:01.500000Z"}\n'
        "not json\n"
        '{"event": "leading", "timestamp": "2026-12-05T10:00:02Z"}\n'
        '{"event": "snapshot written", "fact_seq": 100000, "seconds": 0.5,'
        ' "timestamp": "2026-12-05T10:00:10Z"}\n'
    )  # fmt: skip
    first, second = snapshots_written(log)
    assert (first.fact_seq, second.fact_seq) == (50_000, 100_000)
    assert first.stored - first.captured == 1.5 and second.captured - first.captured == 9.5
