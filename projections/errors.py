"""What can go wrong with a projection, as exceptions the CLI and the projector can tell apart."""

from __future__ import annotations


class ProjectionError(RuntimeError):
    pass


class ProjectionLocked(ProjectionError):
    """Another process holds the file (DuckDB allows one writer, or readers only)."""


class SchemaMismatch(ProjectionError):
    """The file was written by another schema version: rebuild it from the log."""


class FactNotApplicable(ProjectionError):
    """A fact the projection cannot apply; `problems` lists (seq, kind, problem)."""

    def __init__(self, problems: list[tuple[int, str, str]], detail: str | None = None):
        self.problems = problems
        if not problems:
            super().__init__(f"cannot project the facts: {detail}")
            return
        first = problems[0]
        message = f"cannot project fact seq {first[0]} ({first[1]}): {first[2]}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more problem(s) in the batch)"
        super().__init__(message)


class FileNotReadable(FactNotApplicable):
    """DuckDB's reader refused a fact file (a line that is not JSON), or numbered its lines
    otherwise than the caller expected; `rebuild_from_stream` then applies those facts one
    message each, so that the error names a stream sequence."""


class SpoolFailed(ProjectionError):
    """The facts read from the stream could not be written beside the projection (a full or
    read-only disk): a rebuild from the stream fails with it, a projector's bulk catch-up
    goes on batch by batch instead."""
