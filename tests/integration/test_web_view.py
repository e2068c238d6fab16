"""The live web view of a real `quotasched up` (services/web): its JSON answers what the
scheduler's read API answers for the notebook's story, its event stream pushes a new job's
submission, its page ships Chart.js itself, and (with a headless Chromium) the page shows the
shares and updates live.  test_web_first_render.py has the first render, the waiting lists'
pages, the names of UUID-id jobs, the usage step lines and the escaping of markup."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from quotasched.events.labels import job_label
from quotasched.services.client import Bus
from quotasched.services.report import png as report_png
from tests.integration.conftest import Process
from tests.integration.helpers import NO_TICKS

pytestmark = [pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]
UNIT = "ml.g5.xlarge"
START_CEILING_S = 120.0  # generous, for 2 busy cores


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(NATS URL, web URL) of `quotasched up --executor simulated` (with its projector)."""
    tmp = tmp_path_factory.mktemp("web-view")
    up = Process(["up", "--data-dir", str(tmp / "data"), "--executor", "simulated"],
                 {**os.environ, **NO_TICKS}, tmp / "up.log")  # fmt: skip
    try:
        deadline = time.monotonic() + START_CEILING_S
        while not any(line.startswith("WEB=") for line in up.output().splitlines()):
            if up.popen.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`up` printed no WEB= line:\n{up.output()}")
            time.sleep(0.1)
        lines = [line for line in up.output().splitlines()
                 if line.startswith(("nats://", "AWS_ENDPOINT_URL_BATCH=", "WEB="))]  # fmt: skip
        assert [line.split(":", 1)[0].split("=")[0] for line in lines] == \
            ["nats", "AWS_ENDPOINT_URL_BATCH", "WEB"], lines  # its own line, after the AWS one
        web = lines[2].split("=", 1)[1]
        assert web.startswith("http://127.0.0.1:")  # loopback only
        yield lines[0], web
    finally:
        assert up.stop() == 0, up.output()


async def notebook(bus: Bus) -> None:
    """The notebook's commands as a live client sends them (stamped by the scheduler)."""
    for line in (ROOT / "examples" / "notebook.jsonl").read_text().splitlines():
        command = json.loads(line)
        command.pop("at", None)
        await bus.submit_and_wait(command)


