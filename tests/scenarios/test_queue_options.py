"""Queue options beyond AWS (SetJobQueueOptions, docs/options.md): fair-share idle assignment
and share groups, in named scenarios with every expected value worked out by hand.  Each runs
through the Cluster, so the core's invariants and the independent checker watch every command.

Conventions: `g5` capacity; times are the commands' `at`.  D is a share's decayed past
borrowing in instance-seconds (periods of H seconds from t=0, the past halved at every
boundary: D = C[k] + C[k-1]/2 + C[k-2]/4 + ...); borrowers are served by (group rank,
D / weight, acceptance, share name).  The numbers below come from those rules, not from a run.
"""

from __future__ import annotations

from typing import Any

import pytest

from quotasched.events import facts as F
from quotasched.events.codec import encode
from quotasched.services.scheduler.core.fairshare import decayed
from tests.builders import (
    G5,
    Cluster,
    borrowed,
    dispatch_of,
    dispatched_ids,
    kinds,
    of_kind,
    only,
    preempted_ids,
)

Options = dict[str, Any] | None  # wire options of SetJobQueueOptions; None: not set at all
Span = tuple[float, float] | None  # when a borrower held its borrowed instance; None: never


def fair(half_life: int, **weights: int) -> dict[str, Any]:
    """FAIR_SHARE options as wire names: the half-life and each named share's weight."""
    options: dict[str, Any] = {"halfLifeSeconds": half_life}
    if weights:
        options["weights"] = [{"quotaShareName": name, "weight": w} for name, w in weights.items()]
    return {"idleResourceAssignmentStrategy": "FAIR_SHARE", "fairShare": options}


def groups(*members: tuple[str, ...], cap: int | None = None) -> dict[str, Any]:
    """shareGroups: one group per tuple, named g1, g2, ...; `cap` g5 for each when given."""
    found = []
    for number, shares in enumerate(members, start=1):
        group: dict[str, Any] = {"name": f"g{number}", "quotaShareNames": list(shares)}
        if cap is not None:
            group["maxCapacity"] = [{"capacityUnit": G5, "maxCapacity": cap}]
        found.append(group)
    return {"shareGroups": found}


def end(c: Cluster, job_id: str, at: float) -> list[F.Fact]:
    """The job succeeds at `at`."""
    c.at = at
    return c.finish(job_id)


def set_or_tick(c: Cluster, options: Options, at: float) -> list[F.Fact]:
    """SetJobQueueOptions, or (None) a Tick in its place: a command that decides nothing, so
    both runs number their commands alike."""
    return c.tick(at) if options is None else c.queue_options(at=at, **options)


BORROWER = ("LEND_AND_BORROW", 1)


def cluster(capacity: int, options: Options, **shares: tuple) -> Cluster:
    """An environment of `capacity` g5, queue q with the shares given as (strategy, g5 limit)
    or (strategy, g5 limit, True) for in-share preemption, and `options` at t=0."""
    c = Cluster()
    c.environment(g5=capacity)
    c.queue()
    for name, (strategy, limit, *in_share) in shares.items():
        c.share(name, strategy, in_share=bool(in_share), g5=limit)
    set_or_tick(c, options, 0)
    return c


# -- two borrowers after their past borrowing --------------------------------------------------


def two_borrowers(options: Options, a_span: Span, b_span: Span, first: str, free_at: float,
                  changes: tuple[Options, ...] = ()) -> tuple[Cluster, list[F.Fact]]:  # fmt: skip
    """Capacity 4; a and b: LEND_AND_BORROW 1; l: LEND 2.  `options` at t=0 (None: a Tick).

    a1 and b1 hold their shares' own instance from t=0 on.  a2 borrows 1 over `a_span`, b2
    over `b_span` (l's idle instances back it).  One second after the last borrowing ended,
    `changes` are set (None: a Tick), l1 and l2 fill the environment (4 of 4) and the heads a3
    and b3, both would-be borrowers, wait, `first` accepted first.  At `free_at` l1 ends: one
    instance, one borrower.  Returns the cluster and the facts of that last command."""
    c = cluster(4, options, a=BORROWER, b=BORROWER, l=("LEND", 2))
    c.submit("a1", "a", at=0)
    c.submit("b1", "b", at=0)
    moments = []
    for job, span in (("a2", a_span), ("b2", b_span)):
        if span is not None:
            moments += [(span[0], 0, job), (span[1], 1, job)]
    for at, ends, job in sorted(moments):
        if ends:
            end(c, job, at)
        else:
            assert borrowed(dispatch_of(c.submit(job, job[0], at=at), job)) == {G5: 1}
    then = max((at for at, _, _ in moments), default=0) + 1
    for change in changes:
        set_or_tick(c, change, then)
    c.submit("l1", "l", at=then)
    c.submit("l2", "l", at=then)
    for head in (first, "b" if first == "a" else "a"):
        assert dispatched_ids(c.submit(f"{head}3", head, at=then)) == []
    return c, end(c, "l1", free_at)


