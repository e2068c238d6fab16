"""Why the projector stops: `ProjectorError` (cannot start or go on) and `ProjectorHalted`
(a fact could not be applied; it names the fact, the reason and the position it stopped at).
"""

from __future__ import annotations


class ProjectorError(RuntimeError):
    """The projector cannot start or go on (locked file, log and file disagree, ...)."""


class ProjectorHalted(ProjectorError):
    """A fact could not be applied; the projector stopped right before it."""

    def __init__(self, seq: int | None, kind: str | None, reason: str, position: int):
        self.seq, self.kind, self.reason, self.position = seq, kind, reason, position
        where = f"fact seq {seq} ({kind})" if seq is not None else "a fact of the batch"
        super().__init__(f"cannot project {where}: {reason}; the projection stopped at "
                         f"position {position}")  # fmt: skip


__all__ = ["ProjectorError", "ProjectorHalted"]
