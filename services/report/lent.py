"""The words and tables under each chart: the share legend (limits, strategy), the
one-sentence summary of who borrowed what, and the who-lent-to-whom table (instance-seconds,
exact, from the chart's integrals; a borrower's row adds up to its total borrowed), that table
also as values for the page's JSON.
"""

from __future__ import annotations

from .formatting import _e, _hours, _qty, _swatch
from .model import Chart, Report


def _lent_table(report: Report, chart: Chart) -> str:
    q, unit = chart.job_queue, chart.capacity_unit
    borrowers = [n for n in chart.shares if chart.borrowed_s.get(n, 0.0) > 0]
    if not borrowers:
        return (f'<p class="none">No quota share borrowed {_e(unit)} in this window: every share '
                f"stayed within its own limit.</p>")  # fmt: skip
    lenders = [n for n in chart.shares
               if sum(chart.lent_s.get((b, n), 0.0) for b in borrowers) > 0]  # fmt: skip
    unbacked = any(chart.unbacked_s.get(b, 0.0) > 0 for b in borrowers)
    hours = chart.t1 - chart.t0 >= 3600

    def cell(v: float, cls: str, extra: str = "") -> str:
        text = _qty(v) + (f' <span class="h">{_hours(v)}</span>' if hours and v >= 18 else "")
        return f'<td class="{cls}" data-value="{v!r}"{extra}>{text if v else "–"}</td>'

    def name_cell(name: str) -> str:
        colour = report.shares[(q, name)].colour
        return f'{_swatch(colour, hatched=True)} {_e(name)}'

    out = [f'<table class="lent" data-job-queue="{_e(q)}" data-capacity-unit="{_e(unit)}">',
           f"<caption>Who lent to whom: {_e(unit)} instance-seconds"
           + (" (and instance-hours)" if hours else "") + " borrowed in the window</caption>",
           '<thead><tr><th class="corner">borrower ↓ · lender →</th>']  # fmt: skip
    for lender in lenders:
        colour = report.shares[(q, lender)].colour
        out.append(f'<th class="lender" data-lender="{_e(lender)}">'
                   f'{_swatch(colour)} {_e(lender)}</th>')  # fmt: skip
    if unbacked:
        out.append('<th class="lender" data-lender="">not backed by idle quota</th>')
    out.append('<th class="total">total borrowed</th></tr></thead><tbody>')
    for b in borrowers:
        out.append(f'<tr data-borrower="{_e(b)}"><th>{name_cell(b)}</th>')
        for lender in lenders:
            out.append(cell(chart.lent_s.get((b, lender), 0.0), "lent",
                            f' data-lender="{_e(lender)}"'))  # fmt: skip
        if unbacked:
            out.append(cell(chart.unbacked_s.get(b, 0.0), "lent", ' data-lender=""'))
        out.append(cell(chart.borrowed_s[b], "total"))
        out.append("</tr>")
    out.append('</tbody><tfoot><tr class="lent-total"><th>total lent</th>')
    for lender in lenders:
        out.append(cell(sum(chart.lent_s.get((b, lender), 0.0) for b in borrowers), "lent",
                        f' data-lender="{_e(lender)}"'))  # fmt: skip
    if unbacked:
        out.append(cell(sum(chart.unbacked_s.get(b, 0.0) for b in borrowers), "lent",
                        ' data-lender=""'))  # fmt: skip
    out.append(cell(sum(chart.borrowed_s[b] for b in borrowers), "total"))
    out.append("</tr></tfoot></table>")
    return "".join(out)


def _summary(chart: Chart) -> str:
    """One sentence per borrower: the table, said."""
    sentences = []
    for b in chart.shares:
        total = chart.borrowed_s.get(b, 0.0)
        if total <= 0:
            continue
        sources = sorted(((v, lender) for (bb, lender), v in chart.lent_s.items()
                          if bb == b and v > 0), reverse=True)  # fmt: skip
        parts = [f"{_qty(v)} from {lender}" for v, lender in sources[:3]]
        if len(sources) > 3:
            rest = sum(v for v, _ in sources[3:])
            parts.append(f"{_qty(rest)} from {len(sources) - 3} other shares")
        if chart.unbacked_s.get(b, 0.0) > 0:
            parts.append(f"{_qty(chart.unbacked_s[b])} not backed by idle quota")
        sentences.append(f"<b>{_e(b)}</b> borrowed {_qty(total)} instance-seconds: "
                         + _e(", ".join(parts)) + ".")  # fmt: skip
    return f'<p class="summary">{" ".join(sentences)}</p>' if sentences else ""


def _share_legend(report: Report, chart: Chart) -> str:
    items = []
    for name in chart.shares:
        info = report.shares[(chart.job_queue, name)]
        limits: list[int] = []
        for step in chart.steps:
            if name in step.shares and (not limits or limits[-1] != step.shares[name].limit):
                limits.append(step.shares[name].limit)
        limit = " → ".join(str(v) for v in limits[:6]) + (" …" if len(limits) > 6 else "") \
            if limits else "0"
        what = (info.strategy or "?").replace("_", " ").lower()
        note = ", deleted" if info.deleted else ""
        items.append(
            f'<span class="share" data-share="{_e(name)}">{_swatch(info.colour)}'
            f' <b>{_e(name)}</b> '
            f'<span class="meta">limit {_e(limit)}, {_e(what)}{note}</span></span>'
        )  # fmt: skip
    return f'<div class="shares">{"".join(items)}</div>' if items else ""


def lent_values(chart: Chart) -> dict:
    """The who-lent-to-whom table as the page's JSON carries it (instance-seconds)."""
    return {"borrowed": {b: v for b, v in chart.borrowed_s.items() if v > 0},
            "lent": [[b, lender, v] for (b, lender), v in chart.lent_s.items() if v > 0],
            "unbacked": {b: v for b, v in chart.unbacked_s.items() if v > 0}}  # fmt: skip
