"""Options beyond AWS in the projection: a lending limit caps a share's lendable idle in
`share_usage`, `queue_usage` and the utilization rollups' `lent_s`, exactly as the decision core
caps what it lends (docs/options.md).  Expected values by hand.

b (LEND 4) lends at most 2 from t=0; a (LEND_AND_BORROW 1) runs a1 on its own instance from
t=1 and borrows 2 more (a2, a3; a4 waits: nothing else is lendable); b runs b1 and b2 from t=2
(its idle 3, then 2: still 2 lendable); at t=4 the limit is lifted (options {}), and b's
lendable idle is its whole idle quota, 2.
"""

from __future__ import annotations

import pytest

from tests.projections.helpers import G5, by_key, command, facts_of, project, rows, setup, share, submit

LIMIT = [{"capacityUnit": G5, "maxCapacity": 2}]


def commands(limit: list[dict] | None = LIMIT) -> list[dict]:
    options = {} if limit is None else {"lendingLimits": limit}
    return [
        *setup({G5: 5}, [share("a", 1, "LEND_AND_BORROW"), share("b", 4, "LEND")]),
        command("SetQuotaShareOptions", 0, jobQueue="q", quotaShareName="b", options=options),
        *(submit(1, f"a{i}", "a") for i in range(1, 5)),
        submit(2, "b1", "b"), submit(2, "b2", "b"),
        command("SetQuotaShareOptions", 4, jobQueue="q", quotaShareName="b", options={}),
    ]


@pytest.fixture(scope="module")
def con():
    projection = project(facts_of(commands()))
    yield projection.con
    projection.close()


def test_a_lending_limit_caps_the_shares_lendable_idle(con):
    steps = rows(con, """SELECT "at", in_use, lendable_idle FROM share_usage
                         WHERE quota_share = 'b' ORDER BY seq""")
    assert steps[0] == (0.0, 0, 4)  # created: all 4 idle and lendable
    assert steps[1:] == [(0.0, 0, 2), (2.0, 1, 2), (2.0, 2, 2), (4.0, 2, 2)]
    assert by_key(con, """SELECT quota_share, max(borrowed) FROM share_usage
                          GROUP BY quota_share""") == {"a": 2, "b": 0}  # fmt: skip
    assert rows(con, "SELECT status FROM jobs WHERE job_id = 'a4'") == [("RUNNABLE",)]


def test_what_is_lent_is_what_is_borrowed_under_the_limit(con):
    """From t=1 to t=4: a borrows 2, b lends 2 (its capped idle), so lent_s = borrowed_s."""
    totals = by_key(con, """SELECT quota_share, sum(borrowed_s), sum(lent_s)
                            FROM utilization(1, 4, 3) GROUP BY quota_share""")  # fmt: skip
    assert totals == {"a": (6.0, 0.0), "b": (0.0, 6.0)}
