"""The fact log of a simulation into a DuckDB projection, through the projections' own rebuild.

The facts are written as JSON Lines (the canonical encoding, as `quotasched replay` prints
them) to a temporary file beside the target, then `projections.rebuild.rebuild_from_file`
projects them with DuckDB's NDJSON reader: the fastest entry point that takes facts, and the
same tables, views and macros as any projection, so every query of `projections/README.md`
works on a simulation.
"""

from __future__ import annotations

import os

from quotasched.events.codec import write_json_lines
from quotasched.events.facts import Fact
from quotasched.projections.rebuild import Rebuilt, rebuild_from_file


def write_fact_log(facts: list[Fact], db_path: str, progress: bool = False) -> Rebuilt:
    staging = db_path + ".facts.jsonl"
    try:
        with open(staging, "wb") as handle:
            write_json_lines(facts, handle, chunk=8192)
        return rebuild_from_file(staging, db_path, progress=progress)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
