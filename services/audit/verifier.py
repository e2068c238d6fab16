"""The verifier: compares the re-run's facts with the recorded ones, in log order, and
describes the first place where they disagree.  No I/O: it consumes two iterables."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from quotasched.events.codec import decode_fact, encode
from quotasched.services.audit.records import CommandRecord, Divergence, FactRecord, Result
from quotasched.services.audit.sides import _Produced, _Recorded
from quotasched.services.scheduler.core import State, evolve
from quotasched.services.scheduler.partition import Partition


def verify(
    commands: Iterable[CommandRecord],
    facts: Iterable[FactRecord],
    *,
    pending_allowed: bool = False,
    partial: tuple[int, int, int] | None = None,
    scope: Partition | None = None,
) -> Result:
    """Re-run `commands` on a fresh state and compare the facts with `facts`, in order.

    `pending_allowed` (the live bus): commands after the last recorded decision are not a
    divergence but "not decided yet" (the scheduler may still be working, or be stopped).
    `partial`, from the bus reader: a trailing command whose facts were still being appended,
    already left out of `facts`.  `scope`: the log was written by a partition per job queue,
    and `facts` are one partition's; its commands are picked out of `commands`, and only
    its own part of their facts is compared.
    """
    result = Result(partial=partial, partition=scope.name if scope is not None else None)
    state = State()
    recorded = _Recorded(facts)
    produced = _Produced(commands, state, result, scope, recorded)
    first = produced.start()
    if first is not None and first.seq > 1 and produced.scope is None:
        _fold_trimmed(first.seq, recorded, state, result)
    index = 0
    while True:
        want = produced.peek()
        got = recorded.peek()
        if want is None and got is None:
            return result
        if got is None:
            last = result.last_decided
            if pending_allowed and (last is None or want[0] > last):
                _leave_pending(result, produced, want[0])
                return result
        if got is not None and want is not None and got.text == want[1]:
            produced.pop()
            recorded.pop()
            index += 1
            result.facts += 1
            result.last_decided = got.command_seq
            if got.text.startswith('{"kind":"CommandRejected"'):
                result.rejected += 1
            continue
        result.divergence = _divergence(index, want, got, produced, recorded)
        return result


def _fold_trimmed(first_seq: int, recorded: _Recorded, state: State, result: Result) -> None:
    # The command stream was trimmed (allowed up to the last snapshot): the facts of the
    # commands that are gone are folded as recorded, and the audit starts from there.
    while (fact := recorded.peek()) is not None and fact.command_seq is not None \
            and fact.command_seq < first_seq:
        try:
            folded = decode_fact(fact.text)
        except ValueError:  # not a fact: the comparison below reports it
            break
        recorded.pop()
        evolve(state, folded)
        result.folded += 1
        result.last_decided = fact.command_seq


def _leave_pending(result: Result, produced: _Produced, want_seq: int) -> None:
    # The command that produced `want` ran last: it is pending, not verified.
    result.commands -= 1
    result.last_seq = produced.before_last
    if result.gaps and result.gaps[-1][1] == want_seq - 1:
        result.gaps.pop()
    if result.commands == 0:
        result.first_seq = None
    result.pending = 1 + produced.remaining()


def _divergence(index: int, want: tuple[int, str] | None, got: FactRecord | None,
                produced: _Produced, recorded: _Recorded) -> Divergence:  # fmt: skip
    want_seq = want[0] if want is not None else None
    got_seq = got.command_seq if got is not None else None
    changed = False
    if want is None:
        seq = got_seq
        what = ("the log records a fact the re-run does not produce: no command left to "
                "cause it" + ("" if got_seq is not None else " (and it is not a readable fact)"))
    elif got is None:
        seq = want_seq
        what = "the log ends here, but the re-run produces this fact (missing from the log)"
    elif got_seq is None:
        seq = want_seq
        what = "the recorded fact is not a readable fact (no integer commandSeq)"
    elif got_seq > want_seq:
        seq = want_seq
        what = (f"the log has no (more) facts for command {want_seq}; its next fact is for "
                f"command {got_seq}: the re-run's fact is missing from the log")
    elif got_seq < want_seq:
        seq = got_seq
        what = (f"the log has a fact for command {got_seq} that the re-run does not produce "
                f"(the re-run is at command {want_seq}): an extra fact")
    else:
        seq = want_seq
        after_want = produced.peek2()
        after_got = recorded.peek(1)
        if after_got is not None and after_got.text == want[1]:
            what = "the log has an extra fact here (the next recorded fact is the re-run's)"
        elif after_want is not None and after_want[1] == got.text:
            what = "a fact is missing from the log here (the recorded fact is the re-run's next)"
        else:
            changed = True
            what = "the recorded fact differs from the recomputed one"
            if _canonical(got.text) == want[1]:
                what += " only in its encoding (same fact, other bytes)"
    matched = recorded.group if recorded.group_seq == seq else []
    return Divergence(
        command_seq=seq, fact_index=index + 1, position=got.position if got else None, what=what,
        recorded=got.text if got else None, recomputed=want[1] if want else None,
        fields=_field_differences(got.text, want[1]) if changed else [],
        command=produced.command_text(seq), recorded_group=matched + recorded.rest_of_group(seq),
        recomputed_group=produced.group(seq),
    )  # fmt: skip


def _canonical(text: str) -> str | None:
    try:
        return encode(decode_fact(text))
    except Exception:  # a tampered line may be anything
        return None


def _field_differences(recorded: str | None, recomputed: str | None) -> list[tuple[str, Any, Any]]:
    try:
        left = json.loads(recorded) if recorded is not None else None
        right = json.loads(recomputed) if recomputed is not None else None
    except ValueError:
        return []
    if not isinstance(left, dict) or not isinstance(right, dict):
        return []
    absent = "(absent)"
    out = []
    for name in [*left, *(key for key in right if key not in left)]:
        a, b = left.get(name, absent), right.get(name, absent)
        if a != b or (name in left) != (name in right):
            out.append((name, a, b))
    return out
