"""quotasched: AWS Batch quota management as an event-sourced scheduler on NATS JetStream.

The installed distribution adds one top-level name, `quotasched`.  Its parts are
`quotasched.services` (the scheduler, projector, executors, CLI, client), `quotasched.events`
(the contract: commands, facts, codec, subjects) and `quotasched.projections` (DuckDB).  In the
source tree they are the folders services/, events/ and projections/ at the top level, mapped
under this package by pyproject.toml (`package-dir`); in a checkout that is not installed, the
parts are found beside this folder.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("quotasched")
except PackageNotFoundError:  # a checkout used without installing it
    __version__ = "0+unknown"

_here = os.path.dirname(os.path.abspath(__file__))
_checkout = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "services")) and os.path.isfile(
        os.path.join(_checkout, "services", "__init__.py")):  # fmt: skip
    __path__.append(_checkout)  # the source tree: services/, events/, projections/ beside us


def examples_dir() -> Path:
    """The example command files and configurations: `quotasched/examples` in an installed
    wheel, the checkout's examples/ folder in a source tree."""
    for base in __path__:
        candidate = Path(base) / "examples"
        if (candidate / "notebook.jsonl").exists():
            return candidate
    return Path(_here) / "examples"