def served(*args: Any, **kwargs: Any) -> list[str]:
    """Which borrower `two_borrowers` serves when l1 ends."""
    return dispatched_ids(two_borrowers(*args, **kwargs)[1])


def test_fair_share_serves_the_borrower_with_less_past_borrowing_although_it_came_later():
    """H = 100 s.  a borrowed 1 instance over [0, 50): D_a(60) = 1 x 50 = 50 (period 0, nothing
    halved); b never borrowed: D_b = 0.  a3 was accepted before b3, so AWS's FIFO serves a3;
    fair share serves b3, 0 / 1 < 50 / 1."""
    assert served(fair(100), (0, 50), None, "a", free_at=60) == ["b3"]
    assert served(None, (0, 50), None, "a", free_at=60) == ["a3"]


@pytest.mark.parametrize(
    "weights,expected",
    [pytest.param({}, ["b3"], id="no weights: D_a 60 > D_b 40, b3"),
     pytest.param({"a": 2}, ["a3"], id="a weighs 2: 60 / 2 = 30 < 40, a3 although b3 came first"),
     pytest.param({"a": 3, "b": 2}, ["b3"], id="60 / 3 = 40 / 2 = 20: a tie, FIFO serves b3")],
)  # fmt: skip
def test_a_weight_divides_the_past_borrowing(weights, expected):
    """H = 100 s.  a borrowed 1 over [0, 60) and b 1 over [0, 40): at t=70 (period 0) D_a = 60,
    D_b = 40.  b3 was accepted first; the value compared is D / weight."""
    assert served(fair(100, **weights), (0, 60), (0, 40), "b", free_at=70) == expected


@pytest.mark.parametrize(
    "half_life,expected",
    [pytest.param(100, ["a3"], id="H 100: D_a = 80 / 2 = 40 < D_b = 50, a3"),
     pytest.param(1000, ["b3"], id="H 1000: nothing halved, D_a = 80 > D_b = 50, b3")],
)  # fmt: skip
def test_a_period_boundary_halves_the_past(half_life, expected):
    """a borrowed 1 over [0, 80), b 1 over [110, 160); b3 accepted first, l1 ends at t=170.
    With H = 100, a's 80 lie in period 0 and are halved at t=100: D_a(170) = 40; b's 50 lie in
    period 1, the current one: D_b = 50.  So a goes first although it borrowed more in all
    (80 > 50) and its head came later.  With H = 1000 no boundary has passed."""
    c, facts = two_borrowers(fair(half_life), (0, 80), (110, 160), "b", free_at=170)
    assert dispatched_ids(facts) == expected
    queue = c.state.queues["q"]
    halved = 40.0 if half_life == 100 else 80.0
    assert decayed(queue, queue.shares["a"], 170) == halved
    assert decayed(queue, queue.shares["b"], 170) == 50.0


@pytest.mark.parametrize(
    "b_charge,expected",
    [pytest.param(56, ["b3"], id="D_b 56 < D_a 56.25: b3 although a3 came first"),
     pytest.param(57, ["a3"], id="D_b 57 > D_a 56.25: a3")],
)  # fmt: skip
def test_several_boundaries_halve_each_period_once_more(b_charge, expected):
    """H = 100 s.  a borrowed 1 over [50, 250): 50 in period 0, 100 in period 1, 50 in period 2.
    At t=360 (period 3) they were halved 3, 2 and 1 times:
        D_a = 50 / 8 + 100 / 4 + 50 / 2 = 6.25 + 25 + 25 = 56.25.
    b borrowed 1 over [300, 300 + b_charge), all in period 3: D_b = b_charge.  a3 is accepted
    first; b_charge 56 and 57 pin D_a between them, and the exact value is 56.25."""
    c, facts = two_borrowers(fair(100), (50, 250), (300, 300 + b_charge), "a", free_at=360)
    assert dispatched_ids(facts) == expected
    queue = c.state.queues["q"]
    assert decayed(queue, queue.shares["a"], 360) == 56.25
    assert decayed(queue, queue.shares["b"], 360) == float(b_charge)


