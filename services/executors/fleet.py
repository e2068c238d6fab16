"""What the GPU agents of a fleet share, in the NATS KV bucket QM_FLEET: who is alive, who
places which attempt, and the capacity they last published.

Keys:
  host.<host>              an agent's heartbeat, rewritten every `heartbeat_s` and whenever
                           what it holds changes: {"host", "serviceEnvironment",
                           "capacityUnit", "gpus", "attempts": [{"jobId", "attempt",
                           "jobQueue", "share", "gpus"}], "state": "up" | "gone" | "lost"}
  claim.<job>.<attempt>    (<job>: `job_key`, the id itself for any id the contract accepts)
                           who places an attempt, written once (KV `create` is atomic, so
                           exactly one agent wins): {"host", "gpus"}, or {"host", "none": true}
                           when no agent could place it in time (that agent alone reports
                           INSUFFICIENT_CAPACITY)
  fleet.<env>              the capacity the agents last published for their service
                           environment: {"capacity": {unit: instances}}

Liveness is judged by each agent's own clock, never by comparing clocks: an agent watches the
host keys and notes when each one's revision last changed; a host whose revision has not
changed for `host_timeout_s` has lapsed.  A watcher that just started gives every host a full
timeout.

The capacity keeper (`Fleet.keep`, every heartbeat) acts on the agent with the lowest live
host name of the service environment; every decision it makes is a compare-and-set on a key,
so two agents that both believe they keep (their views differ for a moment) never act twice:
- a lapsed host is marked "lost" on the condition that its key is still at the revision seen;
  the winner reports that host's attempts FAILED ("Host <name> lost (no heartbeat for N s)"),
  so each job's retryStrategy can run it elsewhere;
- when the live hosts' GPUs per unit differ from `fleet.<env>`, the keeper rewrites it on the
  condition that it is unchanged, and the winner publishes UpdateServiceEnvironment (the
  scheduler records ServiceEnvironmentUpdated): a host that joins raises the capacity, a host
  lost or gone lowers it.
An agent's own heartbeat is a compare-and-set too: one that finds its key marked "lost" (it
was too slow, not dead) stops its attempts without reporting them (the keeper did) and
advertises itself again, empty.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from quotasched.events.subjects import API_PREFIX, ANY, FLEET_BUCKET, command_subject
from quotasched.services import logs

log = logs.get("quotasched.agent")

Report = Callable[[dict[str, Any], str, str], Awaitable[None]]  # (attempt record, status, reason)


def host_key(host: str) -> str:
    return f"host.{host}"


# A job id as it stands in a key: dot-separated tokens of [A-Za-z0-9_-] (every id the contract
# accepts is one token; an older rule let dots in).  Any other id (`..`, `bad.`, `a:b`, from a
# log older than the rule) is written `=` + its unpadded base64url: still one valid key token,
# and never equal to an id as it stands, since `=` is in no id.
_KEY_AS_IS = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")


def job_key(job_id: str) -> str:
    """`job_id` as a valid NATS KV key (or part of one), one to one."""
    if _KEY_AS_IS.fullmatch(job_id):
        return job_id
    return "=" + base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def claim_key(job_id: str, attempt: int) -> str:
    return f"claim.{job_key(job_id)}.{attempt}"


async def fleet_bucket(js, storage: str = "file"):
    """The bucket, created when missing: one value per key (history 1) and no expiry, since a
    claim must outlive any redelivery of its dispatch (a new agent reads the whole log)."""
    try:
        return await js.key_value(FLEET_BUCKET)
    except NotFoundError:
        return await js.create_key_value(KeyValueConfig(
            bucket=FLEET_BUCKET, history=1,
            storage=StorageType.FILE if storage == "file" else StorageType.MEMORY))  # fmt: skip


async def claims_of(nats_url: str, job_id: str) -> list[tuple[int, dict[str, Any]]]:
    """The claims of a job's attempts, (attempt, {host, gpus} or {host, none}), in attempt
    order: where each attempt ran (for `quotasched logs` on the wrong host)."""
    from quotasched.services.nats.bus import connect

    nc = await connect(nats_url, "quotasched-logs", timeout=5.0)  # the role's credentials, TLS
    try:
        kv = await nc.jetstream().key_value(FLEET_BUCKET)
        found = []
        for number in range(1, 10_000):  # attempts are numbered 1, 2, ...; each one is claimed
            try:
                entry = await kv.get(claim_key(job_id, number))
            except KeyNotFoundError:
                break
            found.append((number, json.loads(entry.value or b"{}")))
        return found
    finally:
        await nc.close()


@dataclass
class Seen:
    """A host's last heartbeat as this agent saw it, and since when (monotonic)."""

    record: dict[str, Any]
    revision: int
    since: float


