"""The `quotasched` console script, run for real in subprocesses (contract.md section 4)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quotasched.events.codec import decode_fact
from quotasched.events.commands import COMMAND_KINDS

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "notebook.jsonl"
QUOTASCHED = Path(sys.executable).parent / "quotasched"
G5 = "ml.g5.xlarge"

NOTEBOOK_SETUP = NOTEBOOK.read_text().splitlines()[:6]  # SE, policy, queue, qs1-qs3


def run(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:  # fmt: skip
    return subprocess.run(
        [str(QUOTASCHED), *args], input=stdin, capture_output=True, cwd=cwd, timeout=120,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def facts_of(stdout: bytes) -> list[dict]:
    lines = stdout.decode("utf-8").splitlines()
    for line in lines:
        decode_fact(line)  # every line is one valid fact
    return [json.loads(line) for line in lines]


def decisions(facts: list[dict]) -> list[tuple]:
    """What the scheduler decided, in order: (kind, jobId, commandSeq) of the job-level facts."""
    kinds = {"JobDispatched", "JobPreempted", "JobStatusChanged", "ShareBlocked", "CommandRejected"}
    return [(f["kind"], f.get("jobId"), f["commandSeq"]) for f in facts if f["kind"] in kinds]


def one(facts: list[dict], kind: str, job_id: str) -> dict:
    found = [f for f in facts if f["kind"] == kind and f.get("jobId") == job_id]
    assert len(found) == 1, (kind, job_id, found)
    return found[0]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
    state_path = tmp_path_factory.mktemp("notebook") / "state.json"
    result = run("replay", "examples/notebook.jsonl", "--state-out", str(state_path))
    assert result.returncode == 0, result.stderr.decode()
    return result, facts_of(result.stdout), json.loads(state_path.read_text())


def _line(**fields) -> str:
    return json.dumps(fields)


def _submit(job_id: str, share: str, at: float, priority: int = 0, **extra) -> str:
    return _line(at=at, kind="SubmitServiceJob", jobId=job_id, jobName=job_id, jobQueue="q",
                 quotaShareName=share, schedulingPriority=priority,
                 capacityUsage=[{"capacityUnit": G5, "quantity": 1}], **extra)  # fmt: skip


# -- replay of the notebook (the outcome stated at the end of contract.md) ----------------------


def test_replay_of_the_notebook_exits_0_and_prints_only_facts(notebook):
    result, facts, _ = notebook
    assert result.stderr == b""
    assert facts, "no facts printed"
    assert result.stdout.endswith(b"\n")
    assert all(f["at"] >= prev["at"] for prev, f in zip(facts, facts[1:]))
    assert all(f["commandSeq"] >= prev["commandSeq"] for prev, f in zip(facts, facts[1:]))
    assert not [f for f in facts if f["kind"] == "CommandRejected"]


def test_notebook_decisions_are_exactly_those_of_the_contract(notebook):
    _, facts, _ = notebook
    assert decisions(facts) == [
        ("JobDispatched", "high", 7),
        ("JobDispatched", "med", 8),
        ("JobPreempted", "med", 10),
        ("JobDispatched", "b1", 10),
        ("JobPreempted", "high", 11),
        ("JobDispatched", "low", 11),
    ]


def test_notebook_high_is_dispatched_on_its_own_quota(notebook):
    _, facts, _ = notebook
    high = one(facts, "JobDispatched", "high")
    assert (high["attempt"], high["quotaShareName"]) == (1, "qs1")
    assert (high["borrowed"], high["afterPreemptionOf"]) == ([], [])
    assert high["capacityUsage"] == [{"capacityUnit": G5, "quantity": 1}]


def test_notebook_med_is_dispatched_borrowing_one_instance(notebook):
    _, facts, _ = notebook
    med = one(facts, "JobDispatched", "med")
    assert med["quotaShareName"] == "qs1"
    assert med["borrowed"] == [{"capacityUnit": G5, "quantity": 1}]
    assert med["afterPreemptionOf"] == []


def test_notebook_low_waits_because_the_reserve_share_lends_nothing(notebook):
    _, facts, _ = notebook
    low = one(facts, "JobDispatched", "low")
    assert low["commandSeq"] == 11  # only after its priority update, not at submission (line 9)


def test_notebook_b1_reclaims_its_quota_by_preempting_med(notebook):
    _, facts, _ = notebook
    preempted = one(facts, "JobPreempted", "med")
    assert preempted["reason"] == "CROSS_SHARE_RECLAIM"
    assert preempted["outcome"] == "REQUEUED"
    assert preempted["preemptorJobId"] == "b1"
    assert (preempted["attempt"], preempted["preemptedAttemptCount"]) == (1, 1)
    b1 = one(facts, "JobDispatched", "b1")
    assert b1["quotaShareName"] == "qs2"
    assert b1["afterPreemptionOf"] == ["med"]
    assert b1["borrowed"] == []
    assert facts.index(preempted) < facts.index(b1)


def test_notebook_priority_update_makes_low_preempt_high_in_share(notebook):
    _, facts, _ = notebook
    updated = one(facts, "JobPriorityUpdated", "low")
    assert updated["schedulingPriority"] == 4
    preempted = one(facts, "JobPreempted", "high")
    assert preempted["reason"] == "IN_SHARE_PRIORITY"
    assert preempted["outcome"] == "REQUEUED"
    assert preempted["preemptorJobId"] == "low"
    low = one(facts, "JobDispatched", "low")
    assert low["afterPreemptionOf"] == ["high"]
    assert low["borrowed"] == []
    assert facts.index(updated) < facts.index(preempted) < facts.index(low)


def test_notebook_med_stays_runnable_and_is_never_redispatched(notebook):
    _, facts, state = notebook
    assert [f for f in facts if f["kind"] == "JobDispatched" and f["jobId"] == "med"][1:] == []
    assert state["jobs"]["med"]["status"] == "RUNNABLE"


def test_notebook_has_exactly_two_preemptions(notebook):
    _, facts, _ = notebook
    assert [f["jobId"] for f in facts if f["kind"] == "JobPreempted"] == ["med", "high"]


# -- --state-out --------------------------------------------------------------------------------


def test_state_out_has_the_shape_of_contract_section_4(notebook):
    _, _, state = notebook
    assert set(state) == {"jobs", "queues"}
    for job in state["jobs"].values():
        assert set(job) == {"status", "quotaShareName", "schedulingPriority",
                            "preemptedAttemptCount", "attempt", "statusReason"}  # fmt: skip
        assert job["statusReason"] is None or isinstance(job["statusReason"], str)
    for queue in state["queues"].values():
        assert set(queue) == {"totalCapacityUsage", "quotaShares"}


def test_state_out_has_the_right_job_values(notebook):
    _, _, state = notebook
    jobs = {job_id: {k: v for k, v in job.items() if k != "statusReason"}
            for job_id, job in state["jobs"].items()}  # fmt: skip
    assert jobs == {
        "high": {"status": "RUNNABLE", "quotaShareName": "qs1", "schedulingPriority": 3,
                 "preemptedAttemptCount": 1, "attempt": 1},
        "med": {"status": "RUNNABLE", "quotaShareName": "qs1", "schedulingPriority": 2,
                "preemptedAttemptCount": 1, "attempt": 1},
        "low": {"status": "SCHEDULED", "quotaShareName": "qs1", "schedulingPriority": 4,
                "preemptedAttemptCount": 0, "attempt": 1},
        "b1": {"status": "SCHEDULED", "quotaShareName": "qs2", "schedulingPriority": 1,
               "preemptedAttemptCount": 0, "attempt": 1},
    }  # fmt: skip
    assert state["jobs"]["low"]["statusReason"] is None
    assert state["jobs"]["b1"]["statusReason"] is None


def test_state_out_has_the_right_usage(notebook):
    _, _, state = notebook
    queue = state["queues"]["q"]
    assert queue["totalCapacityUsage"] == {G5: 2}
    shares = queue["quotaShares"]
    assert set(shares) == {"qs1", "qs2", "qs3"}
    assert shares["qs1"] == {G5: 1}
    assert shares["qs2"] == {G5: 1}
    assert shares["qs3"].get(G5, 0) == 0


def test_state_out_is_written_even_when_stdout_is_not_read(tmp_path):
    state_path = tmp_path / "nested-state.json"
    result = run("replay", str(NOTEBOOK), "--state-out", str(state_path))
    assert result.returncode == 0
    assert json.loads(state_path.read_text())["queues"]["q"]["totalCapacityUsage"] == {G5: 2}


# -- determinism ----------------------------------------------------------------------------------

EXAMPLE_FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.jsonl"))


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=f"replaying {p} twice gives byte-identical output") for p in EXAMPLE_FILES],
)
def test_output_is_byte_identical_across_runs(path, tmp_path):
    outputs = []
    for seed in ("0", "12345"):  # a different hash seed must not change anything
        state_path = tmp_path / f"state-{seed}.json"
        result = run("replay", path, "--state-out", str(state_path), env={"PYTHONHASHSEED": seed})
        assert result.returncode == 0, result.stderr.decode()
        outputs.append((result.stdout, state_path.read_bytes()))
    assert outputs[0] == outputs[1]


def test_crlf_line_endings_give_the_same_facts(tmp_path):
    crlf = tmp_path / "notebook-crlf.jsonl"
    crlf.write_bytes(NOTEBOOK.read_bytes().replace(b"\n", b"\r\n"))
    assert run("replay", str(crlf)).stdout == run("replay", str(NOTEBOOK)).stdout


def test_a_last_line_without_newline_is_still_replayed(tmp_path):
    path = tmp_path / "no-newline.jsonl"
    path.write_bytes(NOTEBOOK.read_bytes().rstrip(b"\n"))
    assert run("replay", str(path)).stdout == run("replay", str(NOTEBOOK)).stdout


# -- bad input lines ----------------------------------------------------------------------------

INVALID_JSON = '{"at": 1, "kind": '
UNKNOWN_KIND = '{"at": 1, "kind": "LaunchRocket"}'
WRONG_TYPES = _submit("bad1", "qs1", 1, priority="3")  # type: ignore[arg-type]
NON_UTF8 = b'\xff\xfe{"at": 2, "kind": "Tick"}'


@pytest.fixture(scope="module")
def bad_file(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict]]:
    lines = [line.encode() for line in NOTEBOOK_SETUP]  # lines 1-6
    lines += [INVALID_JSON.encode(), UNKNOWN_KIND.encode(), WRONG_TYPES.encode()]  # lines 7-9
    lines += [NON_UTF8]  # line 10
    lines += [_submit("good", "qs1", 3, priority=5).encode()]  # line 11
    lines += [_submit("other", "nope", 4).encode()]  # line 12: a share that does not exist
    path = tmp_path_factory.mktemp("bad") / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = run("replay", str(path))
    return result, facts_of(result.stdout)


def test_a_file_with_bad_lines_still_exits_0(bad_file):
    result, _ = bad_file
    assert result.returncode == 0
    assert result.stderr == b""


@pytest.mark.parametrize(
    "seq,kind,raw,words",
    [pytest.param(7, "Unknown", INVALID_JSON, "invalid json",
                  id="an invalid JSON line becomes a CommandRejected keeping it"),
     pytest.param(8, "LaunchRocket", UNKNOWN_KIND, "unknown command kind",
                  id="an unknown kind becomes a CommandRejected keeping it"),
     pytest.param(9, "SubmitServiceJob", WRONG_TYPES, "schedulingPriority",
                  id="a command with wrong types becomes a CommandRejected keeping it")],
)  # fmt: skip
def test_each_bad_line_becomes_a_command_rejected_keeping_the_raw_text(
    bad_file, seq, kind, raw, words
):
    _, facts = bad_file
    (rejected,) = [f for f in facts if f["commandSeq"] == seq]
    assert rejected["kind"] == "CommandRejected"
    assert rejected["commandKind"] == kind
    assert words in rejected["statusReason"].lower() or words in rejected["statusReason"]
    assert rejected["raw"] == raw


def test_a_non_utf8_line_becomes_a_command_rejected_keeping_its_exact_bytes(bad_file):
    _, facts = bad_file
    (rejected,) = [f for f in facts if f["commandSeq"] == 10]
    assert rejected["kind"] == "CommandRejected"
    assert rejected["rawEncoding"] == "base64"
    assert b'{"at": 2, "kind": "Tick"}' in base64.b64decode(rejected["raw"])


def test_good_lines_after_bad_ones_still_take_effect(bad_file):
    _, facts = bad_file
    assert [f["kind"] for f in facts if f["commandSeq"] == 11] == ["JobSubmitted", "JobDispatched"]


def test_a_command_the_core_refuses_names_its_job_and_share(bad_file):
    _, facts = bad_file
    (rejected,) = [f for f in facts if f["commandSeq"] == 12]
    assert rejected["kind"] == "CommandRejected"
    assert rejected["commandKind"] == "SubmitServiceJob"
    assert (rejected["jobId"], rejected["quotaShareName"]) == ("other", "nope")
    assert "nope" in rejected["statusReason"]


def test_an_undecodable_command_that_names_a_job_and_share_is_rejected_naming_them(bad_file):
    """contract.md section 3: CommandRejected has `jobId` / `quotaShareName` when the command
    named one; this SubmitServiceJob names both but has a string priority."""
    _, facts = bad_file
    (rejected,) = [f for f in facts if f["commandSeq"] == 9]
    assert (rejected["jobId"], rejected["quotaShareName"]) == ("bad1", "qs1")


def test_an_empty_line_becomes_a_command_rejected(tmp_path):
    """contract.md section 4: 'a line that is not a valid command becomes a CommandRejected
    fact'; section 1: the scheduler 'never drops a command silently'."""
    path = tmp_path / "empty-line.jsonl"
    path.write_text("\n".join([*NOTEBOOK_SETUP, "", _submit("after", "qs1", 1)]) + "\n")
    result = run("replay", str(path))
    assert result.returncode == 0
    facts = facts_of(result.stdout)
    rejected = [f for f in facts if f["commandSeq"] == 7]
    assert [f["kind"] for f in rejected] == ["CommandRejected"]
    assert rejected[0]["raw"] == ""
    assert [f["kind"] for f in facts if f["commandSeq"] == 8] == ["JobSubmitted", "JobDispatched"]