@pytest.mark.parametrize("first", ["a", "b"])
def test_equal_decayed_borrowing_falls_back_to_fifo(first):
    """H = 100 s.  a borrowed 1 over [0, 80): halved once by t=170, D_a = 40.  b borrowed 1
    over [110, 150): D_b = 40, unhalved.  A tie: the head accepted first is served, whatever
    the share's name."""
    assert served(fair(100), (0, 80), (110, 150), first, free_at=170) == [f"{first}3"]


@pytest.mark.parametrize(
    "changes,expected",
    [pytest.param((), ["b3"], id="unchanged: D_a 50 > D_b 0, b3"),
     pytest.param((fair(100, a=2),), ["b3"], id="a new weight keeps the charges: 50 / 2 = 25 > 0, b3"),
     pytest.param((fair(200),), ["a3"], id="a new half-life starts both at 0: a tie, FIFO a3"),
     pytest.param(({},), ["a3"], id="turned off: FIFO, a3"),
     pytest.param(({}, fair(100)), ["a3"], id="off and on again: both start at 0, FIFO a3")],
)  # fmt: skip
def test_charges_start_again_with_a_new_half_life_or_when_turned_on(changes, expected):
    """H = 100 s.  a borrowed 1 over [0, 50): D_a = 50; b never borrowed: D_b = 0.  At t=51
    (nobody borrows then) the options change; a3 is accepted first and l1 ends at t=60."""
    assert served(fair(100), (0, 50), None, "a", free_at=60, changes=changes) == expected


def test_fair_share_turned_off_gives_the_facts_of_a_run_that_never_set_options():
    """The same story twice: once with fair share and a (non-binding) group set at t=0 and
    turned off at t=61, once with a Tick at both places.  Apart from the two
    JobQueueOptionsSet facts, every fact is the same byte for byte: a3, accepted first, is
    served (FIFO) although a borrowed 60 and b 40 while fair share was on."""
    on = {**fair(100), **groups(("a", "b"), cap=4)}
    with_options, last = two_borrowers(on, (0, 60), (0, 40), "a", free_at=70, changes=({},))
    assert dispatched_ids(last) == ["a3"]
    never, _ = two_borrowers(None, (0, 60), (0, 40), "a", free_at=70, changes=(None,))
    kept = [encode(fact) for fact in with_options.facts
            if not isinstance(fact, F.JobQueueOptionsSet)]  # fmt: skip
    assert len(kept) == len(with_options.facts) - 2
    assert kept == [encode(fact) for fact in never.facts]


# -- the command itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "queue,options,reason,names",
    [pytest.param("q", fair(100, a=2, nope=3), "Quota share nope does not exist in job queue q",
                  {"job_queue": "q", "quota_share_name": "nope"}, id="a weight for an unknown share"),
     pytest.param("q", groups(("a", "ghost")), "Quota share ghost does not exist in job queue q",
                  {"job_queue": "q", "quota_share_name": "ghost"}, id="a group member that does not exist"),
     pytest.param("nq", fair(100), "Job queue nq does not exist", {"job_queue": "nq"},
                  id="an unknown queue")],
)  # fmt: skip
def test_options_naming_what_does_not_exist_are_refused_by_name(queue, options, reason, names):
    c = cluster(2, None, a=BORROWER)
    rejected = only(c.queue_options(queue=queue, **options), F.CommandRejected)
    assert rejected.command_kind == "SetJobQueueOptions" and rejected.status_reason == reason
    assert {name: getattr(rejected, name) for name in names} == names
    assert c.state.queues["q"].options is None and c.state.queues["q"].half_life is None


