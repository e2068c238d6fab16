"""The words and tables about jobs and capacity under the charts: the over-capacity notes, the
jobs still waiting at the end of the window, and the preemptions, each as HTML and as the
plain values the page's JSON carries (the same rows, for a reader who wants the data).

Long tables keep their first MAX_ROWS rows and say how many more there are (and how to get
them with `quotasched sql`), so a big log still makes a page of a few MB.
"""

from __future__ import annotations

from quotasched.services.explain.story import duration

from .formatting import _e, _qty
from .model import Chart, OverCapacity, Preemption, QueueReport, WaitingJob
from .style import REASONS
from .timeaxis import TimeAxis

MAX_ROWS = 200

RULING_3 = ("Running jobs are not stopped when the capacity is lowered (spec ruling 3: the "
            "service environment is a hard ceiling on what is dispatched, and lowering it "
            "preempts nothing by itself): they ran on above the line, and new work in this "
            "unit waited until usage was back under it.")  # fmt: skip


def over_capacity(chart: Chart, axis: TimeAxis) -> tuple[str, list[dict]]:
    """The note under a chart whose usage went over its capacity, and its values."""
    stretches = chart.over_capacity()
    if not stretches:
        return "", []
    sentences = [_over_sentence(s, axis, chart.capacity_unit) for s in stretches[:20]]
    if len(stretches) > 20:
        sentences.append(f"And {len(stretches) - 20} more stretches over capacity.")
    html = (f'<p class="over"><b>Over capacity.</b> {" ".join(_e(s) for s in sentences)} '
            f"{_e(RULING_3)}</p>")  # fmt: skip
    values = [{"from": s.a, "to": s.b, "mostOver": s.most, "inUse": s.in_use,
               "capacity": s.capacity, "instanceSeconds": s.instance_s} for s in stretches]
    return html, values


def _over_sentence(s: OverCapacity, axis: TimeAxis, unit: str) -> str:
    plural = "s" if s.most != 1 else ""
    return (f"From {axis.stamp(s.a)} to {axis.stamp(s.b)} ({duration(s.b - s.a)}): up to "
            f"{s.most} {unit} instance{plural} in use above the capacity ({s.in_use} in use, "
            f"capacity {s.capacity}); {_qty(s.instance_s)} instance-seconds over in all.")


def _job(name: str | None, job_id: str) -> str:
    """A job by name and id ("train-7 · 4f1c…"), once when they are the same."""
    if not name or name == job_id:
        return f"<code>{_e(job_id)}</code>"
    return f'{_e(name)} <code class="id">{_e(job_id)}</code>'


def _table(cls: str, queue: QueueReport, caption: str, headings: list[str]) -> str:
    """A table's opening, up to its body."""
    cells = "".join(f"<th>{_e(heading)}</th>" for heading in headings)
    return (f'<table class="{cls}" data-job-queue="{_e(queue.job_queue)}"><caption>'
            f"{_e(caption)}</caption><thead><tr>{cells}</tr></thead><tbody>")


def _more(shown: int, total: int, query: str) -> str:
    if total <= shown:
        return ""
    return (f'<p class="more">The first {shown:,} of {total:,} rows; all of them: '
            f"<code>quotasched sql {_e(repr(query))}</code></p>")


def waiting_table(queue: QueueReport, axis: TimeAxis) -> tuple[str, list[dict]]:
    """The jobs waiting at the end of the window (t1), longest waiting first."""
    jobs: list[WaitingJob] = queue.waiting_at_end
    values = [{"jobId": j.job_id, "jobName": j.job_name, "quotaShare": j.quota_share,
               "priority": j.priority, "since": j.since, "sinceText": axis.stamp(j.since),
               "blockedReason": j.blocked_reason, "statusReason": j.status_reason,
               "waitingReason": j.why, "waitingCode": j.why_code}
              for j in jobs[:MAX_ROWS]]  # fmt: skip
    if not jobs:
        return (f'<p class="none">No job of {_e(queue.job_queue)} was waiting at the end of the '
                "window.</p>", values)  # fmt: skip
    caption = (f"Waiting at the end of the window ({axis.stamp(queue.t1)}): {len(jobs):,} "
               f"job{'s' if len(jobs) != 1 else ''}")  # fmt: skip
    out = [_table("waiting", queue, caption, ["job", "share", "priority", "waiting since", "for",
                                              "why it waits", "last status reason"])]
    for j in jobs[:MAX_ROWS]:
        blocked = _e(j.why or j.blocked_reason or "–")
        out.append(f'<tr data-job-id="{_e(j.job_id)}"><td>{_job(j.job_name, j.job_id)}</td>'
                   f"<td>{_e(j.quota_share)}</td><td class=n>{_e(j.priority)}</td>"
                   f"<td>{_e(axis.stamp(j.since))}</td><td>{_e(duration(queue.t1 - j.since))}"
                   f'</td><td class="reason{" blocked" if j.blocked_reason else ""}">{blocked}'
                   f"</td><td class=reason>{_e(j.status_reason or '–')}</td></tr>")  # fmt: skip
    out.append("</tbody></table>")
    out.append(_more(MAX_ROWS, len(jobs), "SELECT job_id, quota_share, priority, status_reason "
                     f"FROM jobs WHERE job_queue = '{queue.job_queue}' AND status = 'RUNNABLE'"))
    return "".join(out), values


def preemption_table(queue: QueueReport, axis: TimeAxis) -> tuple[str, list[dict]]:
    """Every preemption of the queue in the window, in log order."""
    rows: list[Preemption] = queue.preemptions
    values = [{"seq": p.seq, "at": p.at, "atText": axis.stamp(p.at), "jobId": p.job_id,
               "jobName": p.job_name, "attempt": p.attempt, "quotaShare": p.quota_share,
               "preemptorJobId": p.preemptor_job_id, "preemptorName": p.preemptor_name,
               "preemptorShare": p.preemptor_share, "reason": p.reason, "outcome": p.outcome}
              for p in rows[:MAX_ROWS]]  # fmt: skip
    if not rows:
        return (f'<p class="none">No job of {_e(queue.job_queue)} was preempted in the '
                "window.</p>", values)  # fmt: skip
    out = [_table("preemptions", queue, f"Preemptions: {len(rows):,}",
                  ["time", "victim", "its share", "preempted by", "its share", "reason",
                   "outcome"])]  # fmt: skip
    for p in rows[:MAX_ROWS]:
        words = REASONS.get(p.reason, (None, p.reason))[1]
        out.append(f'<tr data-seq="{p.seq}"><td>{_e(axis.stamp(p.at))}</td>'
                   f"<td>{_job(p.job_name, p.job_id)} <span class=meta>attempt {p.attempt}"
                   f"</span></td><td>{_e(p.quota_share)}</td>"
                   f"<td>{_job(p.preemptor_name, p.preemptor_job_id)}</td>"
                   f"<td>{_e(p.preemptor_share or '?')}</td>"
                   f'<td title="{_e(p.reason)}">{_e(words)}</td><td>{_e(p.outcome)}</td></tr>')
    out.append("</tbody></table>")
    out.append(_more(MAX_ROWS, len(rows), "SELECT * FROM preemptions WHERE job_queue = "
                     f"'{queue.job_queue}' ORDER BY seq"))  # fmt: skip
    return "".join(out), values
