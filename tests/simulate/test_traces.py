"""The real traces under traces/ and their converters (traces/README.md, traces/convert/).

For each trace: the schema, the sort order, the row count and the totals against the figures
traces/README.md states (taken from the source, not from the converter's output), and that
`quotasched simulate` runs on a 2-day slice of it.  A trace that is a documented download step
rather than a vendored file (Helios, Acme) is checked the same way once someone has converted
it into traces/; until then those cases skip, and the converters are checked on small files in
the source's documented format.  QUOTASCHED_ITP_SOURCE=path/to/raw-traces.tar.gz also checks
that the ITP converter reproduces the vendored file byte for byte.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from quotasched.services.cli.main import app
from quotasched.services.simulate import read_trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(ROOT, "traces")
CONVERT = os.path.join(TRACES, "convert")
HEADER = ["job_id", "submit_time_s", "duration_s", "gpus", "team", "job_type"]
DAY = 86400


def converter(name: str):
    spec = importlib.util.spec_from_file_location(f"traces_convert_{name}",
                                                  os.path.join(CONVERT, f"{name}.py"))  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Figures:
    """What traces/README.md states for a trace; `exact` figures must match, the others are
    the source's published means and bounds (rounded there, so compared with a tolerance)."""

    file: str
    jobs: int | None = None  # exact row count
    jobs_at_most: int | None = None  # the source's GPU-job count (zero-duration rows dropped)
    teams: int | None = None
    teams_within: frozenset[str] | None = None
    gpu_seconds: int | None = None
    gpu_seconds_rel: float = 0.0  # relative tolerance on gpu_seconds
    duration_sum: float | None = None  # sum of durations, from the source's mean x job count
    duration_tol: float = 0.0
    first_submit: int | None = None
    last_submit: int | None = None
    sizes: dict[int, int] | None = None
    per_team: dict[str, tuple[int, int, int]] | None = None  # jobs, GPU-seconds, largest job
    max_gpus: int | None = None
    max_duration: int | None = None
    readme: tuple[str, ...] = ()  # strings traces/README.md must hold (the figures, as stated)


ITP = Figures(
    file="itp_2021_jobs.csv", jobs=69_351, teams=10, gpu_seconds=5_877_791_065,
    first_submit=1_999, last_submit=5_175_336,
    sizes={1: 57_682, 2: 1_483, 4: 2_371, 8: 7_009, 16: 381, 32: 354, 64: 71},
    per_team={
        "cluster01": (1_595, 81_864_453, 64), "cluster02": (5_778, 445_494_106, 64),
        "cluster03": (3_011, 595_593_077, 64), "cluster04": (15_802, 2_540_458_386, 64),
        "cluster05": (3_629, 51_491_311, 8), "cluster06": (2_396, 445_963_163, 64),
        "cluster07": (12_699, 1_320_479_327, 16), "cluster08": (13_047, 241_559_936, 32),
        "cluster09": (11_134, 140_402_737, 1), "cluster10": (260, 14_484_569, 16),
    },
    readme=("69,351 jobs", "5,877,791,065 GPU-seconds", "1,999 s", "5,175,336 s"),
)  # fmt: skip

VENUS_VCS = frozenset(
    "vc6YE vc8Gr vcEhP vcEwI vcHvQ vcIya vcJLV vcJkd vcJsw vcKeu vcKrE vcLTP vcOhe vcP2J vcWoR "
    "vcYVn vcbIW vccJW vcefl vcgkz vchA3 vchbv vcsBT vcvGl vcvlY".split())  # fmt: skip
HELIOS_VENUS = Figures(
    file="helios_venus_jobs.csv", jobs_at_most=125_303, teams_within=VENUS_VCS,
    gpu_seconds=12_345_612_608, gpu_seconds_rel=1e-6,
    duration_sum=13_040.598 * 125_303, duration_tol=0.0005 * 125_303 + 1,
    readme=("125,303 GPU jobs", "12,345,612,608 GPU-seconds", "13,040.598 s"),
)  # fmt: skip
ACME_KALOS = Figures(
    file="acme_kalos_jobs.csv", jobs_at_most=19_907, gpu_seconds=5_333_180_061,
    gpu_seconds_rel=1e-6, duration_sum=1_259.689 * 19_907, duration_tol=0.0005 * 19_907 + 1,
    max_gpus=1_024, max_duration=625_740,
    readme=("19,907 GPU jobs", "5,333,180,061 GPU-seconds", "1,259.689 s", "625,740 s"),
)  # fmt: skip
ALL = [ITP, HELIOS_VENUS, ACME_KALOS]


def present(figures: Figures) -> str:
    path = os.path.join(TRACES, figures.file)
    if not os.path.exists(path):
        pytest.skip(f"traces/{figures.file} is a download step (traces/README.md), not run here")
    return path


