"""`quotasched demo`: the official notebook's story, live, on an embedded stack.

Starts nats-server, the scheduler, the projector and the simulated executor in a temporary
directory, configures fixture N (three shares over three ml.g5.xlarge instances), submits
through the Python client and narrates every fact as it lands in the log: the borrow, the
cross-share reclaim, the in-share preemption after a priority update.  Ends with per-share
usage.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from quotasched.events.codec import decode_fact
from quotasched.services.explain.narrate import Names, sentence
from quotasched.services.client import AsyncTrainingQueue, Bus
from quotasched.services.runtime import Stack, stop_on_signals
from quotasched.services.nats.log import read_log
from quotasched.services.settings import Settings

UNIT = "ml.g5.xlarge"
SETUP = [
    {"kind": "CreateServiceEnvironment", "serviceEnvironmentName": "se",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 3}]},
    {"kind": "CreateSchedulingPolicy", "name": "sp",
     "quotaSharePolicy": {"idleResourceAssignmentStrategy": "FIFO"}},
    {"kind": "CreateJobQueue", "jobQueueName": "q", "schedulingPolicy": "sp",
     "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": "se"}]},
    {"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs1",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "LEND_AND_BORROW", "borrowLimit": 200},
     "preemptionConfiguration": {"inSharePreemption": "ENABLED"}},
    {"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs2",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "LEND"},
     "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
    {"kind": "CreateQuotaShare", "jobQueue": "q", "quotaShareName": "qs3",
     "capacityLimits": [{"capacityUnit": UNIT, "maxCapacity": 1}],
     "resourceSharingConfiguration": {"strategy": "RESERVE"},
     "preemptionConfiguration": {"inSharePreemption": "DISABLED"}},
]  # fmt: skip

STEPS = [
    ("Team 1 submits three jobs to qs1 (priorities 3, 2, 1)", [("high", "qs1", 3), ("med", "qs1", 2), ("low", "qs1", 1)]),
    ("Team 2 needs its own instance back: b1 goes to qs2", [("b1", "qs2", 1)]),
]  # fmt: skip


# With `--executor agent` each job is a real process on one of three fake GPUs: it says which
# GPU it got (CUDA_VISIBLE_DEVICES, set by the agent) and sleeps until stopped.
GPU_JOB = ("python3 -c \"import os, time; print('on GPU', os.environ['CUDA_VISIBLE_DEVICES'], "
           "flush=True); time.sleep(600)\"")
# ... except two: `high` trains with checkpoints (examples/jobs/checkpointed_train.py, 40 steps
# of 0.1 s), so that when `low` preempts it and then ends (after 3 s), its second attempt
# resumes from the step it saved on SIGTERM; `grace` gives it 5 s to save.
SHORT_GPU_JOB = GPU_JOB.replace("time.sleep(600)", "time.sleep(3)")
TRAIN_ARGS = "--steps 40 --every 10 --step-seconds 0.1"


async def run_demo(console: Console, pause_s: float = 1.0, serve: bool = False,
                   executor: str = "simulated") -> None:
    """The story; with `serve`, the stack then stays up (its AWS Batch endpoint too) until
    Ctrl-C, for the real AWS CLI, boto3 or the SageMaker SDK to look at the demo's queue.
    `executor`: simulated, or agent (the GPU-host agent on fake GPUs 0, 1 and 2: real
    processes, each on its own GPU)."""
    with tempfile.TemporaryDirectory(prefix="quotasched-demo-") as data_dir:
        settings = Settings(data_dir=data_dir, tick_interval_s=0.5)
        agent, tags, job_tags = None, {"duration": "600"}, {}
        if executor == "agent":
            from quotasched.services.executors.agent import AgentOptions

            agent = AgentOptions(gpus=["0", "1", "2"], capacity_unit=UNIT,
                                 service_environment="se", host="demo-host", grace_s=2.0,
                                 heartbeat_s=0.5, host_timeout_s=3.0,
                                 checkpoint_dir=os.path.join(data_dir, "checkpoints"),
                                 checkpoint_keep="never", grace_max_s=10.0)  # fmt: skip
            tags = {"command": GPU_JOB}
            job_tags = _checkpointed_story()
        # with a projector, as `up` runs one: the web view's usage over time reads it
        async with Stack(settings, executor=executor, speed=1.0, aws_port=0, agent=agent,
                         executor_state_dir=data_dir, web_port=0,
                         projector_db=os.path.join(data_dir, "quotasched.duckdb"),
                         stop_jobs=agent is not None, gate=True) as stack:  # fmt: skip
            what = ("the GPU agent on fake GPUs 0, 1, 2" if agent is not None
                    else "simulated executor")  # fmt: skip
            console.print(f"[bold]Embedded stack up[/] at {stack.url} "
                          f"(nats-server, scheduler, admission gate, {what})")  # fmt: skip
            console.print(f"AWS_ENDPOINT_URL_BATCH={stack.endpoint.url}", highlight=False,
                          soft_wrap=True)  # fmt: skip
            console.print(f"WEB={stack.web.url}", highlight=False, soft_wrap=True)
            async with Bus(stack.url, name="quotasched-demo") as bus:
                narrator = asyncio.create_task(_narrate(bus, console))
                for command in SETUP:
                    await bus.submit_and_wait(command)
                queue = AsyncTrainingQueue("q", bus)
                jobs = {}
                for title, submissions in STEPS:
                    console.rule(title)
                    for name, share, priority in submissions:
                        jobs[name] = await queue.submit(
                            name, job_id=name, quota_share_name=share, priority=priority,
                            instance_type=UNIT, tags=job_tags.get(name, tags),
                        )  # fmt: skip
                    await asyncio.sleep(pause_s)
                console.rule("Team 1 raises low to priority 4 (UpdateServiceJob)")
                await jobs["low"].update(scheduling_priority=4)
                await asyncio.sleep(pause_s * 2)
                if "high" in job_tags:
                    await _resumes(console, data_dir)
                narrator.cancel()
                await asyncio.gather(narrator, return_exceptions=True)
                await _usage(console, await queue.snapshot(), bus)
                if agent is not None:
                    _gpus(console, data_dir, jobs)
            if serve:
                stop_on_signals(stack.stop)
                _serving(console, stack)
                await stack.stop.wait()


def _checkpointed_story() -> dict[str, dict[str, str]]:
    """The agent demo's tags for `high` (the checkpointed example job) and `low` (a short
    one); none where the example is not there (an installed wheel without it)."""
    import shlex
    import sys

    from quotasched import examples_dir

    script = examples_dir() / "jobs" / "checkpointed_train.py"
    if not script.is_file():
        return {}
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {TRAIN_ARGS}"
    return {"high": {"command": command, "grace": "5"}, "low": {"command": SHORT_GPU_JOB}}


async def _resumes(console: Console, data_dir: str, timeout_s: float = 60.0) -> None:
    """`low` ends, `high` is dispatched again and resumes from the step it saved when it was
    preempted; once it has trained to the end, its checkpoint directory is removed."""
    import re
    from pathlib import Path

    console.rule("low ends: high runs again and resumes from its checkpoint")
    second = Path(data_dir) / "logs" / "high" / "2.log"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    said = ""
    while loop.time() < deadline and not re.search(r"resumed from|starting from|done at", said):
        await asyncio.sleep(0.2)
        said = second.read_text() if second.exists() else ""
    found = re.search(r"resumed from step (\d+)", said)
    if found:
        console.print(f"[bold]high resumed from its checkpoint at step {found.group(1)}[/] "
                      "(attempt 2; attempt 1 saved it on SIGTERM when low preempted it)")
    else:
        console.print(f"high did not resume from a checkpoint: {said.strip() or 'no attempt 2'}",
                      markup=False)  # fmt: skip
        return
    folder = Path(data_dir) / "checkpoints" / "high"
    while loop.time() < deadline and ("done at" not in said or folder.exists()):
        await asyncio.sleep(0.2)
        said = second.read_text()
    if "done at" in said and not folder.exists():
        console.print("high trained to its last step and SUCCEEDED; its checkpoint directory is "
                      "removed (QUOTASCHED_CHECKPOINT_KEEP=never)")  # fmt: skip


def _gpus(console: Console, data_dir: str, jobs: dict) -> None:
    """What each job's processes printed: the GPU the agent gave each attempt."""
    from pathlib import Path

    table = Table(title="Processes (the agent's per-attempt logs, `quotasched logs JOB_ID`)")
    for column in ("job", "attempt", "said"):
        table.add_column(column)
    for name in jobs:
        for log in sorted((Path(data_dir) / "logs" / name).glob("*.log")):
            said = log.read_text().strip() or "(stopped before it printed)"
            table.add_row(name, log.stem, said)
    console.print(table)


