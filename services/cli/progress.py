"""A progress bar over a file being read, for the long offline commands (`replay`, `explain
--facts/--commands`): drawn by rich (already the CLI's table library) on standard error, and
only when standard error is a terminal, so piped or captured output never changes."""

from __future__ import annotations

import sys
from typing import IO


def reading(path: str, description: str) -> IO[bytes]:
    """`path` opened for binary reading; on a terminal, with a transient bar of the bytes
    read.  Raises OSError like `open`."""
    if not sys.stderr.isatty():
        return open(path, "rb")
    import rich.progress
    from rich.console import Console

    return rich.progress.open(path, "rb", description=description, transient=True,
                              console=Console(stderr=True))  # fmt: skip
