"""The audit's report as plain text: a summary, or the first divergence with both versions."""

from __future__ import annotations

import json

from quotasched.services.audit.records import Divergence, Result


def render(result: Result, source: str) -> str:
    """The report as plain text: a summary, or the first divergence with both versions."""
    lines = _summary(result, source)
    divergence = result.divergence
    if divergence is None:
        return "\n".join(lines)
    lines.append("")
    lines.extend(_divergence_lines(divergence, source))
    return "\n".join(lines)


def _summary(result: Result, source: str) -> list[str]:
    lines = []
    span = (f"commands {result.first_seq}..{result.last_seq}"
            if result.first_seq is not None else "no commands")  # fmt: skip
    if result.ok:
        lines.append("audit verify: OK: the decision core reproduces every recorded fact "
                     f"({source})")  # fmt: skip
    else:
        lines.append(f"audit verify: DIVERGENCE: the re-run disagrees with the log ({source})")
    lines.append(f"  commands re-run:   {result.commands} ({span}; "
                 f"{result.silent} produced no fact)")  # fmt: skip
    lines.append(f"  facts reproduced:  {result.facts} byte for byte "
                 f"({result.rejected} CommandRejected)")  # fmt: skip
    if result.log_refused:
        lines.append(f"  refused by the log: {result.log_refused} commands whose facts the bus "
                     "could not carry, recorded as CommandRejected and re-run as such")  # fmt: skip
    if result.folded:
        lines.append(f"  facts folded unverified: {result.folded} (their commands are no longer in "
                     f"the command stream, which starts at {result.first_seq})")  # fmt: skip
    if result.gaps:
        shown = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in result.gaps[:5])
        lines.append(f"  note: the command stream has gaps (deleted messages): {shown}"
                     + (" ..." if len(result.gaps) > 5 else ""))  # fmt: skip
    if result.pending:
        lines.append(f"  not decided yet:   {result.pending} command(s) after command "
                     f"{result.last_decided} (the scheduler has not recorded them yet)")  # fmt: skip
    if result.partial:
        seq, got, want = result.partial
        lines.append(f"  command {seq} is being recorded ({got} of its {want} facts are in the "
                     "log); it counts as not decided yet")  # fmt: skip
    return lines


def _divergence_lines(divergence: Divergence, source: str) -> list[str]:
    lines = []
    if divergence.position is None:
        where = "past the log's end"
    elif source.startswith("files"):
        where = f"line {divergence.position}"
    else:
        where = f"QM_FACTS sequence {divergence.position}"
    lines.append(f"First divergence: command {divergence.command_seq}, "
                 f"fact #{divergence.fact_index} of the log ({where})")  # fmt: skip
    lines.append(f"  {divergence.what}")
    if divergence.command is not None:
        lines.append(f"  command   : {divergence.command}")
    none = "(none)"
    lines.append(f"  recorded  : {divergence.recorded if divergence.recorded is not None else none}")
    lines.append(f"  recomputed: "
                 f"{divergence.recomputed if divergence.recomputed is not None else none}")
    if divergence.fields:
        lines.append("  fields that differ (recorded -> recomputed):")
        for name, old, new in divergence.fields:
            lines.append(f"    {name}: {json.dumps(old)} -> {json.dumps(new)}")
    rec, new = divergence.recorded_group, divergence.recomputed_group
    if rec or new:
        lines.append(f"  all facts of command {divergence.command_seq}, side by side "
                     f"(recorded {len(rec)}, recomputed {len(new)}):")  # fmt: skip
        for k in range(max(len(rec), len(new))):
            a = rec[k] if k < len(rec) else None
            b = new[k] if k < len(new) else None
            mark = "==" if a == b else "!="
            lines.append(f"    {k + 1:>3} {mark} recorded  : {a if a is not None else '(none)'}")
            lines.append(f"           recomputed: {b if b is not None else '(none)'}")
    return lines
