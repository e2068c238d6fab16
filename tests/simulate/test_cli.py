"""`quotasched simulate` and `synth-trace` end to end, with the fact log queried through SQL."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from quotasched.services.cli.main import app
from quotasched.services.simulate import load_config, read_trace, simulate, summarize

CONFIG = """\
name: {name}
environment: {{instance_type: ml.g5.xlarge, gpus_per_instance: 1, max_instances: 24}}
shares:
  - {{name: a, teams: [team1], strategy: {strategy}, weight: 2, in_share_preemption: true}}
  - {{name: b, teams: [team2], strategy: LEND, weight: 1}}
  - {{name: c, teams: [team3], strategy: {strategy}, weight: 1}}
priority: {{kind: job_type, map: {{prod: 5, dev: 1}}}}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    runner = CliRunner()
    result = runner.invoke(app, ["synth-trace", "--jobs", "250", "--seed", "5",
                                 "--out", str(root / "t.csv")])  # fmt: skip
    assert result.exit_code == 0, result.output
    for name, strategy in (("fixed", "RESERVE"), ("borrow", "LEND_AND_BORROW")):
        (root / f"{name}.yaml").write_text(CONFIG.format(name=name, strategy=strategy))
    return root


def sql(db, query: str) -> list[dict]:
    result = CliRunner().invoke(app, ["sql", query, "--db", str(db), "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_simulate_writes_the_fact_log_that_sql_reads(files):
    db = files / "sim.duckdb"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(files / "t.csv"), "--config",
                                      str(files / "borrow.yaml"), "--out", str(db),
                                      "--shares"])  # fmt: skip (progress bars on, as by default)
    assert result.exit_code == 0, result.output
    assert "utilization of the pool" in result.stdout and "borrow: per share" in result.stdout
    assert "simulating borrow" in result.output and "wrote " in result.output
    expected = summarize(simulate(read_trace(str(files / "t.csv")),
                                  load_config(str(files / "borrow.yaml"))))  # fmt: skip
    assert expected.preemptions > 0 and expected.borrowed_gpu_h > 0
    jobs = sql(db, "SELECT count(*) AS n, count(*) FILTER (WHERE status = 'SUCCEEDED') AS ok, "
                   "sum(preemptions) AS preempted FROM jobs")[0]  # fmt: skip
    assert jobs == {"n": 250, "ok": 250, "preempted": expected.preemptions}
    end = int(expected.last_end) + 1
    usage = {row["quota_share"]: row for row in sql(
        db, f"SELECT quota_share, sum(used_h) AS used_h, sum(borrowed_h) AS borrowed_h "
            f"FROM utilization(0, {end}, {end}) GROUP BY 1")}  # fmt: skip
    for share in expected.shares:  # the projection's own arithmetic agrees with the summary
        assert usage[share.name]["used_h"] == pytest.approx(share.used_gpu_h)
        assert usage[share.name]["borrowed_h"] == pytest.approx(share.borrowed_gpu_h)


def test_compare_prints_side_by_side_and_draws_the_chart(files):
    chart = files / "what-if.html"
    result = CliRunner().invoke(app, ["simulate", "--trace", str(files / "t.csv"), "--compare",
                                      str(files / "fixed.yaml"), str(files / "borrow.yaml"),
                                      "--pool", "16", "--pool", "32", "--chart", str(chart),
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "fixed@16" in line)
    assert all(name in header for name in ("fixed@32", "borrow@16", "borrow@32"))
    page = chart.read_text()
    assert page.count("<svg") == 2 and page.count("<path") == 8 and "<script" not in page
    assert "borrow@32" in page


@pytest.mark.parametrize("args, code, message", [
    (["--config", "{f}/nope.yaml"], 2, "cannot read config"),
    (["--config", "{f}/broken.yaml"], 2, "shares.0: borrow_limit can only be applied"),
    (["--compare", "{f}/fixed.yaml", "{f}/borrow.yaml", "--out", "{f}/x.duckdb"], 2,
     "--out writes one simulation's fact log"),
    (["{f}/fixed.yaml", "{f}/borrow.yaml"], 2, "several configurations need --compare"),
    ([], 2, "no configuration"),
    (["--config", "{f}/fixed.yaml", "--chart", "{f}/c.png"], 2, "--chart must name an .html"),
    (["--config", "{f}/fixed.yaml", "--pool", "0"], 2, "at least 1 instance"),
    (["--compare", "{f}/fixed.yaml", "{f}/fixed.yaml"], 2, "two configurations share the name"),
])  # fmt: skip
def test_bad_requests_exit_with_a_clear_message(files, args, code, message):
    (files / "broken.yaml").write_text(
        "name: b\nenvironment: {max_instances: 4}\n"
        "shares: [{name: a, teams: [team1], strategy: LEND, limit: 2, borrow_limit: 5}]\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(files / "t.csv"), "--no-progress",
                                      *(a.format(f=files) for a in args)])  # fmt: skip
    assert result.exit_code == code, result.output
    assert message in result.output


