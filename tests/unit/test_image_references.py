"""A job's image reaches `docker run` / `podman run` only as an image reference, in the place
of the image (issue 28, point 2).

The grammar (events/images.py, distribution/reference's) is checked at submission, where a
refusal names the field and the problem; `run_argv` writes every option as `--opt=value` and
ends the options with `--`, so nothing a job controls is ever read as a runtime option; and
the agent checks again before a run (`check_attempt`), for a job an older log holds.  The
same through the real scheduler: tests/integration/test_hostile_names_live.py; under a real
agent: tests/reliability/test_agent_hostile_names.py.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotasched.events.codec import DecodeError, decode_command
from quotasched.events.images import reference_problem
from quotasched.services.executors import containers

DIGEST = "sha256:" + "0123456789abcdef" * 4

VALID = [
    ("a bare name", "busybox"),
    ("a registry, a path and a tag", "docker.io/library/busybox:1.36"),
    ("a registry with a port and a digest", f"localhost:5000/a/b@{DIGEST}"),
    ("a dotted registry and a dotted tag", "registry.example.com/team/img:v1.2"),
    ("a tag and a digest", f"busybox:1.36@{DIGEST}"),
    ("every path separator", "a.b_c__d-e---f/g"),
    ("an IPv6 registry", "[::1]:5000/img"),
    ("an uppercase registry host", "Registry.Example.com/team/img"),
    ("the test image of the container tests", "localhost/quotasched-test-busybox"),
]

# (scenario, image, words the problem must contain)
HOSTILE = [
    ("a privileged flag", "--privileged", ["'--privileged'", "begins with '-'", "option"]),
    ("a host mount", "--volume=/:/host", ["'--volume=/:/host'", "begins with '-'"]),
    ("the host's pid namespace", "--pid=host", ["'--pid=host'", "begins with '-'"]),
    ("a short flag", "-v", ["'-v'", "begins with '-'"]),
    ("an uppercase path", "Busybox", ["'Busybox'", "lowercase"]),
    ("an uppercase path under a registry", "docker.io/Library/busybox", ["lowercase"]),
    ("an empty image", "", ["is empty"]),
    ("spaces", "busybox --privileged", ["whitespace"]),
    ("a trailing newline", "busybox\n", ["whitespace or control"]),
    ("a name too long", "a" * 300, ["longer than 255"]),
    ("a reference too long", "a" * 600, ["longer than 512"]),
    ("a tag beginning with a dash", "busybox:-x", ["not an image reference"]),
    ("a short digest", "busybox@sha256:abc", ["not an image reference"]),
    ("an option after the name", "busybox=--privileged", ["not an image reference"]),
    ("a separator at the end", "busybox-", ["not an image reference"]),
    ("a path traversal", "../busybox", ["not an image reference"]),
]

SUBMIT = {"kind": "SubmitServiceJob", "jobName": "j", "jobQueue": "q", "quotaShareName": "s"}
USAGE = [{"capacityUnit": "ml.g5.xlarge", "quantity": 1}]


def with_tag(image: str) -> str:
    return json.dumps({**SUBMIT, "capacityUsage": USAGE, "tags": {"image": image}})


def with_payload(image: object, as_text: bool) -> str:
    payload = {"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
               "AlgorithmSpecification": {"TrainingImage": image}}  # fmt: skip
    return json.dumps({**SUBMIT, "serviceRequestPayload": json.dumps(payload) if as_text else payload})


@pytest.mark.parametrize("scenario, image", VALID, ids=[case[0] for case in VALID])
def test_an_image_reference_of_the_grammar_is_accepted_in_a_tag_and_in_a_payload(scenario, image):
    assert reference_problem(image) is None
    decode_command(with_tag(image))
    decode_command(with_payload(image, as_text=True))
    decode_command(with_payload(image, as_text=False))


@pytest.mark.parametrize("scenario, image, words", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_a_hostile_image_is_refused_at_submission_naming_the_field_and_the_problem(scenario, image, words):
    problem = reference_problem(image)
    assert problem is not None and all(word in problem for word in words), problem
    refusals = []
    if len(image) <= 256:  # a tag value is at most 256 characters (AWS's)
        refusals.append(("tags.image ", with_tag(image)))
    for as_text in (True, False):
        refusals.append(("serviceRequestPayload AlgorithmSpecification.TrainingImage ",
                         with_payload(image, as_text)))  # fmt: skip
    for field, message in refusals:
        with pytest.raises(DecodeError) as refused:
            decode_command(message)
        assert refused.value.reason == f"Invalid SubmitServiceJob: {field}{problem}"


def test_a_training_image_that_is_not_a_string_is_refused():
    with pytest.raises(DecodeError, match=r"TrainingImage is not a string \(list\)"):
        decode_command(with_payload(["--privileged"], as_text=False))


def test_a_tag_too_long_for_a_tag_is_refused_by_the_tag_limit_naming_tags_image():
    with pytest.raises(DecodeError, match=r"tags\.image: String should have at most 256"):
        decode_command(with_tag("a" * 300))


# -- the runtime's command line ---------------------------------------------------------------

AGENT_OPTIONS = ("--rm", "--name=", "--env=", "--gpus=", "--device=")


def option_part(argv: list[str]) -> list[str]:
    """What the runtime reads as options: after `<runtime> run`, up to `--`."""
    assert argv[1] == "run" and "--" in argv, argv
    return argv[2:argv.index("--")]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
@pytest.mark.parametrize("devices", [False, True])
def test_run_argv_ends_the_options_with_a_double_dash_before_the_image(runtime, devices):
    command = ["--privileged", "-v", "/:/host", "--pid=host"]
    argv = containers.run_argv(runtime, "quotasched--x-1", "busybox", command,
                               {"QUOTASCHED_JOB_ID": "-x", "CUDA_VISIBLE_DEVICES": "0,1"},
                               ["0", "1"], devices)  # fmt: skip
    assert argv[argv.index("--") + 1:] == ["busybox", *command]
    assert all(part.startswith(AGENT_OPTIONS) for part in option_part(argv)), argv
    assert "--env=QUOTASCHED_JOB_ID=-x" in argv and "--name=quotasched--x-1" in argv


@settings(max_examples=200, deadline=None)
@given(job_id=st.text(min_size=1, max_size=40), command=st.lists(st.text(max_size=20), max_size=5),
       runtime=st.sampled_from(["docker", "podman"]), devices=st.booleans())  # fmt: skip
def test_no_job_controlled_string_is_ever_in_option_position(job_id, command, runtime, devices):
    name = containers.container_name(job_id, 1)
    env = {"CUDA_VISIBLE_DEVICES": "0", "QUOTASCHED_JOB_ID": job_id, "QUOTASCHED_ATTEMPT": "1"}
    argv = containers.run_argv(runtime, name, "busybox", command, env, ["0"], devices)
    assert all(part.startswith(AGENT_OPTIONS) for part in option_part(argv)), argv
    assert argv[argv.index("--") + 1:] == ["busybox", *command]


CONTAINER_NAME = r"[a-zA-Z0-9][a-zA-Z0-9_.-]*"  # what docker and podman accept


@settings(max_examples=300, deadline=None)
@given(first=st.text(min_size=1, max_size=30), second=st.text(min_size=1, max_size=30),
       attempt=st.integers(1, 12))  # fmt: skip
def test_container_names_are_valid_and_never_shared_by_two_attempts(first, second, attempt):
    import re

    name = containers.container_name(first, attempt)
    assert re.fullmatch(CONTAINER_NAME, name), name
    if first != second:
        assert name != containers.container_name(second, attempt)
    assert name != containers.container_name(first, attempt + 1)


def test_an_id_the_contract_accepts_names_its_container_as_it_is():
    assert containers.container_name("-_Az09_-", 3) == "quotasched--_Az09_--3"


# -- the agent's check before a run (a log older than the rules) ------------------------------

@pytest.mark.parametrize("job_id, image, words", [
    ("old", "--privileged", ["image '--privileged' begins with '-'", "not run"]),
    ("old", "Busybox", ["lowercase", "not run"]),
    ("..", None, ["job id '..' cannot name a log directory"]),
    (".", "busybox", ["job id '.' cannot name a log directory"]),
    ("a/b", None, ["cannot name a log directory"]),
])  # fmt: skip
def test_an_attempt_from_an_older_log_with_a_hostile_image_or_id_is_refused_before_it_runs(
        job_id, image, words):  # fmt: skip
    with pytest.raises(ValueError) as refused:
        containers.check_attempt(job_id, image)
    assert all(word in str(refused.value) for word in words), str(refused.value)


@pytest.mark.parametrize("job_id", ["bad.", "a:b", "a.b", "-_Az09_-"])
def test_an_attempt_whose_id_is_a_path_component_and_image_a_reference_may_run(job_id):
    containers.check_attempt(job_id, "busybox")
    containers.check_attempt(job_id, None)