def rows_of(path: str) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        text = handle.read()
    assert text.endswith("\n") and '"' not in text and "\r" not in text
    reader = csv.reader(text.splitlines())
    return next(reader), list(reader)


@pytest.mark.parametrize("figures", ALL, ids=lambda f: f.file)
def test_the_readme_states_the_figures_the_test_checks(figures):
    with open(os.path.join(TRACES, "README.md"), encoding="utf-8") as handle:
        readme = " ".join(handle.read().split())  # a figure may wrap across lines
    assert f"`{figures.file}`" in readme
    for text in figures.readme:
        assert text in readme, f"traces/README.md no longer says {text!r} for {figures.file}"


@pytest.mark.parametrize("figures", ALL, ids=lambda f: f.file)
def test_a_trace_has_the_schema_the_order_and_the_stated_figures(figures):
    header, rows = rows_of(present(figures))
    assert header == HEADER
    assert all(len(row) == 6 for row in rows)
    jobs = [(int(r[1]), r[4], r[0], int(r[2]), int(r[3])) for r in rows]
    assert jobs == sorted(jobs), "rows are sorted by (submit_time_s, team, job_id)"
    assert len({r[0] for r in rows}) == len(rows)
    assert all(d > 0 and g > 0 and s >= 0 for s, _, _, d, g in jobs)
    gpu_seconds = sum(d * g for _, _, _, d, g in jobs)
    teams = Counter(t for _, t, _, _, _ in jobs)
    if figures.jobs is not None:
        assert len(jobs) == figures.jobs
    if figures.jobs_at_most is not None:
        assert 0.9 * figures.jobs_at_most <= len(jobs) <= figures.jobs_at_most
    if figures.teams is not None:
        assert len(teams) == figures.teams
    if figures.teams_within is not None:
        assert set(teams) <= figures.teams_within
    if figures.gpu_seconds is not None:
        assert gpu_seconds == pytest.approx(figures.gpu_seconds, rel=figures.gpu_seconds_rel, abs=0)
    if figures.duration_sum is not None:
        total = sum(d for _, _, _, d, _ in jobs)
        assert total == pytest.approx(figures.duration_sum, abs=figures.duration_tol)
    if figures.first_submit is not None:
        assert (jobs[0][0], jobs[-1][0]) == (figures.first_submit, figures.last_submit)
    if figures.sizes is not None:
        assert dict(Counter(g for *_, g in jobs)) == figures.sizes
    if figures.per_team is not None:
        got = {team: (n, sum(d * g for _, t, _, d, g in jobs if t == team),
                      max(g for _, t, _, _, g in jobs if t == team)) for team, n in teams.items()}
        assert got == figures.per_team
    if figures.max_gpus is not None:
        assert max(g for *_, g in jobs) == figures.max_gpus
        assert max(d for _, _, _, d, _ in jobs) == figures.max_duration


