"""Following the fact log for the web view: one small event per fact, fanned out to every open
event stream, and the recent dispatches, preemptions and ends of each job queue.

The follower runs on the stack's event loop, beside the scheduler, so it does as little as it
can per fact: the job queue, share and kind come from the subject (`qm.fact.<queue>.<share>.
<kind>`); the payload is parsed as plain JSON for the job id and time; a dispatch or a
preemption is kept as it came and decoded into a fact (for its sentence) only when the page
asks for the recent activity.

Jobs are named by their labels (`events.labels`: a UUID id reads as its name).  The names
come from the JobSubmitted facts the follower reads (the last NAMES_KEPT of them); a job
submitted before the follower's look-back is named by the scheduler's description, once, on
the first page that shows it: no request reads the log again for a name.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from quotasched.events import facts as F
from quotasched.events.codec import decode_fact
from quotasched.events.labels import job_label
from quotasched.events.subjects import ANY
from quotasched.services import logs
from quotasched.services.nats.bus import last_sequence
from quotasched.services.nats.log import ALL_FACTS, read_log

log = logs.get("quotasched.web")

RECENT = 50  # dispatches, preemptions and ends kept per job queue
LOOK_BACK = 5000  # facts read before the log's end at start, for the recent activity
CLIENT_BACKLOG = 1000  # events queued for a slow page before it is told to re-fetch everything
SHOWN_KINDS = ("JobDispatched", "JobPreempted")  # and the ends: SUCCEEDED, FAILED (`shown`)
ENDS = ("SUCCEEDED", "FAILED")
NAMES_KEPT = 100_000  # job names remembered (about 100 bytes each), the newest kept


def shown(event: dict[str, Any]) -> bool:
    """Is this fact one of the recent activity's: a dispatch, a preemption, or a job's end (a
    completion, a failure, a termination)?"""
    if event["jobQueue"] is None:
        return False
    return event["kind"] in SHOWN_KINDS or (event["kind"] == "JobStatusChanged"
                                            and event.get("status") in ENDS)  # fmt: skip


def event_of(seq: int, data: bytes, subject: str) -> dict[str, Any]:
    """The event pushed for one fact: {seq, kind, jobQueue, quotaShareName, jobId, at}."""
    parts = subject.split(".")
    kind = parts[-1]
    queue = parts[2] if len(parts) >= 5 and parts[2] != ANY else None
    share = parts[3] if len(parts) >= 5 and parts[3] != ANY else None
    event: dict[str, Any] = {"seq": seq, "kind": kind, "jobQueue": queue, "quotaShareName": share}
    try:
        payload = json.loads(data)
    except ValueError:
        return event
    if isinstance(payload, dict):
        event["jobId"] = payload.get("jobId")
        event["at"] = payload.get("at")
        if kind == "JobSubmitted":
            event["jobName"] = payload.get("jobName")
        if kind == "JobStatusChanged":
            event["status"] = payload.get("status")
    return event


class Follower:
    """`run()` follows the log until cancelled; `listen()` / `unlisten(queue)` for a stream's
    own queue of events; `activity(job_queue, name_of)` the latest dispatches, preemptions
    and ends."""

    def __init__(self, js):
        self.js = js
        self.listeners: set[asyncio.Queue] = set()
        self.recent: dict[str, deque] = {}
        self.position = 0
        self.last_at: float | None = None
        self.names: OrderedDict[str, str] = OrderedDict()  # job id -> job name

    def listen(self) -> asyncio.Queue:
        inbox: asyncio.Queue = asyncio.Queue(maxsize=CLIENT_BACKLOG)
        self.listeners.add(inbox)
        return inbox

    def unlisten(self, inbox: asyncio.Queue) -> None:
        self.listeners.discard(inbox)

    def close(self) -> None:
        """Ends every open stream (a None in its queue)."""
        for inbox in list(self.listeners):
            self._put(inbox, None)

    async def run(self) -> None:
        end = await last_sequence(self.js, ALL_FACTS)
        start = max(1, end - LOOK_BACK + 1)
        async for seq, data, subject in read_log(self.js, start_seq=start, follow=True):
            event = event_of(seq, data, subject)
            self.position = seq
            if isinstance(event.get("at"), (int, float)):
                self.last_at = event["at"]
            if isinstance(event.get("jobName"), str) and isinstance(event.get("jobId"), str):
                self.remember(event["jobId"], event["jobName"])
            if shown(event):
                recent = self.recent.setdefault(event["jobQueue"], deque(maxlen=RECENT))
                recent.append((event, data))
            for inbox in list(self.listeners):
                self._put(inbox, event)

    def remember(self, job_id: str, job_name: str) -> None:
        self.names[job_id] = job_name
        self.names.move_to_end(job_id)
        while len(self.names) > NAMES_KEPT:
            self.names.popitem(last=False)

    async def activity(self, job_queue: str,
                       name_of: Callable[[str], Awaitable[str | None]]) -> list[dict]:  # fmt: skip
        """The queue's recent dispatches, preemptions and ends, newest first, each with its
        sentence and the labels of the jobs it names (`jobLabel`, and for a preemption
        `preemptorJobId` and `preemptorLabel`).  `name_of(job_id)` names a job the follower
        has not seen submitted (the scheduler's description); its answer is kept."""
        from quotasched.services.explain.narrate import sentence

        shown = []
        for event, data in reversed(self.recent.get(job_queue, ())):
            try:
                fact = decode_fact(data)
            except ValueError as error:  # a fact this version cannot read: without words
                log.warning("the web view cannot read a fact", seq=event["seq"], error=str(error))
                shown.append({**event, "sentence": f"{event['kind']} {event.get('jobId')}"})
                continue
            ids = [fact.job_id]
            if isinstance(fact, F.JobPreempted):
                ids.append(fact.preemptor_job_id)
            elif isinstance(fact, F.JobDispatched):
                ids.extend(fact.after_preemption_of)
            names = {job_id: self.names.get(job_id) for job_id in ids}
            missing = sorted(job_id for job_id, name in names.items() if name is None)
            for job_id, name in zip(missing, await asyncio.gather(*map(name_of, missing))):
                names[job_id] = name or job_id  # unknown: its id is all there is
                self.remember(job_id, names[job_id])
            labels = {job_id: job_label(job_id, name) for job_id, name in names.items()}
            entry = {**event, "jobName": names[fact.job_id],
                     "jobLabel": labels[fact.job_id], "sentence": sentence(fact, labels)}
            if isinstance(fact, F.JobPreempted):
                entry["preemptorJobId"] = fact.preemptor_job_id
                entry["preemptorLabel"] = labels[fact.preemptor_job_id]
            shown.append(entry)
        return shown

    @staticmethod
    def _put(inbox: asyncio.Queue, event: dict | None) -> None:
        try:
            inbox.put_nowait(event)
        except asyncio.QueueFull:  # a page that does not keep up: it re-fetches everything
            while not inbox.empty():
                inbox.get_nowait()
            inbox.put_nowait({"kind": "Resync"} if event is not None else None)
