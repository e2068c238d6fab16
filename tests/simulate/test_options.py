"""Options beyond AWS in a simulation: set on the share right after it is created, and their
lapses acted on at the very moment (a Tick at the core's next timer), by hand-computed runs."""

from __future__ import annotations

import pytest

from quotasched.events import facts as F
from quotasched.services.simulate import simulate, summarize
from quotasched.services.simulate.cluster import setup_commands
from tests.simulate.builders import config, trace

# a borrows b's idle instance; b's own job reclaims it
BORROWER = {"name": "a", "teams": ["ta"], "strategy": "LEND_AND_BORROW", "limit": 1}
LENDER = {"name": "b", "teams": ["tb"], "strategy": "LEND", "limit": 1}


def run_with(options: dict | None, *rows: tuple):
    borrower = BORROWER if options is None else {**BORROWER, "options": options}
    return simulate(trace(*rows), config([borrower, LENDER], 2), record=True)


def preemptions(run) -> list[tuple[str, float]]:
    return [(f.job_id, f.at) for f in run.facts if type(f) is F.JobPreempted]


def by_id(run, values):
    return dict(zip(run.trace.job_ids, values))


# x fills a's own instance for long; y borrows b's from t=0; b's z (5 s) arrives at t=10
RECLAIM = (("x", 0, 1000, 1, "ta"), ("y", 0, 100, 1, "ta"), ("z", 10, 5, 1, "tb"))


@pytest.mark.parametrize("options, preempted_at, y_end", [
    # AWS: z reclaims at once; y restarts at 15 after z, 100 s more
    (None, 10.0, 115.0),
    # y is protected until 0 + 30: z waits, and the protection's lapse (a Tick at 30, before
    # the next trace event at 1000) lets it reclaim then; y restarts at 35
    ({"minRuntimeBeforePreemptionSeconds": 30}, 30.0, 135.0),
    # a protection that outlasts y: z waits for y to end at 100 and nothing is preempted
    ({"minRuntimeBeforePreemptionSeconds": 500}, None, 100.0),
])  # fmt: skip
def test_a_protected_borrower_is_reclaimed_when_its_protection_lapses(options, preempted_at, y_end):
    run = run_with(options, *RECLAIM)
    expected = [] if preempted_at is None else [("y", preempted_at)]
    assert preemptions(run) == expected
    z_start = 100.0 if preempted_at is None else preempted_at
    assert by_id(run, run.first_start) == {"x": 0.0, "y": 0.0, "z": z_start}
    assert by_id(run, run.end) == {"x": 1000.0, "y": y_end, "z": z_start + 5}
    lost = preempted_at or 0.0  # y's work since its dispatch at 0
    assert summarize(run).lost_gpu_h == pytest.approx(lost / 3600)


def test_a_budget_spent_holds_the_next_reclaim_until_its_window_slides_past():
    # One preemption of a's jobs per 100 s.  z1 reclaims y at 10 (budget spent until 110); y
    # is dispatched again at 15 when z1 ends.  z2 (t=20) would reclaim it at once under AWS,
    # but waits for the window: y is preempted at 110 after 95 s more, z2 runs 110..115, and
    # y starts over at 115 (done at 215).  Lost: 10 + 95 s.
    budget = {"preemptionBudget": {"maxPreemptions": 1, "windowSeconds": 100}}
    rows = (("x", 0, 1000, 1, "ta"), ("y", 0, 100, 1, "ta"), ("z1", 10, 5, 1, "tb"),
            ("z2", 20, 5, 1, "tb"))  # fmt: skip
    run = run_with(budget, *rows)
    assert preemptions(run) == [("y", 10.0), ("y", 110.0)]
    assert by_id(run, run.end) == {"x": 1000.0, "y": 215.0, "z1": 15.0, "z2": 115.0}
    assert by_id(run, run.preemptions)["y"] == 2
    assert summarize(run).lost_gpu_h == pytest.approx(105 / 3600)
    unbudgeted = run_with(None, *rows)
    assert preemptions(unbudgeted) == [("y", 10.0), ("y", 20.0)]


