"""The page's first state, rendered on the server: the page shows its data without its script
(a headless browser's `--dump-dom` or `--screenshot`, a reader without JavaScript), and the
script then keeps it live from the same JSON (embedded in the page, then re-fetched).

Every value from the scheduler or the log (job ids and names, share, queue and environment
names, reasons, sentences) is free text a team chose: each goes through `_e` (html.escape,
quotes too) and nothing else is written into the page unescaped; the embedded JSON has `<`,
`>` and `&` as \\u escapes, so no value can close its script element.  The layout mirrors
app.js's, which builds the same rows with textContent.
"""

from __future__ import annotations

import html
import json
import re
import time
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from quotasched.services.web.usage import WINDOWS

TEMPLATE = "index.html"
SLOT = re.compile(r"<!--slot:([a-z-]+)-->")
COLOURS = ("#1976d2", "#f57c00", "#7cb342", "#8e24aa", "#00897b", "#c62828", "#6d4c41")
TOTAL_COLOUR = "#222"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


@cache
def _template() -> str:
    return (Path(__file__).parent / "static" / TEMPLATE).read_text()


def page(first: dict[str, Any]) -> str:
    """The page with every slot filled from `first` (see `WebView.first_state`)."""
    view = first.get("view")
    share = first.get("share") or ""
    slots = {
        "queues": "".join(_option(name, name == first.get("queue")) for name in first["queues"]),
        "share-options": _option("all", not share, "") + "".join(
            _option(row["quotaShareName"], row["quotaShareName"] == share)
            for row in (view or {}).get("shares", ())),
        "live": _e(f"as of fact {first.get('position', 0)}"),  # the script makes it "live"
        "units": _e(", ".join((view or {}).get("units", ()))),
        "environment": _e(environment_text(view) if view else first.get("viewError") or ""),
        "shares": share_rows(view, share) if view else "",
        "waiting": waiting_html(view, first) if view else "",
        "activity": activity_items(first.get("activity") or [], share),
        "job-value": _e(first.get("job") or ""),
        "job": job_html(first.get("story")),
        "windows": "".join(_option(name, name == first.get("window")) for name in WINDOWS),
        "usage-note": _e(usage_note(first.get("usage"))),
        "usage": usage_svg(first.get("usage"), share),
        "state": embedded(first),
    }
    return SLOT.sub(lambda found: slots[found.group(1)], _template())


def embedded(value: Any) -> str:
    """JSON safe inside a script element: `<`, `>` and `&` as \\u escapes (still JSON)."""
    text = json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _option(text: str, selected: bool, value: str | None = None) -> str:
    chosen = " selected" if selected else ""
    shown = "" if value is None else f' value="{_e(value)}"'
    return f"<option{shown}{chosen}>{_e(text)}</option>"


def clock(at: float | None) -> str:
    """A fact's time as the page shows it: HH:MM:SS local (the view serves loopback, so the
    server's clock is the reader's), or t=… s for a replayed file's logical time."""
    if at is None:
        return ""
    if at < 1e9:
        return f"t={at:g} s"
    return time.strftime("%H:%M:%S", time.localtime(at))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _pairs(amounts: dict[str, float]) -> str:
    return ", ".join(f"{_number(v)} {'from/to ' + k if k else 'not backed by idle quota'}"
                     for k, v in amounts.items() if v > 0)  # fmt: skip


def environment_text(view: dict) -> str:
    env = view.get("environment")
    if not env:
        return ""
    used = ", ".join(f"{_number(c['inUse'])} of {c['maxCapacity']} {c['capacityUnit']} in use"
                     for c in env["capacity"])  # fmt: skip
    return f"service environment {env['name']} ({env['state']}): {used}"


def share_rows(view: dict, share: str) -> str:
    rows = []
    for row in view["shares"]:
        if share and row["quotaShareName"] != share:
            continue
        strategy = row["strategy"] or ""
        if row.get("borrowLimit") is not None:
            strategy += f" (borrow limit {row['borrowLimit']}%)"
        jobs = row.get("jobs")
        counted = "–" if jobs is None else f"{jobs.get('pending', 0)} / {jobs.get('admitted', 0)}"
        for unit in view["units"]:
            u = row["units"][unit]
            cells = [row["quotaShareName"], strategy, counted, unit, f"{u['inUse']} / {u['limit']}",
                     f"{u['borrowed']} ({_pairs(u['borrowedFrom'])})" if u["borrowed"] else "0",
                     f"{_number(u['lent'])} (to {_pairs(u['lentTo'])})" if u["lent"] else "0",
                     _number(u["idle"])]  # fmt: skip
            rows.append(f'<tr data-share="{_e(row["quotaShareName"])}">'
                        + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + "</tr>")  # fmt: skip
    return "".join(rows)


