"""The read-pressure bench (benchmarks/read_pressure_bench.py) in its smoke size, so that a
change that breaks it fails `make test`: it runs both phases on a real stack and prints its
figures (what they are is the bench's to say; no timing is asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.integration.helpers import ROOT

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def test_the_read_pressure_bench_prints_both_p99s_and_their_ratio_in_its_smoke_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "read_pressure_bench.py"),
                           "--smoke"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    assert re.search(r"^quiet: .* p99 [\d.]+ ms \(\d+ measured, 0 missing\)", out, re.M), out
    assert re.search(r"^under read pressure: .* p99 [\d.]+ ms \(\d+ measured, 0 missing\)",
                     out, re.M), out  # fmt: skip
    assert re.search(r"^p99 ratio \(pressure / quiet\): [\d.]+$", out, re.M), out
    reads = re.search(r"^reads answered: (\d+) .* errors (\d+)", out, re.M)
    assert reads and int(reads.group(1)) > 0 and reads.group(2) == "0", out
    assert "stepped down during the run: no" in out, out
