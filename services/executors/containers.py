"""Attempts in containers: the GPU agent's `--container-runtime docker|podman`.

A job that names an image (its tag `image`, or the SageMaker payload's
`AlgorithmSpecification.TrainingImage`) runs as

    <runtime> run --rm --name quotasched-<job>-<attempt> -e CUDA_VISIBLE_DEVICES=<its GPUs>
        -e QUOTASCHED_JOB_ID=... -e QUOTASCHED_ATTEMPT=... [GPU devices] <image> [command]

where the command is the job's own (tag `command`, payload `Command` or
`ContainerEntrypoint` + `ContainerArguments`; none: the image's entrypoint).  The runtime's
client is the attempt's process, so everything the process executor does holds: the ledger
has its pid before it runs, its output goes to the attempt's log, and its exit code is the
container's.  GPU devices: where NVML found the GPUs (a driver is there), docker gets
`--gpus "device=0,1"` and podman the CDI devices `nvidia.com/gpu=0`...; with an explicit
`--gpus` list only the variable is set.  Stopping asks the runtime (`stop -t <grace>`: SIGTERM,
then SIGKILL after the grace period), since a signal to the client alone may leave the
container running; a previous run's container is removed (`rm -f`) when its attempt is found
lost.  A job without an image runs as a plain process, as without a runtime.
"""

from __future__ import annotations

import asyncio
import re

from quotasched.services.executors.base import payload_object

RUNTIMES = ("docker", "podman")


def image_of(spec: dict) -> str | None:
    """The container image the job names, if any."""
    tags = spec.get("tags") or {}
    if tags.get("image"):
        return str(tags["image"])
    payload = payload_object(spec)
    image = ((payload or {}).get("AlgorithmSpecification") or {}).get("TrainingImage")
    return str(image) if image else None


def container_name(job_id: str, attempt: int) -> str:
    """A name the runtimes accept ([a-zA-Z0-9][a-zA-Z0-9_.-]*), one per attempt."""
    return f"quotasched-{re.sub(r'[^a-zA-Z0-9_.-]', '_', job_id)}-{attempt}"


def run_argv(runtime: str, name: str, image: str, command: list[str], env: dict[str, str],
             gpus: list[str], devices: bool) -> list[str]:  # fmt: skip
    """The client command line that runs one attempt's container."""
    argv = [runtime, "run", "--rm", "--name", name]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    if devices and gpus:
        if runtime == "docker":
            argv += ["--gpus", f'"device={",".join(gpus)}"']
        else:
            for gpu in gpus:
                argv += ["--device", f"nvidia.com/gpu={gpu}"]
    return [*argv, image, *command]


async def stop(runtime: str, name: str, grace_s: float) -> None:
    """Stop the container (SIGTERM, SIGKILL after the grace period); quiet if it is gone."""
    await _quietly(runtime, "stop", "-t", str(max(0, round(grace_s))), name)


async def remove(runtime: str, name: str) -> None:
    """Remove a container a previous run left, whatever its state; quiet if there is none."""
    await _quietly(runtime, "rm", "-f", name)


async def _quietly(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await process.wait()