def test_a_bad_trace_exits_2(files):
    (files / "bad.csv").write_text("job_id,submit_time_s,duration_s,gpus,team\na,1,5,x,t\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", str(files / "bad.csv"), "--config",
                                      str(files / "fixed.yaml"), "--no-progress"])  # fmt: skip
    assert result.exit_code == 2
    assert "bad.csv:2: gpus must be an integer, got 'x'" in result.output


@pytest.fixture()
def tiny(tmp_path):
    """Two teams on 4 instances (tests/simulate/test_figures.py works its figures out by hand);
    share a's quota of 1 is lifted to its 3-GPU job, share g's team never submits."""
    (tmp_path / "t.csv").write_text(
        "job_id,submit_time_s,duration_s,gpus,team,job_type\n"
        "j1,100,10,3,ta,\nj2,102,4,1,tb,\nj3,112,3,1,ta,\n")
    (tmp_path / "c.yaml").write_text(
        "name: tiny\nenvironment: {max_instances: 4}\nshares:\n"
        "  - {name: a, teams: [ta], strategy: RESERVE, limit: 1}\n"
        "  - {name: b, teams: [tb], strategy: RESERVE, limit: 2}\n"
        "  - {name: g, teams: [ghost], strategy: RESERVE, limit: 1}\n")
    return tmp_path


def test_lifted_quotas_and_absent_teams_are_warned_about_on_standard_error(tiny):
    # twin: the same shares under another name, so the same warnings, said once for both
    (tiny / "twin.yaml").write_text((tiny / "c.yaml").read_text().replace("tiny", "twin"))
    result = CliRunner().invoke(app, ["simulate", "--trace", str(tiny / "t.csv"), "--compare",
                                      str(tiny / "c.yaml"), str(tiny / "twin.yaml"),
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    errors = result.stderr
    assert "raise_to_largest_job lifted these quotas" in errors.replace("\n", " ")
    rows = [line for line in errors.splitlines() if "│ tiny" in line]
    # configurations, share, teams, configured quota, lifted quota, largest job
    assert [[cell.strip() for cell in row.split("│")[1:-1]] for row in rows] == [
        ["tiny, twin", "a", "ta", "1", "3", "3"]]  # fmt: skip
    # 3 + 2 + 1 = 6 instances of quota on a pool of 4
    assert ("warning: tiny, twin: the quotas total 6 instances after lifting, 2 more than the "
            "pool of 4: oversubscribed by 50.0 %") in errors  # fmt: skip
    assert ("warning: tiny, twin: team ghost (share g, RESERVE) has no job in the trace: the "
            "share holds its 1 instance idle for the whole run (RESERVE lends nothing)") in errors
    assert "warning" not in result.stdout


def test_window_overrides_the_submit_span_for_every_run_and_says_so(tiny):
    # a's lifted quota 3 runs j1 [100, 110) and j3 [112, 115); b runs j2 [102, 106)
    args = ["simulate", "--trace", str(tiny / "t.csv"), "--config", str(tiny / "c.yaml"),
            "--no-progress"]  # fmt: skip
    default = CliRunner().invoke(app, args)
    # [100, 112): 3 x 10 + 1 x 4 = 34 of 4 x 12 = 48: 70.8 %
    assert "utilization over the trace's submit span, 0 s – 12 s after the first submission" in (
        default.stdout)  # fmt: skip
    assert _row(default.stdout, "utilization of the pool") == ["70.8 %"]
    chosen = CliRunner().invoke(app, [*args, "--window", "5:15"])
    # [105, 115): 3 x 5 + 1 x 1 + 1 x 3 = 19 of 4 x 10 = 40: 47.5 %
    assert "utilization over --window, 5 s – 15 s after the first submission" in chosen.stdout
    assert _row(chosen.stdout, "utilization of the pool") == ["47.5 %"]
    assert _row(chosen.stdout, "jobs finished / still waiting") == ["3 / 0"]
    bad = CliRunner().invoke(app, [*args, "--window", "15:5"])
    assert bad.exit_code == 2 and "--window 15:5: END must come after START" in bad.output


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if label in line)
    return [cell.strip() for cell in line.split("│")[2:-1]]


def test_the_per_share_table_never_cuts_a_share_name(files):
    """At 80 columns the per-share table cut names ("cluste…"); the names now stay whole and
    the figures wrap."""
    long = files / "long.yaml"
    long.write_text(CONFIG.format(name="long", strategy="RESERVE")
                    .replace("name: a,", "name: research-vision-a,")
                    .replace("name: b,", "name: research-language-b,"))  # fmt: skip
    result = CliRunner().invoke(app, ["simulate", "--trace", str(files / "t.csv"), "--config",
                                      str(long), "--shares", "--no-progress"],
                                env={"COLUMNS": "80"})  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = result.stdout.split("long: per share", 1)[1]
    assert "research-vision-a" in rows and "research-language-b" in rows, rows
    assert "research-…" not in rows and "resear…" not in rows
