"""NATS users and subject permissions, derived from the subject scheme in `events.subjects`,
and how a process presents its credentials.

`quotasched auth generate` turns a configuration (the YAML of `quotasched config apply`, or a
command file) into a nats-server configuration fragment with one user per role (its password
only as a bcrypt hash), and one credentials file per role (the password itself).  The roles:

  admin                  configures everything; every subject
  scheduler, projector   the services; only the scheduler may append to the fact log
  executor               publishes ReportJobStatus on the configured job queues' subjects and
                         reads the fact log through its durable consumer and ordered readers;
                         it may create, inspect, ack and delete (to restore one that was
                         changed) any consumer on the fact log except the teams' slots (denied
                         by name)
  agent                  an executor that also keeps a GPU fleet: the QM_FLEET bucket (its
                         stream, keys and watchers), UpdateServiceEnvironment,
                         describe-service-environments; nothing of any other bucket
  gate                   the admission gate: takes the teams' job commands and forwards
                         those within their share's limits to the command stream
  pipeline-<q>-<share>   publishes SubmitServiceJob, UpdateServiceJob and TerminateServiceJob
                         on its own share's gate subjects only (`qm.in.<q>.<share>.<Kind>`:
                         never straight into the command stream), reads its own share's facts
                         through a consumer whose filter is its share (the server refuses to
                         create a consumer with any other filter), and sends read requests on
                         `qm.api.<q>.<share>.<verb>` only: answered about its job queue (like
                         AWS's per-queue list-service-jobs), with the payloads and tags of its
                         own share's jobs only (other shares' jobs: their summaries)

Two (queue, share) pairs that would give one user name (`ml`/`vision-a` and `ml-vision`/`a`
both give pipeline-ml-vision-a, and so one inbox, credentials file and consumer names) are
refused (`NameCollision`): everything else derived from a role is a function of its name.

Every role has its own inbox prefix (`_INBOX_<role>`) and may subscribe to nothing else: the
replies and consumer deliveries of one role never reach another (a shared `_INBOX.>` would let
one team receive another's facts).

A process presents its credentials through the environment, so every entry point (CLI, Python
client, services) uses them alike: QUOTASCHED_NATS_USER, QUOTASCHED_NATS_PASSWORD,
QUOTASCHED_NATS_INBOX_PREFIX, and QUOTASCHED_NATS_TLS_CA (a CA bundle: TLS, with the server's
certificate verified against it); services/nats/credentials.py reads them.  A role's
credentials file holds those lines.

Each role also gets an AWS-style access key pair for the AWS Batch endpoint (`quotasched
endpoint --keys`): its credentials file holds AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY too,
so the same file makes the AWS CLI and boto3 act as that role, and `endpoint-keys.json` maps
each access key id to its role, secret and NATS credentials.  The endpoint acts on NATS as the
key's role, so the NATS permissions above decide what a key may do, whichever path it takes.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotasched.events.subjects import (
    API_PREFIX,
    COMMANDS_PREFIX,
    COMMANDS_STREAM,
    FACTS_PREFIX,
    FACTS_STREAM,
    FLEET_BUCKET,
    GATE_PREFIX,
    GATED_COMMANDS,
    LEASES_BUCKET,
    SNAPSHOTS_BUCKET,
)
from quotasched.services.nats.credentials import (
    INBOX_ENV,
    PASSWORD_ENV,
    TLS_CA_ENV,
    USER_ENV,
)

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"  # the AWS CLI's and boto3's own variables
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
ENDPOINT_KEYS_FILE = "endpoint-keys.json"
ACCESS_KEY_PREFIX = "QSAK"  # AWS's ids start AKIA/ASIA: ours cannot be mistaken for real ones
KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # AWS's: upper-case letters and digits 2-7
SECRET_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

TEAM_QUEUE_ENV = "QUOTASCHED_TEAM_QUEUE"  # a pipeline's own (queue, share): where its reads go
TEAM_SHARE_ENV = "QUOTASCHED_TEAM_SHARE"  # (services.client.reads)

JOB_COMMANDS = GATED_COMMANDS  # what a team publishes: through the gate only
PROJECTOR_PREFIX = "qm.proj"  # services.projector.API_PREFIX
PROJECTED = "qm.projected"  # services.projector.APPLIED_SUBJECT


def new_access_key_id() -> str:
    """20 characters like AWS's (QSAK + 16 random of its alphabet: 80 bits, never guessed)."""
    return ACCESS_KEY_PREFIX + "".join(secrets.choice(KEY_ALPHABET) for _ in range(16))


