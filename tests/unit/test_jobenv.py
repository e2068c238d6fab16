"""A job's environment is built from what it needs, never inherited (services/executors/jobenv.py):
the executor's credentials never reach a job, whoever asks for them."""

from __future__ import annotations

import json

import pytest

from quotasched.services.executors.jobenv import JobEnvError, build, check_pass_env, runtime_client

EXECUTOR = {  # an executor started with its role's credentials file sourced
    "PATH": "/usr/bin:/bin", "HOME": "/home/exec", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
    "TZ": "UTC", "QUOTASCHED_NATS_URL": "nats://10.0.0.5:4222",
    "QUOTASCHED_NATS_USER": "executor", "QUOTASCHED_NATS_PASSWORD": "s3cret-pass",
    "QUOTASCHED_NATS_INBOX_PREFIX": "_INBOX_executor", "QUOTASCHED_NATS_TLS_CA": "/etc/ca.pem",
    "AWS_ACCESS_KEY_ID": "QSAKEXAMPLE", "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "NATS_CREDS": "/etc/nats/executor.creds", "GOOGLE_APPLICATION_CREDENTIALS": "/etc/g.json",
    "HF_HOME": "/data/hf", "LEAKY": "password is s3cret-pass", "CONTAINERS_CONF": "/etc/c.conf",
}  # fmt: skip
FIXED = {"QUOTASCHED_JOB_ID": "j1", "QUOTASCHED_ATTEMPT": "2"}


def spec(environment=None) -> dict:
    payload = None if environment is None else json.dumps({"Environment": environment})
    return {"tags": {"command": "true"}, "payload": payload}


def test_a_job_gets_what_it_needs_and_no_credential():
    env = build(EXECUTOR, (), spec(), FIXED)
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/home/exec", "LANG": "C.UTF-8",
                   "LC_ALL": "C.UTF-8", "TZ": "UTC", **FIXED}  # fmt: skip


def test_the_allow_list_and_the_payload_add_to_it_and_the_executor_has_the_last_word():
    env = build(EXECUTOR, ("HF_HOME",), spec({"WANDB_MODE": "offline", "HF_HOME": "/mine"}),
                {**FIXED, "CUDA_VISIBLE_DEVICES": "1"})  # fmt: skip
    assert (env["HF_HOME"], env["WANDB_MODE"], env["CUDA_VISIBLE_DEVICES"]) == (
        "/mine", "offline", "1")
    assert not any(name.startswith(("AWS_", "NATS_")) or "NATS" in name for name in env)


@pytest.mark.parametrize("name", [
    "QUOTASCHED_NATS_PASSWORD", "QUOTASCHED_NATS_USER", "AWS_PROFILE", "NATS_CREDS",
    "GOOGLE_APPLICATION_CREDENTIALS", "aws_secret_access_key"])  # fmt: skip
def test_a_payload_asking_for_a_credential_fails_naming_it(name):
    with pytest.raises(JobEnvError, match=name):
        build(EXECUTOR, (), spec({name: "x"}), FIXED)


def test_a_payload_setting_what_the_executor_sets_fails():
    with pytest.raises(JobEnvError, match="CUDA_VISIBLE_DEVICES.*executor sets"):
        build(EXECUTOR, (), spec({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}),
              {**FIXED, "CUDA_VISIBLE_DEVICES": "1"})


@pytest.mark.parametrize("environment", [["A=1"], {"A": 1}, {"1A": "x"}, {"A": "x\0y"}])
def test_a_payload_environment_that_is_not_names_to_strings_fails(environment):
    with pytest.raises(JobEnvError):
        build(EXECUTOR, (), spec(environment), FIXED)


@pytest.mark.parametrize("names, refused", [
    (["HF_HOME", "QUOTASCHED_NATS_PASSWORD"], "QUOTASCHED_NATS_PASSWORD"),
    (["AWS_SECRET_ACCESS_KEY"], "AWS_SECRET_ACCESS_KEY"), (["NATS_CREDS"], "NATS_CREDS"),
    (["MY_CREDENTIALS_FILE"], "MY_CREDENTIALS_FILE"), (["LEAKY"], "LEAKY"), (["A-B"], "A-B"),
])  # fmt: skip
def test_the_allow_list_refuses_credentials_at_start(names, refused):
    with pytest.raises(JobEnvError, match=refused):
        check_pass_env(names, EXECUTOR)
    assert check_pass_env(["HF_HOME", "HF_HOME", "WANDB_MODE"], EXECUTOR) == (
        "HF_HOME", "WANDB_MODE")


def test_a_container_runtime_client_gets_its_settings_and_still_no_credential():
    assert runtime_client(EXECUTOR) == {"CONTAINERS_CONF": "/etc/c.conf"}


@pytest.mark.parametrize("command", [
    ["executor", "--kind", "process", "--pass-env", "HF_HOME,QUOTASCHED_NATS_PASSWORD"],
    ["agent", "--gpus", "0", "--capacity-unit", "u", "--service-environment", "se",
     "--pass-env", "AWS_PROFILE"],
])  # fmt: skip
def test_a_credential_in_the_allow_list_stops_the_start_in_one_line(command):
    import os
    import subprocess

    from tests.integration.conftest import QUOTASCHED

    done = subprocess.run([QUOTASCHED, *command, "--nats-url", "nats://127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "QUOTASCHED_PASS_ENV": ""})  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--pass-env" in done.stderr and "never passed to a job" in done.stderr, done.stderr