def two_day_config(trace_path: str, out_dir) -> str:
    """A config for a slice: the 19 teams with the most GPU time own a share each, the rest one
    share (at most 20); weights are GPU time; the pool is 60 % of the slice's peak demand."""
    trace = read_trace(trace_path)
    use = Counter()
    for team, gpus, duration in zip(trace.team, trace.gpus, trace.duration):
        use[team] += gpus * duration
    ranked = [team for team, _ in use.most_common()]
    shares = [(team, [team], use[team]) for team in ranked[:19]]
    if ranked[19:]:
        shares.append(("rest", ranked[19:], sum(use[t] for t in ranked[19:])))
    events = sorted([(s, g) for s, g in zip(trace.submit, trace.gpus)]
                    + [(s + d, -g) for s, d, g in zip(trace.submit, trace.duration, trace.gpus)])
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    lines = ["name: two-days", "environment: {instance_type: ml.g5.xlarge, gpus_per_instance: 1, "
             f"max_instances: {max(1, int(0.6 * peak))}}}", "shares:"]  # fmt: skip
    for name, teams, weight in shares:
        lines.append(f"  - {{name: {name}, teams: [{', '.join(teams)}], strategy: LEND_AND_BORROW, "
                     f"borrow_limit: -1, weight: {max(weight, 1.0)}}}")  # fmt: skip
    path = os.path.join(out_dir, "two-days.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def two_day_slice(path: str, out_dir, start_day: int = 7) -> str:
    """Jobs submitted in days [start_day, start_day + 2) of the trace (after its warm-up), with
    times shifted to start at 0; a trace shorter than that gives its first two days."""
    header, rows = rows_of(path)
    first = int(rows[0][1])
    lo = first + start_day * DAY
    if int(rows[-1][1]) < lo + 2 * DAY:
        lo = first
    picked = [r for r in rows if lo <= int(r[1]) < lo + 2 * DAY]
    out = os.path.join(out_dir, "slice.csv")
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(",".join(header) + "\n")
        for r in picked:
            handle.write(",".join([r[0], str(int(r[1]) - lo), *r[2:]]) + "\n")
    return out


def simulate_ok(trace_path: str, out_dir) -> str:
    config = two_day_config(trace_path, out_dir)
    result = CliRunner().invoke(app, ["simulate", "--trace", trace_path, "--config", config,
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "utilization of the pool" in result.stdout
    return result.stdout


@pytest.mark.parametrize("figures", ALL, ids=lambda f: f.file)
def test_simulate_runs_on_two_days_of_a_trace(figures, tmp_path):
    sliced = two_day_slice(present(figures), tmp_path)
    assert len(read_trace(sliced)) > 100
    simulate_ok(sliced, tmp_path)


@pytest.mark.skipif(not os.environ.get("QUOTASCHED_ITP_SOURCE"),
                    reason="QUOTASCHED_ITP_SOURCE (raw-traces.tar.gz) not given")
def test_the_itp_converter_reproduces_the_vendored_file(tmp_path):
    out = tmp_path / "itp.csv"
    converter("itp").main(["--source", os.environ["QUOTASCHED_ITP_SOURCE"], "--out", str(out)])
    with open(os.path.join(TRACES, ITP.file), "rb") as vendored:
        assert out.read_bytes() == vendored.read()


# The converters on small files in the source's documented format (the first three Helios rows
# and the two Acme rows are the examples of the sources' READMEs), with one row per drop reason.

HELIOS_LOG = """\
job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0
1425512,uVMrF,vchbv,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,2020-06-09 18:45:36,249,0
1425513,uzqls,vcpDC,1,1,1,CANCELLED,2020-06-09 18:41:28,2020-06-09 18:41:28,2020-06-17 14:15:21,675233,0
1425400,uXBbc,vcJkd,16,64,2,TIMEOUT,2020-06-08 23:59:59,2020-06-09 00:10:00,2020-06-09 01:10:00,3600,601
1425514,uXBbc,vcJkd,0,4,1,COMPLETED,2020-06-09 19:00:00,2020-06-09 19:00:00,2020-06-09 19:10:00,600,0
1425515,uVMrF,vchbv,2,8,1,CANCELLED,2020-06-09 19:00:01,,,0,5
1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 04:55:09,36848,0
1425516,uVMrF,vchbv,1,8,1,FAILED,yesterday,,,10,0
1425517,uVMrF,vc hb,1,8,1,FAILED,2020-06-09 19:00:02,2020-06-09 19:00:02,2020-06-09 19:00:12,10,0
"""
HELIOS_OUT = """\
job_id,submit_time_s,duration_s,gpus,team,job_type
1425400,86399,3600,16,vcJkd,
1425511,153661,36848,1,vcJkd,
1425512,153687,249,4,vchbv,
1425513,153688,675233,1,vcpDC,
"""

ACME_LOG = """\
job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,gpu_time
dlctk696s0jbvitv,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0
dlc1t2ypl09b8qtp,uf794,8,64,960,1000,100.0,Other,CANCELLED,2023-05-17 11:28:42+00:00,2023-05-17 11:28:54+00:00,2023-05-17 11:30:04+00:00,,2023-05-17 11:30:04+00:00,82,12.0,5248.0
dlcaaaaaaaaaaaa1,u0a11,1,0,16,100,10.0,Other,COMPLETED,2023-05-17 12:00:00+00:00,2023-05-17 12:00:01+00:00,2023-05-17 12:10:01+00:00,,,600,1.0,0.0
dlcaaaaaaaaaaaa2,u0a11,1,8,16,100,10.0,Pretrain,CANCELLED,2023-05-17 12:00:00+00:00,,,,2023-05-17 12:01:00+00:00,,,
dlcaaaaaaaaaaaa3,u0b22,1,8,16,100,10.0,Multi Modal,COMPLETED,2023-05-16 23:59:59+00:00,2023-05-17 00:00:09+00:00,2023-05-17 01:00:09+00:00,,,3600,10.0,28800.0
dlcaaaaaaaaaaaa4,u0b22,1,2.5,16,100,10.0,SFT,COMPLETED,2023-05-17 12:00:00+00:00,2023-05-17 12:00:01+00:00,2023-05-17 12:10:01+00:00,,,600,1.0,1500.0
dlcaaaaaaaaaaaa5,u0b.22,1,1,16,100,10.0,SFT,COMPLETED,2023-05-17 12:00:00+00:00,2023-05-17 12:00:01+00:00,2023-05-17 12:10:01+00:00,,,600,1.0,600.0
"""
ACME_OUT = """\
job_id,submit_time_s,duration_s,gpus,team,job_type
dlcaaaaaaaaaaaa3,86399,3600,8,u0b22,Multi_Modal
dlctk696s0jbvitv,126058,18,64,uf794,Other
dlc1t2ypl09b8qtp,127722,82,64,uf794,Other
"""


def run_converter(name: str, *args: str) -> str:
    result = subprocess.run([sys.executable, os.path.join(CONVERT, f"{name}.py"), *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_helios_converter_keeps_one_cluster_s_gpu_jobs_and_counts_each_drop(tmp_path):
    source = tmp_path / "data.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("data/Venus/cluster_log.csv", HELIOS_LOG)
        archive.writestr("data/Earth/cluster_log.csv", HELIOS_LOG.splitlines()[0] + "\n")
    out = tmp_path / "venus.csv"
    report = run_converter("helios", "--source", str(source), "--out", str(out))
    assert out.read_text() == HELIOS_OUT
    for line in ("rows read: 9", "jobs kept: 4", "dropped, no GPUs (CPU job): 1",
                 "dropped, a job_id or vc that is not 1-128 letters, digits, '-' or '_': 1",
                 "dropped, zero duration: 1", "dropped, job_id seen before: 1",
                 "dropped, a submit time, duration or GPU count that does not parse: 1",
                 "origin (submit_time_s 0): 2020-06-08 00:00:00",
                 "final states kept: COMPLETED 1, FAILED 1, CANCELLED 1, TIMEOUT 1"):  # fmt: skip
        assert line in report, report
    plain = tmp_path / "cluster_log.csv"
    plain.write_text(HELIOS_LOG)
    again = tmp_path / "again.csv"
    run_converter("helios", "--source", str(plain), "--out", str(again))
    assert again.read_text() == HELIOS_OUT
    window = tmp_path / "window.csv"
    report = run_converter("helios", "--source", str(source), "--since", "2020-06-09",
                           "--out", str(window))  # fmt: skip
    assert "dropped, outside --since/--until: 1" in report
    assert window.read_text().splitlines()[1] == "1425511,67261,36848,1,vcJkd,"
    assert read_trace(str(out)).teams() == ["vcJkd", "vchbv", "vcpDC"]


def test_the_acme_converter_keeps_gpu_jobs_with_users_as_teams_and_counts_each_drop(tmp_path):
    source = tmp_path / "trace_kalos.csv"
    source.write_text(ACME_LOG)
    report = run_converter("acme", "--source", str(source), "--out", str(tmp_path / "k.csv"))
    assert (tmp_path / "k.csv").read_text() == ACME_OUT
    for line in ("rows read: 7", "jobs kept: 3", "dropped, no GPUs (CPU job): 1",
                 "dropped, a job_id or user that is not 1-128 letters, digits, '-' or '_': 1",
                 "dropped, zero or missing duration (never ran): 1",
                 "dropped, a GPU count that is missing or not a whole number: 1",
                 "origin (submit_time_s 0): 2023-05-16T00:00:00+00:00"):  # fmt: skip
        assert line in report, report
    trace = read_trace(str(tmp_path / "k.csv"))
    assert trace.teams() == ["u0b22", "uf794"] and trace.job_type[0] == "Multi_Modal"


def test_converter_output_runs_through_simulate(tmp_path):
    source = tmp_path / "trace_seren.csv"
    lines = [ACME_LOG.splitlines()[0]]
    for i in range(300):  # enough jobs over two days for the pool to queue and lend
        day, second = divmod(i * 577, DAY)
        hour, minute = divmod(second // 60, 60)
        stamp = f"2023-03-{1 + day:02d} {hour:02d}:{minute:02d}:{second % 60:02d}+08:00"
        lines.append(f"j{i:05d},u{i % 7},1,{1 + i % 8},8,10,1.0,SFT,COMPLETED,{stamp},{stamp},"
                     f"{stamp},,,{600 + 97 * (i % 40)},0,0")  # fmt: skip
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "seren.csv"
    report = run_converter("acme", "--source", str(source), "--out", str(out))
    assert "jobs kept: 300" in report and "teams: 7" in report
    assert "utilization of the pool" in simulate_ok(str(out), tmp_path)


def test_the_shared_writer_refuses_what_the_reader_would(tmp_path):
    common = converter("common")
    job = common.Job(0, "team", "j1", 10, 1)
    with pytest.raises(common.ConvertError, match="appears twice"):
        common.write_jobs([job, common.Job(5, "team", "j1", 10, 1)], str(tmp_path / "x.csv"))
    with pytest.raises(common.ConvertError, match="duration > 0"):
        common.write_jobs([common.Job(0, "team", "j2", 0, 1)], str(tmp_path / "x.csv"))
    with pytest.raises(common.ConvertError, match="not 1-128"):
        common.check_name("a,b", "job_id", "x:2")
