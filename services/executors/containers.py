"""Attempts in containers: the GPU agent's `--container-runtime docker|podman`.

A job that names an image (its tag `image`, or the SageMaker payload's
`AlgorithmSpecification.TrainingImage`) runs as

    <runtime> run --rm --name=quotasched-<job>-<attempt> --env=CUDA_VISIBLE_DEVICES=<its GPUs>
        --env=QUOTASCHED_JOB_ID=... --env=QUOTASCHED_ATTEMPT=... [GPU devices]
        [--mount=type=bind,source=<the job's checkpoint directory>,target=<LocalPath>]
        -- <image> [command]

where the command is the job's own (tag `command`, payload `Command` or
`ContainerEntrypoint` + `ContainerArguments`; none: the image's entrypoint).  The runtime's
client is the attempt's process, so everything the process executor does holds: the ledger
has its pid before it runs, its output goes to the attempt's log, and its exit code is the
container's.  GPU devices: where NVML found the GPUs (a driver is there), docker gets
`--gpus "device=0,1"` and podman the CDI devices `nvidia.com/gpu=0`...; with an explicit
`--gpus` list only the variable is set.  The mount is there when the payload has a
`CheckpointConfig` (checkpoints.py): its source is always the agent's own directory for the
job, and the job chooses only the target, a checked path.  Stopping asks the runtime (`stop -t
<grace>`: SIGTERM, then SIGKILL after the job's grace period), since a signal to the client
alone may leave the container running; a previous run's container is removed (`rm -f`) when
its attempt is found lost.  A job without an image runs as a plain process, as without a
runtime.

No string a job controls is ever in option position: every option is written `--opt=value`
(its value cannot be taken for another option), and `--` ends the options before the image,
so both runtimes' parsers (cobra/pflag, non-interspersed) read the image and everything after
it as positional arguments: the image, then the container's command.  The image must also be
an image reference (events/images.py): refused at submission, and checked again here
(`check_attempt`) for a job submitted before that rule, whose attempt then fails with the
reason instead of running.  What a job may influence in `docker run` is documented in
docs/executors.md.
"""

from __future__ import annotations

import asyncio
import base64
import re

from quotasched.events.base import is_path_component
from quotasched.events.images import reference_problem
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


def check_attempt(job_id: str, image: str | None) -> None:
    """Refuse to run (ValueError: the attempt fails with it as its reason) an attempt whose
    job id cannot name its log directory (`<logs>/<job>/<attempt>.log`) or whose image is not
    an image reference: both refused at submission, so only a log older than those rules
    holds such a job."""
    if not is_path_component(job_id):
        raise ValueError(f"the job id {job_id[:60]!r} cannot name a log directory; it is not run")
    problem = reference_problem(image) if image is not None else None
    if problem is not None:
        raise ValueError(f"the job's image {problem}; it is not run")


def container_name(job_id: str, attempt: int) -> str:
    """A name the runtimes accept ([a-zA-Z0-9][a-zA-Z0-9_.-]*), one per attempt, never the
    same for two attempts: an id the contract accepts stands as it is; any other (from an
    older log) as its base64url and `.b64`, which no accepted id holds."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", job_id):
        return f"quotasched-{job_id}-{attempt}"
    encoded = base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")
    return f"quotasched-{encoded}.b64-{attempt}"


def run_argv(runtime: str, name: str, image: str, command: list[str], env: dict[str, str],
             gpus: list[str], devices: bool, user: str | None = None,
             mounts: tuple[tuple[str, str], ...] = ()) -> list[str]:  # fmt: skip
    """The client command line that runs one attempt's container: options as `--opt=value`,
    then `--`, the image and the command (positional, whatever they look like).  `user`
    (UID:GID, the agent's --run-as): who the container's process runs as.  `mounts`: (host
    directory, container path) bind mounts, both checked by the caller (checkpoints.py: no
    comma or quote, which `--mount`'s CSV would read)."""
    argv = [runtime, "run", "--rm", f"--name={name}"]
    if user is not None:
        argv.append(f"--user={user}")
    for key, value in env.items():
        argv.append(f"--env={key}={value}")
    if devices and gpus:
        if runtime == "docker":
            argv.append(f'--gpus="device={",".join(gpus)}"')
        else:
            argv += [f"--device=nvidia.com/gpu={gpu}" for gpu in gpus]
    argv += [f"--mount=type=bind,source={source},target={target}" for source, target in mounts]
    return [*argv, "--", image, *command]


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
