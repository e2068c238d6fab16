"""`quotasched report`: what the page shows is what the facts say.

Two small command files whose facts can be followed by hand give the expectations:
examples/notebook.jsonl (logical times 0..5 s: lending, a cross-share reclaim, an in-share
preemption, two jobs left waiting) and LOWERED below (on the real clock from
2026-12-01T08:00:00Z: the service environment's capacity lowered under three running jobs, a
job that waits behind the ceiling, a blocked one).  Each is replayed
(services.replay.replay_lines), projected (projections.rebuild.rebuild_from_file), the report
written, and the JSON the page carries for Chart.js and its tables (page.report_data) is
compared with the hand-derived values.  The four examples also check invariants against the
projection's own tables (usage, lending, preemptions).  The PNG test runs where Chromium is
installed.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from quotasched.events.codec import encode
from quotasched.projections.rebuild import rebuild_from_file
from quotasched.services import report as report_module
from quotasched.services.cli.main import app
from quotasched.services.projector import api
from quotasched.services.replay import replay_lines
from quotasched.services.report import Piece, ReportError, ShareAt, Step, attribute
from quotasched.services.report import readers, render_html, report_data, write_report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SCENARIOS = ("notebook", "two-teams-day", "reclaim-and-retries",
             "blocked-heads-and-capacity-events")  # fmt: skip
T = 1796112000  # 2026-12-01T08:00:00Z
G5 = "ml.g5.xlarge"


def _limits(n: int) -> list[dict]:
    return [{"capacityUnit": G5, "maxCapacity": n}]


def _share(name: str, limit: int) -> dict:
    return {"at": T, "kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": name,
            "capacityLimits": _limits(limit),
            "resourceSharingConfiguration": {"strategy": "RESERVE"},
            "preemptionConfiguration": {"inSharePreemption": "DISABLED"}}  # fmt: skip


def _submit(minutes: float, job_id: str, share: str, quantity: int = 1, priority: int = 0) -> dict:
    return {"at": T + 60 * minutes, "kind": "SubmitServiceJob", "jobId": job_id, "jobName": job_id,
            "jobQueue": "q", "quotaShareName": share, "schedulingPriority": priority,
            "capacityUsage": [{"capacityUnit": G5, "quantity": quantity}]}  # fmt: skip


def _capacity(minutes: float, n: int) -> dict:
    return {"at": T + 60 * minutes, "kind": "UpdateServiceEnvironment", "serviceEnvironment": "se",
            "capacityLimits": _limits(n)}  # fmt: skip


def _done(minutes: float, job_id: str) -> dict:
    return {"at": T + 60 * minutes, "kind": "ReportJobStatus", "jobId": job_id,
            "status": "SUCCEEDED"}  # fmt: skip


# Two RESERVE shares of 2 in an environment of 4.  08:10 a1, a2 (A) and b1 (B) run: 3 in use.
# 08:30 the capacity drops to 2: nothing is preempted (ruling 3), 1 instance over capacity.
# 08:40 b2 (B, within B's limit) cannot be dispatched: 3 in use >= 2; it waits, not blocked.
# 08:45 a-big (A, 3 instances, priority 7) can never fit 2: blocked, SERVICE_ENVIRONMENT_MAX_
# RESOURCE.  09:00 a1 ends: 2 in use, at the line (b2 would make 3).  09:20 the capacity is
# back at 4: b2 runs; a-big now fits the environment but never A's limit of 2: blocked,
# QUOTA_MANAGEMENT_LIMIT_EXCEEDED.  09:30 b1 ends (the last fact).
LOWERED = [
    {"at": T, "kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": _limits(4)},
    {"at": T, "kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"at": T, "kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
    _share("A", 2), _share("B", 2),
    _submit(10, "a1", "A"), _submit(10, "a2", "A"), _submit(10, "b1", "B"),
    _capacity(30, 2),
    _submit(40, "b2", "B"),
    _submit(45, "a-big", "A", quantity=3, priority=7),
    _done(60, "a1"),
    _capacity(80, 4),
    _done(90, "b1"),
]  # fmt: skip


def build_db(directory: Path, name: str, lines: list[str]) -> Path:
    facts = directory / f"{name}.facts.jsonl"
    facts.write_text("".join(encode(fact) + "\n" for fact in replay_lines(lines)))
    db = directory / f"{name}.duckdb"
    rebuild_from_file(str(facts), str(db))
    return db


@pytest.fixture(scope="module")
def dbs(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("report")
    found = {name: build_db(directory, name, (EXAMPLES / f"{name}.jsonl").read_text().splitlines())
             for name in SCENARIOS}  # fmt: skip
    found["lowered"] = build_db(directory, "lowered", [json.dumps(c) for c in LOWERED])
    return found


def written(db: Path, tmp_path: Path, **options) -> tuple[str, dict]:
    out = tmp_path / "report.html"
    write_report(str(out), str(db), **options)
    text = out.read_text(encoding="utf-8")
    return text, report_data(text)


def value_at(points: list[list[float]], t: float) -> float:
    """The value of a step series at t (it holds from its point to the next one)."""
    return [y for x, y in points if x <= t][-1]


def series(chart: dict) -> dict[str, list]:
    return {d["key"]: d["points"] for d in chart["datasets"]}


def integral(points: list[list[float]]) -> float:
    return sum(y * (b[0] - a[0]) for a, b, y in zip(points, points[1:], (p[1] for p in points)))


BLOCKS = {"p", "div", "section", "td", "th", "tr", "caption", "h1", "h2", "h3", "br"}


class Page(HTMLParser):
    """The page's text (scripts and styles left out), its tags and their attributes."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self._skip = 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._skip += tag in ("script", "style")
        if tag in BLOCKS:
            self.text.append(" ")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)

    def words(self) -> str:
        return " ".join("".join(self.text).split())


