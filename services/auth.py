"""NATS credentials and permissions: what each role may publish and subscribe to, derived
from the subject scheme in `events.subjects`, and how a process presents its credentials.

Roles:
  admin                  configure everything (service environments, policies, queues, shares)
  scheduler, projector   the services (the scheduler is the only writer of the fact log)
  executor               report job status (ReportJobStatus on any job's subject) and read
                         the facts that start and stop attempts
  pipeline-<q>-<share>   submit, update and terminate jobs in its own quota share, and read
                         the facts of that share only (with a filtered ordered consumer)

A process presents its credentials through the environment, so every entry point (CLI,
client, services) uses them alike: QUOTASCHED_NATS_USER and QUOTASCHED_NATS_PASSWORD, and
QUOTASCHED_NATS_TLS_CA (a CA bundle: the connection uses TLS and verifies the server).
"""

from __future__ import annotations

import os
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events.subjects import (
    API_PREFIX,
    COMMANDS_PREFIX,
    COMMANDS_STREAM,
    FACTS_PREFIX,
    FACTS_STREAM,
    LEASES_BUCKET,
    SNAPSHOTS_BUCKET,
)

USER_ENV, PASSWORD_ENV, TLS_CA_ENV = (
    "QUOTASCHED_NATS_USER", "QUOTASCHED_NATS_PASSWORD", "QUOTASCHED_NATS_TLS_CA")

JOB_COMMANDS = ("SubmitServiceJob", "UpdateServiceJob", "TerminateServiceJob")
# what an executor acts on (services.executors.app.EXECUTOR_FACTS)
EXECUTOR_FACTS = ("JobSubmitted", "JobDispatched", "JobPreempted", "JobStatusChanged")
# read requests a pipeline may ask the scheduler (no configuration verbs exist on qm.api)
PIPELINE_API = ("describe-service-job", "list-service-jobs", "get-job-queue-snapshot",
                "describe-job-queues", "describe-quota-shares")  # fmt: skip


def connect_options(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """nats.connect keyword arguments for the credentials and TLS CA in the environment."""
    environ = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    if environ.get(USER_ENV):
        options["user"] = environ[USER_ENV]
        options["password"] = environ.get(PASSWORD_ENV, "")
    if environ.get(TLS_CA_ENV):
        options["tls"] = ssl.create_default_context(cafile=environ[TLS_CA_ENV])
    return options


@dataclass
class Role:
    name: str
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24))


def _js_api(*verbs: str) -> list[str]:
    return [f"$JS.API.{verb}" for verb in verbs]


def _reader(stream: str, subject_filter: str | None = None) -> list[str]:
    """What reading `stream` with an ordered consumer needs: create it (filtered on a subject
    when given, so the server refuses any other filter), ask about it and the stream, and
    delete it again; plus flow-control replies."""
    create = (f"CONSUMER.CREATE.{stream}.*.{subject_filter}" if subject_filter
              else f"CONSUMER.CREATE.{stream}.>")  # fmt: skip
    return [*_js_api("INFO", create, f"CONSUMER.INFO.{stream}.*",
                     f"CONSUMER.DELETE.{stream}.*", f"STREAM.INFO.{stream}"),
            "$JS.FC.>"]  # fmt: skip


def roles(queues: dict[str, list[str]]) -> list[Role]:
    """Every role for the job queues and their quota shares ({queue: [share, ...]})."""
    everything = Role("admin", publish=[f"{COMMANDS_PREFIX}.>", f"{API_PREFIX}.>", "qm.proj.>",
                                        "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"],
                      subscribe=[f"{FACTS_PREFIX}.>", "_INBOX.>"])  # fmt: skip
    service = ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>", f"$KV.{LEASES_BUCKET}.>",
               f"$O.{SNAPSHOTS_BUCKET}.>"]  # fmt: skip
    scheduler = Role("scheduler",
                     publish=[f"{COMMANDS_PREFIX}.~.~.Tick", f"{FACTS_PREFIX}.>", *service],
                     subscribe=[f"{COMMANDS_PREFIX}.>", f"{API_PREFIX}.>", "_INBOX.>",
                                f"$KV.{LEASES_BUCKET}.>", f"$O.{SNAPSHOTS_BUCKET}.>"])  # fmt: skip
    projector = Role("projector", publish=[*service], subscribe=[f"{FACTS_PREFIX}.>",
                                                                 "qm.proj.>", "_INBOX.>"])
    executor = Role(
        "executor",
        publish=[f"{COMMANDS_PREFIX}.*.*.ReportJobStatus",
                 *_js_api("INFO", f"STREAM.INFO.{FACTS_STREAM}",
                          f"CONSUMER.CREATE.{FACTS_STREAM}.>", f"CONSUMER.INFO.{FACTS_STREAM}.*",
                          f"CONSUMER.DURABLE.CREATE.{FACTS_STREAM}.*",
                          f"STREAM.INFO.{COMMANDS_STREAM}",
                          f"STREAM.NAMES", f"CONSUMER.MSG.NEXT.{FACTS_STREAM}.*"),
                 "$JS.ACK.{}.>".format(FACTS_STREAM), "$JS.FC.>"],
        subscribe=[*(f"{FACTS_PREFIX}.*.*.{kind}" for kind in EXECUTOR_FACTS), "_INBOX.>"],
    )  # fmt: skip
    out = [everything, scheduler, projector, executor]
    for queue, shares in sorted(queues.items()):
        for share in sorted(shares):
            own_facts = f"{FACTS_PREFIX}.{queue}.{share}.*"
            out.append(Role(
                f"pipeline-{queue}-{share}",
                publish=[*(f"{COMMANDS_PREFIX}.{queue}.{share}.{kind}" for kind in JOB_COMMANDS),
                         *(f"{API_PREFIX}.{verb}" for verb in PIPELINE_API),
                         *_reader(FACTS_STREAM, own_facts)],
                subscribe=["_INBOX.>"],
            ))  # fmt: skip
    return out
