"""`quotasched simulate`: what-if runs of a job trace through the real decision core.

    quotasched simulate --trace traces/itp_2021_jobs.csv --config examples/simulate/itp-fixed.yaml
    quotasched simulate --trace T.csv --config C.yaml --out sim.duckdb      # + the fact log
    quotasched simulate --trace T.csv --compare A.yaml B.yaml --chart what-if.html
    quotasched simulate --trace T.csv --compare A.yaml B.yaml --pool 1715 --pool 2287
    quotasched simulate --trace T.csv --compare A.yaml B.yaml --window 7d:50d   # after warm-up
    quotasched simulate --trace T.csv --config C.yaml --checkpoint-interval 1h \
        --checkpoint-interval team=cluster03:30m --checkpoint-overhead 5m --output json
    quotasched synth-trace --jobs 500 --seed 7 --out small.csv            # a seeded test trace

Exit status: 0 done; 1 the simulation failed (the core refused the set-up, or the fact log
could not be projected); 2 bad usage: unreadable or invalid trace or configuration.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from quotasched.services.cli.report_cli import _prose

EXIT_FAILED, EXIT_USAGE = 1, 2


def register(app: typer.Typer) -> None:
    """Add `simulate` and `synth-trace` to the `quotasched` app."""
    app.command("simulate", help=_prose(simulate.__doc__))(simulate)
    app.command("synth-trace", help=_prose(synth_trace.__doc__))(synth_trace)


def _fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.echo(f"quotasched simulate: {message}", err=True)
    return typer.Exit(code)


def simulate(
    trace: Annotated[str, typer.Option("--trace", help="Job trace CSV: job_id,submit_time_s,"
                                       "duration_s,gpus,team,job_type.")],
    config: Annotated[Optional[str], typer.Option(
        "--config", help="One configuration (YAML).")] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Run every configuration given as an argument on the same trace and "
                          "print them side by side.")] = False,
    configs: Annotated[Optional[list[str]], typer.Argument(
        help="Configurations to compare (with --compare).", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", help="Write the fact log into this DuckDB projection (one configuration "
                      "only); query it with quotasched sql --db.")] = None,
    chart: Annotated[Optional[str], typer.Option(
        "--chart", help="Write utilization and wait over time per configuration as one "
                        "self-contained HTML file.")] = None,
    pool: Annotated[Optional[list[int]], typer.Option(
        "--pool", help="Pool size in instances instead of the configuration's (repeat for a "
                       "sweep: every configuration runs at every size); weighted quotas "
                       "follow the pool, absolute limits scale with it.")] = None,
    window: Annotated[Optional[str], typer.Option(
        "--window", help="Measure utilization over START:END instead of the trace's submit "
                         "span (its first to its last submission): seconds after the first "
                         "submission, or with a unit s, m, h or d, e.g. 7d:50d; an empty "
                         "START or END is the first or the last submission. Every run "
                         "compared is measured over the same window.", show_default=False)] = None,
    shares: Annotated[bool, typer.Option(
        "--shares/--no-shares", help="Also print the per-share table of each run.")] = False,
    progress: Annotated[bool, typer.Option(
        "--progress/--no-progress", help="A progress bar over simulated time.")] = True,
    checkpoint_interval: Annotated[Optional[list[str]], typer.Option(
        "--checkpoint-interval", help="How often jobs checkpoint, over every configuration's "
        "own: DURATION for every job (0: none), or a class: team=NAME:DURATION, "
        "job_type=NAME:DURATION, gpus>=N:DURATION (repeat; a team's class wins, then a "
        "job_type's, then the largest gpus>= a job reaches). DURATION: seconds, or with a "
        "unit s, m, h or d.", show_default=False)] = None,
    checkpoint_overhead: Annotated[Optional[str], typer.Option(
        "--checkpoint-overhead", help="Work a checkpointing job redoes at every restart "
        "(DURATION), instead of the configurations' checkpoint_overhead_s.",
        show_default=False)] = None,
    output: Annotated[str, typer.Option(
        "--output", help="table, or json: every figure as one JSON document.")] = "table",
) -> None:
    """Simulate a job trace under quota-share configurations, with the real decision core.

    Jobs are submitted at their trace times and complete after their durations; lending,
    borrowing and preemption are decided by the same core the service runs. A preempted job
    loses the work since its last checkpoint (default: all of it) and goes back to its
    queue; its next attempt runs the work left plus a restart overhead
    (--checkpoint-interval, --checkpoint-overhead, or the configuration's checkpoint_*
    keys). Prints utilization, waits per team, preemptions, GPU-hours lost (with the run's
    checkpoints, and counting preempted attempts whole: without), borrowed and lent, and the
    makespan.

    Utilization is measured over one window common to every run compared: the trace's submit
    span unless --window says otherwise; work outside it is clipped. Waits are given as time
    to first start and total time queued (each wait after a preemption too), p50 and p95; a
    job still waiting when its run ends is counted, and its wait is censored there (a lower
    bound, marked ≥ where it reaches a percentile). Warnings on standard error: quotas lifted
    to a share's largest job (raise_to_largest_job) and whether they oversubscribe the pool,
    and teams named in a configuration but absent from the trace.
    """
    paths = ([config] if config else []) + list(configs or [])
    _check_usage(paths, config, compare, out, chart, pool, output)
    checkpoints = _checkpoints(checkpoint_interval, checkpoint_overhead)
    job_trace, loaded, measured_over = _load(trace, paths, pool, window, checkpoints)
    runs = _run_all(job_trace, loaded, bool(out), progress)
    _warn(runs)
    _report(runs, job_trace, measured_over, out, chart, shares, progress, output == "json")


def _check_usage(paths: list[str], config, compare: bool, out, chart, pool, output) -> None:
    """Refuse option combinations that cannot work, before reading anything."""
    if output not in ("table", "json"):
        raise _fail(f"--output must be table or json, not {output}")
    if compare and config:
        raise _fail("give configurations either with --config (one) or after --compare, not both")
    if not paths:
        raise _fail("no configuration: --config FILE.yaml, or --compare A.yaml B.yaml ...")
    if len(paths) > 1 and not compare:
        raise _fail("several configurations need --compare")
    if out and (len(paths) > 1 or len(pool or []) > 1):
        raise _fail("--out writes one simulation's fact log: give one configuration and at "
                    "most one --pool")  # fmt: skip
    if chart and not chart.endswith((".html", ".htm")):
        raise _fail(f"--chart must name an .html file, not {chart}")


def _checkpoints(intervals: list[str] | None, overhead: str | None):
    """The checkpoint options, checked before anything is read."""
    from quotasched.services.simulate.checkpoints import CheckpointError, parse_options

    try:
        return parse_options(intervals, overhead)
    except CheckpointError as error:
        raise _fail(str(error)) from None


def _load(trace: str, paths: list[str], pool, window: str | None, checkpoints):
    """The trace, every configuration (one per --pool size each, with the checkpoint options),
    uniquely named, and the window utilization is measured over."""
    from quotasched.services.simulate import ConfigError, TraceError, load_config, read_trace
    from quotasched.services.simulate.checkpoints import job_intervals
    from quotasched.services.simulate.window import WindowError, parse_window, submit_span

    try:
        loaded = [checkpoints.apply(load_config(path)) for path in paths]
        job_trace = read_trace(trace)
        for c in loaded:  # a class naming a team the trace lacks: say so before any run
            job_intervals(c, job_trace)
        measured_over = parse_window(window, job_trace) if window else submit_span(job_trace)
        if pool:
            loaded = [c.with_pool(size).model_copy(update={"name": f"{c.name}@{size}"})
                      if len(pool) > 1 else c.with_pool(size)
                      for c in loaded for size in pool]  # fmt: skip
    except (ConfigError, TraceError, WindowError) as error:
        raise _fail(str(error)) from None
    names = [c.name for c in loaded]
    if len(set(names)) != len(names):
        raise _fail(f"two configurations share the name {next(n for n in names if names.count(n) > 1)}"
                    "; names label the columns")  # fmt: skip
    return job_trace, loaded, measured_over


def _run_all(job_trace, loaded, record: bool, progress: bool) -> list:
    """Simulate every configuration in turn; a failure ends the command with its exit status."""
    from quotasched.services.simulate import ConfigError, SimulationError, TraceError

    console = Console(stderr=True)
    runs = []
    try:
        for c in loaded:
            runs.append(_run(job_trace, c, record, progress, console))
    except (ConfigError, TraceError) as error:
        raise _fail(str(error)) from None
    except SimulationError as error:
        raise _fail(str(error), EXIT_FAILED) from None
    return runs


def _run(job_trace, config, record: bool, progress: bool, console: Console):
    from quotasched.services.simulate import simulate as run_simulation

    if not progress:
        return run_simulation(job_trace, config, record=record)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    start, last = job_trace.submit[0], job_trace.submit[-1]
    total = max((last - start) / 86400, 1e-9)
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("day {task.completed:>5.1f} of {task.total:.1f}"),
                  TimeElapsedColumn(), console=console, transient=False) as bar:  # fmt: skip
        task = bar.add_task(f"simulating {config.name}", total=total)
        run = run_simulation(
            job_trace, config, record=record,
            progress=lambda now: bar.update(task, completed=min((now - start) / 86400, total)),
        )  # fmt: skip
        bar.update(task, completed=total)
    return run


def _warn(runs) -> None:
    """What the set-up decided that the configurations do not say, on standard error."""
    from quotasched.services.simulate.checks import absent_teams, lifted_quotas
    from quotasched.services.simulate.render import (absent_line, group_absent, group_lifts,
                                                     lift_table, oversubscription_line)  # fmt: skip

    console = Console(stderr=True)
    if not console.is_terminal:
        console = Console(stderr=True, width=120)
    groups = group_lifts([lift for lift in map(lifted_quotas, runs) if lift is not None])
    if groups:
        console.print(lift_table(groups))
        for names, lift in groups:
            _say(console, oversubscription_line(names, lift))
    for team in group_absent([team for run in runs for team in absent_teams(run)]):
        _say(console, absent_line(team))


def _say(console: Console, line: str) -> None:
    """One line as it is: no markup, no highlighting, wrapped by the terminal if at all."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _report(runs, job_trace, measured_over, out, chart, shares, progress, as_json) -> None:
    from quotasched.services.simulate import summarize, write_fact_log
    from quotasched.services.simulate.render import (chart_html, compare_table, document,
                                                     share_table, window_line)  # fmt: skip

    console = Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for several columns
        console = Console(width=max(120, 44 + 18 * len(runs)))
    summaries = [summarize(run, measured_over) for run in runs]
    if as_json:
        import json

        typer.echo(json.dumps(document(summaries, job_trace), indent=2, ensure_ascii=False))
    else:
        title = (f"{job_trace.source}: {len(job_trace):,} jobs, "
                 f"{job_trace.gpu_seconds() / 3600:,.0f} GPU-hours")  # fmt: skip
        _say(console, window_line(summaries))
        console.print(compare_table(summaries, title))
    for summary in summaries:
        if shares and not as_json:
            console.print(share_table(summary))
        for share, reason in summary.blocked.items():
            if as_json:  # in the document; said on standard error too
                typer.echo(f"{summary.name}: share {share} was blocked: {reason}", err=True)
            else:
                console.print(f"[yellow]{summary.name}: share {share} was blocked: {reason}[/]")
    if out:
        from quotasched.projections import ProjectionError

        try:
            rebuilt = write_fact_log(runs[0].facts or [], out, progress=progress)
        except ProjectionError as error:
            raise _fail(f"cannot write {out}: {error}", EXIT_FAILED) from None
        except OSError as error:
            raise _fail(f"cannot write {out}: {error.strerror or error}") from None
        typer.echo(f"wrote {out}: {rebuilt.facts:,} facts in {rebuilt.seconds:.1f} s "
                   f"(query it: quotasched sql \"...\" --db {out})", err=True)  # fmt: skip
    if chart:
        from quotasched.services.simulate import series

        start = min(s.first_submit for s in summaries)
        end = max(s.last_end for s in summaries)
        page = chart_html(summaries, [series(run, start, end) for run in runs], job_trace.source)
        try:
            with open(chart, "w", encoding="utf-8") as handle:
                handle.write(page)
        except OSError as error:
            raise _fail(f"cannot write {chart}: {error.strerror or error}") from None
        typer.echo(f"wrote {chart}", err=True)


def synth_trace(
    out: Annotated[str, typer.Option("--out", help="Where to write the trace CSV.")],
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Number of jobs.")] = 500,
    teams: Annotated[int, typer.Option("--teams", min=1, max=20, help="Number of teams.")] = 3,
    seed: Annotated[int, typer.Option("--seed", help="Random seed: same seed, same file.")] = 0,
    mean_gap_s: Annotated[float, typer.Option(
        "--mean-gap-s", min=0.001, help="Mean seconds between two submissions.")] = 60.0,
) -> None:
    """Write a small seeded synthetic trace (ITP-like sizes and durations) for tests and demos."""
    from quotasched.services.simulate import synthetic, write_trace

    try:
        write_trace(synthetic(jobs, teams=teams, seed=seed, mean_gap_s=mean_gap_s), out)
    except OSError as error:
        typer.echo(f"quotasched synth-trace: cannot write {out}: {error.strerror or error}",
                   err=True)  # fmt: skip
        raise typer.Exit(EXIT_USAGE) from None
    typer.echo(f"wrote {out}: {jobs} jobs, {teams} teams, seed {seed}", err=True)