# -- files that can't be read -----------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [pytest.param(lambda tmp: tmp / "missing.jsonl",
                  id="a missing file exits non-zero naming it on stderr"),
     pytest.param(lambda tmp: tmp, id="a directory exits non-zero naming it on stderr")],
)  # fmt: skip
def test_an_unreadable_file_exits_non_zero_naming_it(tmp_path, make):
    target = make(tmp_path)
    result = run("replay", str(target))
    assert result.returncode != 0
    assert str(target) in result.stderr.decode()
    assert result.stdout == b""


def test_an_unreadable_file_writes_no_state(tmp_path):
    state_path = tmp_path / "state.json"
    result = run("replay", str(tmp_path / "missing.jsonl"), "--state-out", str(state_path))
    assert result.returncode != 0
    assert not state_path.exists()


# -- standard input -----------------------------------------------------------------------------


def test_dash_reads_the_commands_from_standard_input(tmp_path):
    from_file = run("replay", str(NOTEBOOK), "--state-out", str(tmp_path / "a.json"))
    from_stdin = run("replay", "-", "--state-out", str(tmp_path / "b.json"),
                     stdin=NOTEBOOK.read_bytes())  # fmt: skip
    assert from_stdin.returncode == 0
    assert from_stdin.stdout == from_file.stdout
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_empty_standard_input_prints_nothing_and_exits_0():
    result = run("replay", "-", stdin=b"")
    assert (result.returncode, result.stdout) == (0, b"")