# -- the notebook: logical times, lending, preemptions, waiting -------------------------------


def test_a_log_on_logical_time_is_shown_as_time_since_its_first_fact(dbs, tmp_path):
    html, data = written(dbs["notebook"], tmp_path)
    words = Page(html).words()
    assert "first fact +0 s (t=0 s), last fact +5 s (t=5 s)" in words
    assert "not clock times" in words and "UTC" not in words
    assert data["time"]["mode"] == "elapsed"
    (chart,) = [c for c in data["charts"] if c["kind"] == "usage"]
    labels = [tick["label"] for tick in chart["ticks"]]
    assert labels[0] == "+0 s" and labels[-1] == "+5 s" and "+2.5 s" in labels
    assert not any(re.fullmatch(r"\d+:\d\d", label) for label in labels)  # no clock "0:05"
    assert "since the first fact" in data["time"]["title"]


def test_notebook_usage_lending_waiting_and_preemptions(dbs, tmp_path):
    _, data = written(dbs["notebook"], tmp_path)
    (chart,) = [c for c in data["charts"] if c["kind"] == "usage"]
    assert (chart["jobQueue"], chart["capacityUnit"], chart["t0"], chart["t1"]) == ("q", G5, 0, 5)
    s = series(chart)
    # high runs from 1, med from 2 on qs2's idle quota (qs1's limit is 1), b1 reclaims at 4.
    assert [value_at(s["own:qs1"], t) for t in (0.5, 1.5, 2.5, 4.5)] == [0, 1, 1, 1]
    assert [value_at(s["borrowed:qs1"], t) for t in (0.5, 1.5, 2.5, 4.5)] == [0, 0, 1, 0]
    assert [value_at(s["own:qs2"], t) for t in (2.5, 4.5)] == [0, 1]
    assert {value for _, value in s["capacity"]} == {3}
    assert "over" not in s and chart["overCapacity"] == []
    # qs2 (LEND) lent med its idle instance from 2 to 4; qs3 (RESERVE) lends nothing.
    assert chart["lent"] == {"borrowed": {"qs1": 2.0}, "lent": [["qs1", "qs2", 2.0]],
                             "unbacked": {}}  # fmt: skip
    marks = {d["key"]: [(p["x"], p["text"]) for p in d["points"]]
             for d in chart["datasets"] if d["kind"] == "marker"}  # fmt: skip
    assert [x for x, _ in marks["preemption:CROSS_SHARE_RECLAIM"]] == [4]
    assert [x for x, _ in marks["preemption:IN_SHARE_PRIORITY"]] == [5]

    (queue,) = data["queues"]
    rows = [(p["at"], p["jobName"], p["jobId"], p["quotaShare"], p["preemptorName"],
             p["preemptorShare"], p["reason"], p["outcome"]) for p in queue["preemptions"]]
    assert rows == [(4, "med", "med", "qs1", "b1", "qs2", "CROSS_SHARE_RECLAIM", "REQUEUED"),
                    (5, "high", "high", "qs1", "low", "qs1", "IN_SHARE_PRIORITY", "REQUEUED")]
    # low waits from 3 (qs2's idle instance is lent to med), med from 4, high from 5 (low ran).
    waiting = series(data["charts"][queue["waitingChart"]])
    assert [value_at(waiting["waiting:qs1"], t) for t in (2.5, 3.5, 4.5)] == [0, 1, 2]
    left = [(j["jobId"], j["quotaShare"], j["priority"], j["since"], j["blockedReason"],
             j["statusReason"]) for j in queue["waitingAtEnd"]]
    assert left == [("med", "qs1", 2, 4, None, "Preempted by job b1 (CROSS_SHARE_RECLAIM)"),
                    ("high", "qs1", 3, 5, None, "Preempted by job low (IN_SHARE_PRIORITY)")]
    # why each waits at the end, by hand: high heads qs1 and could only borrow (qs2 runs b1,
    # qs3 is RESERVE); med is behind it.  The core's words, as explain and the web view say.
    why = {j["jobId"]: (j["waitingCode"], j["waitingReason"]) for j in queue["waitingAtEnd"]}
    assert why["high"][0] == "no_idle_lendable" and why["med"][0] == "behind_higher_priority"
    assert why["med"][1].startswith("med waits (RUNNABLE): it is behind higher-priority job high")


