"""The memory bench (benchmarks/memory_bench.py) in its smoke size, so that a change that
breaks it fails the suite: it decides its commands and prints its table and the ended-job
ratio (the figures are the bench's to report; no size or time is asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_memory_bench_prints_its_per_job_table_in_its_smoke_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_bench.py"), "--smoke"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    assert "| tags | N | traced B/queued job | RSS B/queued job | traced B/ended job" in out, out
    for size in ("small", "max"):
        assert re.search(rf"^\| {size} \| 200 \| [\d,]+ \| -?[\d,]+ \| [\d,]+ \| -?[\d,]+ \|", out, re.M), out
        assert re.search(rf"^ended {size} tags: total ended-job bytes N=200 / N=50 = [\d.]+ ", out, re.M), out
    # the expiring series: retention forgets ended jobs, so the state keeps only the recent
    # ones (the smoke's retention is 1 s of logical time: 20 jobs at 0.05 s a job)
    for size in ("small", "max"):
        assert re.search(rf"^\| {size} \| 200 \| [\d,]+ \| -?[\d,]+ \| [\d.]+ \| 20 \|$", out, re.M), out
        assert re.search(rf"^expiring {size} tags: .* 20 jobs kept at N=200; the baseline without "
                         r"retention kept 200", out, re.M), out
