"""The figures a capacity planner reads (issue 22), computed by hand on tiny traces: utilization
over a window common to every run, time to first start and total time queued with the jobs
still waiting at the end censored, and the warnings about lifted quotas and absent teams."""

from __future__ import annotations

import math

import pytest

from quotasched.services.simulate import WindowError, parse_window, simulate, submit_span, summarize
from quotasched.services.simulate.checks import absent_teams, lifted_quotas
from quotasched.services.simulate.render import first_start
from quotasched.services.simulate.waits import Quantile, quantile
from quotasched.services.simulate.window import span_words, step_area
from tests.simulate.builders import config, trace


def share(name: str, strategy: str, limit: int, *teams: str) -> dict:
    """A share of `limit` instances for `teams` (default: the team t<name>)."""
    return {"name": name, "teams": list(teams or [f"t{name}"]), "strategy": strategy,
            "limit": limit}  # fmt: skip


# -- utilization over a common window ---------------------------------------------------------

# Two teams, 4 one-GPU instances, each share RESERVE 2; the trace starts at t=100:
#   j1  ta  t=100  10 s  2 GPUs   runs [100, 110)
#   j2  tb  t=102   4 s  1 GPU    runs [102, 106)
#   j3  tb  t=104  20 s  2 GPUs   b holds j2's 1 of 2 until 106: runs [106, 126)
#   j4  ta  t=112   3 s  1 GPU    runs [112, 115)
TWO_TEAMS = trace(("j1", 100, 10, 2, "ta"), ("j2", 102, 4, 1, "tb"), ("j3", 104, 20, 2, "tb"),
                  ("j4", 112, 3, 1, "ta"))  # fmt: skip
FIXED = config([share("a", "RESERVE", 2), share("b", "RESERVE", 2)], 4)


def test_utilization_is_measured_over_the_submit_span_not_the_makespan():
    run = simulate(TWO_TEAMS, FIXED)
    assert dict(zip(TWO_TEAMS.job_ids, run.end)) == {"j1": 110, "j2": 106, "j3": 126, "j4": 115}
    summary = summarize(run)
    # the submit span is [100, 112): j1 2 x 10, j2 1 x 4, j3 2 x (112 - 106), j4 not yet:
    # 20 + 4 + 12 = 36 instance-seconds of 4 x 12 = 48
    assert (summary.window.start, summary.window.end) == (100, 112)
    assert summary.utilization == pytest.approx(36 / 48)
    assert summary.useful_utilization == pytest.approx(36 / 48)  # nothing lost, 1 GPU/instance
    # the makespan still says when the trace finished: 126 - 100
    assert summary.makespan_h == pytest.approx(26 / 3600)
    assert summary.window.describe() == (
        "the trace's submit span, 0 s – 12 s after the first submission")  # fmt: skip


def test_a_chosen_window_counts_from_the_first_submission_and_clips_the_work():
    window = parse_window("5:15", TWO_TEAMS)
    assert (window.start, window.end) == (105, 115)
    summary = summarize(simulate(TWO_TEAMS, FIXED), window)
    # [105, 115): j1 2 x 5, j2 1 x 1, j3 2 x 9, j4 1 x 3: 10 + 1 + 18 + 3 = 32 of 4 x 10 = 40
    assert summary.utilization == pytest.approx(32 / 40)
    assert summary.window.describe() == "--window, 5 s – 15 s after the first submission"


def test_the_same_window_serves_every_pool_size_compared():
    # on 8 instances nothing waits: j3 runs [104, 124); over the same [100, 112):
    # 20 + 4 + 2 x 8 = 40 of 8 x 12 = 96
    bigger = summarize(simulate(TWO_TEAMS, FIXED.with_pool(8)))
    assert bigger.window == summarize(simulate(TWO_TEAMS, FIXED)).window
    assert bigger.utilization == pytest.approx(40 / 96)


@pytest.mark.parametrize("text, start, end", [
    ("7d:50d", 7 * 86400, 50 * 86400), (":30m", 0, 1800), ("3:", 3, 12), ("1.5h:2h", 5400, 7200),
    (" 2 s : 4s ", 2, 4),
])  # fmt: skip
def test_window_bounds_take_units_and_an_open_side_is_the_submit_span(text, start, end):
    window = parse_window(text, TWO_TEAMS)  # submitted from 100 to 112
    assert (window.start - 100, window.end - 100) == (start, end) and window.chosen


@pytest.mark.parametrize("text, message", [
    ("86400", "expected START:END"), ("a:b", "'a' is not a time"), ("5:5", "END must come after"),
    ("-1:5", "'-1' is not a time"), ("12h:", "END must come after START"),  # the span is 12 s
])  # fmt: skip
def test_bad_windows_say_why(text, message):
    with pytest.raises(WindowError, match=message):
        parse_window(text, TWO_TEAMS)


