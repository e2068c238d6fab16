"""The hostile-job soak (benchmarks/hostile_jobs_soak.py) in its smoke size, so that a change
that breaks it, or lets a hostile job through, fails `make test`: four honest and four hostile
jobs on a secured stack, one executor SIGKILL, every check of the soak."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.helpers import ROOT

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def test_the_hostile_job_soak_holds_every_check_in_its_smoke_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hostile_jobs_soak.py"),
                           "--smoke"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    checks = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert len(checks) >= 9 and all(line.startswith("  ok") for line in checks), done.stdout
    assert "4 hostile jobs (4 attempts reported" in done.stdout, done.stdout