def test_options_are_set_right_after_their_share_and_only_when_given():
    options = {"minRuntimeBeforePreemptionSeconds": 60,
               "preemptionBudget": {"maxPreemptions": 2, "windowSeconds": 3600}}  # fmt: skip
    cfg = config([{**BORROWER, "options": options}, LENDER], 2)
    kinds = [(c.kind, getattr(c, "quota_share_name", None)) for c in setup_commands(cfg, {"a": 1, "b": 1})]
    assert kinds[3:] == [("CreateQuotaShare", "a"), ("SetQuotaShareOptions", "a"), ("CreateQuotaShare", "b")]
    run = run_with(options, *RECLAIM)
    sets = [f for f in run.facts if type(f) is F.QuotaShareOptionsSet]
    assert [(f.quota_share_name, f.options.model_dump(by_alias=True, exclude_none=True)) for f in sets] \
        == [("a", options)]


def test_without_options_no_option_is_set_and_no_tick_is_sent():
    # The fact log stays what it was before options existed: no QuotaShareOptionsSet, and no
    # Tick (each command's facts come from a submission, a completion or the set-up).
    run = run_with(None, *RECLAIM)
    assert not [f for f in run.facts if type(f) is F.QuotaShareOptionsSet]
    # 5 set-up commands, 3 submissions, 3 completions (y's first attempt's never comes)
    assert run.commands == 5 + 3 + 3


@pytest.mark.parametrize("name, options", [
    ("itp-all-borrow-protected", {"minRuntimeBeforePreemptionSeconds": 3600}),
    ("itp-all-borrow-budget", {"preemptionBudget": {"maxPreemptions": 1, "windowSeconds": 86400}}),
])  # fmt: skip
def test_the_example_variants_are_all_borrow_with_options_on_every_share(name, options):
    from quotasched.services.simulate.config import load_config

    variant = load_config(f"examples/simulate/{name}.yaml")
    base = load_config("examples/simulate/itp-all-borrow.yaml")
    assert [share.options.model_dump(by_alias=True, exclude_none=True) for share in variant.shares] \
        == [options] * len(base.shares)
    assert [share.model_copy(update={"options": None}) for share in variant.shares] == base.shares


def test_the_lend_half_example_is_all_borrow_lending_half_of_each_planned_quota():
    # Per share, so not the parametrized check above: each cap is half the limit the run uses
    # at the example's pool (after raise_to_largest_job), rounded down, as the bench computes it.
    from quotasched.services.simulate import read_trace
    from quotasched.services.simulate.cluster import plan
    from quotasched.services.simulate.config import load_config

    variant = load_config("examples/simulate/itp-all-borrow-lend-half.yaml")
    base = load_config("examples/simulate/itp-all-borrow.yaml")
    limits = plan(read_trace("traces/itp_2021_jobs.csv"), base).limits
    half = [{"lendingLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": limits[name] // 2}]}
            for name in (share.name for share in base.shares)]  # fmt: skip
    assert [share.options.model_dump(by_alias=True, exclude_none=True) for share in variant.shares] \
        == half
    assert [share.model_copy(update={"options": None}) for share in variant.shares] == base.shares


def test_a_lender_that_lends_nothing_spares_its_jobs_the_reclaim_and_the_borrower_waits():
    """b lends at most 0 of its idle instance (lendingLimits): y cannot borrow it and waits for
    a's own instance (x ends at 1000); z runs on b at 10 with nothing to reclaim."""
    lender = {**LENDER, "options": {"lendingLimits": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 0}]}}
    run = simulate(trace(*RECLAIM), config([BORROWER, lender], 2), record=True)
    assert preemptions(run) == []
    assert by_id(run, run.first_start) == {"x": 0.0, "y": 1000.0, "z": 10.0}
    assert summarize(run).lost_gpu_h == 0
