"""`quotasched audit verify` and `quotasched explain`, offline: files, and bus-shaped records.

The verifier must accept every example's fact log exactly as `quotasched replay` prints it,
and must point at the first fact of a tampered log (a changed field, a dropped fact, an added
one).  The explanations must tell the notebook's story with its reasons (borrowing, reclaim,
usage and limits, in-share preemption) and quote a blocked head's reason string, and every
sentence must be backed by a recorded fact (its commandSeq and `at`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.events.codec import decode_command, decode_fact, encode
from quotasched.events.subjects import command_subject, subject_for_command
from quotasched.services.audit import CommandRecord, FactRecord, render, verify, verify_files
from quotasched.services.explain import WAITING, InconsistentLog, Story, explain, why_waiting
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import State
from quotasched.services.scheduler.core.admission import (
    BORROWABLE_EXCEEDED,
    LIMIT_AND_BORROW_EXCEEDED,
    SE_MAX_RESOURCE,
)
from quotasched.services.scheduler.routing import decide_message

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOTEBOOK = EXAMPLES / "notebook.jsonl"
BLOCKED = EXAMPLES / "blocked-heads-and-capacity-events.jsonl"
GOLDEN = ROOT / "tests" / "golden" / "expected"
QUOTASCHED = Path(sys.executable).parent / "quotasched"
G5 = "ml.g5.xlarge"


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("QUOTASCHED_NATS_URL", None)
    return subprocess.run([str(QUOTASCHED), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)  # fmt: skip


def replayed(path: Path) -> list[str]:
    with open(path, "rb") as handle:
        return [encode(fact) for fact in replay_lines(handle)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def story(path: Path, job_id: str):
    with open(path, "rb") as handle:
        return explain(list(replay_lines(handle)), job_id)


def text_of(entries) -> str:
    return "\n".join(entry.sentence for entry in entries)


# -- verify: files ---------------------------------------------------------------------------


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_example_verifies(example: Path, tmp_path: Path):
    facts = write_lines(tmp_path / "facts.jsonl", replayed(example))
    result = verify_files(str(example), str(facts))
    assert result.ok, render(result, "files")
    lines = example.read_bytes().splitlines()
    assert result.commands == len(lines) and (result.first_seq, result.last_seq) == (1, len(lines))
    assert result.facts == len(replayed(example))
    assert result.pending == 0 and result.folded == 0 and not result.gaps
    golden = GOLDEN / f"{example.stem}.facts.jsonl"
    assert verify_files(str(example), str(golden)).ok


def test_cli_verify_ok_and_json(tmp_path: Path):
    result = run("audit", "verify", "--commands", str(NOTEBOOK),
                 "--facts", str(GOLDEN / "notebook.facts.jsonl"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "audit verify: OK" in result.stdout
    assert "11 (commands 1..11" in result.stdout and "17 byte for byte" in result.stdout
    document = json.loads(run("audit", "verify", "--commands", str(NOTEBOOK), "--facts",
                              str(GOLDEN / "notebook.facts.jsonl"), "--output", "json").stdout)
    assert document["ok"] is True and document["facts"] == 17 and document["commands"] == 11
    assert document["divergence"] is None


def _tampered(tmp_path: Path, how: str) -> Path:
    lines = (GOLDEN / "notebook.facts.jsonl").read_text().splitlines()
    if how == "changed":  # fact 13: med preempted by b1 (command 10)
        fact = json.loads(lines[12])
        assert fact["kind"] == "JobPreempted" and fact["jobId"] == "med"
        fact["reason"] = "IN_SHARE_PRIORITY"
        lines[12] = json.dumps(fact, separators=(",", ":"))
    elif how == "dropped":
        del lines[12]
    elif how == "added":  # med dispatched twice (command 8)
        lines.insert(10, lines[9])
    elif how == "dropped-last":
        del lines[-1]
    elif how == "added-last":
        lines.append(lines[-1])
    elif how == "garbled":
        lines[6] = lines[6][:40]
    return write_lines(tmp_path / f"{how}.jsonl", lines)


@pytest.mark.parametrize("how, command, index, what", [
    ("changed", 10, 13, "differs"),
    ("dropped", 10, 13, "missing"),
    ("added", 8, 11, "extra"),
    ("dropped-last", 11, 17, "missing"),
    ("added-last", 11, 18, "no command left"),
    ("garbled", 7, 7, "not a readable fact"),
])  # fmt: skip
def test_tampered_fact_log_is_caught_at_the_first_divergence(tmp_path, how, command, index, what):
    facts = _tampered(tmp_path, how)
    result = verify_files(str(NOTEBOOK), str(facts))
    assert not result.ok
    divergence = result.divergence
    assert (divergence.command_seq, divergence.fact_index) == (command, index), divergence
    assert what in divergence.what
    assert result.facts == index - 1
    golden = (GOLDEN / "notebook.facts.jsonl").read_text().splitlines()
    if how in ("changed", "dropped"):
        assert divergence.recomputed == golden[12]
    if how == "changed":
        assert divergence.recorded != divergence.recomputed
        assert divergence.fields == [("reason", "IN_SHARE_PRIORITY", "CROSS_SHARE_RECLAIM")]
        assert len(divergence.recorded_group) == len(divergence.recomputed_group) == 3
    if how == "added-last":
        assert divergence.recomputed is None and divergence.recorded == golden[-1]

    cli = run("audit", "verify", "--commands", str(NOTEBOOK), "--facts", str(facts))
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "DIVERGENCE" in cli.stdout
    assert f"First divergence: command {command}, fact #{index}" in cli.stdout
    assert "recorded  :" in cli.stdout and "recomputed:" in cli.stdout
    if how == "changed":
        assert '"reason":"IN_SHARE_PRIORITY"' in cli.stdout
        assert '"reason":"CROSS_SHARE_RECLAIM"' in cli.stdout
        assert 'reason: "IN_SHARE_PRIORITY" -> "CROSS_SHARE_RECLAIM"' in cli.stdout


def test_a_changed_command_is_caught_too(tmp_path: Path):
    lines = NOTEBOOK.read_text().splitlines()
    command = json.loads(lines[8])
    command["schedulingPriority"] = 2  # low, submitted with priority 1
    lines[8] = json.dumps(command)
    commands = write_lines(tmp_path / "commands.jsonl", lines)
    result = verify_files(str(commands), str(GOLDEN / "notebook.facts.jsonl"))
    assert not result.ok and result.divergence.command_seq == 9
    assert ("schedulingPriority", 1, 2) in result.divergence.fields


def test_refused_and_unreadable_command_lines_are_reproduced(tmp_path: Path):
    lines = NOTEBOOK.read_text().splitlines()
    lines[7:7] = ["", "not json", '{"kind": "Nope", "at": 2}',
                  '{"kind": "UpdateServiceJob", "jobId": "ghost", "schedulingPriority": 1}']
    commands = write_lines(tmp_path / "commands.jsonl", lines)
    facts = write_lines(tmp_path / "facts.jsonl", replayed(commands))
    result = verify_files(str(commands), str(facts))
    assert result.ok, render(result, "files")
    assert result.rejected == 4 and result.commands == len(lines)


def test_cli_verify_usage_errors(tmp_path: Path):
    assert run("audit", "verify").returncode == 2
    assert run("audit", "verify", "--commands", str(NOTEBOOK)).returncode == 2
    missing = run("audit", "verify", "--commands", str(NOTEBOOK), "--facts", str(tmp_path / "x"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    both = run("audit", "verify", "--commands", str(NOTEBOOK), "--facts", str(NOTEBOOK),
               "--nats-url", "nats://127.0.0.1:9")  # fmt: skip
    assert both.returncode == 2


# -- verify: bus-shaped records (subject, stream timestamp), as the live scheduler sees them -----


def bus_records() -> list[CommandRecord]:
    """The notebook as a command stream: subjects, Ticks without `at` stamped by the stream's
    clock, and a submission without `at` (it takes its stamp)."""
    routes = {"low": ("q", "qs1")}
    records: list[CommandRecord] = []
    stamp = 1000.0

    def add(subject: str, data: str) -> None:
        nonlocal stamp
        stamp += 0.25
        records.append(CommandRecord(len(records) + 1, subject, data.encode(), stamp))

    for number, line in enumerate(NOTEBOOK.read_text().splitlines()):
        command = decode_command(line)
        add(subject_for_command(command, routes.get(getattr(command, "job_id", None))), line)
        if number % 3 == 0:
            add(command_subject("Tick"), '{"kind":"Tick"}')
    add(command_subject("SubmitServiceJob", "q", "qs3"),
        json.dumps({"kind": "SubmitServiceJob", "jobId": "late", "jobName": "late", "jobQueue": "q",
                    "quotaShareName": "qs3", "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}))
    add(command_subject("UpdateServiceJob", "q", "qs2"),  # misrouted: refused
        '{"kind": "UpdateServiceJob", "jobId": "med", "schedulingPriority": 7}')
    add(command_subject("Tick"), '{"kind":"Tick"}')
    return records


def scheduler_log(records: list[CommandRecord]) -> list[FactRecord]:
    """What the live scheduler records for these messages: `decide_message`, in order."""
    state = State()
    out = []
    for record in records:
        for fact in decide_message(state, record.subject, record.data, record.seq, record.stamp):
            out.append(FactRecord.of(encode(fact), len(out) + 1))
    return out


def test_bus_records_verify_with_ticks_stamps_and_refusals():
    records = bus_records()
    log = scheduler_log(records)
    result = verify(records, log, pending_allowed=True)
    assert result.ok, render(result, "bus")
    assert result.commands == len(records) and result.facts == len(log)
    assert result.silent >= 4 and result.rejected == 1 and result.pending == 0
    late = [decode_fact(fact.text) for fact in log if '"jobId":"late"' in fact.text]
    assert late[0].at == records[-3].stamp  # a command without `at` happens at its stamp


def test_bus_commands_not_decided_yet_are_pending_not_divergent():
    records = bus_records()
    log = scheduler_log(records)
    decided = [fact for fact in log if fact.command_seq < records[-3].seq]  # `late` not yet
    result = verify(records, decided, pending_allowed=True)
    assert result.ok and result.pending == 3 and result.last_decided < records[-3].seq
    assert result.commands == len(records) - 3
    assert "not decided yet:   3 command(s)" in render(result, "bus")
    strict = verify(records, decided)
    assert not strict.ok and "missing" in strict.divergence.what


def test_bus_a_different_stamp_is_a_divergence():
    records = bus_records()
    log = scheduler_log(records)
    late = records[-3]
    records[-3] = CommandRecord(late.seq, late.subject, late.data, late.stamp + 1)
    result = verify(records, log, pending_allowed=True)
    assert not result.ok and result.divergence.command_seq == late.seq
    assert result.divergence.fields[0][0] == "at"


def test_bus_trimmed_command_stream_starts_from_the_recorded_facts():
    records = bus_records()
    log = scheduler_log(records)
    start = 9
    result = verify(records[start - 1:], log, pending_allowed=True)
    assert result.ok, render(result, "bus")
    assert result.folded == sum(1 for fact in log if fact.command_seq < start)
    assert result.first_seq == start and result.facts + result.folded == len(log)


# -- explain -----------------------------------------------------------------------------------


def test_explain_med_borrowing_then_reclaimed_by_b1():
    entries = story(NOTEBOOK, "med")
    kinds = [entry.kind for entry in entries]
    assert kinds[:3] == ["JobSubmitted", "JobDispatched", "JobPreempted"]
    submitted, dispatched, preempted = entries[:3]
    assert "priority 2" in submitted.sentence and "1 x ml.g5.xlarge" in submitted.sentence
    assert (dispatched.command_seq, dispatched.at) == (8, 2.0)
    assert "borrowing 1 x ml.g5.xlarge beyond qs1's own limit" in dispatched.sentence
    assert "qs1 then uses 2 of its limit 1" in dispatched.sentence
    assert "idle lendable capacity right before: qs2 1 ml.g5.xlarge" in dispatched.sentence
    text = preempted.sentence
    assert (preempted.command_seq, preempted.at) == (10, 4.0)
    assert "preempted by b1 under CROSS_SHARE_RECLAIM" in text
    assert "qs1 (LEND_AND_BORROW) uses 2 of its limit 1 (borrowing 1)" in text
    assert "qs2 (LEND) uses 0 of its limit 1" in text
    assert "qs3 (RESERVE) uses 0 of its limit 1" in text
    assert "service environment se: 2 of 3 ml.g5.xlarge in use" in text
    assert "med was chosen because it was borrowing" in text and "high was not" in text
    assert "went back to RUNNABLE" in text
    waits = [entry for entry in entries if entry.kind == WAITING]
    assert waits and "no idle lendable capacity" in waits[0].sentence


def test_explain_low_waits_then_preempts_high_after_its_priority_update():
    entries = story(NOTEBOOK, "low")
    assert [entry.kind for entry in entries] == [
        "JobSubmitted", WAITING, WAITING, "JobPriorityUpdated", "JobPreempted", "JobDispatched",
    ]
    first_wait, second_wait = entries[1], entries[2]
    assert first_wait.command_seq == 9
    assert "no idle lendable capacity" in first_wait.sentence
    assert "finds no running job with a priority below 1: high (priority 3), med (priority 2)" \
        in first_wait.sentence
    assert second_wait.command_seq == 10
    assert "behind higher-priority job med (priority 2, its own is 1)" in second_wait.sentence
    update, preempt, dispatch = entries[3:]
    assert "from 1 to 4" in update.sentence
    assert "low preempted high" in preempt.sentence and "IN_SHARE_PRIORITY" in preempt.sentence
    assert "high (priority 3, dispatched at 1)" in preempt.sentence
    assert "once high stopped" in dispatch.sentence and dispatch.command_seq == 11


def test_explain_blocked_heads_quote_the_reason():
    t4 = text_of(story(BLOCKED, "t4"))
    assert f'behind the blocked head of cv-train, t-wide, which can never fit as configured: "{LIMIT_AND_BORROW_EXCEEDED}"' in t4
    assert "cv-train has reached its borrow ceiling: it may use at most 3 ml.m5.xlarge" in t4

    wide = story(BLOCKED, "t-wide")
    blocked = [entry for entry in wide if entry.kind == "ShareBlocked"]
    assert blocked and LIMIT_AND_BORROW_EXCEEDED in blocked[0].sentence
    preempted = next(entry for entry in wide if entry.kind == "JobPreempted")
    assert "preempted by p-big under CROSS_SHARE_RECLAIM" in preempted.sentence
    assert "it alone frees enough room" in preempted.sentence

    a10 = story(BLOCKED, "a-10")
    assert BORROWABLE_EXCEEDED in text_of(a10)
    assert a10[-1].kind == "JobStatusChanged" and "FAILED" in a10[-1].sentence

    b12 = text_of(story(BLOCKED, "b-12"))
    assert SE_MAX_RESOURCE in b12 and BORROWABLE_EXCEEDED in b12

    assert "service environment se-ops is DISABLED" in text_of(story(BLOCKED, "o2"))
    assert "a LEND share may not borrow" in text_of(story(BLOCKED, "ob2"))


def _command(kind: str, **fields) -> str:
    return json.dumps({"kind": kind, **fields})


def test_explain_local_story_full_environment_reserve_and_fifo(tmp_path: Path):
    limits = lambda n: [{"capacityUnit": G5, "maxCapacity": n}]  # noqa: E731
    submit = lambda job, share, n, at: _command(  # noqa: E731
        "SubmitServiceJob", at=at, jobId=job, jobName=job, jobQueue="q", quotaShareName=share,
        capacityUsage=[{"capacityUnit": G5, "quantity": n}])
    lines = [
        _command("CreateServiceEnvironment", at=0, serviceEnvironmentName="se", capacityLimits=limits(2)),
        _command("CreateSchedulingPolicy", at=0, name="sp",
                 quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}),
        _command("CreateJobQueue", at=0, jobQueueName="q", schedulingPolicy="sp",
                 serviceEnvironmentOrder=[{"order": 1, "serviceEnvironment": "se"}]),
        _command("CreateQuotaShare", at=0, jobQueue="q", quotaShareName="a", capacityLimits=limits(2),
                 resourceSharingConfiguration={"strategy": "RESERVE"},
                 preemptionConfiguration={"inSharePreemption": "DISABLED"}),
        _command("CreateQuotaShare", at=0, jobQueue="q", quotaShareName="b", capacityLimits=limits(2),
                 resourceSharingConfiguration={"strategy": "LEND"},
                 preemptionConfiguration={"inSharePreemption": "DISABLED"}),
        submit("a1", "a", 2, 1),  # 6: dispatched, the SE (2) is full
        submit("b1", "b", 1, 2),  # 7: fits b's limit, but the SE is full and nobody borrows
        submit("b2", "b", 1, 3),  # 8: behind b1 (same priority, earlier)
        submit("a2", "a", 1, 4),  # 9: a is at its limit and RESERVE never borrows
        _command("ReportJobStatus", at=5, jobId="a1", status="SUCCEEDED"),  # 10
    ]  # fmt: skip
    commands = write_lines(tmp_path / "commands.jsonl", lines)
    b1 = text_of(story(commands, "b1"))
    assert "service environment se is full: 2 of its 2 ml.g5.xlarge are in use and b1 needs 1" in b1
    assert "cross-share reclaim finds nothing to take back" in b1
    b2 = story(commands, "b2")
    assert "it is behind b1, submitted earlier with the same priority 0, at the head of b" \
        in b2[1].sentence
    assert "b1 itself waits because service environment se is full" in b2[1].sentence
    a2 = text_of(story(commands, "a2"))
    assert "a is at its own limit (2 of 2 ml.g5.xlarge in use, a2 needs 1) and a RESERVE " \
           "share may not borrow" in a2
    assert "a2 was dispatched" in a2  # once a1 finished
    state = State()
    with open(commands, "rb") as handle:
        list(replay_lines(handle, state))
    assert why_waiting(state, state.jobs["b2"]).startswith("b2 waits (RUNNABLE)")


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_sentence_is_backed_by_a_recorded_fact(example: Path):
    with open(example, "rb") as handle:
        facts = list(replay_lines(handle))
    moments = {(fact.command_seq, fact.at) for fact in facts}
    kinds = {(fact.command_seq, fact.kind) for fact in facts}
    jobs = {fact.job_id: fact.job_name for fact in facts if fact.kind == "JobSubmitted"}
    submitted = {fact.job_id: fact.command_seq for fact in reversed(facts) if fact.kind == "JobSubmitted"}
    for job_id, name in jobs.items():
        entries = explain(facts, job_id)
        assert entries[0].kind in ("JobSubmitted", "CommandRejected")
        assert any(entry.kind == "JobSubmitted" for entry in entries)
        for entry in entries:
            assert (entry.command_seq, entry.at) in moments, (job_id, entry)
            assert entry.kind == WAITING or (entry.command_seq, entry.kind) in kinds
            # named as a person reads it: "name (first 8 of the id)", or the id that is a name;
            # by its id alone only before the log knows its name (a refused submission)
            short = job_id if name in ("", job_id) else f"{name} ({job_id[:8]})"
            before = entry.command_seq < submitted[job_id]
            assert short in entry.sentence or (before and job_id in entry.sentence), (job_id, entry)


def test_cli_explain_text_json_and_errors(tmp_path: Path):
    facts = str(GOLDEN / "notebook.facts.jsonl")
    text = run("explain", "med", "--facts", facts)
    assert text.returncode == 0, text.stderr
    # the answer first (issue 21), by hand from the notebook: high (3) heads qs1 and waits
    assert text.stdout.splitlines()[0] == ("med is waiting: it is behind higher-priority job "
                                           "high (priority 3, its own is 2) at the head of qs1 "
                                           "(since t=5 s)")  # fmt: skip
    assert "\nThe story of job med, from the fact log:\n" in text.stdout
    assert "[t=4 s, command 10, JobPreempted] med (attempt 1) was preempted by b1" in text.stdout
    assert max(len(line.split()) for line in text.stdout.splitlines()) < 60  # no 150-word line
    replay = run("explain", "med", "--commands", str(NOTEBOOK))
    assert replay.stdout == text.stdout
    document = json.loads(run("explain", "low", "--facts", facts, "--output", "json").stdout)
    assert [set(item) for item in document] == [{"at", "commandSeq", "kind", "sentence"}] * 6
    assert document[-1]["kind"] == "JobDispatched" and document[-1]["commandSeq"] == 11
    unknown = run("explain", "nobody", "--facts", facts)
    assert unknown.returncode == 1 and "no fact names job nobody" in unknown.stderr
    assert run("explain", "med", "--facts", facts, "--commands", str(NOTEBOOK)).returncode == 2
    assert run("explain", "med").returncode == 2
    bad = write_lines(tmp_path / "bad.jsonl", ["{}"])
    broken = run("explain", "med", "--facts", str(bad))
    assert broken.returncode == 2 and "line 1" in broken.stderr


def test_explain_takes_a_job_name_and_lists_the_jobs_a_name_shares(tmp_path: Path):
    """Issue 21: `explain` by job name; a name several jobs share lists their ids."""
    commands = [json.loads(line) for line in NOTEBOOK.read_text().splitlines() if line.strip()]
    for command in commands:
        if command.get("kind") == "SubmitServiceJob" and command["jobId"] in ("high", "low"):
            command["jobName"] = "train"
        elif command.get("kind") == "SubmitServiceJob":
            command["jobName"] = f"{command['jobId']}-name"
    renamed = write_lines(tmp_path / "renamed.jsonl", [json.dumps(c) for c in commands])
    one = run("explain", "med-name", "--commands", str(renamed))
    assert one.returncode == 0, one.stderr
    assert "(job name med-name is job med)" in one.stderr
    # issue 32: a job reads by its name first, with (a short) id beside it
    assert one.stdout.startswith("med-name (med) is waiting: it is behind higher-priority job "
                                 "train (high) (priority 3, its own is 2)")  # fmt: skip
    assert "\nThe story of job med-name (job id med), from the fact log:\n" in one.stdout
    assert "med-name (med) (attempt 1) was preempted by b1-name (b1)" in one.stdout
    several = run("explain", "train", "--commands", str(renamed))
    assert several.returncode == 1
    assert "job name train names 2 jobs: high, low; give one job id" in several.stderr


def test_epoch_times_read_as_iso_timestamps_and_durations_in_words():
    from quotasched.services.explain.story import duration, when

    assert when(1796147291.7) == "2026-12-01T17:48:11Z" and when(2.5) == "t=2.5 s"
    assert [duration(s) for s in (0.5, 59, 192, 3600, 7500)] == [
        "0.5 s", "59 s", "3 min 12 s", "1 h", "2 h 5 min"]


def test_explain_refuses_a_log_it_cannot_fold(tmp_path: Path):
    lines = (GOLDEN / "notebook.facts.jsonl").read_text().splitlines()
    partial = write_lines(tmp_path / "partial.jsonl", lines[9:])  # starts at med's dispatch
    result = run("explain", "med", "--facts", str(partial))
    assert result.returncode == 2
    assert "can't be folded" in result.stderr and "audit verify" in result.stderr


def test_bus_reader_holds_back_a_command_still_being_appended(monkeypatch):
    """The fact reader passes whole commands on and keeps a trailing one whose messages are
    fewer than its `Qm-Facts` header announces (the scheduler is appending it right now)."""
    import asyncio
    import queue as queue_module
    from types import SimpleNamespace

    import quotasched.services.nats.log as log_module
    from quotasched.services.audit import BusReader

    texts = (GOLDEN / "notebook.facts.jsonl").read_text().splitlines()[:13]  # command 10: 2 of 3
    counts: dict[int, int] = {}
    for text in (GOLDEN / "notebook.facts.jsonl").read_text().splitlines():
        seq = json.loads(text)["commandSeq"]
        counts[seq] = counts.get(seq, 0) + 1
    messages, index_of = [], {}
    for number, text in enumerate(texts, start=1):
        seq = json.loads(text)["commandSeq"]
        index = index_of[seq] = index_of.get(seq, -1) + 1
        headers = {"Nats-Msg-Id": f"main:{seq}:{index}", "Qm-Facts": str(counts[seq])}
        messages.append(SimpleNamespace(data=text.encode(), headers=headers, number=number))

    async def read_messages(js, subject, start, until_seq=None):
        for message in messages:
            yield message

    monkeypatch.setattr(log_module, "read_messages", read_messages)
    monkeypatch.setattr(log_module, "stream_seq", lambda message: message.number)
    reader = BusReader("nats://unused")
    reader._facts = queue_module.Queue()
    asyncio.run(reader._read_facts(None, len(messages)))
    passed = []
    while True:
        batch = reader._facts.get_nowait()
        if not isinstance(batch, list):
            break
        passed.extend(batch)
    assert [record.text for record in passed] == texts[:11]  # commands 1..9, whole
    assert reader.partial == (10, 2, 3)
    result = verify(bus_like(NOTEBOOK), passed, pending_allowed=True, partial=reader.partial)
    assert result.ok and result.pending == 2 and result.last_decided == 9
    assert "command 10 is being recorded (2 of its 3 facts are in the log)" in render(result, "bus")


def bus_like(path: Path) -> list[CommandRecord]:
    """A replay file as file records (line = seq), for verifying against a bus-shaped log."""
    return [CommandRecord(number, None, line)
            for number, line in enumerate(path.read_bytes().splitlines(), start=1)]


# -- the end of a story -----------------------------------------------------------------------


class FoldingToTheEnd(Story):
    """A story that folds the whole log, never ending early: what the early end must equal."""

    def _flush(self) -> None:
        super()._flush()
        self.finished = False


def folded_to_the_end(facts, job_id: str):
    story = FoldingToTheEnd(job_id)
    for fact in facts:
        story.add(fact)
    return story.close()


AFTER_THE_END = [  # the notebook, then b1 finishes and is reported on, updated and terminated
    {"at": 6, "kind": "ReportJobStatus", "jobId": "b1", "status": "SUCCEEDED"},
    {"at": 7, "kind": "ReportJobStatus", "jobId": "b1", "status": "RUNNING"},
    {"at": 8, "kind": "UpdateServiceJob", "jobId": "b1", "schedulingPriority": 9},
    {"at": 9, "kind": "SubmitServiceJob", "jobId": "b2", "jobName": "b2", "jobQueue": "q",
     "quotaShareName": "qs2", "schedulingPriority": 1,
     "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]},
    {"at": 10, "kind": "TerminateServiceJob", "jobId": "b1", "reason": "too late"},
]


def test_a_finished_jobs_story_ends_early_and_still_tells_what_names_it(tmp_path: Path):
    lines = NOTEBOOK.read_text().splitlines() + [json.dumps(c) for c in AFTER_THE_END]
    facts = list(replay_lines([line.encode() for line in lines if line.strip()]))
    entries = explain(facts, "b1")
    assert entries == folded_to_the_end(facts, "b1")
    kinds = [entry.kind for entry in entries]
    assert kinds[-3:] == ["JobReportIgnored", "CommandRejected", "CommandRejected"]
    assert "b1 finished: SUCCEEDED" in text_of(entries)
    # The command line reads a file, decoding only the lines that name b1 once it finished.
    path = write_lines(tmp_path / "facts.jsonl", [encode(fact) for fact in facts])
    told = run("explain", "b1", "--facts", str(path), "--output", "json")
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout) == [entry.document() for entry in entries]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_jobs_story_ending_early_equals_the_whole_fold(seed: int):
    from tests.projections.helpers import random_workload

    facts = list(replay_lines([line.encode() for line in random_workload(seed, commands=600)]))
    jobs = sorted({fact.job_id for fact in facts if fact.kind == "JobSubmitted"})
    finished = 0
    for job_id in jobs:
        entries = explain(facts, job_id)
        assert entries == folded_to_the_end(facts, job_id), job_id
        finished += any("finished" in entry.sentence for entry in entries)
    assert finished >= 10


def test_a_fact_that_changes_a_finished_job_is_an_inconsistent_log():
    lines = NOTEBOOK.read_text().splitlines() + [json.dumps(AFTER_THE_END[0])]
    facts = list(replay_lines([line.encode() for line in lines if line.strip()]))
    (succeeded,) = [fact for fact in facts if fact.kind == "JobStatusChanged"
                    and fact.job_id == "b1" and fact.status.value == "SUCCEEDED"]  # fmt: skip
    forged = decode_fact(encode(succeeded).replace('"SUCCEEDED"', '"RUNNING"', 1))
    forged_later = forged.model_copy(update={"command_seq": facts[-1].command_seq + 1})
    with pytest.raises(InconsistentLog, match="names job b1 after it finished"):
        explain([*facts, forged_later], "b1")
