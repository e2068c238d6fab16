"""The read APIs' request models, for the AsyncAPI document only (the services parse their
requests themselves): one per verb in `API_REQUESTS`, the projector's `qm.projected`
notification (`Applied`), and the error reply every verb may answer with."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Request(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class DescribeServiceJobRequest(_Request):
    job_id: str = Field(description="The job's id, or its ARN.")


class QueueRequest(_Request):
    job_queue: str = Field(description="The job queue's name, or its ARN.")


class ListFilter(_Request):
    name: Literal["QUOTA_SHARE_NAME", "JOB_NAME", "BEFORE_CREATED_AT", "AFTER_CREATED_AT"]
    values: list[str]


class ListServiceJobsRequest(_Request):
    job_queue: str = Field(description="The job queue's name, or its ARN.")
    job_status: str | None = Field(None, description="Default RUNNING; ALL lists every status.")
    filters: list[ListFilter] | None = Field(
        None, description="At most 5 filters, each of at most 100 values of at most 128 characters.")
    max_results: int | None = Field(None, ge=1, le=1000, description="1-1000, default 100.")
    next_token: str | None = Field(
        None, description="The previous page's nextToken: the next page (an answer always fits "
                          "the bus, so a page may hold fewer than maxResults jobs).")


class ListWaitingJobsRequest(_Request):
    job_queue: str = Field(description="The job queue's name, or its ARN.")
    quota_share_name: str = Field(description="The quota share whose RUNNABLE jobs to list.")
    offset: int = Field(0, ge=0, description="Jobs skipped, in dispatch order; past the end, none.")
    limit: int = Field(20, ge=0, le=100, description=(
        "0-100, default 20; a page of a long share may be shorter (see nextOffset)."))


class DescribeQuotaShareRequest(_Request):
    quota_share_arn: str | None = None
    job_queue: str | None = Field(None, description="With quotaShareName, instead of the ARN.")
    quota_share_name: str | None = None


class EmptyRequest(_Request):
    """No parameters: send `{}`."""


class AnyRequest(_Request):
    """A JSON object (this verb's parameters are not described here yet)."""


class SqlRequest(_Request):
    sql: str = Field(description="One read-only statement (SELECT, WITH, DESCRIBE, SHOW).")
    limit: int = Field(1000, description="Rows returned, at most 10000.")


class UtilizationRequest(_Request):
    t0: float
    t1: float
    bucket_seconds: float = 3600
    per: Literal["share", "queue"] = "share"


class Applied(_Request):
    """Published by the projector after every committed batch."""

    position: int = Field(description="The last fact sequence the projection applied.")
    facts: int = Field(description="Facts applied in this batch.")
    at: float | None = Field(description="Logical time of the last fact applied.")


API_REQUESTS: dict[str, type[_Request]] = {
    "describe-service-job": DescribeServiceJobRequest,
    "list-service-jobs": ListServiceJobsRequest,
    "get-job-queue-snapshot": QueueRequest,
    "list-waiting-jobs": ListWaitingJobsRequest,
    "list-quota-shares": QueueRequest,
    "describe-quota-share": DescribeQuotaShareRequest,
    "describe-service-environments": EmptyRequest,
    "describe-job-queues": EmptyRequest,
    "describe-scheduling-policies": EmptyRequest,
    "sql": SqlRequest,
    "utilization": UtilizationRequest,
    "checksum": EmptyRequest,
    "position": EmptyRequest,
}

ERROR_REPLY = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string", "examples": ["ClientException"]},
        "message": {"type": "string"}}}},
}  # fmt: skip