def _link(first: dict, **changes: Any) -> str:
    params = {"queue": first.get("queue"), "share": first.get("share"),
              "window": first.get("window"), **changes}  # fmt: skip
    return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "", 0)})


def waiting_html(view: dict, first: dict) -> str:
    """Per share (or the filtered one): its waiting jobs' page, then previous / next links."""
    parts = []
    for name, page in view["waiting"].items():
        rows = "".join(
            f'<tr data-job-id="{_e(job["jobId"])}"><td>{page["offset"] + index + 1}</td>'
            f'<td><a class="job" data-job-id="{_e(job["jobId"])}" title="job id '
            f'{_e(job["jobId"])}" href="{_e(_link(first, job=job["jobId"]))}">'
            f"{_e(job['jobLabel'])}</a></td><td>{_e(job['schedulingPriority'])}</td>"
            f'<td><code>{_e(job["waitingReason"]["code"])}</code> '
            f'{_e(job["waitingReason"]["message"])}</td></tr>'
            for index, job in enumerate(page["jobs"]))  # fmt: skip
        table = ('<table class="waiting"><thead><tr><th>#</th><th>job</th><th>priority</th>'
                 f"<th>why it waits</th></tr></thead><tbody>{rows}</tbody></table>" if rows
                 else f'<p class="none">{_e(nothing_waits(name, page))}</p>')  # fmt: skip
        parts.append(f'<div class="share-waiting" data-share="{_e(name)}"><h3>{_e(name)} '
                     f'<span class="sub">{_e(waiting_count(page))}</span></h3>{table}'
                     f"{pager(name, page, first)}</div>")  # fmt: skip
    return "".join(parts)


def nothing_waits(share: str, page: dict) -> str:
    if page["total"] and page["offset"] >= page["total"]:
        return f"no job here: {share} has {page['total']} waiting (offset {page['offset']})"
    return f"no job waits in {share}"


def waiting_count(page: dict) -> str:
    shown = len(page["jobs"])
    if not shown:
        return f"{page['total']} waiting"
    return f"{page['offset'] + 1}-{page['offset'] + shown} of {page['total']} waiting"


def pager(share: str, page: dict, first: dict) -> str:
    """Links to the previous page (`limit` jobs back) and the next (`nextOffset`)."""
    links = []
    if page["offset"] > 0:
        links.append(("previous", max(0, page["offset"] - page["limit"])))
    if page.get("nextOffset") is not None:
        links.append(("next", page["nextOffset"]))
    shown = " ".join(f'<a class="{kind}" data-share="{_e(share)}" data-offset="{offset}" '
                     f'href="{_e(_link(first, share=share, offset=offset))}">{kind}</a>'
                     for kind, offset in links)  # fmt: skip
    return f'<nav class="pager">{shown}</nav>' if links else ""


def activity_items(events: list[dict], share: str) -> str:
    items = []
    for event in events:
        if share and event.get("quotaShareName") != share:
            continue
        ids = [event.get("jobId"), event.get("preemptorJobId")]
        title = "job ids: " + ", ".join(str(i) for i in ids if i)
        when = clock(event.get("at"))
        items.append(f'<li class="{_e(event["kind"])}" data-job-id="{_e(event.get("jobId"))}" '
                     f'title="{_e(title)}">{_e((when + " " if when else "") + event["sentence"])}'
                     "</li>")  # fmt: skip
    return "".join(items) or "nothing dispatched, preempted or ended yet"