def new_secret_access_key() -> str:
    """40 characters of AWS's secret alphabet (base64's): 240 bits from `secrets`."""
    return "".join(secrets.choice(SECRET_ALPHABET) for _ in range(40))


@dataclass
class Role:
    name: str
    publish: list[str]
    subscribe: list[str]
    allow_responses: bool = False
    password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    access_key_id: str = field(default_factory=new_access_key_id)
    secret_access_key: str = field(default_factory=new_secret_access_key)
    job_queue: str | None = None  # a pipeline's: the one job queue it may ask about
    quota_share: str | None = None  # a pipeline's: the share whose payloads and tags it reads
    deny_publish: list[str] = field(default_factory=list)  # carved out of `publish`

    @property
    def inbox(self) -> str:
        return f"_INBOX_{self.name}"

    def user(self) -> dict[str, Any]:
        """The server's entry for this role: the password only as a bcrypt hash, which
        nats-server checks a client's password against (so the server's configuration holds
        nothing a client could log in with)."""
        publish: dict[str, Any] = {"allow": self.publish}
        if self.deny_publish:
            publish["deny"] = self.deny_publish  # the server checks deny before allow
        permissions: dict[str, Any] = {"publish": publish,
                                       "subscribe": {"allow": [*self.subscribe, f"{self.inbox}.>"]}}
        if self.allow_responses:
            permissions["allow_responses"] = True
        return {"user": self.name, "password": password_hash(self.password),
                "permissions": permissions}  # fmt: skip

    def environment(self, tls_ca: str | None = None) -> dict[str, str]:
        """The NATS variables a process of this role connects with."""
        env = {USER_ENV: self.name, PASSWORD_ENV: self.password, INBOX_ENV: self.inbox}
        if self.job_queue is not None and self.quota_share is not None:
            env.update({TEAM_QUEUE_ENV: self.job_queue, TEAM_SHARE_ENV: self.quota_share})
        if tls_ca:
            env[TLS_CA_ENV] = tls_ca
        return env

    def aws_environment(self) -> dict[str, str]:
        """The AWS CLI's and boto3's variables for this role's access key pair."""
        return {ACCESS_KEY_ENV: self.access_key_id, SECRET_KEY_ENV: self.secret_access_key}

    def endpoint_key(self, tls_ca: str | None = None) -> dict[str, Any]:
        """This role's entry in the endpoint's keys file: what it checks a signature with
        (the secret) and what it then connects to NATS as (the role's own credentials)."""
        entry = {"role": self.name, "secretAccessKey": self.secret_access_key,
                 "nats": self.environment(tls_ca)}  # fmt: skip
        if self.job_queue is not None:
            entry["jobQueue"] = self.job_queue
        if self.quota_share is not None:
            entry["quotaShare"] = self.quota_share
        return entry


BCRYPT_COST = 11  # nats-server's own `nats server passwd` default


def password_hash(password: str) -> str:
    """bcrypt, with the `$2a$` prefix nats-server recognises as a hash."""
    import bcrypt

    salt = bcrypt.gensalt(rounds=BCRYPT_COST, prefix=b"2a")
    return bcrypt.hashpw(password.encode(), salt).decode()


def _js(*verbs: str) -> list[str]:
    return [f"$JS.API.{verb}" for verb in verbs]


KV_LEASES = f"KV_{LEASES_BUCKET}"  # the streams behind the buckets (nats-py's naming)
OBJ_SNAPSHOTS = f"OBJ_{SNAPSHOTS_BUCKET}"
STREAMS = (COMMANDS_STREAM, FACTS_STREAM, KV_LEASES, OBJ_SNAPSHOTS)
# How many consumers a team may hold at once on the fact log: NATS permissions match whole
# subject tokens only (no prefix wildcard), so a team's consumers have fixed names,
# <role>-0 .. <role>-<CONSUMER_SLOTS - 1> (`team_consumers`).
CONSUMER_SLOTS = 8


