"""Showing simulations: rich tables for the terminal, one self-contained HTML chart (inline SVG).

    compare_table(summaries, title)   configurations side by side, one column each
    share_table(summary)              one configuration, one row per share
    document(summaries, trace)        the same figures as one JSON-ready document
    group_lifts, lift_table, oversubscription_line, group_absent, absent_line   the warnings
    chart_html(summaries, series_list)   utilization and p95 wait over time, per configuration
"""

from __future__ import annotations

import html
import math
from dataclasses import asdict, replace

from rich.table import Table

from quotasched.services.simulate.checks import AbsentTeam, LiftedQuotas
from quotasched.services.simulate.summary import Series, Summary
from quotasched.services.simulate.trace import Trace
from quotasched.services.simulate.waits import Quantile, Waits

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22")  # fmt: skip
DAY, HOUR = 86400.0, 3600.0
PERCENTILES = ("p50 / p95: linear interpolation between closest ranks. A job still waiting at "
               "the end counts, waiting until its run's last event: \"≥\" marks a percentile "
               "such a wait reaches (a lower bound).")  # fmt: skip


def _h(value: float) -> str:
    if value != value:  # nan: no job in this group
        return "-"
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def _q(quantile: Quantile) -> str:
    """Hours; "≥ 12.50" when jobs still waiting at the end reach the percentile."""
    return ("≥ " if quantile.at_least else "") + _h(quantile.seconds / HOUR)


def _pct(value: float) -> str:
    return "-" if value != value else f"{100 * value:.1f} %"


def first_start(waits: Waits) -> str:
    return f"{_q(waits.first_start_p50)} / {_q(waits.first_start_p95)}"


def queued(waits: Waits) -> str:
    return f"{_q(waits.queued_p50)} / {_q(waits.queued_p95)}"


ROWS: tuple[tuple[str, object], ...] = (
    ("pool (instances / GPUs)", lambda s: f"{s.pool_instances:,} / {s.pool_gpus:,}"),
    ("jobs finished / still waiting at the end",
     lambda s: f"{s.finished:,} / {s.still_waiting:,}"),
    ("utilization of the pool (window)", lambda s: _pct(s.utilization)),
    ("useful utilization (work kept, window)", lambda s: _pct(s.useful_utilization)),
    ("to first start p50 / p95 (h)", lambda s: first_start(s.waits)),
    ("queued in all p50 / p95 (h)", lambda s: queued(s.waits)),
    ("jobs preempted (preemptions)", lambda s: f"{s.preempted_jobs:,} ({s.preemptions:,})"),
    ("GPU-hours lost to preemption, with / without checkpoints", lambda s: lost(s)),
    ("GPU-hours borrowed (= lent)", lambda s: f"{s.borrowed_gpu_h:,.0f}"),
    ("makespan (days)", lambda s: f"{s.makespan_h / 24:,.2f}"),
    ("simulated in (s) / jobs/s", lambda s: f"{s.seconds:.2f} / {s.jobs_per_second:,.0f}"),
)  # fmt: skip


def lost(figures) -> str:
    """GPU-hours lost as the run's checkpoints kept work, and counting preempted attempts
    whole (the same figure twice when no job checkpoints)."""
    return f"{figures.lost_gpu_h:,.0f} / {figures.lost_whole_gpu_h:,.0f}"


def window_line(summaries: list[Summary]) -> str:
    """'utilization over the trace's submit span, 0 s – 60 d 1 h after the first submission'."""
    windows = {summary.window for summary in summaries}
    if len(windows) != 1:
        raise ValueError("runs compared side by side must share one utilization window")
    return f"utilization over {windows.pop().describe()}"


def compare_table(summaries: list[Summary], title: str = "") -> Table:
    """The totals, then each team's waits (and, where any run left one waiting, the count);
    print `window_line` with it, which says what "(window)" is."""
    window_line(summaries)  # one window for all, or ValueError
    table = Table(title=title or None, caption=PERCENTILES, caption_justify="left")
    table.add_column("")
    for summary in summaries:
        table.add_column(summary.name, justify="right")
    for label, value in ROWS:
        table.add_row(label, *(value(summary) for summary in summaries))  # type: ignore[operator]
    if any(summary.checkpoints != "none" for summary in summaries):
        table.add_row("checkpoints", *(summary.checkpoints for summary in summaries))
    for team in summaries[0].teams:  # one trace: the same teams in every run
        table.add_row(f"{team} first start p50 / p95 (h)",
                      *(first_start(s.teams[team]) for s in summaries))  # fmt: skip
        table.add_row(f"{team} queued p50 / p95 (h)", *(queued(s.teams[team]) for s in summaries))
        if any(s.teams[team].still_waiting for s in summaries):
            table.add_row(f"{team} still waiting at the end",
                          *(f"{s.teams[team].still_waiting:,}" for s in summaries))  # fmt: skip
    return table


