"""The client's read requests: routing a question to the job queue that can answer it, asking
again while no leader answers, and merging the answers of a fan-out over several job queues.

A request naming a job queue goes to `qm.api.<queue>.<verb>`, any other to `qm.api.~.<verb>`;
a scheduler partitioned per job queue may answer the latter with a `redirect` naming the
queues that hold the answer (see `services.client.Bus.request`).

With a team's credentials (a pipeline's credentials file names its job queue and quota share:
QUOTASCHED_TEAM_QUEUE, QUOTASCHED_TEAM_SHARE) a request about its queue goes to
`qm.api.<queue>.<share>.<verb>`, the only read subject its role may publish to; the scheduler
then shows the payloads and tags of that share's jobs only.  The variables only route: the
server's permissions are what pin them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from nats.errors import NoRespondersError

from quotasched.events.base import NAME_PATTERN
from quotasched.events.subjects import ANY, api_subject
from quotasched.services.config.auth import TEAM_QUEUE_ENV, TEAM_SHARE_ENV

RESPONDER_WAIT_S = 8.0  # a lease TTL (6 s) and then some: how long a read waits for a leader
PAGE_MAX = 1000  # the most jobs one list-service-jobs answer holds (AWS's maxResults bound)
HANDOVER_WAIT_S = 2.5  # a partition handed over is taken within a quarter TTL and a recovery


async def ask(bus: Any, queue: str, verb: str, params: dict, timeout: float,
              missing_ok: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """One request; while nobody answers (a leader changing hands: a failover, or a
    partition handed over to another process), asked again for up to RESPONDER_WAIT_S,
    or HANDOVER_WAIT_S for one queue of a fan-out (`missing_ok`: a queue that no
    scheduler serves has nothing to say, and gives None)."""
    wanted = params.get("maxResults")
    if verb == "list-service-jobs" and isinstance(wanted, int) and wanted > PAGE_MAX:
        return await _pages(bus, queue, verb, params, timeout, missing_ok, wanted)
    loop = asyncio.get_running_loop()
    wait = HANDOVER_WAIT_S if missing_ok else RESPONDER_WAIT_S
    deadline = loop.time() + min(timeout, wait)
    while True:
        try:
            reply = await bus.nc.request(subject_of(bus, queue, verb),
                                         json.dumps(params).encode(), timeout=timeout)  # fmt: skip
            return json.loads(reply.data)
        except NoRespondersError:
            if loop.time() >= deadline:
                if missing_ok:
                    return None
                raise
            await asyncio.sleep(0.2)


async def _pages(bus: Any, queue: str, verb: str, params: dict, timeout: float,
                 missing_ok: bool, wanted: int) -> dict[str, Any] | None:  # fmt: skip
    """More jobs than one answer may hold (`maxResults` over PAGE_MAX, as callers from
    before the scheduler paged ask): its pages, followed by `nextToken`, as one answer."""
    jobs: list = []
    token = params.get("nextToken")
    while True:
        page = {**params, "maxResults": min(PAGE_MAX, wanted - len(jobs)), "nextToken": token}
        answer = await ask(bus, queue, verb, {k: v for k, v in page.items() if v is not None},
                           timeout, missing_ok)  # fmt: skip
        if answer is None or "error" in answer or "redirect" in answer:
            return answer
        jobs.extend(answer.get("jobSummaryList", []))
        token = answer.get("nextToken")
        if token is None or len(jobs) >= wanted:
            return {**answer, "jobSummaryList": jobs}


def subject_of(bus: Any, queue: str, verb: str) -> str:
    """A read request's subject: a team's own (queue, share) subject when its credentials
    (the bus's, else the environment's) name them and the request is about its queue;
    otherwise `qm.api.<queue or ~>.<verb>` (which a team's role may not use: refused)."""
    credentials = getattr(bus, "credentials", None)
    credentials = os.environ if credentials is None else credentials
    own_queue, own_share = credentials.get(TEAM_QUEUE_ENV), credentials.get(TEAM_SHARE_ENV)
    if own_queue and own_share and queue == own_queue:
        return api_subject(verb, own_queue, own_share)
    return api_subject(verb, None if queue == ANY else queue)


def queue_of(value: Any) -> str | None:
    """A job queue's name from a name or an ARN (`...:job-queue/<name>`)."""
    if not isinstance(value, str) or not value:
        return None
    name = value.rsplit("job-queue/", 1)[-1].split("/", 1)[0]
    return name if re.fullmatch(NAME_PATTERN, name) else None  # not `match`: "q\n" is no name


def merge(verb: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer from those of several job queues' partitions: the lists of every queue
    that answered without an error, concatenated (a job lives in one queue: the others say it
    does not exist), or the first error when none could answer."""
    found = [answer for answer in answers if "error" not in answer]
    if not found:
        return answers[0] if answers else {
            "error": {"type": "ClientException", "message": f"no job queue could answer {verb}"}}
    merged = dict(found[0])
    for answer in found[1:]:
        for key, value in answer.items():
            if isinstance(value, list) and isinstance(merged.get(key), list):
                merged[key] = merged[key] + value
    return merged
