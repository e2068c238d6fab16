"""The flooding soak (benchmarks/flooding_soak.py) in its smoke size, so that a change that
breaks it fails `make test`: the real `quotasched up`, an honest team alone, then beside a
flooding tenant (volume, heavy reads, slow sockets); every honest job decided, `up` still
running.  The figures are the soak's to report: no timing is asserted here."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.integration.helpers import ROOT

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def test_the_flooding_soak_decides_every_honest_job_and_prints_its_figures_in_its_smoke_size():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flooding_soak.py"),
                           "--smoke"], capture_output=True, text=True, timeout=600)  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    for phase in ("honest alone", "beside the flood"):
        assert re.search(rf"^{phase}: +submit->decision p50 [\d.]+ ms  p99 [\d.]+ ms "
                         r"\(\d+ measured, 0 undecided", out, re.M), out  # fmt: skip
    assert re.search(r"^p99 ratio \(flood / alone\): [\d.]+$", out, re.M), out
    assert "teams publish: through the admission gate" in out, out
    flood = re.search(r"^flooding submissions: (\d+) stored, (\d+) refused at the gate, .* refused "
                      r"(\d+) \((.*)\)$", out, re.M)  # fmt: skip
    # qs2 may submit 20 a second: the gate lets about that through and refuses the rest
    assert flood and int(flood.group(1)) > 0 and int(flood.group(2)) > int(flood.group(1)), out
    assert "naming no limit" not in flood.group(4), out  # every refusal names its limit
    assert re.search(r"^flooding reads \(nats\): \d+ answered", out, re.M), out
    assert re.search(r"^flooding reads \(endpoint\): \d+ answered", out, re.M), out
    assert re.search(r"^slow sockets: \d+ at once, \d+ opened, \d+ shed", out, re.M), out
    assert re.search(r"^honest jobs decided: (\d+) of \1 \(every one\); honest jobs refused: 0",
                     out, re.M), out  # fmt: skip
    assert "`up` still running: yes" in out, out