def share_table(summary: Summary) -> Table:
    table = Table(title=f"{summary.name}: per share")
    # A share's name is what a reader looks for: never cut (the other columns wrap instead);
    # its teams fold onto more lines rather than end in "…".
    name_width = max((len(share.name) for share in summary.shares), default=5)
    for column in ("share", "teams", "strategy", "limit", "jobs", "waiting at end",
                   "first start p50 / p95 h", "queued p50 / p95 h", "preempted",
                   "lost GPU-h with / without checkpoints", "used GPU-h",
                   "borrowed GPU-h"):  # fmt: skip
        if column == "share":
            table.add_column(column, justify="left", min_width=name_width, no_wrap=True)
        else:
            table.add_column(column, justify="left" if column in ("teams", "strategy") else "right",
                             overflow="fold")  # fmt: skip
    for share in summary.shares:
        table.add_row(
            share.name, ",".join(share.teams), share.strategy, f"{share.limit:,}",
            f"{share.jobs:,}", f"{share.waits.still_waiting:,}", first_start(share.waits),
            queued(share.waits), f"{share.preempted_jobs:,}", lost(share),
            f"{share.used_gpu_h:,.0f}", f"{share.borrowed_gpu_h:,.0f}",
        )  # fmt: skip
    return table


def document(summaries: list[Summary], trace: Trace) -> dict:
    """Every figure of the tables for `--output json`: field names as in `Summary`, hours as
    hours (`*_h`), waits in seconds with `at_least` where jobs still waiting reach them, nan
    (no job in a group) as null."""
    first = summaries[0].window if summaries else None
    return {
        "trace": {"source": trace.source, "jobs": len(trace),
                  "gpu_hours": trace.gpu_seconds() / HOUR},
        "window": None if first is None else {
            "start_s": first.start, "end_s": first.end, "chosen": first.chosen,
            "describe": first.describe()},
        "runs": [_plain({key: value for key, value in asdict(summary).items()
                         if key != "window"}) for summary in summaries],
    }  # fmt: skip


