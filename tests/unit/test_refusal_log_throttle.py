"""The writer's refusal lines, and its story lines (issue 32), bounded (issue 29): `LineBudget` (services/logs.py) and
`RefusalLog` (services/scheduler/refusals.py), driven by an injected clock, no bus.

Per (job queue, quota share) the first 5 refusals of each 10 s window are logged in full
("command rejected"), the rest are counted per reason class and told in one "commands
rejected" line once the window has closed: on the share's next refusal after it, when the
owner asks (`due`, which the writer does on a timer) and at close."""

from __future__ import annotations

import asyncio
from pathlib import Path

from quotasched.events.facts import CommandRejected
from quotasched.services.logs import LineBudget
from quotasched.services.scheduler.refusals import (
    LOG_REFUSAL,
    OTHER_SHARES,
    REFUSAL_LINES,
    REFUSAL_WINDOW_S,
    RefusalLog,
    reason_class,
)

ROOT = Path(__file__).resolve().parents[2]
FULL = ("Quota share qs2 has 200 queued jobs, its limit maxQueuedJobs of 200; submit again "
        "when some have ended")  # fmt: skip
FAST = ("Quota share qs2 already had 20 submissions in this second, its limit "
        "maxSubmissionsPerSecond of 20")  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines:
    """A structlog-like logger that keeps (event, fields) of every info line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **fields) -> None:
        self.lines.append((event, fields))

    def events(self, name: str) -> list[dict]:
        return [fields for event, fields in self.lines if event == name]


def rejected(seq: int, reason: str = FULL, share: str = "qs2") -> CommandRejected:
    return CommandRejected(at=0.0, command_seq=seq, command_kind="SubmitServiceJob",
                           status_reason=reason, job_id=f"f-{seq}", job_queue="q",
                           quota_share_name=share)  # fmt: skip


def refuse(refusals: RefusalLog, seq: int, reason: str = FULL, share: str = "qs2") -> None:
    refusals.rejected(seq, f"qm.cmd.q.{share}.SubmitServiceJob", "q", share,
                      rejected(seq, reason, share))  # fmt: skip


def test_the_defaults_are_five_lines_per_ten_seconds():
    assert (REFUSAL_LINES, REFUSAL_WINDOW_S) == (5, 10.0)


def test_a_flood_is_five_full_lines_then_one_summary_when_the_window_has_closed():
    clock, out = Clock(), Lines()
    refusals = RefusalLog(out, clock=clock)
    for seq in range(1, 301):
        refuse(refusals, seq, FULL if seq % 3 else FAST)
        clock.now += 0.01  # 300 refusals in 3 s: one window
    full = out.events("command rejected")
    assert [line["stream_seq"] for line in full] == [1, 2, 3, 4, 5]
    assert full[0] == {"stream_seq": 1, "job_queue": "q", "quota_share": "qs2", "job_id": "f-1",
                       "subject": "qm.cmd.q.qs2.SubmitServiceJob", "reason": FULL}  # fmt: skip
    assert out.events("commands rejected") == []  # the window is still open
    refusals.due()
    assert out.events("commands rejected") == []
    clock.now = 1000.0 + REFUSAL_WINDOW_S  # it closes 10 s after its first refusal
    refusals.due()
    [summary] = out.events("commands rejected")
    assert summary == {"job_queue": "q", "quota_share": "qs2", "refused": 300, "logged": 5,
                       "held_back": 295, "reasons": {"maxQueuedJobs": 200,
                                                     "maxSubmissionsPerSecond": 100},
                       "first_stream_seq": 1, "last_stream_seq": 300, "window_s": 10.0}  # fmt: skip
    refusals.due()
    refusals.close()
    assert len(out.events("commands rejected")) == 1  # told once


def test_the_next_refusal_after_the_window_tells_its_summary_first_and_opens_a_new_window():
    clock, out = Clock(), Lines()
    refusals = RefusalLog(out, clock=clock)
    for seq in range(1, 9):
        refuse(refusals, seq)
    clock.now += 12.0
    for seq in range(9, 20):
        refuse(refusals, seq)
    events = [(event, fields.get("stream_seq"), fields.get("refused"))
              for event, fields in out.lines]  # fmt: skip
    assert events == ([("command rejected", seq, None) for seq in range(1, 6)]
                      + [("commands rejected", None, 8)]
                      + [("command rejected", seq, None) for seq in range(9, 14)])  # fmt: skip
    refusals.close()  # the open window's summary, at the end of the term
    assert out.events("commands rejected")[-1]["refused"] == 11
    assert out.events("commands rejected")[-1]["held_back"] == 6


def test_a_window_that_held_nothing_back_has_no_summary():
    clock, out = Clock(), Lines()
    refusals = RefusalLog(out, clock=clock)
    for seq in range(1, 6):
        refuse(refusals, seq)
    clock.now += 60
    refusals.due()
    refuse(refusals, 6)
    refusals.close()
    assert len(out.events("command rejected")) == 6 and out.events("commands rejected") == []


def test_each_share_has_its_own_budget():
    clock, out = Clock(), Lines()
    refusals = RefusalLog(out, clock=clock)
    for seq in range(1, 101):
        refuse(refusals, seq, share="qs2" if seq % 2 else "qs3")
    assert len(out.events("command rejected")) == 10
    refusals.close()
    summaries = {line["quota_share"]: line for line in out.events("commands rejected")}
    assert {share: (line["refused"], line["held_back"]) for share, line in summaries.items()} == {
        "qs2": (50, 45), "qs3": (50, 45)}


def test_the_counts_of_every_line_add_up_to_every_refusal_over_many_windows():
    clock, out = Clock(), Lines()
    refusals = RefusalLog(out, clock=clock)
    for seq in range(1, 5001):
        refuse(refusals, seq, share=f"qs{seq % 3}")
        clock.now += 0.013  # 65 s: seven windows per share
        if seq % 200 == 0:
            refusals.due()
    refusals.close()
    full, summaries = out.events("command rejected"), out.events("commands rejected")
    assert len(full) + sum(line["held_back"] for line in summaries) == 5000
    assert len(full) <= 3 * 7 * REFUSAL_LINES
    for line in summaries:
        assert line["refused"] == line["logged"] + line["held_back"]
        assert line["refused"] == sum(line["reasons"].values())


def test_shares_and_reason_classes_are_bounded():
    clock = Clock()
    budget = LineBudget(lines=1, window_s=10.0, clock=clock, max_keys=3, max_kinds=2,
                        overflow_key="others")  # fmt: skip
    for index in range(10):
        budget.admit(f"key-{index}", f"kind-{index % 4}")
    budget.admit("key-0", "kind-1")
    budget.admit("key-0", "kind-2")
    budget.admit("key-0", "kind-3")
    held = {window.key: window for window in budget.flush()}
    assert set(held) == {"key-0", "others"}  # keys 1 and 2 told their one line in full
    assert held["others"].count == 7 and held["others"].told == 1
    assert held["key-0"].kinds == {"kind-0": 1, "kind-1": 1, LineBudget.OTHER: 2}
    assert budget.flush() == [] and budget.next_close() is None


def test_the_next_close_is_the_earliest_window_that_held_lines_back():
    clock = Clock()
    budget = LineBudget(lines=1, window_s=10.0, clock=clock)
    budget.admit("a", "x")  # opens at 1000, holds nothing back
    clock.now = 1002.0
    budget.admit("b", "x")
    budget.admit("b", "x")  # held back: b's window closes at 1012
    assert budget.next_close() == 1012.0
    clock.now = 1012.0
    [closed] = budget.due()
    assert (closed.key, closed.count, closed.held_back) == ("b", 2, 1)
    assert budget.next_close() is None


def test_reason_classes_name_the_limit_or_the_start_of_the_reason():
    assert reason_class(FULL) == "maxQueuedJobs"
    assert reason_class(FAST) == "maxSubmissionsPerSecond"
    assert reason_class("Quota share qs2 would reach 70000000 submission bytes in this 60-second "
                        "window, over its limit maxSubmissionBytesPerWindow of 67108864"
                        ) == "maxSubmissionBytesPerWindow"  # fmt: skip
    assert reason_class(f"{LOG_REFUSAL} (too big); it was not decided") == "the fact log refused"
    long = "Job queue q does not exist " + "x" * 100
    assert reason_class(long) == long[:60] + "..."
    assert reason_class("Job j1 does not exist") == "Job j1 does not exist"


async def test_a_summary_is_told_on_a_timer_when_the_window_closes_without_another_refusal():
    out = Lines()
    loop = asyncio.get_running_loop()
    refusals = RefusalLog(out, lines=2, window_s=0.2, clock=loop.time)
    for seq in range(1, 11):
        refuse(refusals, seq)
    assert out.events("commands rejected") == []
    await asyncio.sleep(0.5)
    [summary] = out.events("commands rejected")
    assert (summary["refused"], summary["logged"], summary["held_back"]) == (10, 2, 8)
    refusals.close()
    assert len(out.events("commands rejected")) == 1


def test_the_overflow_key_is_a_share_no_name_can_be():
    assert OTHER_SHARES == ("*", "*")


def test_the_story_lines_tell_each_dispatch_and_preemption_of_the_notebook():
    """By hand, from the notebook (examples/notebook.jsonl): high and med dispatched (med
    borrowing 1), b1 preempts med (CROSS_SHARE_RECLAIM) and is dispatched after it, low
    preempts high (IN_SHARE_PRIORITY) and is dispatched after it."""
    from tests.builders import Cluster
    from quotasched.services.scheduler.refusals import StoryLog

    c = Cluster()
    lines = Lines()
    story = StoryLog(lines, clock=Clock())
    for seq, line in enumerate((ROOT / "examples" / "notebook.jsonl").read_text().splitlines(), 1):
        story.decided(seq, c.send(line))
    told = [(event, f["job_id"]) for event, f in lines.lines]
    assert told == [("dispatched", "high"), ("dispatched", "med"), ("preempted", "med"),
                    ("dispatched", "b1"), ("preempted", "high"), ("dispatched", "low")]
    med = lines.events("dispatched")[1]
    assert med["borrowed"] == "1 x ml.g5.xlarge" and med["quota_share"] == "qs1"
    assert lines.events("dispatched")[2]["after_preemption_of"] == ["med"]
    assert lines.events("preempted")[0] | {"stream_seq": 0} == {
        "job": "med", "job_id": "med", "attempt": 1, "job_queue": "q", "quota_share": "qs1",
        "by": "b1", "by_job_id": "b1", "reason": "CROSS_SHARE_RECLAIM", "outcome": "REQUEUED",
        "stream_seq": 0}


def test_the_story_lines_name_jobs_whose_ids_are_uuids_by_their_names():
    """The notebook again, each job's id a UUID (as the AWS CLI and the SDK make them): the
    lines read "med (1b4e28ba)" preempted by "b1 (6fa459ea)", the ids kept whole beside."""
    import json

    from tests.builders import Cluster
    from quotasched.services.scheduler.refusals import StoryLog

    ids = {"high": "0f8fad5b-d9cb-469f-a165-70867728950e",
           "med": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
           "low": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
           "b1": "6fa459ea-ee8a-3ca4-894e-db77e160355e"}  # fmt: skip
    c = Cluster()
    lines = Lines()
    story = StoryLog(lines, clock=Clock())
    for seq, line in enumerate((ROOT / "examples" / "notebook.jsonl").read_text().splitlines(), 1):
        command = json.loads(line)
        if "jobId" in command:
            command["jobId"] = ids[command["jobId"]]
        story.decided(seq, c.send(json.dumps(command)), c.state.jobs)
    told = [(event, f["job"]) for event, f in lines.lines]
    assert told == [("dispatched", "high (0f8fad5b)"), ("dispatched", "med (1b4e28ba)"),
                    ("preempted", "med (1b4e28ba)"), ("dispatched", "b1 (6fa459ea)"),
                    ("preempted", "high (0f8fad5b)"), ("dispatched", "low (7c9e6679)")]
    preempted = lines.events("preempted")[0]
    assert (preempted["by"], preempted["by_job_id"]) == ("b1 (6fa459ea)", ids["b1"])
    assert preempted["job_id"] == ids["med"]
    assert lines.events("dispatched")[2]["after_preemption_of"] == ["med (1b4e28ba)"]


def test_the_story_lines_are_bounded_per_share_and_summed_up():
    from tests.builders import Cluster
    from quotasched.services.scheduler.refusals import STORY_LINES, STORY_WINDOW_S, StoryLog

    c = Cluster()
    c.environment(g5=100)
    c.queue()
    c.share("big", "RESERVE", g5=100)
    clock, lines = Clock(), Lines()
    story = StoryLog(lines, clock=clock)
    for n in range(STORY_LINES + 5):
        story.decided(n, c.submit(f"j{n}", "big"))
    assert len(lines.events("dispatched")) == STORY_LINES
    clock.now += STORY_WINDOW_S
    story.due()
    [summary] = lines.events("decisions not logged in full")
    assert (summary["decisions"], summary["logged"], summary["held_back"]) == (
        STORY_LINES + 5, STORY_LINES, 5)
    assert summary["kinds"] == {"JobDispatched": STORY_LINES + 5}