def team_consumers(role: str) -> list[str]:
    """The only consumer names a pipeline role may create, use and delete on the fact log."""
    return [f"{role}-{slot}" for slot in range(CONSUMER_SLOTS)]


def started_services() -> list[str]:
    """What every service needs to start (`bus.ensure_streams` looks at each stream and
    bucket, and asks for nothing else when they exist) and to answer flow control."""
    return [*_js("INFO", *(f"STREAM.INFO.{stream}" for stream in STREAMS)), "$JS.FC.>"]


def log_reader(stream: str) -> list[str]:
    """Reading a whole stream through ordered consumers (ephemeral, named by the server:
    the legacy create subject, which carries no name, so none can be taken over) and
    single messages; nothing that changes or removes a consumer it did not create."""
    return _js(f"CONSUMER.CREATE.{stream}", f"STREAM.MSG.GET.{stream}",
               f"DIRECT.GET.{stream}", f"DIRECT.GET.{stream}.>")  # fmt: skip


def fact_reader(role: str, subject_filter: str) -> list[str]:
    """A team reading its own facts: create, inspect, pull from, ack and delete consumers
    named `team_consumers(role)` only, each with `subject_filter` in the API subject (the
    server checks the consumer's filter against it).  The legacy durable create
    (`CONSUMER.DURABLE.CREATE`) carries no filter, so it is never allowed."""
    names = team_consumers(role)
    return [*_js("INFO", f"STREAM.INFO.{FACTS_STREAM}"),
            *(subject for name in names for subject in _js(
                f"CONSUMER.CREATE.{FACTS_STREAM}.{name}.{subject_filter}",
                f"CONSUMER.INFO.{FACTS_STREAM}.{name}", f"CONSUMER.DELETE.{FACTS_STREAM}.{name}",
                f"CONSUMER.MSG.NEXT.{FACTS_STREAM}.{name}")),
            *(f"$JS.ACK.{FACTS_STREAM}.{name}.>" for name in names), "$JS.FC.>"]  # fmt: skip


def scheduler_api() -> list[str]:
    """The scheduler owns its four streams: it creates and updates them (`ensure_streams`),
    reads them, runs its command consumers (delete and recreate each term) and purges
    replaced snapshot chunks (the object store does, on put); it never deletes a stream nor
    purges the command or fact log, and touches no other stream."""
    verbs = ["STREAM.NAMES"]
    for stream in STREAMS:
        verbs += [f"STREAM.CREATE.{stream}", f"STREAM.UPDATE.{stream}",
                  f"CONSUMER.CREATE.{stream}.>", f"CONSUMER.DURABLE.CREATE.{stream}.*",
                  f"CONSUMER.INFO.{stream}.*", f"CONSUMER.LIST.{stream}",
                  f"CONSUMER.NAMES.{stream}", f"CONSUMER.MSG.NEXT.{stream}.*"]  # fmt: skip
    verbs += [f"CONSUMER.DELETE.{COMMANDS_STREAM}.*", f"STREAM.PURGE.{OBJ_SNAPSHOTS}"]
    readers = [subject for stream in STREAMS for subject in log_reader(stream)]
    return [*started_services(), *_js(*verbs), *readers, *(f"$JS.ACK.{s}.>" for s in STREAMS)]


class NameCollision(ValueError):
    """Two (job queue, quota share) pairs would give one role name (one line)."""


def pipeline_name(queue: str, share: str) -> str:
    return f"pipeline-{queue}-{share}"