# -- schema, demo, help -------------------------------------------------------------------------


def test_schema_prints_valid_json_with_both_unions():
    result = run("schema")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert set(document) == {"commands", "facts"}
    commands, facts = json.dumps(document["commands"]), json.dumps(document["facts"])
    for kind in COMMAND_KINDS:
        assert f'"{kind}"' in commands
    for kind in ("CommandRejected", "JobSubmitted", "JobDispatched", "JobPreempted",
                 "JobStatusChanged", "ShareBlocked", "JobPriorityUpdated", "QuotaShareCreated"):
        assert f'"{kind}"' in facts  # fmt: skip


def test_schema_can_print_one_union():
    result = run("schema", "--which", "commands")
    assert result.returncode == 0
    assert set(json.loads(result.stdout)) == {"commands"}


def test_demo_narrates_both_kinds_of_preemption():
    result = run("demo", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "CROSS_SHARE_RECLAIM" in text
    assert "IN_SHARE_PRIORITY" in text
    assert "AWS_ENDPOINT_URL_BATCH=http://127.0.0.1:" in text  # its AWS Batch endpoint
    # The end, by hand: qs1 runs low on its own instance (high and med wait), qs2 runs b1 on its
    # own, qs3 idles; nobody borrows.  One unit, so the title names it and cells are numbers.
    assert "in ml.g5.xlarge instances" in text
    rows = {row[0]: row[1:] for row in re.findall(
        r"│ (qs\d) +│ (\w+) +│ (\d+) +│ (\d+) +│ (\d+) +│ ([^│]*?) *│", text)}
    assert rows == {"qs1": ("LEND_AND_BORROW", "1", "1", "0", "RUNNABLE high, med"),
                    "qs2": ("LEND", "1", "1", "0", "RUNNING b1"),
                    "qs3": ("RESERVE", "1", "0", "0", "")}, text
    assert re.search(r"│ +│ +│ +│ +│ +│ RUNNING low +│", text), text


def test_demo_with_the_gpu_agent_runs_each_job_as_a_process_on_its_own_gpu():
    """`make demo EXECUTOR=agent`: the notebook story with real processes on fake GPUs 0-2.
    By hand: high and med start on two GPUs; med is preempted for b1, high for low, each
    preemptor taking its victim's GPU; qs3's GPU stays free."""
    result = run("demo", "--executor", "agent", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "CROSS_SHARE_RECLAIM" in text and "IN_SHARE_PRIORITY" in text
    said = dict(re.findall(r"│ (high|med|low|b1) +│ 1 +│ on GPU (\d)", text))
    assert set(said) == {"high", "med", "low", "b1"}, text
    assert said["low"] == said["high"] and said["b1"] == said["med"] != said["high"]


def test_demo_in_a_narrow_terminal_still_exits_0():
    assert run("demo", env={"COLUMNS": "60"}).returncode == 0


@pytest.mark.parametrize(
    "args,words",
    [pytest.param(("--help",), ("replay", "schema", "demo"),
                  id="quotasched --help lists the commands"),
     pytest.param(("replay", "--help"), ("--state-out",),
                  id="quotasched replay --help shows --state-out")],
)  # fmt: skip
def test_help_works(args, words):
    result = run(*args, env={"COLUMNS": "200"})
    assert result.returncode == 0
    for word in words:
        assert word in result.stdout.decode()


def test_apply_of_a_missing_file_exits_2_with_the_reason(tmp_path):
    """Nothing is published, and no traceback: the file is read before any connection."""
    missing = tmp_path / "nope.jsonl"
    result = run("apply", str(missing), "--nats-url", "nats://127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.decode().strip() == (
        f"quotasched apply: cannot read {missing}: No such file or directory"
    )


@pytest.mark.parametrize(("args", "message"), [
    (("--kind", "docker"), "--kind docker: simulated, process or sagemaker"),
    (("--job-queue", "q/../x"), "--job-queue q/../x: must be 1-128 characters"),
])  # fmt: skip
def test_executor_options_are_checked_before_anything_starts(args, message):
    result = run("executor", "--nats-url", "nats://127.0.0.1:1", *args)
    assert result.returncode == 2 and message in result.stderr.decode()


def test_executor_with_a_damaged_attempt_file_says_which_and_exits_2(tmp_path):
    (tmp_path / "executor-process-qa.json").write_text("{not json\n")
    result = run("executor", "--nats-url", "nats://127.0.0.1:1", "--kind", "process",
                 "--job-queue", "qa", "--state-dir", str(tmp_path))  # fmt: skip
    assert result.returncode == 2
    assert f"cannot read the executor's attempt file {tmp_path}/executor-process-qa.json" in \
        result.stderr.decode()


def test_agent_with_a_damaged_attempt_file_says_which_and_exits_2(tmp_path):
    (tmp_path / "executor-agent-h1.json").write_text("{not json\n")
    result = run("agent", "--nats-url", "nats://127.0.0.1:1", "--gpus", "0,1", "--capacity-unit",
                 "ml.g5.xlarge", "--service-environment", "se", "--host", "h1", "--state-dir",
                 str(tmp_path))  # fmt: skip
    assert result.returncode == 2
    assert f"cannot read the executor's attempt file {tmp_path}/executor-agent-h1.json" in \
        result.stderr.decode()


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` (a pseudo-terminal) not installed")
def test_replay_draws_progress_on_a_terminal_only_and_prints_the_same_facts(tmp_path):
    """Issue 21: long offline commands show progress on a terminal.  Standard error is a
    pseudo-terminal here (`script`), standard output a file: the bar goes to the terminal and
    the facts are byte-identical to a run without one."""
    out = tmp_path / "facts.jsonl"
    command = f"{QUOTASCHED} replay {NOTEBOOK} > {out}"
    terminal = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True,
                              timeout=120)  # fmt: skip
    assert terminal.returncode == 0, terminal.stdout
    assert b"replaying notebook.jsonl" in terminal.stdout  # what the terminal showed
    piped = run("replay", str(NOTEBOOK))
    assert out.read_bytes() == piped.stdout and piped.stderr == b""


def test_help_text_is_reflowed_not_broken_where_the_source_line_was():
    """Issue 21: `up --help` read "Ctrl-C stops it" / "all cleanly" on two lines."""
    shown = run("up", "--help", env={"COLUMNS": "200"}).stdout.decode()
    assert "Ctrl-C stops it all cleanly" in shown
    listing = run("--help", env={"COLUMNS": "200"}).stdout.decode()
    assert "the admission gate, the projector and an executor." in listing  # one line in the list


def test_demo_offline_labels_each_share_value_it_narrates():
    """`demo --offline` said "in-share preemption ENABLED, ENABLED": the second is the share's
    state, and says so."""
    result = run("demo", "--offline", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "quota share qs1 created: LEND_AND_BORROW, borrowLimit 200, limits 1 x ml.g5.xlarge, " \
           "in-share preemption ENABLED, state ENABLED" in text, text
    assert "ENABLED, ENABLED" not in text and "DISABLED, ENABLED" not in text


def test_the_agent_help_says_its_nats_url_is_required_and_never_embedded():
    """The agent joins the scheduler's bus; `up` is what starts an embedded server."""
    for command, word in (("agent", "(required)"), ("logs", "(optional)")):
        result = run(command, "--help", env={"COLUMNS": "200"})
        assert result.returncode == 0, result.stderr.decode()
        line = next(line for line in result.stdout.decode().splitlines()
                    if line.lstrip("│ ").startswith("--nats-url"))  # the option's row
        assert word in line and "embedded" not in line, line
    refused = run("agent", "--gpus", "0", env={"QUOTASCHED_NATS_URL": ""})
    assert refused.returncode != 0
    assert b"--nats-url (or QUOTASCHED_NATS_URL) is required" in refused.stderr


@pytest.mark.parametrize("command", ["up", "agent", "executor", "simulate", "sql", "report", "demo",
                                     "logs", "projections rebuild", "config apply"])
def test_help_at_80_columns_cuts_no_word(command):
    """At 80 columns Rich's option table cut long words ("<data-dir>/quotasched.…",
    "QUOTASCHED_METRICS_POR…"); below 100 the CLI lays help out as Click does, wrapping."""
    result = run(*command.split(), "--help", env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    if command == "up":
        flat = " ".join(text.split())  # wrapped lines joined
        assert "[default: simulated]" in flat and "QUOTASCHED_METRICS_PORT" in flat
        assert "dir>/quotasched.duckdb" in flat
    wide = run(*command.split(), "--help", env={"COLUMNS": "120"}).stdout.decode()
    assert "╭─ Options" in wide  # a wide terminal keeps Rich's panels
