"""The job queue's options beyond AWS in a simulation (`queue_options`: fair-share idle
assignment and share groups): set once after every share, and who runs first / when, by
hand-computed runs; a share the options name that the configuration lacks is a config error.

The rules the expectations come from (docs/options.md): borrowers (heads beyond their own
limit) are served FIFO by the head's acceptance under AWS; FAIR_SHARE serves the least
decayed past borrowing per weight first, the charge being instance-seconds beyond the
share's own limit, halved at every multiple of the half-life since time 0; a share group
serves first a borrower its other members' idle quota covers, and its maxCapacity refuses a
borrowing dispatch that would take the members' total beyond it.
"""

from __future__ import annotations

import pytest

from quotasched.events import facts as F
from quotasched.services.simulate import ConfigError, parse_config, simulate
from quotasched.services.simulate.cluster import setup_commands
from tests.simulate.builders import config, trace

DAY = 86400


def share(name: str, strategy: str = "LEND_AND_BORROW", limit: int = 1) -> dict:
    """A share named like its one team."""
    return {"name": name, "teams": [name], "strategy": strategy, "limit": limit}


def fair(half_life: int, **weights: int) -> dict:
    wire = {"halfLifeSeconds": half_life}
    if weights:
        wire["weights"] = [{"quotaShareName": name, "weight": w} for name, w in weights.items()]
    return {"idleResourceAssignmentStrategy": "FAIR_SHARE", "fairShare": wire}


def wire(options) -> dict:
    """Validated options back in wire names, as a config file or a command writes them."""
    return options.model_dump(mode="json", by_alias=True, exclude_none=True)


def starts(shares: list[dict], pool: int, options: dict | None, *rows: tuple) -> dict[str, float]:
    """Each job's first start under `options` (None: no queue options, AWS)."""
    extra = {} if options is None else {"queue_options": options}
    run = simulate(trace(*rows), config(shares, pool, **extra))
    return dict(zip(run.trace.job_ids, run.first_start))


# a and b borrow from the lender c (2 instances); x and y fill a's and b's own instance.
# p_a borrows 0..250 and p_b 100..200, so at 200, when p_b ends and frees one of c's
# instances, a has borrowed 200 instance-seconds and b 100.  Both heads wait then: q_a
# (accepted at 150) and q_b (at 160); the other takes p_a's instance at 250.
CHARGED = (("x", 0, 5000, 1, "a"), ("y", 0, 5000, 1, "b"), ("p_a", 0, 250, 1, "a"),
           ("p_b", 100, 100, 1, "b"), ("q_a", 150, 100, 1, "a"),
           ("q_b", 160, 100, 1, "b"))  # fmt: skip
CHARGED_SHARES = [share("a"), share("b"), share("c", "LEND", 2)]


@pytest.mark.parametrize("options, first", [
    (None, "q_a"),  # AWS: FIFO, q_a was accepted first
    (fair(DAY), "q_b"),  # b borrowed 100 < a's 200 (one period: nothing halved yet)
    (fair(DAY, a=3), "q_a"),  # per weight: a 200 / 3 = 66.7 < b's 100 / 1
])  # fmt: skip
def test_fair_share_serves_the_borrower_that_borrowed_less_per_weight(options, first):
    got = starts(CHARGED_SHARES, 4, options, *CHARGED)
    second = "q_b" if first == "q_a" else "q_a"
    assert (got[first], got[second]) == (200.0, 250.0)
    assert (got["p_a"], got["p_b"]) == (0.0, 100.0)


# c lends 1 instance.  a borrowed it long ago (0..100: 100 instance-seconds), b recently
# (400..460: 60).  At 460 q_b (accepted at 420) and q_a (at 430) both wait for it.
AGED = (("x", 0, 5000, 1, "a"), ("y", 0, 5000, 1, "b"), ("p_a", 0, 100, 1, "a"),
        ("p_b", 400, 60, 1, "b"), ("q_b", 420, 100, 1, "b"), ("q_a", 430, 100, 1, "a"))  # fmt: skip


@pytest.mark.parametrize("options, first", [
    (None, "q_b"),  # FIFO
    (fair(DAY), "q_b"),  # all in period 0: a 100 > b 60
    # half-life 100 s: a's 100 (period 0) is halved at 100, 200, 300 and 400: 6.25 at 460,
    # below b's 60 accrued in the current period 4
    (fair(100), "q_a"),
])  # fmt: skip
def test_a_short_half_life_forgets_old_borrowing(options, first):
    got = starts([share("a"), share("b"), share("c", "LEND")], 3, options, *AGED)
    second = "q_a" if first == "q_b" else "q_b"
    assert (got[first], got[second]) == (460.0, 560.0)


