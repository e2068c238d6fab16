"""What-if simulation of real GPU traces through the real decision core (issue #5).

    trace = read_trace("traces/itp_2021_jobs.csv")
    config = load_config("examples/simulate/itp-lend-and-borrow.yaml")
    run = simulate(trace, config, record=True)      # record: keep the facts for --out
    print(summarize(run).utilization)               # over the trace's submit span
    print(summarize(run, parse_window("7d:50d", trace)).utilization)   # or a chosen window
    write_fact_log(run.facts, "sim.duckdb")          # the projections, queryable with SQL
"""

from quotasched.services.simulate.config import ConfigError, SimConfig, load_config, parse_config
from quotasched.services.simulate.engine import Run, SimulationError, simulate
from quotasched.services.simulate.output import write_fact_log
from quotasched.services.simulate.summary import Summary, series, summarize
from quotasched.services.simulate.trace import Trace, TraceError, read_trace, synthetic, write_trace
from quotasched.services.simulate.window import Window, WindowError, parse_window, submit_span

__all__ = [
    "ConfigError", "Run", "SimConfig", "SimulationError", "Summary", "Trace", "TraceError",
    "Window", "WindowError", "load_config", "parse_config", "parse_window", "read_trace",
    "series", "simulate", "submit_span", "summarize", "synthetic", "write_fact_log",
    "write_trace",
]  # fmt: skip