def test_the_fact_records_the_options_as_they_now_are():
    c = cluster(2, None, a=BORROWER, b=("LEND", 1))
    facts = c.queue_options(at=5, **fair(3600, a=2), **groups(("a", "b"), cap=2))
    assert kinds(facts) == ["JobQueueOptionsSet"]
    fact = only(facts, F.JobQueueOptionsSet)
    assert (fact.job_queue, fact.options_version, fact.at) == ("q", 1, 5.0)
    assert fact.options.summary() == (
        "fair share (half-life 3600 s), group g1 (a, b, at most 2 ml.g5.xlarge)")
    assert only(c.queue_options(at=6), F.JobQueueOptionsSet).options.summary() == "all off"


# -- share groups: lending inside first ----------------------------------------------------------


def department(filler: str, options: Options) -> list[str]:
    """Capacity 4; x: LEND_AND_BORROW 1 and m: LEND 1 form group g1 (when `options` say so);
    o: LEND_AND_BORROW 1 and l: LEND 1 are outside.  At t=0 x1 and o1 use their own instance,
    o2 borrows, and `filler` ("l" or "m") runs one job on its own share: 4 of 4.  o3 (t=1) and
    x2 (t=2) would borrow and wait.  At t=10 o2 ends: one instance is free, and the idle
    lendable capacity is that of whichever of l and m did not run the filler.  Returns who is
    served."""
    c = cluster(4, options, x=BORROWER, m=("LEND", 1), o=BORROWER, l=("LEND", 1))
    for job, share in (("x1", "x"), ("o1", "o"), ("o2", "o"), (f"{filler}1", filler)):
        assert dispatched_ids(c.submit(job, share, at=0)) == [job]
    assert dispatched_ids(c.submit("o3", "o", at=1)) == []
    assert dispatched_ids(c.submit("x2", "x", at=2)) == []
    return dispatched_ids(end(c, "o2", 10))


@pytest.mark.parametrize(
    "filler,options,expected",
    [pytest.param("l", groups(("x", "m")), ["x2"],
                  id="m idle (1 >= the 1 x2 borrows): x2 first, although o3 came first"),
     pytest.param("m", groups(("x", "m")), ["o3"], id="m busy (0 < 1): both rank alike, FIFO o3"),
     pytest.param("l", None, ["o3"], id="no group (AWS): FIFO o3")],
)  # fmt: skip
def test_a_group_lends_inside_first_only_when_its_mates_idle_covers_it(filler, options, expected):
    """After o2 ends the free lendable pool is 1 either way (l's or m's idle instance); only
    whether it is x's group mate's decides.  The second borrower then finds 4 of 4 in use."""
    assert department(filler, options) == expected


# -- share groups: the group's limit ------------------------------------------------------------


def capped_group(cap: int | None) -> Cluster:
    """Capacity 6; x and y: LEND_AND_BORROW 2 in group g1 (at most `cap` g5 while one of them
    borrows; None: no options); l: LEND 2.  At t=0 x1, x2 and y1 run on their own quotas: the
    group holds 3."""
    options = None if cap is None else groups(("x", "y"), cap=cap)
    c = cluster(6, options, x=("LEND_AND_BORROW", 2), y=("LEND_AND_BORROW", 2), l=("LEND", 2))
    for job, share in (("x1", "x"), ("x2", "x"), ("y1", "y")):
        assert borrowed(dispatch_of(c.submit(job, share, at=0), job)) == {}
    return c


def test_a_group_limit_refuses_a_borrowing_dispatch_but_never_one_within_own_quota():
    """x3 (t=1) would take x beyond its 2: the group would hold 3 + 1 = 4 > 3, so it waits
    (RUNNABLE, no fact), although the environment (4 of 6) and l's 2 idle instances would take
    it, as they do without the option.  y2 (t=2) fits y's own 2: it is dispatched, and the
    group holds 4, above its limit, because a member's own quota stays its own."""
    c = capped_group(3)
    assert kinds(c.submit("x3", "x", at=1)) == ["JobSubmitted"]
    assert c.status("x3") == "RUNNABLE"
    facts = c.submit("y2", "y", at=2)
    assert dispatched_ids(facts) == ["y2"] and borrowed(dispatch_of(facts, "y2")) == {}
    assert c.usage("x") + c.usage("y") == 4 and c.status("x3") == "RUNNABLE"

    aws = capped_group(None)
    assert borrowed(dispatch_of(aws.submit("x3", "x", at=1), "x3")) == {G5: 1}


