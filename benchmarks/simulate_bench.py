"""Speed of `quotasched simulate` on the full ITP trace (issue #5: < 10 s per configuration,
cost linear in the number of jobs).

    .venv/bin/python benchmarks/simulate_bench.py              # every examples/simulate config
    .venv/bin/python benchmarks/simulate_bench.py --quick      # two configurations
    .venv/bin/python benchmarks/simulate_bench.py --profile    # cProfile one run, top 25
    .venv/bin/python benchmarks/simulate_bench.py --smoke      # seconds: that it runs (make test)

Per configuration: wall and CPU seconds of the simulation alone (the trace is read once,
before), jobs/s, commands and facts, preemptions, the pool's utilization over the trace's
submit span (the window every configuration is measured over, as `quotasched simulate`
prints it; not timed), and PASS / MISS against 10 s.  Then the linearity
check: the first 25 %, 50 % and 100 % of the trace under the same configuration, cost per
job, and the ratio largest / smallest (<= 1.5 is called linear).  Times are best of
--reps runs on a machine shared with other work: compare ratios, not last digits.

`--smoke` runs every configuration on the trace's first 2,000 jobs, each on a pool of 300
instances (small enough that jobs queue and are preempted, as on the full trace), then the
linearity check on those jobs, in about 10-20 s: that the bench runs (`make test`); its
figures are not the full trace's.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from quotasched.services.simulate import (load_config, read_trace, simulate,  # noqa: E402
                                          submit_span, summarize)  # fmt: skip

TARGET_S = 10.0
SMOKE_JOBS, SMOKE_POOL = 2_000, 300  # --smoke: the trace's first jobs, on this pool


def timed(trace, config, reps: int) -> tuple[float, float, object]:
    best_wall, best_cpu, run = float("inf"), float("inf"), None
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        run = simulate(trace, config)
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return best_wall, best_cpu, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=os.path.join(ROOT, "traces", "itp_2021_jobs.csv"))
    parser.add_argument("--configs", nargs="*", default=None)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="two configurations only")
    parser.add_argument("--profile", action="store_true", help="cProfile the first configuration")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the trace's first {SMOKE_JOBS:,} jobs on a pool of {SMOKE_POOL} "
                             "instances: seconds, that it runs (make test)")  # fmt: skip
    parser.add_argument("--linearity", default=None,
                        help="configuration for the linearity check (default: the mix)")  # fmt: skip
    args = parser.parse_args()

    paths = args.configs or sorted(glob.glob(os.path.join(ROOT, "examples", "simulate", "*.yaml")))
    if args.quick:
        paths = [p for p in paths if p.endswith(("itp-fixed.yaml", "itp-lend-and-borrow.yaml"))]
    started = time.perf_counter()
    trace = read_trace(args.trace)
    if args.smoke:
        trace = trace.head(SMOKE_JOBS)
    print(f"trace {trace.source}: {len(trace):,} jobs, "
          f"read in {time.perf_counter() - started:.2f} s")  # fmt: skip
    configs = [load_config(path) for path in paths]
    if args.smoke:
        configs = [config.with_pool(SMOKE_POOL) for config in configs]
        print(f"smoke: every configuration on a pool of {SMOKE_POOL} instances; that it runs, "
              "no figures to quote")  # fmt: skip

    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(simulate, trace, configs[0])
        out = os.path.join(ROOT, "benchmarks", "out")
        os.makedirs(out, exist_ok=True)
        profile.dump_stats(os.path.join(out, "simulate.prof"))
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return

    window = submit_span(trace)
    print(f"\nutil: utilization of the pool over {window.describe()}")
    print(f"{'configuration':<14} {'wall s':>7} {'cpu s':>7} {'jobs/s':>8} {'µs/job':>7} "
          f"{'commands':>9} {'facts':>8} {'preempt':>8} {'util':>7}  "
          f"target < {TARGET_S:.0f} s")  # fmt: skip
    for config in configs:
        wall, cpu, run = timed(trace, config, args.reps)
        verdict = "PASS" if wall < TARGET_S else "MISS"
        utilization = summarize(run, window).utilization
        print(f"{config.name:<14} {wall:>7.2f} {cpu:>7.2f} {len(trace) / wall:>8,.0f} "
              f"{wall / len(trace) * 1e6:>7.1f} {run.commands:>9,} {run.fact_count:>8,} "
              f"{sum(run.preemptions):>8,} {100 * utilization:>6.1f}%  {verdict}")  # fmt: skip

    linear_path = args.linearity or next((p for p in paths if p.endswith("itp-lend-and-borrow.yaml")),
                                         paths[0])  # fmt: skip
    config = load_config(linear_path)
    if args.smoke:
        config = config.with_pool(SMOKE_POOL)
    print(f"\nlinearity ({config.name}): first 25 / 50 / 100 % of the trace")
    print(f"{'jobs':>8} {'wall s':>7} {'cpu s':>7} {'µs/job (cpu)':>13}")
    costs = []
    for fraction in (0.25, 0.5, 1.0):
        part = trace.head(int(len(trace) * fraction))
        wall, cpu, _run = timed(part, config, args.reps)
        costs.append(cpu / len(part))
        print(f"{len(part):>8,} {wall:>7.2f} {cpu:>7.2f} {costs[-1] * 1e6:>13.1f}")
    ratio = max(costs) / min(costs)
    print(f"cost per job, largest / smallest: {ratio:.2f}x  "
          f"{'PASS' if ratio <= 1.5 else 'MISS'} (linear: <= 1.5x)")  # fmt: skip


if __name__ == "__main__":
    main()