# a and b form a department; e is outside.  b's own job w holds b's instance until 100; e's
# q_e (accepted at 10) and a's q_a (at 20) both wait to borrow it.
GROUPED = (("x", 0, 5000, 1, "a"), ("z", 0, 5000, 1, "e"), ("w", 0, 100, 1, "b"),
           ("q_e", 10, 100, 1, "e"), ("q_a", 20, 100, 1, "a"))  # fmt: skip
GROUPED_SHARES = [share("a"), share("b", "LEND"), share("e")]


@pytest.mark.parametrize("options, q_a, q_e", [
    (None, 200.0, 100.0),  # FIFO: q_e first; q_a takes b's instance when q_e ends
    # b, a's group-mate, has the idle instance q_a borrows: q_a comes before every other
    # borrower, and q_e waits for it to end
    ({"shareGroups": [{"name": "dept", "quotaShareNames": ["a", "b"]}]}, 100.0, 200.0),
    # a group whose other member lends nothing idle changes nothing: FIFO again
    ({"shareGroups": [{"name": "dept", "quotaShareNames": ["a", "e"]}]}, 200.0, 100.0),
])  # fmt: skip
def test_a_group_lends_inside_first(options, q_a, q_e):
    got = starts(GROUPED_SHARES, 3, options, *GROUPED)
    assert (got["q_a"], got["q_e"]) == (q_a, q_e)


# a and b (1 each) borrow from c (2).  p (a) borrows one of c's instances 0..100; q (b) wants
# to borrow the other at 10, which takes the department {a, b} to 4 instances.
CAPPED = (("x", 0, 5000, 1, "a"), ("y", 0, 5000, 1, "b"), ("p", 0, 100, 1, "a"),
          ("q", 10, 100, 1, "b"))  # fmt: skip


@pytest.mark.parametrize("cap, q_start", [
    (None, 10.0),  # no cap: q borrows at once
    (4, 10.0),  # 3 held + 1 = 4 fits
    (3, 100.0),  # refused until p ends: 2 held + 1 = 3
])  # fmt: skip
def test_a_group_cap_holds_a_borrower_until_the_group_releases(cap, q_start):
    group = {"name": "dept", "quotaShareNames": ["a", "b"]}
    if cap is not None:
        group["maxCapacity"] = [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": cap}]
    got = starts(CHARGED_SHARES, 4, {"shareGroups": [group]}, *CAPPED)
    assert got["q"] == q_start


def test_a_group_cap_never_refuses_a_member_its_own_quota():
    # The cap (1) is below what a and b own (2): b's own job starts at once all the same.
    # a's p would borrow c's idle instance, which takes the group to 3 > 1: it waits until
    # x ends at 50 and then runs on a's own instance.
    group = {"name": "dept", "quotaShareNames": ["a", "b"],
             "maxCapacity": [{"capacityUnit": "ml.g5.xlarge", "maxCapacity": 1}]}  # fmt: skip
    rows = (("x", 0, 50, 1, "a"), ("y", 5, 100, 1, "b"), ("p", 10, 100, 1, "a"))
    got = starts([share("a"), share("b"), share("c", "LEND")], 3, {"shareGroups": [group]}, *rows)
    assert got == {"x": 0.0, "y": 5.0, "p": 50.0}


def test_queue_options_are_set_once_after_every_share_and_only_when_given():
    shares = [{**share("a"), "options": {"minRuntimeBeforePreemptionSeconds": 60}}, share("b")]
    options = {**fair(3600, a=2), "shareGroups": [{"name": "g", "quotaShareNames": ["a", "b"]}]}
    commands = setup_commands(config(shares, 2, queue_options=options), {"a": 1, "b": 1})
    assert [c.kind for c in commands[3:]] == ["CreateQuotaShare", "SetQuotaShareOptions",
                                              "CreateQuotaShare", "SetJobQueueOptions"]  # fmt: skip
    assert wire(commands[-1].options) == options
    without = setup_commands(config(shares, 2), {"a": 1, "b": 1})
    assert "SetJobQueueOptions" not in [c.kind for c in without]
    run = simulate(trace(("j", 0, 10, 1, "a")), config(shares, 2, queue_options=options),
                   record=True)  # fmt: skip
    (fact,) = [f for f in run.facts if type(f) is F.JobQueueOptionsSet]
    assert wire(fact.options) == options


def error_of(options: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"name": "t", "environment": {"max_instances": 2},
                      "shares": [share("a"), share("b")], "queue_options": options}, "c.yaml")  # fmt: skip
    return str(caught.value)


