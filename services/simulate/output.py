"""The fact log of a simulation into a DuckDB projection, through the projections' own rebuild.

The facts are written as JSON Lines (the canonical encoding, as `quotasched replay` prints
them) to a temporary file beside the target, then `projections.rebuild.rebuild_from_file`
projects them with DuckDB's NDJSON reader: the fastest entry point that takes facts, and the
same tables, views and macros as any projection, so every query of `projections/README.md`
works on a simulation.
"""

from __future__ import annotations

import os

from quotasched.events.codec import encode_bytes
from quotasched.events.facts import Fact
from quotasched.projections.rebuild import Rebuilt, rebuild_from_file


def write_fact_log(facts: list[Fact], db_path: str, progress: bool = False) -> Rebuilt:
    staging = db_path + ".facts.jsonl"
    try:
        with open(staging, "wb") as handle:
            chunk: list[bytes] = []
            for fact in facts:
                chunk.append(encode_bytes(fact))
                if len(chunk) >= 8192:
                    handle.write(b"\n".join(chunk) + b"\n")
                    chunk.clear()
            if chunk:
                handle.write(b"\n".join(chunk) + b"\n")
        return rebuild_from_file(staging, db_path, progress=progress)
    finally:
        if os.path.exists(staging):
            os.remove(staging)