def pipelines(shares: Iterable[tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Role name -> (job queue, quota share), sorted; `NameCollision` names both pairs when two
    give one name (names may hold hyphens, so the name alone cannot tell them apart; the
    user, its inbox, credentials file and consumer slots all derive from it)."""
    named: dict[str, tuple[str, str]] = {}
    for queue, share in sorted(set(shares)):
        name = pipeline_name(queue, share)
        if name in named:
            other = named[name]
            raise NameCollision(f"job queue {other[0]!r} share {other[1]!r} and job queue "
                                f"{queue!r} share {share!r} both become user {name}; rename "
                                "one of the shares (or queues)")  # fmt: skip
        named[name] = (queue, share)
    return named


def executor_publish(queues: Iterable[str]) -> list[str]:
    """Status reports on the configured queues' subjects (any share: a share created later
    needs no new credentials; the scheduler checks a report's route against the job), and
    the fact log through its durable consumer (`CONSUMER.DURABLE.CREATE`, whose subject
    carries the name only: NATS matches whole tokens, so `executor-*` cannot be expressed;
    the teams' slots are denied instead, `team_slots_denied`) and ordered readers."""
    return [*(f"{COMMANDS_PREFIX}.{queue}.*.ReportJobStatus" for queue in sorted(set(queues))),
            *started_services(), *log_reader(FACTS_STREAM),
            *_js(f"CONSUMER.DURABLE.CREATE.{FACTS_STREAM}.*", f"CONSUMER.INFO.{FACTS_STREAM}.*",
                 f"CONSUMER.DELETE.{FACTS_STREAM}.*"),  # a changed consumer is recreated (watch.py)
            f"$JS.ACK.{FACTS_STREAM}.>"]  # fmt: skip


def team_slots_denied(names: Iterable[str]) -> list[str]:
    """What an executor must not do to a team's consumer slots on the fact log: create or
    change one (it would read, or redirect, a team's facts), inspect it, ack its messages."""
    return [subject for name in names for slot in team_consumers(name) for subject in (
        *_js(f"CONSUMER.DURABLE.CREATE.{FACTS_STREAM}.{slot}",
             f"CONSUMER.INFO.{FACTS_STREAM}.{slot}", f"CONSUMER.DELETE.{FACTS_STREAM}.{slot}"),
        f"$JS.ACK.{FACTS_STREAM}.{slot}.>")]


def roles(shares: Iterable[tuple[str, str]]) -> list[Role]:
    """Every role, with one pipeline per (job queue, quota share); `NameCollision` when two
    pairs would share a pipeline's name."""
    teams = pipelines(shares)
    denied = team_slots_denied(teams)
    stores = [f"$KV.{LEASES_BUCKET}.>", f"$O.{SNAPSHOTS_BUCKET}.>"]
    out = [
        Role("admin", publish=[">"], subscribe=[">"]),
        Role("scheduler", publish=[f"{COMMANDS_PREFIX}.*.~.Tick", f"{FACTS_PREFIX}.>",
                                   *scheduler_api(), *stores],
             subscribe=[f"{API_PREFIX}.>", *stores], allow_responses=True),
        Role("projector", publish=[*started_services(), *log_reader(FACTS_STREAM), PROJECTED],
             subscribe=[f"{PROJECTOR_PREFIX}.>"], allow_responses=True),
    ]  # fmt: skip
    executor = Role("executor", publish=executor_publish(queue for queue, _ in teams.values()),
                    subscribe=[], deny_publish=denied)  # fmt: skip
    out += [executor, agent_role(executor), gate_role()]
    for name, (queue, share) in teams.items():
        out.append(Role(
            name,
            publish=[*(f"{GATE_PREFIX}.{queue}.{share}.{kind}" for kind in JOB_COMMANDS),
                     *fact_reader(name, f"{FACTS_PREFIX}.{queue}.{share}.*"),
                     f"{API_PREFIX}.{queue}.{share}.*"],
            subscribe=[], job_queue=queue, quota_share=share,
        ))  # fmt: skip
    return out


def gate_role() -> Role:
    """The admission gate (services/gate): receives the teams' job commands on `qm.in.>`, in its
    queue group, forwards them to the same kinds' `qm.cmd` subjects of any share (the team's
    own subject, which the gate does not change), answers refusals (`allow_responses`), and
    reads the shares' limits from the fact log through an ordered consumer."""
    return Role("gate", publish=[*(f"{COMMANDS_PREFIX}.*.*.{kind}" for kind in JOB_COMMANDS),
                                 *started_services(), *log_reader(FACTS_STREAM)],
                subscribe=[f"{GATE_PREFIX}.>"], allow_responses=True)  # fmt: skip


def agent_role(executor: Role) -> Role:
    """A GPU agent (services/executors/agent.py) is an executor that also keeps its fleet: the
    fleet's KV bucket (heartbeats, claims, the capacity it published; created by the first
    agent: `fleet_bucket`), watched through ordered consumers (nats-py's `kv.watch` creates
    one, server-named, and asks for its info), the capacity command, and the question of
    what the environment's limits are.  It never deletes or purges the bucket, nor a consumer
    but its own executor consumer (as the executor role), and touches no other bucket."""
    kv = f"KV_{FLEET_BUCKET}"
    return Role("agent", publish=[
        *executor.publish, f"{COMMANDS_PREFIX}.~.~.UpdateServiceEnvironment",
        f"{API_PREFIX}.~.describe-service-environments", f"$KV.{FLEET_BUCKET}.>",
        *_js(f"STREAM.INFO.{kv}", f"STREAM.CREATE.{kv}", f"CONSUMER.CREATE.{kv}",
             f"CONSUMER.INFO.{kv}.*", f"STREAM.MSG.GET.{kv}", f"DIRECT.GET.{kv}",
             f"DIRECT.GET.{kv}.>")],
        subscribe=[], deny_publish=executor.deny_publish)  # fmt: skip


def shares_of(path: str | Path) -> list[tuple[str, str]]:
    """(job queue, quota share) pairs declared in a configuration: the YAML of `quotasched
    config apply`, or a command file (JSON Lines) whose CreateQuotaShare commands count."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        from quotasched.services.config.as_code import load

        return list(load(path).shares)
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            command = json.loads(line)
            if isinstance(command, dict) and command.get("kind") == "CreateQuotaShare":
                pairs.append((command["jobQueue"], command["quotaShareName"]))
    return pairs


def server_config(all_roles: list[Role]) -> str:
    """A nats-server configuration fragment (JSON is valid nats-server configuration)."""
    document = {"authorization": {"users": [role.user() for role in all_roles]}}
    return ("# quotasched auth generate: users and subject permissions per role.\n"
            "# Include it in the server's configuration, or start nats-server -c with it.\n"
            + json.dumps(document, indent=2) + "\n")  # fmt: skip


def endpoint_keys(all_roles: list[Role], tls_ca: str | None = None) -> str:
    """The AWS Batch endpoint's keys file: access key id -> the role's entry."""
    keys = {role.access_key_id: role.endpoint_key(tls_ca) for role in all_roles}
    if len(keys) != len(all_roles):  # 80 random bits each: never, but never silently
        raise NameCollision("two roles drew the same access key id; generate again")
    return json.dumps(keys, indent=2) + "\n"


def write(all_roles: list[Role], out: Path, tls_ca: str | None = None) -> list[Path]:
    """nats-server.conf, endpoint-keys.json and creds/<role>.env under `out`, each readable by
    its owner only (mode 0600: they hold secrets or their hashes); returns the paths."""
    creds = out / "creds"
    creds.mkdir(parents=True, exist_ok=True)
    files = {out / "nats-server.conf": server_config(all_roles),
             out / ENDPOINT_KEYS_FILE: endpoint_keys(all_roles, tls_ca)}  # fmt: skip
    for role in all_roles:
        variables = {**role.environment(tls_ca), **role.aws_environment()}
        files[creds / f"{role.name}.env"] = "".join(f"{key}={value}\n"
                                                    for key, value in variables.items())
    for path, text in files.items():
        _write_private(path, text)
    return list(files)


def _write_private(path: Path, text: str) -> None:
    """Created 0600 before a byte is written (a file left by an earlier run is narrowed first),
    so no secret is ever readable by others, not even for an instant."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)


def read_credentials(path: str | Path) -> dict[str, str]:
    """The variables of a credentials file (KEY=value lines)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            env[key.strip()] = value.strip()
    return env
