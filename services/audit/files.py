"""The file sources of the audit: a replay command file (line number = commandSeq) and the
fact log it printed, read as records for `verify`."""

from __future__ import annotations

from collections.abc import Iterator

from quotasched.services.audit.records import CommandRecord, FactRecord, Result
from quotasched.services.audit.verifier import verify


def command_file_records(path: str) -> Iterator[CommandRecord]:
    """A replay file's lines as commands: line number = seq, every line (blank ones too),
    line ends removed exactly as `replay_lines` does."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            yield CommandRecord(number, None, line.rstrip(b"\r\n"))


def fact_file_records(path: str) -> Iterator[FactRecord]:
    """A fact log (JSON Lines, as `quotasched replay` or `quotasched facts` print it); blank
    lines are not facts and are skipped."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.rstrip(b"\r\n").decode("utf-8", errors="replace")
            if text.strip():
                yield FactRecord.of(text, number)


def verify_files(commands_path: str, facts_path: str) -> Result:
    return verify(command_file_records(commands_path), fact_file_records(facts_path))