def job_html(story: dict | None) -> str:
    if not story:
        return ""
    if "error" in story and "job" not in story:
        return f"<p>{_e(story['error'])}</p>"
    job = story.get("job") or {}
    if job.get("error"):
        summary = job["error"]
    else:
        summary = (f"{story.get('jobLabel') or job.get('jobName')} in {job.get('jobQueue')}/"
                   f"{job.get('quotaShareName')}: {job.get('status')}"
                   + (f" ({job['statusReason']})" if job.get("statusReason") else "")
                   + f", priority {job.get('schedulingPriority')}, attempts "
                   f"{len(job.get('attempts') or [])}")  # fmt: skip
    parts = [f'<p title="job id {_e(story.get("jobId") or "")}">{_e(summary)}</p>']
    attempts = job.get("attempts") or []
    if attempts:
        rows = "".join(
            f"<tr><td>{i + 1}</td><td>{_e(_stamp(a.get('startedAt')))}</td>"
            f"<td>{_e(_stamp(a.get('stoppedAt')))}</td>"
            f"<td>{_e(a.get('statusReason') or '–')}</td></tr>"
            for i, a in enumerate(attempts))  # fmt: skip
        parts.append("<table><thead><tr><td>attempt</td><td>started</td><td>stopped</td>"
                     f"<td>reason</td></tr></thead><tbody>{rows}</tbody></table>")  # fmt: skip
    parts.append(f"<pre>{_e(story.get('text') or '')}</pre>")
    return "".join(parts)


def _stamp(ms: int | None) -> str:
    return clock(ms / 1000) if ms else "–"


def usage_note(usage: dict | None) -> str:
    if not usage:
        return ""
    if not usage.get("available"):
        return usage.get("reason") or ""
    if not usage["series"]:
        return "nothing ran in this job queue yet"
    note = (f"instances in use, stepping at each dispatch, preemption and end (from the "
            f"projection, position {usage.get('position')})")
    if usage.get("truncated"):
        note += "; only the newest steps are drawn"
    return note


def usage_svg(usage: dict | None, share: str = "", width: int = 600, height: int = 220) -> str:
    """The step lines as an inline SVG (the script draws them again with Chart.js): each
    level holds until the next fact's time; the legend gives each line's level now.  Under
    the share filter, that share's line and the total."""
    if not usage or not usage.get("available") or not usage["series"]:
        return ""
    left, right, top, bottom = 34, 10, 26, 24
    t0, t1 = usage["t0"], usage["t1"]
    top_value = max([1] + [y for s in usage["series"] for _, y in s["points"]])
    step = max(1, -(-top_value // 5))
    y_max = -(-top_value // step) * step

    def x(at: float) -> float:
        return left + (at - t0) / max(t1 - t0, 1e-9) * (width - left - right)

    def y(value: float) -> float:
        return top + (1 - value / y_max) * (height - top - bottom)

    parts = [f'<svg id="usage-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
             f'{height}" width="{width}" height="{height}" role="img" '
             'aria-label="instances in use over time">']  # fmt: skip
    for value in range(0, y_max + 1, step):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" '
                     f'y2="{y(value):.1f}" stroke="#eee"/><text x="{left - 4}" '
                     f'y="{y(value) + 4:.1f}" text-anchor="end" font-size="10">{value}</text>')
    for i in range(5):
        at = t0 + (t1 - t0) * i / 4
        parts.append(f'<text x="{x(at):.1f}" y="{height - 8}" text-anchor="middle" '
                     f'font-size="10">{_e(clock(at))}</text>')  # fmt: skip
    legend_x = left
    for index, series in enumerate(usage["series"]):
        if share and series["quotaShareName"] not in (share, None):
            continue
        total = series["quotaShareName"] is None
        colour = TOTAL_COLOUR if total else COLOURS[index % len(COLOURS)]
        (x0, y0), rest = series["points"][0], series["points"][1:]
        path = f"M{x(x0):.1f} {y(y0):.1f}" + "".join(
            f" H{x(at):.1f} V{y(value):.1f}" for at, value in rest)  # fmt: skip
        label = f"{series['label']} ({series['points'][-1][1]} now)"
        dash = ' stroke-dasharray="5 3"' if total else ""
        parts.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}>'
                     f"<title>{_e(label)}</title></path>"
                     f'<text class="legend" x="{legend_x}" y="14" font-size="11" fill="{colour}">'
                     f"{_e(label)}</text>")  # fmt: skip
        legend_x += 14 + 6.5 * len(label)
    parts.append("</svg>")
    return "".join(parts)