def test_an_empty_submit_span_gives_no_utilization_and_says_so():
    t = trace(("a", 0, 5, 1, "ta"), ("b", 0, 5, 1, "tb"))
    summary = summarize(simulate(t, FIXED))
    assert math.isnan(summary.utilization) and "choose a window with --window" in (
        summary.window.describe())  # fmt: skip


def test_capacity_that_changes_during_a_run_is_integrated():
    run = simulate(TWO_TEAMS, FIXED)
    # as if the pool grew from 4 to 8 instances at t=106: over [100, 112) 4 x 6 + 8 x 6 = 72
    run.capacity_times, run.capacity_levels = [0.0, 106.0], [4, 8]
    assert summarize(run).utilization == pytest.approx(36 / 72)
    assert step_area([0.0, 106.0], [4, 8], 100, 112) == 72


@pytest.mark.parametrize("seconds, words", [
    (0, "0 s"), (45, "45 s"), (12.25, "12.2 s"), (720, "12 min"), (12000, "3 h 20 min"),
    (7200, "2 h"), (60 * 86400 + 3600, "60 d 1 h"), (3 * 86400, "3 d"),
])  # fmt: skip
def test_spans_read_in_words(seconds, words):
    assert span_words(seconds) == words


# -- waits: first start, time queued, censored --------------------------------------------------

LENDING = [share("a", "LEND_AND_BORROW", 1, "ta"), share("b", "LEND", 1, "tb")]


def test_a_preempted_job_waits_again_until_its_next_start():
    # Pool 2: a (LEND_AND_BORROW, 1) and b (LEND, 1).  x holds a's instance [0, 100), w b's
    # [0, 3).  y (t=1) waits for w, then borrows b's idle instance at 3: first start wait 2.
    # z (b's own, t=10) reclaims it: y is preempted at 10, requeued, and starts again when z
    # ends at 15: queued 2 + 5 = 7; it runs 50 s from 15 (nothing checkpointed): ends 65.
    t = trace(("x", 0, 100, 1, "ta"), ("w", 0, 3, 1, "tb"), ("y", 1, 50, 1, "ta"),
              ("z", 10, 5, 1, "tb"))  # fmt: skip
    run = simulate(t, config(LENDING, 2))
    assert dict(zip(t.job_ids, run.first_start)) == {"x": 0, "w": 0, "y": 3, "z": 10}
    assert dict(zip(t.job_ids, run.queued)) == {"x": 0, "w": 0, "y": 7, "z": 0}
    assert dict(zip(t.job_ids, run.end)) == {"x": 100, "w": 3, "y": 65, "z": 15}
    summary = summarize(run)
    # first start [0, 0, 0, 2]: p50 at rank 1.5 is 0; p95 at 2.85 is 0 + 0.85 x 2 = 1.7
    assert summary.waits.first_start_p50 == Quantile(0.0)
    assert summary.waits.first_start_p95 == Quantile(pytest.approx(1.7))
    # queued [0, 0, 0, 7]: p95 0.85 x 7 = 5.95
    assert summary.waits.queued_p95 == Quantile(pytest.approx(5.95))
    # team ta: x and y: first start [0, 2], queued [0, 7]; p50 halfway, p95 at 0.95
    ta = summary.teams["ta"]
    assert (ta.first_start_p50.seconds, ta.first_start_p95.seconds) == pytest.approx((1.0, 1.9))
    assert (ta.queued_p50.seconds, ta.queued_p95.seconds) == pytest.approx((3.5, 6.65))
    assert summary.still_waiting == 0 and ta.still_waiting == 0


def test_a_job_that_never_starts_is_counted_and_its_wait_censored_at_the_end():
    # big (4 GPUs) can never fit x's quota of 2 (not lifted); a and b of team y run
    # [0, 10) and [5, 25).  The run ends at its last event, 25: big waited at least 25 s.
    t = trace(("big", 0, 10, 4, "x"), ("a", 0, 10, 1, "y"), ("b", 5, 20, 1, "y"))
    c = config([share("s", "RESERVE", 2, "x"), share("u", "RESERVE", 2, "y")], 4,
               raise_to_largest_job=False)  # fmt: skip
    run = simulate(t, c)
    assert run.horizon == 25 and run.waiting_at_end == [True, False, False]
    summary = summarize(run)
    assert summary.still_waiting == 1 and summary.teams["x"].still_waiting == 1
    assert summary.teams["y"].still_waiting == 0
    # first start [0, 0, 25 censored]: p50 (rank 1) is exact; p95 (ranks 1 and 2, 0.9 of the
    # way) reaches the censored one: at least 22.5
    assert summary.waits.first_start_p50 == Quantile(0.0, at_least=False)
    assert summary.waits.first_start_p95 == Quantile(pytest.approx(22.5), at_least=True)
    assert summary.teams["x"].queued_p50 == Quantile(25.0, at_least=True)
    assert first_start(summary.waits) == "0.00 / ≥ 0.01"  # hours, as printed
    assert summary.shares[0].waits.still_waiting == 1


