"""One decision round: the facts a command produces, folded into state as they are emitted.

Folding each fact the moment it is emitted is what lets later decisions of the same round see
earlier ones (a dispatch uses capacity the next head can no longer have), and it makes the
state after a round equal, by construction, to the fold of the facts it returned.

Also what every command handler shares: the registry `handles` fills (configure.py, jobs.py),
`Rejected` for a refusal, and `fact_base`, the time and seq every fact of the round carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quotasched.events.facts import Fact
from quotasched.services.scheduler.core.evolve import evolve
from quotasched.services.scheduler.core.state import State


class Round:
    __slots__ = ("state", "seq", "at", "facts", "size")

    def __init__(self, state: State, seq: int, at: float, size: int = 0):
        self.state = state
        self.seq = seq
        self.at = at
        self.facts: list[Fact] = []
        self.size = size  # the message's bytes, as received (0: not from bytes)

    def emit(self, fact: Fact) -> None:
        self.facts.append(fact)
        evolve(self.state, fact)


class Rejected(Exception):
    """Raised by a handler before it emits anything; becomes a CommandRejected fact."""

    def __init__(self, reason: str, **names: str | None):
        super().__init__(reason)
        self.reason = reason
        self.names: dict[str, Any] = names


# Command type -> its handler (configure.py, jobs.py); decision.step calls the one that fits.
HANDLERS: dict[type, Callable[[Round, Any], None]] = {}


def handles(kind: type):
    def register(function):
        HANDLERS[kind] = function
        return function

    return register


def fact_base(round_: Round) -> dict:
    """The fields every fact of this round carries: its time and the command's seq."""
    return {"at": round_.at, "command_seq": round_.seq}
