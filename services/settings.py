"""Configuration, from flags or `QUOTASCHED_*` environment variables (pydantic-settings).

Every JetStream option is explicit here rather than left to server defaults, because each one
changes a guarantee: file storage and replicas decide what survives a crash or a node loss,
the duplicate window decides how long a retried publish is recognised, and limits retention
with DiscardNew keeps the command log and the fact log (the record) whole: a size cap refuses
new messages, never evicts old ones.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class StreamOptions(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_STREAM_", extra="forbid")

    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(1, ge=1, le=5)
    duplicate_window_s: float = Field(120.0, gt=0)
    # -1: unlimited.  A cap never evicts: the streams discard *new* messages when full (the
    # scheduler reports "disk full"), because the fact log is the record and its first facts
    # are the configuration every later one needs (issue 29).  Compaction is done by the
    # operator: snapshot, archive, purge (docs/operations.md#retention-and-compaction).
    max_bytes: int = Field(-1, ge=-1)
    max_age_s: float = Field(0.0, ge=0)  # only 0 (keep forever): an age limit always evicts
    max_msg_size: int = Field(1024 * 1024, ge=1024)

    @field_validator("max_age_s")
    @classmethod
    def _no_eviction(cls, value: float) -> float:
        if value != 0:
            raise ValueError(
                f"QUOTASCHED_STREAM_MAX_AGE_S={value:g} would evict the oldest facts and commands, "
                "which the scheduler and the audit need; leave it 0 and compact instead "
                "(docs/operations.md, Retention and compaction)")  # fmt: skip
        return value


class HttpOptions(BaseSettings):
    """The limits of the AWS Batch endpoint and the web view, each server on its own
    (`services/http_guard.py`; docs/service.md, "Limits of the HTTP ports")."""

    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_HTTP_", extra="ignore")

    header_timeout_s: float = Field(10.0, gt=0)  # a new connection's request headers, complete
    body_timeout_s: float = Field(30.0, gt=0)  # a request's body, once its headers are in
    keepalive_timeout_s: float = Field(15.0, gt=0)  # idle after an answer, to the next headers
    max_connections: int = Field(128, ge=1)  # open at once; then the longest idle is closed
    # Host names (or name:port) the servers answer to besides the addresses they listen on
    # (QUOTASCHED_HTTP_ALLOWED_HOSTS="batch.example.com,batch:8080")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    error_log_interval_s: float = Field(60.0, gt=0)  # one line per kind of error and interval
    search_timeout_s: float = Field(120.0, gt=0)  # the web view's job search, one at a time
    # The AWS Batch endpoint's requests waiting on the scheduler at once; beyond it a request is
    # answered 429 TooManyRequestsException at once, without touching the bus
    max_in_flight: int = Field(64, ge=1)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts(cls, value):
        if isinstance(value, str):
            return tuple(name.lower() for name in re.split(r"[\s,]+", value) if name)
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_", extra="ignore")

    nats_url: str | None = None  # None: `quotasched up` starts an embedded nats-server
    data_dir: str = ".quotasched"
    partition: str = "main"  # the lease key and consumer name of this scheduling partition
    lease_ttl_s: float = Field(6.0, ge=2.0)
    # A file only this scheduler instance locks (`--instance-lock`): restarted after a crash,
    # it takes its own lease back at once instead of waiting lease_ttl_s (instance.py).
    instance_lock: str | None = None
    tick_interval_s: float = Field(1.0, gt=0)
    snapshot_every: int = Field(50_000, ge=100)  # facts between state snapshots
    batch_commands: int = Field(512, ge=1, le=1000)  # commands decided per atomic append
    max_ack_pending: int = Field(20_000, ge=1)
    publish_timeout_s: float = Field(5.0, gt=0)
    # GET /metrics and /healthz of the scheduler and the projector (docs/metrics.md); None: off
    metrics_port: int | None = Field(None, ge=0, le=65535)  # 0: any free port
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 to be scraped from other hosts or containers
    streams: StreamOptions = Field(default_factory=StreamOptions)
    # The executor's variables a job also gets (`--pass-env`; QUOTASCHED_PASS_ENV="A,B"): a
    # job's environment is built, never inherited (services/executors/jobenv.py).
    pass_env: Annotated[tuple[str, ...], NoDecode] = ()
    # The user jobs run as (`--run-as`; QUOTASCHED_RUN_AS), and where their attempts' working
    # directories go (`--work-dir`; default <state dir>/work): services/executors/jobuser.py.
    run_as: str | None = None
    job_work_dir: str | None = None
    # The GPU agent's per-job checkpoint directories, `<checkpoint_dir>/<job>`, kept across the
    # job's attempts (default <state dir>/checkpoints; share it between the hosts for a job
    # to resume on another one), and what is kept once the job ended: never, failed (its
    # checkpoints stay for a look or a resubmission) or always (services/executors/checkpoints.py).
    checkpoint_dir: str | None = None
    checkpoint_keep: Literal["never", "failed", "always"] = "never"
    # The most seconds between SIGTERM and SIGKILL a job may ask for (its tag `grace`) when it
    # is preempted or terminated; a job asking for nothing gets the executor's --grace.
    preempt_grace_max_s: float = Field(60.0, ge=0, allow_inf_nan=False)

    @field_validator("pass_env", mode="before")
    @classmethod
    def _names(cls, value):
        if isinstance(value, str):  # from the environment: comma- or space-separated
            return tuple(name for name in re.split(r"[\s,]+", value) if name)
        return value
