"""Configuration, from flags or `QUOTASCHED_*` environment variables (pydantic-settings).

Every JetStream option is explicit here rather than left to server defaults, because each one
changes a guarantee: file storage and replicas decide what survives a crash or a node loss,
the duplicate window decides how long a retried publish is recognised, and limits retention
keeps the command log and the fact log (the record) forever unless an operator says otherwise.
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
    max_bytes: int = Field(-1, ge=-1)  # -1: unlimited; the fact log is the record
    max_age_s: float = Field(0.0, ge=0)  # 0: keep forever
    max_msg_size: int = Field(1024 * 1024, ge=1024)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QUOTASCHED_", extra="ignore")

    nats_url: str | None = None  # None: `quotasched up` starts an embedded nats-server
    data_dir: str = ".quotasched"
    partition: str = "main"  # the lease key and consumer name of this scheduling partition
    lease_ttl_s: float = Field(6.0, ge=2.0)
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

    @field_validator("pass_env", mode="before")
    @classmethod
    def _names(cls, value):
        if isinstance(value, str):  # from the environment: comma- or space-separated
            return tuple(name for name in re.split(r"[\s,]+", value) if name)
        return value
