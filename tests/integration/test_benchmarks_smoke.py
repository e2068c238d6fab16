"""The benchmarks the performance goals are measured with (docs/performance.md), each run at a
tiny size so that a change that breaks one fails `make test` (issue 34: "a benchmark that no
longer runs is a defect").  Each must exit 0 and print the figures its docs quote; what the
figures are is the benchmark's to say: no timing is asserted here (shared, noisy machines).

`live_bench.py`'s latency half asked for a capacity beyond the contract's bound and was
refused for a turn without anybody noticing: that is the kind of break these catch.

Every benchmark of benchmarks/ has one here or beside it (benchmarks/README.md lists them);
the simulation benches (options, simulate) need no NATS but fit here all the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.integration.helpers import EXAMPLES, ROOT

pytestmark = [pytest.mark.nats, pytest.mark.slow]


def run_bench(name: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=None if env is None else {**os.environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_live_bench_prints_throughput_against_the_raw_writer_and_the_latency_p99():
    out = run_bench("live_bench.py", "--commands", "5000", "--seconds", "1", "--rate", "200",
                    "--no-inprocess")  # fmt: skip
    assert re.search(r"^raw baseline.*\d", out, re.M) or "[1] raw baseline" in out, out
    assert re.search(r"sustained commands/s >= .* of raw baseline \(subprocess\)\s+\d+%", out), out
    latency = re.search(r"submit -> JobDispatched p99 .*?\s([\d.]+)ms", out)
    assert latency, out
    assert "never got a JobDispatched" not in out, out


def test_replay_bench_prints_replay_against_the_serialization_floor():
    out = run_bench("replay_bench.py", "--smoke", "--phases")
    assert re.search(r"^decision core: (compiled|interpreted)", out, re.M), out
    assert re.search(r"^\[target 1\] replay/floor = [\d.]+x", out, re.M), out
    # --phases: decode, decide and encode by kind, and the interpreted core's decision always
    assert re.search(r"^SubmitServiceJob +[\d.]+% +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+", out, re.M), out
    assert re.search(r"^  deciding, interpreted core: [\d.]+ µs a command \([\d.]+x the floor\)",
                     out, re.M), out


def test_restart_bench_prints_the_restart_with_and_without_the_snapshot():
    out = run_bench("restart_bench.py", "--smoke")
    assert "== restart after SIGKILL" in out, out
    assert re.search(r"rebuild with the snapshot [\d.]+x faster than folding the whole log", out), out


def test_restart_bench_worst_tail_restarts_against_the_tail_it_built():
    # 20,000 commands (half held back): enough for three snapshots or more at the smoke's interval of 500 facts
    out = run_bench("restart_bench.py", "--smoke", "--worst-tail", "--instance-lock",
                    "--commands", "20000", env={"QUOTASCHED_LEASE_TTL_S": "120"})  # fmt: skip
    cadence = re.search(r"the longest tail this cadence allows: ([\d,]+) facts", out)
    built = re.search(r"more commands: ([\d,]+) facts, ([\d,]+) after the stored snapshot", out)
    assert cadence and built, out
    tail = int(built.group(2).replace(",", ""))
    # the restart's own count (its "state rebuilt" line) is the tail the bench says it built
    folded = re.search(r"^snapshot \+ tail\s+([\d,]+)\s", out, re.M)
    assert folded and int(folded.group(1).replace(",", "")) == tail, out
    assert tail > 0, out


def test_restart_bench_with_an_instance_lock_takes_the_killed_schedulers_lease_back():
    # a lease far longer than the run: each restart finds the killed one's lease still valid
    out = run_bench("restart_bench.py", "--smoke", "--instance-lock", env={"QUOTASCHED_LEASE_TTL_S": "120"})
    assert "== restart after SIGKILL" in out, out
    assert "each restart took the killed scheduler's lease back at once" in out, out
    log = (ROOT / "benchmarks" / "out" / "restart_bench_scheduler.log").read_text()
    leading = [json.loads(line) for line in log.splitlines() if '"event": "leading"' in line]
    assert [event.get("took_back_own_lease") for event in leading][-2:] == [True, True], leading


def test_options_bench_prints_every_variant_against_the_aws_baseline_at_each_pool():
    out = run_bench("options_bench.py", "--smoke")
    assert re.search(r"^30 runs in \d+ s wall, \d+ s CPU", out, re.M), out
    ratios = r"\| ([\d.]+x|–|new) \| ([\d.]+x|–|new) \|$"
    for pool in (150, 300):
        baseline = rf"^\| {pool} \(\d+ %\) \| AWS \(baseline\) \|"
        assert re.search(rf"{baseline}.*\| (1\.00x|–) \| (1\.00x|–) \|$", out, re.M), out
        for variant in (r"min runtime 1 h", r"budget 1 / day", r"lend at most half",
                        r"fair share 1 d, quota weights", r"groups capped 1\.5x"):  # fmt: skip
            assert re.search(rf"^\| {pool} \(\d+ %\) \| {variant} \|.*{ratios}", out, re.M), out
    assert re.search(r"^first-start p95 per team at 150 GPUs$", out, re.M), out
    waits = "\nper team, first start p50 / p95, then total queued p50 / p95, at 150 GPUs\n"
    assert waits in out, out


def test_partition_bench_prints_per_queue_throughput_against_the_single_partition_and_latency():
    out = run_bench("partition_bench.py", "--smoke")
    assert out.count("facts match the core") == 3, out  # per-queue K=1 and 2, per-queue 1p K=2
    row = r"\s+[\d,]+\s+[\d.]+\s+[\d,]+\s+"
    assert re.search(rf"^single\s+1\s+1{row}1\.00x", out, re.M), out
    assert re.search(rf"^per-queue\s+1\s+1{row}[\d.]+x", out, re.M), out
    assert re.search(rf"^single\s+2\s+1{row}1\.00x", out, re.M), out
    assert re.search(rf"^per-queue\s+2\s+2{row}[\d.]+x", out, re.M), out
    assert re.search(rf"^per-queue 1p\s+2\s+1{row}[\d.]+x", out, re.M), out
    for mode in ("single", "per-queue K=1"):  # every paced submission got its JobDispatched
        latency = rf"^{mode}\s+[\d,]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d,]+\s+0$"
        assert re.search(latency, out, re.M), out
    assert re.search(r"target, single partition: p99 < 10 ms at 1000 commands/s: (PASS|MISS)",
                     out), out  # fmt: skip


def test_projections_bench_prints_the_rebuilds_against_the_decode_and_stream_read_floors():
    out = run_bench("projections_bench.py", "--smoke")
    assert re.search(r"^decode floor \((orjson|json), nothing kept\):\s+[\d,]+ facts/s", out,
                     re.M), out  # fmt: skip
    assert re.search(r"^rebuild \(best of 1\):\s+[\d,]+ facts/s", out, re.M), out
    assert re.search(r"^read: get-job-queue-snapshot\s+\d+ ms", out, re.M), out
    assert re.search(r"^incremental apply, 100 facts/batch on [\d,]+ facts: \d+ ms/batch; "
                     r"on [\d,]+: \d+ ms/batch \([\d.]+x for \d+x the facts\)",
                     out, re.M), out  # fmt: skip
    assert re.search(r"^rebuild from the stream \(best of 1\):\s+[\d,]+ facts/s \(runs: .*; "
                     r"\d+% of the read floor, \d+% of the file rebuild\)",
                     out, re.M), out  # fmt: skip
    assert re.search(r"^target: rebuild >= 500,000 facts/s: (PASS|MISS) \(\d+% of target; "
                     r"\d+% of the (orjson|json) decode floor\)", out, re.M), out  # fmt: skip


def test_projector_bench_prints_the_lag_the_catch_up_and_identical_files():
    out = run_bench("projector_bench.py", "--smoke")
    assert re.search(r"lag, publish of fact N -> position >= N: p50 \d+ ms, p99 \d+ ms", out), out
    assert re.search(r"sustained apply rate over the run: [\d,]+ facts/s", out), out
    assert re.search(r"(PASS|MISS): p99 lag [\d.]+ s [<>]=? 1 s at 10,000 facts/s offered",
                     out), out  # fmt: skip
    assert "catch-up of 3,000 facts on a fresh file:" in out, out
    same = "checksums of the live file and the catch-up file: identical (position 3,000)"
    assert same in out, out


def test_executor_bench_prints_each_executor_against_the_scheduler_decision():
    out = run_bench("executor_bench.py", "--smoke")
    ms = r"[\d.,]+"
    for kind in ("simulated", "process", "agent"):  # jobs ok, missing, decide, STARTING, ratio
        assert re.search(rf"^{kind}\s+10\s+0\s+{ms}\s+{ms}\s+[\d.,]+x", out, re.M), out
    assert re.search(rf"^sagemaker\s+(10\s+0\s+{ms}\s+{ms}\s+[\d.,]+x|skipped)", out, re.M), out
    assert re.search(r"^\(floor\)\s+local spawn", out, re.M), out


def test_endpoint_bench_prints_the_endpoint_against_direct_nats():
    out = run_bench("endpoint_bench.py", "--smoke")
    for op in ("SubmitServiceJob", "DescribeServiceJob"):
        for clients in (1, 8):  # requests 40, errors 0, req/s, p50, p99, the two ratios
            assert re.search(rf"{op}\W+endpoint\W+{clients}\W+40\W+0\W+[\d,]+\W+[\d.]+"
                             r"\W+[\d.]+\W+[\d.]+x\W+[\d.]+x", out), out  # fmt: skip
    assert "(the submitted jobs are SCHEDULED, as expected with no executor)" in out, out


def test_simulate_bench_prints_every_configuration_and_the_linearity_ratio():
    out = run_bench("simulate_bench.py", "--smoke")
    rows = re.findall(r"^\S+\s+[\d.]+\s+[\d.]+\s+[\d,]+\s+[\d.]+\s+[\d,]+\s+[\d,]+\s+[\d,]+\s+"
                      r"[\d.]+%\s+(PASS|MISS)$", out, re.M)  # fmt: skip
    assert len(rows) == len(list((EXAMPLES / "simulate").glob("*.yaml"))), out
    assert re.search(r"^linearity \(mix\): first 25 / 50 / 100 % of the trace$", out, re.M), out
    assert re.search(r"^cost per job, largest / smallest: [\d.]+x\s+(PASS|MISS)", out, re.M), out


def test_soak_injects_one_fault_of_each_kind_and_holds_every_check():
    out = run_bench("soak.py", "--smoke")
    assert re.search(r"4 faults injected 1 scheduler SIGKILL, 1 projector SIGKILL, "
                     r"1 nats-server SIGKILL, 1 disk full;", out), out  # fmt: skip
    assert "commands with facts lost: 0; duplicated facts: 0;" in out, out
    assert len(re.findall(r"^  ok   ", out, re.M)) == 6 and "FAIL" not in out, out


def test_gate_bench_prints_the_cost_of_a_refusal_and_of_a_round_trip():
    out = run_bench("gate_bench.py", "--smoke")
    assert re.search(r"^refusals: 2,000 submissions to a share over its limit, ([\d,]+) refused, "
                     r"(\d+) stored; gate CPU [\d.]+ us a refusal; [\d,]+ answered a second$",
                     out, re.M), out  # fmt: skip
    refused, stored = (int(n.replace(",", "")) for n in re.search(
        r"([\d,]+) refused, (\d+) stored", out).groups())  # fmt: skip
    assert refused + stored == 2000 and stored <= 5, out  # 1 a second passes
    assert re.search(r"^round trips \(100 each, one at a time\): through the gate p50 [\d.]+ ms "
                     r"p99 [\d.]+ ms; straight into the stream p50 [\d.]+ ms p99 [\d.]+ ms; "
                     r"ratio p50 [\d.]+x p99 [\d.]+x$", out, re.M), out  # fmt: skip
