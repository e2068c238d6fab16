"""The GPU agent: one per host of an on-prem fleet, several sharing one service environment.

It is the process executor (process.py: the command from the job's tags or payload, its own
session, SIGTERM then SIGKILL after the grace period, the ledger) with GPUs to hand out:
- each host advertises its GPUs, one instance of its capacity unit per GPU, in the fleet's
  KV bucket, and the fleet's capacity follows the live hosts (fleet.py);
- every agent sees every `JobDispatched` of its service environment's job queue; the attempt
  is placed by exactly one agent that has enough free GPUs of its own for all of it (the
  `capacityUsage` quantity: two free GPUs on two hosts do not place a two-GPU job), through a
  create-only claim per (job, attempt).  An attempt no agent could place within
  `place_timeout_s` is reported INSUFFICIENT_CAPACITY once, by the agent whose "none" claim
  won; the scheduler then queues the job again;
- the attempt's process gets CUDA_VISIBLE_DEVICES set to exactly its GPUs, and its stdout and
  stderr go to `<logs_dir>/<job>/<attempt>.log` (`<attempt>.exit` says how it ended, once it
  has); two attempts never hold the same GPU, and an attempt's GPUs are free only once
  nothing it started is alive (its cgroup or its marker, contain.py: a daemonized child
  too);
- `afterPreemptionOf`: the preemptor waits (at most `victim_timeout_s`) until its victims have
  stopped, here (their process exited) or on another host (its heartbeat no longer lists them,
  or the host is no longer live), then it is placed;
- a (re)started agent places nothing before `join`: `recover` has stopped the processes its
  previous run left (whose GPUs it does not know) by then, and the fleet is watched;
- each job has a checkpoint directory that every attempt of it gets (checkpoints.py), removed
  once the job is over and no host runs it any more; a preemption gives the job its own grace
  period (its tag `grace`, at most QUOTASCHED_PREEMPT_GRACE_MAX_S) to save a checkpoint, and
  its GPUs stay held until it has exited.

Each agent also appends what it did to `<state_dir>/agent-<host>.records.jsonl` (claim,
start with pid, end; wall-clock nanoseconds), for audits and the tests' invariant checker.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from quotasched.events.base import is_path_component
from quotasched.events.facts import JobDispatched, JobPreempted, JobQueueCreated, JobQueueUpdated
from quotasched.services import logs
from quotasched.services.executors import checkpoints, containers, jobenv
from quotasched.services.executors.base import Attempt, ExecutorFact, Publish, job_over
from quotasched.services.executors.checkpoints import Checkpoints
from quotasched.services.executors.containers import RUNTIMES
from quotasched.services.executors.fleet import Fleet
from quotasched.services.executors.ledger import Entry, Ledger
from quotasched.services.executors.process import ProcessExecutor, command_line
from quotasched.services.nats.waits import wait_set

log = logs.get("quotasched.agent")

HOST_PATTERN = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*"  # a KV key token each, like a DNS name


class GpuError(RuntimeError):
    """The GPUs could not be found (no NVML bindings, no driver)."""


def discover_gpus() -> list[str]:
    """The indices of this host's NVIDIA GPUs, through NVML (nvidia-ml-py, imported only here:
    an agent given --gpus needs neither the bindings nor a driver)."""
    try:
        import pynvml
    except ImportError:
        raise GpuError("the NVML bindings are not installed (pip install 'quotasched[gpu]'); "
                       "or name the GPUs with --gpus 0,1,...") from None  # fmt: skip
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise GpuError(f"no NVIDIA driver answers ({error}); name the GPUs with --gpus 0,1,...") from None
    try:
        return [str(index) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def parse_gpus(text: str) -> list[str]:
    """`--gpus 0,1,2`: GPU indices (or UUIDs), as CUDA_VISIBLE_DEVICES names them."""
    gpus = [part.strip() for part in text.replace(" ", ",").split(",") if part.strip()]
    if not gpus or len(set(gpus)) != len(gpus) or not all(re.fullmatch(r"[A-Za-z0-9_-]+", g) for g in gpus):
        raise ValueError(f"--gpus {text!r}: distinct GPU indices (or UUIDs), comma-separated")
    return gpus


@dataclass
class AgentOptions:
    gpus: list[str]
    capacity_unit: str
    service_environment: str
    host: str = field(default_factory=socket.gethostname)
    logs_dir: str | None = None  # default <state_dir>/logs
    grace_s: float = 10.0
    place_timeout_s: float = 10.0
    victim_timeout_s: float = 60.0
    heartbeat_s: float = 2.0
    host_timeout_s: float = 10.0
    container_runtime: str | None = None  # docker or podman: jobs naming an image run in it
    container_devices: bool = False  # hand the GPUs to containers as devices (a driver is there)
    # None: from QUOTASCHED_CHECKPOINT_DIR, _KEEP and QUOTASCHED_PREEMPT_GRACE_MAX_S (`settle`)
    checkpoint_dir: str | None = None  # None there too: <state_dir>/checkpoints
    checkpoint_keep: str | None = None
    grace_max_s: float | None = None
    settled: bool = field(default=False, init=False, repr=False, compare=False)

    def settle(self) -> None:
        """Fill what is not given from the QUOTASCHED_* settings (settings.py: how `quotasched
        agent` and `up` set them), once; ValueError, one line, for a value they refuse."""
        if self.settled or None not in (self.checkpoint_dir, self.checkpoint_keep,
                                        self.grace_max_s):  # fmt: skip
            self.settled = True
            return
        from pydantic import ValidationError

        from quotasched.services.settings import Settings

        try:
            settings = Settings()
        except ValidationError as error:
            raise ValueError("; ".join(
                f"QUOTASCHED_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}"
                for e in error.errors())) from None  # fmt: skip
        if self.checkpoint_dir is None:
            self.checkpoint_dir = settings.checkpoint_dir
        if self.checkpoint_keep is None:
            self.checkpoint_keep = settings.checkpoint_keep
        if self.grace_max_s is None:
            self.grace_max_s = settings.preempt_grace_max_s
        self.settled = True

    def check(self) -> None:
        if self.container_runtime is not None and self.container_runtime not in RUNTIMES:
            raise ValueError(f"--container-runtime {self.container_runtime}: docker or podman")
        self.settle()
        if self.checkpoint_keep not in checkpoints.KEEP:
            raise ValueError(f"checkpoint keep {self.checkpoint_keep!r}: never, failed or always")
        if self.grace_max_s is None or not 0 <= self.grace_max_s < float("inf"):
            raise ValueError(f"the most grace a job may ask for, {self.grace_max_s}: seconds >= 0")
        if self.checkpoint_dir is not None:
            checkpoints.check_root(self.checkpoint_dir, self.container_runtime is not None)
        if not re.fullmatch(HOST_PATTERN, self.host):
            raise ValueError(f"host name {self.host!r}: letters, digits, '-', '_' and dots")
        if self.host_timeout_s <= 2 * self.heartbeat_s:
            raise ValueError("the host timeout must be more than two heartbeats")

    @property
    def durable(self) -> str:
        """Its consumer and ledger name: one per host (a consumer name has no dots)."""
        return f"executor-agent-{self.host.replace('.', '_')}"


class GpuAgent(ProcessExecutor):
    """Across a restart (base.Executor.recover): a shutdown leaves the attempts running and
    the host's key "up" (it does not leave the fleet, which would lower the capacity under
    them); an agent started again on the same host and state within `--host-timeout` holds
    their GPUs again (the ledger names them) and follows them.  A host silent for longer is
    lost as before: the keeper reported its attempts FAILED, so a restarted agent that finds
    its key "lost" stops them without a report."""

    name = "agent"

    def __init__(self, publish: Publish, options: AgentOptions, fleet: Fleet,
                 ledger: Ledger | None = None, state_dir: str | None = None):  # fmt: skip
        super().__init__(publish, grace_s=options.grace_s, ledger=ledger)
        options.settle()
        self.options = options
        self.fleet = fleet
        self.logs_dir = options.logs_dir or os.path.join(state_dir or ".quotasched", "logs")
        root = options.checkpoint_dir or os.path.join(state_dir or ".quotasched", "checkpoints")
        checkpoints.check_root(os.path.abspath(root), options.container_runtime is not None)
        self.checkpoints = Checkpoints(root, options.checkpoint_keep or "never")
        self.grace_max_s = options.grace_max_s  # a job's tag `grace`, at most (grace_for)
        self.removing: set[asyncio.Task] = set()  # checkpoint directories of ended jobs
        self.records_path = (os.path.join(state_dir, f"agent-{options.host}.records.jsonl")
                             if state_dir is not None else None)  # fmt: skip
        self.held: dict[str, tuple[str, int]] = {}  # GPU -> the attempt holding it
        self.in_containers: set[tuple[str, int]] = set()  # attempts running in a container
        self.holding: dict[tuple[str, int], dict[str, Any]] = {}  # attempt -> heartbeat entry
        self.placing: dict[str, tuple[int, asyncio.Task]] = {}  # job -> (attempt, its task)
        self.queue_environment: dict[str, str] = {}  # job queue -> its service environment
        self.preempted: dict[str, int] = {}  # job -> its last preempted attempt
        self.freed = asyncio.Event()  # pulsed whenever GPUs are given back
        self.changed = asyncio.Event()  # what this host holds changed: beat now
        # Set by `join`: nothing is placed before, since the facts arrive before `recover` has
        # stopped what a previous run left (its GPUs are not in `held`: they would be handed
        # out twice) and before the fleet is watched (a victim on another host looks stopped).
        self.joined = asyncio.Event()
        self._beating: asyncio.Task | None = None
        self._mirrored = -1  # the ledger version last copied to the fleet's KV

    # -- the fact log ------------------------------------------------------------------------

    async def on_fact(self, fact: ExecutorFact) -> None:
        await super().on_fact(fact)  # a stop it calls for is over when this returns
        over = job_over(fact)
        if over is not None:
            self._job_over(*over)

    def learn(self, fact: ExecutorFact) -> None:
        super().learn(fact)
        if isinstance(fact, (JobQueueCreated, JobQueueUpdated)):
            self.queue_environment[fact.job_queue] = fact.service_environment
        elif isinstance(fact, JobPreempted):
            self.preempted[fact.job_id] = fact.attempt

    def serves(self, fact: JobDispatched) -> bool:
        """A dispatch in this fleet's service environment, of this host's unit only."""
        usage = fact.capacity_usage
        return (self.queue_environment.get(fact.job_queue) == self.options.service_environment
                and bool(usage) and all(u.capacity_unit == self.options.capacity_unit for u in usage))

    async def _dispatched(self, fact: JobDispatched) -> None:
        """Placing can take a while (victims stopping, GPUs freed elsewhere): it runs beside
        the log, which goes on being read (a preemption or termination of it included)."""
        key = (fact.job_id, fact.attempt)
        if key in self.started or not self.serves(fact):
            return
        self.started.add(key)
        task = asyncio.create_task(self._place_and_run(fact))
        self.placing[fact.job_id] = (fact.attempt, task)

    async def _stop(self, job_id: str, attempt_number: int) -> None:
        placing = self.placing.get(job_id)
        if placing is not None and placing[0] == attempt_number:
            placing[1].cancel()  # not started yet: there is nothing to stop but the placing
            await asyncio.gather(placing[1], return_exceptions=True)
            return
        await super()._stop(job_id, attempt_number)

    # -- checkpoints -------------------------------------------------------------------------

    def _job_over(self, job_id: str, attempt: int, failed: bool) -> None:
        """The job has ended: its checkpoint directory goes (unless kept), once no host runs
        an attempt of it any more (under a shared root another host may still be stopping
        it, its process saving a checkpoint there)."""
        if self.checkpoints.keeps(failed) or not self.checkpoints.exists(job_id):
            return
        task = asyncio.create_task(self._remove_checkpoints(job_id, attempt))
        self.removing.add(task)
        task.add_done_callback(self.removing.discard)

    async def _remove_checkpoints(self, job_id: str, attempt: int) -> None:
        """Wait while an attempt of the job is still here or listed by another live host (a
        lost one drops out of the live hosts), then remove the directory."""
        while job_id in self.running or job_id in self.placing \
                or self.fleet.runs_elsewhere(job_id, attempt):  # fmt: skip
            await asyncio.sleep(0.2)
        try:
            await asyncio.to_thread(self.checkpoints.remove, job_id)  # it may be large
        except OSError as error:
            log.warning("could not remove a checkpoint directory", job_id=job_id,
                        path=self.checkpoints.path(job_id), error=str(error))  # fmt: skip

    # -- placing -----------------------------------------------------------------------------

    async def _place_and_run(self, fact: JobDispatched) -> None:
        job_id, number = fact.job_id, fact.attempt
        attempt = Attempt(job_id, number, fact.job_queue, fact.quota_share_name,
                          self.specs.get(job_id, {"tags": {}, "payload": None}))  # fmt: skip
        need = sum(usage.quantity for usage in fact.capacity_usage)
        try:
            await self.joined.wait()
            await self._wait_for_victims(fact.after_preemption_of)
            gpus = await self._place(attempt, need)
        finally:
            if self.placing.get(job_id, (None,))[0] == number:
                del self.placing[job_id]
        if gpus is None:
            return
        attempt.task = asyncio.current_task()
        self.running[job_id] = attempt
        self.note(attempt)
        await self._run_holding(attempt)

    async def _run_holding(self, attempt: Attempt) -> None:
        """Run (or follow) the attempt, then give its GPUs back once nothing of it is alive;
        an attempt a shutdown leaves running keeps them (the next start follows it)."""
        try:
            await self._run(attempt)
        finally:
            if not attempt.detached:
                try:  # its GPUs are free only once nothing of it is alive (contain.py)
                    while not await self.end_processes(attempt):
                        if attempt.shutdown:  # the agent is leaving and hands out no GPU again;
                            break  # kill_all logged what survives (a shutdown must not hang)
                finally:
                    self._release(attempt)

    async def adopt(self, attempt: Attempt) -> bool:
        """Follow an attempt the previous run left, holding its GPUs again, unless this host
        was declared lost meanwhile (the keeper reported it FAILED: it is stopped) or the
        GPUs it holds are no longer this host's."""
        entry = attempt.adopted
        gpus = list(entry.gpus or await self._claimed_gpus(attempt))
        if not gpus or any(gpu not in self.options.gpus or gpu in self.held for gpu in gpus):
            return False
        if await self.fleet.state() == "lost":  # the keeper reported it FAILED: no report
            self.stop_requested.add((attempt.job_id, attempt.attempt))
            return False
        if not await super().adopt(attempt):
            return False
        self._hold(attempt, gpus)
        runtime = self.options.container_runtime
        if runtime is not None and containers.image_of(attempt.spec):
            self.in_containers.add((attempt.job_id, attempt.attempt))
        return True

    async def _claimed_gpus(self, attempt: Attempt) -> list[str]:
        """The GPUs this host claimed for the attempt (the fleet's claim): what an older
        release's ledger, which does not name them, left running holds."""
        claim = await self.fleet.claim_of(attempt.job_id, attempt.attempt)
        if not claim or claim.get("host") != self.options.host:
            return []
        gpus = claim.get("gpus")
        return [str(gpu) for gpu in gpus] if isinstance(gpus, list) else []

    async def follow(self, attempt: Attempt) -> None:
        await self._run_holding(attempt)

    async def _wait_for_victims(self, victims: list[str]) -> None:
        """Until every victim has stopped, here or on another host; at most victim_timeout_s
        (a host that cannot say is lost after its own timeout anyway)."""
        deadline = time.monotonic() + self.options.victim_timeout_s
        for victim in victims:
            while self._victim_running(victim):
                if time.monotonic() > deadline:
                    log.warning("victim still running after the wait; starting anyway", job_id=victim)
                    return
                await asyncio.sleep(0.05)

    def _victim_running(self, victim: str) -> bool:
        preempted = self.preempted.get(victim, 0)
        local = self.running.get(victim)
        if local is not None and local.attempt <= preempted and not local.stopped.is_set():
            return True
        if any(job == victim and n <= preempted for job, n in self.holding):
            return True  # stopped, but its GPUs are not given back yet
        return self.fleet.runs_elsewhere(victim, preempted)

    async def _place(self, attempt: Attempt, need: int) -> list[str] | None:
        """Claim the attempt with `need` of this host's free GPUs as soon as it has them,
        unless another agent claimed it first; past the placing timeout, claim it "none" and
        report INSUFFICIENT_CAPACITY (one agent wins that claim).  Returns the GPUs, or None
        when this agent does not run it."""
        job_id, number = attempt.job_id, attempt.attempt
        deadline = time.monotonic() + self.options.place_timeout_s
        while True:
            if await self.fleet.claimed(job_id, number):
                return None
            free = [gpu for gpu in self.options.gpus if gpu not in self.held]
            if len(free) >= need:
                gpus = free[:need]
                self._hold(attempt, gpus)  # before the claim's round trip: nobody else takes them
                try:
                    won = await self.fleet.claim(job_id, number, {"host": self.options.host, "gpus": gpus})
                except BaseException:
                    self._release(attempt)
                    raise
                if not won:
                    self._release(attempt)
                    return None
                self.record("claim", attempt, gpus=gpus)
                return gpus
            if time.monotonic() >= deadline:
                if await self.fleet.claim(job_id, number, {"host": self.options.host, "none": True}):
                    log.warning("no host can place the attempt", job_id=job_id, attempt=number, gpus=need)
                    self.record("insufficient", attempt, gpus=[])
                    await self.report(attempt, "INSUFFICIENT_CAPACITY",
                                      f"No host has {need} free GPUs of {self.options.capacity_unit}")
                return None
            self.freed.clear()
            await wait_set(self.freed, 0.1)  # then look at the claim again: another agent may have placed it

    def _hold(self, attempt: Attempt, gpus: list[str]) -> None:
        for gpu in gpus:
            self.held[gpu] = (attempt.job_id, attempt.attempt)
        self.holding[(attempt.job_id, attempt.attempt)] = {
            "jobId": attempt.job_id, "attempt": attempt.attempt, "jobQueue": attempt.job_queue,
            "share": attempt.share, "gpus": gpus}  # fmt: skip
        self.changed.set()

    def _release(self, attempt: Attempt) -> None:
        key = (attempt.job_id, attempt.attempt)
        entry = self.holding.pop(key, None)
        for gpu in entry["gpus"] if entry else []:
            if self.held.get(gpu) == key:
                del self.held[gpu]
        self.freed.set()
        self.changed.set()

    # -- running -----------------------------------------------------------------------------

    def gpus_of(self, attempt: Attempt) -> list[str]:
        entry = self.holding.get((attempt.job_id, attempt.attempt))
        return entry["gpus"] if entry else []

    def environment(self, attempt: Attempt, **fixed: str) -> dict[str, str]:
        """The process executor's (built, no credential: jobenv.py) with exactly its GPUs and
        the job's checkpoint directory.  A container gets these variables (`argv`, `--env`;
        the directory as its mount point, or not at all without a CheckpointConfig); its
        runtime's client, the attempt's process once `argv` chose a container, also gets the
        executor's runtime settings (jobenv.RUNTIME_CLIENT: CONTAINERS_CONF, XDG_RUNTIME_DIR,
        DOCKER_HOST, ...), which the container does not see."""
        env = super().environment(attempt, CUDA_VISIBLE_DEVICES=",".join(self.gpus_of(attempt)),
                                  **{checkpoints.VARIABLE: self.checkpoints.path(attempt.job_id)},
                                  **fixed)  # fmt: skip
        if (attempt.job_id, attempt.attempt) in self.in_containers:
            return {**jobenv.runtime_client(os.environ), **env}
        return env

    def log_path(self, attempt: Attempt) -> str:
        return attempt_log(self.logs_dir, attempt.job_id, attempt.attempt)

    def argv(self, attempt: Attempt) -> list[str]:
        """The job's command, or with a container runtime and an image, the runtime's client
        running it in a container (containers.py), the job's checkpoint directory mounted
        where its CheckpointConfig says (checkpoints.py)."""
        runtime = self.options.container_runtime
        image = containers.image_of(attempt.spec) if runtime is not None else None
        containers.check_attempt(attempt.job_id, image)  # a job from an older log: fails here
        if runtime is None or image is None:
            return super().argv(attempt)
        try:
            command = command_line(attempt.spec)
        except ValueError:
            command = []  # no command: the image's own entrypoint
        env = self.environment(attempt)  # the same variables as a process (jobenv.py)
        source = env.pop(checkpoints.VARIABLE)
        target = checkpoints.container_path(attempt.spec)
        mounts = ((source, target),) if target is not None else ()
        if target is not None:
            env[checkpoints.VARIABLE] = target
        self.in_containers.add((attempt.job_id, attempt.attempt))
        user = self.job_user and f"{self.job_user.uid}:{self.job_user.gid}"
        return containers.run_argv(runtime, containers.container_name(attempt.job_id, attempt.attempt),
                                   image, command, env, self.gpus_of(attempt),
                                   self.options.container_devices, user, mounts)  # fmt: skip

    def runs_as(self, attempt: Attempt):
        """In a container, the runtime's client runs as the agent (the container as the job
        user, `--user`); a process as the job user."""
        if (attempt.job_id, attempt.attempt) in self.in_containers:
            return None
        return self.job_user

    def note(self, attempt: Attempt, pid: int | None = None, pid_started: str | None = None,
             exit_file: str | None = None) -> None:  # fmt: skip
        super().note(attempt, pid, pid_started, exit_file)
        self.changed.set()  # beat now: the ledger's copy in the fleet follows
        if pid is not None:
            self.record("start", attempt, gpus=self.gpus_of(attempt), pid=pid)

    async def execute(self, attempt: Attempt) -> tuple[str, str | None]:
        try:
            if attempt.adopted is None:  # its checkpoint directory, before anything of it runs
                self.checkpoints.prepare(attempt.job_id, self.job_user)
            status, reason = await super().execute(attempt)
        except asyncio.CancelledError:
            raise  # `interrupt` stops the process and records the end
        except Exception as error:  # no command, or it could not start
            self._ended(attempt, f"FAILED {error}")
            raise
        self._ended(attempt, status if reason is None else f"{status} {reason}")
        return status, reason

    async def end_lost(self, entry: Entry):
        """A previous run's process (and its container), stopped before this host advertises
        itself again."""
        if self.options.container_runtime is not None:
            await containers.remove(self.options.container_runtime,
                                    containers.container_name(entry.job_id, entry.attempt))
        ended = await super().end_lost(entry)
        self._ended(Attempt(entry.job_id, entry.attempt, entry.job_queue, entry.share, {}), "LOST")
        return ended

    async def interrupt(self, attempt: Attempt) -> None:
        key = (attempt.job_id, attempt.attempt)
        if key in self.in_containers and self.options.container_runtime is not None:
            self.in_containers.discard(key)  # the runtime stops it: a signal to its client may not
            await containers.stop(self.options.container_runtime, containers.container_name(*key),
                                  self.grace_for(attempt.spec, attempt.job_id))  # fmt: skip
        await super().interrupt(attempt)
        self._ended(attempt, "STOPPED")

    async def end_processes(self, attempt: Attempt) -> bool:
        """A container is removed through its runtime before what is left of the attempt is
        killed: the runtime's monitor (podman's conmon) may be in the attempt's cgroup, and
        killed mid-cleanup it would leave the exited container behind."""
        key = (attempt.job_id, attempt.attempt)
        runtime = self.options.container_runtime
        if runtime is not None and key in self.containments and containers.image_of(attempt.spec):
            await containers.remove(runtime, containers.container_name(*key))
        return await super().end_processes(attempt)

    def _ended(self, attempt: Attempt, how: str) -> None:
        """The process has exited: say so in the records and beside the log (`logs --follow`
        stops there)."""
        self.in_containers.discard((attempt.job_id, attempt.attempt))
        self.record("end", attempt, gpus=self.gpus_of(attempt), how=how)
        path = self.log_path(attempt)
        if is_path_component(attempt.job_id) and os.path.exists(path):  # never `<logs>/..`
            with open(exit_path(path), "w", encoding="utf-8") as handle:
                handle.write(how + "\n")

    def record(self, event: str, attempt: Attempt, **details: Any) -> None:
        if self.records_path is None:
            return
        line = {"event": event, "host": self.options.host, "jobId": attempt.job_id,
                "attempt": attempt.attempt, "ns": time.time_ns(), **details}  # fmt: skip
        os.makedirs(os.path.dirname(self.records_path) or ".", exist_ok=True)
        with open(self.records_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    # -- the fleet ---------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        return {"host": self.options.host, "serviceEnvironment": self.options.service_environment,
                "capacityUnit": self.options.capacity_unit, "gpus": self.options.gpus,
                "attempts": list(self.holding.values()), "state": "up"}  # fmt: skip

    async def join(self) -> None:
        """Advertise this host (after `recover` stopped what a previous run left), then beat
        and keep the fleet's capacity until `close`."""
        await self.fleet.watch()
        if not await self.fleet.beat(self.heartbeat()):
            await self._fenced()  # declared lost since `recover` followed what it left
        self._beating = asyncio.create_task(self._beat_forever())
        self.joined.set()  # the attempts dispatched meanwhile are placed from now on

    async def _beat_forever(self) -> None:
        while True:
            await wait_set(self.changed, self.options.heartbeat_s)
            self.changed.clear()
            try:
                if not await self.fleet.beat(self.heartbeat()):
                    await self._fenced()
                await self._mirror()
                await self.fleet.keep(self._report_for_keeper)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the bus is away: the next beat tries again
                log.warning("heartbeat failed", host=self.options.host, error=repr(error))

    async def _mirror(self) -> None:
        """Copy the ledger to the fleet's KV when it changed since the last copy."""
        if self.ledger is None or self.ledger.version == self._mirrored:
            return
        version = self.ledger.version
        await self.fleet.save_ledger([asdict(entry) for entry in self.ledger.entries.values()])
        self._mirrored = version

    async def _fenced(self) -> None:
        """Declared lost while alive (too slow): the keeper reported this host's attempts
        FAILED and may have run them elsewhere, so stop them here without a report, then
        advertise again with nothing held."""
        for job_id, (number, _) in list(self.placing.items()):
            await self._stop(job_id, number)
        for attempt in list(self.running.values()):
            await self._stop(attempt.job_id, attempt.attempt)
        self.fleet.revision = None
        await self.fleet.beat(self.heartbeat())

    async def _report_for_keeper(self, entry: dict[str, Any], status: str, reason: str) -> None:
        attempt = Attempt(entry["jobId"], entry["attempt"], entry["jobQueue"], entry["share"], {})
        await self.report(attempt, status, reason)

    async def close(self) -> None:
        """Stop placing; leave the running attempts running and the host "up" for the next
        start to follow them within --host-timeout (base; with --stop-jobs: stop and report
        them, and leave the fleet)."""
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        for task in list(self.removing):  # waiting on another host: its next start does not
            task.cancel()  # know of them (the operator removes <root>/<job>; docs/executors.md)
        await asyncio.gather(*list(self.removing), return_exceptions=True)
        for _, task in list(self.placing.values()):
            task.cancel()
        await asyncio.gather(*(task for _, task in list(self.placing.values())), return_exceptions=True)
        kept = bool(self.running) and self.ledger is not None and not self.stop_jobs
        await super().close()
        try:
            await self._mirror()
        except Exception as error:  # the bus is gone: the local ledger still has them
            log.warning("could not copy the ledger to the fleet", host=self.options.host,
                        error=repr(error))  # fmt: skip
        if kept:
            log.info(f"host {self.options.host} stays in the fleet: start this agent again "
                     f"within --host-timeout ({self.options.host_timeout_s:g} s) to follow "
                     "its attempts, or the host is lost and they are reported FAILED",
                     host=self.options.host)  # fmt: skip
            await self.fleet.stop()
            return
        try:
            await self.fleet.leave(self.heartbeat())
        except Exception as error:  # the bus is gone: the keeper will find the host lapsed
            log.warning("could not leave the fleet", host=self.options.host, error=repr(error))
        await self.fleet.stop()


