"""The facts an executor reads (services/executors/base.py `ExecutorFact`), built as the
contract's own models for tests that hand them to `Executor.on_fact` / `learn` directly.

Each is decoded from its camelCase JSON by `events.codec.decode_fact`, as the executor's
subscriber decodes what it reads (services/executors/app.py), so a test can only build a valid
fact: every field the scheduler writes, with defaults for the ones a test does not care about.
`at` defaults to now (the bus's logical clock is Unix time), as in a live dispatch.

    await executor.on_fact(submitted("j1", {"duration": "1"}))
    await executor.on_fact(dispatched("j1"))
    await executor.on_fact(preempted("j1"))
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from typing import Any

from quotasched.events import facts as F
from quotasched.events.codec import decode_fact

QUEUE, SHARE, UNIT = "q", "qs1", "ml.g5.xlarge"
_SEQ = itertools.count(1)  # each fact's commandSeq: increasing, as in a log


def _fact(kind: str, at: float | None, **fields: Any) -> F.Fact:
    at = time.time() if at is None else at
    return decode_fact(json.dumps({"kind": kind, "at": at, "commandSeq": next(_SEQ), **fields}))


def submitted(job_id: str, tags: dict[str, str] | None = None, *, payload: Any = None,
              queue: str = QUEUE, share: str = SHARE, unit: str = UNIT, quantity: int = 1,
              at: float | None = None) -> F.JobSubmitted:  # fmt: skip
    """A submission: how to run the job is in its `tags` (or its `payload`)."""
    return _fact("JobSubmitted", at, jobId=job_id, jobName=job_id, jobQueue=queue,
                 quotaShareName=share, schedulingPriority=0,
                 capacityUsage=[{"capacityUnit": unit, "quantity": quantity}],
                 tags=tags, serviceRequestPayload=payload)  # fmt: skip


def dispatched(job_id: str, attempt: int = 1, *, queue: str = QUEUE, share: str = SHARE,
               unit: str = UNIT, quantity: int = 1, after: Iterable[str] = (),
               at: float | None = None) -> F.JobDispatched:  # fmt: skip
    """An attempt's dispatch; `after`: the jobs it preempted (`afterPreemptionOf`)."""
    return _fact("JobDispatched", at, jobId=job_id, attempt=attempt, jobQueue=queue,
                 quotaShareName=share, capacityUsage=[{"capacityUnit": unit, "quantity": quantity}],
                 borrowed=[], afterPreemptionOf=list(after))  # fmt: skip


def preempted(job_id: str, attempt: int = 1, *, preemptor: str = "preemptor",
              outcome: str = "REQUEUED", reason: str = "IN_SHARE_PRIORITY", queue: str = QUEUE,
              share: str = SHARE, at: float | None = None) -> F.JobPreempted:  # fmt: skip
    """An attempt's preemption by `preemptor`; outcome FAILED: the job is over."""
    return _fact("JobPreempted", at, jobId=job_id, attempt=attempt, jobQueue=queue,
                 quotaShareName=share, preemptorJobId=preemptor, reason=reason,
                 outcome=outcome, preemptedAttemptCount=1)  # fmt: skip


def status_changed(job_id: str, attempt: int = 1, status: str = "FAILED",
                   cause: str = "TERMINATED", reason: str | None = None,
                   at: float | None = None) -> F.JobStatusChanged:  # fmt: skip
    """The job's status changed (by default: terminated, which stops its attempt)."""
    return _fact("JobStatusChanged", at, jobId=job_id, attempt=attempt, status=status,
                 statusReason=reason, cause=cause,
                 isTerminated=cause == "TERMINATED")  # fmt: skip


def queue_created(queue: str, service_environment: str, *,
                  at: float | None = None) -> F.JobQueueCreated:  # fmt: skip
    """A job queue on `service_environment` (what the GPU agent serves)."""
    return _fact("JobQueueCreated", at, jobQueue=queue, serviceEnvironment=service_environment,
                 schedulingPolicy="policy", priority=1, state="ENABLED",
                 jobStateTimeLimitActions=[])  # fmt: skip