def test_the_tables_are_on_the_page_not_only_in_tooltips(dbs, tmp_path):
    words = Page(written(dbs["notebook"], tmp_path)[0]).words()
    assert ("+4 s (t=4 s) med attempt 1 qs1 b1 qs2 cross-share reclaim REQUEUED" in words)
    assert "+5 s (t=5 s) high attempt 1 qs1 low qs1 in-share priority REQUEUED" in words
    assert "Waiting at the end of the window (+5 s (t=5 s)): 2 jobs" in words
    assert "med qs1 2 +4 s (t=4 s) 1 s" in words


# -- LOWERED: the real clock, capacity lowered under running jobs, blocked jobs ---------------


def test_a_log_on_the_real_clock_is_shown_in_utc(dbs, tmp_path):
    html, data = written(dbs["lowered"], tmp_path)
    words = Page(html).words()
    assert "first fact 2026-12-01T08:00:00Z, last fact 2026-12-01T09:30:00Z" in words
    assert "Times are UTC." in words and "1.79" not in words
    assert data["time"] == {"mode": "utc", "origin": T, "title": "time (UTC)"}
    (chart,) = [c for c in data["charts"] if c["kind"] == "usage"]
    ticks = {tick["value"]: tick["label"] for tick in chart["ticks"]}
    assert ticks[T] == "2026-12-01 08:00" and ticks[T + 1800] == "08:30"
    assert ticks[T + 5400] == "09:30"


def test_usage_over_a_lowered_capacity_is_flagged_not_drawn_as_fine(dbs, tmp_path):
    html, data = written(dbs["lowered"], tmp_path)
    (chart,) = [c for c in data["charts"] if c["kind"] == "usage"]
    s = series(chart)
    minutes = (20, 35, 70, 85)
    assert [value_at(s["own:A"], T + 60 * m) for m in minutes] == [2, 2, 1, 1]
    assert [value_at(s["own:B"], T + 60 * m) for m in minutes] == [1, 1, 1, 2]
    assert [value_at(s["capacity"], T + 60 * m) for m in minutes] == [4, 2, 2, 4]
    assert [value_at(s["over"], T + 60 * m) for m in minutes] == [0, 1, 0, 0]
    assert not [k for k in s if k.startswith("borrowed:")]  # RESERVE shares never borrow
    over = next(d for d in chart["datasets"] if d["key"] == "over")
    assert over["stack"] == "capacity" and over["colour"] == "#d62728"
    assert chart["overCapacity"] == [{"from": T + 1800, "to": T + 3600, "mostOver": 1,
                                      "inUse": 3, "capacity": 2, "instanceSeconds": 1800}]
    words = Page(html).words()
    assert ("Over capacity. From 2026-12-01T08:30:00Z to 2026-12-01T09:00:00Z (30 min): up to "
            "1 ml.g5.xlarge instance in use above the capacity (3 in use, capacity 2)") in words
    assert "Running jobs are not stopped when the capacity is lowered (spec ruling 3" in words


