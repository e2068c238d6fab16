"""Scheduling partitions: which commands one scheduler term decides, which facts it writes.

Job queues share nothing at run time: a quota-management service environment serves exactly
one job queue, shares and jobs belong to one queue.  What they do share is fleet-wide
configuration (service environments, scheduling policies, which queue claimed which
environment) and the clock of explicit `Tick`s.  So the scheduler can run as:

- one partition, `single` (the default): one consumer of `qm.cmd.>`, one lease, one fence
  on `qm.fact.>`; it decides and writes everything;
- one partition per job queue plus one `fleet` partition (`--job-queue`): the partition of
  queue `q` consumes `qm.cmd.q.>` and the fleet-wide `qm.cmd.~.>`, decides both with the one
  core over a state holding the fleet configuration and queue `q`, and writes only the facts
  under `qm.fact.q.>` (fenced there); the fleet partition consumes `qm.cmd.~.>` and writes
  the facts under `qm.fact.~.>`.  Each has its own lease, consumer and snapshot, so N
  scheduler processes can each lead some queues and stand by for the others.

Every partition decides a fleet-wide command over the same fleet configuration (no queue's
commands change it), so they all reach the same decision; each records only its own part.
Which part is whose is `routing.fact_subject_of`, a pure function of the state, the fact and
the command's subject, shared with the audit.
"""

from __future__ import annotations

from dataclasses import dataclass

from quotasched.events.subjects import ANY, COMMANDS_PREFIX, FACTS_PREFIX, command_subject

SINGLE = "single"
PER_QUEUE = "per-queue"


@dataclass(frozen=True)
class Partition:
    name: str  # names its lease key, durable consumer and snapshot
    token: str | None  # None: every queue; ANY: fleet configuration; else one job queue

    @classmethod
    def single(cls, name: str = "main") -> Partition:
        return cls(name, None)

    @classmethod
    def fleet(cls) -> Partition:
        return cls("fleet", ANY)

    @classmethod
    def for_queue(cls, job_queue: str) -> Partition:
        return cls(f"queue-{job_queue}", job_queue)

    @property
    def mode(self) -> str:
        return SINGLE if self.token is None else PER_QUEUE

    @property
    def is_queue(self) -> bool:
        return self.token is not None and self.token != ANY

    @property
    def command_filters(self) -> list[str]:
        if self.token is None:
            return [f"{COMMANDS_PREFIX}.>"]
        if self.token == ANY:
            return [f"{COMMANDS_PREFIX}.{ANY}.>"]
        return [f"{COMMANDS_PREFIX}.{self.token}.>", f"{COMMANDS_PREFIX}.{ANY}.>"]

    @property
    def fact_filter(self) -> str:
        """The facts this partition alone writes, and the fence of its appends."""
        return f"{FACTS_PREFIX}.>" if self.token is None else f"{FACTS_PREFIX}.{self.token}.>"

    @property
    def durable(self) -> str:
        return f"scheduler-{self.name}"

    @property
    def tick_subject(self) -> str | None:
        """Where this partition's leader publishes its ticks: the fleet has no timers, and a
        queue's ticks stay on its own subject, so N partitions do not tick each other."""
        if self.token == ANY:
            return None
        return command_subject("Tick", self.token)

    def hears(self, command_subject: str) -> bool:
        """Does this partition decide a command published on `command_subject`?"""
        if self.token is None:
            return True
        parts = command_subject.split(".", 3)
        return len(parts) == 4 and parts[2] in (self.token, ANY)

    def owns(self, fact_subject: str) -> bool:
        if self.token is None:
            return True
        return fact_subject.split(".", 3)[2] == self.token


def partition_mode(name: str) -> str:
    """The mode of the partition named `name` (as in message ids and consumer names)."""
    return PER_QUEUE if name == "fleet" or name.startswith("queue-") else SINGLE
