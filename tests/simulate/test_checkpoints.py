"""Checkpoints in a simulation (issue 33 point 2): a preempted attempt loses the work since its
last checkpoint plus the restart overhead, its next attempt runs the work left plus that
overhead, and the loss is reported with and without checkpoints.  Every expectation is worked
out by hand from the model in services/simulate/checkpoints.py:

    an attempt preempted after t s, begun with r s of overhead (0 on a first attempt), last
    checkpointed at c (the largest multiple of the interval <= t): work kept max(0, c - r),
    lost t - kept - r + o (o: the overhead its next attempt pays), next attempt: the work
    left + o; without checkpoints the attempt's whole t is lost.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from quotasched.services.cli.main import app
from quotasched.services.simulate import ConfigError, simulate, summarize
from quotasched.services.simulate.checkpoints import (CheckpointError, CheckpointOptions,
                                                      describe, job_intervals, parse_duration,
                                                      parse_options)  # fmt: skip
from quotasched.services.simulate.config import CheckpointClass
from tests.simulate.builders import config, trace

H, MIN = 3600.0, 60.0

# A pool of 4 one-GPU instances; a (team ta) borrows, b (team tb) lends 2.  x fills a's own 2
# instances for 40 h; y (2 GPUs, 10 h) borrows b's 2 from t=0; each z (2 GPUs, 1 h, team tb)
# reclaims them at once, preempting y, which restarts (borrowing again) when z ends.
SHARES = [
    {"name": "a", "teams": ["ta"], "strategy": "LEND_AND_BORROW", "limit": 2},
    {"name": "b", "teams": ["tb"], "strategy": "LEND", "limit": 2},
]


def reclaimed(*z_at: float, **checkpoints):
    """y reclaimed by one z at each of `z_at` (seconds), under the checkpoint keys given."""
    rows = [("x", 0, 40 * H, 2, "ta"), ("y", 0, 10 * H, 2, "ta")]
    rows += [(f"z{i}", at, 1 * H, 2, "tb") for i, at in enumerate(z_at, start=1)]
    run = simulate(trace(*rows), config(SHARES, 4, **checkpoints))
    return run, dict(zip(run.trace.job_ids, range(len(rows))))["y"]


def test_the_issue_example_loses_half_an_hour_and_the_overhead_and_resumes_shorter():
    # 10 h job, 1 h interval, 6 min overhead, preempted at 3.5 h: checkpoints at 1, 2, 3 h;
    # lost 0.5 h since the last + 0.1 h overhead = 0.6 h x 2 GPUs = 1.2 GPU-h (without
    # checkpoints the whole 3.5 h x 2 = 7 GPU-h).  z runs 3.5-4.5 h; y's next attempt runs
    # the 7 h left + 0.1 h overhead: 4.5 + 7.1 = 11.6 h.  It ran 3.5 + 7.1 = 10.6 h.
    run, y = reclaimed(3.5 * H, checkpoint_interval_s=H, checkpoint_overhead_s=6 * MIN)
    assert run.preemptions[y] == 1
    assert run.end[y] == pytest.approx(11.6 * H)
    assert run.lost[y] == pytest.approx(0.6 * H) and run.lost_whole[y] == pytest.approx(3.5 * H)
    assert run.ran[y] == pytest.approx(10.6 * H)
    # work kept: the first 3 h, then 4.6-11.6 h (after the 0.1 h reload): 10 h in all
    kept = sorted((lo, hi) for j, lo, hi in run.kept if j == y)
    assert kept == [pytest.approx((0, 3 * H)), pytest.approx((4.6 * H, 11.6 * H))]
    summary = summarize(run)
    assert summary.lost_gpu_h == pytest.approx(1.2) and summary.lost_whole_gpu_h == pytest.approx(7)
    assert summary.checkpoints == "every 1 h; restart overhead 6 min"


@pytest.mark.parametrize("extra", [{}, {"checkpoint_overhead_s": 6 * MIN}])
def test_without_an_interval_nothing_changes_and_both_figures_are_the_whole_attempt(extra):
    # No interval: y restarts from zero at 4.5 h and ends at 14.5 h, losing its 3.5 h x 2
    # GPUs both ways; an overhead alone changes nothing (only checkpointing jobs pay it).
    run, y = reclaimed(3.5 * H, **extra)
    assert run.end[y] == pytest.approx(14.5 * H)
    assert run.lost[y] == run.lost_whole[y] == pytest.approx(3.5 * H)
    summary = summarize(run)
    assert summary.lost_gpu_h == summary.lost_whole_gpu_h == pytest.approx(7)
    assert summary.checkpoints == "none"


def test_interval_zero_on_the_command_line_turns_a_configurations_checkpoints_off():
    c = config(SHARES, 4, checkpoint_interval_s=H, checkpoint_overhead_s=6 * MIN)
    off = CheckpointOptions(interval_s=0.0).apply(c)
    assert off.checkpoint_interval_s is None
    t = trace(("x", 0, 40 * H, 2, "ta"), ("y", 0, 10 * H, 2, "ta"), ("z", 3.5 * H, H, 2, "tb"))
    plain, turned_off = simulate(t, config(SHARES, 4)), simulate(t, off)
    for field in ("first_start", "end", "ran", "lost", "lost_whole", "kept", "usage_levels"):
        assert getattr(turned_off, field) == getattr(plain, field), field


def test_an_interval_longer_than_the_attempt_keeps_nothing_and_still_costs_the_overhead():
    # 5 h interval, preempted at 3.5 h: no checkpoint yet.  Lost 3.5 h + 0.1 h overhead =
    # 3.6 h (more than the 3.5 h without checkpoints: the restart costs the reload anyway);
    # the next attempt runs 10 h + 0.1 h from 4.5 h: ends 14.6 h.
    run, y = reclaimed(3.5 * H, checkpoint_interval_s=5 * H, checkpoint_overhead_s=6 * MIN)
    assert run.lost[y] == pytest.approx(3.6 * H) and run.lost_whole[y] == pytest.approx(3.5 * H)
    assert run.end[y] == pytest.approx(14.6 * H)


def test_preempted_exactly_at_a_checkpoint_loses_only_the_overhead():
    # 30 min interval, preempted at 3.5 h = the 7th checkpoint: all 3.5 h kept; lost 0.1 h;
    # the next attempt runs 6.5 h + 0.1 h from 4.5 h: ends 11.1 h.
    run, y = reclaimed(3.5 * H, checkpoint_interval_s=30 * MIN, checkpoint_overhead_s=6 * MIN)
    assert run.lost[y] == pytest.approx(0.1 * H)
    assert run.end[y] == pytest.approx(11.1 * H)


def test_a_job_preempted_twice_checkpoints_on_its_resumed_attempts_own_clock():
    # First preemption at 3.5 h as in the issue example (lost 0.6 h; 7 h left).  The second
    # attempt starts at 4.5 h with 7.1 h to run; z2 at 7 h preempts it after 2.5 h of its own
    # run time: checkpoints at its 1 h and 2 h, of which 0.1 h was the reload, so 1.9 h of
    # work kept (5.1 h left) and lost 0.5 h + the next 0.1 h = 0.6 h.  z2 runs 7-8 h; the
    # third attempt runs 5.1 + 0.1 = 5.2 h: ends 13.2 h.  Ran 3.5 + 2.5 + 5.2 = 11.2 h =
    # 10 h + 1.2 h lost; without checkpoints 3.5 + 2.5 = 6 h lost.
    run, y = reclaimed(3.5 * H, 7 * H, checkpoint_interval_s=H, checkpoint_overhead_s=6 * MIN)
    assert run.preemptions[y] == 2
    assert run.end[y] == pytest.approx(13.2 * H)
    assert run.lost[y] == pytest.approx(1.2 * H) and run.lost_whole[y] == pytest.approx(6 * H)
    assert run.ran[y] == pytest.approx(11.2 * H)


def test_an_overhead_longer_than_the_attempt_is_not_charged_twice():
    # 30 min overhead.  First preemption at 3.5 h: lost 0.5 h + 0.5 h = 1 h, 7 h left, the
    # next attempt needs 7.5 h from 4.5 h.  z2 at 4.7 h cuts it 0.2 h into its reload: no
    # work kept; lost 0.2 h (the partial reload; the next reload was charged once, at the
    # first preemption); the third attempt still needs 7 + 0.5 = 7.5 h from 5.7 h: ends
    # 13.2 h.  Ran 3.5 + 0.2 + 7.5 = 11.2 h = 10 h + 1.2 h lost.
    run, y = reclaimed(3.5 * H, 4.7 * H, checkpoint_interval_s=H, checkpoint_overhead_s=30 * MIN)
    assert run.preemptions[y] == 2
    assert run.lost[y] == pytest.approx(1.2 * H) and run.lost_whole[y] == pytest.approx(3.7 * H)
    assert run.end[y] == pytest.approx(13.2 * H)


def test_an_overhead_longer_than_the_whole_job():
    # y is 1 h here, checkpointing every 10 min with a 2 h overhead; z at 25 min: 20 min kept,
    # lost 5 min + 2 h; z runs 25-85 min; y's next attempt runs 40 min + 2 h = 160 min:
    # ends 245 min.  Ran 25 + 160 = 185 min = 60 + 125.
    t = trace(("x", 0, 40 * H, 2, "ta"), ("y", 0, H, 2, "ta"), ("z", 25 * MIN, H, 2, "tb"))
    run = simulate(t, config(SHARES, 4, checkpoint_interval_s=10 * MIN,
                             checkpoint_overhead_s=2 * H))  # fmt: skip
    assert run.lost[1] == pytest.approx(125 * MIN) and run.lost_whole[1] == pytest.approx(25 * MIN)
    assert run.end[1] == pytest.approx(245 * MIN) and run.ran[1] == pytest.approx(185 * MIN)


# -- intervals per team, job class and size ------------------------------------------------


def test_a_teams_interval_wins_then_a_job_types_then_the_largest_size_then_every_jobs():
    c = config([{"name": "s", "teams": ["ta", "tb", "tc"], "strategy": "RESERVE", "limit": 8}], 8,
               checkpoint_interval_s=H, checkpoint_classes=[
                   {"team": "ta", "interval_s": 30 * MIN}, {"team": "tc", "interval_s": 0},
                   {"job_type": "prod", "interval_s": 2 * H},
                   {"gpus_at_least": 4, "interval_s": 3 * H},
                   {"gpus_at_least": 8, "interval_s": 4 * H}])  # fmt: skip
    t = trace(("j1", 0, 9, 8, "ta", "prod"), ("j2", 0, 9, 8, "tb", "prod"),
              ("j3", 0, 9, 8, "tb", "dev"), ("j4", 0, 9, 4, "tb", "dev"),
              ("j5", 0, 9, 1, "tb", "dev"), ("j6", 0, 9, 8, "tc", "prod"))  # fmt: skip
    assert job_intervals(c, t) == [30 * MIN, 2 * H, 4 * H, 3 * H, H, 0.0]
    assert describe(c) == ("every 1 h; team=ta every 30 min; team=tc never; job_type=prod "
                           "every 2 h; gpus>=4 every 3 h; gpus>=8 every 4 h")  # fmt: skip


def test_a_team_that_never_checkpoints_loses_its_whole_attempt_while_others_save():
    # every job checkpoints hourly but team ta's: y (ta) loses its whole 3.5 h, and pays no
    # overhead (it restarts from zero: ends 4.5 + 10 = 14.5 h)
    classes = [{"team": "ta", "interval_s": 0}]
    run, y = reclaimed(3.5 * H, checkpoint_interval_s=H, checkpoint_overhead_s=6 * MIN,
                       checkpoint_classes=classes)  # fmt: skip
    assert run.lost[y] == run.lost_whole[y] == pytest.approx(3.5 * H)
    assert run.end[y] == pytest.approx(14.5 * H)


def test_a_class_naming_a_team_or_job_type_absent_from_the_trace_is_an_error():
    t = trace(("j1", 0, 9, 1, "ta"), ("j2", 0, 9, 1, "tb"))
    shares = [{"name": "s", "teams": ["ta", "tb"], "strategy": "RESERVE", "limit": 2}]
    team = config(shares, 2, checkpoint_classes=[{"team": "tz", "interval_s": H}])
    with pytest.raises(ConfigError, match="team tz: no job of the trace has that team "
                                          r"\(its teams: ta, tb\)"):
        simulate(t, team)
    kind = config(shares, 2, checkpoint_classes=[{"job_type": "prod", "interval_s": H}])
    with pytest.raises(ConfigError, match="job_type prod: .*its job_type column is empty"):
        simulate(t, kind)


def test_command_line_classes_replace_the_configurations_own_of_the_same_kind():
    c = config(SHARES, 4, checkpoint_interval_s=H, checkpoint_overhead_s=60, checkpoint_classes=[
        {"team": "ta", "interval_s": 600}, {"gpus_at_least": 8, "interval_s": 7200}])  # fmt: skip
    options = parse_options(["team=ta:30m", "job_type=prod:2h"], "5m")
    out = options.apply(c)
    assert out.checkpoint_interval_s == H and out.checkpoint_overhead_s == 300
    assert [(k.selector, k.interval_s) for k in out.checkpoint_classes] == [
        ("gpus>=8", 7200), ("team=ta", 1800), ("job_type=prod", 7200)]  # fmt: skip
    assert parse_options(["90"], None) == CheckpointOptions(interval_s=90.0)
    assert parse_options(["gpus>=8:1.5h"], None).classes == (
        CheckpointClass(gpus_at_least=8, interval_s=5400),)  # fmt: skip
    assert [parse_duration(text, "x") for text in ("0", "45", "2m", "1.5h", "1d", ".5h")] == [
        0, 45, 120, 5400, 86400, 1800]  # fmt: skip


@pytest.mark.parametrize("intervals, overhead, message", [
    (["-5m"], None, "--checkpoint-interval -5m: a duration must not be negative"),
    (["1x"], None, "--checkpoint-interval 1x: '1x' is not a duration"),
    (["team=ta:"], None, "--checkpoint-interval team=ta:: '' is not a duration"),
    (["team=ta:-1h"], None, "--checkpoint-interval team=ta:-1h: a duration must not be negative"),
    (["owner=ta:1h"], None, "expected DURATION, team=NAME:DURATION"),
    (["team=:1h"], None, "--checkpoint-interval team=:1h: team names nothing"),
    (["gpus>=0:1h"], None, "gpus>= takes a whole number of GPUs, at least 1, not '0'"),
    (["1h", "2h"], None, "--checkpoint-interval 2h: every job's interval is already given"),
    (["team=ta:1h", "team=ta:2h"], None, "team=ta:2h: team=ta is given twice"),
    ([], "-1m", "--checkpoint-overhead -1m: a duration must not be negative"),
    ([], "soon", "--checkpoint-overhead soon: 'soon' is not a duration"),
])  # fmt: skip
def test_bad_checkpoint_options_name_the_option_and_the_problem(intervals, overhead, message):
    with pytest.raises(CheckpointError) as caught:
        parse_options(intervals, overhead)
    assert message in str(caught.value)


# -- the command line: both figures, table and JSON, and errors with exit 2 ------------------


@pytest.fixture()
def files(tmp_path):
    """The issue example as files: y reclaimed at 3.5 h."""
    (tmp_path / "t.csv").write_text(
        "job_id,submit_time_s,duration_s,gpus,team,job_type\n"
        f"x,0,{40 * H:.0f},2,ta,\ny,0,{10 * H:.0f},2,ta,\nz,{3.5 * H:.0f},3600,2,tb,\n")
    (tmp_path / "c.yaml").write_text(
        "name: tiny\nenvironment: {max_instances: 4}\nshares:\n"
        "  - {name: a, teams: [ta], strategy: LEND_AND_BORROW, limit: 2}\n"
        "  - {name: b, teams: [tb], strategy: LEND, limit: 2}\n")
    return tmp_path


def invoke(files, *args: str):
    return CliRunner().invoke(app, ["simulate", "--trace", str(files / "t.csv"), "--config",
                                    str(files / "c.yaml"), "--no-progress", *args])  # fmt: skip


def cells(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if label in line)
    return [cell.strip() for cell in line.split("│")[2:-1]]


def test_the_table_and_the_json_give_the_loss_with_and_without_checkpoints(files):
    plain = invoke(files)
    assert plain.exit_code == 0, plain.output
    # 3.5 h x 2 GPUs both ways; no checkpoints row when nothing checkpoints
    assert cells(plain.stdout, "GPU-hours lost to preemption, with / without") == ["7 / 7"]
    assert "│ checkpoints" not in plain.stdout
    result = invoke(files, "--checkpoint-interval", "1h", "--checkpoint-overhead", "6m")
    assert result.exit_code == 0, result.output
    assert cells(result.stdout, "GPU-hours lost to preemption, with / without") == ["1 / 7"]
    assert cells(result.stdout, "│ checkpoints ") == ["every 1 h; restart overhead 6 min"]
    out = invoke(files, "--checkpoint-interval", "1h", "--checkpoint-overhead", "6m",
                 "--output", "json")  # fmt: skip
    assert out.exit_code == 0, out.output
    run = json.loads(out.stdout)["runs"][0]
    assert run["lost_gpu_h"] == pytest.approx(1.2) and run["lost_whole_gpu_h"] == pytest.approx(7)
    assert run["checkpoints"] == "every 1 h; restart overhead 6 min"
    a = next(share for share in run["shares"] if share["name"] == "a")
    assert (a["lost_gpu_h"], a["lost_whole_gpu_h"]) == (pytest.approx(1.2), pytest.approx(7))
    assert run["last_end"] == 40 * H  # x's end; y ends at 11.6 h


@pytest.mark.parametrize("args, message", [
    (["--checkpoint-interval", "-5m"],
     "--checkpoint-interval -5m: a duration must not be negative"),
    (["--checkpoint-interval", "30 minutes"], "'30 minutes' is not a duration"),
    (["--checkpoint-interval", "team=cluster03:1h"],
     "tiny: checkpoint interval for team cluster03: no job of the trace has that team"),
    (["--checkpoint-overhead", "-2m"],
     "--checkpoint-overhead -2m: a duration must not be negative"),
    (["--output", "yaml"], "--output must be table or json, not yaml"),
])  # fmt: skip
def test_bad_checkpoint_options_exit_2_naming_the_problem(files, args, message):
    result = invoke(files, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


# -- properties over random runs -------------------------------------------------------------

BUSY = [
    {"name": "a", "teams": ["ta"], "strategy": "LEND_AND_BORROW", "limit": 2,
     "in_share_preemption": True},
    {"name": "b", "teams": ["tb"], "strategy": "LEND_AND_BORROW", "limit": 2},
    {"name": "c", "teams": ["tc"], "strategy": "LEND", "limit": 1},
]  # fmt: skip
TEAMS = st.sampled_from(["ta", "tb", "tc"])
jobs = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 300), st.integers(1, 2), TEAMS),
                min_size=1, max_size=25)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(rows=jobs, interval=st.sampled_from([0, 7, 25, 60, 1000]),
       overhead=st.sampled_from([0, 3, 40]), team_off=st.booleans())  # fmt: skip
def test_checkpoints_never_lose_more_than_whole_attempts_and_work_is_conserved(
        rows, interval, overhead, team_off):  # fmt: skip
    t = trace(*[(f"j{i}", float(at), float(d), g, team)
                for i, (at, d, g, team) in enumerate(sorted(rows, key=lambda r: r[0]))])
    classes = [{"team": "tb", "interval_s": 0}] if team_off and "tb" in t.team else []
    c = config(BUSY, 5, priority={"kind": "random", "values": [0, 1, 5], "seed": len(rows)},
               checkpoint_interval_s=interval or None, checkpoint_overhead_s=overhead,
               checkpoint_classes=classes)  # fmt: skip
    run = simulate(t, c)
    every = job_intervals(c, t)
    assert all(end >= 0 for end in run.end), "every job finishes"
    for i in range(len(t)):
        # with no overhead a checkpoint only ever keeps work; each restart of a checkpointing
        # job costs at most the overhead more
        paid = overhead * run.preemptions[i] if every[i] else 0.0
        assert run.lost[i] <= run.lost_whole[i] + paid + 1e-6
        assert run.lost[i] >= -1e-6
        assert run.ran[i] == pytest.approx(t.duration[i] + run.lost[i], abs=1e-6)
        if not every[i]:
            assert run.lost[i] == run.lost_whole[i]
    summary = summarize(run)
    if not overhead:
        assert summary.lost_gpu_h <= summary.lost_whole_gpu_h + 1e-9
    assert summary.run_gpu_h == pytest.approx(summary.trace_gpu_h + summary.lost_gpu_h)
    kept = [0.0] * len(t)
    for j, lo, hi in run.kept:
        kept[j] += hi - lo
    assert kept == pytest.approx(t.duration)
