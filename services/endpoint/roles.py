"""The endpoint acting as each key's role: the keys file `quotasched auth generate` writes
(`endpoint-keys.json`: access key id -> role, secret, the role's NATS credentials), one NATS
connection per role, and a NATS permissions violation turned into AWS's AccessDeniedException.

The endpoint holds no rules of its own about who may do what: a request signed with a team's
key is performed over a connection logged in as that team, so the NATS server's subject
permissions (`services.config.auth.roles`) decide, exactly as for the team's own NATS clients.  The
server refuses a forbidden publish or subscription asynchronously, naming only the subject
(`-ERR 'Permissions Violation for Publish to "..."'`), and drops it: the operation would wait
for an answer that never comes.  So each role's client remembers which subjects each request
in flight used, and the request whose subject was refused is answered at once, 403.

One rule is the endpoint's own, because NATS cannot express it: a team's key may describe
another share's job only as AWS would with an IAM policy scoped to the team's resources, that
is not at all (AccessDeniedException, `ResourceDenied`); its summary stays in ListServiceJobs.
The scheduler's answer to the team's subject already lacks the payload and tags (defence in
depth: the endpoint never sees them to leak).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from quotasched.services.nats.credentials import INBOX_ENV, PASSWORD_ENV, USER_ENV
from quotasched.services.nats.bus import connect
from quotasched.services.client import Bus

_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) to "([^"]+)"', re.IGNORECASE
)
BY_JOB_ID = frozenset({"describe-service-job"})  # the read questions naming a job by id only
CANCEL_WAIT_S = 2.0  # how long a denied operation may take to clean up (its consumers)


class KeysError(ValueError):
    """The keys file cannot be used (one line, for the command line)."""


@dataclass(frozen=True)
class Key:
    access_key_id: str
    role: str
    secret: str
    nats: dict[str, str]  # the role's credentials file's NATS variables (`Role.environment`)
    job_queue: str | None = None  # a pipeline's own job queue, the only one it may ask about
    quota_share: str | None = None  # a pipeline's own share, the only one whose jobs it describes


def load_keys(path: str | Path) -> dict[str, Key]:
    """Access key id -> Key, from the keys file; `KeysError` says what is wrong with it."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise KeysError(f"cannot read the keys file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise KeysError(f"the keys file {path} is not JSON: {error}") from None
    if not isinstance(document, dict) or not document:
        raise KeysError(f"the keys file {path} holds no keys (an object of access key id -> "
                        "role, secretAccessKey, nats; `quotasched auth generate` writes it)")  # fmt: skip
    return {key_id: _key(path, key_id, entry) for key_id, entry in document.items()}


def _key(path: str | Path, key_id: str, entry: Any) -> Key:
    nats = entry.get("nats") if isinstance(entry, dict) else None
    fields = (entry.get("role"), entry.get("secretAccessKey")) if isinstance(entry, dict) else ()
    if (not all(isinstance(value, str) and value for value in fields) or len(fields) != 2
            or not isinstance(nats, dict) or not isinstance(nats.get(USER_ENV), str)
            or not all(isinstance(value, str) for value in nats.values())):  # fmt: skip
        raise KeysError(f"the keys file {path}: key {key_id} needs role, secretAccessKey and "
                        f"nats ({USER_ENV}, {PASSWORD_ENV}, {INBOX_ENV})")  # fmt: skip
    queue, share = entry.get("jobQueue"), entry.get("quotaShare")
    for member, value in (("jobQueue", queue), ("quotaShare", share)):
        if value is not None and not isinstance(value, str):
            raise KeysError(f"the keys file {path}: key {key_id}: {member} must be a name")
    return Key(key_id, entry["role"], entry["secretAccessKey"], dict(nats), queue, share)


class Denied(Exception):
    """The NATS server refused what a request did as its role."""

    def __init__(self, role: str, action: str, subject: str):
        super().__init__(f"{action} to {subject}")
        self.role, self.action, self.subject = role, action, subject

    def message(self, operation: str) -> str:
        return (f"User: {self.role} is not authorized to perform: batch:{operation} (the NATS "
                f"server refused {self.action} to {self.subject})")  # fmt: skip


class ResourceDenied(Denied):
    """A team's key asked about a resource of another share (AWS's words for an IAM denial)."""

    def __init__(self, role: str, resource: str, why: str):
        super().__init__(role, "read", resource)
        self.resource, self.why = resource, why

    def message(self, operation: str) -> str:
        return (f"User: {self.role} is not authorized to perform: batch:{operation} on "
                f"resource: {self.resource} ({self.why})")  # fmt: skip


