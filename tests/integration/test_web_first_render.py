"""The web view's first render, waiting lists, names and usage step lines (issue 32 points 2
to 5), against a real `quotasched up` (its scheduler, projector and web view) and a story of
jobs with UUID ids worked out by hand:

    queue uq on se-uq (2 x ml.g5.xlarge): team-a (limit 1, LEND_AND_BORROW, in-share
    preemption ENABLED), team-b (limit 1, RESERVE)
    train-small (priority 1) runs in team-a; train-big (priority 5) preempts it (team-b
    lends nothing); eval (priority 1) waits behind train-small; batch-00 runs in team-b and
    batch-01..22 wait behind it; xss-job (its tag and the reason it is terminated with carry
    markup) is submitted to team-a and terminated.

So 2 instances are in use (train-big, batch-00), team-a waits [train-small, eval] and team-b
[batch-01, ..., batch-22].  The expectations come from that story and from the scheduler's
own read API, never from the web code under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from html.parser import HTMLParser

import aiohttp
import pytest

from quotasched.events.codec import DecodeError, decode_command
from quotasched.events.labels import job_label
from quotasched.services.client import Bus
from quotasched.services.client.commands import ClientError
from quotasched.services.report import png as report_png
from tests.integration.conftest import Process
from tests.integration.helpers import NO_TICKS, eventually, read_facts
from tests.integration.test_web_view import Browser

pytestmark = [pytest.mark.nats]

UNIT = "ml.g5.xlarge"
LONG = {"duration": "3600"}  # every job here runs through the whole module
SMALL, BIG, EVAL = ("0b3d5a6e-1c7f-4e8a-9b2d-3f4e5a6b7c8d", "7e9f0a1b-2c3d-4e5f-8a9b-0c1d2e3f4a5b",
                    "c4d5e6f7-a8b9-4c0d-9e1f-2a3b4c5d6e7f")  # fmt: skip
BATCH = [f"{n:08x}-0000-4000-8000-{n:012x}" for n in range(23)]
IMG = "<img src=x onerror=alert(1)>"
SCRIPT = "</script><script>window.__xss = 1</script>"
MARKUP = f"{IMG} {SCRIPT}"


def submit(job_id: str, name: str, share: str, priority: int, tags: dict | None = None) -> dict:
    return {"kind": "SubmitServiceJob", "jobId": job_id, "jobName": name, "jobQueue": "uq",
            "quotaShareName": share, "schedulingPriority": priority, "tags": tags or LONG,
            "capacityUsage": [{"capacityUnit": UNIT, "quantity": 1}]}  # fmt: skip


SETUP = [
    {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se-uq",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 2}]},
    {"kind": "CreateSchedulingPolicy", "name": "sp-uq",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"kind": "CreateJobQueue", "jobQueueName": "uq", "schedulingPolicy": "sp-uq",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se-uq"}]},
    {"kind": "CreateQuotaShare", "jobQueue": "uq", "quotaShareName": "team-a",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 100},
     "preemptionConfiguration": {"inSharePreemption": "ENABLED"}},
    {"kind": "CreateQuotaShare", "jobQueue": "uq", "quotaShareName": "team-b",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "RESERVE"},
     "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
    submit(SMALL, "train-small", "team-a", 1),
    submit(BIG, "train-big", "team-a", 5),
    submit(EVAL, "eval", "team-a", 1),
    *(submit(job_id, f"batch-{n:02d}", "team-b", 0) for n, job_id in enumerate(BATCH)),
]  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(NATS URL, web URL) of `quotasched up --executor simulated` after the story."""
    tmp = tmp_path_factory.mktemp("web-first-render")
    up = Process(["up", "--data-dir", str(tmp / "data"), "--executor", "simulated"],
                 {**os.environ, **NO_TICKS}, tmp / "up.log")  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("WEB=") for line in up.output().splitlines()):
            assert up.popen.poll() is None and time.monotonic() < deadline, up.output()
            time.sleep(0.1)
        lines = up.output().splitlines()
        nats = next(line for line in lines if line.startswith("nats://"))
        web = next(line.split("=", 1)[1] for line in lines if line.startswith("WEB="))
        yield nats, web
    finally:
        assert up.stop() == 0, up.output()


