"""Golden replays: every command file in examples/ through the real `quotasched replay`.

For each `examples/<name>.jsonl` the facts printed on stdout must equal
`tests/golden/expected/<name>.facts.jsonl` byte for byte, and the `--state-out` document must
equal `tests/golden/expected/<name>.state.json`.  tests/golden/expected/README.md says what each
file demonstrates and which decisions were checked by hand against the spec.

After an intended behaviour change, regenerate and then *review* the diff:

    .venv/bin/python -m pytest tests/golden --update-golden
    git diff tests/golden/expected
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest

from quotasched.events.codec import DecodeError, decode_command, decode_fact

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXPECTED = Path(__file__).resolve().parent / "expected"
QUOTASCHED = Path(sys.executable).parent / "quotasched"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.jsonl"))
ARTIFACTS = {"facts": "{name}.facts.jsonl", "state": "{name}.state.json"}


@cache
def replay(name: str) -> dict[str, bytes]:
    """stdout and the --state-out document of replaying examples/<name>.jsonl."""
    with tempfile.TemporaryDirectory() as directory:
        state_path = Path(directory) / "state.json"
        result = subprocess.run(
            [str(QUOTASCHED), "replay", f"examples/{name}.jsonl", "--state-out", str(state_path)],
            cwd=ROOT, capture_output=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode()
        assert result.stderr == b"", result.stderr.decode()
        return {"facts": result.stdout, "state": state_path.read_bytes()}


def _diff(expected: bytes, actual: bytes, path: Path, limit: int = 80) -> str:
    lines = list(difflib.unified_diff(
        expected.decode().splitlines(), actual.decode().splitlines(),
        fromfile=f"{path.name} (expected)", tofile=f"{path.name} (actual)", lineterm="", n=1,
    ))  # fmt: skip
    shown = "\n".join(lines[:limit])
    return shown + (f"\n... {len(lines) - limit} more diff lines" if len(lines) > limit else "")


@pytest.mark.parametrize(
    "name,artifact",
    [pytest.param(name, artifact, id=f"replaying examples/{name}.jsonl gives the golden {artifact}")
     for name in NAMES for artifact in ARTIFACTS],
)  # fmt: skip
def test_golden_replay(name: str, artifact: str, update_golden: bool) -> None:
    actual = replay(name)[artifact]
    path = EXPECTED / ARTIFACTS[artifact].format(name=name)
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(actual)
        return
    if not path.exists():
        pytest.fail(
            f"{path.relative_to(ROOT)} is missing: run `pytest tests/golden --update-golden`, "
            "then read the new file and check its decisions against the spec"
        )
    expected = path.read_bytes()
    if expected != actual:
        pytest.fail(
            f"replaying examples/{name}.jsonl no longer matches {path.relative_to(ROOT)} "
            f"(regenerate with --update-golden only if the change is intended):\n"
            + _diff(expected, actual, path)
        )


def test_every_golden_file_belongs_to_an_example() -> None:
    wanted = {pattern.format(name=name) for name in NAMES for pattern in ARTIFACTS.values()}
    stale = sorted(path.name for path in EXPECTED.glob("*.json*") if path.name not in wanted)
    assert not stale, f"expected files without an example: {stale}"


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, id=f"examples/{name}.jsonl is a well-formed command file") for name in NAMES],
)
def test_example_files_are_well_formed(name: str) -> None:
    """Each line a valid command with an `at`, times never decreasing, fewer than 200 lines."""
    lines = (EXAMPLES / f"{name}.jsonl").read_text().splitlines()
    assert 0 < len(lines) < 200
    times = []
    for number, line in enumerate(lines, start=1):
        try:
            command = decode_command(line)
        except DecodeError as error:
            pytest.fail(f"line {number}: {error}")
        assert command.at is not None, f"line {number} has no `at`"
        times.append(command.at)
    assert times == sorted(times), "`at` decreases somewhere"


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, id=f"the golden facts of {name} are valid facts in order") for name in NAMES],
)
def test_golden_facts_are_valid_and_ordered(name: str) -> None:
    path = EXPECTED / f"{name}.facts.jsonl"
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: run pytest --update-golden")
    facts = [decode_fact(line) for line in path.read_text().splitlines()]
    assert [f.command_seq for f in facts] == sorted(f.command_seq for f in facts)
    assert [f.at for f in facts] == sorted(f.at for f in facts)
    state = json.loads((EXPECTED / f"{name}.state.json").read_text())
    assert set(state) == {"jobs", "queues"}