def test_a_group_capped_borrower_is_dispatched_when_a_group_mate_releases():
    """x3 waits for the group's limit (3 + 1 > 3).  l1 (t=3, l's own) takes an instance outside
    the group and ends at t=4: the group still holds 3, x3 still waits.  y1 ends at t=10: the
    group holds 2, and x3 is dispatched then, borrowing 1 (2 + 1 = 3, within the limit)."""
    c = capped_group(3)
    c.submit("x3", "x", at=1)
    assert dispatched_ids(c.submit("l1", "l", at=3)) == ["l1"]
    assert dispatched_ids(end(c, "l1", 4)) == []
    facts = end(c, "y1", 10)
    assert dispatched_ids(facts) == ["x3"]
    assert borrowed(dispatch_of(facts, "x3")) == {G5: 1} and dispatch_of(facts, "x3").at == 10


@pytest.mark.parametrize(
    "cap,victims",
    [pytest.param(3, {"x1", "x2"}, id="limit 3: one victim leaves 2 + 2 = 4 > 3, two are needed"),
     pytest.param(None, {"x2"}, id="no limit (AWS): one victim, the most recently dispatched")],
)  # fmt: skip
def test_the_group_limit_counts_in_a_borrowers_in_share_preemption(cap, victims):
    """Capacity 4; x: LEND_AND_BORROW 1 with in-share preemption and y: RESERVE 1 form g1 (at
    most `cap`); l: LEND 3.  t=0: y1 (y's own), x1 (x's own) and x2 (x borrows 1; the group
    holds 2 + 1 = 3, within 3), priority 0: 3 of 4 in use.  t=1: hi (priority 5) needs 2
    beyond x's limit; 3 + 2 > 4, so only in-share preemption (pass step c) can place it.
    - Without the limit, taking x2 frees enough: 2 + 2 = 4 of 4, x borrows 2, l's 3 idle back
      it.
    - With it, taking x2 leaves the group at y1 + x1 = 2, and hi would bring it to 4 > 3; only
      taking x1 and x2 makes it 1 + 2 = 3."""
    options = None if cap is None else groups(("x", "y"), cap=cap)
    c = cluster(4, options, x=("LEND_AND_BORROW", 1, True), y=("RESERVE", 1), l=("LEND", 3))
    for job, share in (("y1", "y"), ("x1", "x"), ("x2", "x")):
        c.submit(job, share, at=0)
    assert c.dispatched() == {"y1", "x1", "x2"}
    facts = c.submit("hi", "x", priority=5, n=2, at=1)
    assert set(preempted_ids(facts)) == victims
    assert set(dispatch_of(facts, "hi").after_preemption_of) == victims
    assert {fact.reason.value for fact in of_kind(facts, F.JobPreempted)} == {"IN_SHARE_PRIORITY"}


# -- groups and fair share together --------------------------------------------------------------


