"""Every example file, replayed by the real `quotasched replay`, obeys the independent checker.

The golden tests compare the output with reviewed files; this one judges the same output by
the rules themselves, with tests/checker.py (its own model and arithmetic, nothing imported
from the core): limits and rounded-down borrow ceilings, the environment ceiling, backed
borrowing, minimal and eligible victims, pass order and FIFO, stability after every command
and the job lifecycle.  Facts are read as the JSON lines the CLI prints.

tests/scenarios/test_independent_checker.py shows the checker failing on logs that break a rule.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checker import check_log

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.jsonl"))
QUOTASCHED = Path(sys.executable).parent / "quotasched"


def test_there_are_examples_to_check():
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_example_replay_obeys_the_independent_checker(path: Path):
    result = subprocess.run([str(QUOTASCHED), "replay", str(path)], cwd=ROOT,
                            capture_output=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    facts = [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]
    commands = sum(1 for line in path.read_text().splitlines())
    assert facts and facts[-1]["commandSeq"] <= commands
    checker = check_log(facts)  # raises RuleBroken naming the command and the rule
    assert checker.accepted > 0 and any(fact["kind"] == "JobDispatched" for fact in facts)

