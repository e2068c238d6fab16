"""A job's environment: built, never inherited from the executor.

An executor holds the scheduler's keys (QUOTASCHED_NATS_USER and its password, AWS keys, a
credentials file's path); a job is a tenant's code and must get none of them, or it could
report another team's job FAILED or rewire the executor's consumer.  So the environment of an
attempt's process (process executor, GPU agent, and the agent's containers, through `-e`) is
exactly, later entries winning:

1. `HARMLESS` variables of the executor (PATH, HOME, LANG, LC_*, TZ, ...): what any program
   expects to find, no secret;
2. the operator's allow-list (`--pass-env NAME`, QUOTASCHED_PASS_ENV), from the executor's
   environment: names refused by `forbidden` are refused at start (`check_pass_env`);
3. the payload's `Environment` map (SageMaker CreateTrainingJob's: name -> string);
4. what the executor sets: QUOTASCHED_JOB_ID, QUOTASCHED_ATTEMPT (the agent adds
   CUDA_VISIBLE_DEVICES and QUOTASCHED_CHECKPOINT_DIR, the job's directory: checkpoints.py).

A payload asking for a forbidden name, or for one the executor sets, is not silently trimmed:
`JobEnvError` names the variable, and the attempt is reported FAILED with that reason (a job
whose environment is not what it asked for should not run).  The rule is the executor's, not
the scheduler's: the same payload goes to SageMaker unchanged, where AWS_REGION is legitimate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quotasched.services.executors.base import payload_object

# Names a job never gets, whoever asks: the scheduler's own (QUOTASCHED_NATS_USER,
# _PASSWORD, _INBOX_PREFIX, _TLS_CA, ...), AWS's keys and profile, NATS tools' (NATS_CREDS,
# NATS_PASSWORD, ...), and anything naming a credentials file (GOOGLE_APPLICATION_CREDENTIALS).
FORBIDDEN_PREFIXES = ("QUOTASCHED_", "AWS_", "NATS_")
FORBIDDEN_WORDS = ("CREDS", "CREDENTIAL")
# The executor's variables every program may see: no secret in any of them.
HARMLESS = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "USER", "LOGNAME")
HARMLESS_PREFIXES = ("LC_",)  # LC_ALL, LC_CTYPE, ...
# The executor's secrets: an allow-listed variable may not carry one under another name.
SECRETS = ("QUOTASCHED_NATS_PASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # SageMaker's rule for Environment keys, and POSIX's


class JobEnvError(ValueError):
    """A job's (or the operator's) request for a variable it may not have; says which."""


def forbidden(name: str) -> str | None:
    """Why no job may have the variable `name` (None: it may)."""
    upper = name.upper()
    prefix = next((p for p in FORBIDDEN_PREFIXES if upper.startswith(p)), None)
    if prefix is not None:
        return f"{prefix}* variables are the executor's credentials and settings"
    word = next((w for w in FORBIDDEN_WORDS if w in upper), None)
    if word is not None:
        return f"a name holding {word} points at credentials"
    return None


def check_pass_env(names: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The operator's allow-list, checked at start: each a variable name, none forbidden, none
    whose value (in `environ`, the executor's) holds one of the executor's secrets.  Raises
    JobEnvError naming the first bad entry."""
    secrets = [environ[name] for name in SECRETS if environ.get(name)]
    checked: list[str] = []
    for name in names:
        if not re.fullmatch(NAME, name):
            raise JobEnvError(f"{name!r} is not a variable name")
        why = forbidden(name)
        if why is not None:
            raise JobEnvError(f"{name} is never passed to a job ({why})")
        value = environ.get(name, "")
        if any(secret in value for secret in secrets):
            raise JobEnvError(f"{name} is not passed: its value holds one of the executor's "
                              "secrets")  # fmt: skip
        if name not in checked:
            checked.append(name)
    return tuple(checked)


def split_names(text: str) -> list[str]:
    """`HF_HOME,WANDB_MODE` or `HF_HOME WANDB_MODE`: the names, in order."""
    return [name for name in re.split(r"[\s,]+", text) if name]


def requested(spec: dict[str, Any]) -> dict[str, str]:
    """The payload's `Environment` map; JobEnvError if it is not name -> string."""
    payload = payload_object(spec) or {}
    asked = payload.get("Environment")
    if asked is None:
        return {}
    if not isinstance(asked, dict):
        raise JobEnvError("the payload's Environment is not a map of names to strings")
    for name, value in asked.items():
        if not isinstance(name, str) or not re.fullmatch(NAME, name):
            raise JobEnvError(f"the payload's Environment names {name!r}, not a variable name")
        if not isinstance(value, str) or "\0" in value:
            raise JobEnvError(f"the payload's Environment gives {name} a value that is not a "
                              "string")  # fmt: skip
    return asked


def build(executor_env: Mapping[str, str], pass_env: Iterable[str], spec: dict[str, Any],
          fixed: Mapping[str, str]) -> dict[str, str]:  # fmt: skip
    """The attempt's whole environment (see the module docstring for the layers).  `fixed`:
    what the executor sets itself (job id, attempt, GPUs).  Raises JobEnvError when the payload
    asks for a forbidden variable or one in `fixed`."""
    env = {name: value for name, value in executor_env.items()
           if name in HARMLESS or name.startswith(HARMLESS_PREFIXES)}  # fmt: skip
    for name in pass_env:
        if name in executor_env and forbidden(name) is None:  # refused at start already
            env[name] = executor_env[name]
    asked = requested(spec)
    for name in asked:
        why = forbidden(name)
        if why is not None:
            raise JobEnvError(f"the payload's Environment asks for {name}, which no job may "
                              f"have ({why})")  # fmt: skip
        if name in fixed:
            raise JobEnvError(f"the payload's Environment asks to set {name}, which the "
                              f"executor sets")  # fmt: skip
    return {**env, **asked, **fixed}


# A container runtime's client (the GPU agent's `podman run`/`docker run`, the attempt's
# process; the container sees only its `--env` variables): where the runtime is and how it is
# configured, none of it a credential of the scheduler's.
RUNTIME_CLIENT = ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "DBUS_SESSION_BUS_ADDRESS",
                  "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY",
                  "DOCKER_CERT_PATH", "CONTAINER_HOST", "CONTAINER_CONNECTION",
                  "REGISTRY_AUTH_FILE")  # fmt: skip
RUNTIME_CLIENT_PREFIXES = ("CONTAINERS_",)  # CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, ...


def runtime_client(executor_env: Mapping[str, str]) -> dict[str, str]:
    """The executor's container-runtime settings, for the runtime's client only."""
    return {name: value for name, value in executor_env.items()
            if (name in RUNTIME_CLIENT or name.startswith(RUNTIME_CLIENT_PREFIXES))
            and forbidden(name) is None}  # fmt: skip