def test_waiting_and_blocked_jobs_appear(dbs, tmp_path):
    _, data = written(dbs["lowered"], tmp_path)
    (queue,) = data["queues"]
    waiting = series(data["charts"][queue["waitingChart"]])
    minutes = (30, 42, 50, 85)
    assert [value_at(waiting["waiting:B"], T + 60 * m) for m in minutes] == [0, 1, 1, 0]
    assert [value_at(waiting["blocked:A"], T + 60 * m) for m in minutes] == [0, 0, 1, 1]
    assert [value_at(waiting["waiting:A"], T + 60 * m) for m in minutes] == [0, 0, 0, 0]
    (job,) = queue["waitingAtEnd"]
    assert (job["jobId"], job["quotaShare"], job["priority"], job["since"], job["sinceText"]) \
        == ("a-big", "A", 7, T + 2700, "2026-12-01T08:45:00Z")  # fmt: skip
    # the environment fits 3 again from 09:20, A's limit of 2 never does
    assert job["blockedReason"].startswith("MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED")
    assert queue["preemptions"] == []


def test_a_window_in_iso_times_from_the_command_line(dbs, tmp_path):
    out = tmp_path / "window.html"
    result = CliRunner().invoke(app, ["report", "--db", str(dbs["lowered"]), "--out", str(out),
                                      "--from", "2026-12-01T08:30", "--to",
                                      "2026-12-01T09:00:00Z"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (chart,) = [c for c in report_data(out.read_text())["charts"] if c["kind"] == "usage"]
    assert (chart["t0"], chart["t1"]) == (T + 1800, T + 3600)


# -- every example against the projection's own tables ----------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_charts_add_up_to_the_projection(dbs, tmp_path, name):
    """Per chart, each share's own + borrowed integrates to its share_usage in_use; the
    lending adds up to share_usage.borrowed and, per lender, to the rollup's lent_s; every
    preemption is a table row."""
    _, data = written(dbs[name], tmp_path)
    con = duckdb.connect(str(dbs[name]), read_only=True)
    try:
        expected = con.execute("SELECT DISTINCT job_queue, capacity_unit FROM share_usage UNION "
                               "SELECT DISTINCT job_queue, capacity_unit FROM capacity_changes"
                               ).fetchall()  # fmt: skip
        charts = [c for c in data["charts"] if c["kind"] == "usage"]
        assert sorted((c["jobQueue"], c["capacityUnit"]) for c in charts) == sorted(expected)
        for chart in charts:
            check_chart(con, chart)
        rows = con.execute("SELECT count(*) FROM preemptions").fetchone()[0]
        assert sum(len(q["preemptions"]) for q in data["queues"]) == rows
    finally:
        con.close()


def check_chart(con, chart: dict) -> None:
    params = {"q": chart["jobQueue"], "u": chart["capacityUnit"], "t0": chart["t0"],
              "t1": chart["t1"]}  # fmt: skip
    used = _used(con, params)
    s = series(chart)
    for share, seconds in used.items():
        drawn = integral(s.get(f"own:{share}", [])) + integral(s.get(f"borrowed:{share}", []))
        assert drawn == pytest.approx(seconds, rel=1e-9, abs=1e-9), (chart["jobQueue"], share)
    lent = chart["lent"]
    for borrower, total in lent["borrowed"].items():
        parts = sum(v for b, _, v in lent["lent"] if b == borrower)
        assert parts + lent["unbacked"].get(borrower, 0) == pytest.approx(total, rel=1e-9)
    rollup = dict(con.execute(
        "SELECT quota_share, sum(lent_s) FROM utilization($t0, $t1, $t1 - $t0 + 1) "
        "WHERE job_queue = $q AND capacity_unit = $u GROUP BY ALL", params).fetchall())
    for lender, seconds in rollup.items():
        ours = sum(v for _, lent_by, v in lent["lent"] if lent_by == lender)
        assert ours == pytest.approx(seconds, rel=1e-6, abs=1e-6), (chart["jobQueue"], lender)


def _used(con, params: dict) -> dict[str, float]:
    """Instance-seconds each share held over [t0, t1], from share_usage segments."""
    rows = con.execute(
        'SELECT quota_share, greatest("at", $t0), least(lead("at", 1, $t1) OVER '
        "(PARTITION BY quota_share ORDER BY seq), $t1), in_use FROM share_usage "
        'WHERE job_queue = $q AND capacity_unit = $u AND "at" <= $t1', params).fetchall()
    used: dict[str, float] = {}
    for share, a, b, in_use in rows:
        used[share] = used.get(share, 0.0) + in_use * max(0.0, b - a)
    return used


def test_dense_charts_are_averaged_keeping_their_instance_seconds(dbs, tmp_path, monkeypatch):
    exact = written(dbs["two-teams-day"], tmp_path)[1]
    monkeypatch.setattr(report_module.style, "MAX_EXACT_STEPS", 3)
    monkeypatch.setattr(report_module.style, "AVERAGE_COLUMNS", 50)
    html, dense = written(dbs["two-teams-day"], tmp_path)
    assert "time averages over equal columns" in Page(html).words()
    for before, after in zip(exact["charts"], dense["charts"]):
        assert after["averaged"] and len(after["datasets"][0]["points"]) == 51
        for key, points in series(after).items():
            if not key.startswith("preemption:"):
                assert integral(points) == pytest.approx(integral(series(before)[key]), rel=1e-6)


# -- one file, offline ------------------------------------------------------------------------


def test_the_page_is_one_file_that_loads_nothing(dbs, tmp_path):
    html, data = written(dbs["two-teams-day"], tmp_path)
    page = Page(html)
    for tag, attrs in page.tags:
        assert tag not in ("link", "img", "iframe", "object"), tag
        assert "src" not in attrs and not (attrs.get("href") or "").startswith(("http", "//"))
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert not re.search(r"@import|url\(", "".join(styles))
    vendored = (resources.files("quotasched.services.web") / "static" / "vendor"
                / "chart.umd.min.js").read_text(encoding="utf-8")  # fmt: skip
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    assert vendored in scripts and html.count("Chart.js v4.6.1") == 1
    assert [tag for tag, _ in page.tags].count("canvas") == len(data["charts"])


def test_scripts_that_could_close_their_element_are_refused():
    with pytest.raises(ValueError):
        report_module.script.inline("x = '</script>'")


# -- the two readers --------------------------------------------------------------------------


def test_the_projector_reader_runs_the_same_queries_and_pages(dbs, monkeypatch):
    """Through the projector's own `sql` answer (api.run, api.encode at a small message size),
    two rows a page: the same report as from the file."""
    db = str(dbs["two-teams-day"])
    monkeypatch.setattr(readers, "PAGE_ROWS", 2)
    con = duckdb.connect(db, read_only=True)
    asked: list[str] = []

    def ask(statement: str, limit: int) -> dict:
        asked.append(statement)
        answer = api.run(con.cursor(), "sql", {"sql": statement, "limit": limit})
        return json.loads(api.encode(answer, max_bytes=1500))

    try:
        from_file = report_module.load(readers.DuckDBReader(con, db))
        over_nats = report_module.load(readers.ProjectorReader(ask, db))
    finally:
        con.close()
    assert render_html(over_nats) == render_html(from_file)
    assert any(" OFFSET " in statement for statement in asked)
    assert all("$" not in statement for statement in asked)


def test_parameters_become_exact_literals():
    assert readers.bind("SELECT $q, $t, $n, $names, $none",
                        {"q": "it's", "t": 0.1, "n": 7, "names": ["a", "b'"], "none": None}) \
        == "SELECT 'it''s', 0.1::DOUBLE, 7, ['a', 'b'''], NULL"  # fmt: skip
    con = duckdb.connect()
    value = 1796112000.123456
    assert con.execute(readers.bind("SELECT $t", {"t": value})).fetchone()[0] == value


# -- the command line -------------------------------------------------------------------------


def test_cli_writes_html_and_refuses_bad_requests(dbs, tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "cli.html"
    monkeypatch.setenv("QUOTASCHED_NATS_URL", "nats://127.0.0.1:1")  # --db comes first
    result = runner.invoke(app, ["report", "--db", str(dbs["notebook"]), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 chart, 2 preemptions" in result.output
    bad = [
        (["--job-queue", "nope"], "no job queue 'nope'"),
        (["--from", "5", "--to", "5"], "empty time window"),
        (["--from", "yesterday"], "ISO time"),
        (["--out", str(tmp_path / "x.svg")], ".html"),
    ]
    for extra, message in bad:
        args = ["report", "--db", str(dbs["notebook"]), "--out", str(out), *extra]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (extra, result.output)
        assert message in result.output
    result = runner.invoke(app, ["report", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 2 and "no projection database" in result.output
    monkeypatch.delenv("QUOTASCHED_NATS_URL")
    monkeypatch.delenv("QUOTASCHED_PROJECTION_DB", raising=False)
    result = runner.invoke(app, ["report", "--out", str(out)])
    assert result.exit_code == 2 and "--db PATH" in result.output and "--nats-url" in result.output


def test_a_file_held_by_a_projector_points_to_nats_url(dbs, tmp_path):
    db = tmp_path / "held.duckdb"
    db.write_bytes(dbs["notebook"].read_bytes())
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; "
                               f"c = duckdb.connect({str(db)!r}); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        result = CliRunner().invoke(app, ["report", "--db", str(db), "--out",
                                          str(tmp_path / "r.html")])  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 2, result.output
    assert "held by a running projector" in result.output and "--nats-url" in result.output


# -- the PNG ----------------------------------------------------------------------------------


def test_png_without_chromium_says_to_use_html(dbs, tmp_path, monkeypatch):
    monkeypatch.setattr(report_module.png, "chromium", lambda: None)
    with pytest.raises(ReportError, match=r"--out report\.html"):
        write_report(str(tmp_path / "r.png"), str(dbs["notebook"]))
    result = CliRunner().invoke(app, ["report", "--db", str(dbs["notebook"]),
                                      "--out", str(tmp_path / "r.png")])  # fmt: skip
    assert result.exit_code == 1 and "Chromium" in result.output
    assert not (tmp_path / "r.png").exists()


@pytest.mark.skipif(report_module.chromium() is None, reason="no headless Chromium installed")
def test_png_with_chromium_is_cropped_to_the_content(dbs, tmp_path):
    out = tmp_path / "r.png"
    write_report(str(out), str(dbs["notebook"]))
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    # header, one usage and one waiting chart, three short tables: about 1,300 px, not a
    # screen-high guess with half of it white
    assert width == report_module.png.WIDTH and 900 < height < 1800, height


@pytest.mark.skipif(report_module.chromium() is None, reason="no headless Chromium installed")
def test_png_of_a_page_wider_than_the_window_is_not_cut(tmp_path):
    """The report's PNG cropped its wide tables at the window's edge: the page says how wide
    it is (data-content-width, as the report's script does) and the screenshot is that wide."""
    page = tmp_path / "wide.html"
    page.write_text(
        "<html><body style='margin:0'><main><table><tr><td style='min-width:2000px'>wide"
        "</td><td id='end'>the end</td></tr></table></main><script>"
        "const e = document.documentElement; e.dataset.contentHeight = '300';"
        "e.dataset.contentWidth = String(e.scrollWidth);</script></body></html>")  # fmt: skip
    out = tmp_path / "wide.png"
    report_module.png.html_to_png(str(page), str(out))
    width, height = struct.unpack(">II", out.read_bytes()[16:24])
    assert width > 2000 and height == 300, (width, height)
    from quotasched.services.report.script import DRAW_JS

    assert "dataset.contentWidth" in DRAW_JS  # the report's page says it


def test_no_two_legend_entries_share_a_colour():
    """The capacity line and in-share preemption markers were both black."""
    from quotasched.services.report import style

    colours = [style.CAPACITY, style.OVER, *(colour for colour, _ in style.REASONS.values()),
               style.OTHER_REASON[0]]
    assert len(set(colours)) == len(colours), colours
    assert not set(colours) & set(style.PALETTE)  # nor a share's colour


# -- attribution ------------------------------------------------------------------------------


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


def test_clock_ticks_are_round_utc_times_dated_on_each_new_day():
    axis = report_module.TimeAxis(T, T + 86400)
    labels = [tick["label"] for tick in axis.ticks(T + 12 * 3600, T + 24 * 3600)]
    # 12 h cut in at most 10: every 2 h, from 08:00 + 12 h to 08:00 the next day
    assert labels == ["2026-12-01 20:00", "22:00", "2026-12-02 00:00", "02:00", "04:00", "06:00",
                      "08:00"]  # fmt: skip
    fast = report_module.TimeAxis(T + 0.25, T + 0.31)  # a live service's whole log, 60 ms
    assert [tick["label"] for tick in fast.ticks(T + 0.25, T + 0.31)][:2] == [
        "2026-12-01 08:00:00.25", "08:00:00.26"]
    assert fast.stamp(T + 0.25) == "2026-12-01T08:00:00.250Z"