@pytest.fixture(scope="module")
def story(stack):
    """The story's commands, then the markup scenario: names and ids refuse markup (so it
    cannot reach the page through them); a tag and a termination reason take it.  Answers
    which fields refused markup."""
    asyncio.run(tell_story(stack[0]))
    refused = {}
    for field, command in (("jobName", submit("bad-name", IMG, "team-a", 0)),
                           ("jobId", submit(IMG, "bad-id", "team-a", 0)),
                           ("quotaShareName", {**SETUP[3], "quotaShareName": IMG}),
                           ("jobQueueName", {**SETUP[2], "jobQueueName": IMG}),
                           ("serviceEnvironmentName", {**SETUP[0],
                                                       "serviceEnvironmentName": IMG})):
        with pytest.raises(DecodeError) as refusal:  # the codec the scheduler decodes with
            decode_command(json.dumps(command))
        refused[field] = refusal.value.reason
    return refused


async def tell_story(nats: str) -> None:
    async with Bus(nats, name="test-web-first-render") as bus:
        for command in SETUP:
            facts = await bus.submit_and_wait(command)
            assert all(f.kind != "CommandRejected" for f in facts), (command, facts)
        await bus.submit_and_wait(submit("xss-job", "xss-job", "team-a", 0,
                                         {**LONG, "note": MARKUP}))  # fmt: skip
        await bus.submit_and_wait({"kind": "TerminateServiceJob", "jobId": "xss-job",
                                   "reason": MARKUP}, route=("uq", "team-a"))  # fmt: skip


async def get(session: aiohttp.ClientSession, url: str, status: int = 200) -> dict:
    async with session.get(url) as response:
        assert response.status == status, await response.text()
        return await response.json()


async def page_html(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200 and response.content_type == "text/html"
        return await response.text()


class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str, **attrs: str) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                wanted = {key.replace("_", "-"): value for key, value in attrs.items()}
                if child.tag == tag and all(child.attrs.get(k) == v for k, v in wanted.items()):
                    found.append(child)
                found += child.all(tag, **attrs)
        return found


class Tree(HTMLParser):
    """The page as html.parser reads it: elements, their attributes and their text."""

    VOID = {"meta", "link", "input", "br", "img", "hr", "source", "col"}

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.root = self.at = Node("#document", {}, None)
        self.tags: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        node = Node(tag, dict(attrs), self.at)
        self.at.children.append(node)
        if tag not in self.VOID:
            self.at = node

    def handle_endtag(self, tag):
        at = self.at
        while at.parent is not None and at.tag != tag:
            at = at.parent
        if at.parent is not None:
            self.at = at.parent

    def handle_data(self, data):
        self.at.children.append(data)


def by_id(tree: Tree, tag: str, id_: str) -> Node:
    (node,) = tree.root.all(tag, id=id_)
    return node


async def test_the_server_renders_the_first_state_with_names_waiting_lists_and_usage(stack, story):
    nats, web = stack
    async with Bus(nats) as bus, aiohttp.ClientSession() as session:
        # the projector and the view's follower read the log a moment behind the scheduler
        async def followed():
            usage = await get(session, f"{web}/api/usage?name=uq&window=15m")
            activity = await get(session, f"{web}/api/activity?name=uq")
            return (usage.get("series") and usage["series"][-1]["points"][-1][1] == 2
                    and any(e["kind"] == "JobPreempted" for e in activity["events"]))
        await eventually(followed, timeout=60, what="the projection and the follower")
        html = await page_html(session, f"{web}/?queue=uq")
        waiting = {share: await bus.request("list-waiting-jobs", jobQueue="uq",
                                            quotaShareName=share)
                   for share in ("team-a", "team-b")}  # fmt: skip
    tree = Tree(html)
    # the shares, as list-quota-shares answers them (by hand: 1 of 1 in use in each)
    rows = [[td.text() for td in tr.all("td")] for tr in by_id(tree, "table", "shares").all("tr")]
    assert [(r[0], r[1], r[4]) for r in rows if r] == [
        ("team-a", "LEND_AND_BORROW (borrow limit 100%)", "1 / 1"), ("team-b", "RESERVE", "1 / 1")]
    assert "service environment se-uq (ENABLED): 2 of 2 ml.g5.xlarge in use" in \
        by_id(tree, "p", "environment").text()
    # the waiting jobs of each share in dispatch order (by hand), named, each with the core's
    # reason as the scheduler's read API gives it
    by_hand = {"team-a": [SMALL, EVAL], "team-b": BATCH[1:21]}
    for share, ids in by_hand.items():
        (part,) = tree.root.all("div", data_share=share)
        shown = part.all("tr")[1:]  # past the header
        assert [tr.attrs["data-job-id"] for tr in shown] == ids
        answer = waiting[share]
        assert [job["jobId"] for job in answer["jobs"]] == ids
        for position, (tr, job) in enumerate(zip(shown, answer["jobs"]), start=1):
            number, who, priority, why = tr.all("td")
            assert (number.text(), priority.text()) == (str(position),
                                                        str(job["schedulingPriority"]))
            (link,) = who.all("a")
            assert link.text() == job_label(job["jobId"], job["jobName"])
            assert link.attrs["title"] == f"job id {job['jobId']}"  # the full id kept
            assert why.all("code")[0].text() == job["waitingReason"]["code"]
            assert why.text() == f"{job['waitingReason']['code']} {job['waitingReason']['message']}"
    (team_a,) = tree.root.all("div", data_share="team-a")
    small, eval_ = [tr.all("td")[1].text() for tr in team_a.all("tr")[1:]]
    assert (small, eval_) == ("train-small (0b3d5a6e)", "eval (c4d5e6f7)")
    codes = [tr.all("code")[0].text() for tr in team_a.all("tr")[1:]]
    assert codes[1] == "behind_earlier"  # eval: priority 1, after train-small (by hand)
    assert "train-small (0b3d5a6e)" in team_a.all("tr")[2].text()  # behind whom, by name
    (team_b,) = tree.root.all("div", data_share="team-b")
    assert "1-20 of 22 waiting" in team_b.text()
    (nxt,) = team_b.all("a", **{"class": "next"})
    assert "offset=20" in nxt.attrs["href"] and "share=team-b" in nxt.attrs["href"]
    # the activity names jobs by their labels, the ids in the title
    items = by_id(tree, "ol", "activity").all("li")
    preempted = [li for li in items if li.attrs["class"] == "JobPreempted"]
    assert len(preempted) == 1
    assert "train-small (0b3d5a6e) preempted by train-big (7e9f0a1b)" in preempted[0].text()
    assert preempted[0].attrs["title"] == f"job ids: {SMALL}, {BIG}"
    assert any("train-big (7e9f0a1b) dispatched in team-a" in li.text() for li in items)
    assert not any(BIG in li.text() for li in items)  # no UUID in a sentence
    # the usage step line, drawn on the server too: 2 instances in use reads 2
    svg = by_id(tree, "svg", "usage-svg")
    legend = [text.text() for text in svg.all("text", **{"class": "legend"})]
    assert legend == ["team-a (1 now)", "team-b (1 now)", "all shares (2 now)"]


