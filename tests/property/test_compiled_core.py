"""The compiled decision core decides exactly what the interpreted one does.

`python -m quotasched.services.native build` compiles the core with mypyc (`make test` and `make demo`
build it when the machine has a C compiler), and the rest of the suite then runs against the
compiled modules.  These tests hold the two together: the same command files (every example
and seeded random ones from `conftest.py`) give byte-identical facts and final states in a
process running each, snapshots pickled by either load in the other and decide the same
afterwards, and a build of other sources is never loaded.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from quotasched.services import native
from quotasched.services.scheduler import core
from tests.property.conftest import random_command_lines

ROOT = Path(__file__).resolve().parents[2]
QUOTASCHED = Path(sys.executable).parent / "quotasched"

needs_build = pytest.mark.skipif(
    not core.COMPILED, reason=f"the compiled core is not in use here: {core.CORE_BUILD}"
)

# Replays every file named on the command line; prints {file: sha256 of facts + final state}.
_DIGESTS = """
import hashlib, json, sys
from quotasched.events.codec import encode_bytes
from quotasched.services.replay import replay_lines
from quotasched.services.scheduler.core import COMPILED, State, state_document
out = {"compiled": COMPILED}
for path in sys.argv[1:]:
    state, digest = State(), hashlib.sha256()
    with open(path, "rb") as handle:
        for fact in replay_lines(handle, state):
            digest.update(encode_bytes(fact) + b"\\n")
    digest.update(json.dumps(state_document(state), sort_keys=True).encode())
    out[path] = digest.hexdigest()
