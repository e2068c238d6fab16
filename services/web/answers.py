"""The JSON the page reads, shaped from the scheduler's and the projector's read answers.

Nothing here keeps state: each answer asks the read APIs again (`bus.request` for the
scheduler's `qm.api.*`, `projector.client.request` for `qm.proj.*`).  Who lent to whom is
the report's rule (`services.report.model.attribute`: every borrower takes from every
lending share pro rata to its idle quota), applied to the usage of this instant.  A job is
shown by its label (`events.labels.job_label`: its name, then the start of its id), its id
kept beside it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.errors import NoRespondersError

from quotasched.events.labels import job_label
from quotasched.services.client.commands import ClientError
from quotasched.services.projector.client import ProjectorError, ProjectorUnavailable
from quotasched.services.projector.client import request as ask_projector
from quotasched.services.report.model import ShareAt, Step, attribute

LENDING = ("LEND", "LEND_AND_BORROW")
WAITING_PAGE = 20  # waiting jobs per share and page (the scheduler bounds `limit`)


async def queues(bus) -> dict[str, Any]:
    answer = await bus.request("describe-job-queues")
    return {"jobQueues": [q["jobQueueName"] for q in answer["jobQueues"]]}


def _lending_limits(share: dict) -> dict[str, int]:
    """A share's lending limits (SetQuotaShareOptions), as list-quota-shares answers them."""
    return {item["capacityUnit"]: int(item["maxCapacity"])
            for item in (share.get("options") or {}).get("lendingLimits") or ()}  # fmt: skip


def _limits(share: dict) -> dict[str, int]:
    return {c["capacityUnit"]: c["maxCapacity"] for c in share.get("capacityLimits") or []}


def share_rows(shares: list[dict]) -> tuple[list[str], list[dict]]:
    """Per share and capacity unit: limit, in use, own, borrowed, lent (and to and from whom),
    idle; the units in order of first appearance."""
    units: list[str] = []
    for share in shares:
        for unit in [*_limits(share), *share.get("usage", {})]:
            if unit not in units:
                units.append(unit)
    rows = [{"quotaShareName": s["quotaShareName"],
             "strategy": (s.get("resourceSharingConfiguration") or {}).get("strategy"),
             "borrowLimit": (s.get("resourceSharingConfiguration") or {}).get("borrowLimit"),
             "units": {}} for s in shares]  # fmt: skip
    for unit in units:
        at = {}
        for share in shares:
            limit, used = _limits(share).get(unit, 0), int(share.get("usage", {}).get(unit, 0))
            lending = (share.get("resourceSharingConfiguration") or {}).get("strategy") in LENDING
            idle = max(0, limit - used) if lending else 0
            cap = _lending_limits(share).get(unit)  # an option beyond AWS caps what it lends
            at[share["quotaShareName"]] = ShareAt(
                in_use=used, limit=limit, borrowed=max(0, used - limit),
                lendable_idle=idle if cap is None else min(idle, cap))  # fmt: skip
        pieces = attribute(Step(0.0, 0.0, 0, at))
        for row in rows:
            name, share = row["quotaShareName"], at[row["quotaShareName"]]
            lent_to = {p.borrower: p.amount for p in pieces if p.lender == name}
            borrowed_from = {(p.lender or ""): p.amount for p in pieces if p.borrower == name}
            lent = sum(lent_to.values())
            row["units"][unit] = {
                "limit": share.limit, "inUse": share.in_use, "own": share.own,
                "borrowed": share.borrowed, "borrowedFrom": borrowed_from,
                "lent": lent, "lentTo": lent_to,
                "idle": max(0.0, share.limit - share.in_use - lent),
            }  # fmt: skip
    return units, rows


def _page_bound(raw: str | int | None, name: str, default: int) -> int:
    """A page parameter from the query string; its bounds are the scheduler's to check."""
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ClientError(f"{name} must be an integer, not {raw!r}") from None


async def waiting(bus, name: str, share: str, offset=None, limit=None) -> dict[str, Any]:
    """One page of `share`'s RUNNABLE jobs in dispatch order, each with why it waits (the
    scheduler's `list-waiting-jobs`: the core's reason), each named by its label."""
    page = await bus.request("list-waiting-jobs", jobQueue=name, quotaShareName=share,
                             offset=_page_bound(offset, "offset", 0),
                             limit=_page_bound(limit, "limit", WAITING_PAGE))  # fmt: skip
    for job in page["jobs"]:
        job["jobLabel"] = job_label(job["jobId"], job["jobName"])
    return page