async def test_a_job_is_searched_by_name_and_shown_by_its_label(stack, story):
    _, web = stack
    async with aiohttp.ClientSession() as session:
        found = await get(session, f"{web}/api/job?id=train-big")
        assert (found["jobId"], found["jobLabel"]) == (BIG, "train-big (7e9f0a1b)")
        by_id_ = await get(session, f"{web}/api/job?id={BIG}")
        assert by_id_["jobLabel"] == "train-big (7e9f0a1b)"
        tree = Tree(await page_html(session, f"{web}/?queue=uq&job=train-big"))
    (summary,) = by_id(tree, "div", "job").all("p")
    assert summary.text().startswith("train-big (7e9f0a1b) in uq/team-a: ")
    assert summary.attrs["title"] == f"job id {BIG}"
    assert by_id(tree, "input", "job-id").attrs["value"] == "train-big"


async def test_waiting_pages_and_their_edges(stack, story):
    nats, web = stack
    base = f"{web}/api/waiting?name=uq&share=team-b"
    async with aiohttp.ClientSession() as session:
        first = await get(session, base)
        paging = (first["total"], first["offset"], first["limit"], first["nextOffset"])
        assert paging == (22, 0, 20, 20)
        assert [job["jobName"] for job in first["jobs"]] == [f"batch-{n:02d}" for n in range(1, 21)]
        assert first["jobs"][0]["jobLabel"] == f"batch-01 ({BATCH[1][:8]})"
        second = await get(session, f"{base}&offset=20")
        assert [job["jobId"] for job in second["jobs"]] == BATCH[21:]
        assert second["nextOffset"] is None
        # offset past the end: no jobs, the total still told
        past = await get(session, f"{base}&offset=22")
        assert (past["jobs"], past["total"], past["nextOffset"]) == ([], 22, None)
        far = await get(session, f"{base}&offset=1000")
        assert (far["jobs"], far["total"]) == ([], 22)
        # limit 0: the count alone
        counted = await get(session, f"{base}&limit=0")
        assert (counted["jobs"], counted["total"], counted["nextOffset"]) == ([], 22, None)
        one = await get(session, f"{base}&offset=21&limit=1")
        assert [job["jobName"] for job in one["jobs"]] == ["batch-22"]
        # over the bound, negative, or not a number: 400 with a clear message
        over = await get(session, f"{base}&limit=101", status=400)
        assert over["error"] == "limit must be an integer from 0 to 100, not 101"
        negative = await get(session, f"{base}&offset=-1", status=400)
        assert negative["error"] == "offset must be an integer of 0 or more, not -1"
        word = await get(session, f"{base}&limit=many", status=400)
        assert word["error"] == "limit must be an integer, not 'many'"
        unknown = await get(session, f"{web}/api/waiting?name=uq&share=nope", status=400)
        assert "nope" in unknown["error"]
        missing = await get(session, f"{web}/api/waiting?name=uq", status=400)
        assert "share" in missing["error"]
        # the page of one share, as /api/queue gives it under the share filter
        view = await get(session, f"{web}/api/queue?name=uq&share=team-b&offset=20")
        assert list(view["waiting"]) == ["team-b"]
        assert [job["jobId"] for job in view["waiting"]["team-b"]["jobs"]] == BATCH[21:]
        tree = Tree(await page_html(session, f"{web}/?queue=uq&share=team-b&offset=20"))
    (part,) = tree.root.all("div", **{"class": "share-waiting"})
    assert part.attrs["data-share"] == "team-b" and "21-22 of 22 waiting" in part.text()
    (back,) = part.all("a", **{"class": "previous"})
    assert "offset" not in back.attrs["href"] and back.attrs["data-offset"] == "0"
    # the scheduler refuses the same bounds on its own verb
    async with Bus(nats) as bus:
        with pytest.raises(ClientError, match="limit must be an integer from 0 to 100, not 500"):
            await bus.request("list-waiting-jobs", jobQueue="uq", quotaShareName="team-b",
                              limit=500)  # fmt: skip