print(json.dumps(out))
"""

# argv: command file, snapshot path, "dump" or "load".  Dump: replay the first half of the file
# and pickle the state.  Load: unpickle it.  Either way, then decide the second half and print
# the canonical state before it and the facts it gave.
_SNAPSHOT = """
import json, pickle, sys
from quotasched.events.codec import encode
from quotasched.services.scheduler.core import COMPILED, State, step_raw
from quotasched.services.scheduler.core.views import canonical_state
path, snapshot, action = sys.argv[1:]
lines = open(path).read().splitlines()
half = len(lines) // 2
if action == "dump":
    state = State()
    for number, line in enumerate(lines[:half], start=1):
        step_raw(state, line, number)
    open(snapshot, "wb").write(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
else:
    state = pickle.loads(open(snapshot, "rb").read())
before = canonical_state(state)
facts = [encode(fact) for number, line in enumerate(lines[half:], start=half + 1)
         for fact in step_raw(state, line, number)]
print(json.dumps({"compiled": COMPILED, "before": before, "facts": facts}, sort_keys=True))
"""


def _env(pure: bool) -> dict[str, str]:
    """This process's environment, choosing the interpreted core or whatever is built."""
    env = {key: value for key, value in os.environ.items() if key != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    return env


def _run(script: str, *args: str, pure: bool) -> dict:
    result = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=_env(pure),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer.pop("compiled") is not pure
    return answer


def _command_files(directory: Path) -> list[str]:
    paths = [str(path) for path in sorted((ROOT / "examples").glob("*.jsonl"))]
    for seed, steps in [*((seed, 80) for seed in range(120)), *((seed, 3000) for seed in range(4))]:
        path = directory / f"random-{seed}-{steps}.jsonl"
        path.write_text("\n".join(random_command_lines(random.Random(seed), steps)) + "\n")
        paths.append(str(path))
    return paths


@needs_build
def test_compiled_and_interpreted_cores_give_byte_identical_facts_and_states(tmp_path: Path) -> None:
    paths = _command_files(tmp_path)
    compiled = _run(_DIGESTS, *paths, pure=False)
    interpreted = _run(_DIGESTS, *paths, pure=True)
    differ = [path for path in paths if compiled[path] != interpreted[path]]
    assert not differ, f"{len(differ)} of {len(paths)} files decide differently, first: {differ[0]}"


@needs_build
def test_quotasched_replay_prints_the_same_bytes_with_either_core(tmp_path: Path) -> None:
    outputs = []
    for pure in (False, True):
        state = tmp_path / f"state-{pure}.json"
        result = subprocess.run(
            [str(QUOTASCHED), "replay", "examples/notebook.jsonl", "--state-out", str(state)],
            cwd=ROOT, env=_env(pure), capture_output=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode()
        outputs.append((result.stdout, state.read_bytes()))
    assert outputs[0] == outputs[1]


@needs_build
@pytest.mark.parametrize("writer_pure", [False, True], ids=["compiled writes", "interpreted writes"])
def test_a_snapshot_pickled_by_either_core_loads_in_the_other(tmp_path: Path, writer_pure: bool) -> None:
    commands = tmp_path / "commands.jsonl"
    commands.write_text("\n".join(random_command_lines(random.Random(7), 3000)) + "\n")
    snapshot = str(tmp_path / "state.pickle")
    written = _run(_SNAPSHOT, str(commands), snapshot, "dump", pure=writer_pure)
    loaded = _run(_SNAPSHOT, str(commands), snapshot, "load", pure=not writer_pure)
    assert loaded["before"] == written["before"]
    assert loaded["facts"] == written["facts"] and written["facts"]


def test_the_core_loads_a_build_only_of_exactly_its_sources(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    monkeypatch.setattr(native, "DIRECTORY", tmp_path)
    monkeypatch.setattr(native, "STAMP", tmp_path / "SOURCES")
    assert native.state() == (False, "not built (python -m quotasched.services.native build)")
    (tmp_path / "SOURCES").write_text("0" * 64 + "\n")
    assert native.state()[0] is False and "other sources" in native.state()[1]
    (tmp_path / "SOURCES").write_text(native.source_digest() + "\n")
    suffix = EXTENSION_SUFFIXES[0]
    for name in native.MODULES[1:]:  # one module's extension missing
        (tmp_path / f"{name.removesuffix('.py')}{suffix}").write_bytes(b"")
    assert native.state()[0] is False and native.MODULES[0] in native.state()[1]
    (tmp_path / f"{native.MODULES[0].removesuffix('.py')}{suffix}").write_bytes(b"")
    assert native.state()[0] is True
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.state() == (False, f"{native.PURE_ENV} is set")


def test_the_digest_covers_every_core_module_and_the_message_types(tmp_path, monkeypatch) -> None:
    """Editing any compiled module, or a message type it was compiled against, must make
    the build stale."""
    before = native.source_digest()
    for relative in ["services/scheduler/core/passes.py", "events/facts.py"]:
        fake = tmp_path / "root"
        for path in [*native.CORE.glob("*.py"), *(ROOT / "events").glob("*.py")]:
            target = fake / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        monkeypatch.setattr(native, "ROOT", fake)
        monkeypatch.setattr(native, "CORE", fake / "services" / "scheduler" / "core")
        assert native.source_digest() == before
        (fake / relative).write_bytes((fake / relative).read_bytes() + b"\n# edited\n")
        assert native.source_digest() != before
        monkeypatch.undo()
    assert "passes.py" in native.MODULES and "__init__.py" not in native.MODULES


def test_the_loaded_modules_are_the_ones_the_package_says() -> None:
    suffix = ".so" if core.COMPILED else ".py"
    for name in ("decision", "evolve", "passes", "state", "entities"):
        module = sys.modules.get(f"quotasched.services.scheduler.core.{name}") or __import__(
            f"quotasched.services.scheduler.core.{name}", fromlist=["_"]
        )
        assert module.__file__.endswith(suffix), (name, module.__file__)
    assert core.COMPILED == native.state()[0]


def test_without_a_c_compiler_the_build_says_so_and_the_core_stays_interpreted(
        tmp_path, monkeypatch, capsys) -> None:  # fmt: skip
    monkeypatch.setattr(native, "DIRECTORY", tmp_path / "_native")
    monkeypatch.setattr(native, "STAMP", tmp_path / "_native" / "SOURCES")
    config = native.sysconfig.get_config_var
    monkeypatch.setattr(native.sysconfig, "get_config_var",
                        lambda name: "no-such-compiler-here" if name == "CC" else config(name))
    assert native.build() == 0
    assert "no C compiler (no-such-compiler-here)" in capsys.readouterr().err
    assert not (tmp_path / "_native").exists()
    assert native.state()[0] is False