class _InFlight:
    """One request being performed: the subjects it used, and whether one was refused."""

    def __init__(self) -> None:
        self.subjects: dict[str, str] = {}  # lower case (as nats-py reports) -> as used
        self.denied: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()


_CURRENT: contextvars.ContextVar[_InFlight | None] = contextvars.ContextVar(
    "quotasched_endpoint_request", default=None)  # fmt: skip


class WatchedClient(Client):
    """A nats-py client that notes, for the request being served (a context variable: the
    operation's task and what it awaits), every subject it publishes or subscribes on, so the
    server's refusal of one is told to the request that used it and to no other."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: set[_InFlight] = set()

    async def publish(self, subject: str, *args: Any, **kwargs: Any) -> None:
        self._note(subject)
        await super().publish(subject, *args, **kwargs)

    async def subscribe(self, subject: str, *args: Any, **kwargs: Any):
        self._note(subject)
        return await super().subscribe(subject, *args, **kwargs)

    def _note(self, subject: str) -> None:
        request = _CURRENT.get()
        if request is not None:
            request.subjects[subject.lower()] = subject

    async def on_error(self, error: Exception) -> None:
        """nats-py's error callback: a permissions violation denies the requests that used
        the subject (nats-py reports the server's -ERR all in lower case, subject included)."""
        found = _VIOLATION.search(str(error))
        if found is None:
            return
        action, subject = found[1].lower(), found[2].lower()
        for request in self.in_flight:
            if subject in request.subjects and not request.denied.done():
                request.denied.set_result((action, request.subjects[subject]))


class RoleBus(Bus):
    """A `Bus` logged in as one role, whose refused subjects deny the request that used them."""

    def __init__(self, url: str, key: Key):
        super().__init__(url, name=f"quotasched-endpoint-{key.role}", credentials=key.nats)
        self.role = key.role
        self.job_queue = key.job_queue
        self.own_share = None if key.quota_share is None else (key.job_queue, key.quota_share)
        self.client = WatchedClient()

    async def __aenter__(self) -> RoleBus:
        self.nc = await connect(self.url, self.name, credentials=self.credentials,
                                client=self.client, on_error=self.client.on_error)  # fmt: skip
        self.js = self.nc.jetstream()
        return self

    async def request(self, verb: str, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        """A pipeline's questions name no job queue when AWS's do not (describe a job by its
        id, or find where a job to update lives): asked fleet-wide they are refused, as the
        role may ask about its own queue only, so they are asked there; a job of another queue
        then does not exist, as for the team's own NATS clients."""
        if verb in BY_JOB_ID and self.job_queue is not None and not params.get("jobQueue"):
            params["jobQueue"] = self.job_queue
        return await super().request(verb, timeout, **params)

    async def run(self, operation) -> Any:
        """Await `operation` (a coroutine using this bus); `Denied` as soon as the server
        refuses a subject it used (the operation is cancelled: it would wait in vain)."""
        request = _InFlight()
        self.client.in_flight.add(request)
        token = _CURRENT.set(request)
        try:
            task = asyncio.ensure_future(operation)  # copies the context: it sees `request`
        finally:
            _CURRENT.reset(token)
        try:
            await asyncio.wait({task, request.denied}, return_when=asyncio.FIRST_COMPLETED)
            if request.denied.done():
                task.cancel()
                await asyncio.wait({task}, timeout=CANCEL_WAIT_S)  # its cleanup, not forever
                raise Denied(self.role, *request.denied.result())
            return task.result()
        finally:
            self.client.in_flight.discard(request)
            if not task.done():
                task.cancel()


class RoleBuses:
    """One connected `RoleBus` per role, made on the first request signed with its key (a
    role never used costs no connection) and closed with the endpoint."""

    def __init__(self, url: str):
        self.url = url
        self._buses: dict[str, RoleBus] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def bus(self, key: Key) -> RoleBus:
        # two first requests of one role at once make one connection; other roles never wait
        async with self._locks.setdefault(key.role, asyncio.Lock()):
            if key.role not in self._buses:
                self._buses[key.role] = await RoleBus(self.url, key).__aenter__()
            return self._buses[key.role]

    async def close(self) -> None:
        buses, self._buses = list(self._buses.values()), {}
        for bus in buses:
            await bus.close()