async def test_usage_steps_at_the_facts_times_and_reads_whole_instances(stack, story):
    nats, web = stack
    async with Bus(nats) as bus, aiohttp.ClientSession() as session:
        usage = await get(session, f"{web}/api/usage?name=uq&window=1h")
        snapshot = await bus.request("get-job-queue-snapshot", jobQueue="uq")
        shares = (await bus.request("list-quota-shares", jobQueue="uq"))["quotaShares"]
        every = await read_facts(bus.js)
    facts = [f for f in every if f.get("jobQueue") == "uq"]
    assert usage["available"] and not usage["truncated"]
    lines = {line["label"]: line["points"] for line in usage["series"]}
    assert list(lines) == ["team-a", "team-b", "all shares"]
    # now: 2 instances in use read 2 (by hand: train-big and batch-00), as the scheduler says
    (total,) = snapshot["queueUtilization"]["totalCapacityUsage"]
    assert lines["all shares"][-1][1] == 2 == total["quantity"]
    for share in shares:
        assert lines[share["quotaShareName"]][-1][1] == share["usage"][UNIT] == 1
    # every step is at a dispatch, preemption or end fact's own time, every level whole
    moved = {f["at"] for f in facts if f["kind"] in ("JobDispatched", "JobPreempted")
             or f["kind"] == "JobStatusChanged" and f["status"] in ("SUCCEEDED", "FAILED")}
    created = {f["at"] for f in every if f["kind"].endswith("Created")}
    for points in lines.values():
        assert all(isinstance(n, int) for _, n in points)
        levels = [n for _, n in points]
        steps = [at for (at, n), before in zip(points[1:], levels) if n != before]
        assert steps and set(steps) <= moved, (points, moved)
        assert points[0][0] in created | moved | {usage["t0"]}
    # by hand, team-a held 1 (train-small), 0 (preempted), 1 (train-big): never 2
    assert [n for _, n in lines["team-a"]] == [0, 1, 0, 1, 1]
    async with aiohttp.ClientSession() as session:
        assert (await get(session, f"{web}/api/usage", status=400))["error"].startswith("give")