def _serving(console: Console, stack: Stack) -> None:
    url = stack.endpoint.url
    console.rule("Serving the demo's queue q until Ctrl-C")
    console.print(f"export AWS_ENDPOINT_URL_BATCH={url} AWS_ACCESS_KEY_ID=demo "
                  "AWS_SECRET_ACCESS_KEY=demo AWS_DEFAULT_REGION=us-east-1\n"
                  "aws batch list-service-jobs --job-queue q --job-status RUNNING "
                  "--query 'jobSummaryList[].[jobName,quotaShareName]' --output text\n"
                  f"QUOTASCHED_NATS_URL={stack.url} quotasched facts --follow\n"
                  f"the live web view: {stack.web.url}",
                  highlight=False, markup=False, soft_wrap=True)  # fmt: skip


async def _narrate(bus: Bus, console: Console) -> None:
    names = Names()  # jobs read by name (`events.labels`)
    async for _, data, _ in read_log(bus.js, follow=True):
        fact = decode_fact(data)
        names.see(fact)
        if fact.kind in ("JobDispatched", "JobPreempted", "JobSubmitted", "JobPriorityUpdated",
                         "JobStatusChanged", "ShareBlocked", "CommandRejected"):  # fmt: skip
            style = {"JobPreempted": "bold red", "JobDispatched": "green"}.get(fact.kind, "")
            text = escape(sentence(fact, names))  # a reason may hold [brackets]
            console.print(f"  [{style}]{text}[/]" if style else f"  {text}")