async def queue(bus, name: str, share: str | None = None, offset=None,
                limit=None) -> dict[str, Any]:  # fmt: skip
    """A job queue's shares (usage against limits, borrowed, lent), their heads and a page of
    each share's waiting jobs (only `share`'s, from `offset`, when a share is given), with why
    each waits as the scheduler's core says it (what `quotasched explain` tells)."""
    shares, snapshot, environments = await asyncio.gather(
        bus.request("list-quota-shares", jobQueue=name),
        bus.request("get-job-queue-snapshot", jobQueue=name),
        bus.request("describe-service-environments"))  # fmt: skip
    units, rows = share_rows(shares["quotaShares"])
    names = [row["quotaShareName"] for row in rows]
    if share and share not in names:
        raise ClientError(f"Quota share {share} does not exist in job queue {name}")
    asked = [share] if share else names
    pages = await asyncio.gather(*(waiting(bus, name, each, offset if share else 0, limit)
                                   for each in asked))  # fmt: skip
    listed = {job["jobId"]: job for page in pages for job in page["jobs"]}
    fronts = snapshot["frontOfQuotaShares"]["quotaShares"]
    heads = []
    for each, jobs in fronts.items():
        if not jobs:
            continue
        job_id = jobs[0]["jobArn"].rsplit("/", 1)[-1]
        job = listed.get(job_id)
        if job is None:  # not on a page asked for: its name from its description
            try:
                job = await bus.request("describe-service-job", jobId=job_id, jobQueue=name)
            except ClientError:  # ended between the two reads
                continue
        reason = jobs[0].get("waitingReason") or {}
        heads.append({"quotaShareName": each, "jobId": job_id, "jobName": job["jobName"],
                      "jobLabel": job_label(job_id, job["jobName"]),
                      "schedulingPriority": job["schedulingPriority"], "status": "RUNNABLE",
                      "waitingCode": reason.get("code"), "waitingReason": reason.get("message")})
    total = snapshot["queueUtilization"]["totalCapacityUsage"]
    counts = await job_counts(bus.nc, name)
    for row in rows:
        row["jobs"] = None if counts is None else counts.get(row["quotaShareName"], {})
    return {"jobQueue": name, "units": units, "shares": rows, "heads": heads,
            "waiting": {page["quotaShareName"]: page for page in pages},
            "runnable": len(snapshot["frontOfQueue"]["jobs"]), "totalCapacityUsage": total,
            "environment": environment_of(environments["serviceEnvironments"], name, total)}


async def job_name(bus, job_id: str) -> str | None:
    """A job's name from the scheduler's description (or the projection's, for a job it has
    forgotten); None when neither knows the job."""
    try:
        return (await bus.request("describe-service-job", jobId=job_id))["jobName"]
    except (ClientError, asyncio.TimeoutError, TimeoutError, NoRespondersError):
        return None


async def job_counts(nc, queue: str) -> dict[str, dict[str, int]] | None:
    """Per share of `queue`, its jobs pending (RUNNABLE) and admitted (SCHEDULED, STARTING,
    RUNNING), as Kueue's ClusterQueue status counts them: the projector's `jobs` table, a
    moment behind the scheduler (the scheduler keeps no count it could give within a read's
    bounded work); None when no projector answers."""
    sql = ("SELECT quota_share, count(*) FILTER (WHERE status = 'RUNNABLE') AS pending, "
           "count(*) FILTER (WHERE status IN ('SCHEDULED', 'STARTING', 'RUNNING')) AS admitted "
           f"FROM jobs WHERE job_queue = '{queue.replace(chr(39), chr(39) * 2)}' GROUP BY ALL")
    try:
        answer = await ask_projector(nc, "sql", timeout=5.0, sql=sql, limit=10_000)
    except (ProjectorUnavailable, ProjectorError):
        return None
    return {share: {"pending": pending, "admitted": admitted}
            for share, pending, admitted in answer["rows"]}  # fmt: skip


def environment_of(environments: list[dict], queue: str, total: list[dict]) -> dict | None:
    """The queue's service environment: its name, state, and per unit its maxCapacity and the
    instances the queue holds of it (the snapshot's totalCapacityUsage)."""
    found = next((env for env in environments if env.get("jobQueue") == queue), None)
    if found is None:
        return None
    in_use = {item["capacityUnit"]: item["quantity"] for item in total}
    return {"name": found["serviceEnvironmentName"], "state": found["state"],
            "capacity": [{"capacityUnit": limit["capacityUnit"],
                          "maxCapacity": limit["maxCapacity"],
                          "inUse": in_use.get(limit["capacityUnit"], 0)}
                         for limit in found["capacityLimits"]]}  # fmt: skip


async def job(bus, js, job_id: str) -> dict[str, Any]:
    """describe-service-job (its attempts) and the job's story, as `quotasched explain` tells
    it: the log is streamed (`search`), the folding runs in a thread (not on the scheduler's
    loop).  A job name works like an id; a name several jobs share answers their ids
    (`matches`)."""
    from quotasched.services.explain import render
    from quotasched.services.scheduler.api import PRIVATE
    from quotasched.services.web import search

    try:
        described = await bus.request("describe-service-job", jobId=job_id)
    except ClientError as error:
        described = {"error": str(error)}
        # not an id: a job name, as `explain` takes it
        named = await search.job_ids_named(js, job_id)
        if len(named) > 1:
            text = (f"Job name {job_id} names {len(named)} jobs: {', '.join(named)}; search for "
                    "one of their ids.")  # fmt: skip
            return {"jobId": None, "matches": named, "story": [], "job": {"error": text},
                    "text": text}  # fmt: skip
        if named:
            job_id = named[0]
            described = await bus.request("describe-service-job", jobId=job_id)
    entries = await search.story(js, job_id)
    # the page shows neither; served unauthenticated on loopback, they stay out (a payload's
    # Environment may hold a team's secrets: services/scheduler/api.py PRIVATE)
    described = {key: value for key, value in described.items() if key not in PRIVATE}
    return {"jobId": job_id, "jobLabel": job_label(job_id, described.get("jobName") or ""),
            "job": described,
            "story": [entry.document() for entry in entries],
            "text": render(entries, job_id) if entries else f"No fact names job {job_id}."}