async def test_markup_in_every_free_text_field_is_shown_only_escaped(stack, story, tmp_path):
    """Names and ids (jobs, shares, queues, environments) refuse markup (the contract's name
    rule, in the codec the scheduler decodes every command with), so it can reach the page
    only through free text: a tag and a termination reason."""
    assert all("letters, digits, hyphens (-) and underscores (_)" in reason
               for reason in story.values()) and len(story) == 5, story
    _, web = stack
    async with aiohttp.ClientSession() as session:
        html = await page_html(session, f"{web}/?queue=uq&job=xss-job")
        activity = await get(session, f"{web}/api/activity?name=uq")
    ended = [e for e in activity["events"] if e["jobId"] == "xss-job"]
    assert ended and MARKUP in ended[0]["sentence"]  # the reason reaches the page
    tree = Tree(html)
    assert "img" not in tree.tags and tree.tags.count("script") == 3  # chart.js, state, app.js
    assert IMG not in html and SCRIPT not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    # the reason, as text: in the activity, the job's summary and its attempts
    texts = [li.text() for li in by_id(tree, "ol", "activity").all("li")]
    assert any(text.endswith(f"xss-job is FAILED (terminated): {MARKUP}") for text in texts), texts
    assert MARKUP in by_id(tree, "div", "job").text()
    state = json.loads(by_id(tree, "script", "first-state").text())
    assert MARKUP in json.dumps(state["activity"], ensure_ascii=False)
    # the live page: the script renders the same values as text, never as markup
    browser = report_png.chromium()
    if browser is None:
        pytest.skip("NO HEADLESS CHROMIUM: the live page's DOM was not checked (install "
                    "chromium or set QUOTASCHED_CHROMIUM); the server's HTML was")
    async with Browser(browser, tmp_path / "profile") as chromium:
        page = await chromium.open(f"{web}/?queue=uq&job=xss-job")
        await chromium.until(page, lambda text: MARKUP in text and "as of fact" not in text,
                             "the reason, as text, on the live page")  # fmt: skip
        # the story again, as the script renders a search's answer
        await chromium.call("Runtime.evaluate", page, expression=(
            "document.getElementById('job').replaceChildren();"
            "document.getElementById('search').requestSubmit()"))  # fmt: skip
        await chromium.until(page, lambda text: f"in uq/team-a: FAILED ({MARKUP})" in text,
                             "the job's summary, rendered by the script")  # fmt: skip
        checked = await chromium.call("Runtime.evaluate", page, returnByValue=True, expression=(
            "JSON.stringify([document.querySelectorAll('img').length, "
            "document.querySelectorAll('script').length, typeof window.__xss])"))  # fmt: skip
    assert json.loads(checked["result"]["value"]) == [0, 3, "undefined"]


def test_dump_dom_shows_the_data_without_waiting_for_the_script(stack, story, tmp_path):
    """`chromium --headless --dump-dom` returns at the page's load: what it shows is the
    server's first state (the page goes live only after its load)."""
    browser = report_png.chromium()
    if browser is None:
        pytest.skip("NO HEADLESS CHROMIUM: --dump-dom was not tried")
    _, web = stack
    dumped = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                             f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                             f"{web}/?queue=uq"], capture_output=True, text=True, timeout=120)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    tree = Tree(dumped.stdout)
    (team_a,) = tree.root.all("div", data_share="team-a")
    assert [tr.attrs["data-job-id"] for tr in team_a.all("tr")[1:]] == [SMALL, EVAL]
    assert "train-small (0b3d5a6e) preempted by train-big (7e9f0a1b)" in \
        by_id(tree, "ol", "activity").text()


def test_a_long_share_answers_full_pages_in_order_each_job_told_how_many_are_ahead():
    """A share of 1,299 waiting jobs (one priority, so by hand the order of acceptance):
    every page is full, the pages list every waiting job once, in order, and each reason
    counts the jobs ahead of it as explain does (the 1,291st waiting job has 1,290 ahead)."""
    from quotasched.services.replay import replay_lines
    from quotasched.services.scheduler import api
    from quotasched.services.scheduler.core import State
    from quotasched.services.scheduler.core.waiting import waiting

    commands = [{**SETUP[0], "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}]},
                SETUP[1], SETUP[2], SETUP[4]]  # fmt: skip
    ids = [f"long-{n:04d}" for n in range(1300)]
    commands += [submit(job_id, job_id, "team-b", 0) for job_id in ids]
    state = State()
    for _ in replay_lines([json.dumps(command) for command in commands], state):
        pass
    ask = {"jobQueue": "uq", "quotaShareName": "team-b"}
    first = api.answer(state, "list-waiting-jobs", ask)
    assert first["total"] == 1299 and len(first["jobs"]) == 20  # ids[0] runs
    seen, offset = [], 0
    while offset is not None:
        page = api.answer(state, "list-waiting-jobs", {**ask, "offset": offset, "limit": 100})
        seen += [job["jobId"] for job in page["jobs"]]
        offset = page["nextOffset"]
    assert seen == ids[1:]
    last = api.answer(state, "list-waiting-jobs", {**ask, "offset": 1290})
    assert [job["jobId"] for job in last["jobs"]] == ids[1291:] and last["nextOffset"] is None
    assert all(job["waitingReason"]["code"] == "behind_earlier" for job in last["jobs"])
    told = last["jobs"][0]["waitingReason"]["message"]
    assert "(1290 jobs are ahead of it in team-b)" in told
    assert told == waiting(state, state.jobs[ids[1291]]).text  # explain's own count
