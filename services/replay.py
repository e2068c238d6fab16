"""The offline runner behind `quotasched replay`: a command file through the decision core."""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator

from quotasched.events.codec import encode
from quotasched.events.facts import Fact
from quotasched.services.scheduler.core import State, step_raw


def replay_lines(lines: Iterable[bytes | str], state: State | None = None) -> Iterator[Fact]:
    """Facts of every command line, in order.  Line numbers (1-based) are the command seqs,
    so a fact points at its line; a line that is not a command (blank ones included) becomes
    a CommandRejected, because nothing a caller sent may vanish silently."""
    state = state if state is not None else State()
    for number, line in enumerate(lines, start=1):
        if number % 16384 == 0:
            # The state is hundreds of thousands of long-lived objects; without this the
            # cyclic collector rescans them all, again and again, as the replay allocates.
            gc.freeze()
        yield from step_raw(state, line.rstrip(b"\r\n" if isinstance(line, bytes) else "\r\n"), number)


def replay_file(path: str, state: State) -> Iterator[str]:
    """Encoded facts of a command file, one JSON document per fact."""
    with open(path, "rb") as handle:
        for fact in replay_lines(handle, state):
            yield encode(fact)
