"""Checkpoint directories: one per job, kept across its attempts (the GPU agent; issue 33).

A preempted job comes back as a new attempt, maybe on another host of the fleet: what it saved
must be where that attempt looks.  So the agent gives each job a directory, `<root>/<name>`
(root: `QUOTASCHED_CHECKPOINT_DIR`, default `<state dir>/checkpoints`), made before the job's
first attempt runs and handed to every attempt of it:

- a process gets the directory's path in `QUOTASCHED_CHECKPOINT_DIR`;
- a container gets it bind-mounted where its payload's `CheckpointConfig` says (`LocalPath`,
  SageMaker's default `/opt/ml/checkpoints`), and the variable names that path; a container
  whose payload has no `CheckpointConfig` gets neither (as on SageMaker).

Hosts that share the root (NFS, ...) share the directories: the next attempt resumes on
whichever host runs it.  With a root per host, it resumes only on the host that saved.

`<name>` is the job id when it is one the contract accepts (1-128 of `[A-Za-z0-9_-]`); any
other id (only a log older than that rule holds one: `..`, `a/b`, 200 characters) is
`<its letters, digits, '-' and '_', at most 40>.<sha256 of it, 32 hex>`: the dot keeps it
apart from every accepted id, the digest apart from each other, and no name is `.`, `..` or
holds `/`.

Once the job has ended (SUCCEEDED, FAILED, terminated; not a preemption that requeues it) its
directory is removed, unless `QUOTASCHED_CHECKPOINT_KEEP` says `failed` (kept when the job
FAILED: to look at, or to resubmit from) or `always`.  Under `--run-as` the root is the
agent's, mode 0711 (traversable, never listable), and each job's directory belongs to the
job's user, mode 0700.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from typing import Any

from quotasched.services.executors.base import payload_object
from quotasched.services.executors.jobuser import JobUser

KEEP = ("never", "failed", "always")
VARIABLE = "QUOTASCHED_CHECKPOINT_DIR"  # the job's directory, in the attempt's environment
CONTAINER_PATH = "/opt/ml/checkpoints"  # SageMaker's default CheckpointConfig.LocalPath
ACCEPTED_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# A container path the agent mounts on: absolute, plain components, not the kernel's own.
COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
RESERVED = ("/proc", "/sys", "/dev")
# Characters a root may not hold when containers mount from it: `--mount=` is read as CSV.
UNMOUNTABLE = re.compile(r'[,"\x00-\x1f]')


def directory_name(job_id: str) -> str:
    """The job's directory name under the root (see the module docstring): never `.`, `..`,
    never holding `/`, at most 128 characters, and the same for every attempt."""
    if ACCEPTED_ID.fullmatch(job_id):
        return job_id
    readable = re.sub(r"[^A-Za-z0-9_-]", "", job_id)[:40] or "job"
    digest = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{readable}.{digest}"


def container_path(spec: dict[str, Any]) -> str | None:
    """Where a container gets the job's directory: its payload's `CheckpointConfig.LocalPath`
    (absent or empty: /opt/ml/checkpoints), None without a `CheckpointConfig`.  ValueError
    (the attempt fails with it) for a path the agent does not mount on: not absolute, with
    `.`/`..` or characters beyond letters, digits, `_`, `.`, `-`, or under /proc, /sys, /dev."""
    config = (payload_object(spec) or {}).get("CheckpointConfig")
    if config is None:
        return None
    if not isinstance(config, dict):
        raise ValueError("the payload's CheckpointConfig is not an object")
    local = config.get("LocalPath") or CONTAINER_PATH
    if not isinstance(local, str):
        raise ValueError("the payload's CheckpointConfig.LocalPath is not a string")
    path = local.rstrip("/")  # SageMaker writes its default as /opt/ml/checkpoints/
    parts = path.split("/")[1:]
    if (not local.startswith("/") or not parts or len(path) > 1024
            or not all(COMPONENT.fullmatch(part) for part in parts)):  # fmt: skip
        raise ValueError(f"the payload's CheckpointConfig.LocalPath {local[:80]!r} is not an "
                         "absolute path of plain components ([A-Za-z0-9_.-], no '.' or '..'); "
                         "it is not mounted")  # fmt: skip
    if any(path == top or path.startswith(top + "/") for top in RESERVED):
        raise ValueError(f"the payload's CheckpointConfig.LocalPath {path!r} is under "
                         f"{', '.join(RESERVED)}; it is not mounted")  # fmt: skip
    return path


class Checkpoints:
    """The directories under one root, and when they go."""

    def __init__(self, root: str, keep: str = "never"):
        if keep not in KEEP:
            raise ValueError(f"QUOTASCHED_CHECKPOINT_KEEP={keep}: never, failed or always")
        self.root = os.path.abspath(root)  # the attempt's working directory is not ours
        self.keep = keep

    def path(self, job_id: str) -> str:
        return os.path.join(self.root, directory_name(job_id))

    def prepare(self, job_id: str, user: JobUser | None) -> str:
        """Make the job's directory if it is not there yet (mode 0700; the job user's under
        --run-as, its root then the agent's and 0711) and return it.  ValueError when it
        cannot be the job's: a non-directory in its place, or a root the user cannot reach."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        if user is not None:
            os.chmod(self.root, 0o711)  # to one's own directory, never listable
            user.check_reach(self.root, "QUOTASCHED_CHECKPOINT_DIR")  # and to the root
        path = self.path(job_id)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode):
            raise ValueError(f"the job's checkpoint directory {path} is not a directory")
        if user is not None and (found.st_uid, found.st_gid) != (user.uid, user.gid):
            os.chown(path, user.uid, user.gid, follow_symlinks=False)
        os.chmod(path, 0o700)
        return path

    def keeps(self, failed: bool) -> bool:
        """Whether a job that ended so keeps its directory."""
        return self.keep == "always" or (self.keep == "failed" and failed)

    def exists(self, job_id: str) -> bool:
        return os.path.lexists(self.path(job_id))

    def remove(self, job_id: str) -> None:
        """Remove the job's directory (rmtree works through directory descriptors: a symlink
        the job left is removed, never followed)."""
        path = self.path(job_id)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def check_root(root: str, containers: bool) -> None:
    """Refuse (ValueError, one line) a root a container's `--mount=` could not name."""
    if containers and UNMOUNTABLE.search(root):
        raise ValueError(f"QUOTASCHED_CHECKPOINT_DIR {root!r}: a container runtime mounts from "
                         "it, so no comma, double quote or control character")  # fmt: skip