def _plain(value):
    """nan to None, recursively, so that the document is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


# -- the warnings ----------------------------------------------------------------------------

LIFT_HEADING = ("warning: raise_to_largest_job lifted these quotas to the share's largest job "
                "(instances); set raise_to_largest_job: false to keep the configured ones "
                "(a job larger than its share's quota then never starts under RESERVE or "
                "LEND)")  # fmt: skip


def group_lifts(lifted: list[LiftedQuotas]) -> list[tuple[str, LiftedQuotas]]:
    """Runs that lifted the same quotas on the same pool, as one entry: (their names, one)."""
    groups: dict[tuple, tuple[list[str], LiftedQuotas]] = {}
    for run in lifted:
        key = (run.pool, run.lifted_total,
               tuple((lift.share, lift.configured, lift.lifted, lift.largest_job)
                     for lift in run.lifts))  # fmt: skip
        groups.setdefault(key, ([], run))[0].append(run.config)
    return [(", ".join(names), run) for names, run in groups.values()]


def lift_table(groups: list[tuple[str, LiftedQuotas]]) -> Table:
    table = Table(title=LIFT_HEADING, title_justify="left")
    for column in ("configurations", "share", "teams", "configured quota", "lifted quota",
                   "largest job"):  # fmt: skip
        numbers = "quota" in column or "job" in column
        table.add_column(column, justify="right" if numbers else "left")
    for names, run in groups:
        for lift in run.lifts:
            table.add_row(names, lift.share, ",".join(lift.teams), f"{lift.configured:,}",
                          f"{lift.lifted:,}", f"{lift.largest_job:,}")  # fmt: skip
    return table


def oversubscription_line(names: str, lifted: LiftedQuotas) -> str:
    total = f"{names}: the quotas total {lifted.lifted_total:,} instances after lifting"
    if not lifted.oversubscribed_by:
        return f"{total}, within the pool of {lifted.pool:,}"
    share = 100 * lifted.oversubscribed_by / lifted.pool
    return (f"warning: {total}, {lifted.oversubscribed_by:,} more than the pool of "
            f"{lifted.pool:,}: oversubscribed by {share:.1f} %")  # fmt: skip


def group_absent(absent: list[AbsentTeam]) -> list[AbsentTeam]:
    """The same absence in several runs as one, its `config` naming them all."""
    groups: dict[AbsentTeam, list[str]] = {}
    for team in absent:
        groups.setdefault(replace(team, config=""), []).append(team.config)
    return [replace(team, config=", ".join(names)) for team, names in groups.items()]


def absent_line(absent: AbsentTeam) -> str:
    head = (f"warning: {absent.config}: team {absent.team} (share {absent.share}, "
            f"{absent.strategy}) has no job in the trace")  # fmt: skip
    quota = f"{absent.limit:,} instance{'' if absent.limit == 1 else 's'}"
    if not absent.share_idle:
        return f"{head}; the share still serves its other teams"
    if absent.strategy == "RESERVE":
        return f"{head}: the share holds its {quota} idle for the whole run (RESERVE lends nothing)"
    if not absent.borrowers:
        return (f"{head}: the share holds its {quota} idle for the whole run ({absent.strategy} "
                "lends, but no other share with jobs borrows)")  # fmt: skip
    return (f"{head}: the share only lends its {quota} for the whole run (to the "
            "LEND_AND_BORROW shares)")  # fmt: skip


# -- the HTML chart --------------------------------------------------------------------------

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 960, 260, 64, 16, 16, 34


def _nice(top: float) -> float:
    if top <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(top))
    for step in (1, 2, 2.5, 5, 10):
        if top <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _panel(title: str, unit: str, series_list: list[Series], values: list[list[float | None]],
           top: float) -> str:  # fmt: skip
    start, end = series_list[0].edges[0], series_list[0].end
    span = max(end - start, 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - start) / span * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - min(v, top) / top * plot_h

    out = [f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
           'stroke="#ccc"/>']  # fmt: skip
    tick = _nice(top / 4)
    ticks = max(1, math.ceil(top / tick - 1e-9))
    top = tick * ticks
    for k in range(ticks + 1):
        v = tick * k
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#e4e4e4"/><text x="{LEFT - 6}" y="{y(v) + 4:.1f}" '
                   f'text-anchor="end">{v:g}{unit}</text>')  # fmt: skip
    days = span / DAY
    step = max(1, round(_nice(days / 10)))
    day = 0
    while day * DAY <= span + 1:
        out.append(f'<text x="{x(start + day * DAY):.1f}" y="{HEIGHT - 12}" '
                   f'text-anchor="middle">{day}</text>')
        day += step
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 1}" text-anchor="middle">days since '
               'the first submission</text>')
    for index, (serie, points) in enumerate(zip(series_list, values)):
        width = (serie.end - serie.edges[0]) / len(serie.edges)
        path, pen = [], "M"
        for t, v in zip(serie.edges, points):
            if v is None:
                pen = "M"
                continue
            path.append(f"{pen}{x(t + width / 2):.1f},{y(v):.1f}")
            pen = "L"
        out.append(f'<path d="{" ".join(path)}" fill="none" stroke-width="1.6" '
                   f'stroke="{COLOURS[index % len(COLOURS)]}"/>')
    out.append("</svg>")
    return "".join(out)


def chart_html(summaries: list[Summary], series_list: list[Series], trace_name: str) -> str:
    utilization = [[100 * u for u in s.utilization] for s in series_list]
    waits = [s.wait_p95_h for s in series_list]
    top_wait = _nice(max([w for ws in waits for w in ws if w is not None], default=1.0))
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{COLOURS[i % len(COLOURS)]}">'
        f"</span>{html.escape(s.name)}</span>" for i, s in enumerate(summaries)
    )  # fmt: skip
    rows = []
    for label, value in ROWS:
        cells = "".join(f"<td>{html.escape(value(s))}</td>" for s in summaries)  # type: ignore[operator]
        rows.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    head = "".join(f"<th>{html.escape(s.name)}</th>" for s in summaries)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>quotasched simulate: {html.escape(trace_name)}</title><style>"
        "body{font:13px system-ui,sans-serif;margin:24px;color:#222}svg text{font-size:11px;"
        "fill:#444}.key{margin-right:18px}.swatch{display:inline-block;width:14px;height:4px;"
        "margin-right:6px;vertical-align:middle}table{border-collapse:collapse;margin-top:16px}"
        "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th:first-child{text-align:"
        "left}</style></head><body>"
        f"<h1>What-if on {html.escape(trace_name)}</h1><p>{legend}</p>"
        "<h2>Utilization of the pool (instances held, time-weighted per bucket)</h2>"
        + _panel("utilization", "%", series_list, utilization, 100.0)
        + "<h2>Wait p95 of the jobs submitted in each bucket (hours to first dispatch; a job "
        "never dispatched counts until its run's last event, a lower bound)</h2>"
        + _panel("wait p95", "h", series_list, waits, top_wait)
        + f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"
        f"<p>{html.escape(window_line(summaries))}. {html.escape(PERCENTILES)}</p></body></html>"
    )