@pytest.mark.parametrize(
    "options,expected",
    [pytest.param({**groups(("x", "m")), **fair(1000)}, ["x3", "p3"],
                  id="both: x3 (rank 0) first, then p3 (D 10 < 30)"),
     pytest.param(fair(1000), ["p3", "o3"], id="fair share only: p3 (10), o3 (30); x3 (100) waits"),
     pytest.param(groups(("x", "m")), ["x3", "o3"], id="groups only: x3 (rank 0), then FIFO o3"),
     pytest.param(None, ["o3", "x3"], id="neither (AWS): FIFO o3, x3")],
)  # fmt: skip
def test_the_group_rank_comes_first_then_the_fair_value(options, expected):
    """Capacity 6; x: LEND_AND_BORROW 1 and m: LEND 1 (group g1 when set); o and p:
    LEND_AND_BORROW 1; l: LEND 3.  H = 1000 s.  x1, o1 and p1 run on their own quotas from t=0.
    Past borrowing, 1 instance each: x2 over [0, 100), o2 over [100, 130), p2 over [130, 140),
    so at t=200 (period 0) D_x = 100, D_o = 30, D_p = 10.  At t=150 l runs big (2) and l1 (1):
    6 of 6.  o3 (t=151), x3 (t=152) and p3 (t=153) would borrow and wait.  big ends at t=200:
    2 instances, lendable idle m 1 + l 2 = 3, so two borrowers are served, in pass order
    (the order of their JobDispatched facts), and the third finds 6 of 6.  x3 ranks first in
    its group when m's idle 1 covers the 1 it borrows."""
    c = cluster(6, options, x=BORROWER, o=BORROWER, p=BORROWER, m=("LEND", 1), l=("LEND", 3))
    for name in ("x", "o", "p"):
        c.submit(f"{name}1", name, at=0)
    for job, start, stop in (("x2", 0, 100), ("o2", 100, 130), ("p2", 130, 140)):
        assert borrowed(dispatch_of(c.submit(job, job[0], at=start), job)) == {G5: 1}
        end(c, job, stop)
    c.submit("big", "l", n=2, at=150)
    c.submit("l1", "l", at=150)
    for at, job in ((151, "o3"), (152, "x3"), (153, "p3")):
        assert dispatched_ids(c.submit(job, job[0], at=at)) == []
    assert dispatched_ids(end(c, "big", 200)) == expected


def test_a_job_that_must_borrow_beyond_its_groups_limit_blocks_its_share():
    """x (LEND_AND_BORROW 1) and y (LEND 1) form g1, at most 2 g5 while one borrows; l lends 4;
    capacity 6.  wide needs 3 on x: more than x's 1, so it borrows whenever it runs, and 3 > 2
    even with the group empty: it can never fit.  Like AWS's limits, it blocks x
    (QUOTA_MANAGEMENT_LIMIT_EXCEEDED, naming the group's limits), and the queue's 600 s time
    limit for that reason terminates it at 1 + 600 = 601; small (1, x's own quota), behind it,
    is dispatched then.  Lifting the limit (options off) lets a 3-instance job through at once."""
    c = cluster(6, groups(("x", "y"), cap=2), x=BORROWER, y=("LEND", 1), l=("LEND", 4))
    c.command("UpdateJobQueue", jobQueue="q", jobStateTimeLimitActions=[{
        "state": "RUNNABLE", "action": "TERMINATE", "maxTimeSeconds": 600,
        "reason": "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"}])  # fmt: skip
    blocked = only(c.submit("wide", "x", n=3, at=1), F.ShareBlocked)
    assert blocked.reason.value == "MISCONFIGURATION:QUOTA_MANAGEMENT_LIMIT_EXCEEDED"
    assert "share group's capacity limits" in blocked.status_reason
    assert dispatched_ids(c.submit("small", "x", at=2)) == []
    fired = c.tick(1000)
    assert c.status("wide") == "FAILED" and dispatched_ids(fired) == ["small"]
    assert dispatch_of(fired, "small").at == 601

    again = cluster(6, groups(("x", "y"), cap=2), x=BORROWER, y=("LEND", 1), l=("LEND", 4))
    assert kinds(again.submit("wide", "x", n=3, at=1))[-1] == "ShareBlocked"
    facts = again.queue_options(at=2)
    assert kinds(facts)[-1] == "JobDispatched" and dispatch_of(facts, "wide").at == 2


def test_a_deleted_share_leaves_its_group_and_its_weight():
    """a and b form g1 and b weighs 5.  Deleting b leaves g1 = [a] and no weight in the
    queue's options as they read; a share b created again is in no group and weighs 1, and
    the options as read can be sent again as they are."""
    c = cluster(4, {**groups(("a", "b")), **fair(60, b=5)}, a=BORROWER, b=("LEND", 1))
    c.update_share("b", state="DISABLED")
    c.command("DeleteQuotaShare", jobQueue="q", quotaShareName="b")
    queue = c.state.queues["q"]
    options = queue.options.options
    assert [group.quota_share_names for group in options.share_groups] == [["a"]]
    assert options.fair_share.weights is None and queue.weights == {} and queue.group_of == {"a": "g1"}
    c.share("b", "LEND", g5=1)
    assert "b" not in queue.group_of
    again = c.queue_options(**options.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert kinds(again) == ["JobQueueOptionsSet"]
