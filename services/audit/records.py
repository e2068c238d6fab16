"""The records the audit compares, and its outcome: a command as the scheduler saw it, a fact
as the log stores it, the first divergence, and the result `verify` returns (which
`render` and the JSON output of `quotasched audit verify` report)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CommandRecord:
    """One command as the scheduler saw it.  `subject` None: a replay-file line (decided with
    `step_raw`, like `quotasched replay`); otherwise a bus message (decided with
    `decide_message`, the stream timestamp `stamp` standing in for a missing `at`)."""

    seq: int
    subject: str | None
    data: bytes
    stamp: float | None = None


@dataclass(frozen=True)
class FactRecord:
    """One recorded fact: its text exactly as stored, and where it is stored (`position`: line
    number of a fact file, or the stream sequence in QM_FACTS)."""

    text: str
    position: int
    command_seq: int | None = None  # parsed from the text; None when the text is not a fact

    @staticmethod
    def of(text: str, position: int) -> FactRecord:
        return FactRecord(text, position, _command_seq(text))


def _command_seq(text: str) -> int | None:
    try:
        value = json.loads(text).get("commandSeq")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the result ----------------------------------------------------------------------------------


@dataclass
class Divergence:
    """The first place where the re-run and the log disagree."""

    command_seq: int | None  # the command whose facts differ
    fact_index: int  # 1-based position among the recorded facts (and the recomputed ones)
    position: int | None  # where the recorded fact is stored (line, stream seq); None: past the end
    what: str  # one sentence: changed, missing, extra, ...
    recorded: str | None  # the recorded fact (None: the log has no fact here)
    recomputed: str | None  # the recomputed fact (None: the core produces no fact here)
    fields: list[tuple[str, Any, Any]] = field(default_factory=list)  # (name, recorded, recomputed)
    command: str | None = None  # the command's raw text, when it is at hand
    recorded_group: list[str] = field(default_factory=list)  # every recorded fact of the command
    recomputed_group: list[str] = field(default_factory=list)  # every recomputed fact of it


@dataclass
class Result:
    commands: int = 0  # commands re-run
    silent: int = 0  # of which produced no fact (idle Ticks, mostly)
    facts: int = 0  # facts reproduced byte for byte
    rejected: int = 0  # of which CommandRejected
    log_refused: int = 0  # commands the log recorded as refused by the log (refusals.py)
    first_seq: int | None = None
    last_seq: int | None = None  # last command re-run
    last_decided: int | None = None  # commandSeq of the last recorded fact
    pending: int = 0  # commands after the last decided one (bus only): not decided yet
    partial: tuple[int, int, int] | None = None  # (command seq, facts logged, facts announced)
    folded: int = 0  # facts folded as recorded because their commands are gone (trimmed stream)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # missing command seq ranges
    divergence: Divergence | None = None
    partition: str | None = None  # the partition audited, when the log has one per job queue

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def document(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        if self.divergence is not None:
            out["divergence"]["fields"] = [
                {"field": name, "recorded": rec, "recomputed": new}
                for name, rec, new in self.divergence.fields
            ]
        return out