@dataclass
class Fleet:
    kv: Any
    nc: Any  # for the scheduler's describe-service-environments
    publish: Callable[[str, bytes], Awaitable[Any]]
    host: str
    service_environment: str
    heartbeat_s: float = 2.0
    host_timeout_s: float = 10.0
    hosts: dict[str, Seen] = field(default_factory=dict)
    revision: int | None = None  # of this agent's own host key, after its last write
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # the watcher's first values
    _watcher: Any = None
    _task: asyncio.Task | None = None

    # -- the view of the hosts ---------------------------------------------------------------

    async def watch(self) -> None:
        self._watcher = await self.kv.watch("host.>")
        self._task = asyncio.create_task(self._follow())
        await asyncio.wait_for(self.ready.wait(), 30)

    async def _follow(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # the values there were at the start have all arrived
                self.ready.set()
                continue
            host = entry.key.removeprefix("host.")
            if entry.operation in ("DEL", "PURGE"):
                self.hosts.pop(host, None)
                continue
            seen = self.hosts.get(host)
            if seen is None or seen.revision != entry.revision:
                self.hosts[host] = Seen(json.loads(entry.value), entry.revision, time.monotonic())
            if entry.delta == 0:
                self.ready.set()

    def mine(self) -> dict[str, Seen]:
        return {name: seen for name, seen in self.hosts.items()
                if seen.record.get("serviceEnvironment") == self.service_environment}

    def live(self) -> dict[str, Seen]:
        """The hosts that are up and whose heartbeat changed within the timeout."""
        now = time.monotonic()
        return {name: seen for name, seen in self.mine().items()
                if seen.record.get("state") == "up" and now - seen.since < self.host_timeout_s}

    def lapsed(self) -> dict[str, Seen]:
        now = time.monotonic()
        return {name: seen for name, seen in self.mine().items()
                if seen.record.get("state") == "up" and now - seen.since >= self.host_timeout_s}

    def runs_elsewhere(self, job_id: str, attempt_at_most: int) -> bool:
        """Whether a live host other than this one lists an attempt of `job_id` numbered
        `attempt_at_most` or less (a preemption's victim that is still stopping there)."""
        return any(entry["jobId"] == job_id and entry["attempt"] <= attempt_at_most
                   for name, seen in self.live().items() if name != self.host
                   for entry in seen.record.get("attempts") or [])  # fmt: skip

    # -- this agent's heartbeat --------------------------------------------------------------

    async def beat(self, record: dict[str, Any]) -> bool:
        """Write this host's heartbeat on the condition that nobody else wrote its key since;
        returns False when the keeper had marked it lost (the caller stops its attempts and
        beats again, empty).  The first beat of a process takes the key over, and returns
        False too if its previous run had been declared lost (the attempts it follows were
        reported FAILED by the keeper)."""
        data = json.dumps(record).encode()
        key = host_key(self.host)
        if self.revision is None:  # the first beat of this process: take over the key
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                self.revision = await self.kv.create(key, data)
                return True
            self.revision = await self.kv.update(key, data, last=entry.revision)
            return json.loads(entry.value or b"{}").get("state") != "lost"
        try:
            self.revision = await self.kv.update(key, data, last=self.revision)
            return True
        except KeyWrongLastSequenceError:
            entry = await self.kv.get(key)
            self.revision = entry.revision
            if json.loads(entry.value).get("state") == "lost":
                log.error("this host was declared lost by the fleet; stopping its attempts",
                          host=self.host)  # fmt: skip
                return False
            self.revision = await self.kv.update(key, data, last=entry.revision)
            return True

    async def state(self) -> str | None:
        """This host's state in the fleet ("up", "gone", "lost"), None if it has no key."""
        try:
            entry = await self.kv.get(host_key(self.host))
        except KeyNotFoundError:
            return None
        return json.loads(entry.value or b"{}").get("state")

    async def save_ledger(self, entries: list[dict[str, Any]]) -> None:
        """This host's copy of its ledger (`ledger.<host>`): what an agent started again
        without its state directory (a reinstalled host) follows."""
        await self.kv.put(f"ledger.{self.host}", json.dumps(entries).encode())

    async def saved_ledger(self) -> list[dict[str, Any]]:
        try:
            entry = await self.kv.get(f"ledger.{self.host}")
        except KeyNotFoundError:
            return []
        return json.loads(entry.value or b"[]")

    async def leave(self, record: dict[str, Any]) -> None:
        """A clean stop: the key says "gone", so the keeper lowers the capacity at once."""
        if self.revision is None:
            return
        try:
            await self.kv.update(host_key(self.host), json.dumps({**record, "state": "gone"}).encode(),
                                 last=self.revision)  # fmt: skip
        except KeyWrongLastSequenceError:
            pass  # declared lost meanwhile: the capacity is lowered already

    async def stop(self) -> None:
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:  # the connection is already closed
                pass
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- claims ------------------------------------------------------------------------------

    async def claimed(self, job_id: str, attempt: int) -> bool:
        try:
            await self.kv.get(claim_key(job_id, attempt))
            return True
        except KeyNotFoundError:
            return False

    async def claim_of(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The attempt's claim ({host, gpus} or {host, none}), None if it has none."""
        try:
            entry = await self.kv.get(claim_key(job_id, attempt))
        except KeyNotFoundError:
            return None
        try:
            value = json.loads(entry.value or b"{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def claim(self, job_id: str, attempt: int, value: dict[str, Any]) -> bool:
        """Create the attempt's claim; False if another agent's (or a "none") is there."""
        try:
            await self.kv.create(claim_key(job_id, attempt), json.dumps(value).encode())
            return True
        except KeyWrongLastSequenceError:
            return False

    # -- the capacity keeper -----------------------------------------------------------------

    def keeper(self) -> bool:
        live = self.live()
        return bool(live) and min(live) == self.host

    async def keep(self, report: Report) -> None:
        """One round of the keeper, if this agent is it: lapsed hosts, then the capacity."""
        if not self.ready.is_set() or not self.keeper():
            return
        for name, seen in self.lapsed().items():
            await self._declare_lost(name, seen, report)
        await self._set_capacity()

    async def _declare_lost(self, name: str, seen: Seen, report: Report) -> None:
        silent_s = round(time.monotonic() - seen.since)
        record = {**seen.record, "state": "lost", "attempts": []}
        try:
            await self.kv.update(host_key(name), json.dumps(record).encode(), last=seen.revision)
        except KeyWrongLastSequenceError:
            return  # it beat meanwhile, or another keeper declared it
        reason = f"Host {name} lost (no heartbeat for {silent_s} s)"
        log.warning("host lost", host=name, attempts=len(seen.record.get("attempts") or []))
        for entry in seen.record.get("attempts") or []:
            await report(entry, "FAILED", reason)

    def capacity(self) -> dict[str, int]:
        """The live hosts' GPUs per capacity unit (one GPU, one instance of the unit)."""
        total: dict[str, int] = {}
        for seen in self.live().values():
            unit = seen.record["capacityUnit"]
            total[unit] = total.get(unit, 0) + len(seen.record.get("gpus") or [])
        return total

    async def _set_capacity(self) -> None:
        key = f"fleet.{self.service_environment}"
        try:
            entry = await self.kv.get(key)
            published, revision = json.loads(entry.value)["capacity"], entry.revision
        except KeyNotFoundError:
            published, revision = {}, 0
        desired = {unit: 0 for unit in published} | self.capacity()
        if desired == published:
            return
        limits = await self._environment_limits()
        if limits is None:
            return  # the service environment does not exist (yet): next round
        try:
            await self.kv.update(key, json.dumps({"capacity": desired}).encode(), last=revision)
        except KeyWrongLastSequenceError:
            return  # another keeper published this change
        merged = {**limits, **desired}
        if merged == limits:
            return  # already so (set by whoever created the environment)
        command = {"kind": "UpdateServiceEnvironment", "serviceEnvironment": self.service_environment,
                   "capacityLimits": [{"capacityUnit": unit, "maxCapacity": count}
                                      for unit, count in sorted(merged.items())]}  # fmt: skip
        await self.publish(command_subject("UpdateServiceEnvironment"), json.dumps(command).encode())
        log.info("fleet capacity", service_environment=self.service_environment, capacity=desired)

    async def _environment_limits(self) -> dict[str, int] | None:
        """The service environment's capacity limits now, from the scheduler; None if it
        does not exist or nobody answers."""
        try:
            reply = await self.nc.request(f"{API_PREFIX}.{ANY}.describe-service-environments", b"{}",
                                          timeout=5)  # fmt: skip
        except Exception as error:  # no scheduler right now: next round
            log.warning("no answer about the service environment", error=repr(error))
            return None
        for environment in json.loads(reply.data).get("serviceEnvironments") or []:
            if environment["serviceEnvironmentName"] == self.service_environment:
                return {limit["capacityUnit"]: limit["maxCapacity"]
                        for limit in environment["capacityLimits"]}  # fmt: skip
        return None