@pytest.mark.parametrize("options, expected", [
    ({"shareGroups": [{"name": "g", "quotaShareNames": ["a", "zz"]}]},
     "queue_options: shareGroups.0.quotaShareNames.1 names share zz, which is not one of the "
     "shares"),
    (fair(DAY, a=1, nope=2),
     "queue_options: fairShare.weights.1.quotaShareName names share nope, which is not one of "
     "the shares"),
    ({"idleResourceAssignmentStrategy": "FAIR_SHARE"},
     "queue_options: idleResourceAssignmentStrategy FAIR_SHARE needs fairShare"),
    ({"idleResourceAssignmentStrategy": "FAIREST"},
     "queue_options.idleResourceAssignmentStrategy: Input should be 'FIFO' or 'FAIR_SHARE'"),
    (fair(0), "queue_options.fairShare.halfLifeSeconds: Input should be greater than or equal to 1"),
    ({"shareGroups": [{"name": "g", "quotaShareNames": ["a"]},
                      {"name": "h", "quotaShareNames": ["a"]}]},
     "queue_options: quota share a is in group g and group h"),
    ({"fairShare": {"halfLifeSeconds": 60}},
     "fairShare is given but idleResourceAssignmentStrategy is not"),
    ({"groups": []}, "queue_options.groups: Extra inputs are not permitted"),
])  # fmt: skip
def test_queue_option_errors_name_the_config_key(options, expected):
    message = error_of(options)
    assert message.startswith("c.yaml: invalid configuration")
    assert expected in message, message


# -- the ITP examples: all-borrow plus the queue options the bench measures at 1,715 GPUs ----

DEPARTMENTS = {"large": ["cluster04", "cluster07"],
               "medium": ["cluster02", "cluster03", "cluster06"],
               "small": ["cluster01", "cluster05", "cluster08", "cluster09", "cluster10"]}  # fmt: skip


@pytest.fixture(scope="module")
def itp():
    from quotasched.services.simulate import read_trace

    return read_trace("traces/itp_2021_jobs.csv")


def example(name: str):
    """The example and the all-borrow configuration it must equal but for its queue options."""
    from quotasched.services.simulate.config import load_config

    variant = load_config(f"examples/simulate/{name}.yaml")
    base = load_config("examples/simulate/itp-all-borrow.yaml")
    assert variant.shares == base.shares and variant.environment == base.environment
    return variant, base


def test_the_fair_example_weighs_each_share_by_its_quota_weight():
    variant, base = example("itp-all-borrow-fair")
    weights = [{"quotaShareName": share.name, "weight": round(share.weight)}
               for share in base.shares]  # fmt: skip
    assert wire(variant.queue_options) == {"idleResourceAssignmentStrategy": "FAIR_SHARE",
                                           "fairShare": {"halfLifeSeconds": DAY, "weights": weights}}


def test_the_groups_example_caps_each_department_at_one_and_a_half_its_planned_quotas(itp):
    from quotasched.services.simulate.cluster import plan

    variant, base = example("itp-all-borrow-groups")
    limits = plan(itp, base).limits
    groups = [{"name": name, "quotaShareNames": members, "maxCapacity": [
        {"capacityUnit": "ml.g5.xlarge", "maxCapacity": 3 * sum(limits[m] for m in members) // 2}]}
        for name, members in DEPARTMENTS.items()]  # fmt: skip
    assert wire(variant.queue_options) == {"idleResourceAssignmentStrategy": "FIFO",
                                           "shareGroups": groups}  # fmt: skip
    every = sorted(m for members in DEPARTMENTS.values() for m in members)
    assert every == [share.name for share in base.shares]  # each team in one department


@pytest.mark.parametrize("name", ["itp-all-borrow-fair", "itp-all-borrow-groups"])
def test_the_queue_option_examples_run(itp, name):
    # The core accepts the options (every share they name exists) and the first jobs run.
    variant, _ = example(name)
    run = simulate(itp.head(400), variant, record=True)
    assert len([f for f in run.facts if type(f) is F.JobQueueOptionsSet]) == 1
    assert min(run.end) > 0  # every job finished
