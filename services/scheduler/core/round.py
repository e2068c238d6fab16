"""One decision round: the facts a command produces, folded into state as they are emitted.

Folding each fact the moment it is emitted is what lets later decisions of the same round see
earlier ones (a dispatch uses capacity the next head can no longer have), and it makes the
state after a round equal, by construction, to the fold of the facts it returned.
"""

from __future__ import annotations

from events.facts import Fact
from services.scheduler.core.evolve import evolve
from services.scheduler.core.state import State


class Round:
    __slots__ = ("state", "seq", "at", "facts")

    def __init__(self, state: State, seq: int, at: float):
        self.state = state
        self.seq = seq
        self.at = at
        self.facts: list[Fact] = []

    def emit(self, fact: Fact) -> None:
        self.facts.append(fact)
        evolve(self.state, fact)
