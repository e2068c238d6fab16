"""`quotasched audit verify`: re-run the decision core over the recorded commands and prove
that it reproduces every recorded fact, byte for byte, or show the first divergence.

The contract (contract.md section 3) keeps every command the scheduler decided on, verbatim
and in order, and every fact names the command that caused it (`commandSeq`).  So the audit
is a plain re-run: a fresh `State`, each command through the very function the scheduler ran
for it, and a comparison of the encoded facts with the recorded ones, in log order.

    commands  (seq, subject, raw bytes, stamp)      recorded facts  (JSON text, in order)
        │  decide_message  (bus: subject + stream timestamp)        │
        │  step_raw        (replay file: line number = seq)         │
        ▼                                                           ▼
    recomputed facts, encoded ───────────── compare ────────────── recorded facts

Two sources feed the same `verify`:
- files: a replay command file (`quotasched replay` input) and the fact log it printed (or
  `quotasched facts` printed);
- the live bus: QM_COMMANDS read in stream order with each message's sequence, subject and
  timestamp (the scheduler's own `sequence_and_time`, so a command without `at`, every Tick
  included, gets the exact stamp the scheduler used), and QM_FACTS.  The log's end is taken
  before the command stream's, so every recorded fact's command is read; commands after the
  last decided one are reported as not decided yet, and a command whose facts are still being
  appended (fewer messages than its `Qm-Facts` header says) counts as not decided yet too.

The verifier itself does no I/O: it consumes two iterables.  The bus reader runs nats-py on
its own event loop in a background thread and hands records over through bounded queues.

The package, by concept: `records` (the commands, facts, divergence and result), `sides` (the
re-run and the recorded log, read a fact at a time), `verifier` (the comparison), `report`
(the text output), `files` and `bus_reader` (the two sources), `live` (auditing the bus, one
partition at a time).  This module is the public face: every name importers use is here.
"""

from quotasched.services.audit.bus_reader import BusReader, BusUnavailable
from quotasched.services.audit.files import command_file_records, fact_file_records, verify_files
from quotasched.services.audit.live import partitions_on_bus, verify_bus
from quotasched.services.audit.records import CommandRecord, Divergence, FactRecord, Result
from quotasched.services.audit.report import render
from quotasched.services.audit.verifier import verify

__all__ = [
    "BusReader",
    "BusUnavailable",
    "CommandRecord",
    "Divergence",
    "FactRecord",
    "Result",
    "command_file_records",
    "fact_file_records",
    "partitions_on_bus",
    "render",
    "verify",
    "verify_bus",
    "verify_files",
]
