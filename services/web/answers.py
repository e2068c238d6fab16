"""The JSON the page reads, shaped from the scheduler's and the projector's read answers.

Nothing here keeps state: each answer asks the read APIs again (`bus.request` for the
scheduler's `qm.api.*`, `projector.client.request` for `qm.proj.*`).  Who lent to whom is the
report's rule (`services.report.model.attribute`: every borrower takes from every lending
share pro rata to its idle quota), applied to the usage of this instant.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from quotasched.services.client.commands import ClientError
from quotasched.services.projector.client import ProjectorError, ProjectorUnavailable
from quotasched.services.projector.client import request as ask_projector
from quotasched.services.report.model import ShareAt, Step, attribute

LENDING = ("LEND", "LEND_AND_BORROW")
WINDOWS = {"15m": (900, 30), "1h": (3600, 120), "6h": (21600, 900), "24h": (86400, 3600)}


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


async def queue(bus, name: str) -> dict[str, Any]:
    """A job queue's shares (usage against limits, borrowed, lent) and heads, with why each
    waits as the scheduler's core says it (the snapshot's `waitingReason`, what `quotasched
    explain` tells)."""
    shares, snapshot, environments = await asyncio.gather(
        bus.request("list-quota-shares", jobQueue=name),
        bus.request("get-job-queue-snapshot", jobQueue=name),
        bus.request("describe-service-environments"))  # fmt: skip
    units, rows = share_rows(shares["quotaShares"])
    fronts = snapshot["frontOfQuotaShares"]["quotaShares"]
    head_ids = {share: jobs[0]["jobArn"].rsplit("/", 1)[-1] for share, jobs in fronts.items() if jobs}
    reasons = {share: jobs[0].get("waitingReason") or {} for share, jobs in fronts.items() if jobs}
    described = await asyncio.gather(
        *(bus.request("describe-service-job", jobId=job_id, jobQueue=name)
          for job_id in head_ids.values()), return_exceptions=True)  # fmt: skip
    heads = []
    for (share, job_id), job in zip(head_ids.items(), described):
        if isinstance(job, BaseException):  # ended between the two reads
            continue
        heads.append({"quotaShareName": share, "jobId": job_id, "jobName": job["jobName"],
                      "schedulingPriority": job["schedulingPriority"],
                      "status": job["status"], "createdAt": job["createdAt"],
                      "waitingCode": reasons[share].get("code"),
                      "waitingReason": reasons[share].get("message")})  # fmt: skip
    total = snapshot["queueUtilization"]["totalCapacityUsage"]
    counts = await job_counts(bus.nc, name)
    for row in rows:
        row["jobs"] = None if counts is None else counts.get(row["quotaShareName"], {})
    return {"jobQueue": name, "units": units, "shares": rows, "heads": heads,
            "runnable": len(snapshot["frontOfQueue"]["jobs"]), "totalCapacityUsage": total,
            "environment": environment_of(environments["serviceEnvironments"], name, total)}


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
        named = await search.job_ids_named(js, job_id)  # not an id: a job name, as `explain` takes it
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
    return {"jobId": job_id, "job": described,
            "story": [entry.document() for entry in entries],
            "text": render(entries, job_id) if entries else f"No fact names job {job_id}."}


async def utilization(nc, window: str, per: str, last_at: float | None) -> dict[str, Any]:
    """The projector's `utilization` over the last `window` (15m, 1h, 6h, 24h) up to now (or
    the last fact's time, if the log's clock is behind now), or why there is none."""
    seconds, bucket = WINDOWS.get(window, WINDOWS["1h"])
    t1 = max(time.time(), last_at or 0.0) if last_at is None or last_at > 1e9 else last_at
    t0 = t1 - seconds
    try:
        answer = await ask_projector(nc, "utilization", timeout=10.0, t0=t0, t1=t1,
                                     bucketSeconds=bucket, per=per)  # fmt: skip
    except ProjectorUnavailable as error:
        return {"available": False, "reason": f"No usage over time: {error}."}
    except ProjectorError as error:
        return {"available": False, "reason": f"The projector refused: {error}."}
    return {"available": True, "t0": t0, "t1": t1, "bucketSeconds": bucket, "per": per,
            "position": answer.get("position"), "rows": answer["rows"]}  # fmt: skip