async def get(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def next_event(stream: aiohttp.ClientResponse, wanted, timeout: float = 10.0) -> dict:
    """The first `fact` event of the stream for which wanted(event) holds."""
    async def read() -> dict:
        kind = None
        async for raw in stream.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "fact":
                event = json.loads(line[6:])
                if wanted(event):
                    return event
        raise AssertionError("the event stream ended")

    return await asyncio.wait_for(read(), timeout)


async def test_the_web_view_answers_what_the_scheduler_answers_and_pushes_facts(stack):
    nats_url, web = stack
    async with Bus(nats_url, name="test-web-view") as bus, aiohttp.ClientSession() as session:
        async with session.get(f"{web}/api/events") as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            await notebook(bus)
            # the stream pushed the notebook's facts as they landed
            event = await next_event(stream, lambda e: e["kind"] == "JobPreempted")
            assert event["jobQueue"] == "q"

            queues = await get(session, f"{web}/api/queues")
            assert queues["jobQueues"] == ["q"] and queues["position"] >= event["seq"]
            view = await get(session, f"{web}/api/queue?name=q")
            shares = (await bus.request("list-quota-shares", jobQueue="q"))["quotaShares"]
            assert [s["quotaShareName"] for s in view["shares"]] == ["qs1", "qs2", "qs3"]
            assert view["units"] == [UNIT]
            for row, share in zip(view["shares"], shares):
                unit = row["units"][UNIT]
                assert unit["limit"] == 1 == share["capacityLimits"][0]["maxCapacity"]
                assert unit["inUse"] == share["usage"].get(UNIT, 0)
                assert row["strategy"] == share["resourceSharingConfiguration"]["strategy"]
            # by hand: low (raised to 4) runs in qs1 after preempting high, b1 took qs2 back
            in_use = {row["quotaShareName"]: row["units"][UNIT]["inUse"] for row in view["shares"]}
            assert in_use == {"qs1": 1, "qs2": 1, "qs3": 0}
            # per share, jobs pending / admitted (from the projection, a moment behind): by
            # hand, qs1 has high and med waiting and low running, qs2 runs b1, qs3 nothing
            async def counted():
                view = await get(session, f"{web}/api/queue?name=q")
                return {row["quotaShareName"]: row["jobs"] for row in view["shares"]}
            deadline = time.monotonic() + 30
            while (counts := await counted()) != {"qs1": {"pending": 2, "admitted": 1},
                                                   "qs2": {"pending": 0, "admitted": 1},
                                                   "qs3": {}}:  # fmt: skip
                assert time.monotonic() < deadline, counts
                await asyncio.sleep(0.2)
            # the service environment: 3 instances, 2 of them in use (low and b1)
            assert view["environment"] == {"name": "se", "state": "ENABLED", "capacity": [
                {"capacityUnit": UNIT, "maxCapacity": 3, "inUse": 2}]}  # fmt: skip
            assert all(row["units"][UNIT]["borrowed"] == 0 for row in view["shares"])
            snapshot = await bus.request("get-job-queue-snapshot", jobQueue="q")
            heads = {share: jobs[0]["jobArn"].rsplit("/", 1)[-1]
                     for share, jobs in snapshot["frontOfQuotaShares"]["quotaShares"].items()
                     if jobs}  # fmt: skip
            assert {h["quotaShareName"]: h["jobId"] for h in view["heads"]} == heads == {"qs1": "high"}
            # by hand: low runs in qs1 at its limit, b1 took qs2's instance back and qs3 is
            # RESERVE, so high could only borrow and nothing is idle to lend
            head = view["heads"][0]
            assert head["waitingCode"] == "no_idle_lendable", head
            assert "no idle lendable capacity in other shares" in head["waitingReason"], head
            # the page, the snapshot and explain tell the same reason (the core's)
            told = await get(session, f"{web}/api/job?id=high")
            waits = [e["sentence"] for e in told["story"] if e["kind"] == "Waiting"]
            assert waits and head["waitingReason"] == waits[-1], (head, waits)
            front = snapshot["frontOfQuotaShares"]["quotaShares"]["qs1"][0]["waitingReason"]
            assert front == {"code": head["waitingCode"], "message": head["waitingReason"]}
            # every waiting job of each share, in dispatch order: by hand, qs1 has high
            # (priority 3) then med (2), which waits behind high; the reasons are the core's
            listed = await bus.request("list-waiting-jobs", jobQueue="q", quotaShareName="qs1")
            qs1 = view["waiting"]["qs1"]
            assert [job["jobId"] for job in qs1["jobs"]] == ["high", "med"] == \
                [job["jobId"] for job in listed["jobs"]]
            assert [job["waitingReason"] for job in qs1["jobs"]] == \
                [job["waitingReason"] for job in listed["jobs"]]
            assert qs1["jobs"][0]["waitingReason"] == front
            assert qs1["jobs"][1]["waitingReason"]["code"] == "behind_higher_priority"
            assert (view["waiting"]["qs2"]["total"], view["waiting"]["qs3"]["jobs"]) == (0, [])

            activity = await get(session, f"{web}/api/activity?name=q")
            kinds = [e["kind"] for e in activity["events"]]
            assert kinds.count("JobPreempted") == 2 and "JobDispatched" in kinds, kinds
            assert all(e["sentence"] for e in activity["events"])

            story = await get(session, f"{web}/api/job?id=med")
            described = await bus.request("describe-service-job", jobId="med")
            assert story["job"]["attempts"] == described["attempts"]
            assert story["text"].startswith("med") and "preempted" in story["text"]
            assert [e["kind"] for e in story["story"]][0] == "JobSubmitted"

            # `up` runs the projector; it follows the log a little behind the scheduler
            deadline = time.monotonic() + 30
            while True:
                usage = await get(session, f"{web}/api/usage?name=q&window=15m")
                assert usage["available"], usage
                shares = {line["quotaShareName"] for line in usage["series"]}
                if shares >= {"qs1", "qs2"} or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert shares >= {"qs1", "qs2"}, usage

            # a new job: its submission is pushed
            await bus.submit_and_wait({"kind": "SubmitServiceJob", "jobId": "extra",
                                       "jobName": "extra-run", "jobQueue": "q",
                                       "quotaShareName": "qs3",
                                       "capacityUsage": [{"capacityUnit": UNIT, "quantity": 1}]})
            event = await next_event(stream, lambda e: e.get("jobId") == "extra")
            assert event["kind"] == "JobSubmitted" and event["quotaShareName"] == "qs3"

            # the search takes a job name too, as `explain` does (issue 21)
            by_name = await get(session, f"{web}/api/job?id=extra-run")
            assert by_name["jobId"] == "extra" and by_name["job"]["jobName"] == "extra-run"
            # the story names the job by its label (events.labels): its name, then its id
            assert by_name["jobLabel"] == job_label("extra", "extra-run") == "extra-run (extra)"
            assert by_name["text"].startswith("extra-run (extra) ")

            # a job's end is in the recent activity too (issue 32): med, terminated
            await bus.publish({"kind": "TerminateServiceJob", "jobId": "med", "reason": "test"},
                              route=("q", "qs1"))  # fmt: skip
            await next_event(stream, lambda e: e.get("jobId") == "med"
                             and e["kind"] == "JobStatusChanged" and e.get("status") == "FAILED")
            ended = (await get(session, f"{web}/api/activity?name=q"))["events"][0]
            assert (ended["kind"], ended["jobId"], ended["status"]) == ("JobStatusChanged", "med",
                                                                        "FAILED"), ended
            assert "med" in ended["sentence"] and "FAILED" in ended["sentence"], ended

        # the page and its vendored Chart.js, offline; read-only
        async with session.get(f"{web}/") as page:
            html = await page.text()
        assert '<script src="/static/vendor/chart.umd.min.js">' in html and "https://" not in html
        async with session.get(f"{web}/static/vendor/chart.umd.min.js") as chart:
            assert chart.status == 200 and (await chart.text()).startswith("/*!\n * Chart.js v4")
        async with session.post(f"{web}/api/queue?name=q") as refused:
            assert refused.status == 405
        async with session.get(f"{web}/api/queue?name=nope") as missing:
            assert missing.status == 400 and "nope" in (await missing.json())["error"]


class Browser:
    """A headless Chromium driven over its DevTools protocol (a websocket, aiohttp's client):
    the page keeps its event stream open, so Chromium's one-shot `--dump-dom` and
    `--virtual-time-budget` never see it settle; here the test reads the live page."""

    def __init__(self, executable: str, profile: Path):
        self.executable, self.profile = executable, profile
        self.ids = iter(range(1, 1_000_000))

    async def __aenter__(self) -> Browser:
        self.process = await asyncio.create_subprocess_exec(
            self.executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
            "--window-size=1280,1000", "about:blank", stderr=asyncio.subprocess.PIPE)  # fmt: skip
        while True:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
            line = (await asyncio.wait_for(self.process.stderr.readline(), 60)).decode()
            assert line, "chromium exited before it listened"
            if "DevTools listening on " in line:
                address = line.split("DevTools listening on ", 1)[1].strip()
                break
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(address, max_msg_size=0)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.ws.close()
        await self.http.close()
        self.process.kill()
        await self.process.wait()

    async def call(self, method: str, session: str | None = None, **params) -> dict:
        number = next(self.ids)
        message = {"id": number, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_json(message)
        while True:  # events (no id) and other answers pass by
            answer = json.loads((await asyncio.wait_for(self.ws.receive(), 30)).data)
            if answer.get("id") == number:
                assert "error" not in answer, answer
                return answer["result"]

    async def open(self, url: str) -> str:
        target = (await self.call("Target.createTarget", url=url))["targetId"]
        return (await self.call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]

    async def text(self, session: str) -> str:
        result = await self.call("Runtime.evaluate", session, expression="document.body.innerText",
                                 returnByValue=True)  # fmt: skip
        return result["result"].get("value") or ""

    async def until(self, session: str, wanted, what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            shown = await self.text(session)
            if wanted(shown):
                return shown
            assert time.monotonic() < deadline, f"the page never showed {what}:\n{shown}"
            await asyncio.sleep(0.2)


async def test_the_page_shows_the_shares_and_updates_live_in_a_headless_browser(stack, tmp_path):
    """The notebook's shares on the page; then a job submitted while the page is open appears
    on it without a reload (server push); the screenshot is taken after that."""
    browser = report_png.chromium() or shutil.which("chromium")
    if browser is None:
        pytest.skip("NO HEADLESS CHROMIUM: the page itself was not rendered (install chromium "
                    "or set QUOTASCHED_CHROMIUM); its JSON and event stream were tested")
    nats, web = stack
    async with aiohttp.ClientSession() as session:  # why high waits, as explain tells it
        told = await get(session, f"{web}/api/job?id=high")
    reason = [e["sentence"] for e in told["story"] if e["kind"] == "Waiting"][-1]
    async with Browser(browser, tmp_path / "profile") as chromium:
        page = await chromium.open(f"{web}/?job=med")
        await chromium.until(page, lambda text: all(f"qs{n}" in text for n in (1, 2, 3))
                             and "The story of job med" in text and reason in text
                             and "service environment se (ENABLED):" in text,
                             f"the shares, med's story and why high waits: {reason}")  # fmt: skip
        async with Bus(nats) as bus:
            await bus.submit_and_wait({
                "kind": "SubmitServiceJob", "jobId": "live-one", "jobName": "live-one",
                "jobQueue": "q", "quotaShareName": "qs3", "tags": {"duration": "600"},
                "capacityUsage": [{"capacityUnit": UNIT, "quantity": 1}]})  # fmt: skip
        await chromium.until(page, lambda text: "live-one" in text, "the new job, pushed")
        # the share filter (?share=, or its select): qs2's rows and activity only
        only = await chromium.open(f"{web}/?share=qs2")
        await chromium.until(only, lambda text: "b1 dispatched in qs2" in text
                             and "no job waits in qs2" in text
                             and "high waits" not in text and "low dispatched" not in text,
                             "qs2 alone")  # fmt: skip
        await asyncio.sleep(1.0)  # the charts' animation
        shot = await chromium.call("Page.captureScreenshot", page, format="png")
    image = base64.b64decode(shot["data"])
    assert image[:8] == b"\x89PNG\r\n\x1a\n" and len(image) > 20_000


@pytest.mark.parametrize("value", ["abc", "70000"])
def test_a_web_port_that_is_not_a_port_is_a_one_line_error(tmp_path, value):
    done = subprocess.run([str(Path(sys.executable).parent / "quotasched"), "up", "--data-dir",
                           str(tmp_path / "data"), "--web-port", value],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (f"quotasched up: --web-port must be a port (1-65535), 0 or "
                                   f"off, not {value!r}")  # fmt: skip
    assert not (tmp_path / "data" / "jetstream").exists()


async def test_demo_serve_shows_usage_over_time_from_its_own_projector(tmp_path):
    """Issue 32 point 4: under `demo --serve` the page's usage over time said "no projector is
    running". The demo runs one, as `up` does: after the story, the step lines of qs1 and qs2
    (by hand: both ran jobs) are there, and all shares end at 2 (low and b1 run)."""
    demo = Process(["demo", "--serve"], {**os.environ, "COLUMNS": "200"}, tmp_path / "demo.log")
    try:
        deadline = time.monotonic() + 120
        while "Serving the demo's queue q" not in demo.output():
            assert demo.popen.poll() is None and time.monotonic() < deadline, demo.output()[-3000:]
            await asyncio.sleep(0.2)
        web = next(line.split("=", 1)[1] for line in demo.output().splitlines()
                   if line.startswith("WEB="))  # fmt: skip
        async with aiohttp.ClientSession() as session:
            while True:
                answer = await get(session, f"{web}/api/usage?name=q&window=15m")
                assert answer["available"], answer  # not "no projector is running"
                lines = {line["label"]: line["points"] for line in answer["series"]}
                ended = lines.get("all shares", [[0, 0]])[-1][1] == 2
                if {"qs1", "qs2"} <= set(lines) and ended or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        assert {"qs1", "qs2"} <= set(lines), answer
        assert lines["all shares"][-1][1] == 2, lines
    finally:
        assert demo.stop() == 0, demo.output()[-3000:]