def attempt_log(logs_dir: str, job_id: str, attempt: int) -> str:
    return os.path.join(logs_dir, job_id, f"{attempt}.log")


def exit_path(log_path: str) -> str:
    return log_path.removesuffix(".log") + ".exit"


async def build_agent(broker, nc, options: AgentOptions, state_dir: str | None):
    """The agent with its subscriber registered on `broker` (like app.build_executor; start the
    broker after, `recover`, then `join`)."""
    from quotasched.events.subjects import FACTS_PREFIX
    from quotasched.services.executors.app import commands_publisher, subscribe
    from quotasched.services.executors.fleet import fleet_bucket

    options.check()
    publish = commands_publisher(broker)
    kv = await fleet_bucket(nc.jetstream())
    fleet = Fleet(kv, nc, publish, options.host, options.service_environment,
                  heartbeat_s=options.heartbeat_s, host_timeout_s=options.host_timeout_s)  # fmt: skip
    ledger = None
    if state_dir:
        path = os.path.join(state_dir, f"{options.durable}.json")
        missing = not os.path.exists(path)
        ledger = Ledger(path)
        saved = await fleet.saved_ledger() if missing else []
        for fields in saved:  # a host started again without its state directory
            ledger.record(Entry(**fields))
        if saved:
            log.warning(f"no ledger at {path}: following the {len(saved)} attempts of this "
                        "host's copy in the fleet", host=options.host)  # fmt: skip
    agent = GpuAgent(publish, options, fleet, ledger=ledger, state_dir=state_dir)
    return subscribe(broker, agent, options.durable, f"{FACTS_PREFIX}.>")
