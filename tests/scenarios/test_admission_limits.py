"""Per-share admission limits (issue 29, point 2): one team cannot flood the service.

Every case is a command file run through `replay_lines` (what `quotasched replay` runs), with
command times from the file's `at`; expectations are worked out by hand.
"""

from __future__ import annotations

import json

from quotasched.services.replay import replay_lines

G5 = "ml.g5.xlarge"
SETUP = [
    {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 2}]},
    {"kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
    *({"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": name,
       "capacityLimits": [{"capacityUnit": G5, "maxCapacity": 1}],
       "resourceSharingConfiguration": {"strategy": "RESERVE"},
       "preemptionConfiguration": {"inSharePreemption": "DISABLED"}} for name in ("a", "b")),
]  # fmt: skip


def options(share: str, **limits) -> dict:
    return {"kind": "SetQuotaShareOptions", "jobQueue": "q", "quotaShareName": share,
            "options": limits}


def submit(share: str, job_id: str, at: float, pad: int = 0) -> dict:
    """A submission; `pad` spaces of JSON whitespace make its message that much larger (a
    valid command can be padded so: its size is the message's, as the bus carries it)."""
    command = {"kind": "SubmitServiceJob", "jobQueue": "q", "quotaShareName": share,
               "jobName": job_id, "jobId": job_id, "at": at,
               "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}
    if pad:
        command["_pad"] = pad
    return command


def line(command: dict) -> str:
    pad = command.pop("_pad", 0)
    return json.dumps(command)[:-1] + " " * pad + "}"


def run(*commands: dict) -> list[dict]:
    lines = [line(dict(command)) for command in (*SETUP, *commands)]
    return [json.loads(fact.model_dump_json(by_alias=True)) for fact in replay_lines(lines)]


def outcome(facts: list[dict]) -> dict[str, str]:
    """Per submitted job id: "accepted" or the refusal's reason."""
    said = {}
    for fact in facts:
        if fact["kind"] == "JobSubmitted":
            said[fact["jobId"]] = "accepted"
        elif fact["kind"] == "CommandRejected" and fact["commandKind"] == "SubmitServiceJob":
            said[fact["jobId"]] = fact["statusReason"]
    return said


def test_a_share_over_its_queued_jobs_limit_is_refused_while_another_shares_job_is_accepted():
    said = outcome(run(options("a", maxQueuedJobs=2),
                       submit("a", "a1", 1), submit("a", "a2", 1), submit("a", "a3", 1),
                       submit("b", "b1", 1)))  # fmt: skip
    assert said["a1"] == said["a2"] == said["b1"] == "accepted"
    assert "maxQueuedJobs of 2" in said["a3"] and "has 2 queued jobs" in said["a3"]


def test_a_job_that_ends_frees_its_place_under_the_queued_jobs_limit():
    terminate = {"kind": "TerminateServiceJob", "jobId": "a1", "reason": "done", "at": 2}
    said = outcome(run(options("a", maxQueuedJobs=1), submit("a", "a1", 1), submit("a", "a2", 1),
                       terminate, submit("a", "a3", 3)))  # fmt: skip
    assert said["a1"] == "accepted" and "maxQueuedJobs of 1" in said["a2"]
    assert said["a3"] == "accepted"


def test_a_burst_over_submissions_per_second_is_refused_and_accepted_again_the_next_second():
    # 3 per second: at t=5.0, 5.2, 5.9 accepted; 5.95 refused (4th in [5, 6)); 6.0 accepted.
    said = outcome(run(options("a", maxSubmissionsPerSecond=3, maxQueuedJobs=100),
                       submit("a", "j1", 5.0), submit("a", "j2", 5.2), submit("a", "j3", 5.9),
                       submit("a", "j4", 5.95), submit("b", "k1", 5.96),
                       submit("a", "j5", 6.0)))  # fmt: skip
    assert [said[j] for j in ("j1", "j2", "j3", "k1", "j5")] == ["accepted"] * 5
    assert "maxSubmissionsPerSecond of 3" in said["j4"]


def test_submission_bytes_per_window_are_refused_over_the_limit_and_accepted_the_next_window():
    # 20,000 bytes of padding (each message ~20.2 KB, counted: over 16 KiB); a 50,000-byte
    # limit per 10 s window takes two in [0, 10); the third is refused; t=10 opens a new window.
    big = 20_000
    said = outcome(run(options("a", maxSubmissionBytesPerWindow=50_000, submissionBytesWindowSeconds=10),
                       submit("a", "j1", 1, big), submit("a", "j2", 2, big), submit("a", "j3", 3, big),
                       submit("a", "small", 4), submit("b", "k1", 5, big),
                       submit("a", "j4", 10, big)))  # fmt: skip
    assert [said[j] for j in ("j1", "j2", "small", "k1", "j4")] == ["accepted"] * 5
    assert "maxSubmissionBytesPerWindow of 50000" in said["j3"]
    assert "10-second window" in said["j3"]


def test_default_limits_apply_when_none_is_set():
    # the default is 10,000 submissions per second: the 10,001st in one second is refused
    said = outcome(run(*(submit("a", f"j{i}", 7.5) for i in range(10_001))))
    assert said["j9999"] == "accepted"
    assert "maxSubmissionsPerSecond of 10000" in said["j10000"]


def test_a_refusal_over_a_limit_is_cheap_and_replays_identically():
    commands = (options("a", maxSubmissionsPerSecond=1), submit("a", "j1", 1),
                submit("a", "j2", 1, 200_000))
    first, second = run(*commands), run(*commands)
    assert first == second
    refused = first[-1]
    assert refused["kind"] == "CommandRejected" and refused["raw"] is None
    assert len(json.dumps(refused)) < 1000  # the 200 KB message is not kept


def test_options_that_set_no_limit_write_none_into_their_fact():
    facts = run(options("a", minRuntimeBeforePreemptionSeconds=5))
    assert "maxQueuedJobs" not in facts[-1]["options"]
    facts = run(options("a", maxQueuedJobs=7))
    assert facts[-1]["options"]["maxQueuedJobs"] == 7