@pytest.mark.parametrize("values, censored, p, expected", [
    ([10, 20, 30, 40], [False] * 4, 50, Quantile(25)),
    ([10, 20, 30, 40], [False] * 4, 95, Quantile(38.5)),  # 30 + 0.85 x 10
    ([10, 20, 30, 40], [False, False, False, True], 50, Quantile(25)),  # above: exact
    ([10, 20, 30, 40], [False, False, False, True], 95, Quantile(38.5, at_least=True)),
    ([40, 10, 20, 30], [True, False, False, False], 50, Quantile(25)),  # order of input
    ([20, 20], [True, False], 0, Quantile(20)),  # at a tie the exact one ranks first
    ([20, 20], [True, False], 50, Quantile(20, at_least=True)),
    ([5], [True], 50, Quantile(5, at_least=True)),
])  # fmt: skip
def test_censored_percentiles_are_lower_bounds_only_where_censored_waits_reach_them(
        values, censored, p, expected):  # fmt: skip
    assert quantile(values, censored, p) == expected


# -- warnings ---------------------------------------------------------------------------------


def test_lifted_quotas_name_each_share_and_the_oversubscription():
    # a's quota 1 is below its 3-GPU job: lifted to 3; with b's 2 the quotas promise 5 of 4
    t = trace(("big", 0, 5, 3, "ta"), ("b1", 0, 5, 2, "tb"))
    run = simulate(t, config([share("a", "RESERVE", 1), share("b", "RESERVE", 2)], 4))
    lifted = lifted_quotas(run)
    assert [(x.share, x.configured, x.lifted, x.largest_job) for x in lifted.lifts] == [
        ("a", 1, 3, 3)]  # fmt: skip
    assert (lifted.lifted_total, lifted.pool, lifted.oversubscribed_by) == (5, 4, 1)
    # on 8 instances the same lift fits: 5 of 8
    roomy = lifted_quotas(simulate(t, config([share("a", "RESERVE", 1),
                                              share("b", "RESERVE", 2)], 8)))  # fmt: skip
    assert (roomy.lifted_total, roomy.oversubscribed_by) == (5, 0)
    kept = config([share("a", "RESERVE", 1), share("b", "RESERVE", 2)], 4,
                  raise_to_largest_job=False)  # fmt: skip
    assert lifted_quotas(simulate(t, kept)) is None


def test_weighted_quotas_are_lifted_only_where_their_part_of_the_pool_is_below_the_largest_job():
    # weights 3 : 1 on 8 instances: 6 and 2; b's 3-GPU job lifts it to 3: 9 of 8
    # on 16: 12 and 4, nothing to lift
    t = trace(("a1", 0, 5, 1, "ta"), ("b1", 0, 5, 3, "tb"))
    weighted = [{**share("a", "LEND", 1), "limit": None, "weight": 3},
                {**share("b", "LEND", 1), "limit": None, "weight": 1}]  # fmt: skip
    lifted = lifted_quotas(simulate(t, config(weighted, 8)))
    assert [(x.share, x.configured, x.lifted) for x in lifted.lifts] == [("b", 2, 3)]
    assert lifted.oversubscribed_by == 1
    assert lifted_quotas(simulate(t, config(weighted, 16))) is None  # 12 and 4: b fits


def test_teams_absent_from_the_trace_are_named_with_what_their_share_does_with_its_quota():
    t = trace(("a1", 0, 5, 1, "ta"))
    c = config([share("a", "LEND_AND_BORROW", 2, "ta", "gone"), share("r", "RESERVE", 3),
                share("l", "LEND", 4)], 9)  # fmt: skip
    found = {(absent.team, absent.share, absent.limit, absent.share_idle, absent.borrowers)
             for absent in absent_teams(simulate(t, c))}  # fmt: skip
    assert found == {("gone", "a", 2, False, False), ("tr", "r", 3, True, True),
                     ("tl", "l", 4, True, True)}  # fmt: skip
    assert absent_teams(simulate(t, config([share("a", "RESERVE", 2, "ta")], 2))) == []


def test_submit_span_of_a_trace():
    assert (submit_span(TWO_TEAMS).start, submit_span(TWO_TEAMS).end) == (100, 112)