async def _usage(console: Console, snapshot: dict, bus: Bus) -> None:
    shares = (await bus.request("list-quota-shares", jobQueue="q"))["quotaShares"]
    jobs = (await bus.request("list-service-jobs", jobQueue="q", jobStatus="ALL"))["jobSummaryList"]
    units = {c["capacityUnit"] for share in shares for c in share["capacityLimits"]}
    one_unit = next(iter(units)) if len(units) == 1 else None  # then the title names it
    table = Table(title="Per-share usage at the end (get-job-queue-snapshot)"
                  + (f", in {one_unit} instances" if one_unit else ""))  # fmt: skip
    for column in ("quota share", "strategy", "limit", "in use", "borrowed"):
        table.add_column(column, no_wrap=True)
    table.add_column("jobs", overflow="fold")
    for share in shares:
        limits = {c["capacityUnit"]: c["maxCapacity"] for c in share["capacityLimits"]}
        used = share["usage"]
        borrowed = {unit: n - limits.get(unit, 0) for unit, n in used.items() if n > limits.get(unit, 0)}
        by_status: dict[str, list[str]] = {}
        for job in reversed(jobs):
            if job["quotaShareName"] == share["quotaShareName"]:
                by_status.setdefault(job["status"], []).append(job["jobName"])
        members = "\n".join(f"{status} {', '.join(names)}" for status, names in by_status.items())
        table.add_row(share["quotaShareName"], share["resourceSharingConfiguration"]["strategy"],
                      *(_units(counts, one_unit) for counts in (limits, used, borrowed)), members)
    console.print(table)
    total = snapshot["queueUtilization"]["totalCapacityUsage"]
    console.print("Total in use: " + _units({t["capacityUnit"]: t["quantity"] for t in total}))


def _units(counts: dict[str, int | float], only: str | None = None) -> str:
    """`1 ml.g5.xlarge, 2 ml.p4d.24xlarge`, the one way counts of a unit are written here (just
    the number when every count is of the unit `only`)."""
    if only is not None and set(counts) <= {only}:
        return f"{counts.get(only, 0):g}"
    return ", ".join(f"{n:g} {unit}" for unit, n in counts.items()) or "0"
