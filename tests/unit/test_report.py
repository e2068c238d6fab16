"""`quotasched report`: the charts say what the projection says.

Each example command file is replayed (services.replay.replay_lines, events.codec.encode), its
facts projected into DuckDB (projections.rebuild.rebuild_from_file), the report written and
parsed back, and what it draws is compared with the projection's own tables: one chart per job
queue and capacity unit, one series per quota share, borrowed areas exactly where
share_usage.borrowed > 0, one preemption marker per preemptions row, and the who-lent-to-whom
tables adding up to the integral of share_usage.borrowed (and, per lender, to the utilization
rollup's lent_s).  Nothing here needs Chromium: the PNG test is skipped without it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from quotasched.events.codec import encode
from quotasched.projections.rebuild import rebuild_from_file
from quotasched.services import report as report_module
from quotasched.services.cli.main import app
from quotasched.services.replay import replay_lines
from quotasched.services.report import Piece, ReportError, ShareAt, Step, attribute, write_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# The brief's two first; the other two add unbacked borrowing, several queues and a
# heterogeneous job.
SCENARIOS = ("notebook", "two-teams-day", "reclaim-and-retries",
             "blocked-heads-and-capacity-events")  # fmt: skip
REL = 1e-9


def build_db(name: str, directory: Path) -> Path:
    facts = directory / f"{name}.facts.jsonl"
    with open(EXAMPLES / f"{name}.jsonl", "rb") as handle:
        facts.write_text("".join(encode(fact) + "\n" for fact in replay_lines(handle)))
    db = directory / f"{name}.duckdb"
    rebuild_from_file(str(facts), str(db))
    return db


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("report")
    return {name: build_db(name, directory) for name in SCENARIOS}


def parse(path: Path) -> ET.Element:
    text = path.read_text(encoding="utf-8")
    HTMLParser().feed(text)  # an HTML parser takes it ...
    return ET.fromstring(text)  # ... and it is well-formed XML too


def by_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(tag) if cls in (e.get("class") or "").split()]


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1] + 1e-9:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def segments(con, queue: str, unit: str, t0: float, t1: float) -> list[tuple]:
    """share_usage as (share, a, b, borrowed) segments clipped to [t0, t1), zero widths out."""
    rows = con.execute(
        'SELECT quota_share, greatest("at", $t0), least(lead("at", 1, $t1) OVER '
        "(PARTITION BY job_queue, quota_share, capacity_unit ORDER BY seq), $t1), borrowed "
        'FROM share_usage WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1',
        {"q": queue, "u": unit, "t0": t0, "t1": t1}).fetchall()  # fmt: skip
    return [row for row in rows if row[2] > row[1]]


def check_report(con, root: ET.Element, t_from: float | None = None,
                 t_to: float | None = None, queue_filter: str | None = None) -> None:  # fmt: skip
    charts = by_class(root, "svg", "usage")
    keys = [(c.get("data-job-queue"), c.get("data-capacity-unit")) for c in charts]
    expected = con.execute(
        "SELECT DISTINCT job_queue, capacity_unit FROM share_usage UNION "
        "SELECT DISTINCT job_queue, capacity_unit FROM capacity_changes").fetchall()
    if queue_filter is not None:
        expected = [key for key in expected if key[0] == queue_filter]
    assert len(keys) == len(set(keys)), "one chart per (job queue, capacity unit)"
    assert set(keys) == set(expected)

    last_at = con.execute("SELECT last_at FROM projection_state").fetchone()[0]
    markers_total = 0
    for chart, (queue, unit) in zip(charts, keys):
        t0, t1 = float(chart.get("data-t0")), float(chart.get("data-t1"))
        if t_from is not None:
            assert t0 == t_from
        assert t1 == (last_at if t_to is None else min(t_to, last_at))

        # A series per share.
        shares = {row[0] for row in con.execute(
            'SELECT DISTINCT quota_share FROM share_usage WHERE job_queue = $q AND '
            'capacity_unit = $u AND "at" <= $t1', {"q": queue, "u": unit, "t1": t1}).fetchall()}
        series = [g.get("data-share") for g in by_class(chart, "g", "series")]
        assert sorted(series) == sorted(shares), (queue, unit)

        # Borrowed areas exactly where share_usage.borrowed > 0, adding up to it.
        rects = [(r.get("data-share"), float(r.get("data-from")), float(r.get("data-to")),
                  float(r.get("data-amount"))) for r in by_class(chart, "rect", "borrowed")]
        assert all(amount > 0 and b > a for _, a, b, amount in rects)
        rows = segments(con, queue, unit, t0, t1)
        for share in shares:
            drawn = merge([(a, b) for s, a, b, _ in rects if s == share])
            wanted = merge([(a, b) for s, a, b, borrowed in rows if s == share and borrowed > 0])
            assert drawn == wanted, (queue, unit, share)
            for s, a, b, borrowed in rows:
                if s == share:
                    covering = sum(amount for s2, a2, b2, amount in rects
                                   if s2 == share and a2 <= a < b2)  # fmt: skip
                    assert covering == pytest.approx(borrowed, rel=REL, abs=1e-9)

        # Preemption markers: one per preemption of this queue in the window whose victim
        # held this unit.
        marks = by_class(chart, "g", "preemption")
        markers_total += len(marks)
        want = con.execute(
            "SELECT p.seq FROM preemptions p JOIN allocations a USING (job_id, attempt) "
            'WHERE p.job_queue = $q AND a.capacity_unit = $u AND p."at" BETWEEN $t0 AND $t1 '
            "ORDER BY p.seq", {"q": queue, "u": unit, "t0": t0, "t1": t1}).fetchall()  # fmt: skip
        assert [int(m.get("data-seq")) for m in marks] == [row[0] for row in want]
        for m in marks:
            assert m.find("title") is not None and m.get("data-victim") in m.find("title").text

        # Who lent to whom: a row per borrower adding up to its borrowed instance-seconds.
        borrowed_s = {s: 0.0 for s in shares}
        for s, a, b, borrowed in rows:
            borrowed_s[s] += borrowed * (b - a)
        section = next(s for s in by_class(root, "section", "chart")
                       if (s.get("data-job-queue"), s.get("data-capacity-unit")) == (queue, unit))
        tables = by_class(section, "table", "lent")
        if not any(borrowed_s.values()):
            assert not tables and by_class(section, "p", "none")
            continue
        (table,) = tables
        body = {tr.get("data-borrower"): tr for tr in table.find("tbody")}
        assert set(body) == {s for s, v in borrowed_s.items() if v > 0}
        lent_by_lender: dict[str, float] = {}
        for share, tr in body.items():
            cells = tr.findall("td")
            total = float(by_class(tr, "td", "total")[0].get("data-value"))
            parts = [float(td.get("data-value")) for td in by_class(tr, "td", "lent")]
            assert total == pytest.approx(borrowed_s[share], rel=REL)
            assert sum(parts) == pytest.approx(total, rel=REL)
            assert len(cells) == len(parts) + 1
            for td in by_class(tr, "td", "lent"):
                lender = td.get("data-lender")
                value = float(td.get("data-value"))
                lent_by_lender[lender] = lent_by_lender.get(lender, 0.0) + value
        foot = table.find("tfoot").find("tr")
        assert float(by_class(foot, "td", "total")[0].get("data-value")) == pytest.approx(
            sum(borrowed_s.values()), rel=REL)
        # Per lender, the same attribution as the utilization rollup's lent_s.
        rollup = dict(con.execute(
            "SELECT quota_share, sum(lent_s) FROM utilization($t0, $t1, $t1 - $t0 + 1) "
            "WHERE job_queue = $q AND capacity_unit = $u GROUP BY ALL",
            {"q": queue, "u": unit, "t0": t0, "t1": t1}).fetchall())  # fmt: skip
        for lender, lent in lent_by_lender.items():
            if lender:  # "": not backed by any lender's idle quota
                assert lent == pytest.approx(rollup[lender], rel=1e-6), (queue, unit, lender)
        assert sum(v for k, v in rollup.items() if k not in lent_by_lender) == pytest.approx(0)

    if t_from is None and t_to is None:
        count = con.execute("SELECT count(*) FROM preemptions").fetchone()[0]
        assert markers_total == count, "a marker per preemptions row (single-unit victims)"


def check_self_contained(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"https?://", text)
    assert not re.search(r"<script", text, re.I)
    assert not re.search(r"<link\b|@import|@font-face|\bsrc\s*=", text, re.I)
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", text))


@pytest.mark.parametrize("name", SCENARIOS)
def test_report_draws_the_projection(dbs, tmp_path, name):
    out = tmp_path / f"{name}.html"
    write_report(str(dbs[name]), str(out))
    check_self_contained(out)
    root = parse(out)
    con = duckdb.connect(str(dbs[name]), read_only=True)
    try:
        check_report(con, root)
        position, facts = con.execute(
            "SELECT position, facts_applied FROM projection_state").fetchone()
    finally:
        con.close()
    source = by_class(root, "p", "source")[0]
    text = "".join(source.itertext())
    assert str(dbs[name]) in text and f"{facts:,} facts" in text and f"last seq {position}" in text
    assert root.find("head").find("title").text.startswith("quotasched report")
    assert by_class(root, "div", "legend")


def test_window_and_queue_filter(dbs, tmp_path):
    out = tmp_path / "window.html"
    write_report(str(dbs["two-teams-day"]), str(out), job_queues=["training"],
                 t_from=29000, t_to=30050)  # fmt: skip
    root = parse(out)
    assert {c.get("data-job-queue") for c in by_class(root, "svg", "usage")} == {"training"}
    con = duckdb.connect(str(dbs["two-teams-day"]), read_only=True)
    try:
        check_report(con, root, t_from=29000, t_to=30050, queue_filter="training")
    finally:
        con.close()
    seqs = [int(m.get("data-seq")) for m in by_class(root, "g", "preemption")]
    assert seqs == [34]  # the 8:20 reclaim; 8:21:40 is after the window
    # vision borrows 1 from 29000, 2 from 29060; nlp and platform idle 1 each until nlp's
    # reclaim at 30000, then platform alone: 0.5 each for 60 s, 1 each for 940 s, 1 for 50 s.
    (table,) = [t for t in by_class(root, "table", "lent")
                if t.get("data-capacity-unit") == "ml.p4d.24xlarge"]  # fmt: skip
    row = {td.get("data-lender"): float(td.get("data-value"))
           for td in by_class(table.find("tbody")[0], "td", "lent")}  # fmt: skip
    assert row == pytest.approx({"nlp": 30 + 940, "platform": 30 + 940 + 50})


def test_dense_charts_are_drawn_as_averages(dbs, tmp_path, monkeypatch):
    """Past MAX_EXACT_STEPS a chart shows per-column time averages: the same areas (so the
    same instance-seconds per borrower and lender), one hatched band per (borrower, lender)."""
    monkeypatch.setattr(report_module.style, "MAX_EXACT_STEPS", 3)
    db = str(dbs["two-teams-day"])
    made = report_module.build(db)
    for chart in made.charts:
        shown, dense = report_module.frames(chart, 200)
        assert dense == (len(chart.steps) > 3)
        assert len(shown) == 200 if dense else len(shown) == len(chart.steps)
        lent: dict = {}
        for frame in shown:
            for key, amount in frame.pieces.items():
                lent[key] = lent.get(key, 0.0) + amount * (frame.b - frame.a)
        exact = {**chart.lent_s, **{(b, None): v for b, v in chart.unbacked_s.items()}}
        assert lent == pytest.approx(exact, rel=1e-9)
    out = tmp_path / "dense.html"
    write_report(db, str(out))
    check_self_contained(out)
    root = parse(out)
    assert {c.get("data-mode") for c in by_class(root, "svg", "usage")} == {"average"}
    for section in by_class(root, "section", "chart"):
        bands = {(p.get("data-share"), p.get("data-lender"))
                 for p in by_class(section, "path", "borrowed")}  # fmt: skip
        cells = {(tr.get("data-borrower"), td.get("data-lender"))
                 for table in by_class(section, "table", "lent") for tr in table.find("tbody")
                 for td in by_class(tr, "td", "lent") if float(td.get("data-value")) > 0}
        assert bands == cells
        assert not by_class(section, "rect", "borrowed")
        assert "time averages" in "".join(by_class(section, "p", "notes")[0].itertext())


def test_cli_writes_html_and_refuses_bad_requests(dbs, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli.html"
    result = runner.invoke(app, ["report", "--db", str(dbs["notebook"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.exists() and len(by_class(parse(out), "svg", "usage")) == 1
    bad = [
        (["--job-queue", "nope"], "no job queue 'nope'"),
        (["--from", "5", "--to", "5"], "empty time window"),
        (["--out", str(tmp_path / "x.svg")], ".html"),
    ]
    for extra, message in bad:
        args = ["report", "--db", str(dbs["notebook"]), "--out", str(out), *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output
    result = runner.invoke(app, ["report", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "no projection database" in result.output


def test_png_without_chromium_says_to_use_html(dbs, tmp_path, monkeypatch):
    monkeypatch.setattr(report_module.png, "chromium", lambda: None)
    with pytest.raises(ReportError, match=r"--out report\.html"):
        write_report(str(dbs["notebook"]), str(tmp_path / "r.png"))
    result = CliRunner().invoke(app, ["report", "--db", str(dbs["notebook"]),
                                      "--out", str(tmp_path / "r.png")])  # fmt: skip
    assert result.exit_code == 1 and "Chromium" in result.output
    assert not (tmp_path / "r.png").exists()


@pytest.mark.skipif(report_module.chromium() is None, reason="no headless Chromium installed")
def test_png_with_chromium(dbs, tmp_path):
    out = tmp_path / "r.png"
    write_report(str(dbs["notebook"]), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attribution_is_pro_rata_to_idle_quota():
    step = Step(0, 10, 8, {
        "a": ShareAt(in_use=4, limit=2, borrowed=2, lendable_idle=0),
        "b": ShareAt(in_use=0, limit=1, borrowed=0, lendable_idle=1),
        "c": ShareAt(in_use=0, limit=3, borrowed=0, lendable_idle=3),
        "r": ShareAt(in_use=0, limit=2, borrowed=0, lendable_idle=0),  # RESERVE: lends nothing
    })  # fmt: skip
    assert attribute(step) == [Piece("a", "b", 0.5), Piece("a", "c", 1.5)]
    # More borrowed than idle quota (a limit lowered under running jobs): the rest unbacked,
    # the lenders' idle fully lent, every borrower in proportion.
    step.shares["d"] = ShareAt(in_use=6, limit=0, borrowed=6, lendable_idle=0)
    pieces = attribute(step)
    assert sum(p.amount for p in pieces if p.borrower == "a") == pytest.approx(2)
    assert sum(p.amount for p in pieces if p.borrower == "d") == pytest.approx(6)
    assert sum(p.amount for p in pieces if p.lender == "b") == pytest.approx(1)
    assert sum(p.amount for p in pieces if p.lender == "c") == pytest.approx(3)
    assert sum(p.amount for p in pieces if p.lender is None) == pytest.approx(4)
    assert attribute(Step(0, 1, 1, {"a": ShareAt(1, 2, 0, 1)})) == []
